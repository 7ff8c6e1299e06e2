"""CallbacksHandler: validates, orders, rank-gates and dispatches the loop's callbacks.

Per-hook dispatch lists are rebuilt only when the set of callbacks changes; :meth:`CallbacksHandler.fire` is the
one way a hook is called. A hook no callback uses costs one loop over an empty list, and in the training step not
even that: the loop reads :attr:`CallbacksHandler.hook_lists` and calls ``fire`` only for a hook that has callbacks.
"""
import importlib
import inspect
import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from torch.optim import lr_scheduler as torch_lr_scheduler

from ..model.huggingface import is_transformers_schedule
from .callback import HOOK_ARITY, HOOK_NAMES, HOOKS_WITH_ARGUMENTS, AbstractCallback, overrides_hook

if TYPE_CHECKING:
    from .train_loop import TrainLoop

logger = logging.getLogger(__name__)

#: Callbacks of other libraries that ``fit`` takes as they are: the root package of a foreign callback's class (or of
#: one of its bases) -> its adapter, ``adapter(loop, callbacks) -> callbacks``: the list with that library's callbacks
#: replaced by callbacks of the loop.
#: Named by path and imported only when such a callback is given, so the core imports no callback library.
FOREIGN_CALLBACK_ADAPTERS: Dict[str, str] = {
    'pytorch_accelerated': 'aitoolbox_like.adapters.pytorch_accelerated:adopt_callbacks',
    'bigdl': 'aitoolbox_like.adapters.orca.callback:adopt_bigdl_callbacks',
}


def import_object(path: str) -> Any:
    """The object named ``'package.module:name'``, its module imported now."""
    module, _, name = path.partition(':')
    return getattr(importlib.import_module(module), name)


def foreign_library(obj: Any) -> Optional[str]:
    """The :data:`FOREIGN_CALLBACK_ADAPTERS` key of a foreign callback (an instance or a class), else None. Only
    the classes' ``__module__`` is read: a foreign object may raise on any attribute it lacks."""
    cls = obj if isinstance(obj, type) else type(obj)
    for klass in cls.__mro__:
        root = klass.__module__.partition('.')[0]
        if root in FOREIGN_CALLBACK_ADAPTERS:
            return root
    return None


class CollectiveInRankRestrictedCallbackError(RuntimeError):
    """A callback that runs on one rank only called an operation every rank must join."""


def _describe(obj):
    return f'{type(obj).__module__}.{type(obj).__qualname__}'


def _not_a_callback(i: int, obj: Any) -> TypeError:
    """The error for ``callbacks[i]`` that is no callback; for a torch scheduler, how to wrap it."""
    wrap = 'from aitoolbox_like.callbacks.train_schedule import LRSchedulerCallback'
    if is_transformers_schedule(obj):
        return TypeError(f'callbacks[{i}] is a learning-rate schedule of transformers ({_describe(obj)}), not a '
                         f'callback; it counts optimizer updates, so wrap it to step after every update: '
                         f'LRSchedulerCallback(scheduler, interval=\'step\') ({wrap})')
    if isinstance(obj, torch_lr_scheduler.ReduceLROnPlateau):
        return TypeError(f'callbacks[{i}] is a torch scheduler ({_describe(obj)}), not a callback; wrap it: '
                         f'LRSchedulerCallback(scheduler, monitor=\'val_loss\') ({wrap})')
    if isinstance(obj, torch_lr_scheduler.LRScheduler):
        return TypeError(f'callbacks[{i}] is a torch scheduler ({_describe(obj)}), not a callback; wrap it: '
                         f'LRSchedulerCallback(scheduler, interval=\'step\') to step it after every optimizer '
                         f'update (a schedule counted in updates, as transformers\' are), or interval=\'epoch\' '
                         f'after every epoch ({wrap})')
    return TypeError(f'callbacks[{i}] is a {_describe(obj)}; a callback must be an instance of a '
                     f'subclass of aitoolbox_like.callbacks.abstract.AbstractCallback')


# What a hook no callback uses does, one per number of arguments: a call without ``*args`` (no tuple to build) costs
# about a third less, and the step calls six hooks that usually nobody uses.
def _nothing0() -> None: ...
def _nothing1(a: Any) -> None: ...                        # noqa: E704
def _nothing2(a: Any, b: Any) -> None: ...                # noqa: E704
def _nothing3(a: Any, b: Any, c: Any) -> None: ...        # noqa: E704
def _nothing4(a: Any, b: Any, c: Any, d: Any) -> None: ...    # noqa: E704


_NOTHING_BY_ARITY: Dict[int, Callable[..., None]] = {0: _nothing0, 1: _nothing1, 2: _nothing2, 3: _nothing3,
                                                     4: _nothing4}


class HookDispatch:
    """What firing each hook does now: one callable per hook, as an attribute named after it
    (``handler.dispatch.on_batch_end()``). The handler sets them whenever the registered callbacks change: a hook no
    callback uses is a call that does nothing, a hook one callback uses is that callback's method itself, and a hook
    several use calls each in execution order. ``on_exception`` calls each and logs what fails in it, so that one
    failing handler hides neither the others nor the exception being handled."""

    if TYPE_CHECKING:
        # For the type checker only: at run time a ``__getattr__`` would slow every read of a hook's callable
        # (about four times in CPython 3.11, whose attribute reads are then no longer specialized).
        def __getattr__(self, name: str) -> Callable[..., None]: ...


def _dispatcher(hook_name: str, fns: List[Callable[..., Any]]) -> Callable[..., None]:
    if hook_name == 'on_exception':
        handlers = tuple(fns)

        def each_isolated(exception: BaseException) -> None:
            for fn in handlers:
                try:
                    fn(exception)
                except Exception:
                    logger.exception('on_exception handler %r failed while handling %r', fn, exception)
        return each_isolated
    if not fns:
        return _NOTHING_BY_ARITY[HOOK_ARITY[hook_name]]
    if len(fns) == 1:
        return fns[0]
    calls = tuple(fns)

    def each(*args: Any) -> None:
        for fn in calls:
            fn(*args)
    return each


class CallbacksHandler:
    """The loop's callbacks: registration (validated, ordered, rank-gated) and dispatch.

    ``dispatch`` holds one callable per hook, rebuilt at registration (:class:`HookDispatch`): the loop fires every
    hook through it (``dispatch.on_batch_end()``), so a hook no callback uses costs a call that does nothing, with no
    test at the call site. :meth:`fire` does the same by the hook's name.
    """

    def __init__(self, train_loop_obj: 'TrainLoop') -> None:
        self.train_loop_obj = train_loop_obj
        self.registered_cbs: List[AbstractCallback] = []    # AIToolbox name; same objects as loop.callbacks
        self.cached_callbacks: List[AbstractCallback] = []  # registered at the first fit
        #: Per hook name, the bound methods to call, in execution order (only callbacks that use the hook). Updated
        #: in place when the registered callbacks change (the same dict, the same keys); read it, do not modify it.
        self.hook_lists: Dict[str, List[Callable[..., Any]]] = {name: [] for name in HOOK_NAMES}
        #: What firing each hook does, built from ``hook_lists`` (see :class:`HookDispatch`).
        self.dispatch = HookDispatch()
        for name in HOOK_NAMES:
            self._refresh(name)
        self._custom_event_lists: Dict[str, List[Callable[..., Any]]] = {}
        # What the dispatch lists were built from: per hook the callbacks in its list, and the callbacks in order.
        self._hook_owners: Dict[str, List[AbstractCallback]] = {name: [] for name in HOOK_NAMES}
        self._dispatched: List[AbstractCallback] = []

    # ---- registration -------------------------------------------------------------------------

    def register_callbacks(self, callbacks: Optional[Sequence[AbstractCallback]], cache_callbacks: bool = False,
                           print_callbacks: bool = False) -> None:
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
        callbacks, self.cached_callbacks = self.cached_callbacks + list(callbacks), []
        loop = self.train_loop_obj
        unique: List[AbstractCallback] = []
        for cb in callbacks:
            if any(cb is seen for seen in unique):
                # Registered twice, a StepLR would step twice per epoch: keep the first.
                logger.warning('%s (%s) is in the callbacks list more than once; it is registered once',
                               cb.callback_name, type(cb).__name__)
            else:
                unique.append(cb)
        new_callbacks = [cb for cb in unique if not any(cb is c for c in loop.callbacks)]
        new_callbacks = [cb for cb in new_callbacks if self.runs_on_this_rank(cb)]
        # Stable sort before registering so on_train_loop_registration also follows execution_order.
        new_callbacks.sort(key=lambda cb: cb.execution_order)
        for callback in new_callbacks:
            if any(callback is registered for registered in loop.callbacks):
                # Registered meanwhile by a callback before it that registers others (SuperGradients'
                # phase_callbacks): one registration, or it would run twice per event.
                logger.warning('%s (%s) is given here and was also registered by another callback of this fit (e.g. '
                               'in SuperGradients\' training_params["phase_callbacks"]); it is registered once',
                               callback.callback_name, type(callback).__name__)
                continue
            loop.callbacks.append(callback)
            loop.callbacks.sort(key=lambda cb: cb.execution_order)
            self._add_to_dispatch_lists(callback)
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
        callbacks = self.adopt_foreign(callbacks)
        for i, cb in enumerate(callbacks):
            if isinstance(cb, type):
                raise TypeError(f'callbacks[{i}] is the class {cb.__qualname__}, not an instance; '
                                f'pass {cb.__qualname__}(...) instead')
            if not isinstance(cb, AbstractCallback):
                raise _not_a_callback(i, cb)
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
            for hook_name in HOOKS_WITH_ARGUMENTS:
                self._check_hook_signature(i, cb, hook_name)
        return list(callbacks)

    def adopt_foreign(self, callbacks: Any) -> Any:
        """``callbacks`` with the callbacks of other libraries (:data:`FOREIGN_CALLBACK_ADAPTERS`) in the form the
        loop runs them, as each library's adapter gives it. ``fit`` calls it first: a foreign callback may raise on
        any attribute it lacks, so none may reach the loop's own checks. Anything but a list or tuple is returned as
        is (registration then says what is wrong with it)."""
        if not isinstance(callbacks, (list, tuple)):
            return callbacks
        for library in dict.fromkeys(lib for lib in map(foreign_library, callbacks) if lib is not None):
            callbacks = import_object(FOREIGN_CALLBACK_ADAPTERS[library])(self.train_loop_obj, list(callbacks))
        return callbacks

    @staticmethod
    def _check_hook_signature(i, cb, hook_name):
        if not overrides_hook(type(cb), hook_name):
            return
        expected = inspect.signature(getattr(AbstractCallback, hook_name))
        try:
            inspect.signature(getattr(cb, hook_name)).bind(*[None] * (len(expected.parameters) - 1))
        except TypeError:
            names = ', '.join(name for name in expected.parameters if name != 'self')
            raise TypeError(f'callbacks[{i}] ({cb.callback_name!r}): {hook_name} must accept the arguments '
                            f'{hook_name}({names})') from None

    def runs_on_this_rank(self, callback: AbstractCallback) -> bool:
        """Whether ``callback`` runs in this process (its device_idx_execution is None or this global rank)."""
        world_size = self.train_loop_obj.world_size
        return world_size == 1 or callback.device_idx_execution is None \
            or callback.device_idx_execution == self.train_loop_obj.global_rank

    def regate_for_rank(self) -> None:
        """Drop the callbacks that do not run in this process. Called once a distributed process knows its rank:
        callbacks registered before the process group existed were gated as in a single process."""
        loop = self.train_loop_obj
        loop.callbacks[:] = [cb for cb in loop.callbacks if self.runs_on_this_rank(cb)]
        self._rebuild_dispatch_lists()

    def _rebuild_dispatch_lists(self):
        callbacks = self.train_loop_obj.callbacks
        self.registered_cbs = callbacks
        hooks_of = {id(cb): set(cb.hooks_in_use()) for cb in callbacks}
        for hook_name in HOOK_NAMES:
            owners = [cb for cb in callbacks if hook_name in hooks_of[id(cb)]]
            self._hook_owners[hook_name] = owners
            self.hook_lists[hook_name] = [self._bound(cb, hook_name) for cb in owners]
            self._refresh(hook_name)
        self._dispatched = list(callbacks)
        self._custom_event_lists = {}

    def _add_to_dispatch_lists(self, callback):
        """The dispatch lists after ``callback`` joined ``loop.callbacks``: the same lists a full rebuild gives,
        built by inserting only its hooks (registering N callbacks costs O(N) list work per callback instead of
        a rebuild over every callback and hook). Falls back to the full rebuild when ``loop.callbacks`` was
        changed by other means since the last build."""
        callbacks = self.train_loop_obj.callbacks
        position = next(i for i, cb in enumerate(callbacks) if cb is callback)
        others = callbacks[:position] + callbacks[position + 1:]
        if len(others) != len(self._dispatched) or any(a is not b for a, b in zip(others, self._dispatched)):
            self._rebuild_dispatch_lists()
            return
        self.registered_cbs = callbacks
        before = {id(cb) for cb in callbacks[:position]}
        for hook_name in set(callback.hooks_in_use()):
            owners = self._hook_owners[hook_name]
            at = sum(1 for cb in owners if id(cb) in before)
            owners.insert(at, callback)
            self.hook_lists[hook_name].insert(at, self._bound(callback, hook_name))
            self._refresh(hook_name)
        self._dispatched.insert(position, callback)
        self._custom_event_lists = {}

    def __getstate__(self) -> Dict[str, Any]:
        # Sent with the loop to the processes of a DDP fit: ``dispatch`` holds closures, and is rebuilt there.
        return {key: value for key, value in self.__dict__.items() if key != 'dispatch'}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.dispatch = HookDispatch()
        for name in HOOK_NAMES:
            self._refresh(name)

    def _refresh(self, hook_name: str) -> None:
        setattr(self.dispatch, hook_name, _dispatcher(hook_name, self.hook_lists[hook_name]))

    def _bound(self, callback, name):
        method = getattr(callback, name)
        loop = self.train_loop_obj
        if loop.world_size == 1 or callback.device_idx_execution is None:
            return method

        # Only rank-restricted callbacks in a multi-process run pay for this wrapper; it lets the loop's
        # collectives name the callback instead of hanging while the other ranks never join.
        def guarded(*args, **kwargs):
            loop.running_rank_restricted_callback = callback
            try:
                return method(*args, **kwargs)
            finally:
                loop.running_rank_restricted_callback = None
        return guarded

    # ---- dispatch -----------------------------------------------------------------------------

    def fire(self, hook_name: str, *args: Any) -> None:
        """Call ``hook_name(*args)`` on the callbacks that use the hook, in execution order: ``dispatch``'s callable
        for that hook, found by its name."""
        getattr(self.dispatch, hook_name)(*args)

    def call_event(self, event_name: str, **kwargs: Any) -> List[Any]:
        """Call ``cb.<event_name>(**kwargs)`` on every registered callback that defines it, in order; returns
        their results."""
        fns = self._custom_event_lists.get(event_name)
        if fns is None:
            fns = [self._bound(cb, event_name) for cb in self.train_loop_obj.callbacks
                   if callable(getattr(cb, event_name, None))]
            self._custom_event_lists[event_name] = fns
        return [fn(**kwargs) for fn in fns]

    def has_hook(self, hook_name: str) -> bool:
        """Whether any registered callback uses ``hook_name``."""
        return bool(self.hook_lists[hook_name])

    # ---- state for checkpoints ----------------------------------------------------------------

    def _state_keys(self) -> Iterator[Tuple[str, AbstractCallback]]:
        seen: Dict[str, int] = {}
        for cb in self.train_loop_obj.callbacks:
            key = cb.state_key
            seen[key] = seen.get(key, 0) + 1
            yield (key if seen[key] == 1 else f'{key}#{seen[key]}'), cb

    def callbacks_state_dict(self) -> Dict[str, Any]:
        """Every stateful callback's state_dict, by state_key (a '#n' suffix tells equal keys apart)."""
        return {key: state for key, cb in self._state_keys() if (state := cb.state_dict()) is not None}

    def load_callbacks_state_dict(self, state: Mapping[str, Any]) -> None:
        """Give each callback its saved state (by state_key); callbacks without saved state are left alone."""
        for key, cb in self._state_keys():
            if key in state:
                cb.load_state_dict(state[key])

    # ---- reporting ----------------------------------------------------------------------------

    def print_registered_callback_names(self) -> None:
        """Print the registered callbacks in execution order (print_callbacks=True)."""
        # A report the user asked for (print_callbacks=True), so it goes to stdout.
        print('CALLBACKS:')
        for cb in self.train_loop_obj.callbacks:
            print(f'  {cb.execution_order:>6}  {cb.callback_name}  ({type(cb).__name__}, '
                  f'device_idx_execution={cb.device_idx_execution})')

    # ---- AIToolbox's container protocol ---------------------------------------------------------

    def __len__(self) -> int:
        return len(self.train_loop_obj.callbacks)

    def __contains__(self, item: Any) -> bool:
        """``'name' in handler`` (a callback_name), ``SomeCallback in handler`` (a class: exact type, as in AIToolbox)
        or ``callback in handler`` (that object)."""
        callbacks = self.train_loop_obj.callbacks
        if isinstance(item, str):
            return any(cb.callback_name == item for cb in callbacks)
        if isinstance(item, type):
            return any(type(cb) is item for cb in callbacks)
        return any(cb is item for cb in callbacks)

    def __iadd__(self, callbacks: Sequence[AbstractCallback]) -> 'CallbacksHandler':
        """``handler += [cb, ...]`` registers the callbacks."""
        self.register_callbacks(callbacks)
        return self

    __add__ = __iadd__

    def should_enable_callback(self, callback: AbstractCallback) -> bool:
        """AIToolbox's name for :meth:`runs_on_this_rank`."""
        return self.runs_on_this_rank(callback)

    def __str__(self) -> str:
        return 'CALLBACKS:\n' + '\n'.join(f'  {cb.callback_name}' for cb in self.train_loop_obj.callbacks)
