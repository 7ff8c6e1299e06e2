"""Ray Train: a TrainLoop(gpu_mode='ddp') inside TorchTrainer workers, with RayTrainReport and resume_from='auto'.

One test, because a Ray cluster and a TorchTrainer fit cost tens of seconds: a worker SIGKILLs itself mid-epoch, Ray
replaces the worker group, the run resumes from the checkpoint RayTrainReport reported to S3, and the final weights
are those of the same loop trained without Ray and without a failure (fit(gpu_mode='ddp') spawning 2 processes,
which gives the same weights as an uninterrupted Ray run: same process-group backend, seeds and data order)."""
import os
import sys

import pytest
import torch

from aitoolbox_like.checkpoint import load_checkpoint
from aitoolbox_like.adapters.ray import CHECKPOINT_FILE_NAME, RayTrainReport
from helpers import state_equal
from s3_server import make_bucket, s3_server  # noqa: F401  (pytest fixture)

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ray_scripts')
sys.path.insert(0, SCRIPTS)

from ray_train_fn import KILL_AT, NUM_EPOCHS, build_loop, train_fn  # noqa: E402

# One ray at a time, in one pytest-xdist worker (its set-up is paid once, and two would share 2 cores).
pytestmark = pytest.mark.xdist_group('ray')


@pytest.mark.timeout(600)
def test_killed_worker_resumes_from_the_s3_checkpoint_to_the_uninterrupted_weights(tmp_path, s3_server, monkeypatch,
                                                                                    quick_ray_train):
    # Ray imported here, not at the top: the module is collected by every pytest worker of make test too, which
    # leaves out this system test.
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    monkeypatch.setenv('OMP_NUM_THREADS', '1')      # inherited by the spawned processes and Ray's workers
    reference = build_loop()
    reference.fit(num_epochs=NUM_EPOCHS, num_gpus=2, on_gpu=False)

    bucket = make_bucket(s3_server)
    # Ray's workers are started by this process's Ray node: they inherit its environment (the S3 credentials the
    # fixture set, and this folder so that they import ray_train_fn by name).
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join(p for p in (SCRIPTS, os.environ.get('PYTHONPATH')) if p))
    marker, starts = tmp_path / 'killed', tmp_path / 'starts.txt'
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        trainer = TorchTrainer(
            train_fn, train_loop_config={'kill_marker': str(marker), 'starts_file': str(starts)},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name='killed', failure_config=FailureConfig(max_failures=1),
                                 storage_path=f's3://{bucket}/ray?endpoint_override={s3_server.endpoint_url}'))
        result = trainer.fit()
        with result.checkpoint.as_directory() as folder:
            final = load_checkpoint(os.path.join(folder, CHECKPOINT_FILE_NAME))
    finally:
        ray.shutdown()

    assert marker.exists()                                  # rank 1 did kill itself
    # Two attempts: from scratch, then from the checkpoint of the epoch before the kill.
    assert starts.read_text().split() == ['0', str(KILL_AT[0])]
    assert result.checkpoint.path.startswith(f'{bucket}/ray/killed/')
    assert state_equal(final['model_state_dict'], reference.model.state_dict())
    history = reference.train_history
    assert result.metrics == {'accumulated_loss': history['accumulated_loss'][-1],
                              'val_loss': history['val_loss'][-1], 'epoch': NUM_EPOCHS - 1}


def test_outside_a_ray_worker_fit_fails_before_the_first_step():
    loop = build_loop(gpu_mode='single')
    before = {k: v.clone() for k, v in loop.model.state_dict().items()}
    with pytest.raises(RuntimeError, match='not a Ray Train worker: call fit.. inside the function given to '
                                           'ray.train.torch.TorchTrainer'):
        loop.fit(num_epochs=1, callbacks=[RayTrainReport()], resume_from='auto')
    assert state_equal(loop.model.state_dict(), before)
