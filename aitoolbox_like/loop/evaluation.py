"""TrainLoop's evaluation: the end-of-epoch and end-of-training losses in the history, and the passes of the model
over a loader (its loss, its predictions) in eval mode without gradients, averaged or gathered over the processes
of a distributed run, and cached per training position so that every callback asking at one point gets the same
values for one pass."""
import contextlib
import copy
import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from .. import distributed
from ..callbacks.handler import CallbacksHandler, CollectiveInRankRestrictedCallbackError
from ..multi_loss_optim import MultiLoss
from ..predictions import batch_size_of, combine_prediction_metadata_batches

if TYPE_CHECKING:
    from ..amp import AmpPolicy
    from ..callbacks.abstract import AbstractCallback
    from ..history import TrainingHistory
    from ..model import BatchFeed

# The loop's messages keep the logger of train_loop.py, where users configure them.
logger = logging.getLogger('aitoolbox_like.train_loop')

EVAL_LOSS_WEIGHTINGS = ('batch', 'sample')


class EvaluationMixin:
    """TrainLoop's evaluation (a part of TrainLoop; the run state it reads is declared in TrainLoop.__init__)."""

    if TYPE_CHECKING:   # what this part uses of TrainLoop: run state (declared in its __init__), other parts
        model: torch.nn.Module
        criterion: Any
        device: torch.device
        train_loader: Any
        validation_loader: Any
        test_loader: Any
        collate_batch_pred_fn: Callable[[Any, List[Any]], List[Any]]
        pred_transform_fn: Callable[[List[Any]], Any]
        end_auto_eval: Union[bool, int]
        eval_loss_weighting: str
        epoch: int
        total_iteration_idx: int
        loss_batch_accum: List[Any]
        train_history: 'TrainingHistory'
        callbacks_handler: CallbacksHandler
        running_rank_restricted_callback: Optional['AbstractCallback']
        _feed: 'BatchFeed'
        _amp: 'AmpPolicy'
        _eval_cache: Dict[Any, Any]

        @property
        def world_size(self) -> int: ...

        def is_main_process(self) -> bool: ...

        def move_criterion_to_device(self) -> None: ...

        def _collective_device(self) -> torch.device: ...

    def _auto_eval_due(self):
        if isinstance(self.end_auto_eval, bool):
            return self.end_auto_eval
        return self.epoch % self.end_auto_eval == 0

    def auto_execute_end_of_epoch(self) -> None:
        """The end-of-epoch evaluation: 'accumulated_loss', and 'loss' / 'val_loss' when end_auto_eval is due."""
        readable = [loss for loss in self.loss_batch_accum if loss is not None]
        if readable:
            self._insert_loss('accumulated_loss', self.parse_loss(readable))
        elif self.loss_batch_accum:
            logger.warning("Epoch %d: the model's get_loss returned %s, which has no detach(), item() or float(), "
                           "so 'accumulated_loss' is not recorded", self.epoch, type(self.loss_batch_accum[0]))
        else:
            logger.warning('Epoch %d had no training batches', self.epoch)
        if self._auto_eval_due():
            self._insert_loss('loss', self.evaluate_loss_on_train_set())
            if self.validation_loader is not None:
                self._insert_loss('val_loss', self.evaluate_loss_on_validation_set())
        if self.is_main_process() and logger.isEnabledFor(logging.INFO):
            values = {k: v[-1] for k, v in self.train_history.items()
                      if v and self.train_history.get_epochs(k)[-1] == self.epoch and isinstance(v[-1], float)}
            logger.info('Epoch %d: %s', self.epoch, ', '.join(f'{k}={v:.5g}' for k, v in values.items()))

    def auto_execute_end_of_training(self) -> None:
        """The end-of-training evaluation: 'train_end_test_loss' when there is a test loader."""
        if self.test_loader is not None and self.end_auto_eval:
            self._insert_loss('train_end_test_loss', self.evaluate_loss_on_test_set())
            logger.info('Test loss at the end of training: %.5g', self.train_history['train_end_test_loss'][-1])

    def _insert_loss(self, name, loss):
        if isinstance(loss, MultiLoss):
            # One key per loss as in AIToolbox, plus their sum under the plain name (AIToolbox left it
            # empty, which broke early stopping and plots on multi-loss models).
            for loss_name, value in loss.items():
                self.insert_metric_result_into_history(f'{name}_{loss_name}', value.item())
            self.insert_metric_result_into_history(name, float(sum(v.item() for v in loss.values())))
        else:
            self.insert_metric_result_into_history(name, loss.item())

    def parse_loss(self, loss_record: Sequence[Any]) -> Any:
        """Mean of a list of per-batch losses (tensors or MultiLoss), as a float64 tensor (or MultiLoss);
        averaged across processes in a distributed run."""
        if isinstance(loss_record[0], MultiLoss):
            names = list(loss_record[0].keys())
            return MultiLoss({name: self.parse_loss([ml[name] for ml in loss_record]) for name in names})
        mean = _mean_float64(loss_record)
        if self.world_size > 1:
            self._check_collective_allowed('parse_loss')
            mean = mean.to(self._collective_device())
            dist.all_reduce(mean)
            mean = mean / self.world_size
        return mean

    def insert_metric_result_into_history(self, metric_name: str, metric_result: Any) -> None:
        """Record ``metric_result`` under ``metric_name`` for the current epoch."""
        self.train_history.insert_single_result_into_history(metric_name, metric_result)

    def evaluate_loss_on_train_set(self, force_prediction: bool = False, float_dict_format: bool = False) -> Any:
        """Mean loss over the train set (cached per training position; see evaluate_model_loss)."""
        return self._cached_loss('train', self.train_loader, force_prediction, float_dict_format)

    def evaluate_loss_on_validation_set(self, force_prediction: bool = False, float_dict_format: bool = False) -> Any:
        """Mean loss over the validation set (cached per training position)."""
        return self._cached_loss('validation', self.validation_loader, force_prediction, float_dict_format)

    def evaluate_loss_on_test_set(self, force_prediction: bool = False, float_dict_format: bool = False) -> Any:
        """Mean loss over the test set (cached per training position)."""
        return self._cached_loss('test', self.test_loader, force_prediction, float_dict_format)

    def _cached_loss(self, dataset_type, data_loader, force_prediction, float_dict_format):
        # The weighting is part of the key: changing loop.eval_loss_weighting between two requests recomputes.
        key = ('loss', dataset_type, self.eval_loss_weighting)
        loss = self._cached(key, force_prediction, lambda: self.evaluate_model_loss(
            self._require_loader(data_loader, dataset_type), move_to_cpu=True, dataset_info={'type': dataset_type}))
        return self.convert_loss_to_float_dict_format(loss) if float_dict_format else loss

    @staticmethod
    def convert_loss_to_float_dict_format(loss: Any) -> Any:
        """A loss tensor as a float, a MultiLoss as a dict of floats."""
        return loss.item() if isinstance(loss, (torch.Tensor, MultiLoss)) else loss

    def evaluate_model_loss(self, data_loader: Any, move_to_cpu: bool = False,
                            dataset_info: Optional[Dict[str, Any]] = None) -> Any:
        """Loss of the model over a loader, in eval mode without gradients: the mean of the per-batch losses
        (as AIToolbox), or with ``eval_loss_weighting='sample'`` their mean weighted by batch size."""
        self._check_collective_allowed('evaluate_model_loss')
        weighting = self.eval_loss_weighting
        if weighting not in EVAL_LOSS_WEIGHTINGS:
            raise ValueError(f'eval_loss_weighting must be one of {EVAL_LOSS_WEIGHTINGS}, got {weighting!r}')
        by_sample = weighting == 'sample'
        weighted_sum: Any = None
        num_samples = 0
        batch_losses: List[Any] = []
        hooks = self.callbacks_handler.hook_lists
        batch_begin, batch_end = hooks['on_eval_batch_begin'], hooks['on_eval_batch_end']
        with self._eval_pass('loss', dataset_info) as info:
            with torch.no_grad(), self._amp.autocast():
                for batch_data in data_loader:
                    for fn in batch_begin:
                        fn(batch_data, info)
                    loss = self._feed.get_loss_eval(batch_data, self.criterion, self.device)
                    for fn in batch_end:
                        fn(batch_data, loss, info)
                    detached = {k: v.detach() for k, v in loss.items()} if isinstance(loss, MultiLoss) \
                        else loss.detach()
                    if not by_sample:
                        batch_losses.append(detached)
                        continue
                    n = batch_size_of(batch_data)
                    if isinstance(detached, dict):
                        parts = {k: torch.as_tensor(v).double() * n for k, v in detached.items()}
                        weighted_sum = parts if weighted_sum is None else \
                            {k: weighted_sum[k] + parts[k] for k in weighted_sum}
                    else:
                        contribution = torch.as_tensor(detached).double() * n
                        weighted_sum = contribution if weighted_sum is None else weighted_sum + contribution
                    num_samples += n
            if by_sample:
                if weighted_sum is None:
                    raise ValueError(f'cannot evaluate the loss on an empty data loader ({dataset_info})')
                means: Any = {k: v / num_samples for k, v in weighted_sum.items()} \
                    if isinstance(weighted_sum, dict) else weighted_sum / num_samples
            else:
                if not batch_losses:
                    raise ValueError(f'cannot evaluate the loss on an empty data loader ({dataset_info})')
                # The float64 mean of the batch means, computed as AIToolbox (and a hand-written loop) computes it.
                num_samples = len(batch_losses)
                means = {k: _mean_float64([b[k] for b in batch_losses]) for k in batch_losses[0]} \
                    if isinstance(batch_losses[0], dict) else _mean_float64(batch_losses)
            if isinstance(means, dict):
                result: Any = MultiLoss({k: self._mean_over_ranks(v, num_samples) for k, v in means.items()})
            else:
                result = self._mean_over_ranks(means, num_samples)
            # The pass's result, for on_eval_end (SuperGradients hands it to its loader-end phase).
            info['loss'] = result
        if move_to_cpu:
            return result.apply(torch.Tensor.cpu) if isinstance(result, MultiLoss) else result.cpu()
        return result

    @contextlib.contextmanager
    def _eval_pass(self, kind: str, dataset_info: Optional[Dict[str, Any]]) -> Iterator[Dict[str, Any]]:
        """One evaluation pass (``kind`` 'loss' or 'predictions'): the model in eval mode and ``on_eval_begin``
        before it; its training mode back and ``on_eval_end`` after it, also when the pass stops early
        (StopTraining from an eval hook), so that callbacks that swapped weights in on_eval_begin (EMA) swap them
        back. Yields the pass's info dict, which the hooks receive."""
        self._prepare_model_for_evaluation()
        was_training = self.model.training
        self.model.eval()
        hooks = self.callbacks_handler.hook_lists
        info = dict(dataset_info or {}, kind=kind)
        info.setdefault('type', None)
        for fn in hooks['on_eval_begin']:
            fn(info)
        try:
            yield info
        finally:
            self.model.train(was_training)
            for fn in hooks['on_eval_end']:
                fn(info)

    def _prepare_model_for_evaluation(self):
        # A loop built only to predict or evaluate never ran fit, which is where the model moves to the device.
        self.model.to(self.device)
        self.move_criterion_to_device()

    def _mean_over_ranks(self, mean, count):
        """The mean over every process of per-process means of ``count`` items each (this process's mean as it
        is in a single-process run)."""
        if self.world_size == 1:
            return mean
        device = self._collective_device()
        totals = torch.stack([mean.to(device) * count, torch.tensor(float(count), dtype=torch.float64, device=device)])
        dist.all_reduce(totals)
        return totals[0] / totals[1]

    def predict_on_train_set(self, force_prediction: bool = False, execute_callbacks: bool = False) -> Tuple[Any, Any, Any]:
        """``(y_pred, y_true, metadata)`` over the train set (cached per training position)."""
        return self._cached_predictions('train', self.train_loader, force_prediction, execute_callbacks)

    def predict_on_validation_set(self, force_prediction: bool = False,
                                  execute_callbacks: bool = False) -> Tuple[Any, Any, Any]:
        """``(y_pred, y_true, metadata)`` over the validation set (cached per training position)."""
        return self._cached_predictions('validation', self.validation_loader, force_prediction, execute_callbacks)

    def predict_on_test_set(self, force_prediction: bool = False, execute_callbacks: bool = False) -> Tuple[Any, Any, Any]:
        """``(y_pred, y_true, metadata)`` over the test set (cached per training position)."""
        return self._cached_predictions('test', self.test_loader, force_prediction, execute_callbacks)

    def _cached_predictions(self, dataset_type, data_loader, force_prediction, execute_callbacks):
        return self._cached(('predictions', dataset_type), force_prediction, lambda: self.predict_with_model(
            self._require_loader(data_loader, dataset_type), execute_callbacks, move_to_cpu=True,
            dataset_info={'type': dataset_type}))

    def predict_with_model(self, data_loader: Any, execute_callbacks: bool = False, move_to_cpu: bool = False,
                           dataset_info: Optional[Dict[str, Any]] = None) -> Tuple[Any, Any, Any]:
        """Run the model over a loader in eval mode: returns ``(y_pred, y_true, metadata)``."""
        self._check_collective_allowed('predict_with_model')
        y_pred: List[Any] = []
        y_true: List[Any] = []
        metadata_list: List[Dict[str, Any]] = []
        hooks = self.callbacks_handler.hook_lists
        batch_begin, batch_end = hooks['on_eval_batch_begin'], hooks['on_eval_batch_end']
        with self._eval_pass('predictions', dataset_info) as info:
            with torch.no_grad(), self._amp.autocast():
                for batch_data in data_loader:
                    for fn in batch_begin:
                        fn(batch_data, info)
                    y_pred_batch, y_true_batch, metadata_batch = self._feed.get_predictions(batch_data, self.device)
                    for fn in batch_end:
                        fn(batch_data, (y_pred_batch, y_true_batch, metadata_batch), info)
                    if execute_callbacks:
                        self.callbacks_handler.execute_after_batch_prediction(
                            y_pred_batch, y_true_batch, metadata_batch, dataset_info)
                    y_pred = self.collate_batch_pred_fn(y_pred_batch, y_pred)
                    y_true = self.collate_batch_pred_fn(y_true_batch, y_true)
                    if metadata_batch is not None:
                        metadata_list.append(metadata_batch)
        y_pred, y_true = self.pred_transform_fn(y_pred), self.pred_transform_fn(y_true)
        # As in AIToolbox, batches that return {} give {}; None only when every batch returned None.
        metadata = combine_prediction_metadata_batches(metadata_list) if metadata_list else None
        if self.world_size > 1:     # every rank predicted its share; all get the whole set in dataset order
            y_pred, y_true, metadata = distributed.gather_predictions(data_loader, y_pred, y_true, metadata)
        if move_to_cpu:
            y_pred, y_true = _cpu(y_pred), _cpu(y_true)
            metadata = {k: _cpu(v) for k, v in metadata.items()} if metadata else metadata
        return y_pred, y_true, metadata

    def _cached(self, key, force, compute):
        """Results are cached per training position: every callback asking at the same point gets the same
        values without recomputing, and each caller gets its own copy to mutate."""
        position = (self.epoch, self.total_iteration_idx)
        hit = self._eval_cache.get(key)
        if force or hit is None or hit[0] != position:
            # Iterating a loader draws from the global RNG (sampler and worker seeds); isolating it keeps
            # the training trajectory independent of how often and on what the model is evaluated.
            with torch.random.fork_rng(devices=self._rng_devices()):
                hit = (position, compute())
            self._eval_cache[key] = hit
        return copy.deepcopy(hit[1])

    def _rng_devices(self):
        if self.device.type != 'cuda':
            return []
        return [self.device.index if self.device.index is not None else torch.cuda.current_device()]

    def purge_prediction_cache(self) -> None:
        """Forget cached losses and predictions (e.g. after loading other weights into the model)."""
        self._eval_cache.clear()

    @staticmethod
    def _require_loader(data_loader, dataset_type):
        if data_loader is None:
            raise ValueError(f'no {dataset_type} loader was given to the TrainLoop, so there is nothing to evaluate '
                             f'on the {dataset_type} set')
        return data_loader

    def _check_collective_allowed(self, operation):
        callback = self.running_rank_restricted_callback
        if callback is not None and self.world_size > 1:
            raise CollectiveInRankRestrictedCallbackError(
                f'callback {callback.callback_name!r} ({type(callback).__name__}) runs only on rank '
                f'{callback.device_idx_execution} but called {operation}, which every rank must join; it would hang. '
                f'Set device_idx_execution=None so it runs on every rank (and guard its side effects with '
                f'train_loop_obj.is_main_process()).')


def _mean_float64(losses: Sequence[Any]) -> torch.Tensor:
    """The float64 mean of one-element losses: tensors, or the Python floats recorded for duck-typed losses
    (see _loss_value). The common case, same-device tensors, is one stack and one conversion instead of one
    tensor op per batch (an epoch-end cost that grows with the epoch); converting to float64 is exact, so both
    ways give the same bits."""
    if all(type(loss) is torch.Tensor for loss in losses):
        try:
            stacked = torch.stack(list(losses))
        except RuntimeError:        # shapes or devices differ: the general path below
            pass
        else:
            if stacked.numel() == len(losses):
                return stacked.reshape(-1).to(torch.float64).mean()
    return torch.stack([torch.as_tensor(loss, dtype=torch.float64).reshape(()) for loss in losses]).mean()


def _cpu(value):
    return value.cpu() if isinstance(value, torch.Tensor) else value


# The tracking loops live in tracking.py (they subclass TrainLoop, so defining them here would import the saving
# callbacks into the core). They stay importable from here, where AIToolbox and DESIGN.md put them, through a
# lazy module attribute: nothing is imported until the name is used, so no import circle comes back.
_TRACKING_LOOPS = ('TrainLoopCheckpoint', 'TrainLoopEndSave', 'TrainLoopCheckpointEndSave')
