"""The saved experiment folder, project folder and bucket look exactly like AIToolbox's: AIToolbox code lists them
and expects only its own files. Our bookkeeping (run claim, pointers, journal, hyperparams.json, temp files) lives
in the hidden folder <root>/.aitoolbox_like/<project>/<experiment folder>/; nothing of ours stays in the bucket."""
import os
import socket
import pickle
import shutil
import threading
import time

import pytest
import torch

from aitoolbox_like.results.reporting import matplotlib_available
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.experiment import bookkeeping_dir, read_pointer
from aitoolbox_like.results.basic import ClassificationResultPackage
# AIToolbox's loops, as its module paths serve them (its end-of-epoch evaluation: 'loss' is in their history).
from aitoolbox_like.torchtrain.train_loop import TrainLoopCheckpoint, TrainLoopCheckpointEndSave
from s3_server import make_bucket, s3_env  # noqa: F401  (fixture)
from saving_helpers import assert_same_weights, make_parts, weights

AITOOLBOX_FOLDERS = ('checkpoint_model', 'model', 'results')


def _loop(cls, root, seed=0, **kwargs):
    model, train, val, test, optimizer = make_parts(seed=seed)
    return cls(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'exp', str(root),
               {'lr': 1e-2}, progress_bar=False, **kwargs)


SCRIPT = os.path.basename(__file__)


def _all_files(folder):
    """Every file under ``folder``, '/'-separated, as a script walking the whole experiment folder sees them."""
    return sorted(os.path.relpath(os.path.join(d, f), folder).replace(os.sep, '/')
                  for d, _, files in os.walk(folder) for f in files)


def _aitoolbox_files(ts, epochs, iterations=(), end_save=True):
    """Every file AIToolbox writes into the experiment folder (and the same keys into the bucket)."""
    files = _aitoolbox_file_set(ts, epochs, iterations)
    found = ['hyperparams_list.txt', SCRIPT] + [f'checkpoint_model/{n}' for n in files['checkpoint_model']]
    if end_save:
        found += [f'model/{n}' for n in files['model']] + [f'results/{n}' for n in files['results']]
    return sorted(found)


def _listing(folder):
    """{subfolder: sorted file paths inside it}, as a user's script walking the folders sees them."""
    found = {}
    for sub in AITOOLBOX_FOLDERS:
        base = os.path.join(folder, sub)
        found[sub] = sorted(os.path.relpath(os.path.join(d, f), base).replace(os.sep, '/')
                            for d, _, files in os.walk(base) for f in files)
    return found


# The metrics of these loops' histories (no evaluation callbacks): one end-of-training plot each (none
# without matplotlib, the plots extra).
HISTORY_PLOTS = ('accumulated_loss', 'loss', 'val_loss') if matplotlib_available() else ()


def _aitoolbox_file_set(ts, epochs, iterations=()):
    """What AIToolbox's ModelCheckpoint / ModelIterationCheckpoint / ModelTrainEndSave write into the three
    folders (names from local_model_save.py / local_results_save.py): the results pickle (targets and
    predictions inside) and the training history plots."""
    return {
        'checkpoint_model': sorted([f'model_exp_{ts}_E{e}.pth' for e in epochs] +
                                   [f'model_exp_{ts}_E{e}_ITER{i}.pth' for e, i in iterations]),
        'model': [f'model_exp_{ts}.pth'],
        'results': sorted([f'results_hyperParams_hist_exp_{ts}.p'] + [f'plots/{m}.png' for m in HISTORY_PLOTS]),
    }


def _load_every_file(folder):
    for sub, names in _listing(folder).items():
        for name in names:
            path = os.path.join(folder, sub, name)
            if name.endswith('.p'):
                with open(path, 'rb') as f:
                    assert set(pickle.load(f)) >= {'results', 'hyperparameters', 'training_history', 'y_true'}
            elif name.endswith('.png'):
                with open(path, 'rb') as f:
                    assert f.read(8) == b'\x89PNG\r\n\x1a\n', path
            else:
                torch.load(path, weights_only=True)


def test_checkpoint_and_end_save_folders_hold_exactly_aitoolboxs_files(tmp_path):
    loop = _loop(TrainLoopCheckpointEndSave, tmp_path, val_result_package=ClassificationResultPackage(),
                 cloud_save_mode='local')
    loop.fit(num_epochs=3)
    ts = loop.experiment_timestamp
    folder = tmp_path / 'proj' / f'exp_{ts}'
    assert _listing(folder) == _aitoolbox_file_set(ts, range(3))
    assert _all_files(folder) == _aitoolbox_files(ts, range(3))
    _load_every_file(folder)
    # Our bookkeeping is in the hidden folder at the root, and the project folder holds nothing else (AIToolbox
    # users list it to find their experiments).
    work = tmp_path / '.aitoolbox_like' / 'proj' / f'exp_{ts}'
    assert bookkeeping_dir(folder) == str(work)
    assert os.listdir(tmp_path / 'proj') == [f'exp_{ts}']
    assert sorted(os.listdir(tmp_path)) == ['.aitoolbox_like', 'proj']
    assert sorted(os.listdir(work)) == ['best_checkpoint.txt', 'hyperparams.json', 'latest_checkpoint.txt', 'run']
    # The run's id, then its machine and process (a later start tells a dead run's leftovers from a live one's).
    assert (work / 'run').read_text() == f'{loop.experiment.run_id}\n{socket.gethostname()} {os.getpid()}\n'
    assert (work / 'latest_checkpoint.txt').read_text() == f'checkpoint_model/model_exp_{ts}_E2.pth'
    assert (work / 'best_checkpoint.txt').read_text().startswith('checkpoint_model/model_exp_')
    assert read_pointer(folder) == str(folder / 'checkpoint_model' / f'model_exp_{ts}_E2.pth')


def test_iteration_checkpoints_also_keep_the_folders_clean(tmp_path):
    loop = _loop(TrainLoopCheckpointEndSave, tmp_path, val_result_package=ClassificationResultPackage(),
                 cloud_save_mode='local', iteration_save_freq=4)
    loop.fit(num_epochs=2)        # 7 batches per epoch: checkpoints after global batches 4, 8, 12
    ts = loop.experiment_timestamp
    folder = tmp_path / 'proj' / f'exp_{ts}'
    assert _listing(folder) == _aitoolbox_file_set(ts, range(2), [(0, 4), (1, 8), (1, 12)])
    assert _all_files(folder) == _aitoolbox_files(ts, range(2), [(0, 4), (1, 8), (1, 12)])
    assert read_pointer(folder) == str(folder / 'checkpoint_model' / f'model_exp_{ts}_E1.pth')


class _LookInside(AbstractCallback):
    """Lists the experiment folder while the epoch's checkpoint is being renamed into place: its temporary file is
    complete then."""

    def __init__(self, renaming):
        super().__init__('look inside', execution_order=200)
        self.renaming = renaming
        self.seen = []

    def on_epoch_begin(self):
        self.renaming.clear()

    def on_epoch_end(self):
        assert self.renaming.wait(10)
        self.seen.append(_all_files(self.train_loop_obj.experiment.dir_path))


def test_temporary_files_of_writes_never_show_in_the_experiment_folder(tmp_path, monkeypatch):
    import aitoolbox_like.storage.local as local
    real_replace, renaming = os.replace, threading.Event()

    def slow_replace(src, dst):
        renaming.set()
        time.sleep(0.3)
        return real_replace(src, dst)
    monkeypatch.setattr(local.os, 'replace', slow_replace)
    loop = _loop(TrainLoopCheckpoint, tmp_path, cloud_save_mode='local')
    look = _LookInside(renaming)
    loop.fit(num_epochs=2, callbacks=[look])
    assert len(look.seen) == 2
    assert not any(name.startswith('.') or '/.' in name for seen in look.seen for name in seen), look.seen


def test_resume_latest_and_from_the_folder_follow_the_pointer(tmp_path):
    first = _loop(TrainLoopCheckpoint, tmp_path, cloud_save_mode='local')
    first.fit(num_epochs=2)
    folder = tmp_path / 'proj' / f'exp_{first.experiment_timestamp}'
    # The pointer, not the newest file, decides: point back at epoch 0 and resume from there.
    pointer = os.path.join(bookkeeping_dir(folder), 'latest_checkpoint.txt')
    with open(pointer, 'w') as f:
        f.write(f'checkpoint_model/model_exp_{first.experiment_timestamp}_E0.pth')
    resumed = _loop(TrainLoopCheckpoint, tmp_path, seed=7, cloud_save_mode='local')
    resumed.fit(num_epochs=2, resume_from=str(folder))
    assert resumed.train_history.get_epochs('loss') == [0, 1]
    assert resumed.experiment_timestamp == first.experiment_timestamp
    assert _all_files(folder) == _aitoolbox_files(first.experiment_timestamp, range(2), end_save=False)

    again = _loop(TrainLoopCheckpoint, tmp_path, seed=8, cloud_save_mode='local')
    again.fit(num_epochs=2, resume_from='latest')     # nothing left to train: state equals the last checkpoint
    assert_same_weights(weights(again.model), weights(resumed.model))


def _bucket_keys(s3_env, bucket):
    pages = s3_env.client().get_paginator('list_objects_v2').paginate(Bucket=bucket)
    return sorted(obj['Key'] for page in pages for obj in page.get('Contents', ()))


def test_s3_bucket_holds_exactly_aitoolboxs_files_and_resume_finds_the_newest_checkpoint(s3_env, tmp_path):
    bucket = make_bucket(s3_env)
    loop = _loop(TrainLoopCheckpointEndSave, tmp_path / 'a', val_result_package=ClassificationResultPackage(),
                 cloud_save_mode='s3', bucket_name=bucket, cloud_dir_prefix='runs')
    loop.fit(num_epochs=2)
    ts = loop.experiment_timestamp
    root = f'runs/proj/exp_{ts}'
    # The whole bucket, as AIToolbox's tests list it: its files only (the run's claim is gone with the run).
    assert _bucket_keys(s3_env, bucket) == [f'{root}/{name}' for name in _aitoolbox_files(ts, range(2))]
    assert loop.upload_failures == []

    # A fresh machine: nothing local, resume from the bucket.
    shutil.rmtree(tmp_path / 'a')
    resumed = _loop(TrainLoopCheckpoint, tmp_path / 'b', seed=5, cloud_save_mode='s3', bucket_name=bucket,
                    cloud_dir_prefix='runs')
    resumed.fit(num_epochs=2, resume_from=f's3://{bucket}/{root}')
    assert_same_weights(weights(resumed.model), weights(loop.model))
    latest = _loop(TrainLoopCheckpoint, tmp_path / 'c', seed=6, cloud_save_mode='s3', bucket_name=bucket,
                   cloud_dir_prefix='runs')
    latest.fit(num_epochs=2, resume_from='latest')
    assert_same_weights(weights(latest.model), weights(loop.model))
    assert _bucket_keys(s3_env, bucket) == [f'{root}/{name}' for name in _aitoolbox_files(ts, range(2))]
