"""``python -m aitoolbox_like ...``: the ``aitoolbox-like`` command line (aitoolbox_like/recipes/cli.py)."""
import sys

from aitoolbox_like.recipes.cli import main

if __name__ == '__main__':      # a process spawned for DDP imports this module again: it must not run the command
    sys.exit(main())
