"""The published pytorch-accelerated wheel: download it (``pip download --no-deps``: nothing installed), verify its
hash, and check that the installed package (setup.py's extra ``pta``) is that wheel's code, file for file, so the
check runs PTA's published classes and nothing else."""
import base64
import csv
import hashlib
import io
import zipfile
from importlib import metadata
from pathlib import Path
from typing import List

from ..published_wheel import PublishedWheel

PTA_VERSION = '0.1.61'
WHEEL_NAME = f'pytorch_accelerated-{PTA_VERSION}-py3-none-any.whl'
WHEEL_SHA256 = '6335954b04b4e0b124f1bfe18ae88e3eb4b59f075178e531da9e0e5c5e0f7534'


_WHEEL = PublishedWheel('pta-check', 'pytorch-accelerated', PTA_VERSION, WHEEL_NAME, WHEEL_SHA256)
default_cache = _WHEEL.default_cache
fetch_wheel = _WHEEL.fetch


def differences_from_installed(wheel: Path) -> List[str]:
    """The package files of ``wheel`` that the installed pytorch-accelerated lacks or holds with other bytes (the
    installed RECORD is not trusted: each file is hashed)."""
    try:
        installed = metadata.distribution('pytorch-accelerated')
    except metadata.PackageNotFoundError:
        return [f"pytorch-accelerated is not installed: pip install 'aitoolbox_like[pta]' (version {PTA_VERSION})"]
    if installed.version != PTA_VERSION:
        return [f'installed pytorch-accelerated is {installed.version}, the check pins {PTA_VERSION}']
    root = Path(str(installed.locate_file('')))
    differences = []
    with zipfile.ZipFile(wheel) as archive:
        record = next(name for name in archive.namelist() if name.endswith('.dist-info/RECORD'))
        for row in csv.reader(io.StringIO(archive.read(record).decode())):
            name = row[0]
            if not name.startswith('pytorch_accelerated/'):
                continue
            path = root / name
            digest = base64.urlsafe_b64encode(hashlib.sha256(archive.read(name)).digest()).rstrip(b'=').decode()
            if not path.exists():
                differences.append(f'{name}: not installed')
            elif base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b'=').decode() != digest:
                differences.append(f'{name}: the installed file differs from the published one')
    return differences
