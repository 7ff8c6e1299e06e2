"""Training run used by the preemption tests: trains with a TrainLoopCheckpoint (PreemptionCheckpoint is added by
default), announces batch T by writing a marker file and waits there for a signal, or resumes.

python preempt_script.py OUT_DIR RESULT_FILE [--epochs N] [--wait-at-batch T] [--exit-code CODE] [--resume]
    [--slow-phase validation|loader|compile]

``--slow-phase`` makes one phase of the run long and writes RESULT_FILE.phase when it begins (the test sends its
signal then): ``validation``, the validation pass of epoch 1 (3 batches of 2.7 s); ``loader``, the wait for batch 9
(the train loader's dataset sleeps 60 s); ``compile``, torch.compile's warm-up in the first step (a backend that
sleeps 60 s, then compiles as the 'eager' backend does). A resumed run (``--resume``) compiles with 'eager' when
``--slow-phase compile`` is given, and is never slow.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(1)

from aitoolbox_like import AbstractCallback  # noqa: E402
from aitoolbox_like.callbacks.basic import EarlyStopping  # noqa: E402
from aitoolbox_like.callbacks.preemption import PreemptionCheckpoint, find_preemption_callback  # noqa: E402
from aitoolbox_like.callbacks.train_schedule import StepLRScheduler  # noqa: E402
from aitoolbox_like.tracking import TrainLoopCheckpoint  # noqa: E402
from saving_helpers import make_parts, weights  # noqa: E402


class WaitForSignalAt(AbstractCallback):
    """At the end of batch T (before the PreemptionCheckpoint's check), write the marker file and wait until a
    signal asked for a stop, so the test knows exactly after which batch the run stops."""

    def __init__(self, batch_idx, marker):
        super().__init__('wait for a signal', execution_order=0)
        self.batch_idx = batch_idx
        self.marker = marker

    def on_batch_end(self):
        if self.train_loop_obj.total_iteration_idx != self.batch_idx:
            return
        preemption = find_preemption_callback(self.train_loop_obj)
        with open(self.marker, 'w') as f:
            f.write(str(os.getpid()))
        deadline = time.monotonic() + 60
        while not preemption.stop_requested and time.monotonic() < deadline:
            time.sleep(0.01)


class SlowValidation(AbstractCallback):
    """The validation pass of epoch ``epoch`` takes ``batches * seconds``: each of its batches sleeps first."""

    def __init__(self, epoch, seconds, marker):
        super().__init__('slow validation')
        self.epoch, self.seconds, self.marker = epoch, seconds, marker
        self.passes = []            # [epoch, type, batches evaluated] of every evaluation pass

    def _slow(self, info):
        return info.get('type') == 'validation' and self.train_loop_obj.epoch == self.epoch

    def on_eval_begin(self, dataset_info):
        self.passes.append([self.train_loop_obj.epoch, dataset_info.get('type'), 0])
        if self._slow(dataset_info):
            with open(self.marker, 'w') as f:
                f.write(str(os.getpid()))

    def on_eval_batch_begin(self, batch, dataset_info):
        if self._slow(dataset_info):
            time.sleep(self.seconds)

    def on_eval_batch_end(self, batch, outputs, dataset_info):
        self.passes[-1][2] += 1


class SleepyDataset(torch.utils.data.Dataset):
    """``dataset`` whose ``at``-th item read (0-based, in reading order) sleeps ``seconds`` after writing
    ``marker``: the train loader's wait for one batch (a stalled network file system, a slow bucket)."""

    def __init__(self, dataset, at, seconds, marker):
        self.dataset, self.at, self.seconds, self.marker, self.reads = dataset, at, seconds, marker, 0

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        if self.reads == self.at:
            with open(self.marker, 'w') as f:
                f.write(str(os.getpid()))
            time.sleep(self.seconds)
        self.reads += 1
        return self.dataset[index]


def slow_backend(marker):
    """A torch.compile backend whose compilation takes 60 s (then the 'eager' backend's graph)."""
    def compile_graph(graph_module, example_inputs):
        with open(marker, 'w') as f:
            f.write(str(os.getpid()))
        time.sleep(60)
        return graph_module.forward
    return compile_graph


class RequestStopOnRank(AbstractCallback):
    """DDP tests: on one rank only, ask the PreemptionCheckpoint for a stop at the end of batch T (as a signal
    reaching only that process would)."""

    def __init__(self, rank, batch_idx):
        super().__init__('request a stop on one rank')
        self.rank, self.batch_idx = rank, batch_idx

    def on_batch_end(self):
        loop = self.train_loop_obj
        if loop.global_rank == self.rank and loop.total_iteration_idx == self.batch_idx:
            find_preemption_callback(loop).request_stop('test request')


class RecordLastBatch(AbstractCallback):
    """DDP tests: each rank writes the index of the last batch it trained to <out_dir>/last_batch_rank<k>."""

    def __init__(self, out_dir):
        super().__init__('record the last batch')
        self.out_dir = out_dir

    def on_train_end(self):
        loop = self.train_loop_obj
        with open(os.path.join(self.out_dir, f'last_batch_rank{loop.global_rank}'), 'w') as f:
            f.write(str(loop.total_iteration_idx))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('out_dir')
    parser.add_argument('result_file')
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--wait-at-batch', type=int, default=None)
    parser.add_argument('--exit-code', default=None)
    parser.add_argument('--resume', action='store_true')
    parser.add_argument('--slow-phase', choices=['validation', 'loader', 'compile'], default=None)
    args = parser.parse_args()

    model, train, val, test, optimizer = make_parts(seed=123 if args.resume else 0)
    phase_marker = args.result_file + '.phase'
    slow = None if args.resume else args.slow_phase
    if slow == 'loader':
        train = torch.utils.data.DataLoader(SleepyDataset(train.dataset, 9 * train.batch_size, 60, phase_marker),
                                            batch_size=train.batch_size, shuffle=True)
    compile_option = False
    if args.slow_phase == 'compile':
        compile_option = {'backend': 'eager' if args.resume else slow_backend(phase_marker)}
    loop = TrainLoopCheckpoint(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'run',
                               args.out_dir, {'lr': 1e-2}, cloud_save_mode='local', progress_bar=False,
                               compile=compile_option)
    callbacks = [StepLRScheduler(step_size=1, gamma=0.7), EarlyStopping(patience=50)]
    validation = SlowValidation(1, 2.7 if slow == 'validation' else 0.0, phase_marker)
    callbacks.append(validation)
    if args.exit_code is not None:
        code = args.exit_code if args.exit_code == 'signal' else int(args.exit_code)
        callbacks.append(PreemptionCheckpoint(exit_code=code))
    if args.wait_at_batch is not None:
        callbacks.append(WaitForSignalAt(args.wait_at_batch, args.result_file + '.marker'))
    loop.fit(num_epochs=args.epochs, callbacks=callbacks, resume_from='latest' if args.resume else None)
    preemption = find_preemption_callback(loop)
    torch.save({'weights': weights(loop.model), 'history': loop.train_history.state_dict(),
                'total_iteration_idx': loop.total_iteration_idx,
                'stop_reason': preemption.stop_reason, 'checkpoint_path': preemption.checkpoint_path,
                'interrupted': loop.interrupted, 'history_names': sorted(loop.train_history.keys()),
                'experiment_timestamp': loop.experiment_timestamp, 'eval_passes': validation.passes,
                'stop_latency_s': preemption.stop_latency_s}, args.result_file)


if __name__ == '__main__':
    main()
