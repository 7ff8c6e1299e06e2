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
_KEY_TYPES = (str, int)
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
                if any(type(key) not in _KEY_TYPES and type(key) is not bool for key in value):
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
                    if type(key) not in _KEY_TYPES and type(key) is not bool:
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


_PathKey = tuple[Any, ...]


class AsyncCheckpointWriter:
    """Writes checkpoints in a background thread, one at a time, so training waits only for a host copy.

    The saving callbacks use one writer each:

    1. :meth:`snapshot` (training thread): a deep copy of the checkpoint dict whose tensors are copied to host
       memory (CPU tensors cloned, device tensors copied with ``.to('cpu', copy=True)`` semantics). The buffers
       of the previous snapshot are reused when a tensor has the same place, shape and dtype, so a steady run
       copies into memory that is already mapped (no page faults) and holds at most one extra copy of the state.
       Nothing is pickled on the training thread.
    2. :meth:`submit` (training thread): waits for the write in flight (at most one: memory stays bounded), raises
       its error if it failed, then starts a thread that runs ``job(snapshot)``: serialise, fsync, rename, update
       the pointers, queue the upload.
    3. :meth:`wait`: blocks until the write in flight is complete and raises :class:`CheckpointError` (with the
       original error as its cause) if it failed. An error is raised once, at the first ``wait`` / ``submit``
       after it happened: never silently dropped.

    The thread is not a daemon: a process that ends normally finishes the write in flight first. A process killed
    during the write (``kill -9``) loses only that write: the file is written to a temporary name and renamed, and
    pointers are updated only afterwards, so the previous checkpoint and pointer stay intact.

    ``before_write`` is a hook for tests: called in the background thread with the target's description (the
    checkpoint path) before the job runs (block it on an Event to hold a write in flight).
    """

    def __init__(self) -> None:
        self.before_write: Optional[Callable[[str], None]] = None
        self._thread: Optional[threading.Thread] = None
        self._description = ''
        self._error: Optional[BaseException] = None
        self._pool: dict[_PathKey, torch.Tensor] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Pickled with its callback (a DDP spawn): a thread cannot travel, and the staging buffers need not.
        self.wait()
        state = dict(self.__dict__)
        state.update(_thread=None, _pool={})
        return state

    @property
    def pending(self) -> bool:
        """True while a write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def snapshot(self, obj: Any) -> Any:
        """A deep copy of ``obj`` (dicts, lists, tuples, scalars, tensors) with every tensor copied to host memory.

        Call it only when no write is in flight (:meth:`submit` and :meth:`wait` ensure it): it reuses the
        previous snapshot's buffers."""
        if self._thread is not None:
            raise RuntimeError('AsyncCheckpointWriter.snapshot() while a write is in flight; call wait() first')
        new_pool: dict[_PathKey, torch.Tensor] = {}
        memo: dict[int, torch.Tensor] = {}
        devices: set[torch.device] = set()
        copied = self._copy(obj, (), memo, new_pool, devices)
        for device in devices:
            torch.cuda.synchronize(device)      # the non-blocking device -> pinned host copies are complete
        self._pool = new_pool
        return copied

    def _copy(self, value: Any, path: _PathKey, memo: dict[int, torch.Tensor], new_pool: dict[_PathKey, torch.Tensor],
              devices: set[torch.device]) -> Any:
        kind = type(value)
        if isinstance(value, torch.Tensor):
            if id(value) in memo:               # the same tensor twice (tied weights) stays one tensor
                return memo[id(value)]
            copied = self._copy_tensor(value, path, devices)
            memo[id(value)] = copied
            new_pool[path] = copied
            return copied
        # Immutable leaves (numbers, strings, None, torch.Size, dtype, device) are kept without a call: an optimizer's
        # state is mostly lists of parameter indices and numbers, and the copy runs on the training thread.
        if kind in _DICT_TYPES:
            return kind((key, item if type(item) in _IMMUTABLE_LEAVES else
                         self._copy(item, path + (key,), memo, new_pool, devices)) for key, item in value.items())
        if kind is list or kind is tuple:
            items = [item if type(item) in _IMMUTABLE_LEAVES else self._copy(item, path + (i,), memo, new_pool, devices)
                     for i, item in enumerate(value)]
            return items if kind is list else tuple(items)
        return value        # immutable: numbers, strings, None, torch.Size, dtype, device

    def _copy_tensor(self, value: torch.Tensor, path: _PathKey, devices: set[torch.device]) -> torch.Tensor:
        tensor = value.detach()
        if tensor.layout != torch.strided or tensor.is_quantized:
            return tensor.to('cpu', copy=True)
        buffer = self._pool.get(path)
        reusable = (buffer is not None and buffer.shape == tensor.shape and buffer.dtype == tensor.dtype
                    and buffer.is_contiguous() and tensor.is_contiguous())
        if tensor.device.type == 'cpu':
            if not reusable:
                return tensor.clone(memory_format=torch.contiguous_format)
            assert buffer is not None
            buffer.copy_(tensor)
            return buffer
        if tensor.is_cuda:
            if not reusable or not buffer.is_pinned():   # type: ignore[union-attr]
                buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            assert buffer is not None
            buffer.copy_(tensor, non_blocking=True)
            devices.add(tensor.device)
            return buffer
        return tensor.to('cpu', copy=True)

    def submit(self, description: str, job: Callable[[Any], None], snapshot: Any) -> None:
        """Run ``job(snapshot)`` in a background thread once the previous write is complete (its error, if any,
        is raised here first). ``description`` names the write in errors (the checkpoint's path)."""
        self.wait()
        self._description = description
        self._thread = threading.Thread(target=self._run, args=(job, snapshot, description),
                                        name=f'checkpoint-writer {os.path.basename(description)}', daemon=False)
        self._thread.start()

    def _run(self, job: Callable[[Any], None], snapshot: Any, description: str) -> None:
        try:
            if self.before_write is not None:
                self.before_write(description)
            job(snapshot)
            logger.debug('Checkpoint %s written in the background', description)
        except BaseException as error:      # kept for the training thread, which raises it at its next wait()
            self._error = error

    def wait(self) -> None:
        """Block until the write in flight (if any) is complete; raise CheckpointError if a write failed."""
        thread = self._thread
        if thread is not None:
            thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise CheckpointError(f'writing the checkpoint {self._description} in the background failed: '
                                  f'{type(error).__name__}: {error}') from error
