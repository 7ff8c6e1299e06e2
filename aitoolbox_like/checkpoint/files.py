"""Checkpoint files: atomic writes and safe (``weights_only``) loading.

A checkpoint is one ``torch.save`` dict that holds only tensors, numbers, strings, lists/tuples and
dicts, so it loads with ``torch.load(weights_only=True)``: loading a file then never runs code that
came with it.
"""
from __future__ import annotations

import logging
import os
import pickle
import re
import threading
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from typing import IO, Any, Callable, Optional, TypeVar

import torch

from ..runtime._typing import StrPath
from ..storage.local import write_atomically

logger = logging.getLogger(__name__)

_ModuleT = TypeVar('_ModuleT', bound=torch.nn.Module)

# Bump when the checkpoint dict layout changes incompatibly; a reader refuses newer files rather
# than silently misreading them.
FORMAT_VERSION = 1

# Exact types only: subclasses (IntEnum, numpy scalars, custom dicts) are pickled as globals that
# the weights_only unpickler rejects.
_SCALAR_TYPES = (int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device)
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_DICT_TYPES = (dict, OrderedDict)
_SEQUENCE_TYPES = (list, tuple, torch.Size)
_KEY_TYPES = frozenset((str, int, bool))
_IMMUTABLE_LEAVES = frozenset(_SCALAR_TYPES + (torch.Size,))

# How torch's weights_only unpickler reports an object it refuses to rebuild (as opposed to a
# malformed byte stream). Matched against the inner UnpicklingError's text.
_UNSAFE_GLOBAL_RE = re.compile(r'GLOBAL (\S+) was not an allowed global')
_UNSAFE_OTHER_MARKERS = (
    'is blocked',
    'Can only create new object',
    'Trying to call reduce',
    'Can only build',
    'must be imported to load',
)
_DOTTED_NAME_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$')


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read as asked; the message says why and what to do."""


def fsync_directory(directory: StrPath) -> None:
    """fsync a folder, which makes a rename (or a file created) inside it durable; a no-op where a folder cannot
    be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_torch_save(obj: Any, path: StrPath, temp_dir: StrPath | None = None) -> None:
    """``torch.save(obj, path)`` such that ``path`` holds either the old file or the complete new one.

    The temporary file (``.<name>.<random>.tmp``) lives in the target directory, or in ``temp_dir`` (same
    filesystem), so ``os.replace`` is a same-filesystem rename; the target directory must exist.
    """
    path = os.path.abspath(os.fspath(path))
    write_atomically(path, lambda f: torch.save(obj, f), temp_suffix='.tmp', make_parents=False, temp_dir=temp_dir)
    fsync_directory(os.path.dirname(path))


def load_model_weights(model: _ModuleT, state_dict: Mapping[str, Any], source: str = 'checkpoint') -> _ModuleT:
    """``model.load_state_dict(state_dict)`` (strict), with a CheckpointError that names the missing and the
    unexpected keys when the checkpoint was saved from a different model."""
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as error:
        model_keys = set(model.state_dict())
        saved_keys = set(state_dict)
        details = []
        if saved_keys - model_keys:
            details.append(f'unexpected {sorted(saved_keys - model_keys)[:5]}')
        if model_keys - saved_keys:
            details.append(f'missing {sorted(model_keys - saved_keys)[:5]}')
        if not details:
            details.append(str(error).splitlines()[-1].strip())
        raise CheckpointError(f'{source} was saved from a different model than {type(model).__qualname__}: '
                              f'{"; ".join(details)}') from None
    return model


def _is_plain_pickle(path_or_file: Any) -> bool:
    """True for a file written by pickle.dump (not torch.save's zip format): it starts with pickle's PROTO opcode."""
    if not isinstance(path_or_file, (str, bytes, os.PathLike)):
        return False
    try:
        with open(path_or_file, 'rb') as f:
            head = f.read(2)
    except OSError:
        return False
    return len(head) == 2 and head[0] == 0x80 and head[1] >= 2 and not zipfile.is_zipfile(path_or_file)


def _describe_key(key: object) -> str:
    return f'[{key!r}]'


def check_weights_only_safe(obj: object, where: str = 'checkpoint') -> None:
    """Raise CheckpointError if ``obj`` holds anything ``torch.load(weights_only=True)`` would refuse.

    Run before saving so the mistake (a lambda, a numpy scalar, a custom object in a callback's
    state) is reported with its location now, not as an unreadable checkpoint at resume time.
    """
    if _all_weights_only_safe(obj):
        return
    # Something is not: walk again, naming where each value is, to say where the first one is.
    _raise_at_first_unsafe(obj, where)


def _all_weights_only_safe(obj: object) -> bool:
    """The walk of :func:`check_weights_only_safe` without the locations (a string per value): a save checks every
    value of its checkpoint, and on the training thread."""
    stack: list[Any] = [obj]
    seen: set[int] = set()
    leaves = _TENSOR_TYPES + _SCALAR_TYPES
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind in leaves:
            continue
        if kind in _DICT_TYPES:
            if id(value) not in seen:
                seen.add(id(value))
                if not _KEY_TYPES.issuperset(map(type, value)):
                    return False
                stack.extend(value.values())
            continue
        if kind in _SEQUENCE_TYPES:
            if id(value) not in seen:
                seen.add(id(value))
                stack.extend(value)
            continue
        return False
    return True


def _raise_at_first_unsafe(obj: object, where: str) -> None:
    # Iterative walk: deeply nested state must not hit the recursion limit; `seen` guards cycles.
    stack: list[tuple[Any, str]] = [(obj, where)]
    seen: set[int] = set()
    while stack:
        value, location = stack.pop()
        kind = type(value)
        if kind in _TENSOR_TYPES or kind in _SCALAR_TYPES:
            continue
        if kind in _DICT_TYPES or kind in _SEQUENCE_TYPES:
            if id(value) in seen:
                continue
            seen.add(id(value))
            if kind in _DICT_TYPES:
                for key, item in value.items():
                    if type(key) not in _KEY_TYPES:
                        raise CheckpointError(
                            f'{location}: dict key {key!r} has type {_type_name(key)}; '
                            f'checkpoint dict keys must be str or int'
                        )
                    stack.append((item, location + _describe_key(key)))
            else:
                for index, item in enumerate(value):
                    stack.append((item, f'{location}[{index}]'))
            continue
        hint = ''
        if kind.__module__ == 'numpy':
            hint = ' (convert numpy values with .item() or torch.as_tensor())'
        raise CheckpointError(
            f'{location}: {_type_name(value)} cannot be stored in a weights_only checkpoint; '
            f'only tensors, numbers, bools, None, strings, lists/tuples and dicts are allowed{hint}'
        )


def _type_name(value: object) -> str:
    kind = type(value)
    if kind.__module__ == 'builtins':
        return kind.__qualname__
    return f'{kind.__module__}.{kind.__qualname__}'


def _unsafe_reason(error: BaseException) -> str | None:
    """Return a short description if a weights_only failure is a refused object, else None.

    torch wraps the unpickler's own error in a long message; the original is its __context__.
    """
    texts = [str(error)]
    if error.__context__ is not None:
        texts.insert(0, str(error.__context__))
    for text in texts:
        match = _UNSAFE_GLOBAL_RE.search(text)
        if match:
            name = match.group(1)
            # A flipped byte inside a global's name looks like an unknown global; a real Python
            # name is the sign of a pickled object rather than corruption.
            if _DOTTED_NAME_RE.match(name):
                return f'it references {name}'
            return None
        for marker in _UNSAFE_OTHER_MARKERS:
            if marker in text:
                return text.splitlines()[0].strip()
    return None


def _short_error(error: BaseException) -> str:
    inner = error.__context__ if isinstance(error, pickle.UnpicklingError) and error.__context__ else error
    lines = str(inner).strip().splitlines()
    first = lines[0] if lines else ''
    return f'{type(inner).__name__}: {first}' if first else type(inner).__name__


def load_checkpoint(path_or_file: StrPath | IO[bytes], map_location: Any = 'cpu',
                    allow_unsafe_pickle: bool = False, source_name: str | None = None) -> Any:
    """Load a checkpoint written by :func:`atomic_torch_save`.

    Uses ``torch.load(weights_only=True)`` unless ``allow_unsafe_pickle`` is set, which is only for
    files you trust (for example old checkpoints that pickled whole objects).

    Args:
        source_name: how errors name the checkpoint (e.g. its ``s3://`` address when the file is a downloaded copy).
    """
    name: str
    if isinstance(path_or_file, (str, bytes, os.PathLike)):
        name = source_name or str(os.fspath(path_or_file))
        if not os.path.exists(path_or_file):
            raise FileNotFoundError(f'Checkpoint file not found: {name}')
    else:
        name = source_name or str(getattr(path_or_file, 'name', repr(path_or_file)))

    try:
        checkpoint = torch.load(path_or_file, map_location=map_location,
                                weights_only=not allow_unsafe_pickle)
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except pickle.UnpicklingError as error:
        reason = None if allow_unsafe_pickle else _unsafe_reason(error)
        if reason is None and not allow_unsafe_pickle and _is_plain_pickle(path_or_file):
            raise CheckpointError(
                f'Checkpoint {name} is a plain pickle file, not a weights-only checkpoint written with torch.save: '
                f'aitoolbox_like loads checkpoints with torch.load(weights_only=True). Re-save it with torch.save, or, '
                f'if you trust where it came from, load it with allow_unsafe_pickle=True.') from None
        if reason is not None:
            raise CheckpointError(
                f'Checkpoint {name} contains arbitrary Python objects ({reason}), which '
                f'torch.load(weights_only=True) refuses because unpickling them can run code. '
                f'If you trust where this file came from, load it with allow_unsafe_pickle=True.'
            ) from None
        raise CheckpointError(
            f'Checkpoint {name} is truncated or corrupt and cannot be loaded '
            f'({_short_error(error)})'
        ) from error
    except (ModuleNotFoundError, AttributeError) as error:
        if not allow_unsafe_pickle:
            raise CheckpointError(
                f'Checkpoint {name} is truncated or corrupt and cannot be loaded '
                f'({_short_error(error)})'
            ) from error
        # Full unpickling imports the classes the file names; a missing one is not corruption.
        raise CheckpointError(
            f'Checkpoint {name} refers to Python code that cannot be imported here '
            f'({_short_error(error)}); install or import the module that defined it'
        ) from error
    except Exception as error:
        # A damaged file can surface as nearly any exception (EOFError, RuntimeError from the zip
        # reader, OSError, KeyError, UnicodeDecodeError, ...); report them all the same way.
        raise CheckpointError(
            f'Checkpoint {name} is truncated or corrupt and cannot be loaded ({_short_error(error)})'
        ) from error

    if isinstance(checkpoint, dict):
        version = checkpoint.get('format_version')
        if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
            raise CheckpointError(
                f'Checkpoint {name} has format_version {version}, but this aitoolbox_like reads '
                f'format_version <= {FORMAT_VERSION}; upgrade aitoolbox_like to load it.'
            )
    logger.debug('Loaded checkpoint %s', name)
    return checkpoint


# ---------------------------------------------------------------------------------------------- asynchronous writes


class AsyncCheckpointWriter:
    """Writes checkpoints in a background thread, one at a time, so training waits only for a host copy.

    The thread's ``torch.save`` pickles with Python's interpreter lock held (about 25 us per tensor): a training step
    that runs Python meanwhile waits for it, so on a CPU a small model's next step takes about that much longer. A
    step in large kernels or waiting for a GPU goes on beside the write.

    The saving callbacks use one writer each:

    1. :meth:`snapshot` (training thread): a deep copy of the checkpoint dict whose tensors are copied to host
       memory (CPU tensors copied, device tensors copied into pinned host memory without waiting for each). The
       buffers of the previous snapshot are reused when a tensor has the same shape and dtype, so a steady run copies
       into memory that is already mapped (no page faults), in one batched copy, and holds at most one extra copy of
       the state. Nothing is pickled on the training thread. A value that ``torch.load(weights_only=True)`` would
       refuse raises :class:`CheckpointError` naming where it is (the walk that copies is the walk that checks).
    2. :meth:`submit` (training thread): waits for the write in flight (at most one: memory stays bounded), raises
       its error if it failed, then hands ``job(snapshot)`` to the writer thread: serialise, fsync, rename, update
       the pointers, queue the upload.
    3. :meth:`wait`: blocks until the write in flight is complete and raises :class:`CheckpointError` (with the
       original error as its cause) if it failed. An error is raised once, at the first ``wait`` / ``submit``
       after it happened: never silently dropped.

    The writer thread is started by the first write and ends :data:`IDLE_SECONDS` after its last one, or at
    :meth:`close`: a run that saves every few milliseconds (every epoch of a small model) does not start a thread per
    write. It is not a daemon: a process that ends normally finishes the write in flight first (and, if nobody
    called :meth:`close`, exits at most ``IDLE_SECONDS`` later). A process killed during the write (``kill -9``)
    loses only that write: the file is written to a temporary name and renamed, and pointers are updated only
    afterwards, so the previous checkpoint and pointer stay intact.

    ``before_write`` is a hook for tests: called in the background thread with the target's description (the
    checkpoint path) before the job runs (block it on an Event to hold a write in flight).
    """

    #: Seconds the writer thread waits for the next write before it ends.
    IDLE_SECONDS = 1.0

    def __init__(self) -> None:
        self.before_write: Optional[Callable[[str], None]] = None
        self._setup()
        self._description = ''
        self._error: Optional[BaseException] = None
        self._pool: list[torch.Tensor] = []
        # (dtype, shape, layout, is_cpu) of each pool buffer, when every one of them is a plain CPU buffer that the
        # next snapshot's tensors may be copied into without a check each (see snapshot); None otherwise.
        self._pool_signature: Optional[list[tuple[Any, ...]]] = None

    def _setup(self) -> None:
        # Guards what the two threads share: the job handed over, whether it is done, and the thread itself.
        self._condition = threading.Condition()
        self._job: Optional[tuple[Callable[[Any], None], Any, str]] = None
        self._busy = False
        self._thread: Optional[threading.Thread] = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickled with its callback (a DDP spawn): a thread and its lock cannot travel, and the staging buffers need
        # not. A failed write is raised here, in this process, not carried to the next.
        self.wait()
        self.close()
        state = dict(self.__dict__)
        for name in ('_condition', '_job', '_busy', '_thread'):
            del state[name]
        state['_pool'] = []
        state['_pool_signature'] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    @property
    def pending(self) -> bool:
        """True while a write is in flight."""
        return self._busy

    def snapshot(self, obj: Any, where: str = 'checkpoint') -> Any:
        """A deep copy of ``obj`` (dicts, lists, tuples, scalars, tensors) with every tensor copied to host memory.

        Raises :class:`CheckpointError` (as :func:`check_weights_only_safe` does, ``where`` naming ``obj``) where
        ``obj`` holds a value a weights_only checkpoint cannot. Call it only when no write is in flight
        (:meth:`submit` and :meth:`wait` ensure it): it reuses the previous snapshot's buffers."""
        if self._busy:
            raise RuntimeError('AsyncCheckpointWriter.snapshot() while a write is in flight; call wait() first')
        with torch.no_grad():
            walk = None
            if self._pool_signature is not None:
                # The common case, a checkpoint of the same tensors as the last one: each tensor is given the
                # buffer at its place in the walk, and one check over all of them afterwards confirms the guess
                # (a check per tensor during the walk was half of the snapshot's time on the training thread).
                # When it fails, the walk is made again, tensor by tensor.
                walk = _SnapshotWalk(self._pool, self._pool_signature)
                copied = walk.copy(obj)
                if not walk.reused_every_buffer():
                    walk = None
            if walk is None:
                walk = _SnapshotWalk(self._pool)
                copied = walk.copy(obj)
            if walk.unsafe:
                check_weights_only_safe(obj, where)     # names where the value is
            walk.finish()
        self._pool = walk.buffers
        self._pool_signature = walk.signature()
        return copied

    def submit(self, description: str, job: Callable[[Any], None], snapshot: Any) -> None:
        """Run ``job(snapshot)`` in the writer thread once the previous write is complete (its error, if any,
        is raised here first). ``description`` names the write in errors (the checkpoint's path)."""
        self.wait()
        with self._condition:
            self._description = description
            self._job = (job, snapshot, description)
            self._busy = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name='checkpoint-writer', daemon=False)
                self._thread.start()
            self._condition.notify_all()

    def _serve(self) -> None:
        condition = self._condition
        while True:
            with condition:
                while self._job is None:
                    if not condition.wait(timeout=self.IDLE_SECONDS) and self._job is None:
                        self._thread = None     # under the lock: a submit from now on starts a new thread
                        return
                    if self._thread is not threading.current_thread():      # close()
                        return
                job, snapshot, description = self._job
                self._job = None
            try:
                if self.before_write is not None:
                    self.before_write(description)
                job(snapshot)
                logger.debug('Checkpoint %s written in the background', description)
            except BaseException as error:      # kept for the training thread, which raises it at its next wait()
                self._error = error
            finally:
                del job, snapshot           # the copy is not held while the thread waits
                with condition:
                    self._busy = False
                    condition.notify_all()

    def wait(self) -> None:
        """Block until the write in flight (if any) is complete; raise CheckpointError if a write failed."""
        if self._busy:
            with self._condition:
                while self._busy:
                    self._condition.wait()
        error, self._error = self._error, None
        if error is not None:
            raise CheckpointError(f'writing the checkpoint {self._description} in the background failed: '
                                  f'{type(error).__name__}: {error}') from error

    def close(self) -> None:
        """Let the write in flight finish, then end the writer thread (a later write starts a new one). Raises
        nothing: a failed write stays to be raised by the next :meth:`wait`."""
        with self._condition:
            while self._busy:
                self._condition.wait()
            thread, self._thread = self._thread, None
            self._condition.notify_all()
        if thread is not None:
            thread.join()


class _SnapshotWalk:
    """One :meth:`AsyncCheckpointWriter.snapshot`: copies a checkpoint's containers, and gives each tensor a host
    buffer. A CPU tensor whose buffer (the previous snapshot's, in the order the walk meets them) has its shape and
    dtype is copied by :meth:`finish`, all in one batched copy: per-tensor calls were most of a save's time on the
    training thread for a model of many small tensors (an optimizer's state is three per parameter).

    With ``signature`` (the previous snapshot's :meth:`signature`) the walk only guesses: the n-th tensor met gets
    the n-th buffer, and :meth:`reused_every_buffer` then checks every guess at once."""

    def __init__(self, pool: list[torch.Tensor], signature: Optional[list[tuple[Any, ...]]] = None) -> None:
        self.pool = pool
        self.buffers: list[torch.Tensor] = []
        self.memo: dict[int, torch.Tensor] = {}
        self.targets: list[torch.Tensor] = []
        self.sources: list[torch.Tensor] = []
        self.devices: set[torch.device] = set()
        self.unsafe = False         # a value a weights_only checkpoint cannot hold was met
        self.plain = 0              # tensors copied into a buffer of their own by the CPU branch
        self.expected = signature
        if signature is not None:
            self._copy_tensor = self._reuse_tensor      # type: ignore[method-assign]
            self.buffers = self.targets = pool

    def copy(self, value: Any) -> Any:
        kind = type(value)
        if kind is torch.Tensor or kind is torch.nn.Parameter:
            copied = self.memo.get(id(value))
            if copied is None:          # the same tensor twice (tied weights) stays one tensor
                copied = self.memo[id(value)] = self._copy_tensor(value)
            return copied
        # Immutable leaves are kept without a call: an optimizer's state is mostly lists of indices and numbers.
        copy, leaves = self.copy, _IMMUTABLE_LEAVES
        if kind in _DICT_TYPES:
            if not _KEY_TYPES.issuperset(map(type, value)):
                self.unsafe = True
            # A comprehension, then the dict's own type: about half the time of kind() over a generator of pairs.
            entries = {key: item if type(item) in leaves else copy(item) for key, item in value.items()}
            return entries if kind is dict else kind(entries)
        if kind is list or kind is tuple:
            items = [item if type(item) in leaves else copy(item) for item in value]
            return items if kind is list else tuple(items)
        if kind not in leaves:
            # A tensor subclass is pickled as its class; anything else is not a value weights_only loads.
            self.unsafe = True
        return value

    def _copy_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        # Under no_grad (snapshot): a copy of a tensor that requires grad is a plain one, without a detach() each.
        index = len(self.buffers)
        kept = self.pool[index] if index < len(self.pool) else None
        dense = tensor.layout is torch.strided and not tensor.is_quantized
        reusable = (dense and kept is not None and kept.shape == tensor.shape and kept.dtype == tensor.dtype
                    and tensor.is_contiguous())
        buffer: torch.Tensor
        if not dense or not (tensor.is_cpu or tensor.is_cuda):
            buffer = tensor.to('cpu', copy=True)
        elif tensor.is_cpu:
            self.plain += 1
            if reusable:
                assert kept is not None
                buffer = kept
                self.targets.append(buffer)
                self.sources.append(tensor)
            else:
                buffer = tensor.clone(memory_format=torch.contiguous_format)
        else:
            buffer = kept if reusable and kept is not None and kept.is_pinned() else \
                torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            buffer.copy_(tensor, non_blocking=True)
            self.devices.add(tensor.device)
        self.buffers.append(buffer)
        return buffer

    def _reuse_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        index = len(self.sources)
        self.sources.append(tensor)
        # Past the pool's end the guess has already failed (reused_every_buffer): any tensor stands in.
        return self.pool[index] if index < len(self.pool) else tensor

    def reused_every_buffer(self) -> bool:
        """Whether the guesses of a walk with a signature hold: as many tensors as buffers, each a CPU tensor of its
        buffer's dtype, shape and layout (the pool holds plain CPU buffers only, see :meth:`signature`)."""
        return [(t.dtype, t.shape, t.layout, t.is_cpu) for t in self.sources] == self.expected

    def signature(self) -> Optional[list[tuple[Any, ...]]]:
        """What the next snapshot's tensors must match to reuse this one's buffers without a check each: every
        buffer's (dtype, shape, layout, is_cpu), when every tensor of this snapshot was a dense CPU tensor (never
        for device, sparse or quantized tensors, whose copies are made one by one); else None."""
        if self.expected is not None:
            return self.expected        # confirmed by reused_every_buffer
        if not self.buffers or self.plain != len(self.buffers):
            return None
        return [(b.dtype, b.shape, b.layout, b.is_cpu) for b in self.buffers]

    def finish(self) -> None:
        """The batched copies, and the device's copies complete."""
        if self.targets:
            torch._foreach_copy_(self.targets, self.sources)
        for device in self.devices:
            torch.cuda.synchronize(device)      # the non-blocking device -> pinned host copies are complete
