"""CallbacksHandler: validates, orders, rank-gates and dispatches the loop's callbacks.

Per-hook dispatch lists are rebuilt only when the set of callbacks changes; a training step with no
callback on a hook costs one loop over an empty list.
"""
import inspect
import logging

from .abstract import HOOK_NAMES, AbstractCallback

logger = logging.getLogger(__name__)


class CollectiveInRankRestrictedCallbackError(RuntimeError):
    """A callback that runs on one rank only called an operation every rank must join."""


def _overrides(callback, hook_name):
    hook = getattr(type(callback), hook_name, None)
    return hook is not None and hook is not getattr(AbstractCallback, hook_name)


def _describe(obj):
    return f'{type(obj).__module__}.{type(obj).__qualname__}'


class CallbacksHandler:
    def __init__(self, train_loop_obj):
        self.train_loop_obj = train_loop_obj
        self.registered_cbs = []          # AIToolbox name; same objects as train_loop_obj.callbacks
        self.cached_callbacks = []        # registered at the first fit
        self._hook_lists = {name: [] for name in HOOK_NAMES}
        self._custom_event_lists = {}

    # ---- registration -------------------------------------------------------------------------

    def register_callbacks(self, callbacks, cache_callbacks=False, print_callbacks=False):
        """Attach callbacks to the loop.

        Args:
            callbacks (list or None): AbstractCallback instances.
            cache_callbacks (bool): keep them and register them at the start of the next fit
                (use it before a distributed fit, so they are registered inside each process).
            print_callbacks (bool): print the registered callbacks afterwards.
        """
        callbacks = self._validate(callbacks)
        if cache_callbacks:
            self.cached_callbacks += [cb for cb in callbacks if not any(cb is c for c in self.cached_callbacks)]
            return
        # Cached callbacks (a tracking loop's savers) join the first real registration, as in AIToolbox.
        callbacks, self.cached_callbacks = self.cached_callbacks + callbacks, []
        loop = self.train_loop_obj
        new_callbacks = [cb for cb in callbacks if not any(cb is c for c in loop.callbacks)]
        new_callbacks = [cb for cb in new_callbacks if self._runs_on_this_rank(cb)]
        # Stable sort before registering so on_train_loop_registration also follows execution_order.
        new_callbacks.sort(key=lambda cb: cb.execution_order)
        for callback in new_callbacks:
            loop.callbacks.append(callback)
            loop.callbacks.sort(key=lambda cb: cb.execution_order)
            self._rebuild_dispatch_lists()
            # A callback may register further callbacks from here (tracking loops do).
            callback.register_train_loop_object(loop)
        if print_callbacks:
            self.print_registered_callback_names()

    def _validate(self, callbacks):
        if callbacks is None:
            return []
        if isinstance(callbacks, AbstractCallback) or not isinstance(callbacks, (list, tuple)):
            raise TypeError(f'callbacks must be a list of callback objects, got {_describe(callbacks)}; '
                            f'wrap a single callback in a list: callbacks=[cb]')
        for i, cb in enumerate(callbacks):
            if isinstance(cb, type):
                raise TypeError(f'callbacks[{i}] is the class {cb.__qualname__}, not an instance; '
                                f'pass {cb.__qualname__}(...) instead')
            if not isinstance(cb, AbstractCallback):
                raise TypeError(f'callbacks[{i}] is a {_describe(cb)}; a callback must be an instance of a '
                                f'subclass of aitoolbox_like.callbacks.abstract.AbstractCallback')
            missing = [a for a in ('callback_name', 'execution_order', 'device_idx_execution')
                       if not hasattr(cb, a)]
            if missing:
                raise TypeError(f'callbacks[{i}] ({_describe(cb)}) has no {", ".join(missing)}: its __init__ must '
                                f'call super().__init__(callback_name, execution_order, device_idx_execution)')
            if isinstance(cb.execution_order, bool) or not isinstance(cb.execution_order, (int, float)):
                raise TypeError(f'callbacks[{i}] ({cb.callback_name!r}): execution_order must be a number, '
                                f'got {cb.execution_order!r}')
            idx = cb.device_idx_execution
            if idx is not None and (isinstance(idx, bool) or not isinstance(idx, int) or idx < 0):
                raise TypeError(f'callbacks[{i}] ({cb.callback_name!r}): device_idx_execution must be None (every '
                                f'process) or a global rank >= 0, got {idx!r}')
            for hook_name in ('on_after_gradient_update', 'on_after_batch_prediction', 'on_exception'):
                self._check_hook_signature(i, cb, hook_name)
        return list(callbacks)

    @staticmethod
    def _check_hook_signature(i, cb, hook_name):
        if not _overrides(cb, hook_name):
            return
        expected = inspect.signature(getattr(AbstractCallback, hook_name))
        try:
            inspect.signature(getattr(cb, hook_name)).bind(*[None] * (len(expected.parameters) - 1))
        except TypeError:
            raise TypeError(f'callbacks[{i}] ({cb.callback_name!r}): {hook_name} must accept the arguments '
                            f'{hook_name}{expected}'.replace('(self, ', '(')) from None

    def _runs_on_this_rank(self, callback):
        world_size = self.train_loop_obj.world_size
        return world_size == 1 or callback.device_idx_execution is None \
            or callback.device_idx_execution == self.train_loop_obj.global_rank

    def _rebuild_dispatch_lists(self):
        callbacks = self.train_loop_obj.callbacks
        self.registered_cbs = callbacks
        for hook_name in HOOK_NAMES:
            self._hook_lists[hook_name] = [self._bound(cb, hook_name) for cb in callbacks if _overrides(cb, hook_name)]
        self._custom_event_lists = {}

    def _bound(self, callback, name):
        method = getattr(callback, name)
        loop = self.train_loop_obj
        if loop.world_size == 1 or callback.device_idx_execution is None:
            return method

        # Only rank-restricted callbacks in a multi-process run pay for this wrapper; it lets the loop's
        # collectives name the callback instead of hanging while the other ranks never join.
        def guarded(*args, **kwargs):
            loop._rank_restricted_callback = callback
            try:
                return method(*args, **kwargs)
            finally:
                loop._rank_restricted_callback = None
        return guarded

    # ---- dispatch -----------------------------------------------------------------------------

    def _run(self, hook_name, *args):
        for fn in self._hook_lists[hook_name]:
            fn(*args)

    def execute_multiprocess_start(self):
        self._run('on_multiprocess_start')

    def execute_train_begin(self):
        self._run('on_train_begin')

    def execute_epoch_begin(self):
        self._run('on_epoch_begin')

    def execute_batch_begin(self):
        self._run('on_batch_begin')

    def execute_after_backward(self):
        self._run('on_after_backward')

    def execute_gradient_update(self, optimizer_idx=0):
        self._run('on_after_gradient_update', optimizer_idx)

    def execute_optimizer_step(self):
        self._run('on_after_optimizer_step')

    def execute_batch_end(self):
        self._run('on_batch_end')

    def execute_epoch_end(self):
        self._run('on_epoch_end')

    def execute_train_end(self):
        self._run('on_train_end')

    def execute_after_batch_prediction(self, y_pred_batch, y_test_batch, metadata_batch, dataset_info):
        self._run('on_after_batch_prediction', y_pred_batch, y_test_batch, metadata_batch, dataset_info)

    def execute_exception(self, exception):
        """Tell every callback about the exception; one failing handler must not hide the others or
        the original error."""
        for fn in self._hook_lists['on_exception']:
            try:
                fn(exception)
            except Exception:
                logger.exception('on_exception handler %r failed while handling %r', fn, exception)

    def call_event(self, event_name, **kwargs):
        """Call ``cb.<event_name>(**kwargs)`` on every registered callback that defines it, in order."""
        fns = self._custom_event_lists.get(event_name)
        if fns is None:
            fns = [self._bound(cb, event_name) for cb in self.train_loop_obj.callbacks
                   if callable(getattr(cb, event_name, None))]
            self._custom_event_lists[event_name] = fns
        return [fn(**kwargs) for fn in fns]

    def has_hook(self, hook_name):
        return bool(self._hook_lists[hook_name])

    # ---- state for checkpoints ----------------------------------------------------------------

    def _state_keys(self):
        seen = {}
        for cb in self.train_loop_obj.callbacks:
            key = cb.state_key
            seen[key] = seen.get(key, 0) + 1
            yield (key if seen[key] == 1 else f'{key}#{seen[key]}'), cb

    def callbacks_state_dict(self):
        return {key: state for key, cb in self._state_keys() if (state := cb.state_dict()) is not None}

    def load_callbacks_state_dict(self, state):
        for key, cb in self._state_keys():
            if key in state:
                cb.load_state_dict(state[key])

    # ---- reporting ----------------------------------------------------------------------------

    def print_registered_callback_names(self):
        # A report the user asked for (print_callbacks=True), so it goes to stdout.
        print('CALLBACKS:')
        for cb in self.train_loop_obj.callbacks:
            print(f'  {cb.execution_order:>6}  {cb.callback_name}  ({type(cb).__name__}, '
                  f'device_idx_execution={cb.device_idx_execution})')

    def __str__(self):
        return 'CALLBACKS:\n' + '\n'.join(f'  {cb.callback_name}' for cb in self.train_loop_obj.callbacks)
