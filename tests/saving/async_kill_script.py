"""Training run for the kill -9 test of asynchronous checkpoints.

python async_kill_script.py OUT_DIR RESULT_FILE [--epochs N] [--big-buffer N] [--block-write K] [--resume]

``--block-write K``: the K-th checkpoint file (1-based) is written only half-way by the background writer, which then
creates ``OUT_DIR/writing`` and blocks forever (the test kills the process then). A callback creates
``OUT_DIR/trained_<epoch>_<batch>`` after each batch trained while that write is blocked: the training thread goes
on during a background write.
"""
import argparse
import io
import os
import sys
import threading

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(1)

from aitoolbox_like import AbstractCallback  # noqa: E402
from aitoolbox_like.callbacks.train_schedule import StepLRScheduler  # noqa: E402
from aitoolbox_like.tracking import TrainLoopCheckpoint  # noqa: E402
from saving_helpers import make_parts, weights  # noqa: E402

_real_save = torch.save
_blocked = threading.Event()


def _blocking_save(block_at, marker):
    calls = []

    def save(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) != block_at:
            return _real_save(obj, f, *args, **kwargs)
        data = io.BytesIO()
        _real_save(obj, data, *args, **kwargs)
        f.write(data.getvalue()[:len(data.getvalue()) // 2])
        f.flush()
        os.fsync(f.fileno())
        _blocked.set()
        open(marker, 'w').close()
        threading.Event().wait()          # until kill -9
    return save


class TrainedWhileBlocked(AbstractCallback):
    def __init__(self, out_dir, write_blocked):
        super().__init__('marks batches trained during the blocked write')
        self.out_dir, self.write_blocked = out_dir, write_blocked

    def on_epoch_begin(self):
        # The blocked write runs in a background thread that, on a busy machine, may reach its file only after the
        # few batches of the next epoch: wait for it, so that those batches are the ones trained during the write.
        if self.write_blocked and self.train_loop_obj.epoch == 2:
            _blocked.wait(timeout=120)

    def on_batch_end(self):
        if _blocked.is_set():
            loop = self.train_loop_obj
            open(os.path.join(self.out_dir, f'trained_{loop.epoch}_{loop.iteration}'), 'w').close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('out_dir')
    parser.add_argument('result_file')
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--big-buffer', type=int, default=0)
    parser.add_argument('--block-write', type=int, default=0)
    parser.add_argument('--resume', action='store_true')
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    if args.block_write:
        torch.save = _blocking_save(args.block_write, os.path.join(args.out_dir, 'writing'))

    model, train, val, test, optimizer = make_parts(seed=123 if args.resume else 0,
                                                    big_buffer_floats=args.big_buffer)
    loop = TrainLoopCheckpoint(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'run',
                               args.out_dir, {'lr': 1e-2}, cloud_save_mode='local', progress_bar=False)
    loop.fit(num_epochs=args.epochs, callbacks=[StepLRScheduler(step_size=1, gamma=0.7),
                                                TrainedWhileBlocked(args.out_dir, bool(args.block_write))],
             resume_from='latest' if args.resume else None)
    torch.save = _real_save
    torch.save({'weights': weights(loop.model), 'history': loop.train_history.state_dict()}, args.result_file)


if __name__ == '__main__':
    main()
