"""The saved experiment folder looks like AIToolbox's: checkpoint_model/, model/ and results/ hold only saved
models and results; our bookkeeping (pointers, run marker, temp files) is at the root."""
import os
import pickle
import shutil

import pytest
import torch

from aitoolbox_like.experiment.reporting import matplotlib_available
from aitoolbox_like.result_package.basic import ClassificationResultPackage
from aitoolbox_like.tracking import TrainLoopCheckpoint, TrainLoopCheckpointEndSave
from s3_server import make_bucket, s3_env  # noqa: F401  (fixture)
from saving_helpers import assert_same_weights, make_parts, weights

AITOOLBOX_FOLDERS = ('checkpoint_model', 'model', 'results')


def _loop(cls, root, seed=0, **kwargs):
    model, train, val, test, optimizer = make_parts(seed=seed)
    return cls(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'exp', str(root),
               {'lr': 1e-2}, progress_bar=False, **kwargs)


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
    _load_every_file(folder)
    # Our bookkeeping is at the root.
    assert (folder / 'latest_checkpoint.txt').read_text() == f'checkpoint_model/model_exp_{ts}_E2.pth'
    assert (folder / 'best_checkpoint.txt').read_text().startswith('checkpoint_model/model_exp_')


def test_iteration_checkpoints_also_keep_the_folders_clean(tmp_path):
    loop = _loop(TrainLoopCheckpointEndSave, tmp_path, val_result_package=ClassificationResultPackage(),
                 cloud_save_mode='local', iteration_save_freq=4)
    loop.fit(num_epochs=2)        # 7 batches per epoch: checkpoints after global batches 4, 8, 12
    ts = loop.experiment_timestamp
    folder = tmp_path / 'proj' / f'exp_{ts}'
    assert _listing(folder) == _aitoolbox_file_set(ts, range(2), [(0, 4), (1, 8), (1, 12)])
    assert (folder / 'latest_checkpoint.txt').read_text() == f'checkpoint_model/model_exp_{ts}_E1.pth'


def test_resume_latest_and_from_the_folder_follow_the_root_pointer(tmp_path):
    first = _loop(TrainLoopCheckpoint, tmp_path, cloud_save_mode='local')
    first.fit(num_epochs=2)
    folder = tmp_path / 'proj' / f'exp_{first.experiment_timestamp}'
    # The pointer, not the newest file, decides: point back at epoch 0 and resume from there.
    (folder / 'latest_checkpoint.txt').write_text(f'checkpoint_model/model_exp_{first.experiment_timestamp}_E0.pth')
    resumed = _loop(TrainLoopCheckpoint, tmp_path, seed=7, cloud_save_mode='local')
    resumed.fit(num_epochs=2, resume_from=str(folder))
    assert resumed.train_history.get_epochs('loss') == [0, 1]
    assert resumed.experiment_timestamp == first.experiment_timestamp

    again = _loop(TrainLoopCheckpoint, tmp_path, seed=8, cloud_save_mode='local')
    again.fit(num_epochs=2, resume_from='latest')     # nothing left to train: state equals the last checkpoint
    assert_same_weights(weights(again.model), weights(resumed.model))


def test_experiment_folders_of_the_old_layout_still_resume(tmp_path):
    first = _loop(TrainLoopCheckpoint, tmp_path, cloud_save_mode='local')
    first.fit(num_epochs=2)
    ts = first.experiment_timestamp
    folder = tmp_path / 'proj' / f'exp_{ts}'
    # The layout before the pointers moved to the root: checkpoint_model/latest holding the file name.
    os.remove(folder / 'latest_checkpoint.txt')
    os.remove(folder / 'best_checkpoint.txt')
    (folder / 'checkpoint_model' / 'latest').write_text(f'model_exp_{ts}_E0.pth')
    resumed = _loop(TrainLoopCheckpoint, tmp_path, seed=3, cloud_save_mode='local')
    resumed.fit(num_epochs=1, resume_from=str(folder))
    assert resumed.train_history.get_epochs('loss') == [0]


def test_s3_folders_hold_exactly_aitoolboxs_files_and_resume_follows_the_root_pointer(s3_env, tmp_path):
    bucket = make_bucket(s3_env)
    loop = _loop(TrainLoopCheckpointEndSave, tmp_path / 'a', val_result_package=ClassificationResultPackage(),
                 cloud_save_mode='s3', bucket_name=bucket, cloud_dir_prefix='runs')
    loop.fit(num_epochs=2)
    ts = loop.experiment_timestamp
    root = f'runs/proj/exp_{ts}'
    pages = s3_env.client().get_paginator('list_objects_v2').paginate(Bucket=bucket, Prefix=root + '/')
    keys = [obj['Key'][len(root) + 1:] for page in pages for obj in page.get('Contents', ())]
    in_folders = {sub: sorted(k[len(sub) + 1:] for k in keys if k.startswith(sub + '/')) for sub in AITOOLBOX_FOLDERS}
    assert in_folders == _aitoolbox_file_set(ts, range(2))
    assert {'latest_checkpoint.txt', 'best_checkpoint.txt'} <= set(keys)

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
