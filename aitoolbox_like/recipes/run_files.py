"""What a recipe run saves with its experiment, for ``aitoolbox-like train`` / ``resume`` and for each trial of
``aitoolbox-like tune``: the resolved recipe (recipe.yaml), the command line (command_line.txt), and the hint a
stopped run prints. (Below both command lines: the search's package imports it, the recipes' command line imports
that package.)"""
import datetime
import logging
import os
import shlex
import sys
from typing import Optional, Sequence

from .recipe import Recipe, Run
from .schema import COMMAND_LINE_FILE, RECIPE_FILE

logger = logging.getLogger(__name__)

#: The console script, in the commands written for the user.
PROG = 'aitoolbox-like'


def program_name() -> str:
    """How the user started us: the console script, or ``python -m aitoolbox_like``."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ''
    return PROG if name.startswith(PROG) else 'python -m aitoolbox_like'


def command_line_text(argv: Sequence[str], program: Optional[str] = None) -> str:
    """The block ``command_line.txt`` gets for this command: when and where it ran, then the command itself
    (``program``: the command's name; None: how the user started us)."""
    when = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')
    lines = [f'# {when}, in {os.getcwd()}']
    if 'WORLD_SIZE' in os.environ and 'RANK' in os.environ:
        lines.append(f'# started by torchrun (or another launcher) as {os.environ["WORLD_SIZE"]} processes')
    lines.append(' '.join([program or program_name(), shlex.join(argv)]).rstrip())
    return '\n'.join(lines) + '\n'


def attach_run_files(run: Run, recipe: Recipe, command_text: str, program: Optional[str] = None) -> None:
    """Save with the run's experiment what ``train`` saves: the resolved recipe and ``command_text`` (its
    command_line.txt), and set the hint a stopped run prints (``program``: the command's name in it; None: how the
    user started us)."""
    loop = run.loop
    # A run stopped by SIGTERM / Ctrl-C says how to continue it: from here, with this command.
    loop.resume_hint = f'{program or program_name()} resume {{experiment_dir}}'
    files = getattr(loop, 'experiment_files', None)
    if not isinstance(files, dict):
        logger.warning('%s has no experiment_files: the resolved recipe and the command line are not saved with '
                       'the experiment', type(loop).__qualname__)
        return
    # The same header every time: a resume that changes nothing in the recipe leaves the file as it is.
    files[RECIPE_FILE] = (f'# The resolved recipe of this experiment ({COMMAND_LINE_FILE} says how it was run); '
                          f'`{PROG} resume <this folder>` continues it.\n' + recipe.to_yaml())
    files[COMMAND_LINE_FILE] = command_text
