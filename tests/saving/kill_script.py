"""Training run used by the kill -9 tests: trains, optionally SIGKILLs itself at a given point, or resumes.

python kill_script.py OUT_DIR RESULT_FILE [--epochs N] [--iter-freq K] [--kill-at-batch T] [--resume]
                      [--big-buffer N] [--cloud MODE --bucket NAME]

With --cloud the run also uploads to the bucket (under the prefix 'runs'); the cloud's endpoint comes from the
environment (AWS_ENDPOINT_URL_S3, STORAGE_EMULATOR_HOST, AZURE_STORAGE_CONNECTION_STRING).
"""
import argparse
import os
import signal
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(1)

from aitoolbox_like import AbstractCallback  # noqa: E402
from aitoolbox_like.callbacks.basic import EarlyStopping  # noqa: E402
from aitoolbox_like.callbacks.train_schedule import StepLRScheduler  # noqa: E402
from aitoolbox_like.tracking import TrainLoopCheckpoint  # noqa: E402
from saving_helpers import make_parts, weights  # noqa: E402


class KillAt(AbstractCallback):
    """SIGKILL this process in the middle of a training step (after backward, before the optimizer step)."""

    def __init__(self, batch_idx):
        super().__init__('kill -9', execution_order=0)
        self.batch_idx = batch_idx

    def on_after_backward(self):
        if self.train_loop_obj.total_iteration_idx == self.batch_idx:
            # Checkpoints are written in the background: let the last one finish, so the kill lands after it
            # (killing during a background write is tested in test_async_checkpoint.py).
            for callback in self.train_loop_obj.callbacks:
                wait = getattr(callback, 'wait_for_pending_save', None)
                if wait is not None:
                    wait()
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('out_dir')
    parser.add_argument('result_file')
    parser.add_argument('--epochs', type=int, default=4)
    parser.add_argument('--iter-freq', type=int, default=0)
    parser.add_argument('--kill-at-batch', type=int, default=None)
    parser.add_argument('--resume', action='store_true')
    parser.add_argument('--big-buffer', type=int, default=0)
    parser.add_argument('--cloud', default='local')
    parser.add_argument('--bucket', default=None)
    args = parser.parse_args()

    # A resumed process starts from a different RNG state: the checkpoint must restore it.
    model, train, val, test, optimizer = make_parts(seed=123 if args.resume else 0,
                                                    big_buffer_floats=args.big_buffer)
    loop = TrainLoopCheckpoint(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'run',
                               args.out_dir, {'lr': 1e-2}, cloud_save_mode=args.cloud, bucket_name=args.bucket,
                               cloud_dir_prefix='runs',
                               iteration_save_freq=args.iter_freq, progress_bar=False)
    callbacks = [StepLRScheduler(step_size=1, gamma=0.7), EarlyStopping(patience=50)]
    if args.kill_at_batch is not None:
        callbacks.append(KillAt(args.kill_at_batch))
    loop.fit(num_epochs=args.epochs, callbacks=callbacks, resume_from='latest' if args.resume else None)
    torch.save({'weights': weights(loop.model), 'history': loop.train_history.state_dict(),
                'experiment_timestamp': loop.experiment_timestamp}, args.result_file)


if __name__ == '__main__':
    main()
