"""Real Optuna studies on the digits recipe (one- or two-epoch trials, in this process): the results name the best
trial and best.yaml trains exactly what it trained, the same command continues the study, a pruned trial stops
cleanly and is recorded as PRUNED, a failing or interrupted trial is FAIL and the study goes on, and a wrong PATH
fails before anything trains."""
import argparse
import os
import subprocess
import sys
import time

import optuna
import pytest

from aitoolbox_like.experiment import read_pointer
from aitoolbox_like.recipes import Recipe
from aitoolbox_like.tuning import MonitorNotRecorded, TuneInputError, tune
from aitoolbox_like.tuning.cli import add_tune_parser

from fresh_process import FreshProcess

PARAMS = ['optimizer.lr=loguniform(1e-4,1e-2)', 'vars.batch_size=choice(32,64)']


def _parse(argv):
    parser = argparse.ArgumentParser(prog='aitoolbox-like')
    add_tune_parser(parser.add_subparsers(dest='command', required=True))
    return parser.parse_args(argv)


def _last_epoch(read_csv, experiment_dir):
    """The last row of a trial's own history file (ModelTrainHistoryFileWriter in the recipe)."""
    return read_csv(os.path.join(experiment_dir, 'results', 'results.csv'))[-1]


def test_a_study_names_its_best_trial_and_the_same_command_continues_it(tmp_path, digits_recipe, digits_overrides,
                                                                        read_csv, capsys):
    out = tmp_path / 'study'
    argv = ['tune', digits_recipe, *digits_overrides, '--trials', '2', '--param', PARAMS[0], '--param', PARAMS[1],
            '--monitor', 'val_loss', '--mode', 'min', '--output', str(out)]
    args = _parse(argv)
    assert args.handler(args, argv) == 0
    printed = capsys.readouterr().out

    rows = read_csv(out / 'trials.csv')
    assert list(rows[0]) == ['number', 'state', 'value', 'optimizer.lr', 'vars.batch_size', 'experiment_dir']
    assert [(r['number'], r['state']) for r in rows] == [('0', 'COMPLETE'), ('1', 'COMPLETE')]
    for row in rows:
        # A trial is a train run of its own: the value is its last epoch's val_loss, its recipe has the values.
        assert float(row['value']) == float(_last_epoch(read_csv, row['experiment_dir'])['val_loss'])
        saved = Recipe.load(os.path.join(row['experiment_dir'], 'recipe.yaml')).config
        assert saved['optimizer']['lr'] == float(row['optimizer.lr'])
        assert saved['data']['batch_size'] == int(row['vars.batch_size'])
        with open(os.path.join(row['experiment_dir'], 'command_line.txt')) as f:
            assert f'optimizer.lr={row["optimizer.lr"]}' in f.read()
    best = min(rows, key=lambda r: float(r['value']))
    assert f'best trial {best["number"]}: val_loss={best["value"]} (min)' in printed
    assert f'  optimizer.lr={best["optimizer.lr"]}\n  vars.batch_size={best["vars.batch_size"]}\n' in printed
    assert (out / 'history.png').stat().st_size > 0

    # best.yaml is the recipe with the best values: training it gives the best trial's value again, exactly.
    best_recipe = Recipe.load(out / 'best.yaml', [f'vars.output_dir={tmp_path / "best_run"}'])
    assert best_recipe.config['optimizer']['lr'] == float(best['optimizer.lr'])
    run = best_recipe.build()
    run.fit()
    assert run.loop.train_history['val_loss'][-1] == float(best['value'])

    # The same command with --trials 3 continues the study: the two trials stay, one more runs.
    result = tune(digits_recipe, digits_overrides, params=PARAMS, trials=3, monitor='val_loss', mode='min',
                  output=out)
    rows_again = read_csv(out / 'trials.csv')
    assert rows_again[:2] == rows
    assert [(r['number'], r['state']) for r in rows_again[2:]] == [('2', 'COMPLETE')]
    assert [t.number for t in result.trials] == [0, 1, 2]
    study = optuna.load_study(study_name='digits', storage=f'sqlite:///{out}/study.db')
    assert len(study.trials) == 3
    # ... and a study that has its trials runs none.
    tune(digits_recipe, digits_overrides, params=PARAMS, trials=3, monitor='val_loss', mode='min', output=out)
    assert len(read_csv(out / 'trials.csv')) == 3
    # A continued study searches what it searched: another monitor is refused before any trial.
    with pytest.raises(TuneInputError,
                       match="--monitor: the study 'digits' searched 'val_loss', not 'accumulated_loss'"):
        tune(digits_recipe, digits_overrides, params=PARAMS, trials=4, monitor='accumulated_loss', mode='min',
             output=out)
    assert len(optuna.load_study(study_name='digits', storage=f'sqlite:///{out}/study.db').trials) == 3


def test_a_pruned_trial_stops_cleanly_and_is_recorded_as_pruned(tmp_path, digits_recipe, read_csv):
    out = tmp_path / 'study'
    out.mkdir()
    overrides = ['fit.num_epochs=2', f'vars.output_dir={tmp_path / "runs"}']
    # A good trial first, then one whose learning rate is far too small: after its first epoch its val_loss is
    # worse than the median of the finished trials at that epoch.
    study = optuna.create_study(storage=f'sqlite:///{out}/study.db', study_name='digits')
    study.enqueue_trial({'optimizer.lr': 3e-3})
    study.enqueue_trial({'optimizer.lr': 1e-5})
    tune(digits_recipe, overrides, params=['optimizer.lr=loguniform(1e-5,1e-2)'], trials=2, monitor='val_loss',
         mode='min', output=out, pruner=optuna.pruners.MedianPruner(n_startup_trials=1))

    good, pruned = read_csv(out / 'trials.csv')
    assert (good['state'], pruned['state']) == ('COMPLETE', 'PRUNED')
    history = read_csv(os.path.join(pruned['experiment_dir'], 'results', 'results.csv'))
    assert [r['Epoch'] for r in history] == ['0']                   # stopped after its first epoch ...
    assert float(pruned['value']) == float(history[0]['val_loss'])  # ... with that epoch's value
    # ... cleanly: the epoch's checkpoint is saved and the callbacks' end of training ran (the final plots).
    assert os.listdir(os.path.join(pruned['experiment_dir'], 'checkpoint_model')) == \
        [f'model_{os.path.basename(pruned["experiment_dir"])}_E0.pth']
    assert os.path.isdir(os.path.join(pruned['experiment_dir'], 'results', 'train_end_plots_epoch_0'))
    # best.yaml comes from completed trials only.
    assert Recipe.load(out / 'best.yaml').config['optimizer']['lr'] == 3e-3


def test_a_failing_trial_is_recorded_with_its_error_and_the_study_goes_on(tmp_path, digits_recipe,
                                                                          digits_overrides, read_csv):
    out = tmp_path / 'study'
    out.mkdir()
    study = optuna.create_study(storage=f'sqlite:///{out}/study.db', study_name='digits')
    study.enqueue_trial({'vars.batch_size': 0})          # DataLoader refuses it when the trial builds the data
    study.enqueue_trial({'vars.batch_size': 64})
    result = tune(digits_recipe, digits_overrides, params=['vars.batch_size=choice(0,64)'], trials=2,
                  monitor='val_loss', mode='min', output=out)
    failed, completed = read_csv(out / 'trials.csv')
    assert (failed['state'], failed['value'], failed['experiment_dir']) == ('FAIL', '', '')
    assert completed['state'] == 'COMPLETE'
    assert result.trials[0].error.startswith('ValueError: batch_size should be a positive integer')
    trial = optuna.load_study(study_name='digits', storage=f'sqlite:///{out}/study.db').trials[0]
    assert trial.user_attrs['error'] == result.trials[0].error
    assert f'  trial 0 failed: {result.trials[0].error}' in result.summary()


def test_a_trial_interrupted_by_the_death_of_its_process_is_fail_and_not_counted(tmp_path, digits_recipe, read_csv):
    out = tmp_path / 'study'
    runs = tmp_path / 'runs'
    # A search whose process is killed (SIGKILL: nothing of it can clean up) in the middle of its first trial.
    argv = [sys.executable, '-m', 'aitoolbox_like', 'tune', digits_recipe, 'fit.num_epochs=50',
            f'vars.output_dir={runs}', '--trials', '3', '--param', PARAMS[0], '--monitor', 'val_loss', '--mode',
            'min', '--output', str(out)]
    search = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, 'OMP_NUM_THREADS': '1'})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and search.poll() is None:
            time.sleep(0.2)
            # The trial's history file has its first epoch: it is training the next.
            if list(runs.glob('digits/*/results/results.csv')):
                break
        else:
            raise AssertionError('the search did not reach its first trial\'s second epoch')
    finally:
        search.kill()
        search.wait()

    # The same command again (shorter trials here): the killed trial is FAIL, not counted, and the study goes on.
    result = tune(digits_recipe, ['fit.num_epochs=1', f'vars.output_dir={runs}'], params=PARAMS[:1], trials=1,
                  monitor='val_loss', mode='min', output=out)
    assert [(r['number'], r['state']) for r in read_csv(out / 'trials.csv')] == [('0', 'FAIL'), ('1', 'COMPLETE')]
    assert result.trials[0].error == 'interrupted: the process running it stopped'
    assert 'trial 0 failed: interrupted: the process running it stopped' in '\n'.join(result.summary())


CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), 'aitoolbox-like')


def _tune_command(digits_recipe, runs, out, epochs, *options, overrides=()):
    return [CONSOLE_SCRIPT, 'tune', digits_recipe, f'vars.output_dir={runs}', f'fit.num_epochs={epochs}', *overrides,
            '--param', PARAMS[0], '--monitor', 'val_loss', '--mode', 'min', '--output', out, *options]


def test_ctrl_c_stops_the_search_and_the_same_command_continues_it(tmp_path, digits_recipe, read_csv, warm_python):
    out, runs = tmp_path / 'study', tmp_path / 'runs'
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}

    # The search a user stops: the console script started cold in a process group of its own (a terminal's job).
    with FreshProcess(_tune_command(digits_recipe, runs, out, 50, '--trials', '2'), tmp_path, env,
                      tmp_path / 'search') as search:
        deadline = time.monotonic() + 120
        while not list(runs.glob('digits/*/results/results.csv')):     # the first trial has finished an epoch
            assert search.running() and time.monotonic() < deadline, search.output()[1][-3000:]
            time.sleep(0.05)
        search.ctrl_c()
        search.wait(timeout=120)                    # kills a search still going after that
    stdout, stderr = search.output()
    assert search.returncode == 130, stderr[-3000:]
    assert 'search interrupted' in stderr and 'run the same command again to continue the study to its 2 trials' \
        in stderr
    assert 'Traceback' not in stderr and stdout == ''       # the trial did not finish: no line for it
    [interrupted] = runs.glob('digits/*')
    assert (interrupted / 'train.log').is_file()            # its whole log, in its folder
    study = optuna.load_study(study_name='digits', storage=f'sqlite:///{out}/study.db')
    assert [t.state.name for t in study.trials] == ['FAIL']     # not COMPLETE with its first epoch's value

    # The same command continues the study to its 2 trials; the interrupted one does not count. Its console says one
    # line per trial (the trials' logs are in their folders) and the summary. This one is forked from the tests'
    # zygote (conftest's warm_python), to spare a start of torch.
    again = warm_python.start_here(_tune_command(digits_recipe, runs, out, 1, '--trials', '2'), tmp_path / 'again',
                                   env)
    assert warm_python.wait(again, timeout=300) == 0, again.output()[1][-3000:]
    again_stdout, again_stderr = again.output()
    assert [(r['number'], r['state']) for r in read_csv(out / 'trials.csv')] == [
        ('0', 'FAIL'), ('1', 'COMPLETE'), ('2', 'COMPLETE')]
    lines = again_stdout.splitlines()
    assert [line.split(':')[0] for line in lines if line.startswith('trial ')] == ['trial 1', 'trial 2']
    assert 'Epoch 0' not in again_stdout + again_stderr and 'performance report' not in again_stdout
    for row in read_csv(out / 'trials.csv')[1:]:
        with open(os.path.join(row['experiment_dir'], 'train.log')) as f:
            assert 'End of epoch performance report' in f.read()


EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            'examples')
SLOW_WORKER_MODEL = """
import multiprocessing
import time

from aitoolbox_like.recipes import register_model
from digits_cnn import DigitsCNN


@register_model
class SlowInWorkerDigitsCNN(DigitsCNN):
    def forward(self, x):
        if self.training and multiprocessing.parent_process() is not None:      # in a worker of --concurrent
            time.sleep(1.0)
        return super().forward(x)
"""


@pytest.mark.system
@pytest.mark.timeout(300)
def test_ctrl_c_stops_every_worker_of_a_concurrent_search_each_trial_with_its_checkpoint(tmp_path, digits_recipe):
    """docs/tuning.md: with --concurrent K, Ctrl-C stops every worker's trial after its step with its checkpoint, the
    trials are FAIL (interrupted), the command exits with status 130 and says so. Ctrl-C as a terminal sends it: to
    the whole process group, the search and the workers it started alike. Nothing of the search is left running."""
    out, runs = tmp_path / 'study', tmp_path / 'runs'
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    # The worker's steps take a second (a large model's), this process's are fast: its stop is over while the worker
    # is still in its step, the case where a second SIGINT from the search would cut the worker's stop short.
    (tmp_path / 'slow_worker.py').write_text(SLOW_WORKER_MODEL)
    recipe = tmp_path / 'digits.yaml'
    with open(digits_recipe) as f:
        recipe.write_text(f.read().replace('imports: [../digits_cnn.py]', f'imports: [{EXAMPLES_DIR}/digits_cnn.py, '
                                                                          f'slow_worker.py]')
                          .replace('model: {name: DigitsCNN}', 'model: {name: SlowInWorkerDigitsCNN}'))
    # Trials far longer than the test (no early stop either): both are running when Ctrl-C comes.
    command = _tune_command(str(recipe), runs, out, 1000, '--trials', '2', '--concurrent', '2',
                            overrides=['callbacks.6.patience=1000', 'vars.batch_size=512'])
    with FreshProcess(command, tmp_path, env, tmp_path / 'search') as search:
        deadline = time.monotonic() + 200
        while len(list(runs.glob('digits/*/results/results.csv'))) < 2:    # each trial has finished an epoch
            assert search.running() and time.monotonic() < deadline, search.output()[1][-3000:]
            time.sleep(0.05)
        search.ctrl_c()
        search.wait(timeout=120)                    # kills a search still going after that
        deadline = time.monotonic() + 60            # a process that outlives the command, until it ends or 60 s
        while search.left_running() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = search.left_running()
    stdout, stderr = search.output()
    assert search.returncode == 130, stderr[-3000:]
    assert left == []
    assert 'search interrupted (received SIGINT): the running trials are recorded as FAIL (interrupted) and not ' \
           'counted; run the same command again to continue the study to its 2 trials' in stderr
    assert 'Traceback' not in stderr and stdout == '', stderr[-4000:]
    study = optuna.load_study(study_name='digits', storage=f'sqlite:///{out}/study.db')
    assert [t.state.name for t in study.trials] == ['FAIL', 'FAIL']
    assert len({t.user_attrs['worker'] for t in study.trials}) == 2         # one trial in each process
    # Each trial stopped after its step, with its checkpoint: the one its folder's pointer names (inside an epoch, or
    # the epoch's own when the Ctrl-C came at its end: its evaluation or its checkpoint write, which the stop uses).
    folders = sorted(runs.glob('digits/*'))
    assert len(folders) == 2, folders
    for folder in folders:
        with open(folder / 'train.log') as f:
            log = f.read()
        assert 'received SIGINT: checkpoint saved; continue with' in log, log[-3000:]
        assert 'Traceback' not in log and 'KeyboardInterrupt' not in log, log[-3000:]
        latest = read_pointer(folder)
        assert os.path.isfile(latest) and ('_ITER' in os.path.basename(latest) or 'at the end of epoch' in log), \
            (latest, log[-3000:])


def test_a_wrong_search_fails_before_anything_trains(tmp_path, digits_recipe, digits_overrides):
    out = tmp_path / 'study'
    with pytest.raises(TuneInputError) as error:
        tune(digits_recipe, digits_overrides, params=['optimizr.lr=loguniform(1e-4,1e-2)',
                                                      'vars.batch_size=choice(64,32,64)'],
             trials=0, monitor='val_loss', mode='min', output=out)
    # Everything at once: the arguments, the SPECs, the PATHs.
    assert error.value.errors == [
        '--trials: expected an int >= 1, got 0',
        '--param vars.batch_size=choice(64,32,64): 64 is given twice',
        '--param optimizr.lr: unknown key path of the recipe; did you mean optimizer.lr?',
    ]
    with pytest.raises(TuneInputError, match='--address auto: a Ray cluster is used only with --backend ray'):
        tune(digits_recipe, digits_overrides, params=PARAMS, trials=2, monitor='val_loss', mode='min', output=out,
             address='auto')
    assert not out.exists() and not (tmp_path / 'runs').exists()


def test_a_misspelt_monitor_is_refused_before_any_trial(tmp_path, digits_recipe, digits_overrides):
    # Every callback of the digits recipe says what it records (its own WorstClassReport declares history_names).
    with pytest.raises(TuneInputError) as error:
        tune(digits_recipe, digits_overrides, params=PARAMS[:1], trials=2, monitor='val_acc', mode='max',
             output=tmp_path / 'study')
    assert error.value.errors[0].startswith('--monitor val_acc: no epoch of this recipe records it; did you mean '
                                            'val_Accuracy?')
    assert 'val_worst_class_errors' in error.value.errors[0]
    assert not (tmp_path / 'runs').exists() and not (tmp_path / 'study').exists()


UNDECLARED_CALLBACK = """
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.recipes import register_callback


@register_callback
class AccuracyCopy(AbstractCallback):
    # No history_names: what it records can only be seen once an epoch has run.
    def __init__(self):
        super().__init__('accuracy copy')

    def on_epoch_end(self):
        loop = self.train_loop_obj
        loop.insert_metric_result_into_history('val_acc_copy', loop.train_history['val_Accuracy'][-1])
"""


def test_a_monitor_the_first_epoch_did_not_record_stops_the_search_and_does_not_bind_the_study(
        tmp_path, digits_recipe, digits_overrides, read_csv):
    (tmp_path / 'copy_callback.py').write_text(UNDECLARED_CALLBACK)
    with open(digits_recipe) as f:
        text = f.read().replace('imports: [../digits_cnn.py]',
                                f'imports: [{os.path.dirname(digits_recipe)}/../digits_cnn.py, '
                                f'{tmp_path / "copy_callback.py"}]')
    recipe = tmp_path / 'digits_copy.yaml'
    recipe.write_text(text.replace('  - {name: WorstClassReport}\n',
                                   '  - {name: WorstClassReport}\n  - {name: AccuracyCopy}\n'))
    overrides = digits_overrides
    with pytest.raises(MonitorNotRecorded) as error:
        tune(str(recipe), overrides, params=PARAMS[:1], trials=2, monitor='val_acc_cpy', mode='max',
             output=tmp_path / 'study')
    assert error.value.errors[0].startswith('--monitor val_acc_cpy: the first epoch recorded no val_acc_cpy; did you '
                                            'mean val_acc_copy')
    assert not (tmp_path / 'study' / 'trials.csv').exists()
    # The study is not bound to the misspelt name: the right one continues it, and the stopped try does not count.
    result = tune(str(recipe), overrides, params=PARAMS[:1], trials=1, monitor='val_acc_copy', mode='max',
                  output=tmp_path / 'study')
    assert [(r['number'], r['state']) for r in read_csv(tmp_path / 'study' / 'trials.csv')] == [('0', 'FAIL'),
                                                                                                 ('1', 'COMPLETE')]
    assert result.best is not None and result.best.number == 1


def test_concurrent_trials_run_in_as_many_processes(tmp_path, digits_recipe, digits_overrides, read_csv):
    out = tmp_path / 'study'
    result = tune(digits_recipe, digits_overrides, params=PARAMS, trials=2, monitor='val_loss', mode='min', output=out,
                  concurrent=2)
    assert [r['state'] for r in read_csv(out / 'trials.csv')] == ['COMPLETE', 'COMPLETE']
    assert result.best is not None and os.path.isfile(out / 'best.yaml')
    study = optuna.load_study(study_name='digits', storage=f'sqlite:///{out}/study.db')
    workers = {trial.user_attrs['worker'] for trial in study.trials}
    assert len(workers) == 2 and f':{os.getpid()}' in ' '.join(workers)


_CLAIM_TRIALS = '''
import os, sys, time
import optuna
from aitoolbox_like.tuning.optuna_backend import load_study
from aitoolbox_like.tuning.trial import StudySettings
optuna.logging.set_verbosity(optuna.logging.WARNING)
settings = StudySettings(recipe='', overrides=[], params=[], monitor='v', mode='min', trials=20,
                         output_dir=sys.argv[1], study_name='claims')
study = load_study(settings)
print('ready', flush=True)
while not os.path.exists(sys.argv[2]):      # both processes start claiming at the same moment
    time.sleep(0.01)
study.optimize(lambda trial: print(trial.number, flush=True) or 0.0, n_trials=20)
'''


def _run_together(warm, code, tmp_path, go, count=2, timeout=120):
    """``count`` processes of ``code`` (argv: tmp_path, go), let go at once when each has loaded the study (its first
    line is 'ready'); the trial numbers they printed, after each exited 0."""
    script = tmp_path / 'worker.py'
    script.write_text(code)
    env = dict(os.environ, OMP_NUM_THREADS='1')
    workers = [warm.start_here([script, tmp_path, go], tmp_path / f'worker{i}', env) for i in range(count)]
    deadline = time.monotonic() + timeout
    while not all(open(w.stdout_path).readline().strip() == 'ready' for w in workers):
        assert time.monotonic() < deadline, [w.output() for w in workers]
        time.sleep(0.01)
    go.touch()
    codes = [warm.wait(w, timeout) for w in workers]
    assert codes == [0] * count, [w.output() for w in workers]
    return [int(n) for w in workers for n in w.output()[0].split()[1:]]


def test_two_processes_sharing_the_sqlite_study_never_run_the_same_enqueued_trial(tmp_path, warm_python):
    # Optuna claims an enqueued (WAITING) trial with SELECT ... FOR UPDATE, which SQLite ignores: without the
    # search's claim lock, two processes took the same trial (2 to 6 of these 40 each time) and trained it twice.
    from aitoolbox_like.tuning.optuna_backend import open_study
    from aitoolbox_like.tuning.trial import StudySettings
    settings = StudySettings(recipe='', overrides=[], params=[], monitor='v', mode='min', trials=20,
                             output_dir=str(tmp_path), study_name='claims')
    study = open_study(settings)
    for i in range(40):
        study.enqueue_trial({'x': i})
    go = tmp_path / 'go'
    ran = _run_together(warm_python, _CLAIM_TRIALS, tmp_path, go)
    assert sorted(ran) == list(range(40))


_TAKE_TRIALS = '''
import os, sys, time
import optuna
from aitoolbox_like.tuning.optuna_backend import StudyFull, load_study
from aitoolbox_like.tuning.trial import StudySettings
optuna.logging.set_verbosity(optuna.logging.WARNING)
settings = StudySettings(recipe='', overrides=[], params=[], monitor='v', mode='min', trials=12,
                         output_dir=sys.argv[1], study_name='slots')
study = load_study(settings)
print('ready', flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
try:
    study.optimize(lambda trial: print(trial.number, flush=True) or 0.0, n_trials=30)
except StudyFull:
    pass
'''


def test_processes_sharing_the_sqlite_study_end_it_with_exactly_its_trials(tmp_path, warm_python):
    # The tasks of a SLURM job array (or --concurrent workers) each add trials until the study has --trials: counting
    # and adding are one step under the database folder's lock, so two never take the last slot.
    from aitoolbox_like.tuning.optuna_backend import open_study
    from aitoolbox_like.tuning.trial import StudySettings
    open_study(StudySettings(recipe='', overrides=[], params=[], monitor='v', mode='min', trials=12,
                             output_dir=str(tmp_path), study_name='slots'))
    go = tmp_path / 'go'
    ran = _run_together(warm_python, _TAKE_TRIALS, tmp_path, go)
    assert sorted(ran) == list(range(12))
    assert len(optuna.load_study(study_name='slots', storage=f'sqlite:///{tmp_path}/study.db').trials) == 12
