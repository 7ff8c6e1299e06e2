"""Recipe files: checking (every error at once, by key path), interpolation, overrides, building, show/callbacks."""
import os
import textwrap

import pytest
import torch

from aitoolbox_like.callbacks.basic import EarlyStopping
from aitoolbox_like.callbacks.performance_eval import ModelPerformanceEvaluation
from aitoolbox_like.callbacks.train_schedule import LRSchedulerCallback
from aitoolbox_like.recipes import Recipe, RecipeError
from aitoolbox_like.recipes.cli import main
from aitoolbox_like.recipes.reference import reference_entries
from aitoolbox_like.recipes.registry import REGISTRIES
from aitoolbox_like.results import ClassificationResultPackage

PARTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'recipe_parts.py')


def write_recipe(tmp_path, body, name='recipe.yaml'):
    path = tmp_path / name
    path.write_text(f'imports: [{PARTS}]\nseed: 0\n' + textwrap.dedent(body))
    return str(path)


TINY = '''
data: {name: tiny_loaders}
model: {name: TinyNet}
optimizer: {name: SGD, lr: 0.1}
criterion: {name: CrossEntropyLoss}
loop: {name: TrainLoop, progress_bar: false}
fit: {num_epochs: 2}
'''


def errors_of(path, overrides=()):
    with pytest.raises(RecipeError) as info:
        Recipe.load(path, overrides).validate()
    return info.value.errors


def test_every_problem_is_reported_at_once_with_its_key_path(tmp_path):
    path = write_recipe(tmp_path, '''
        data: {name: tiny_loaders, batch_size: 8.5}
        model: {name: TinyNet, hiden: 4}
        optimiser: {name: SGD}
        optimizer: {name: SGD, lr: 1, momentum: true}
        criterion: {name: CrossEntropyLos}
        loop: {name: TrainLoopCheckpoint, project_name: p, experiment_name: e, local_model_result_folder_path: out,
               cloud_save_mode: local, model: 3}
        callbacks:
          - {name: EarlyStopping, patience: 3}
          - {name: ModelPerformanceEvaluation, result_package: {name: ClassificationResultPackag}, args: {}}
          - {name: EarlyStopping, monitor: val_loss, patience: ten}
          - {name: EarlyStopping, patience: true}
          - {patience: 3}
        fit: {num_epoch: 3}
    ''')
    assert errors_of(path) == [
        "optimiser: unknown key; did you mean optimizer? (a recipe has: imports, seed, vars, data, model, optimizer, "
        "criterion, loop, callbacks, schedulers, fit)",
        "data.batch_size: expected int, got 8.5",
        "model.hiden: unknown argument of TinyNet; did you mean hidden? its arguments: hidden",
        "optimizer.momentum: expected float, got True",          # bool is not a number; lr: 1 (an int) is a float
        "criterion.name: unknown criterion 'CrossEntropyLos'; did you mean CrossEntropyLoss, LinearCrossEntropyLoss? "
        "(or give an import path package.module:Name)",
        "loop.model: set by the recipe from its model section; remove it here",
        "loop.hyperparams: missing: a required argument of TrainLoopCheckpoint",
        "callbacks[1].result_package.name: unknown result_package 'ClassificationResultPackag'; did you mean "
        "ClassificationResultPackage, BinaryClassificationResultPackage? (or give an import path package.module:Name)",
        "callbacks[2].patience: expected int, got 'ten'",
        "callbacks[3].patience: expected int, got True",
        "callbacks[4]: expected the name of a registered callback (or an import path package.module:Name), got no "
        "name key",
        "fit.num_epoch: unknown argument of TrainLoop.fit; did you mean num_epochs? its arguments: num_epochs, "
        "num_iterations, grad_accumulation",
        "fit: give exactly one of num_epochs and num_iterations (a number > 0), got num_epochs=0, num_iterations=0",
    ]


def test_command_line_overrides_are_checked_like_the_file_and_say_so(tmp_path):
    path = write_recipe(tmp_path, TINY + 'callbacks: [{name: EarlyStopping, monitor: val_loss}]\n')
    assert errors_of(path, ['callbacks.0.patience=ten', 'callbacks[0].patiense=3', 'optimizer.lr=fast',
                            'fit.gpus=2']) == [
        "optimizer.lr: expected float or Tensor, got 'fast' (set on the command line)",
        "callbacks[0].patience: expected int, got 'ten' (set on the command line)",
        "callbacks[0].patiense: unknown argument of EarlyStopping; did you mean patience? its arguments: monitor, "
        "min_delta, patience, mode, restore_best_weights (set on the command line)",
        "fit.gpus: unknown argument of TrainLoop.fit; its arguments: num_epochs, num_iterations, grad_accumulation "
        "(set on the command line)",
    ]
    with pytest.raises(RecipeError, match='an override is key.path=value'):
        Recipe.load(path, ['fit.num_epochs'])
    with pytest.raises(RecipeError, match=r"callbacks\[5\].patience: cannot set it from the command line"):
        Recipe.load(path, ['callbacks.5.patience=1'])


def test_ddp_fit_arguments_are_accepted_only_with_gpu_mode_ddp(tmp_path):
    path = write_recipe(tmp_path, TINY)
    Recipe.load(path, ['loop.gpu_mode=ddp', 'fit.num_gpus=2', 'fit.on_gpu=false']).validate()
    assert errors_of(path, ['fit.num_gpus=2']) == [
        "fit.num_gpus: only with loop.gpu_mode 'ddp' or 'fsdp' (the loop's gpu_mode is 'single') (set on the command "
        "line)"]


def test_interpolation_and_environment_variables(tmp_path, monkeypatch):
    monkeypatch.setenv('RECIPE_TEST_LR', '0.25')
    path = write_recipe(tmp_path, '''
        vars: {hidden: 16, out: '${oc.env:RECIPE_TEST_OUT,default_out}'}
        data: {name: tiny_loaders}
        model: {name: TinyNet, hidden: '${vars.hidden}'}
        optimizer: {name: SGD, lr: '${oc.decode:${oc.env:RECIPE_TEST_LR}}'}    # oc.env gives text; oc.decode types it
        criterion: {name: CrossEntropyLoss}
        loop: {name: TrainLoopCheckpoint, project_name: p, experiment_name: e, cloud_save_mode: local,
               local_model_result_folder_path: '${vars.out}', hyperparams: {lr: '${optimizer.lr}'}, progress_bar: false}
        fit: {num_epochs: 1}
    ''')
    recipe = Recipe.load(path)
    assert recipe.config['loop']['local_model_result_folder_path'] == 'default_out'
    run = recipe.build()
    assert run.loop.optimizer.param_groups[0]['lr'] == 0.25
    assert run.loop.hyperparams['lr'] == 0.25
    assert run.loop.model.net[0].out_features == 16
    with pytest.raises(RecipeError, match="Interpolation key 'vars.nope' not found"):
        Recipe.load(path, ['model.hidden=${vars.nope}'])


def test_nested_objects_callbacks_and_torch_schedulers_are_built(tmp_path):
    path = write_recipe(tmp_path, TINY + textwrap.dedent('''
        callbacks:
          - {name: ModelPerformanceEvaluation, result_package: {name: ClassificationResultPackage}, args: {}}
          - {name: EarlyStopping, monitor: val_loss, patience: 5}
        schedulers:
          - {name: StepLR, step_size: 1, gamma: 0.5}
    '''))
    run = Recipe.load(path).build()
    evaluation, stopper, scheduler = run.callbacks
    assert isinstance(evaluation, ModelPerformanceEvaluation)
    assert isinstance(evaluation.result_package, ClassificationResultPackage)
    assert isinstance(stopper, EarlyStopping) and stopper.patience == 5
    assert isinstance(scheduler, LRSchedulerCallback)
    run.fit()
    # Two epochs, stepped at each epoch's end: as torch's own StepLR on a hand-made optimizer.
    reference = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    step_lr = torch.optim.lr_scheduler.StepLR(reference, step_size=1, gamma=0.5)
    for _ in range(2):
        reference.step()
        step_lr.step()
    assert run.loop.optimizer.param_groups[0]['lr'] == reference.param_groups[0]['lr']
    assert 'val_Accuracy' in run.loop.train_history


def test_a_recipe_that_does_not_check_builds_nothing(tmp_path):
    path = write_recipe(tmp_path, TINY.replace('progress_bar: false', 'progress_bar: false, local: 1'))
    with pytest.raises(RecipeError, match=r'loop.local: unknown argument of TrainLoop'):
        Recipe.load(path).build()


def test_show_prints_the_resolved_recipe(tmp_path, capsys):
    path = write_recipe(tmp_path, TINY.replace('lr: 0.1', "lr: '${vars.lr}'") + 'vars: {lr: 0.5}\n')
    assert main(['show', path, 'vars.lr=0.2']) == 0
    out = capsys.readouterr().out
    assert 'optimizer:\n  name: SGD\n  lr: 0.2\n' in out
    assert f'imports:\n- {PARTS}\n' in out        # python files as absolute paths: a saved recipe finds them again
    assert main(['show', path, 'optimizer.lr=fast']) == 2
    assert "optimizer.lr: expected float or Tensor, got 'fast' (set on the command line)" in capsys.readouterr().err


def test_callbacks_lists_every_registered_callback_with_its_arguments(capsys):
    assert main(['callbacks']) == 0
    out = capsys.readouterr().out
    assert "EarlyStopping(monitor='val_loss', min_delta=0.0, patience=0, mode='auto', restore_best_weights=False)\n" \
           "    Stop training when a history metric stops improving.\n" in out
    for name in REGISTRIES['callback'].names():
        assert f'\n{name}(' in '\n' + out
    assert main(['list', 'optimizer']) == 0
    assert '\nAdam(lr=0.001, betas=(0.9, 0.999)' in capsys.readouterr().out
    assert reference_entries('scheduler')[0][0] == sorted(REGISTRIES['scheduler'].names())[0]


def test_every_subcommand_has_help(capsys):
    for command in ('train', 'resume', 'show', 'callbacks', 'list'):
        with pytest.raises(SystemExit) as info:
            main([command, '--help'])
        assert info.value.code == 0
        assert 'usage: ' in capsys.readouterr().out


def test_resume_leaves_a_run_stopped_early_alone_and_trains_an_unfinished_one_on(tmp_path, capsys):
    checkpointing = TINY.replace('loop: {name: TrainLoop, progress_bar: false}',
                                 f'loop: {{name: TrainLoopCheckpoint, project_name: p, experiment_name: e, '
                                 f'local_model_result_folder_path: {tmp_path / "out"}, hyperparams: {{}}, '
                                 f'cloud_save_mode: local, progress_bar: false}}').replace('num_epochs: 2',
                                                                                           'num_epochs: 6')
    # min_delta 10: no epoch improves on the first, so patience 0 stops the run after its second epoch.
    path = write_recipe(tmp_path, checkpointing + 'callbacks: [{name: EarlyStopping, min_delta: 10.0}]\n')
    assert main(['train', path]) == 0
    [folder] = (tmp_path / 'out' / 'p').iterdir()
    assert sorted(os.listdir(folder / 'checkpoint_model'))[-1].endswith('_E1.pth')
    capsys.readouterr()
    assert main(['resume', str(folder)]) == 0
    assert 'finished: stopped early by EarlyStopping_val_loss after 2 epochs' in capsys.readouterr().out
    assert len(os.listdir(folder / 'checkpoint_model')) == 2

    # Without the stopper the same two epochs are not the end: resume trains the rest.
    assert main(['resume', str(folder), 'callbacks=[]']) == 0
    assert sorted(os.listdir(folder / 'checkpoint_model'))[-1].endswith('_E5.pth')
