"""The ``aitoolbox-like`` command line (also ``python -m aitoolbox_like``).

    aitoolbox-like train RECIPE.yaml [key.path=value ...]      train; the resolved recipe and this command line
                                                               are saved in the experiment folder
    aitoolbox-like resume EXPERIMENT [key.path=value ...]      continue an interrupted run from its own recipe
                                                               (EXPERIMENT: its local folder, or its s3://,
                                                               gs:// or az:// address)
    aitoolbox-like show RECIPE.yaml [key.path=value ...]       print the resolved recipe (and check it)
    aitoolbox-like callbacks [--import FILE]                   the registered callbacks and their arguments
    aitoolbox-like list KIND [--import FILE]                   the names of one registry (optimizer, ...)
    aitoolbox-like tune RECIPE.yaml --trials N --param PATH=SPEC --monitor NAME --mode min|max --output DIR
                                                               search hyper-parameters (docs/tuning.md)

A recipe that does not check (unknown names or keys, wrong types, missing arguments) is reported in full, one
``key.path: problem`` line each, with exit status 2 and nothing trained.
"""
import argparse
import contextlib
import logging
import os
import shlex
import sys
import tempfile
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple

from .recipe import Recipe, Run
from .reference import reference_entries
from .schema import COMMAND_LINE_FILE, RECIPE_FILE, RecipeError
from .registry import KINDS, UnknownNameError, import_path
from .run_files import PROG, attach_run_files, command_line_text, program_name

if TYPE_CHECKING:
    from ..storage.base import Storage

logger = logging.getLogger(__name__)

#: Exit status of a recipe that does not check (argparse uses it for bad command lines too).
EXIT_RECIPE_ERROR = 2
#: Exit status of a run interrupted before its end (Ctrl-C, SIGTERM, a time budget) after its checkpoint was written:
#: what a shell reports for a command ended by Ctrl-C, so that `train ... && next-step` does not go on.
EXIT_INTERRUPTED = 130
#: Callbacks whose saved state says that they stopped the run (no patience left).
EARLY_STOPPING_STATE_PREFIXES = ('EarlyStopping', 'ThresholdEarlyStopping')


def _is_main_process() -> bool:
    return os.environ.get('RANK', '0') == '0'


def _say(message: str) -> None:
    """CLI output the user asked for: on rank 0 only (under torchrun every process runs this command)."""
    if _is_main_process():
        print(message, flush=True)


# ---------------------------------------------------------------------------------------------- train


def _finish(run: Run) -> int:
    """Say how the run ended; returns the exit status (:data:`EXIT_INTERRUPTED` when it stopped before its end)."""
    loop = run.loop
    experiment = getattr(loop, 'experiment', None)
    history = getattr(loop, 'train_history', None)
    interrupted = getattr(loop, 'interrupted', None)
    if history is not None and loop.is_main_process():
        last = {name: history[name][-1] for name in (loop.train_loss_name, 'val_loss')
                if name in history and history[name]}
        if last:
            values = ', '.join(f'{name} {value:.6g}' for name, value in last.items())
            _say(f'{"last" if interrupted else "final"} {values}')
    if experiment is not None and loop.is_main_process():
        _say(f'experiment folder: {experiment.dir_path}')
    if interrupted and loop.is_main_process():
        _say(f'interrupted ({interrupted}); continue with: {loop.how_to_resume()}')
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        # Under torchrun the process group outlives fit (for evaluation after it); this command is done with it.
        dist.destroy_process_group()
    return EXIT_INTERRUPTED if interrupted else 0


def cmd_train(args: argparse.Namespace, argv: Sequence[str]) -> int:
    recipe = Recipe.load(args.recipe, args.overrides)
    if args.check:
        recipe.validate()
        _say(f'{args.recipe}: the recipe checks')
        return 0
    recipe_path = os.path.abspath(args.recipe)
    # The recipe file is the experiment's "script" (copied into the folder, as AIToolbox copies the training
    # script) unless its name is one of the files a recipe run writes there itself.
    script = recipe_path if os.path.basename(recipe_path) not in (RECIPE_FILE, COMMAND_LINE_FILE) else None
    run = recipe.build(hyperparams_defaults={'experiment_file_path': script})
    attach_run_files(run, recipe, command_line_text(argv))
    run.fit()
    return _finish(run)


# ---------------------------------------------------------------------------------------------- resume


def finished_reason(checkpoint: Any, fit_kwargs: Dict[str, Any], callback_names: Sequence[str] = ()) -> Optional[str]:
    """Why the run whose newest checkpoint is ``checkpoint`` needs no more training, or None.

    Finished means: the checkpoint was taken at the end of an epoch (not mid-epoch, as a preemption, a time limit
    or an iteration checkpoint leaves it) and either the epochs (batches) ``fit`` asks for are done
    (``loop.epochs_completed >= num_epochs``; with ``num_iterations``, ``iteration_idx + 1 >= num_iterations``) or
    an early stopper that the recipe still has (its class name in ``callback_names``) had stopped it (the saved
    state of an ``EarlyStopping`` / ``ThresholdEarlyStopping`` has no patience left).
    """
    from ..engine.loop_state import CHECKPOINT_KIND
    if not isinstance(checkpoint, dict) or checkpoint.get('kind') != CHECKPOINT_KIND:
        return None
    position = checkpoint.get('data_position') or {}
    if position.get('batches_done') is not None:
        return None
    counters = checkpoint.get('loop') or {}
    epochs = int(counters.get('epochs_completed', 0))
    num_iterations = fit_kwargs.get('num_iterations') or 0
    if num_iterations:
        done = int(counters.get('total_iteration_idx', -1)) + 1
        if done >= num_iterations:
            return f'finished: {done} batches trained (fit.num_iterations={num_iterations})'
    else:
        num_epochs = fit_kwargs.get('num_epochs') or 0
        if epochs >= num_epochs:
            return f'finished: {epochs} epochs trained (fit.num_epochs={num_epochs})'
    for key, state in (checkpoint.get('callbacks') or {}).items():
        stopper = str(key).split('_', 1)[0]
        if stopper in EARLY_STOPPING_STATE_PREFIXES and stopper in callback_names and isinstance(state, dict):
            patience = state.get('patience_count')
            if isinstance(patience, int) and patience < 0:
                return f'finished: stopped early by {key} after {epochs} epochs'
    return None


def _cloud_experiment(source: str, endpoint_url: Optional[str]) -> Tuple['Storage', str]:
    """The bucket (as storage without a prefix) and the key of the experiment folder a cloud address names."""
    from ..storage.urls import open_storage, split_url
    scheme, bucket, prefix = split_url(source)
    if not bucket or not prefix:
        raise RecipeError([f'{source}: expected {scheme}://bucket/<prefix>/<project>/<experiment>_<timestamp>'])
    return open_storage(f'{scheme}://{bucket}', endpoint_url=endpoint_url), prefix


def _is_cloud(source: str) -> bool:
    from ..storage.urls import is_cloud_url
    return is_cloud_url(source)


def _read_experiment(source: str, endpoint_url: Optional[str]) -> Tuple[str, str, str]:
    """``(recipe text, previous command lines, where the recipe was read)`` of an experiment folder or its cloud
    address."""
    if _is_cloud(source):
        storage, prefix = _cloud_experiment(source, endpoint_url)
        where = storage.uri(f'{prefix}/{RECIPE_FILE}')
        try:
            text = storage.read_text(f'{prefix}/{RECIPE_FILE}')
        except FileNotFoundError:
            raise RecipeError([f'{where} does not exist: only runs started with `{PROG} train` can be resumed '
                               f'this way (or the experiment is elsewhere)']) from None
        try:
            previous = storage.read_text(f'{prefix}/{COMMAND_LINE_FILE}')
        except FileNotFoundError:
            previous = ''
        return text, previous, where
    folder = os.path.abspath(os.path.expanduser(source))
    where = os.path.join(folder, RECIPE_FILE)
    if not os.path.isdir(folder):
        raise RecipeError([f'{source}: not an experiment folder (give the folder, .../<project>/<experiment>_'
                           f'<timestamp>, or its s3://, gs:// or az:// address)'])
    try:
        with open(where, encoding='utf-8') as f:
            text = f.read()
    except FileNotFoundError:
        raise RecipeError([f'{where} does not exist: only runs started with `{PROG} train` can be resumed this '
                           f'way']) from None
    try:
        with open(os.path.join(folder, COMMAND_LINE_FILE), encoding='utf-8') as f:
            previous = f.read()
    except FileNotFoundError:
        previous = ''
    return text, previous, where


def _sections_with(config: Dict[str, Any], key: str) -> List[Tuple[str, Dict[str, Any]]]:
    """``(path, mapping)`` of the loop and callbacks that set ``key``."""
    found = []
    if isinstance(config.get('loop'), dict) and key in config['loop']:
        found.append(('loop', config['loop']))
    for i, item in enumerate(config.get('callbacks') or []):
        if isinstance(item, dict) and key in item:
            found.append((f'callbacks[{i}]', item))
    return found


def _continue_in(recipe: Recipe, experiment: str) -> None:
    """Make the recipe write to the experiment being resumed: a local folder's results root replaces every
    ``local_model_result_folder_path``; a cloud one must be the recipe's cloud, bucket and prefix."""
    errors = []
    config = recipe.config
    if _is_cloud(experiment):
        from ..storage.urls import cloud_scheme, split_url
        scheme, bucket, key = split_url(experiment)
        for path, section in _sections_with(config, 'bucket_name'):
            expected = '/'.join(p for p in (str(section.get('cloud_dir_prefix') or '').strip('/'),
                                            str(section.get('project_name', '')), '') if p)
            try:
                saves_to = cloud_scheme(section['cloud_save_mode']) if 'cloud_save_mode' in section else scheme
            except ValueError:
                saves_to = None
            if saves_to != scheme or section['bucket_name'] != bucket or not key.startswith(expected):
                errors.append(f'{path}: the recipe saves to {saves_to or "?"}://{section["bucket_name"]}/'
                              f'{expected}..., not to {experiment}')
    else:
        folder = os.path.abspath(os.path.expanduser(experiment))
        project_dir, folder_name = os.path.split(folder)
        root, project = os.path.split(project_dir)
        for path, section in _sections_with(config, 'local_model_result_folder_path'):
            if section.get('project_name') != project or \
                    not folder_name.startswith(f'{section.get("experiment_name")}_'):
                errors.append(f'{path}: project_name={section.get("project_name")!r}, experiment_name='
                              f'{section.get("experiment_name")!r} do not name the folder {folder}')
            section['local_model_result_folder_path'] = root
    if errors:
        raise RecipeError(errors, recipe.source)


def _read_train_state(storage: 'Storage', folder_key: str) -> Any:
    """The training state (``train_state.pt``) of the sharded checkpoint stored under ``folder_key``, alone."""
    from ..checkpoint.files import load_checkpoint
    from ..checkpoint.sharded import TRAIN_STATE_FILE
    key = f'{folder_key}/{TRAIN_STATE_FILE}'
    with tempfile.TemporaryDirectory(prefix='aitoolbox_like_resume_') as tmp:
        local = storage.load_file(key, os.path.join(tmp, TRAIN_STATE_FILE))
        return load_checkpoint(local, source_name=storage.uri(key))


def _newest_checkpoint(experiment: str, endpoint_url: Optional[str] = None) -> Tuple[Any, str]:
    """``(checkpoint, where)``: the newest complete checkpoint of the experiment folder or cloud address
    ``experiment``, as much of it as :func:`finished_reason` reads. FileNotFoundError when there is none.

    A sharded (FSDP) checkpoint in the cloud gives only its training state: its shards, possibly large, are
    downloaded once, by the resumed fit, into the local experiment folder where the run expects them (and DCP
    reshards them there for the number of processes it resumes with). ``endpoint_url``: the cloud's endpoint (None:
    the client's own resolution)."""
    from ..engine import loop_state
    if not _is_cloud(experiment):
        return loop_state.load_resume_checkpoint(None, experiment)
    from ..experiment import CHECKPOINT_DIR, find_cloud_checkpoint
    from ..checkpoint.sharded import MARKER
    storage, prefix = _cloud_experiment(experiment, endpoint_url)
    found = find_cloud_checkpoint(storage, prefix)
    if found is None:
        raise FileNotFoundError(f'no complete checkpoint in {storage.uri(prefix)}/{CHECKPOINT_DIR}/')
    if found.endswith(f'/{MARKER}'):
        folder = found[:-len(MARKER) - 1]
        return _read_train_state(storage, folder), storage.uri(folder)
    return loop_state.load_resume_checkpoint(None, storage.uri(found), endpoint_url=endpoint_url)


@contextlib.contextmanager
def _cloud_endpoint(experiment: str, endpoint_url: Optional[str]) -> Iterator[None]:
    """``--endpoint-url`` for the whole resumed run: fit reads its checkpoint from the cloud again (in every process
    it starts) and the loop's savers upload to the bucket, all with the client's own endpoint resolution (the cloud's
    endpoint variable: AWS_ENDPOINT_URL_S3, STORAGE_EMULATOR_HOST, AZURE_STORAGE_ACCOUNT_URL), which an explicit
    address must win over. The variable is put back afterwards (``main`` may be called from Python)."""
    from ..storage.urls import ENDPOINT_VARIABLES, split_url
    if endpoint_url is None:
        yield
        return
    variable = ENDPOINT_VARIABLES[split_url(experiment)[0] if _is_cloud(experiment) else 's3']
    saved = os.environ.get(variable)
    if saved not in (None, endpoint_url):
        logger.info('--endpoint-url %s replaces %s=%s for this run', endpoint_url, variable, saved)
    os.environ[variable] = endpoint_url
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = saved


def _train_again(recipe_file: str) -> str:
    """How to start the run again from its saved recipe (``train`` reads local files only)."""
    if _is_cloud(recipe_file):
        return f'start the run again: copy {recipe_file} here, then {PROG} train {RECIPE_FILE}'
    return f'start the run again with: {PROG} train {shlex.quote(recipe_file)}'


def cmd_resume(args: argparse.Namespace, argv: Sequence[str]) -> int:
    with _cloud_endpoint(args.experiment, args.endpoint_url):
        return _resume(args, argv)


def _resume(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from ..checkpoint.files import CheckpointError
    # A local folder is made absolute once: the recipe's imports, the loop's results root and resume_from use it.
    experiment = args.experiment if _is_cloud(args.experiment) else \
        os.path.abspath(os.path.expanduser(args.experiment))
    text, previous, where = _read_experiment(experiment, args.endpoint_url)
    base_dir = experiment if not _is_cloud(experiment) else os.getcwd()
    recipe = Recipe.from_text(text, source=where, base_dir=base_dir, overrides=args.overrides)
    _continue_in(recipe, experiment)
    plan = recipe.plan()
    try:
        checkpoint, checkpoint_source = _newest_checkpoint(experiment, args.endpoint_url)
    except FileNotFoundError as error:
        _say(f'{experiment}: no checkpoint to resume from ({error}); {_train_again(where)}')
        return 1
    except CheckpointError as error:
        _say(f'{experiment}: its newest checkpoint cannot be resumed from: {error}. Remove it to resume from the one '
             f'before it, or {_train_again(where)}')
        return 1
    reason = finished_reason(checkpoint, plan.fit, [getattr(c.target, '__name__', '') for c in plan.callbacks])
    if reason is not None:
        _say(f'{experiment}: {reason} (newest checkpoint {checkpoint_source}); nothing to train. To train longer: '
             f'{PROG} resume {shlex.quote(experiment)} fit.num_epochs=<more>')
        return 0
    del checkpoint       # fit loads it again, in every process of a distributed run
    # hyperparams_list.txt and the script copy stay those of the first run; no script to copy now.
    run = recipe.build(hyperparams_defaults={'experiment_file_path': None})
    attach_run_files(run, recipe, previous + command_line_text(argv))
    run.fit(resume_from=experiment)
    return _finish(run)


# ---------------------------------------------------------------------------------------------- show / list


def cmd_show(args: argparse.Namespace, argv: Sequence[str]) -> int:
    recipe = Recipe.load(args.recipe, args.overrides)
    sys.stdout.write(recipe.to_yaml())
    sys.stdout.flush()
    recipe.validate()
    return 0


def _import_all(imports: Sequence[str]) -> None:
    if imports:
        Recipe({'imports': list(imports)}, source='--import', base_dir=os.getcwd()).import_modules()


def _print_entries(kind: str) -> None:
    for name, signature, summary in reference_entries(kind):
        print(f'{name}({signature})')
        if summary:
            print(f'    {summary}')


def cmd_callbacks(args: argparse.Namespace, argv: Sequence[str]) -> int:
    _import_all(args.imports)
    _print_entries('callback')
    return 0


def cmd_list(args: argparse.Namespace, argv: Sequence[str]) -> int:
    _import_all(args.imports)
    _print_entries(args.kind)
    return 0


# ---------------------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``aitoolbox-like`` (every subcommand has ``--help``)."""
    parser = argparse.ArgumentParser(
        prog=program_name(), description='Train, resume and inspect experiments described by YAML recipes '
                                          '(docs/recipes.md).')
    parser.add_argument('--log-level', default='INFO', choices=['DEBUG', 'INFO', 'WARNING', 'ERROR'],
                        help='logging level of the training run (default INFO)')
    commands = parser.add_subparsers(dest='command', required=True, metavar='COMMAND')

    overrides_help = 'key.path=value overrides of the recipe, e.g. fit.num_epochs=3 callbacks.0.patience=5'
    train = commands.add_parser('train', help='train from a recipe',
                                description='Check the recipe, build everything it names and train. The resolved '
                                            'recipe and this command line are saved in the experiment folder '
                                            f'({RECIPE_FILE}, {COMMAND_LINE_FILE}).')
    train.add_argument('recipe', help='the recipe YAML file')
    train.add_argument('overrides', nargs='*', metavar='key.path=value', help=overrides_help)
    train.add_argument('--check', action='store_true', help='only check the recipe (exit status 0 when it checks)')
    train.set_defaults(handler=cmd_train)

    resume = commands.add_parser('resume', help='continue an interrupted run from its experiment folder',
                                 description=f'Rebuild the run from the {RECIPE_FILE} saved in its experiment folder '
                                             'and continue from its newest checkpoint, in the same folder, exactly '
                                             'as if it had not been interrupted. A run that already finished says '
                                             'so and exits with status 0.')
    resume.add_argument('experiment', help='the experiment folder (<results>/<project>/<experiment>_<timestamp>) or '
                                           'its s3://, gs:// or az://bucket/<prefix>/<project>/<experiment>_'
                                           '<timestamp> address')
    resume.add_argument('overrides', nargs='*', metavar='key.path=value',
                        help='overrides of the saved recipe (e.g. fit.num_epochs=20 to train a finished run longer); '
                             'they are saved with the run')
    resume.add_argument('--endpoint-url', default=None,
                        help='the cloud\'s endpoint (default: the client\'s own, e.g. AWS_ENDPOINT_URL_S3, '
                             'STORAGE_EMULATOR_HOST, AZURE_STORAGE_ACCOUNT_URL)')
    resume.set_defaults(handler=cmd_resume)

    show = commands.add_parser('show', help='print the resolved recipe',
                               description='Print the recipe with overrides applied and interpolations resolved, '
                                           'then check it (exit status 2 and the problems when it does not check).')
    show.add_argument('recipe', help='the recipe YAML file')
    show.add_argument('overrides', nargs='*', metavar='key.path=value', help=overrides_help)
    show.set_defaults(handler=cmd_show)

    import_help = 'a python file or module to import first (its @register_* names are listed too); repeatable'
    callbacks = commands.add_parser('callbacks', help='list the registered callbacks and their arguments',
                                    description='Every registered callback: its arguments with their defaults, '
                                                'and the first line of its documentation.')
    callbacks.add_argument('--import', dest='imports', action='append', default=[], metavar='FILE_OR_MODULE',
                           help=import_help)
    callbacks.set_defaults(handler=cmd_callbacks)

    listing = commands.add_parser('list', help='list the names of one registry',
                                  description='Every name of one registry, with its arguments. Kinds: ' +
                                              '; '.join(f'{k}: {v}' for k, v in KINDS.items()))
    listing.add_argument('kind', choices=list(KINDS), help='which registry')
    listing.add_argument('--import', dest='imports', action='append', default=[], metavar='FILE_OR_MODULE',
                         help=import_help)
    listing.set_defaults(handler=cmd_list)

    # Packages that build on this one add their own subcommands (`tune`), named by import path in plugins.py.
    from .plugins import SUBCOMMANDS
    for path in SUBCOMMANDS:
        import_path(path)(commands)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status (0 done, 1 nothing to resume, 2 a recipe that does not
    check, 130 a run interrupted before its end, its checkpoint written)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=getattr(logging, args.log_level),
                            format='%(levelname)s %(name)s: %(message)s')
    try:
        return int(args.handler(args, argv))
    except (RecipeError, UnknownNameError) as error:
        print(f'{parser.prog}: {error}', file=sys.stderr, flush=True)
        return EXIT_RECIPE_ERROR
    except BrokenPipeError:
        # The reader of a listing went away (`aitoolbox-like callbacks | head`): not an error of ours; stdout is
        # pointed at /dev/null so that the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == '__main__':
    sys.exit(main())
