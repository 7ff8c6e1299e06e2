"""make sg-check's own machinery (tools/sg_check), without the network: the import-line rewriting changes nothing
but import lines and sends each name where it comes from here, and the callback classes of a wheel are found by
their bases. The check itself (SG's wheel, SG's classes on the TrainLoop) runs in CI as `make sg-check`."""

import pytest
from helpers import assert_only_import_lines_changed

from tools.sg_check.rewrite import ADAPTER, STAND_INS, Rewriter
from tools.sg_check.stand_ins import Unavailable, numpy_1, placeholder
from tools.sg_check.wheel import BASE_MODULE, find_callback_modules

SG_MODULE = '''import os
import cv2
import numpy as np
from typing import Optional
from super_gradients.common.abstractions.abstract_logger import get_logger
from super_gradients.training.utils.callbacks.base_callbacks import (
    PhaseCallback,
    Phase,
)
from super_gradients.training.utils.callbacks import TrainingStageSwitchCallbackBase, PhaseContext

logger = get_logger(__name__)


class Switch(TrainingStageSwitchCallbackBase):
    def apply_stage_change(self, context: PhaseContext):
        from super_gradients.training.losses import PPYoloELoss
        return np.Inf, cv2, PPYoloELoss  # import-looking text in code stays: from x import y
'''


def rewriter():
    return Rewriter({'super_gradients.training.utils.callbacks.callbacks': 'copies.callbacks'},
                    {'TrainingStageSwitchCallbackBase': 'copies.callbacks'},
                    can_import=lambda module: module.split('.')[0] in ('os', 'typing', 'numpy'), numpy_2=True)


def test_only_import_lines_change_and_each_name_goes_where_it_comes_from_here():
    text, edits = rewriter().rewrite(SG_MODULE)
    before, after = SG_MODULE.splitlines(), assert_only_import_lines_changed(SG_MODULE, text)
    assert [line for line, _ in edits] == [2, 3, 5, 6, 10, 17]
    new = dict(edits)
    assert new[2] == f'from {STAND_INS} import cv2 as cv2'                      # not installed here
    assert new[3] == f'from {STAND_INS} import numpy_1 as np'                   # SG 3.7 needs NumPy 1.x names
    assert new[5] == f'from {STAND_INS} import get_logger'                      # an SG utility
    assert new[6] == f'from {ADAPTER} import PhaseCallback, Phase'              # SG's callback API
    assert new[10] == (f'from copies.callbacks import TrainingStageSwitchCallbackBase; '
                       f'from {ADAPTER} import PhaseContext')
    assert after[16] == f'        from {STAND_INS} import PPYoloELoss'          # inside a function too
    assert after[7:9] == ['', '']                                             # the rest of a multi-line import
    assert 'import os' in after and 'from typing import Optional' in after    # importable: unchanged
    assert after[17] == before[17]


def test_an_import_sharing_its_line_with_code_is_refused():
    with pytest.raises(ValueError, match='shares its line'):
        rewriter().rewrite('x = 1; import cv2\n')


def test_placeholders_fail_when_used_and_numpy_1_has_the_old_names():
    cv2 = placeholder('cv2', 'OpenCV is not installed')
    with pytest.raises(Unavailable, match=r'cv2.getTickCount: cv2 is not available here \(OpenCV'):
        cv2.getTickCount()
    with pytest.raises(Unavailable):
        cv2()
    assert numpy_1.Inf == float('inf') and numpy_1.zeros(2).tolist() == [0.0, 0.0]


def test_callback_classes_are_found_by_their_bases():
    sources = {
        BASE_MODULE: 'class Callback: pass\nclass PhaseCallback(Callback): pass\n',
        'super_gradients/a.py': ('from super_gradients.training.utils.callbacks import PhaseCallback\n'
                                 'class Base(PhaseCallback): pass\nclass Other: pass\n'),
        'super_gradients/b.py': ('from super_gradients.a import Base\nfrom hydra import Callback\n'
                                 'class Sub(Base): pass\nclass NotSG(Callback): pass\n'),
    }
    found = {module.path: module.classes for module in find_callback_modules(sources)}
    assert found == {'super_gradients/a.py': ['Base'], 'super_gradients/b.py': ['Sub']}


def test_the_stand_ins_of_the_visualisation_callbacks_helpers():
    import torch

    from tools.sg_check.stand_ins import (draw_segmentation_masks, maybe_all_gather_as_list,
                                          maybe_all_reduce_tensor_average, tensor_container_to_device)
    image = torch.full((3, 2, 2), 100, dtype=torch.uint8)
    masks = torch.tensor([[[True, False], [False, False]], [[False, True], [False, False]]])
    drawn = draw_segmentation_masks(image, masks, alpha=0.4, colors=['green', 'red'])
    # torchvision's blend: the image at 60%, the mask's colour at 40%; pixels without a mask unchanged
    assert drawn[:, 0, 0].tolist() == [60, 111, 60] and drawn[:, 0, 1].tolist() == [162, 60, 60]
    assert drawn[:, 1, 1].tolist() == [100, 100, 100] and drawn.dtype == torch.uint8
    # one process: the value itself, gathered as a list of one
    value = torch.tensor(2.0)
    assert maybe_all_reduce_tensor_average(value) is value and maybe_all_gather_as_list('x') == ['x']
    nested = tensor_container_to_device({'a': (torch.ones(1, requires_grad=True), 3)}, 'cpu', detach=True)
    assert not nested['a'][0].requires_grad and nested['a'][1] == 3 and isinstance(nested['a'], tuple)
