"""``--backend ray``: Ray Tune runs the trials of the same Optuna study on a local Ray cluster, two at a time, with
the same pruning and the same result files as ``--backend optuna``."""
import os

import optuna
import pytest

from aitoolbox_like.recipes import Recipe
from aitoolbox_like.tuning import tune
from aitoolbox_like.tuning.ray_backend import trial_resources

# One ray at a time, in one pytest-xdist worker (its set-up is paid once, and two would share 2 cores).
pytestmark = pytest.mark.xdist_group('ray')


def test_ray_tune_runs_two_trials_at_once_prunes_like_optuna_and_writes_the_same_files(tmp_path, digits_recipe,
                                                                                       read_csv, monkeypatch, capfd):
    monkeypatch.setenv('OMP_NUM_THREADS', '1')          # Ray's workers inherit it: one thread per trial on 2 cores
    monkeypatch.delenv('DIGITS_OUTPUT_DIR', raising=False)
    out = tmp_path / 'study'
    out.mkdir()
    overrides = ['fit.num_epochs=2', f'vars.output_dir={tmp_path / "runs"}']
    # Two good trials run at once; the third, whose learning rate is far too small, starts when one of them has
    # finished, and the pruner stops it after its first epoch, as under --backend optuna. A threshold on the first
    # val_loss (2.30, chance level, against 1.83 and lower for the good ones) rather than the median of finished
    # trials: which of two concurrent trials finishes first is timing, and a median pruner may then stop the slower
    # good one.
    study = optuna.create_study(storage=f'sqlite:///{out}/study.db', study_name='digits')
    for lr in (3e-3, 2e-3, 1e-5):
        study.enqueue_trial({'optimizer.lr': lr})
    result = tune(digits_recipe, overrides, params=['optimizer.lr=loguniform(1e-5,1e-2)'], trials=3,
                  monitor='val_loss', mode='min', output=out, backend='ray', concurrent=2,
                  pruner=optuna.pruners.ThresholdPruner(upper=2.1))

    # One line per trial on the console (Ray forwards its workers' output); the trials' own logs are in their folders,
    # and nothing warns that PreemptionCheckpoint runs outside the main thread (a Ray trial's fit does).
    printed = ''.join(capfd.readouterr())
    trial_lines = [line for line in printed.splitlines() if ' trial ' in f' {line}' and 'log: ' in line]
    assert len(trial_lines) == 3, printed[-3000:]
    assert 'Epoch 0:' not in printed and 'main thread' not in printed and 'Configuration for experiment' not in printed
    rows = read_csv(out / 'trials.csv')
    assert list(rows[0]) == ['number', 'state', 'value', 'optimizer.lr', 'experiment_dir']
    assert [(r['state'], float(r['optimizer.lr'])) for r in rows] in (
        [('COMPLETE', 3e-3), ('COMPLETE', 2e-3), ('PRUNED', 1e-5)],
        [('COMPLETE', 2e-3), ('COMPLETE', 3e-3), ('PRUNED', 1e-5)])
    for row in rows:
        # Each trial is a train run of its own, and its value is its last epoch's val_loss.
        history = read_csv(os.path.join(row['experiment_dir'], 'results', 'results.csv'))
        assert float(row['value']) == float(history[-1]['val_loss'])
        assert len(history) == (1 if row['state'] == 'PRUNED' else 2)
    pruned = rows[2]
    # Stopped cleanly: its end of training ran (the final plots), which a Ray scheduler's stop would skip.
    assert os.path.isdir(os.path.join(pruned['experiment_dir'], 'results', 'train_end_plots_epoch_0'))

    # Ray ran them in its worker processes, two at a time (one process per concurrent trial, reused by the third).
    trials = optuna.load_study(study_name='digits', storage=f'sqlite:///{out}/study.db').trials
    workers = {t.user_attrs['worker'].split(':')[1] for t in trials}
    assert len(workers) == 2 and str(os.getpid()) not in workers
    # Each trial trained once: the two workers claimed different enqueued trials (Optuna's claim of a waiting trial
    # is not exclusive on SQLite by itself; both once trained trial 0, in two experiment folders).
    assert sorted(os.listdir(tmp_path / 'runs' / 'digits')) == sorted(os.path.basename(r['experiment_dir'])
                                                                     for r in rows)
    assert (out / 'ray' / 'digits').is_dir()        # Ray Tune's own record of the search

    best = min(rows[:2], key=lambda r: float(r['value']))
    assert result.best is not None and result.best.number == int(best['number'])
    assert Recipe.load(out / 'best.yaml').config['optimizer']['lr'] == float(best['optimizer.lr'])
    assert (out / 'history.png').stat().st_size > 0
    import ray      # imported at use: every pytest worker of make test collects this module (a system test)
    assert not ray.is_initialized()                 # the local cluster started for the search is shut down

    # The same command continues the study: it has its three trials, so nothing runs (and no cluster starts).
    again = tune(digits_recipe, overrides, params=['optimizer.lr=loguniform(1e-5,1e-2)'], trials=3,
                 monitor='val_loss', mode='min', output=out, backend='ray', concurrent=2)
    assert [t.number for t in again.trials] == [0, 1, 2] and read_csv(out / 'trials.csv') == rows


@pytest.mark.parametrize('cluster, concurrent, expected', [
    ({'CPU': 16.0}, 4, {'cpu': 4}),
    ({'CPU': 2.0}, 4, {'cpu': 1}),
    ({'CPU': 16.0, 'GPU': 8.0}, 4, {'cpu': 4, 'gpu': 2.0}),
    ({'CPU': 16.0, 'GPU': 1.0}, 2, {'cpu': 8, 'gpu': 0.5}),
    ({'CPU': 16.0, 'GPU': 2.0}, 3, {'cpu': 5, 'gpu': 0.5}),
])
def test_each_trial_gets_its_share_of_the_cluster_gpus_included(cluster, concurrent, expected):
    assert trial_resources(cluster, concurrent) == expected
