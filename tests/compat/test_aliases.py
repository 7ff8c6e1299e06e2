"""Every module path and name of AIToolbox 1.8.0's torchtrain / experiment / utils / cloud / nlp packages imports both
ways: as ``aitoolbox.X`` under the compat runner and as ``aitoolbox_like.X`` after a search-and-replace.

aitoolbox_1_8_0_api.json lists AIToolbox 1.8.0's public modules and the classes / functions each defines or
(for package __init__ files) exports; it was generated from AIToolbox's source with the ast module.
"""
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import aitoolbox_like
from aitoolbox_like import compat

API = json.loads(Path(__file__).with_name('aitoolbox_1_8_0_api.json').read_text())


def renamed(module):
    return 'aitoolbox_like' + module[len('aitoolbox'):]


def run(code, cwd, env_extra=None, args=()):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, *args, '-c', code] if code else [sys.executable, *args],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


@pytest.mark.parametrize('module', sorted(API))
def test_every_aitoolbox_module_and_name_imports_after_renaming(module):
    imported = importlib.import_module(renamed(module))
    for name in API[module]:
        value = getattr(imported, name)
        assert value is not None
        # the same object whichever path it is reached by
        assert getattr(imported, name) is value


def test_every_aitoolbox_module_and_name_imports_unchanged_under_the_runner(tmp_path):
    # One subprocess (install() changes the interpreter's import system) that imports everything both ways
    # and checks that both paths give the very same objects.
    script = tmp_path / 'all_names.py'
    script.write_text(textwrap.dedent(f'''
        import importlib, json
        api = json.loads({json.dumps(json.dumps(API))})
        checked = 0
        for module, names in api.items():
            original = importlib.import_module(module)
            own = importlib.import_module('aitoolbox_like' + module[len('aitoolbox'):])
            for name in names:
                if module == 'aitoolbox' and name == 'TrainLoop':
                    # aitoolbox_like's own top-level TrainLoop (no training-set pass by default); AIToolbox's is
                    # its subclass with AIToolbox's default, served on AIToolbox's paths.
                    assert issubclass(getattr(original, name), getattr(own, name)), (module, name)
                else:
                    assert getattr(original, name) is getattr(own, name), (module, name)
                checked += 1
        print(checked)
    '''))
    result = run(None, tmp_path, args=('-m', 'aitoolbox_like.compat', str(script)))
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.strip()) == sum(len(names) for names in API.values())


def test_aliases_are_our_modules_not_copies():
    import aitoolbox_like.callbacks.basic as basic
    import aitoolbox_like.torchtrain.callbacks.basic as aliased
    assert aliased is basic
    assert basic.__spec__.name == 'aitoolbox_like.callbacks.basic'      # our module keeps its own identity
    from aitoolbox_like.experiment.result_package.basic_packages import ClassificationResultPackage
    from aitoolbox_like.results import ClassificationResultPackage as ours
    assert ClassificationResultPackage is ours


def test_star_import_of_train_loop_package_gives_aitoolbox_s_loops_built_on_ours():
    namespace = {}
    exec('from aitoolbox_like.torchtrain.train_loop import *', namespace)
    from aitoolbox_like.compat import loops
    from aitoolbox_like.tracking import TrainLoopCheckpoint, TrainLoopCheckpointEndSave, TrainLoopEndSave
    assert namespace['TrainLoop'] is loops.TrainLoop and issubclass(loops.TrainLoop, aitoolbox_like.TrainLoop)
    for name, ours in (('TrainLoopCheckpoint', TrainLoopCheckpoint), ('TrainLoopEndSave', TrainLoopEndSave),
                       ('TrainLoopCheckpointEndSave', TrainLoopCheckpointEndSave)):
        assert namespace[name] is getattr(loops, name)
        assert issubclass(namespace[name], ours) and issubclass(namespace[name], loops.TrainLoop)
        assert namespace[name].EVAL_TRAIN_SET_DEFAULT and not ours.EVAL_TRAIN_SET_DEFAULT


def test_the_renamed_top_level_train_loop_is_ours_and_aitoolbox_s_is_aitoolbox_s(tmp_path):
    # aitoolbox_like.TrainLoop is the package's own (README's), with its default: no pass over the training set after
    # an epoch. AIToolbox's, with the pass, is what its paths serve: aitoolbox.TrainLoop under the runner,
    # aitoolbox_like.torchtrain.* after a rename (docs/migrating-from-aitoolbox.md).
    script = tmp_path / 'which_loop.py'
    script.write_text('import aitoolbox, aitoolbox_like, aitoolbox_like.torchtrain.train_loop\n'
                      'print(aitoolbox_like.TrainLoop.EVAL_TRAIN_SET_DEFAULT, aitoolbox.TrainLoop.EVAL_TRAIN_SET_DEFAULT, '
                      'aitoolbox.TrainLoop is aitoolbox_like.torchtrain.train_loop.TrainLoop)\n')
    result = run(None, tmp_path, args=('-m', 'aitoolbox_like.compat', str(script)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ['False', 'True', 'True']


def test_top_level_offers_aitoolbox_names_lazily(tmp_path):
    code = ('import sys, aitoolbox_like\n'
            'lazy = [m for m in ("aitoolbox_like.callbacks.tensorboard", "aitoolbox_like.callbacks.wandb", '
            '"aitoolbox_like.tracking", "boto3", "tensorboard", "wandb", "matplotlib") if m in sys.modules]\n'
            'from aitoolbox_like import TrainLoopCheckpointEndSave, TensorboardFullTracking, EarlyStopping\n'
            'names = {}\n'
            'exec("from aitoolbox_like import *", names)\n'
            'print(lazy, "TrainLoopCheckpoint" in names, "ClassificationResultPackage" in names, '
            '"wandb" in sys.modules)')
    result = run(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ['[]', 'True', 'True', 'False']


def test_aitoolbox_is_not_importable_without_the_runner(tmp_path):
    result = run('import aitoolbox_like; import aitoolbox', tmp_path)
    assert result.returncode != 0 and "No module named 'aitoolbox'" in result.stderr


def test_runner_passes_arguments_and_exit_code(tmp_path):
    script = tmp_path / 'user_script.py'
    script.write_text(textwrap.dedent('''
        import sys
        from aitoolbox.torchtrain.train_loop import TrainLoop
        from aitoolbox import TrainLoop as top_level
        assert TrainLoop is top_level
        print(__name__, sys.argv[1:], TrainLoop.__module__)
        sys.exit(3)
    '''))
    result = run(None, tmp_path, args=('-m', 'aitoolbox_like.compat', str(script), 'a', '--b'))
    assert result.returncode == 3, result.stderr
    assert result.stdout.split() == ['__main__', "['a',", "'--b']", 'aitoolbox_like.compat.loops']


def test_runner_does_not_hide_a_real_aitoolbox_unless_forced(tmp_path):
    fake = tmp_path / 'site' / 'aitoolbox'
    fake.mkdir(parents=True)
    (fake / '__init__.py').write_text('REAL = True\n')
    script = tmp_path / 'user_script.py'
    script.write_text('import aitoolbox\nprint(getattr(aitoolbox, "REAL", False))\n')
    env = {'PYTHONPATH': str(tmp_path / 'site')}
    refused = run(None, tmp_path, env, args=('-m', 'aitoolbox_like.compat', str(script)))
    assert refused.returncode == 2
    assert 'a real AIToolbox is installed' in refused.stderr and '--force' in refused.stderr
    forced = run(None, tmp_path, env, args=('-m', 'aitoolbox_like.compat', '--force', str(script)))
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.strip() == 'False'
    notebook = run('from aitoolbox_like import compat\ntry:\n    compat.install()\nexcept compat.AIToolboxShadowingError '
                   'as e:\n    print("refused")\n', tmp_path, env)
    assert notebook.stdout.strip() == 'refused', notebook.stderr


def test_install_in_a_notebook_and_uninstall(tmp_path):
    code = textwrap.dedent('''
        from aitoolbox_like import compat
        compat.install()
        from aitoolbox.torchtrain.model import TTModel
        import aitoolbox_like
        assert TTModel is aitoolbox_like.TTModel and compat.is_installed()
        compat.uninstall()
        try:
            import aitoolbox
        except ImportError:
            print('gone')
    ''')
    result = run(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'gone'


def test_unsupported_names_import_and_fail_clearly_when_used():
    from aitoolbox_like.experiment.local_experiment_saver import FullKerasExperimentLocalSaver
    from aitoolbox_like.torchtrain.train_loop.components.ddp_handler import DDPHandler
    with pytest.raises(NotImplementedError, match='Keras models are not supported'):
        FullKerasExperimentLocalSaver('project', 'experiment')
    with pytest.raises(NotImplementedError, match="gpu_mode='ddp'"):
        DDPHandler(None)


def test_alias_table_covers_exactly_aitoolbox_s_modules():
    from aitoolbox_like.compat.aliases import MODULES
    assert {('aitoolbox.' + key).rstrip('.') for key in MODULES} == set(API)
    assert compat.is_installed() is False
