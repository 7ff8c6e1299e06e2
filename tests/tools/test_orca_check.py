"""make orca-check's own machinery (tools/orca_check), without the network: the import-line rewriting changes nothing
but BigDL's import lines and sends each name where it comes from here, the stand-ins behave as BigDL's helpers do
on local paths, and Orca's callback classes are found by their bases. The check itself (Orca's wheel, Orca's
classes on the TrainLoop) runs in CI as `make orca-check`."""
import os

import pytest
from helpers import assert_only_import_lines_changed

from tools.orca_check import stand_ins
from tools.orca_check.rewrite import ADAPTER, STAND_INS, Rewriter
from tools.orca_check.wheel import FOLDER, find_callback_modules

ORCA_MODULE = '''import os
import math
from .base import Callback
from bigdl.orca.learn.pytorch.callbacks import Callback as Base
from bigdl.dllib.utils.log4Error import (
    invalidInputError,
)
from orca_like.other import Helper


class Checkpoint(Callback):
    def before_run(self, runner):
        from bigdl.orca.data.file import exists, makedirs
        text = "from bigdl.orca.data.file import exists"  # import-looking text in code stays
        return exists, makedirs, math.ceil(runner.epochs / 2), text
'''


def rewriter():
    return Rewriter({'bigdl.orca.learn.pytorch.callbacks.tqdm': 'copies.tqdm'})


def test_only_bigdl_import_lines_change_and_each_name_goes_where_it_comes_from_here():
    text, edits = rewriter().rewrite(ORCA_MODULE)
    before, after = ORCA_MODULE.splitlines(), assert_only_import_lines_changed(ORCA_MODULE, text)
    assert [line for line, _ in edits] == [3, 4, 5, 13]
    new = dict(edits)
    assert new[3] == f'from {ADAPTER} import Callback'                  # relative to the callbacks package
    assert new[4] == f'from {ADAPTER} import Callback as Base'
    assert new[5] == f'from {STAND_INS} import invalidInputError'
    assert after[5:7] == ['', '']                                      # the rest of a multi-line import
    assert after[12] == f'        from {STAND_INS} import exists, makedirs'      # inside a function too
    assert after[:2] == ['import os', 'import math'] and after[7] == 'from orca_like.other import Helper'
    assert after[13] == before[13]


def test_another_module_of_the_package_becomes_its_copy_and_an_import_sharing_a_line_is_refused():
    text, _ = rewriter().rewrite('from .tqdm import TqdmCallback\nimport bigdl.orca as orca\n')
    assert text.splitlines() == ['from copies.tqdm import TqdmCallback',
                                 f'from {STAND_INS} import bigdl__orca as orca']
    with pytest.raises(ValueError, match='shares its line'):
        rewriter().rewrite('x = 1; from bigdl.orca.data.file import exists\n')


def test_stand_ins_behave_as_bigdl_s_helpers_on_local_paths(tmp_path):
    with pytest.raises(RuntimeError, match='Find non-empty dirname'):
        stand_ins.invalidInputError(False, 'Find non-empty dirname')
    stand_ins.invalidInputError(True, 'not raised')
    folder = tmp_path / 'a' / 'b'
    assert not stand_ins.exists(str(folder))
    stand_ins.makedirs(str(folder))
    (folder / 'x.ckpt').write_text('x')
    assert stand_ins.listdir(str(folder)) == [os.path.join(str(folder), 'x.ckpt')]
    stand_ins.put_local_dir_tree_to_remote(str(tmp_path / 'a'), str(tmp_path / 'remote'))
    assert (tmp_path / 'remote' / 'b' / 'x.ckpt').read_text() == 'x'
    with pytest.raises(stand_ins.Unavailable, match='get_remote_file_to_local'):
        stand_ins.get_remote_file_to_local('hdfs://x', 'y')


def test_callback_classes_are_found_by_their_bases():
    sources = {
        FOLDER + 'base.py': 'class Callback: pass\n',
        FOLDER + '__init__.py': 'from .base import Callback\n',
        FOLDER + 'main.py': 'from .base import Callback\nclass Main(Callback): pass\ndef helper(): pass\n',
        FOLDER + 'steps.py': ('from bigdl.orca.learn.pytorch.callbacks import Callback\n'
                              'class Steps(Callback): pass\nclass Sub(Steps): pass\nclass Other: pass\n'),
        FOLDER + 'foreign.py': 'from keras.callbacks import Callback\nclass NotOrca(Callback): pass\n',
    }
    found = {module.path: module.classes for module in find_callback_modules(sources)}
    assert found == {FOLDER + 'main.py': ['Main'], FOLDER + 'steps.py': ['Steps', 'Sub']}
