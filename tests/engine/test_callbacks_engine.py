"""The callback engine: event order, registration, gating, control flow."""
import pytest
import torch
from torch import nn

from aitoolbox_like import StopTraining, TrainLoop
from aitoolbox_like.callbacks.abstract import AbstractCallback, HOOK_NAMES
from helpers import MLP, loaders


class Recorder(AbstractCallback):
    """Records every hook with the loop position it saw."""

    def __init__(self, log, name='recorder', execution_order=0, device_idx_execution=None):
        super().__init__(name, execution_order, device_idx_execution)
        self.log = log

    def _rec(self, hook, *extra):
        self.log.append((self.callback_name, hook, *extra))

    def on_train_loop_registration(self): self._rec('registration')
    def on_multiprocess_start(self): self._rec('multiprocess_start')
    def on_train_begin(self): self._rec('train_begin')
    def on_epoch_begin(self): self._rec('epoch_begin', self.train_loop_obj.epoch)
    def on_batch_begin(self): self._rec('batch_begin', self.train_loop_obj.iteration)
    def on_after_backward(self): self._rec('after_backward', self.train_loop_obj.iteration)
    def on_after_gradient_update(self, optimizer_idx): self._rec('gradient_update', optimizer_idx)
    def on_after_optimizer_step(self): self._rec('optimizer_step', self.train_loop_obj.optimizer_idx)
    def on_batch_end(self): self._rec('batch_end', self.train_loop_obj.iteration)
    def on_epoch_end(self): self._rec('epoch_end', self.train_loop_obj.epoch,
                                      len(self.train_loop_obj.train_history['val_loss']))
    def on_train_end(self): self._rec('train_end', len(self.train_loop_obj.train_history['train_end_test_loss']))
    def on_exception(self, exception): self._rec('exception', type(exception).__name__)

    def on_after_batch_prediction(self, y_pred_batch, y_test_batch, metadata_batch, dataset_info):
        self._rec('after_batch_prediction', dataset_info['type'], len(y_pred_batch))


def make_loop(n=24, batch_size=8, **kwargs):
    torch.manual_seed(0)
    model = MLP()
    train, val, test = loaders(n=n, batch_size=batch_size)
    return TrainLoop(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                     **kwargs)


def test_exact_hook_sequence_for_two_epochs_with_grad_accumulation():
    log = []
    make_loop().fit(num_epochs=2, callbacks=[Recorder(log)], grad_accumulation=2)
    expected = [('recorder', 'registration'), ('recorder', 'train_begin')]
    for epoch in range(2):
        expected.append(('recorder', 'epoch_begin', epoch))
        for i in range(3):          # 24 samples / 8 = 3 batches; updates after batches 1 and 2 (last)
            expected += [('recorder', 'batch_begin', i), ('recorder', 'after_backward', i)]
            if i in (1, 2):
                expected += [('recorder', 'gradient_update', 0), ('recorder', 'optimizer_step', 0)]
            expected.append(('recorder', 'batch_end', i))
        expected.append(('recorder', 'epoch_end', epoch, epoch + 1))   # val_loss already in history
    expected.append(('recorder', 'train_end', 1))                      # test loss already in history
    assert log == expected


def test_callbacks_run_in_stable_execution_order():
    log = []
    cbs = [Recorder(log, 'late', 10), Recorder(log, 'early_a', -5), Recorder(log, 'mid', 0),
           Recorder(log, 'early_b', -5)]
    make_loop().fit(num_epochs=1, callbacks=cbs)
    train_begin = [name for name, hook, *_ in log if hook == 'train_begin']
    assert train_begin == ['early_a', 'early_b', 'mid', 'late']
    registration = [name for name, hook, *_ in log if hook == 'registration']
    assert registration == ['early_a', 'early_b', 'mid', 'late']


def test_only_overridden_hooks_are_dispatched():
    class OnlyEpochEnd(AbstractCallback):
        def __init__(self):
            super().__init__('only epoch end')

        def on_epoch_end(self):
            pass

    tl = make_loop()
    cb = OnlyEpochEnd()
    tl.callbacks_handler.register_callbacks([cb])
    for hook in HOOK_NAMES:
        assert tl.callbacks_handler.has_hook(hook) == (hook == 'on_epoch_end')


def test_device_idx_execution_in_single_process_runs_every_callback():
    log = []
    make_loop(cuda_device_idx=None).fit(num_epochs=1, callbacks=[Recorder(log, 'rank0', device_idx_execution=0),
                                                                  Recorder(log, 'rank1', device_idx_execution=1)])
    assert {name for name, hook, *_ in log if hook == 'train_begin'} == {'rank0', 'rank1'}


def test_multiprocess_start_not_called_in_single_process():
    log = []
    make_loop().fit(num_epochs=1, callbacks=[Recorder(log)])
    assert not [e for e in log if e[1] == 'multiprocess_start']


def test_full_access_example_from_the_docs():
    class MyCallback(AbstractCallback):
        def __init__(self):
            super().__init__('my callback', execution_order=0, device_idx_execution=None)

        def on_train_loop_registration(self):
            self.lr = self.train_loop_obj.optimizer.param_groups[0]['lr']

        def on_epoch_end(self):
            if self.train_loop_obj.train_history['val_loss'][-1] < 10.0:
                self.train_loop_obj.early_stop = True

    cb = MyCallback()
    tl = make_loop()
    model = tl.fit(num_epochs=10, callbacks=[cb])
    assert model is tl.model and cb.lr == 0.1
    assert tl.epoch == 0 and len(tl.train_history['accumulated_loss']) == 1
    # The end of training still runs after an early stop.
    assert len(tl.train_history['train_end_test_loss']) == 1


def test_stop_training_mid_epoch_still_runs_train_end():
    log = []

    class StopAtBatch(AbstractCallback):
        def __init__(self):
            super().__init__('stopper')

        def on_batch_end(self):
            if self.train_loop_obj.total_iteration_idx == 4:
                raise StopTraining('enough')

    tl = make_loop()
    tl.fit(num_epochs=5, callbacks=[StopAtBatch(), Recorder(log)])
    assert tl.total_iteration_idx == 4 and tl.epoch == 1
    assert log[-1][1] == 'train_end'
    assert not [e for e in log if e[1] == 'exception']


def test_exception_calls_on_exception_then_reraises():
    log = []

    class Boom(AbstractCallback):
        def __init__(self):
            super().__init__('boom')

        def on_batch_begin(self):
            if self.train_loop_obj.total_iteration_idx == 2:
                raise RuntimeError('broken batch')

    class FailingHandler(AbstractCallback):
        def __init__(self):
            super().__init__('failing handler', execution_order=-1)

        def on_exception(self, exception):
            raise ValueError('handler bug')

    tl = make_loop()
    with pytest.raises(RuntimeError, match='broken batch'):
        tl.fit(num_epochs=2, callbacks=[Boom(), FailingHandler(), Recorder(log)])
    # A failing on_exception handler does not hide the others or the original error.
    assert log[-1] == ('recorder', 'exception', 'RuntimeError')
    assert not [e for e in log if e[1] == 'train_end']


def test_custom_events_reach_only_callbacks_that_define_them():
    class Listener(AbstractCallback):
        def __init__(self):
            super().__init__('listener')
            self.received = []

        def on_my_event(self, value):
            self.received.append(value)
            return value * 2

    class Emitter(AbstractCallback):
        def __init__(self):
            super().__init__('emitter')

        def on_epoch_end(self):
            self.results = self.train_loop_obj.callbacks_handler.call_event('on_my_event',
                                                                            value=self.train_loop_obj.epoch)

    listener, emitter = Listener(), Emitter()
    make_loop().fit(num_epochs=2, callbacks=[listener, emitter])
    assert listener.received == [0, 1] and emitter.results == [2]


def test_fit_twice_continues_without_repeating_or_double_registering():
    log = []
    cb = Recorder(log)
    tl = make_loop()
    tl.fit(num_epochs=2, callbacks=[cb])
    tl.fit(num_epochs=4, callbacks=[cb])
    assert tl.callbacks.count(cb) == 1
    assert [e[2] for e in log if e[1] == 'epoch_begin'] == [0, 1, 2, 3]
    assert [e for e in log if e[1] == 'registration'] == [('recorder', 'registration')]
    assert tl.train_history.get_epochs('val_loss') == [0, 1, 2, 3]
    assert tl.total_iteration_idx == 11


def test_register_callbacks_directly_and_cached():
    log = []
    tl = make_loop()
    direct, cached = Recorder(log, 'direct'), Recorder(log, 'cached')
    tl.callbacks_handler.register_callbacks([direct])
    assert log == [('direct', 'registration')] and direct.train_loop_obj is tl
    tl.callbacks_handler.register_callbacks([cached], cache_callbacks=True)
    assert cached.train_loop_obj is None
    tl.fit(num_epochs=1)
    assert cached.train_loop_obj is tl
    assert [e[0] for e in log if e[1] == 'train_begin'] == ['direct', 'cached']
    # Firing a hook by hand (dispatch, or fire by name) calls the same callbacks.
    log.clear()
    tl.callbacks_handler.dispatch.on_epoch_begin()
    tl.callbacks_handler.fire('on_after_gradient_update', 0)
    tl.callbacks_handler.dispatch.on_after_optimizer_step()
    assert [e[1] for e in log] == ['epoch_begin', 'epoch_begin', 'gradient_update', 'gradient_update',
                                    'optimizer_step', 'optimizer_step']


def test_aitoolbox_s_loop_has_aitoolbox_s_execute_methods_driving_the_same_dispatch():
    from aitoolbox_like.compat.handler import CallbacksHandler as AIToolboxHandler
    from aitoolbox_like.torchtrain.train_loop import TrainLoop as AIToolboxTrainLoop
    log = []
    torch.manual_seed(0)
    model = MLP()
    train, val, test = loaders()
    tl = AIToolboxTrainLoop(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1),
                            torch.nn.CrossEntropyLoss())
    assert isinstance(tl.callbacks_handler, AIToolboxHandler)
    assert not hasattr(make_loop().callbacks_handler, 'execute_epoch_begin')     # ours fires through dispatch
    tl.callbacks_handler.register_callbacks([Recorder(log, 'a'), Recorder(log, 'b')])
    log.clear()
    tl.callbacks_handler.execute_epoch_begin()
    tl.callbacks_handler.execute_gradient_update(optimizer_idx=0)
    tl.callbacks_handler.execute_optimizer_step()
    assert [e[1] for e in log] == ['epoch_begin', 'epoch_begin', 'gradient_update', 'gradient_update',
                                    'optimizer_step', 'optimizer_step']


def test_callback_registering_another_callback():
    log = []

    class Parent(AbstractCallback):
        def __init__(self):
            super().__init__('parent')

        def on_train_loop_registration(self):
            self.train_loop_obj.callbacks_handler.register_callbacks([Recorder(log, 'child')])

    tl = make_loop()
    tl.fit(num_epochs=1, callbacks=[Parent()])
    assert ('child', 'train_begin') in log


class NoSuperInit(AbstractCallback):
    def __init__(self):
        pass


class BadGradientHook(AbstractCallback):
    def __init__(self):
        super().__init__('bad')

    def on_after_gradient_update(self):
        pass


@pytest.mark.parametrize('callbacks, message', [
    (Recorder([]), 'must be a list'),
    ([Recorder], 'is the class Recorder, not an instance'),
    ([object()], r'callbacks\[0\] is a builtins.object'),
    ([NoSuperInit()], r'must call super\(\).__init__'),
    ([BadGradientHook()], r'on_after_gradient_update must accept the arguments on_after_gradient_update\(optimizer_idx\)'),
    ([Recorder([], device_idx_execution='0')], 'device_idx_execution must be None'),
    ([Recorder([], execution_order='last')], 'execution_order must be a number'),
])
def test_registration_errors_name_the_problem(callbacks, message):
    with pytest.raises(TypeError, match=message):
        make_loop().fit(num_epochs=1, callbacks=callbacks)


def test_grad_cb_used_attribute_kept_for_old_callbacks():
    class OldGradCallback(AbstractCallback):
        def __init__(self):
            super().__init__('old grad')
            self.calls = 0

        def on_train_loop_registration(self):
            self.train_loop_obj.grad_cb_used = True

        def on_after_gradient_update(self, optimizer_idx):
            self.calls += 1

    cb = OldGradCallback()
    tl = make_loop()
    tl.fit(num_epochs=1, callbacks=[cb])
    assert tl.grad_cb_used is True and cb.calls == 3
