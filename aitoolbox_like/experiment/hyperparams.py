"""The files that record how a run was started, in AIToolbox's formats: ``hyperparams_list.txt`` (and our
``hyperparams.json``), a copy of the training script, and ``source_code.zip`` of the source folders."""
import json
import logging
import os
import shutil
import zipfile

from ..storage.local import write_atomically, write_text_atomically
from .layout import SOURCE_ZIP

logger = logging.getLogger(__name__)

_SKIP_DIRS = {'__pycache__', '.git', '.hg', '.svn', '.ipynb_checkpoints', '.venv', 'venv', '.mypy_cache',
              '.pytest_cache'}


def hyperparams_to_json(hyperparams):
    """JSON text of the hyperparameters; values JSON cannot hold are written as their repr."""
    return json.dumps(hyperparams if hyperparams is not None else {}, default=repr, sort_keys=False, indent=2)


def write_hyperparams_text(path, hyperparams, sort_names=False, temp_dir=None):
    """``hyperparams_list.txt``: one ``name:<TAB>value`` line per hyperparameter (AIToolbox's format).
    ``temp_dir``: where the temporary file of the atomic write goes (None: next to ``path``)."""
    names = sorted(hyperparams) if sort_names else list(hyperparams)
    write_text_atomically(path, ''.join(f'{name}:\t{hyperparams[name]}\n' for name in names), temp_dir=temp_dir)
    return path


def copy_experiment_script(folder, hyperparams, temp_dir=None):
    """Copy ``hyperparams['experiment_file_path']`` (the training script) into ``folder``; its new path, or None
    (with a warning saying why) when there is nothing to copy. ``temp_dir`` as in :func:`write_hyperparams_text`."""
    script = hyperparams.get('experiment_file_path') if isinstance(hyperparams, dict) else None
    if not script:
        logger.warning("hyperparams has no 'experiment_file_path'; the experiment script was not copied into %s "
                       "(set hyperparams['experiment_file_path'] to the training script, e.g. in a notebook)", folder)
        return None
    if not os.path.isfile(script):
        logger.warning("hyperparams['experiment_file_path'] = %r is not a file; the experiment script was not "
                       'copied into the experiment folder', script)
        return None
    target = os.path.join(folder, os.path.basename(script))
    with open(script, 'rb') as src:
        write_atomically(target, lambda dst: shutil.copyfileobj(src, dst), temp_dir=temp_dir)
    return target


def zip_source_dirs(source_dirs, zip_path, temp_dir=None):
    """Zip the given folders (each under its own name), skipping caches and VCS folders. ``temp_dir``: where the
    temporary file of the atomic write goes (None: next to ``zip_path``)."""
    if isinstance(source_dirs, (str, os.PathLike)):
        source_dirs = [source_dirs]

    def write(f):
        with zipfile.ZipFile(f, 'w', zipfile.ZIP_DEFLATED) as archive:
            for source in source_dirs:
                source = os.path.abspath(os.path.expanduser(os.fspath(source)))
                if not os.path.isdir(source):
                    logger.warning('source_dirs: %s is not a folder; not added to %s', source, SOURCE_ZIP)
                    continue
                parent = os.path.dirname(source)
                for dirpath, dirnames, filenames in os.walk(source):
                    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
                    for filename in sorted(filenames):
                        path = os.path.join(dirpath, filename)
                        archive.write(path, os.path.relpath(path, parent))

    write_atomically(zip_path, write, make_parents=False, temp_dir=temp_dir)
    return zip_path
