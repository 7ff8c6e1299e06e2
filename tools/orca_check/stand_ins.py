"""What Orca's callback modules import from the rest of BigDL, as small local equivalents.

Orca's callbacks use ``bigdl.dllib``'s ``invalidInputError`` (log and raise RuntimeError when a condition fails) and
``bigdl.orca.data.file``'s helpers, which work on local paths and remote ones (HDFS, S3); here they work on local
paths, which is what the check gives them. Any other name is a placeholder that fails, naming it, when used
(module ``__getattr__``).
"""
import logging
import os
import shutil
from typing import Any, List, Optional

from ..callback_check import Unavailable, placeholder  # noqa: F401  (Unavailable: what a use of a placeholder raises)

logger = logging.getLogger(__name__)


def __getattr__(name: str) -> Any:
    if name.startswith('__'):
        raise AttributeError(name)
    return placeholder(name.replace('__', '.'), 'a BigDL name without a stand-in in tools/orca_check/stand_ins.py')


def invalidInputError(condition: Any, errMsg: str, fixMsg: Optional[str] = None) -> None:
    """bigdl.dllib.utils.log4Error.invalidInputError: when ``condition`` is false, log and raise RuntimeError."""
    if not condition:
        logger.error('****Usage Error****: %s', errMsg)
        if fixMsg:
            logger.error('****How to fix****: %s', fixMsg)
        raise RuntimeError(errMsg)


def exists(path: str) -> bool:
    """bigdl.orca.data.file.exists for a local path."""
    return os.path.exists(path)


def listdir(path: str) -> List[str]:
    """bigdl.orca.data.file.listdir for a local folder: the paths of its entries."""
    return [os.path.join(path, name) for name in sorted(os.listdir(path))]


def makedirs(path: str) -> None:
    """bigdl.orca.data.file.makedirs for a local path."""
    os.makedirs(path, exist_ok=True)


def put_local_dir_tree_to_remote(local_dir: str, remote_dir: str) -> None:
    """bigdl.orca.data.file.put_local_dir_tree_to_remote, to a local folder: the tree copied into it."""
    shutil.copytree(local_dir, remote_dir, dirs_exist_ok=True)


def put_local_file_to_remote(local_path: str, remote_path: str) -> None:
    """bigdl.orca.data.file.put_local_file_to_remote, to a local path."""
    os.makedirs(os.path.dirname(os.path.abspath(remote_path)), exist_ok=True)
    shutil.copyfile(local_path, remote_path)
