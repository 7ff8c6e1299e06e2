"""Run AIToolbox 1.8.0 code on aitoolbox_like.

Two ways, both served by the alias table in :mod:`aitoolbox_like.compat.aliases`:

* unchanged code: ``python -m aitoolbox_like.compat your_script.py [args]``, or :func:`install` in a notebook,
  makes ``import aitoolbox...`` resolve to aitoolbox_like for that process (and the processes it spawns);
* code where ``aitoolbox`` was replaced by ``aitoolbox_like``: ``aitoolbox_like.torchtrain...`` and
  ``aitoolbox_like.experiment...`` resolve without any set-up.

An AIToolbox path imports as the module of ours that implements it (the same object, so ``isinstance`` and
pickling see one class), or as a small module made of the names AIToolbox offered there.

The import hook lives in :mod:`.importer` (imported here, which registers it).
"""
from .aliases import EXTENDED_OWN_MODULES, MODULES, Target, Unsupported  # noqa: F401  (importable from here before)
from .importer import AITOOLBOX, OWN, AIToolboxShadowingError, alias_module, extra_attribute, extra_names  # noqa: F401
from .importer import install, is_installed, uninstall

__all__ = ['install', 'uninstall', 'is_installed', 'AIToolboxShadowingError', 'extra_attribute', 'extra_names',
           'alias_module']
