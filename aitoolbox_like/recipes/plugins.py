"""The one place where recipes name packages that build on them (docs/architecture.md): by import path, imported
when first used, so that recipes/ imports neither adapters/ (whose trial report raises a RecipeError) nor
tuning/ (whose trials are recipes).

- :data:`CALLBACK_PACKAGES`: the packages whose public modules' callback classes the callback registry offers
  with no registration, besides ``aitoolbox_like.callbacks``;
- :data:`SUBCOMMANDS`: the functions that add a subcommand of their own package to the ``aitoolbox-like`` parser.
"""
from typing import Tuple

#: Packages of callback modules above recipes (their callbacks are registered the first time the registry is asked).
CALLBACK_PACKAGES: Tuple[str, ...] = ('aitoolbox_like.adapters',)

#: ``package.module:function``, each called with the parser's subparsers to add its subcommand (``tune``).
SUBCOMMANDS: Tuple[str, ...] = ('aitoolbox_like.tuning.cli:add_tune_parser',)
