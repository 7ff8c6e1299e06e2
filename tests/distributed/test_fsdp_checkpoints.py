"""Sharded (FSDP) checkpoints beyond test_fsdp.py: written in the background (a stalled write killed with
kill -9 leaves the previous checkpoint as the resume point), the preemption checkpoint on SIGTERM, removal of
sub-optimal checkpoint folders, and resuming from S3 (real SeaweedFS server) on 2 processes and on 1.

Each FSDP test is a few whole runs on 2 gloo processes; results are compared with the same training written by
hand in one process (ddp_scripts/fsdp_checkpoint_common.reference), within rtol 1e-5, atol 1e-6 (sharded
reductions sum in another order)."""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ddp_scripts'))

from aitoolbox_like.checkpoint import sharded as sharded_checkpoint  # noqa: E402
from aitoolbox_like.callbacks.preemption import PreemptionCheckpoint  # noqa: E402
from aitoolbox_like.checkpoint import load_checkpoint  # noqa: E402
from aitoolbox_like.experiment import LATEST_POINTER, find_cloud_checkpoint, read_pointer  # noqa: E402
from aitoolbox_like.storage import BackgroundUploader, LocalStorage, UploadJournal, sync_journal  # noqa: E402
from aitoolbox_like.storage.s3 import S3Storage  # noqa: E402
from helpers import assert_close_states, experiment_dir, one_thread_per_worker  # noqa: E402,F401  (fixture)
from fsdp_checkpoint_common import (BLOCK_WRITE_ENV, RecordStop, SignalSelfOnRank, checkpoint_loop,  # noqa: E402
                                    continued_loop, reference)
from fsdp_common import callbacks, shard_each_layer  # noqa: E402
from s3_server import make_bucket, s3_server  # noqa: E402,F401  (pytest fixture)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FSDP = dict(num_gpus=2, on_gpu=False, fsdp_shard_fn=shard_each_layer)
EMA_KEY = 'ExponentialMovingAverage_0.9'


def checkpoint_names(root):
    return sorted(os.listdir(os.path.join(experiment_dir(root), 'checkpoint_model')))


def latest_train_state(root):
    marker = read_pointer(experiment_dir(root), LATEST_POINTER)
    return marker, load_checkpoint(os.path.join(os.path.dirname(marker), sharded_checkpoint.TRAIN_STATE_FILE))


def _wait_for(paths, process, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if all(os.path.exists(p) for p in paths):
            return True
        time.sleep(0.05)
    return all(os.path.exists(p) for p in paths)


# ---------------------------------------------------------------------------------------------- asynchronous


@pytest.mark.system
@pytest.mark.timeout(300)
def test_kill_9_during_a_background_sharded_write_keeps_the_previous_checkpoint_and_resume_is_exact(tmp_path):
    out = str(tmp_path)
    env = dict(os.environ, OMP_NUM_THREADS='1', **{BLOCK_WRITE_ENV: f'2:{out}'},
               PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get('PYTHONPATH')])))
    script = os.path.join(REPO_ROOT, 'tests', 'distributed', 'ddp_scripts', 'fsdp_async_kill_script.py')
    # The second checkpoint (end of epoch 1) stalls after both ranks wrote their shards, before DCP's .metadata.
    process = subprocess.Popen([sys.executable, script, out], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        # Training goes on meanwhile: epoch 2 is trained to its last batch (4 per epoch) during the stalled write.
        reached = _wait_for([os.path.join(out, n) for n in ('writing_rank0', 'writing_rank1', 'trained_2_3_rank0',
                                                            'trained_2_3_rank1')], process, 150)
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert reached and process.returncode == -9, stderr[-3000:]

    ts = os.listdir(os.path.join(out, 'proj'))[0][len('exp_'):]
    names = checkpoint_names(out)
    # The stalled checkpoint exists only as its hidden temporary folder (shards, no .metadata); the pointer and the
    # epoch-0 checkpoint are untouched.
    assert [n for n in names if not n.startswith('.')] == [f'model_exp_{ts}_E0.dcp']
    [stalled] = [n for n in names if n.startswith('.')]
    assert stalled.startswith(f'.model_exp_{ts}_E1.dcp.') and stalled.endswith('.tmp')
    assert '.metadata' not in os.listdir(os.path.join(experiment_dir(out), 'checkpoint_model', stalled))
    marker, state = latest_train_state(out)
    assert marker.endswith('_E0.dcp/.metadata') and state['loop']['epochs_completed'] == 1

    # The resumed run (the storage works again) continues from epoch 0's checkpoint and ends where the hand-written
    # run ends. rm_subopt_local_models deletes the folders that are neither among the best by val_loss nor the newest.
    resumed = checkpoint_loop(out, rm_subopt_local_models=True, num_best_checkpoints_kept=1)
    resumed.fit(num_epochs=3, callbacks=callbacks(), resume_from='latest', **FSDP)
    ref_model, ref_ema, _ = reference(3)
    assert_close_states(resumed.model.state_dict(), ref_model.state_dict())
    marker, state = latest_train_state(out)
    assert marker.endswith('_E2.dcp/.metadata') and state['loop']['epochs_completed'] == 3
    assert_close_states(state['callbacks'][EMA_KEY]['ema'], ref_ema)
    val_loss = resumed.train_history['val_loss']
    best_epoch = min(range(3), key=lambda e: val_loss[e])
    assert checkpoint_names(out) == sorted({f'model_exp_{ts}_E{best_epoch}.dcp', f'model_exp_{ts}_E2.dcp'})


# ---------------------------------------------------------------------------------------------- preemption


@pytest.mark.timeout(300)
def test_sigterm_to_one_rank_checkpoints_after_the_accumulation_window_and_resume_is_exact(tmp_path):
    """SIGTERM reaches rank 1 alone after global batch 5. The ranks agree on stopping at batch 5 (an agreement after
    every batch: ddp_sync_every=1), which is inside a gradient-accumulation window (3 batches per update, 4 per
    epoch: batch 5 is the second of epoch 1): the sharded checkpoint follows the window's update, after batch 6."""
    first = checkpoint_loop(tmp_path)
    first.fit(num_epochs=3, grad_accumulation=3, callbacks=callbacks() + [
        SignalSelfOnRank(1, 5), PreemptionCheckpoint(ddp_sync_every=1), RecordStop(str(tmp_path))], **FSDP)
    stops = [torch.load(tmp_path / f'stop_rank{r}.pt', weights_only=True) for r in (0, 1)]
    assert [s['last_batch'] for s in stops] == [6, 6]
    assert [s['stop_reason'] for s in stops] == ['another rank was asked to stop', 'received SIGTERM']
    marker, state = latest_train_state(tmp_path)
    assert marker.endswith(f'model_exp_{first.experiment_timestamp}_E1_ITER6.dcp/.metadata')
    assert all(os.path.join(os.path.dirname(marker)) == s['checkpoint_path'] for s in stops)
    assert state['data_position']['batches_done'] == 3 and state['data_position']['grads'] is None

    resumed = checkpoint_loop(tmp_path)
    resumed.fit(num_epochs=3, grad_accumulation=3, callbacks=callbacks(), resume_from='latest', **FSDP)
    ref_model, ref_ema, ref_losses = reference(3, grad_accumulation=3)
    assert_close_states(resumed.model.state_dict(), ref_model.state_dict())
    _, state = latest_train_state(tmp_path)
    assert_close_states(state['callbacks'][EMA_KEY]['ema'], ref_ema)
    # The running losses of the interrupted epoch were kept for every rank, not only rank 0's.
    assert resumed.train_history['accumulated_loss'] == pytest.approx(ref_losses, rel=1e-5)


# ---------------------------------------------------------------------------------------------- S3


def _s3_keys(s3_server, bucket):
    pages = s3_server.client().get_paginator('list_objects_v2').paginate(Bucket=bucket)
    return sorted(obj['Key'] for page in pages for obj in page.get('Contents', ()))


@pytest.mark.timeout(400)
def test_sharded_checkpoints_in_s3_removal_of_suboptimal_folders_and_resume_from_s3_on_2_then_1(
        s3_server, tmp_path, monkeypatch):
    monkeypatch.setenv('AWS_ENDPOINT_URL_S3', s3_server.endpoint_url)     # inherited by the spawned processes
    bucket = make_bucket(s3_server)
    s3 = dict(cloud_save_mode='s3', bucket_name=bucket, cloud_dir_prefix='runs')

    # 2 epochs on 2 processes; only the best (val_loss) and the newest folders stay on disk, S3 keeps them all.
    first = checkpoint_loop(tmp_path / 'a', rm_subopt_local_models=True, num_best_checkpoints_kept=1, **s3)
    first.fit(num_epochs=2, callbacks=callbacks(), **FSDP)
    ts = first.experiment_timestamp
    val_loss = first.train_history['val_loss']
    kept = {f'model_exp_{ts}_E{min(range(2), key=lambda e: val_loss[e])}.dcp', f'model_exp_{ts}_E1.dcp'}
    assert checkpoint_names(tmp_path / 'a') == sorted(kept)
    root = f'runs/proj/exp_{ts}'
    keys = _s3_keys(s3_server, bucket)
    for epoch in (0, 1):
        assert [k for k in keys if f'_E{epoch}.dcp/' in k] == [
            f'{root}/checkpoint_model/model_exp_{ts}_E{epoch}.dcp/{name}'
            for name in ('.metadata', '__0_0.distcp', '__1_0.distcp', 'train_state.pt')]
    cloud = S3Storage(bucket, 'runs')
    assert find_cloud_checkpoint(cloud, f'proj/exp_{ts}') == \
        f'proj/exp_{ts}/checkpoint_model/model_exp_{ts}_E1.dcp/.metadata'
    # The marker is queued last: in the bucket a sharded checkpoint counts once its marker is there.
    folder = os.path.join(experiment_dir(tmp_path / 'a'), 'checkpoint_model', f'model_exp_{ts}_E1.dcp')
    assert [os.path.basename(p) for p in sharded_checkpoint.upload_order(folder)][-1] == '.metadata'

    # The machine is gone: 2 processes resume from the experiment folder in S3. The checkpoint folder is
    # downloaded into the local experiments root, at its place in the experiment folder, then loaded.
    shutil.rmtree(tmp_path / 'a')
    resumed = checkpoint_loop(tmp_path / 'b', **s3)
    resumed.fit(num_epochs=3, callbacks=callbacks(), resume_from=f's3://{bucket}/{root}', **FSDP)
    ref_model, _, _ = reference(3)
    assert_close_states(resumed.model.state_dict(), ref_model.state_dict())
    assert resumed.experiment_timestamp == ts
    assert checkpoint_names(tmp_path / 'b') == [f'model_exp_{ts}_E{e}.dcp' for e in (1, 2)]   # no temporary left

    # Gone again. AIToolbox's way, in one process: ModelLoadContinueTraining finds the newest checkpoint (epoch 2's
    # folder) in S3, downloads it to its place under its local folder and continues; then epoch 1's, by number.
    shutil.rmtree(tmp_path / 'b')
    for epoch_num, folder, epochs in ((None, 'd', 4), (1, 'e', 3)):
        loop, loader = continued_loop(tmp_path / folder, ts, epoch_num, **s3)
        loop.fit(num_epochs=epochs, callbacks=[loader] + callbacks())
        ref_model, ref_ema, _ = reference(epochs)
        assert_close_states(loop.model.state_dict(), ref_model.state_dict())
        assert_close_states(loop.callbacks_handler.callbacks_state_dict()[EMA_KEY]['ema'], ref_ema)
        assert loader.loaded_from == f's3://{bucket}/{root}/checkpoint_model/model_exp_{ts}_E{epochs - 2}.dcp'
        assert checkpoint_names(tmp_path / folder) == [f'model_exp_{ts}_E{epochs - 2}.dcp']
    loop, loader = continued_loop(tmp_path / 'f', ts, 5, **s3)
    with pytest.raises(FileNotFoundError, match=r'epoch_num=5 .*model_exp_.*_E5\.pth nor a complete .*_E5\.dcp/'):
        loop.fit(num_epochs=6, callbacks=[loader])

    # A single-process loop resumes 'latest' from S3 (the local folder is missing): 2 -> 1.
    single = checkpoint_loop(tmp_path / 'c', gpu_mode='single', per_rank_batch=8, **s3)
    single.fit(num_epochs=4, callbacks=callbacks(), resume_from='latest')
    ref_model, ref_ema, _ = reference(4)
    assert_close_states(single.model.state_dict(), ref_model.state_dict())
    assert_close_states(single.callbacks_handler.callbacks_state_dict()[EMA_KEY]['ema'], ref_ema)
    assert single.train_history.get_epochs('val_loss') == [0, 1, 2, 3]


# ---------------------------------------------------------------------------------------------- deleting folders


def _sharded_folder(parent, name='model_exp_ts_E0.dcp'):
    folder = parent / name
    folder.mkdir(parents=True)
    for file_name in ('__0_0.distcp', '__1_0.distcp', 'train_state.pt', '.metadata'):
        (folder / file_name).write_bytes(os.urandom(100))
    return folder


def test_a_checkpoint_folder_is_deleted_whole_once_every_upload_inside_it_is_confirmed(tmp_path):
    """What rm_subopt_local_models does with a sharded checkpoint while S3 is slow: the folder stays complete until
    the last of its files is confirmed, then goes at once; a later process (sync) finishes what a killed one left."""
    gate = threading.Event()

    class GatedStorage(LocalStorage):       # uploads wait for the gate: S3 is slow or down
        def save_file(self, local_path, key):
            assert gate.wait(30)
            super().save_file(local_path, key)

    experiment = tmp_path / 'exp'
    folder = _sharded_folder(experiment / 'checkpoint_model')
    journal = UploadJournal(experiment / 'pending_uploads.json')
    uploader = BackgroundUploader(GatedStorage(tmp_path / 'remote'), journal=journal)
    for path in sharded_checkpoint.upload_order(str(folder)):
        uploader.submit(path, os.path.relpath(path, experiment))
    assert uploader.delete_after_upload(folder) is False
    assert sorted(os.listdir(folder)) == ['.metadata', '__0_0.distcp', '__1_0.distcp', 'train_state.pt']
    assert {e['delete_local_folder'] for e in journal.entries()} == {'checkpoint_model/model_exp_ts_E0.dcp'}
    gate.set()
    assert uploader.wait(timeout=30) == []
    assert not folder.exists() and os.listdir(experiment / 'checkpoint_model') == []
    assert sorted(os.listdir(tmp_path / 'remote' / 'checkpoint_model' / 'model_exp_ts_E0.dcp')) == [
        '.metadata', '__0_0.distcp', '__1_0.distcp', 'train_state.pt']
    assert uploader.delete_after_upload(_sharded_folder(experiment / 'checkpoint_model', 'other.dcp')) is True
    assert os.listdir(experiment / 'checkpoint_model') == []            # nothing pending: deleted at once
    uploader.close()

    # A process that ends with two of the four uploads unconfirmed (S3 down): a sync uploads them, then deletes
    # the folder.
    class DownStorage(LocalStorage):
        def save_file(self, local_path, key):
            raise ConnectionRefusedError('down')

    folder = _sharded_folder(experiment / 'checkpoint_model', 'model_exp_ts_E1.dcp')
    ended = BackgroundUploader(DownStorage(tmp_path / 'remote'), journal=journal, max_retries=None,
                               initial_backoff_s=0.01, max_backoff_s=0.01)
    for path in sharded_checkpoint.upload_order(str(folder))[2:]:
        ended.submit(path, os.path.relpath(path, experiment))
    assert ended.delete_after_upload(folder) is False
    assert len(ended.close(timeout=0.1)) == 2 and folder.is_dir()
    report = sync_journal(experiment)
    assert report.complete and len(report.uploaded) == 2 and not folder.exists()
