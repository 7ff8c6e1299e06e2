"""What a recipe is made of: its sections, the files a run writes, key paths (``callbacks[2].patience``), and
:class:`RecipeError`, every problem found, one line per key path."""
from typing import Any, Dict, List, Literal, Optional, Sequence, Union

#: The top-level keys of a recipe.
SECTIONS = ('imports', 'seed', 'vars', 'data', 'model', 'optimizer', 'criterion', 'loop', 'callbacks', 'schedulers',
            'fit')
#: Keys of a ``schedulers`` item that go to LRSchedulerCallback (next to the torch scheduler's own arguments).
SCHEDULER_WRAPPER_KEYS: Dict[str, Any] = {'interval': Literal['epoch', 'step'], 'monitor': Optional[str],
                                          'optimizer_idx': Optional[int]}
#: The ``fit`` arguments the recipe sets itself.
FIT_FILLED = ('callbacks', 'resume_from')
#: ``fit`` arguments of gpu_mode='dp' (TrainLoop's DataParallel fit).
DP_FIT_ARGS: Dict[str, Any] = {'dp_model_args': Optional[Dict[str, Any]]}
#: Files a recipe run writes into its experiment folder (through ``TrainLoop.experiment_files``).
RECIPE_FILE = 'recipe.yaml'
COMMAND_LINE_FILE = 'command_line.txt'


class RecipeError(ValueError):
    """Everything wrong with a recipe, found before anything trains: one ``'key.path: problem'`` line per error
    in ``errors``."""

    def __init__(self, errors: Sequence[str], source: Optional[str] = None) -> None:
        self.errors = list(errors)
        self.source = source
        where = f' {source}' if source else ''
        count = f'{len(self.errors)} error{"s" if len(self.errors) != 1 else ""}'
        super().__init__(f'recipe{where}: {count}\n' + '\n'.join(f'  {e}' for e in self.errors))


# ---------------------------------------------------------------------------------------------- key paths


def key_path(*parts: Union[str, int]) -> str:
    """``callbacks``, 2, ``patience`` -> ``callbacks[2].patience``."""
    text = ''
    for part in parts:
        if isinstance(part, int):
            text += f'[{part}]'
        else:
            text += f'.{part}' if text else part
    return text


def key_parts(key: str) -> List[Union[str, int]]:
    """An override key's parts: ``callbacks.2.patience`` and ``callbacks[2].patience`` both give
    ``['callbacks', 2, 'patience']``."""
    parts: List[Union[str, int]] = []
    for piece in key.replace('[', '.').replace(']', '').split('.'):
        if piece:
            parts.append(int(piece) if piece.isdigit() else piece)
    return parts


def normalize_key(key: str) -> str:
    """An override key as an error path: ``callbacks.2.patience`` and ``callbacks[2].patience`` both become
    ``callbacks[2].patience``."""
    return key_path(*key_parts(key))


def describe_value(value: Any) -> str:
    """A value as an error message names it: a mapping, a list, a plain value's repr, else its type."""
    if isinstance(value, dict):
        return 'a mapping'
    if isinstance(value, (list, tuple)):
        return 'a list'
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    return type(value).__qualname__
