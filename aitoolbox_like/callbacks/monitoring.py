"""Training-quality monitoring: what the model is (ModelSummary), how fast it trains (ThroughputMonitor) and the loss
and learning rate of every step, kept for after the fit (StepHistory).

See docs/callbacks/monitoring.md.
"""
import logging
import math
import os
import time
from typing import Any, Dict, List, Optional, Sequence

import torch

from ..model.predictions import batch_size_of
from ..storage.local import write_atomically
from ._common import BatchLossReader, StepLearningRates, check_int
from .abstract import AbstractCallback

logger = logging.getLogger(__name__)

MB = 1024 * 1024


def _shape_of(output: Any) -> Any:
    """The shape of a module's output as a list (a nested structure for tuples / dicts), or its type name."""
    if isinstance(output, torch.Tensor):
        return list(output.shape)
    if isinstance(output, (list, tuple)):
        return [_shape_of(o) for o in output]
    if isinstance(output, dict):
        return {k: _shape_of(v) for k, v in output.items()}
    return type(output).__name__


class ModelSummary(AbstractCallback):
    """At the start of training, log what the model is: parameters (total / trainable), their size, and a table
    of its layers (name, type, parameters, and the output shape when ``example_input`` is given).

    The summary is kept as ``self.summary`` (a dict: ``num_parameters``, ``num_trainable_parameters``,
    ``parameter_bytes``, ``buffer_bytes``, ``size_mb``, ``layers``: a list of ``{'name', 'type', 'num_parameters',
    'output_shape'}``). It is *not* written into the train history: the history holds per-epoch metrics (and is
    compared across a resume), while these numbers are constants of the model.

    Args:
        example_input: an input for ``model(example_input)`` (a tensor, or a tuple of positional arguments): one
            forward pass in eval mode, without gradients and with the RNG state kept, records each layer's output
            shape. None (default): no forward pass, no shapes. (The train loader is never read for this, so the
            data order of the run stays untouched.)
        max_depth (int or None): the layers listed are the modules up to this nesting depth (1: the model's direct
            children) plus deeper leaves are folded into them; None lists every leaf module.
        save_to_experiment (bool): also write ``model_summary.txt`` at the root of the experiment folder when the
            loop has one (a saving callback or tracking loop), uploaded with the experiment's other files.
        log_level (int): the logging level of the report (INFO).
    """

    FILE_NAME = 'model_summary.txt'

    def __init__(self, example_input: Any = None, max_depth: Optional[int] = None, save_to_experiment: bool = True,
                 log_level: int = logging.INFO) -> None:
        super().__init__('Model summary', execution_order=-10)
        if max_depth is not None and (isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1):
            raise ValueError(f'max_depth must be an int >= 1 or None, got {max_depth!r}')
        self.example_input = example_input
        self.max_depth = max_depth
        self.save_to_experiment = save_to_experiment
        self.log_level = log_level
        self.summary: Dict[str, Any] = {}
        self.report_path: Optional[str] = None

    def on_train_begin(self) -> None:
        """Build the summary; in the main process log it and write the report file."""
        loop = self.train_loop_obj
        self.summary = self.summarize(loop.model, self.example_input, self.max_depth)
        if not loop.is_main_process():
            return
        text = self.format(self.summary)
        logger.log(self.log_level, 'Model summary\n%s', text)
        experiment = loop.experiment
        if self.save_to_experiment and experiment is not None:
            path = os.path.join(experiment.claim(), self.FILE_NAME)
            data = (text + '\n').encode('utf-8')
            write_atomically(path, lambda f: f.write(data), temp_dir=experiment.dir_path)
            self.report_path = path
            if loop.experiment_uploader is not None:
                loop.experiment_uploader.upload_experiment_file(path)

    @classmethod
    def summarize(cls, model: torch.nn.Module, example_input: Any = None,
                  max_depth: Optional[int] = None) -> Dict[str, Any]:
        """The summary dict of ``model`` (see the class docstring)."""
        params = list(model.parameters())
        num_parameters = sum(p.numel() for p in params)
        num_trainable = sum(p.numel() for p in params if p.requires_grad)
        parameter_bytes = sum(p.numel() * p.element_size() for p in params)
        buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
        layers = cls._layers(model, max_depth)
        if example_input is not None:
            shapes = cls._output_shapes(model, example_input, [name for name, _ in layers])
        else:
            shapes = {}
        return {
            'num_parameters': num_parameters,
            'num_trainable_parameters': num_trainable,
            'parameter_bytes': parameter_bytes,
            'buffer_bytes': buffer_bytes,
            'size_mb': (parameter_bytes + buffer_bytes) / MB,
            'layers': [{'name': name, 'type': type(module).__name__,
                        'num_parameters': sum(p.numel() for p in module.parameters()),
                        'output_shape': shapes.get(name)} for name, module in layers],
        }

    @staticmethod
    def _layers(model: torch.nn.Module, max_depth: Optional[int]) -> List[Any]:
        layers = []
        for name, module in model.named_modules():
            if not name:
                continue
            depth = name.count('.') + 1
            is_leaf = next(module.children(), None) is None
            if (max_depth is None and is_leaf) or (max_depth is not None and (
                    depth == max_depth or (depth < max_depth and is_leaf))):
                layers.append((name, module))
        return layers

    @staticmethod
    def _output_shapes(model: torch.nn.Module, example_input: Any, names: Sequence[str]) -> Dict[str, Any]:
        shapes: Dict[str, Any] = {}
        modules = dict(model.named_modules())
        handles = [modules[name].register_forward_hook(
            lambda module, args, output, name=name: shapes.__setitem__(name, _shape_of(output))) for name in names]
        was_training = model.training
        device = next((p.device for p in model.parameters()), torch.device('cpu'))
        inputs = example_input if isinstance(example_input, tuple) else (example_input,)
        inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
        devices = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == 'cuda' else []
        try:
            model.eval()
            with torch.no_grad(), torch.random.fork_rng(devices=devices):
                model(*inputs)
        finally:
            model.train(was_training)
            for handle in handles:
                handle.remove()
        return shapes

    @staticmethod
    def format(summary: Dict[str, Any]) -> str:
        """The summary as a text table."""
        rows = [('name', 'type', 'parameters', 'output shape')]
        rows += [(layer['name'], layer['type'], f"{layer['num_parameters']:,}",
                  '' if layer['output_shape'] is None else str(layer['output_shape'])) for layer in summary['layers']]
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = ['  '.join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
        lines.insert(1, '  '.join('-' * width for width in widths))
        lines += ['',
                  f"parameters: {summary['num_parameters']:,} total, {summary['num_trainable_parameters']:,} "
                  f"trainable, {summary['num_parameters'] - summary['num_trainable_parameters']:,} frozen",
                  f"size: {summary['parameter_bytes']:,} bytes of parameters + {summary['buffer_bytes']:,} bytes of "
                  f"buffers = {summary['size_mb']:.3f} MB"]
        return '\n'.join(lines)


def _percentile(sorted_values: Sequence[float], percent: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(math.ceil(percent / 100 * len(sorted_values)), 1)
    return sorted_values[min(rank, len(sorted_values)) - 1]


class ThroughputMonitor(AbstractCallback):
    """Training speed per epoch, into the train history (which TensorboardTrainHistoryMetric / TensorboardFullTracking
    and the history writers export as they are).

    History keys, per epoch, for this process:

    - ``'throughput_samples_per_sec'``, ``'throughput_batches_per_sec'``: training samples / batches divided by the
      time from the first batch's ``on_batch_begin`` to the last batch's ``on_batch_end`` (evaluation excluded);
    - ``'step_time_p50'``, ``'step_time_p90'``, ``'step_time_p99'`` (for the default ``percentiles``): the step
      time in seconds, from ``on_batch_begin`` to ``on_batch_end`` of each batch;
    - ``'cuda_max_memory_allocated_mb'``: ``torch.cuda.max_memory_allocated`` of the loop's device over the epoch
      (the peak is reset at every epoch's start), only when training on a GPU.

    Times are host clock readings: nothing is synchronized per step. On a GPU a step's time is then the time to
    *enqueue* its work (the device may still run it); the percentiles show host-side stalls (data loading, Python
    overhead, syncs in the model) rather than kernel time. With ``synchronize_at_epoch_end=True`` (default) the
    device is synchronized once per epoch before the epoch's end is read, so the per-epoch throughput is exact.

    Args:
        percentiles: which step-time percentiles to record (each a number in (0, 100]).
        synchronize_at_epoch_end (bool): one ``torch.cuda.synchronize`` per epoch on a GPU (nothing on the CPU).
        log (bool): also log one line per epoch (main process).
    """

    def __init__(self, percentiles: Sequence[float] = (50, 90, 99), synchronize_at_epoch_end: bool = True,
                 log: bool = True) -> None:
        super().__init__('Throughput monitor')
        for p in percentiles:
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 100:
                raise ValueError(f'percentiles must be numbers in (0, 100], got {p!r}')
        self.percentiles = tuple(percentiles)
        self.synchronize_at_epoch_end = synchronize_at_epoch_end
        self.log = log
        self._step_times: List[float] = []
        self._samples = 0
        self._step_start = 0.0
        self._first_start: Optional[float] = None
        self._last_end = 0.0
        self._cuda = False

    def on_train_begin(self) -> None:
        """Note whether the loop trains on a GPU."""
        self._cuda = self.train_loop_obj.device.type == 'cuda'

    def on_epoch_begin(self) -> None:
        """Reset the epoch's counters and the device's memory peak."""
        self._step_times = []
        self._samples = 0
        self._first_start = None
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(self.train_loop_obj.device)

    def on_batch_begin(self) -> None:
        """Host timestamp of the step's start."""
        self._step_start = now = time.perf_counter()
        if self._first_start is None:
            self._first_start = now

    def on_batch_end(self) -> None:
        """Host timestamp of the step's end, and the batch's sample count (its shape: no device read)."""
        self._last_end = now = time.perf_counter()
        self._step_times.append(now - self._step_start)
        self._samples += batch_size_of(self.train_loop_obj.batch)

    def on_train_epoch_end(self) -> None:
        """Record the epoch's values, before its evaluation."""
        loop = self.train_loop_obj
        if self._first_start is None or not self._step_times:
            return
        end = self._last_end
        if self._cuda and self.synchronize_at_epoch_end:
            torch.cuda.synchronize(loop.device)
            end = time.perf_counter()
        elapsed = max(end - self._first_start, 1e-9)
        values: Dict[str, float] = {
            'throughput_samples_per_sec': self._samples / elapsed,
            'throughput_batches_per_sec': len(self._step_times) / elapsed,
        }
        ordered = sorted(self._step_times)
        for p in self.percentiles:
            values[f'step_time_p{p:g}'] = _percentile(ordered, p)
        if self._cuda:
            values['cuda_max_memory_allocated_mb'] = torch.cuda.max_memory_allocated(loop.device) / MB
        for name, value in values.items():
            loop.insert_metric_result_into_history(name, value)
        if self.log and loop.is_main_process():
            logger.info('Epoch %d throughput: %s', loop.epoch, ', '.join(f'{k}={v:.4g}' for k, v in values.items()))


class StepHistory(AbstractCallback):
    """The training loss and the learning rate of every ``every_n_steps``-th step, kept in the history after the
    fit: ``loop.train_history.steps`` is a list of records such as ``{'step': 41, 'epoch': 1, 'loss': 0.613, 'lr':
    0.0009}``.

    - ``step``: the global batch index (``total_iteration_idx``: 0, 1, ... across epochs and fits);
    - ``loss``: that batch's training loss (a MultiLoss: one entry per loss name instead);
    - ``lr``: the learning rate the step's update used (read when the step began, before a per-step scheduler moved
      it on), of the first param group of the first optimizer; ``lrs`` (with more than one group or optimizer) all
      of them, per optimizer and group.

    The losses stay on the device and are read in one transfer every ``sync_every_n_steps`` steps and at the end of
    each epoch: one host-device sync per block, none per step. The records are saved with the history in every
    checkpoint, so a resumed run keeps them. Without this callback the step pays nothing for any of it. The trackers
    write per-step losses and learning rates themselves: ``MLflowTracking`` / ``WandBTracking(batch_log_frequency=k)``,
    TensorBoard's ``TensorboardTrainBatchLoss`` and ``TensorboardLearningRate(batch_log_frequency=k)``.

    Args:
        every_n_steps (int): record every k-th step (steps 0, k, 2k, ...).
        sync_every_n_steps (int): read the pending losses from the device every n steps (and at each epoch's end).
    """

    def __init__(self, every_n_steps: int = 1, sync_every_n_steps: int = 100) -> None:
        super().__init__('Step history')
        check_int('every_n_steps', every_n_steps, who='StepHistory')
        check_int('sync_every_n_steps', sync_every_n_steps, who='StepHistory')
        self.every_n_steps = every_n_steps
        self.sync_every_n_steps = sync_every_n_steps
        self._losses = BatchLossReader()
        self._learning_rates = StepLearningRates()

    @property
    def state_key(self) -> str:
        return f'StepHistory[{self.every_n_steps}]'

    def state_dict(self) -> Dict[str, Any]:
        """The learning rates of the recorded steps whose losses were not read yet."""
        return {'pending_learning_rates': [[step, lrs] for step, lrs in self._learning_rates.pending.items()]}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._learning_rates.pending = {int(step): lrs for step, lrs in state_dict.get('pending_learning_rates', [])}

    def on_batch_begin(self) -> None:
        """The learning rates this step's update uses, on a recorded step."""
        if self.train_loop_obj.total_iteration_idx % self.every_n_steps == 0:
            self._learning_rates.record(self.train_loop_obj)

    def on_batch_end(self) -> None:
        """Read the pending losses every ``sync_every_n_steps`` steps."""
        if (self.train_loop_obj.total_iteration_idx + 1) % self.sync_every_n_steps == 0:
            self.record_pending()

    def on_train_epoch_end(self) -> None:
        """The epoch's remaining records, before its evaluation."""
        self.record_pending()

    def on_train_end(self) -> None:
        """The remaining records (a StopTraining inside an epoch skips its end)."""
        self.record_pending()

    def record_pending(self) -> None:
        """Add the records of the steps whose losses were not read yet to ``train_history.steps``."""
        loop = self.train_loop_obj
        for step, losses, _ in self._losses.read_new(loop):
            lrs = self._learning_rates.take(step)
            if lrs is None:         # not a recorded step (or recorded before a checkpoint this run resumed from)
                continue
            record: Dict[str, Any] = {'step': step, 'epoch': loop.epoch, **losses}
            flat = [lr for groups in lrs for lr in groups]
            if flat:
                record['lr'] = flat[0]
            if len(flat) > 1:
                record['lrs'] = lrs
            loop.train_history.steps.append(record)
