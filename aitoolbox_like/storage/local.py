"""Storage in a local folder (or any mounted filesystem)."""
from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator

from ..runtime._typing import StrPath
from .base import Storage, validate_key

logger = logging.getLogger(__name__)

_PARTIAL_SUFFIX = '.partial'
_PARTIAL_RE = re.compile(r'^\..+\.[0-9a-f]{12}\.partial$')
# Any temp file of write_atomically: '.<name>.<12 hex>.partial' (default) or '.tmp' (checkpoints).
_TEMP_RE = re.compile(r'^\..+\.[0-9a-f]{12}\.(partial|tmp)$')

# Temp files a write_atomically call of this process is writing right now; remove_stray_temp_files skips them.
_live_temp_files: set[str] = set()
_live_lock = threading.Lock()


def _temp_path_for(path: Path, temp_suffix: str = _PARTIAL_SUFFIX, temp_dir: StrPath | None = None) -> Path:
    folder = path.parent if temp_dir is None else Path(os.path.abspath(os.fspath(temp_dir)))
    return folder / temp_name_for(path.name, temp_suffix)


def write_atomically(path: StrPath, write: Callable[[IO[bytes]], object], temp_suffix: str = _PARTIAL_SUFFIX,
                     make_parents: bool = True, temp_dir: StrPath | None = None) -> None:
    """Run ``write(file_object)`` into a temp file, fsync it, then rename it over ``path``.

    Readers (and a crash) see the old file or the complete new one, never a half-written one; a failed
    write leaves no temp file behind. The temp file is ``.<name>.<12 hex digits><temp_suffix>``, next to
    ``path`` or in ``temp_dir``, which must be on the same filesystem (the rename is then atomic); the
    experiment folder uses its root so that a crash leaves no stray file among the saved models.
    ``make_parents=False``: a missing parent folder is an error (FileNotFoundError).
    """
    path = Path(os.path.abspath(os.fspath(path)))
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_path_for(path, temp_suffix, temp_dir)
    with _live_lock:
        _live_temp_files.add(str(tmp))
    try:
        with open(tmp, 'xb') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise
    finally:
        with _live_lock:
            _live_temp_files.discard(str(tmp))


def is_temp_file_name(name: str) -> bool:
    """True for the name of a :func:`write_atomically` temp file (``.<name>.<12 hex>.partial`` or ``.tmp``)."""
    return _TEMP_RE.match(name) is not None


def temp_name_for(name: str, temp_suffix: str = '.tmp') -> str:
    """The name a temporary file or folder standing for ``name`` gets: ``.<name>.<12 hex digits><temp_suffix>``
    (hidden, unique, and recognised by :func:`remove_stray_temp_files` and :func:`is_temp_file_name`)."""
    return f'.{name}.{secrets.token_hex(6)}{temp_suffix}'


def mark_temp_live(path: StrPath, live: bool = True) -> None:
    """Declare that this process is writing the temporary file or folder ``path`` (``live=False``: no longer), so
    that :func:`remove_stray_temp_files` leaves it alone meanwhile. For writers other than write_atomically."""
    path = os.path.abspath(os.fspath(path))
    with _live_lock:
        if live:
            _live_temp_files.add(path)
        else:
            _live_temp_files.discard(path)


@contextmanager
def exclusive_lock(path: StrPath) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the existing file or folder ``path`` between processes (and threads: each
    holder opens it itself); no lock where fcntl does not exist (Windows)."""
    try:
        import fcntl
    except ImportError:     # pragma: no cover - Windows
        yield
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)        # releases the lock


def remove_folder(path: StrPath) -> None:
    """Delete the folder ``path`` and what it holds, all at once for a reader: it is first renamed to a temporary
    name in the same parent (atomic), then deleted; a crash in between leaves only a temporary folder, which
    :func:`remove_stray_temp_files` deletes. FileNotFoundError if it does not exist."""
    path = os.path.abspath(os.fspath(path))
    doomed = os.path.join(os.path.dirname(path), temp_name_for(os.path.basename(path)))
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def remove_stray_temp_files(folder: StrPath) -> list[str]:
    """Delete the temp files a killed :func:`write_atomically` left in ``folder`` (and its subfolders), and the
    temporary folders of a killed folder write or :func:`remove_folder` (same naming).

    Temp files that a write of this process is still writing are never touched. Returns the removed paths.
    Only for folders no other process writes into at the same time (an experiment folder belongs to one run).
    """
    removed: list[str] = []
    root = os.path.abspath(os.fspath(folder))
    for dirpath, dirnames, filenames in os.walk(root):
        for name in list(dirnames):
            if not _TEMP_RE.match(name):
                continue
            dirnames.remove(name)       # not walked into: it goes as a whole
            path = os.path.join(dirpath, name)
            with _live_lock:
                if path in _live_temp_files:
                    continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            logger.info('Removed %s, the temporary folder of a write that never finished', path)
        for name in filenames:
            if not _TEMP_RE.match(name):
                continue
            path = os.path.join(dirpath, name)
            with _live_lock:
                if path in _live_temp_files:
                    continue
                try:
                    os.remove(path)
                except FileNotFoundError:
                    continue
            removed.append(path)
            logger.info('Removed %s, the temporary file of a write that never finished', path)
    return removed


def write_text_atomically(path: StrPath, text: str, temp_dir: StrPath | None = None) -> None:
    """Store ``text`` (UTF-8) in the file ``path`` with :func:`write_atomically`."""
    data = text.encode('utf-8')
    write_atomically(path, lambda f: f.write(data), temp_dir=temp_dir)


class LocalStorage(Storage):
    """Keys map to files under ``root_dir``; the folder is created on first write."""

    def __init__(self, root_dir: StrPath) -> None:
        self.root_dir = Path(os.path.abspath(os.path.expanduser(os.fspath(root_dir))))

    def __repr__(self) -> str:
        return f'LocalStorage({str(self.root_dir)!r})'

    def path(self, key: str) -> Path:
        """The filesystem path that holds ``key``."""
        validate_key(key)
        path = Path(os.path.normpath(self.root_dir / key))
        # validate_key already forbids '..' and absolute keys; this is the backstop that keeps the
        # promise "nothing is written outside root_dir" even if validation is ever loosened.
        # Lexical on purpose: a symlink the user placed inside root_dir is allowed to point elsewhere.
        if path != self.root_dir and self.root_dir not in path.parents:
            raise ValueError(f'key {key!r} resolves outside the storage root {self.root_dir}')
        return path

    def save_file(self, local_path: StrPath, key: str) -> None:
        """Copy ``local_path`` to the file for ``key`` atomically (temp file, fsync, rename)."""
        target = self.path(key)
        with open(local_path, 'rb') as src:
            write_atomically(target, lambda dst: shutil.copyfileobj(src, dst, 1024 * 1024))
        logger.debug('Saved %s to %s', local_path, target)

    def load_file(self, key: str, local_path: StrPath) -> StrPath:
        """Copy the file for ``key`` to ``local_path`` atomically and return ``local_path``."""
        source = self.path(key)
        try:
            src = open(source, 'rb')
        except FileNotFoundError:
            raise FileNotFoundError(f'No such key in storage: {self.uri(key)}') from None
        with src:
            write_atomically(local_path, lambda dst: shutil.copyfileobj(src, dst, 1024 * 1024))
        return local_path

    def exists(self, key: str) -> bool:
        """True if a file is stored under exactly ``key``."""
        return self.path(key).is_file()

    def list(self, prefix: str = '') -> list[str]:
        """Sorted keys starting with ``prefix``; leftover ``.partial`` temp files are skipped."""
        # Walk only the folder the prefix names, not the whole tree.
        directory, _, _ = prefix.rpartition('/')
        start = self.path(directory) if directory else self.root_dir
        if not start.is_dir():
            return []
        keys = []
        for dirpath, _, filenames in os.walk(start):
            rel_dir = os.path.relpath(dirpath, self.root_dir)
            for filename in filenames:
                if _PARTIAL_RE.match(filename):
                    continue
                rel = filename if rel_dir == '.' else os.path.join(rel_dir, filename)
                key = rel.replace(os.sep, '/')
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        """Remove the file for ``key``; a missing file is not an error."""
        try:
            self.path(key).unlink()
        except FileNotFoundError:
            pass

    def write_text(self, key: str, text: str) -> None:
        """Store ``text`` (UTF-8) under ``key`` atomically."""
        write_text_atomically(self.path(key), text)

    def read_text(self, key: str) -> str:
        """Return the UTF-8 text stored under ``key``; FileNotFoundError if missing."""
        try:
            return self.path(key).read_text(encoding='utf-8')
        except FileNotFoundError:
            raise FileNotFoundError(f'No such key in storage: {self.uri(key)}') from None

    def uri(self, key: str) -> str:
        """The ``file://`` URI of the file for ``key``."""
        return self.path(key).as_uri()

    def create_exclusive(self, key: str, text: str) -> bool:
        """Create the file for ``key`` holding ``text`` unless it exists (``O_EXCL``); True if created."""
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            return False
        with os.fdopen(fd, 'w', encoding='utf-8') as f:
            f.write(text)
        return True

    def location(self) -> dict[str, str | None]:
        """``{'root': <folder>}``."""
        return {'root': str(self.root_dir)}
