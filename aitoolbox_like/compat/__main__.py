"""``python -m aitoolbox_like.compat [--force] script.py [args ...]``: run an unchanged AIToolbox script on
aitoolbox_like (``import aitoolbox...`` resolves to aitoolbox_like for that process and its children)."""
import argparse
import os
import runpy
import sys
from typing import List, Optional

from . import AIToolboxShadowingError, install


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog='python -m aitoolbox_like.compat',
        description='Run a script written for AIToolbox 1.8.0 on aitoolbox_like, unchanged.')
    parser.add_argument('--force', action='store_true',
                        help='alias aitoolbox even when a real AIToolbox is installed (it is then hidden)')
    parser.add_argument('script', help='the Python script to run')
    parser.add_argument('args', nargs=argparse.REMAINDER, help="the script's own arguments")
    options = parser.parse_args(argv)
    if not os.path.isfile(options.script):
        parser.error(f'no such script: {options.script}')
    try:
        install(force=options.force)
    except AIToolboxShadowingError as error:
        parser.exit(2, f'{parser.prog}: error: {error}\n')
    # As `python script.py` would: the script's folder first on sys.path, its own argv.
    sys.argv = [options.script] + options.args
    sys.path[0] = os.path.dirname(os.path.abspath(options.script))
    runpy.run_path(options.script, run_name='__main__')
    return 0


if __name__ == '__main__':
    sys.exit(main())
