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
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from typing import IO, Any, TypeVar

import torch

from ._typing import StrPath
from .storage.local import write_atomically

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


def _fsync_directory(directory: StrPath) -> None:
    # Makes the rename itself durable; some platforms (Windows) cannot open a directory.
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
    _fsync_directory(os.path.dirname(path))


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
