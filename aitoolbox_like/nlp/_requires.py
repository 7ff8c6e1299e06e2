"""The optional packages the nlp metrics compute with, imported when a metric first needs one.

A missing one raises an ImportError that names the ``pip install`` to run: ``import aitoolbox_like.nlp`` itself needs
nothing beyond the library's own requirements.
"""
import importlib
from types import ModuleType
from typing import Optional

NLP_EXTRA = 'pip install "aitoolbox_like[nlp]"'


def require(module: str, package: str, what: str, install: Optional[str] = None) -> ModuleType:
    """Import ``module`` (from the PyPI package ``package``) for ``what``, or say how to install it (``install``, by
    default the ``nlp`` extra, which has every package the metrics use except the Perl ROUGE's pyrouge)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        how = install or f'{NLP_EXTRA} (or pip install {package})'
        raise ImportError(f'{what} needs the {package} package, which is not installed: {how}') from exc
