"""The experiment folder of a run: its id, the hyperparameter / source files, and the cloud uploader.

Local layout (the same keys in the cloud, under ``<cloud_dir_prefix>/``), exactly AIToolbox's::

    <local folder>/<project>/<experiment>_<timestamp>/
        checkpoint_model/   model/   results/   hyperparams_list.txt   <script>.py   source_code.zip

AIToolbox code lists the experiment folder, the project folder (to find its experiments) and the bucket, and
expects only its own files there, so our bookkeeping lives in a hidden folder at the root of the local folder, on
the same filesystem (every write there is an atomic rename)::

    <local folder>/.aitoolbox_like/<project>/<experiment>_<timestamp>/
        run                    the id of the run that owns the experiment folder (its claim)
        latest_checkpoint.txt  best_checkpoint.txt     pointers: a checkpoint's path inside the experiment folder
        hyperparams.json       the hyperparameters as JSON
        pending_uploads.json   with a cloud: the uploads not confirmed yet (absent when everything is uploaded)
        .<name>.<hex>.partial  temporary files of atomic writes (same filesystem, so the rename is atomic)

Nothing of ours stays in the bucket: checkpoints are found there by their names (``_E<epoch>[_ITER<idx>]``, see
:func:`find_cloud_checkpoint`), and the claim of the experiment's prefix (``.aitoolbox_like/<project>/
<experiment>_<timestamp>/run`` under the cloud prefix, outside the project's prefix) is deleted at the end of fit
once every upload is confirmed.

One :class:`Experiment` per TrainLoop (``loop.experiment``) so every callback writes to the same folder.
"""
# The package only re-exports: each idea lives in a module of its own (layout, pointers, cloud_checkpoints,
# hyperparams, pending_uploads, run_folder, uploads).
from .cloud_checkpoints import find_cloud_checkpoint, find_latest_cloud_checkpoint
from .hyperparams import copy_experiment_script, hyperparams_to_json, write_hyperparams_text, zip_source_dirs
from .layout import (BEST_POINTER, CHECKPOINT_DIR, HYPERPARAMS_JSON, HYPERPARAMS_TXT, LATEST_POINTER, MODEL_DIR,
                     PENDING_UPLOADS, RESULTS_DIR, SOURCE_ZIP, bookkeeping_dir, checkpoint_order, model_file_name)
from .pending_uploads import experiment_journal, sync_experiment
from .pointers import pointer_text, read_pointer, write_pointer
from .run_folder import Experiment, get_experiment, run_owner_alive
from .uploads import (ACCESS_CHECK_PREFIX, AZURE_SAVE_MODES, BOOKKEEPING_DIR, GCS_SAVE_MODES, LOCAL_SAVE_MODES,
                      MARKER_FILE, S3_SAVE_MODES, ExperimentUploader, all_uploaders, bookkeeping_key, get_uploader,
                      is_cloud_mode, is_s3_mode, normalize_cloud_save_mode, sync_command)

# AIToolbox's aitoolbox.experiment package also exported a few result packages: aitoolbox_like.compat, the one place
# that knows AIToolbox's layout, adds them to this module (imported on first use).
