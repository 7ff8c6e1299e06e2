"""Tracking TrainLoops: a TrainLoop with saving callbacks registered for you (AIToolbox's classes).

- TrainLoopCheckpoint: full-state checkpoint after every epoch (or every ``iteration_save_freq`` batches).
- TrainLoopEndSave: the final model and the result packages' results at the end of training.
- TrainLoopCheckpointEndSave: both.

All three take ``preemption_safe=True`` (last): a SIGTERM / SIGINT then checkpoints and stops cleanly
(PreemptionCheckpoint, added by callbacks/defaults.py when a checkpoint callback is registered); False turns it off.

All three write to ``<local_model_result_folder_path>/<project_name>/<experiment_name>_<timestamp>/`` and, with
``cloud_save_mode='s3'`` (``'gcs'``, ``'azure'``), upload the same files to ``s3://<bucket_name>/<cloud_dir_prefix>/``
(``gs://``, ``az://``; the bucket is checked at the start of fit, never when the loop is created). Our bookkeeping (pointers, run claim, upload journal) lives
in ``<local_model_result_folder_path>/.aitoolbox_like/<project_name>/``, outside the project folder
(aitoolbox_like.experiment).

The classes are defined in aitoolbox_like.train_loop, beside TrainLoop (where AIToolbox's train_loop package offers
them too), and are the same objects here.
"""
from .train_loop import TrainLoop, TrainLoopCheckpoint, TrainLoopCheckpointEndSave, TrainLoopEndSave

__all__ = ['TrainLoopCheckpoint', 'TrainLoopCheckpointEndSave', 'TrainLoopEndSave']
