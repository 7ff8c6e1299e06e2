"""AIToolbox 1.8.0's ``aitoolbox.utils`` helpers (``util``, ``dict_util``, ``file_system``), for code that imports them.

aitoolbox_like itself does not use them. They behave as AIToolbox's, with two repairs that change no result
that worked there: :func:`flatten_dict` works on Python >= 3.10 (AIToolbox's used ``collections.MutableMapping``,
gone in 3.10, and raised for any nested dict), and :func:`unzip_file` extracts ``.tar.gz`` archives with tarfile's
``'data'`` filter where Python has it (members that would land outside the target folder are refused) and logs a
warning for an archive type it does not know, which AIToolbox ignored silently.

Reached as ``aitoolbox.utils.util`` / ``.dict_util`` / ``.file_system`` (under ``aitoolbox_like.compat``) or
``aitoolbox_like.utils.*``.
"""
import copy
import dis
import functools
import logging
import os
import shutil
import tarfile
import types
import zipfile
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

logger = logging.getLogger(__name__)

__all__ = ['function_exists', 'copy_function', 'is_empty_function', 'flatten_list_of_lists',
           'combine_prediction_metadata_batches', 'flatten_dict', 'combine_dict_elements', 'flatten_combine_dict',
           'create_folder_hierarchy', 'zip_folder', 'unzip_file']


# ---------------------------------------------------------------------------------------------- aitoolbox.utils.util

def function_exists(object_to_check: Any, fn_name: str) -> bool:
    """True when ``object_to_check`` has an attribute ``fn_name`` that can be called."""
    return callable(getattr(object_to_check, fn_name, None))


def copy_function(fn: Callable) -> types.FunctionType:
    """A new function object with the code, globals, defaults and closure of ``fn``.

    A bound method is copied as its plain function, so the copy takes the instance as its first argument and can
    be attached to another object.
    """
    func = getattr(fn, '__func__', fn)
    duplicate = types.FunctionType(func.__code__, func.__globals__, func.__name__, func.__defaults__,
                                   func.__closure__)
    functools.update_wrapper(duplicate, fn)
    # FunctionType() has no parameter for the keyword-only defaults.
    duplicate.__kwdefaults__ = copy.copy(func.__kwdefaults__)
    return duplicate


_SETUP_OPCODES = frozenset({'RESUME', 'NOP', 'CACHE'})


def is_empty_function(fn: Callable) -> bool:
    """True when ``fn`` (a function, lambda or method) does nothing but return None: a body of ``pass``, a
    docstring, or both."""
    code = getattr(getattr(fn, '__func__', fn), '__code__', None)
    if code is None:
        return False
    steps = [(ins.opname, ins.argval) for ins in dis.get_instructions(code) if ins.opname not in _SETUP_OPCODES]
    # 3.12 and 3.13 return a constant in one instruction; other versions load it, then return it.
    return steps in ([('RETURN_CONST', None)], [('LOAD_CONST', None), ('RETURN_VALUE', None)])


def flatten_list_of_lists(nested_list: Optional[Iterable[Iterable[Any]]]) -> Optional[List[Any]]:
    """One level of nesting removed: ``[[1, 2], [3]]`` -> ``[1, 2, 3]``; None stays None."""
    if nested_list is None:
        return None
    return [item for sub_list in nested_list for item in sub_list]


# ------------------------------------------------------------------------------------------ aitoolbox.utils.dict_util

def combine_prediction_metadata_batches(metadata_list: Iterable[Mapping[str, Any]]) -> Dict[str, Any]:
    """Merge the per-batch metadata dicts of a prediction into one dict.

    Each key's batch values are joined by the type of its first value: lists are concatenated, torch tensors
    ``torch.cat`` along dim 0, numpy arrays concatenated along axis 0. A key missing from some batches is joined
    over the batches that have it.

    Raises:
        TypeError: a key's values are of another type (a string, a number, a dict, ...).
    """
    per_key: Dict[str, List[Any]] = {}
    for metadata_batch in metadata_list:
        for key in metadata_batch:
            per_key.setdefault(key, []).append(metadata_batch[key])

    combined: Dict[str, Any] = {}
    for key, batches in per_key.items():
        first = batches[0]
        if isinstance(first, list):
            combined[key] = flatten_list_of_lists(batches)
        elif isinstance(first, torch.Tensor):
            combined[key] = torch.cat(batches, dim=0)
        elif isinstance(first, np.ndarray):
            combined[key] = np.concatenate(batches, axis=0)
        else:
            raise TypeError(f'metadata {key!r} holds {type(first).__name__} values, which cannot be combined over '
                            f'batches: return a list, a torch.Tensor or a np.ndarray per batch')
    return combined


def flatten_dict(nested_dict: Mapping[str, Any], parent_key: str = '', sep: str = '_') -> Dict[str, Any]:
    """Nested dicts flattened into one level, the keys joined with ``sep``:
    ``{'a': {'b': 1}, 'c': 2}`` -> ``{'a_b': 1, 'c': 2}``.

    Args:
        nested_dict: the dict to flatten.
        parent_key: put in front of every key (with ``sep``) when not empty.
        sep: the separator between the keys of the levels.
    """
    flat: Dict[str, Any] = {}
    for key, value in nested_dict.items():
        full_key = f'{parent_key}{sep}{key}' if parent_key else key
        if isinstance(value, MutableMapping):
            flat.update(flatten_dict(value, full_key, sep=sep))
        else:
            flat[full_key] = value
    return flat


def combine_dict_elements(list_of_dicts: Iterable[Mapping[str, Any]]) -> Dict[str, List[Any]]:
    """The values of each key over the dicts, in order, as one list per key (a key missing from a dict is
    skipped there): ``[{'a': 1}, {'a': 2, 'b': 3}]`` -> ``{'a': [1, 2], 'b': [3]}``."""
    combined: Dict[str, List[Any]] = {}
    for single in list_of_dicts:
        for key, value in single.items():
            combined.setdefault(key, []).append(value)
    return combined


def flatten_combine_dict(train_history: Mapping[str, Sequence[Any]]) -> Dict[str, Any]:
    """A training history dict with its dict-valued metrics split into one list per (flattened) key.

    ``{'loss': [1., 2.], 'f1': [{'a': .5}, {'a': .7}]}`` -> ``{'loss': [1., 2.], 'f1_a': [.5, .7]}``. The values are
    deep copies. As in AIToolbox, a metric with no values yet (an empty list) does not appear in the result.
    """
    history = copy.deepcopy(dict(train_history))
    result: Dict[str, Any] = {}
    for name, values in history.items():
        # type() rather than isinstance: a dict subclass value is kept whole, as AIToolbox kept it.
        if all(type(value) is dict for value in values):
            for sub_name, sub_values in combine_dict_elements(flatten_dict(value) for value in values).items():
                result[f'{name}_{sub_name}'] = sub_values
        else:
            result[name] = values
    return result


# ---------------------------------------------------------------------------------------- aitoolbox.utils.file_system

def create_folder_hierarchy(base_folder_path: str, folder_names: Sequence[str]) -> Tuple[str, List[str]]:
    """Create ``base_folder_path/<name 1>/<name 2>/...`` (folders that exist are kept).

    Returns:
        The deepest folder's path, and the paths of every level from ``base_folder_path`` down to it.

    Raises:
        ValueError: ``base_folder_path`` does not exist.
    """
    if not os.path.exists(base_folder_path):
        raise ValueError(f'the base folder {base_folder_path!r} does not exist; create it first')
    paths = [base_folder_path]
    for name in folder_names:
        paths.append(os.path.join(paths[-1], name))
        os.makedirs(paths[-1], exist_ok=True)
    return paths[-1], paths


def zip_folder(source_dir_path: str, zip_path: str) -> str:
    """Zip the contents of ``source_dir_path`` into ``zip_path`` (``.zip`` is added when missing); returns the path
    of the archive."""
    base = zip_path[:-len('.zip')] if zip_path.endswith('.zip') else zip_path
    shutil.make_archive(base, 'zip', source_dir_path)
    # The path as the caller gave it (make_archive may return it made absolute).
    return base + '.zip'


def unzip_file(file_path: str, target_dir_path: str) -> None:
    """Extract a ``.zip`` or ``.tar.gz`` archive into ``target_dir_path``; other files are left alone (with a
    warning)."""
    if file_path.endswith('.zip'):
        with zipfile.ZipFile(file_path) as archive:
            archive.extractall(target_dir_path)
    elif file_path.endswith('.tar.gz'):
        with tarfile.open(file_path) as archive:
            if hasattr(tarfile, 'data_filter'):
                archive.extractall(target_dir_path, filter='data')
            else:
                archive.extractall(target_dir_path)
    else:
        logger.warning('unzip_file: %s is neither a .zip nor a .tar.gz archive; nothing extracted', file_path)
