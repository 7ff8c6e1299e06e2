"""Checkpoints, one room: the single-file checkpoint of one process (:mod:`.files`: atomic writes, ``weights_only``
loading, the asynchronous writer) and the sharded checkpoint of a distributed fit (:mod:`.sharded`: a folder of
shards, staging on the host, the full state dicts gathered or scattered). ``aitoolbox_like.checkpoint`` offers the
single-file names, the ones a user's code loads with."""
from .files import (AsyncCheckpointWriter, CheckpointError, atomic_torch_save, check_weights_only_safe,  # noqa: F401
                    load_checkpoint)

__all__ = ['AsyncCheckpointWriter', 'CheckpointError', 'atomic_torch_save', 'check_weights_only_safe',
           'load_checkpoint']
