"""Evaluation: the loop's passes over a loader in eval mode, and what they give.

One owner for everything a TrainLoop evaluates: the loss over a loader, the predictions, both from one forward where
the model can give them together (``get_loss_and_predictions``, aitoolbox_like.model.one_pass_evaluation), the cache
that gives every caller at one training position the same values, how batch losses are averaged
(``eval_loss_weighting``) and averaged over the processes of a distributed run, and the end-of-epoch and
end-of-training evaluation that write 'val_loss' (and, where asked, AIToolbox's training-set 'loss') into the history.
TrainLoop keeps AIToolbox's names for these (``evaluate_loss_on_*``, ``predict_on_*``, ``evaluate_model_loss``,
``predict_with_model``, ``parse_loss``, ``auto_execute_end_of_*``) as thin delegates.
"""
import contextlib
import copy
import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .. import distributed
from ..runtime.host_copy import to_host
from ..model.feeds import BatchFeed, one_pass_evaluation
from ..model.multi_loss_optim import MultiLoss
from ..model.predictions import batch_size_of, combine_prediction_metadata_batches
from .handler import CollectiveInRankRestrictedCallbackError

if TYPE_CHECKING:
    from .train_loop import TrainLoop

# The loop's messages keep the name users configure (the module's public path).
logger = logging.getLogger('aitoolbox_like.train_loop')

EVAL_LOSS_WEIGHTINGS = ('batch', 'sample')
#: The loaders a TrainLoop evaluates on, by the name the cached helpers and the hooks' ``dataset_info['type']`` use.
DATASET_TYPES = ('train', 'validation', 'test')


class Evaluation:
    """The evaluation of one TrainLoop (``loop.evaluation``): its passes, their cache per training position, the
    loss averaging and the end-of-epoch evaluation.

    A pass runs the model in eval mode under ``torch.no_grad()`` and the loop's autocast, firing ``on_eval_begin``,
    ``on_eval_batch_begin`` / ``on_eval_batch_end`` and ``on_eval_end`` (their ``dataset_info`` says the loader's
    type and the pass's kind). Results of the cached helpers (``loss``, ``predictions``) are kept per training
    position (epoch, total_iteration_idx): every callback asking at one point gets the same values, each its own copy.

    One pass for the loss and the predictions: when a callback says it will read a loader's predictions at the
    current position (:meth:`expect_predictions`, as ModelPerformanceEvaluation does before the end-of-epoch
    evaluation) and the model defines ``get_loss_and_predictions``, the loss pass also collects the predictions, and
    the later ``predictions`` call is served from the cache: the validation set is run through the model once per
    epoch for 'val_loss' and the metrics together.
    """

    def __init__(self, loop: 'TrainLoop') -> None:
        self.loop = loop
        #: What the passes turn batches into losses and predictions with, when a callback owns that forward (Orca's
        #: MainCallback, whose ``on_val_forward`` is the evaluation's forward); None: the loop's ``batch_feed``.
        self.feed: Optional[BatchFeed] = None
        # (kind, dataset type[, weighting]) -> (training position, result)
        self._cache: Dict[Any, Tuple[Tuple[int, int], Any]] = {}
        # dataset type -> the training position at which its predictions will be asked for (expect_predictions)
        self._expected: Dict[str, Tuple[int, int]] = {}

    # ------------------------------------------------------------------------------ the end-of-epoch evaluation

    def end_of_epoch(self) -> None:
        """'accumulated_loss' (the mean of the epoch's training-batch losses), and when ``end_auto_eval`` is due,
        'val_loss' (one pass over the validation set) and, with ``eval_train_set``, AIToolbox's 'loss' (one more pass,
        over the training set)."""
        loop = self.loop
        readable = [loss for loss in loop.loss_batch_accum if loss is not None]
        if readable:
            self._insert_loss('accumulated_loss', self.mean_loss(readable))
        elif loop.loss_batch_accum:
            logger.warning("Epoch %d: the model's get_loss returned %s, which has no detach(), item() or float(), "
                           "so 'accumulated_loss' is not recorded", loop.epoch, type(loop.loss_batch_accum[0]))
        else:
            logger.warning('Epoch %d had no training batches', loop.epoch)
        end_auto_eval = loop.end_auto_eval
        due = end_auto_eval if isinstance(end_auto_eval, bool) else loop.epoch % end_auto_eval == 0
        if due:
            if loop.eval_train_set:
                self._insert_loss('loss', self.loss('train'))
            if loop.validation_loader is not None:
                self._insert_loss('val_loss', self.loss('validation'))
        if loop.is_main_process() and logger.isEnabledFor(logging.INFO):
            history = loop.train_history
            values = {k: v[-1] for k, v in history.items()
                      if v and history.get_epochs(k)[-1] == loop.epoch and isinstance(v[-1], float)}
            logger.info('Epoch %d: %s', loop.epoch, ', '.join(f'{k}={v:.5g}' for k, v in values.items()))

    def end_of_training(self) -> None:
        """'train_end_test_loss' when there is a test loader (and ``end_auto_eval`` is not False)."""
        loop = self.loop
        if loop.test_loader is not None and loop.end_auto_eval:
            self._insert_loss('train_end_test_loss', self.loss('test'))
            logger.info('Test loss at the end of training: %.5g', loop.train_history['train_end_test_loss'][-1])

    def _insert_loss(self, name: str, loss: Any) -> None:
        insert = self.loop.insert_metric_result_into_history
        if isinstance(loss, MultiLoss):
            # One key per loss as in AIToolbox, plus their sum under the plain name (AIToolbox left it
            # empty, which broke early stopping and plots on multi-loss models).
            # Read through to_host: a CUDA value's copy is waited for alone, not the whole stream (host_copy.py).
            values = {loss_name: to_host(value).item() for loss_name, value in loss.items()}
            for loss_name, value in values.items():
                insert(f'{name}_{loss_name}', value)
            insert(name, float(sum(values.values())))
        else:
            insert(name, to_host(loss).item())

    # ------------------------------------------------------------------------------ cached results per position

    def loss(self, dataset_type: str, force: bool = False, float_dict_format: bool = False) -> Any:
        """The mean loss over the loop's ``dataset_type`` loader ('train', 'validation' or 'test'), cached per
        training position (``force`` recomputes); a float (a dict of floats for a MultiLoss) with
        ``float_dict_format``. When the predictions of that loader were announced for this position
        (:meth:`expect_predictions`) and the model can give both from one forward, the same pass collects them."""
        # The weighting is part of the key: changing loop.eval_loss_weighting between two requests recomputes.
        key = ('loss', dataset_type, self.loop.eval_loss_weighting)
        hit = self._cache.get(key)
        if force or hit is None or hit[0] != self.position:
            loader = self._loader(dataset_type)
            one_pass = self._one_pass_for(dataset_type) if not force else None
            if one_pass is not None:
                result, predictions = self._isolated(lambda: self._run_pass(
                    loader, 'loss', {'type': dataset_type}, one_pass=one_pass, move_to_cpu=True))
                self._cache[('predictions', dataset_type)] = (self.position, predictions)
            else:
                result, _ = self._isolated(lambda: self._run_pass(loader, 'loss', {'type': dataset_type},
                                                                  move_to_cpu=True))
            hit = self._cache[key] = (self.position, result)
        loss = _fresh_copy(hit[1])
        return loss.item() if float_dict_format and isinstance(loss, (torch.Tensor, MultiLoss)) else loss

    def predictions(self, dataset_type: str, force: bool = False,
                    execute_callbacks: bool = False) -> Tuple[Any, Any, Any]:
        """``(y_pred, y_true, metadata)`` over the loop's ``dataset_type`` loader, cached per training position
        (``force`` recomputes); ``execute_callbacks`` fires ``on_after_batch_prediction`` for each batch of a pass
        made now (a cached result makes none)."""
        key = ('predictions', dataset_type)
        hit = self._cache.get(key)
        if force or hit is None or hit[0] != self.position:
            loader = self._loader(dataset_type)
            _, result = self._isolated(lambda: self._run_pass(
                loader, 'predictions', {'type': dataset_type}, execute_callbacks=execute_callbacks, move_to_cpu=True))
            hit = self._cache[key] = (self.position, result)
        return _fresh_copy(hit[1])

    def expect_predictions(self, dataset_type: str) -> None:
        """Say that the predictions of the loop's ``dataset_type`` loader will be asked for at the current training
        position, so that a loss pass over that loader made before (the end-of-epoch evaluation's) collects them in
        the same forward, where the model defines ``get_loss_and_predictions``. Call it from every process of a
        distributed run (from a hook before the end-of-epoch evaluation, such as ``on_train_epoch_end``)."""
        if dataset_type not in DATASET_TYPES:
            raise ValueError(f'dataset_type must be one of {DATASET_TYPES}, got {dataset_type!r}')
        self.check_collective_allowed('expect_predictions')
        self._expected[dataset_type] = self.position

    def purge(self) -> None:
        """Forget cached losses and predictions (e.g. after loading other weights into the model)."""
        self._cache.clear()

    @property
    def batch_feed(self) -> BatchFeed:
        """The feed the passes use: :attr:`feed` when a callback set one, else the loop's ``batch_feed``."""
        return self.feed if self.feed is not None else self.loop.batch_feed

    @property
    def position(self) -> Tuple[int, int]:
        """The training position results are cached for: ``(epoch, total_iteration_idx)``."""
        return self.loop.epoch, self.loop.total_iteration_idx

    def _one_pass_for(self, dataset_type: str) -> Any:
        if self._expected.get(dataset_type) != self.position:
            return None
        hit = self._cache.get(('predictions', dataset_type))
        if hit is not None and hit[0] == self.position:
            return None
        return one_pass_evaluation(self.batch_feed)

    def _loader(self, dataset_type: str) -> Any:
        loader = {'train': self.loop.train_loader, 'validation': self.loop.validation_loader,
                  'test': self.loop.test_loader}[dataset_type]
        if loader is None:
            raise ValueError(f'no {dataset_type} loader was given to the TrainLoop, so there is nothing to evaluate '
                             f'on the {dataset_type} set')
        return loader

    def _isolated(self, compute: Callable[[], Any]) -> Any:
        # Iterating a loader draws from the global RNG (sampler and worker seeds); isolating it keeps the training
        # trajectory independent of how often and on what the model is evaluated.
        device = self.loop.device
        devices = [] if device.type != 'cuda' else \
            [device.index if device.index is not None else torch.cuda.current_device()]
        with torch.random.fork_rng(devices=devices):
            return compute()

    # ------------------------------------------------------------------------------ passes over any loader

    def model_loss(self, data_loader: Any, move_to_cpu: bool = False,
                   dataset_info: Optional[Dict[str, Any]] = None) -> Any:
        """The loss of the model over a loader (not cached): the mean of the per-batch losses (as AIToolbox), or
        with ``eval_loss_weighting='sample'`` their mean weighted by batch size; averaged over the processes of a
        distributed run."""
        return self._run_pass(data_loader, 'loss', dataset_info, move_to_cpu=move_to_cpu)[0]

    def model_predictions(self, data_loader: Any, execute_callbacks: bool = False, move_to_cpu: bool = False,
                          dataset_info: Optional[Dict[str, Any]] = None) -> Tuple[Any, Any, Any]:
        """``(y_pred, y_true, metadata)`` of the model over a loader (not cached), gathered from every process of
        a distributed run in dataset order."""
        predictions = self._run_pass(data_loader, 'predictions', dataset_info, execute_callbacks=execute_callbacks,
                                     move_to_cpu=move_to_cpu)[1]
        assert predictions is not None      # a predictions pass always collects them
        return predictions

    def _run_pass(self, data_loader: Any, kind: str, dataset_info: Optional[Dict[str, Any]],
                  one_pass: Any = None, execute_callbacks: bool = False,
                  move_to_cpu: bool = False) -> Tuple[Any, Optional[Tuple[Any, Any, Any]]]:
        """One pass over ``data_loader``: ``kind`` 'loss' gives ``(loss, None)``, or with ``one_pass`` (the model's
        one-forward evaluation) ``(loss, predictions)``; 'predictions' gives ``(None, predictions)``."""
        loop = self.loop
        self.check_collective_allowed('evaluate_model_loss' if kind == 'loss' else 'predict_with_model')
        losses = _BatchLosses(loop.eval_loss_weighting) if kind == 'loss' else None
        collected = _Predictions(loop) if kind == 'predictions' or one_pass is not None else None
        feed, criterion, device = self.batch_feed, loop.criterion, loop.device
        dispatch = loop.callbacks_handler.dispatch
        result: Any = None
        with self._eval_pass(kind, dataset_info, with_predictions=one_pass is not None) as info:
            with torch.no_grad(), loop.autocast():
                for batch_data in data_loader:
                    dispatch.on_eval_batch_begin(batch_data, info)
                    if one_pass is not None:
                        loss, y_pred, y_true, metadata = one_pass(batch_data, criterion, device)
                        dispatch.on_eval_batch_end(batch_data, loss, info)
                    elif losses is not None:
                        loss = feed.get_loss_eval(batch_data, criterion, device)
                        dispatch.on_eval_batch_end(batch_data, loss, info)
                    else:
                        y_pred, y_true, metadata = outputs = feed.get_predictions(batch_data, device)
                        dispatch.on_eval_batch_end(batch_data, outputs, info)
                        if execute_callbacks:
                            dispatch.on_after_batch_prediction(y_pred, y_true, metadata, dataset_info)
                    if losses is not None:
                        losses.add(loss, batch_data)
                    if collected is not None:
                        collected.add(y_pred, y_true, metadata)
            if losses is not None:
                result = losses.mean(self, dataset_info)
                # The pass's result, for on_eval_end (SuperGradients hands it to its loader-end phase).
                info['loss'] = result
        if move_to_cpu and result is not None:
            result = result.apply(to_host) if isinstance(result, MultiLoss) else to_host(result)
        predictions = collected.result(data_loader, move_to_cpu) if collected is not None else None
        return result, predictions

    @contextlib.contextmanager
    def _eval_pass(self, kind: str, dataset_info: Optional[Dict[str, Any]],
                   with_predictions: bool = False) -> Iterator[Dict[str, Any]]:
        """One evaluation pass (``kind`` 'loss' or 'predictions'; a loss pass that also collects the predictions has
        ``with_predictions`` in its info): the model in eval mode and ``on_eval_begin`` before it; its training mode
        back and ``on_eval_end`` after it, also when the pass stops early (StopTraining from an eval hook), so that
        callbacks that swapped weights in on_eval_begin (EMA) swap them back. Yields the pass's info dict, which the
        hooks receive."""
        loop = self.loop
        if not loop.epochs_running:
            # A loop built only to predict or evaluate never ran fit, which is where the model moves to the device
            # (during the epochs it is there: a move walks every parameter).
            loop.model.to(loop.device)
            loop.move_criterion_to_device()
        was_training = loop.model.training
        loop.model.eval()
        info = dict(dataset_info or {}, kind=kind)
        info.setdefault('type', None)
        if with_predictions:
            info['with_predictions'] = True
        # A stop may abandon the batches of a pass in the loop's interruptible evaluation (the pass is redone on
        # resume), never its begin and end hooks: weights swapped in for the pass (EMA) are swapped back.
        phase, loop.interruptible_phase = loop.interruptible_phase, None
        if phase is not None:
            info['interruptible'] = True
        loop.callbacks_handler.dispatch.on_eval_begin(info)
        try:
            loop.interruptible_phase = phase
            yield info
        finally:
            loop.interruptible_phase = None
            loop.model.train(was_training)
            loop.callbacks_handler.dispatch.on_eval_end(info)
            loop.interruptible_phase = phase

    # ------------------------------------------------------------------------------ averaging

    def mean_loss(self, loss_record: Sequence[Any]) -> Any:
        """Mean of a list of per-batch losses (tensors or MultiLoss), as a float64 tensor (or MultiLoss);
        averaged across processes in a distributed run (AIToolbox's ``parse_loss``)."""
        if isinstance(loss_record[0], MultiLoss):
            names = list(loss_record[0].keys())
            return MultiLoss({name: self.mean_loss([ml[name] for ml in loss_record]) for name in names})
        mean = mean_float64(loss_record)
        if self.loop.world_size > 1:
            self.check_collective_allowed('parse_loss')
            mean = mean.to(distributed.collective_device(self.loop.device))
            dist.all_reduce(mean)
            mean = mean / self.loop.world_size
        return mean

    def mean_over_ranks(self, mean: torch.Tensor, count: int) -> torch.Tensor:
        """The mean over every process of per-process means of ``count`` items each (this process's mean as it
        is in a single-process run)."""
        if self.loop.world_size == 1:
            return mean
        device = distributed.collective_device(self.loop.device)
        totals = torch.stack([mean.to(device) * count, torch.tensor(float(count), dtype=torch.float64, device=device)])
        dist.all_reduce(totals)
        return totals[0] / totals[1]

    def check_collective_allowed(self, operation: str) -> None:
        """Refuse ``operation``, which every process must join, from a callback that runs on one rank only: it would
        hang."""
        loop = self.loop
        callback = loop.running_rank_restricted_callback
        if callback is not None and loop.world_size > 1:
            raise CollectiveInRankRestrictedCallbackError(
                f'callback {callback.callback_name!r} ({type(callback).__name__}) runs only on rank '
                f'{callback.device_idx_execution} but called {operation}, which every rank must join; it would hang. '
                f'Set device_idx_execution=None so it runs on every rank (and guard its side effects with '
                f'train_loop_obj.is_main_process()).')


class _BatchLosses:
    """The losses of a pass's batches, averaged as ``eval_loss_weighting`` says."""

    def __init__(self, weighting: str) -> None:
        if weighting not in EVAL_LOSS_WEIGHTINGS:
            raise ValueError(f'eval_loss_weighting must be one of {EVAL_LOSS_WEIGHTINGS}, got {weighting!r}')
        self.by_sample = weighting == 'sample'
        self.batch_losses: List[Any] = []
        self.weighted_sum: Any = None
        self.num_samples = 0

    def add(self, loss: Any, batch_data: Any) -> None:
        detached = {k: v.detach() for k, v in loss.items()} if isinstance(loss, MultiLoss) else loss.detach()
        if not self.by_sample:
            self.batch_losses.append(detached)
            return
        n = batch_size_of(batch_data)
        if isinstance(detached, dict):
            parts = {k: torch.as_tensor(v).double() * n for k, v in detached.items()}
            self.weighted_sum = parts if self.weighted_sum is None else \
                {k: self.weighted_sum[k] + parts[k] for k in self.weighted_sum}
        else:
            contribution = torch.as_tensor(detached).double() * n
            self.weighted_sum = contribution if self.weighted_sum is None else self.weighted_sum + contribution
        self.num_samples += n

    def mean(self, evaluation: Evaluation, dataset_info: Optional[Dict[str, Any]]) -> Any:
        if self.by_sample:
            if self.weighted_sum is None:
                raise ValueError(f'cannot evaluate the loss on an empty data loader ({dataset_info})')
            count = self.num_samples
            means: Any = {k: v / count for k, v in self.weighted_sum.items()} \
                if isinstance(self.weighted_sum, dict) else self.weighted_sum / count
        else:
            if not self.batch_losses:
                raise ValueError(f'cannot evaluate the loss on an empty data loader ({dataset_info})')
            # The float64 mean of the batch means, computed as AIToolbox (and a hand-written loop) computes it.
            count = len(self.batch_losses)
            first = self.batch_losses[0]
            means = {k: mean_float64([b[k] for b in self.batch_losses]) for k in first} \
                if isinstance(first, dict) else mean_float64(self.batch_losses)
        if isinstance(means, dict):
            return MultiLoss({k: evaluation.mean_over_ranks(v, count) for k, v in means.items()})
        return evaluation.mean_over_ranks(means, count)


class _Predictions:
    """The predictions of a pass's batches, collected as the loop's ``collate_batch_pred_fn`` and
    ``pred_transform_fn`` say, and gathered from every process of a distributed run."""

    def __init__(self, loop: 'TrainLoop') -> None:
        self.loop = loop
        self.y_pred: List[Any] = []
        self.y_true: List[Any] = []
        self.metadata: List[Dict[str, Any]] = []

    def add(self, y_pred_batch: Any, y_true_batch: Any, metadata_batch: Any) -> None:
        collate = self.loop.collate_batch_pred_fn
        self.y_pred = collate(y_pred_batch, self.y_pred)
        self.y_true = collate(y_true_batch, self.y_true)
        if metadata_batch is not None:
            self.metadata.append(metadata_batch)

    def result(self, data_loader: Any, move_to_cpu: bool) -> Tuple[Any, Any, Any]:
        transform = self.loop.pred_transform_fn
        y_pred, y_true = transform(self.y_pred), transform(self.y_true)
        # As in AIToolbox, batches that return {} give {}; None only when every batch returned None.
        metadata = combine_prediction_metadata_batches(self.metadata) if self.metadata else None
        if self.loop.world_size > 1:     # every rank predicted its share; all get the whole set in dataset order
            y_pred, y_true, metadata = distributed.gather_predictions(data_loader, y_pred, y_true, metadata)
        if move_to_cpu:
            y_pred, y_true = _cpu(y_pred), _cpu(y_true)
            metadata = {k: _cpu(v) for k, v in metadata.items()} if metadata else metadata
        return y_pred, y_true, metadata


def mean_float64(losses: Sequence[Any]) -> torch.Tensor:
    """The float64 mean of one-element losses: tensors, or the Python floats recorded for duck-typed losses
    (see checks.loss_to_record). The common case, same-device tensors, is one stack and one conversion instead of one
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


def _fresh_copy(value: Any, memo: Optional[Dict[int, Any]] = None) -> Any:
    """A copy of a cached result that its caller may change: ``copy.deepcopy``'s result (one copy of an object met
    twice), with plain tensors cloned and tuples, lists and dicts rebuilt here, since deepcopy costs a tensor about ten
    times its clone (every epoch, on the predictions a metric asks for)."""
    if memo is None:
        memo = {}
    kind = type(value)
    if kind is torch.Tensor and not value.requires_grad:
        copied = memo.get(id(value))
        if copied is None:
            copied = memo[id(value)] = value.clone()
        return copied
    if kind is tuple or kind is list:
        return kind(_fresh_copy(item, memo) for item in value)
    if kind is dict:
        return {key: _fresh_copy(item, memo) for key, item in value.items()}
    return copy.deepcopy(value, memo)


def _cpu(value: Any) -> Any:
    return value.cpu() if isinstance(value, torch.Tensor) else value
