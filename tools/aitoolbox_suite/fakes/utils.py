"""Test doubles for AIToolbox's upstream test suite (written for this harness).

The upstream test modules do ``from tests.utils import *`` (or import names
from it), but the PyPI wheel does not ship ``tests/utils.py``.  This file
provides the same names with the behaviour those tests rely on: counting
fakes for losses and optimizers, tiny models, a hook-recording callback, result
package and metric doubles, and a TrainLoop subclass that reports which
private fit path was taken.

The base classes come from ``aitoolbox.*`` (through the harness import alias
when the target is not the original package).  If a base is not available,
only the doubles built on it become unusable (instantiating them raises
``ImportError``); the rest of this module, and the tests that do not need
those doubles, keep working.

Module-level names ``torch``, ``nn`` and ``F`` are part of the interface: some
test modules use ``nn`` that they only get through the star import. So are
``os``, ``time`` and ``datetime``: test modules of tests/test_experiment use them
without importing them, getting them from star imports of AIToolbox modules
(which had no ``__all__``); scaffolding, not behaviour under test.
"""

import datetime  # noqa: F401  (part of the star-import interface, see above)
import importlib
import os  # noqa: F401
import time  # noqa: F401

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------------------
# base classes from the package under test
# ---------------------------------------------------------------------------


def _unavailable(qualname, reason):
    """A base class stand-in: subclasses can be defined, but not instantiated."""

    def __init__(self, *args, **kwargs):
        raise ImportError(f'{qualname} is not available from the package under test: {reason}')

    return type(f'Unavailable_{qualname.rsplit(".", 1)[-1]}', (), {'__init__': __init__})


def _base(module_name, attr):
    qualname = f'{module_name}.{attr}'
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # ImportError / AttributeError / alias placeholder errors
        return _unavailable(qualname, f'{type(exc).__name__}: {exc}')
    if not isinstance(obj, type):  # e.g. the alias hook's Missing placeholder
        return _unavailable(qualname, repr(obj))
    return obj


AbstractModelFeedDefinition = _base('aitoolbox.torchtrain.data.batch_model_feed_defs', 'AbstractModelFeedDefinition')
AbstractCallback = _base('aitoolbox.torchtrain.callbacks.abstract', 'AbstractCallback')
AbstractResultPackage = _base('aitoolbox.experiment.result_package.abstract_result_packages', 'AbstractResultPackage')
AbstractBaseMetric = _base('aitoolbox.experiment.core_metrics.abstract_metric', 'AbstractBaseMetric')
TTModel = _base('aitoolbox.torchtrain.model', 'TTModel')
TrainLoop = _base('aitoolbox.torchtrain.train_loop', 'TrainLoop')
MultiLoss = _base('aitoolbox.torchtrain.multi_loss_optim', 'MultiLoss')


def function_exists(obj, name):
    """True when ``obj`` has an attribute ``name`` that can be called."""
    return callable(getattr(obj, name, None))


# ---------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------


def _add_conv_layers(module):
    """Small conv net for 1x28x28 inputs; layer names conv1, conv2, fc1, fc2."""
    module.conv1 = nn.Conv2d(1, 4, kernel_size=3)
    module.conv2 = nn.Conv2d(4, 8, kernel_size=3)
    module.fc1 = nn.Linear(8 * 5 * 5, 32)
    module.fc2 = nn.Linear(32, 10)


def _conv_forward(module, x):
    x = F.max_pool2d(F.relu(module.conv1(x)), 2)   # 28 -> 26 -> 13
    x = F.max_pool2d(F.relu(module.conv2(x)), 2)   # 13 -> 11 -> 5
    x = F.relu(module.fc1(torch.flatten(x, 1)))
    return F.log_softmax(module.fc2(x), dim=1)


class Net(nn.Module):
    """Plain ``nn.Module`` (used with ``ModelWrap`` and the model savers)."""

    def __init__(self):
        super().__init__()
        _add_conv_layers(self)

    def forward(self, x):
        return _conv_forward(self, x)


def _constant_batch_prediction(counter):
    """Batch prediction for the counting models: 64 copies of counter+100 / counter / counter+200."""
    return (torch.full((64,), float(counter + 100)),
            torch.full((64,), float(counter)),
            {'bla': [counter + 200] * 64})


class NetUnifiedBatchFeed(TTModel):
    """TTModel whose loss is a shared :class:`DummyBatch` and whose predictions count calls.

    ``get_loss``/``get_loss_eval`` return ``self.dummy_batch``; the n-th call of
    ``get_predictions`` returns ``([n+100]*64, [n]*64, {'bla': [n+200]*64})``.
    """

    def __init__(self):
        super().__init__()
        _add_conv_layers(self)
        self.dummy_batch = DummyBatch()
        self.prediction_count = 0

    def forward(self, x):
        return _conv_forward(self, x)

    def get_loss(self, batch_data, criterion, device):
        return self.dummy_batch

    def get_loss_eval(self, batch_data, criterion, device):
        return self.dummy_batch

    def get_predictions(self, batch_data, device):
        self.prediction_count += 1
        return _constant_batch_prediction(self.prediction_count)


class NetUnifiedBatchFeedSimplified(NetUnifiedBatchFeed):
    """Like :class:`NetUnifiedBatchFeed`, but the metadata carries the raw batch and nothing is counted."""

    def get_predictions(self, batch_data, device):
        n = self.prediction_count
        return (torch.full((64,), float(n + 100)),
                torch.full((64,), float(n)),
                {'batch_data': [batch_data]})


class SmallFFNet(TTModel):
    """10 -> 10 -> 1 feed-forward net with a sigmoid output (layers ``l1``, ``l2``)."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(10, 10)
        self.l2 = nn.Linear(10, 1)
        self.out_act = nn.Sigmoid()

    def forward(self, x):
        hidden = F.relu(self.l1(x.float()))
        return self.out_act(self.l2(hidden))

    def get_loss(self, batch_data, criterion, device):
        x, y = batch_data
        return criterion(self(x).squeeze(), y)

    def get_predictions(self, batch_data, device):
        x, y = batch_data
        return self(x), y, {}


class MultiLossModel(TTModel):
    """Two-headed net whose loss is ``MultiLoss({'loss_1': ..., 'loss_2': ...})`` built from two given criteria."""

    def __init__(self, loss_1, loss_2):
        super().__init__()
        self.l1 = nn.Linear(10, 10)
        self.l2_1 = nn.Linear(10, 1)
        self.l2_2 = nn.Linear(10, 1)
        self.out_act = nn.Sigmoid()
        self.loss_1 = loss_1
        self.loss_2 = loss_2

    def forward(self, x):
        hidden = F.relu(self.l1(x.float()))
        return self.out_act(self.l2_1(hidden)), self.out_act(self.l2_2(hidden))

    def get_loss(self, batch_data, criterion, device):
        x, y = batch_data
        out_1, out_2 = self(x)
        return MultiLoss({'loss_1': self.loss_1(out_1, y), 'loss_2': self.loss_2(out_2, y)})

    def get_predictions(self, batch_data, device):
        x, y = batch_data
        out_1, _ = self(x)
        return out_1, y, {}


def keras_dummy_model():
    """Small Keras model (only the keras-based experiment tests use it; needs keras)."""
    from keras.layers import Dense
    from keras.models import Sequential

    return Sequential([Dense(12, input_dim=8, activation='relu'),
                       Dense(8, activation='relu'),
                       Dense(1, activation='sigmoid')])


# ---------------------------------------------------------------------------
# callbacks that record hook calls
# ---------------------------------------------------------------------------

_HOOKS = ('on_train_loop_registration', 'on_epoch_begin', 'on_epoch_end', 'on_train_begin', 'on_train_end',
          'on_batch_begin', 'on_batch_end', 'on_after_gradient_update', 'on_after_optimizer_step')


class _HookRecorder:
    def _init_recording(self):
        self.callback_calls = []
        self.call_ctr = dict.fromkeys(_HOOKS, 0)

    def _record(self, hook):
        self.callback_calls.append(hook)
        self.call_ctr[hook] += 1


class CallbackTracker(_HookRecorder, AbstractCallback):
    """Records every hook call (name appended to ``callback_calls``, counted in ``call_ctr``).

    Registration also switches on the gradient hooks (``grad_cb_used = True``).
    """

    def __init__(self):
        AbstractCallback.__init__(self, 'CallbackTracker1')
        self._init_recording()

    def on_train_loop_registration(self):
        self.train_loop_obj.grad_cb_used = True
        self._record('on_train_loop_registration')

    def on_epoch_begin(self):
        self._record('on_epoch_begin')

    def on_epoch_end(self):
        self._record('on_epoch_end')

    def on_train_begin(self):
        self._record('on_train_begin')

    def on_train_end(self):
        self._record('on_train_end')

    def on_batch_begin(self):
        self._record('on_batch_begin')

    def on_batch_end(self):
        self._record('on_batch_end')

    def on_after_gradient_update(self, optimizer_idx):
        self._record('on_after_gradient_update')

    def on_after_optimizer_step(self):
        self._record('on_after_optimizer_step')


class CallbackTrackerShort(_HookRecorder, AbstractCallback):
    """Records only some hooks; does not implement ``on_train_begin`` and ``on_batch_end``.

    Registration switches on the gradient hooks but is not itself recorded.
    """

    def __init__(self):
        AbstractCallback.__init__(self, 'CallbackTracker2')
        self._init_recording()

    def on_train_loop_registration(self):
        self.train_loop_obj.grad_cb_used = True

    def on_epoch_begin(self):
        self._record('on_epoch_begin')

    def on_epoch_end(self):
        self._record('on_epoch_end')

    def on_train_end(self):
        self._record('on_train_end')

    def on_batch_begin(self):
        self._record('on_batch_begin')

    def on_after_gradient_update(self, optimizer_idx):
        self._record('on_after_gradient_update')

    def on_after_optimizer_step(self):
        self._record('on_after_optimizer_step')


# ---------------------------------------------------------------------------
# model feed definition (legacy ModelWrap API)
# ---------------------------------------------------------------------------


class DeactivateModelFeedDefinition(AbstractModelFeedDefinition):
    """Feed definition that ignores the model: same losses and predictions as :class:`NetUnifiedBatchFeed`."""

    def __init__(self):
        self.dummy_batch = DummyBatch()
        self.prediction_count = 0

    def get_loss(self, model, batch_data, criterion, device):
        return self.dummy_batch

    def get_loss_eval(self, model, batch_data, criterion, device):
        return self.dummy_batch

    def get_predictions(self, model, batch_data, device):
        self.prediction_count += 1
        return _constant_batch_prediction(self.prediction_count)


# ---------------------------------------------------------------------------
# losses and optimizers
# ---------------------------------------------------------------------------


class DummyBatch:
    """Loss double: counts ``backward()``, ``item()`` (returns 1.0) and ``detach()`` (returns tensor(1.)).

    Dividing it (``loss / n``, as gradient accumulation does) returns the object itself.
    """

    def __init__(self):
        self.back_ctr = 0
        self.item_ctr = 0
        self.detach_ctr = 0

    def backward(self):
        self.back_ctr += 1

    def item(self):
        self.item_ctr += 1
        return 1.0

    def detach(self):
        self.detach_ctr += 1
        return torch.tensor(1.0)

    def __truediv__(self, other):
        return self


class MiniDummyOptimizer:
    """Optimizer double without ``state_dict`` (checkpointing must reject it)."""

    def __init__(self):
        self.zero_grad_ctr = 0
        self.step_ctr = 0

    def zero_grad(self):
        self.zero_grad_ctr += 1

    def step(self):
        self.step_ctr += 1


class DummyOptimizer(MiniDummyOptimizer):
    """Optimizer double that counts ``zero_grad``/``step``; ``state_dict()`` prints and returns None."""

    def state_dict(self):
        print('In state_dict')


class DummyLoss:
    """Criterion double: ``to(device)`` records the device and returns itself."""

    def __init__(self):
        self.device = None

    def to(self, device):
        self.device = device
        return self


class MultiLossDummy(DummyLoss):
    """Criterion *and* loss double for the multi-loss tests.

    Calling it counts ``call_ctr`` and returns itself; ``backward(retain_graph)``
    counts calls and retained graphs; division counts ``div_ctr``; ``item()`` and
    ``detach()`` return ``tensor(call_ctr)``.
    """

    def __init__(self):
        super().__init__()
        self.backward_ctr = 0
        self.retain_graph_ctr = 0
        self.call_ctr = 0
        self.div_ctr = 0

    def __call__(self, predicted, true):
        self.call_ctr += 1
        return self

    def backward(self, retain_graph=False):
        self.backward_ctr += 1
        self.retain_graph_ctr += int(bool(retain_graph))

    def item(self):
        return torch.tensor(self.call_ctr)

    def detach(self):
        return torch.tensor(self.call_ctr)

    def __truediv__(self, other):
        self.div_ctr += 1
        return self


# ---------------------------------------------------------------------------
# result packages and metrics
# ---------------------------------------------------------------------------


class DummyNonAbstractResultPackage:
    """Not a result package at all (type checks must reject it)."""


class DummyResultPackage(AbstractResultPackage):
    """Result package named 'DummyPackage' whose results are ``{'dummy': 111}``.

    Remembers the experiment path it is given as
    ``<local_folder>/<project>_<experiment>_<timestamp>``.
    """

    def __init__(self, strict_content_check=False):
        AbstractResultPackage.__init__(self, 'DummyPackage', strict_content_check)
        self.experiment_path = None

    def prepare_results_dict(self):
        return {'dummy': 111}

    def set_experiment_dir_path_for_additional_results(self, project_name, experiment_name, experiment_timestamp,
                                                       local_model_result_folder_path):
        self.experiment_path = \
            f'{local_model_result_folder_path}/{project_name}_{experiment_name}_{experiment_timestamp}'


class DummyResultPackageExtend(DummyResultPackage):
    """Two results that grow by 12 on every evaluation: dummy=111+k, extended_dummy=1323123.44+k."""

    def __init__(self):
        DummyResultPackage.__init__(self)
        self.ctr = 0.

    def prepare_results_dict(self):
        offset = self.ctr
        self.ctr += 12
        return {'dummy': 111 + offset, 'extended_dummy': 1323123.44 + offset}


class DummyResultPackageExtendV2(DummyResultPackageExtend):
    """Also lists additional result files to upload (the given list)."""

    def __init__(self, additional_results):
        DummyResultPackageExtend.__init__(self)
        self.additional_results = additional_results

    def list_additional_results_dump_paths(self):
        return self.additional_results


class DummyResultPackageExtendVariable(DummyResultPackageExtend):
    """Returns the results dict it was given."""

    def __init__(self, result_d):
        DummyResultPackageExtend.__init__(self)
        self.result_d = result_d

    def prepare_results_dict(self):
        return self.result_d


class DummyTorchMetrics:
    """torchmetrics-like double: counts ``compute``/``reset``; ``to(device)`` stores '<device>_1' (returns None).

    Calling it returns 123.4, or a two-metric dict when ``return_float=False``.
    """

    def __init__(self, return_float=True):
        self.return_float = return_float
        self.compute_ctr = 0
        self.reset_ctr = 0
        self.to_result = None

    def compute(self):
        self.compute_ctr += 1

    def reset(self):
        self.reset_ctr += 1

    def to(self, device):
        self.to_result = f'{device}_1'

    def __call__(self, *args, **kwargs):
        return 123.4 if self.return_float else {'metric_1': 12.34, 'metric_2': 56.78}


class DummyAbstractBaseMetric(AbstractBaseMetric):
    """Metric over (val, val + 10) named 'dummy_metric' whose value is y_true."""

    def __init__(self, val):
        AbstractBaseMetric.__init__(self, val, val + 10, 'dummy_metric', np_array=False)

    def calculate_metric(self):
        return self.y_true


# ---------------------------------------------------------------------------
# TrainLoop whose private fit paths only report their arguments
# ---------------------------------------------------------------------------


class TrainLoopFitMethodTracking(TrainLoop):
    """``fit()`` dispatches to ``_train``/``_train_dp``/``_train_ddp``; these return a tag plus their arguments."""

    def __init__(self, *args, gpu_mode):
        super().__init__(*args, gpu_mode=gpu_mode)

    def _train(self, num_epochs, num_iterations, callbacks=None, grad_accumulation=1):
        return 'train_single', num_epochs, num_iterations, callbacks, grad_accumulation

    def _train_dp(self, num_epochs, num_iterations, callbacks=None, grad_accumulation=1, dp_model_args=None):
        return 'train_dp', num_epochs, num_iterations, callbacks, grad_accumulation, dp_model_args

    def _train_ddp(self, num_epochs, num_iterations, callbacks=None, grad_accumulation=1,
                   ddp_model_args=None, in_process_data_load=None,
                   num_nodes=1, node_rank=0, num_gpus=torch.cuda.device_count()):
        return ('train_ddp', num_epochs, num_iterations, callbacks, grad_accumulation, ddp_model_args,
                in_process_data_load, num_nodes)
