"""Stand-in ``aitoolbox`` package, on sys.path only while aitoolbox_like.compat is installed.

A process spawned by a script run under ``python -m aitoolbox_like.compat`` (DDP workers, DataLoader workers)
imports the script again before any of our code runs; its ``import aitoolbox`` lands here, which turns the
alias on in that process too and hands back the aliased package.
"""
import sys

from aitoolbox_like import compat as _compat

_compat.install(force=True)      # the parent process already checked for a real AIToolbox
sys.modules[__name__] = _compat.alias_module(__name__)
