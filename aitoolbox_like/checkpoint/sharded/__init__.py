"""Sharded checkpoints of an FSDP fit (``gpu_mode='fsdp'``), written and read with ``torch.distributed.checkpoint``
(DCP).

A sharded checkpoint is a folder, ``checkpoint_model/model_<experiment>_<timestamp>_E<epoch>.dcp/``::

    train_state.pt       the rest of the training state (loop_state.build_checkpoint without weights: history,
                         counters, RNG, callbacks' state, ...), written by rank 0, weights_only-loadable
    __<rank>_0.distcp    each process's shards of the model and the optimizer state (DCP's files)
    .metadata            DCP's index of the shards, written last, once every rank's shards are written

The folder is written under a hidden temporary name (``.<name>.dcp.<12 hex>.tmp``, next to the final one) and
renamed by rank 0 once DCP's save has completed (its ``.metadata`` is written by rank 0 after every rank reported
its files), so a folder with the final name is complete; its ``.metadata`` file is the marker of completeness, and
the ``latest_checkpoint.txt`` pointer names that file (written after the rename). A killed write leaves only the
temporary folder, removed when the experiment is resumed (storage.local.remove_stray_temp_files). To a cloud the other
files are uploaded first and ``.metadata`` last, with the cloud pointer set once it is uploaded (the uploader sends
in order); :func:`download` brings such a folder back for a resume.

Asynchronous saves (the saving callbacks' ``async_save=True``): :func:`begin_save` copies this rank's shards to host
memory (:class:`HostStager`: into the buffers of the previous save); :meth:`ShardedSave.finish`, run by the
callback's background writer thread, writes that copy with ``torch.distributed.checkpoint.save`` over a gloo process
group of its own (:func:`checkpoint_process_group`: DCP's planning collectives run there, off the training thread)
and completes the folder. The save's other collectives run there too (rank 0 tells the other ranks the folder's
names; the train state's running losses are averaged over the ranks): after the first save, which makes the group,
the training thread of an asynchronous save runs no collective of its own. For a mid-epoch checkpoint followed by
another training step (``until_step=True``) the copy of the parameters and of the optimizer state goes on in the
stager's thread during that step's forward and backward, and each optimizer's ``step()`` waits for it (a step
pre-hook) before it changes them.

Model and optimizer go through ``torch.distributed.checkpoint.state_dict.get_state_dict`` / ``set_state_dict``:
keys are parameter names (FQNs), values DTensors. DCP reshards on load, so a checkpoint written by N processes
resumes on M processes, in a single process without a process group included (then the model is a plain module).
"""
# The package only re-exports: the folder's files, the host staging and the writing each live in a module of their
# own; the state dicts through DCP are the distributed package's (a DDP/FSDP fit's launch gathers them too).
from .files import (FOLDER_KEY, MARKER, SUFFIX, TRAIN_STATE_FILE, checkpoint_folder, download, folder_name,
                    is_sharded_checkpoint, load_train_state, upload_order)
from .staging import HostStager, close_stager, new_stager, step_wait_seconds
from .state_dicts import full_state, index_keyed, load_full_state, load_model_and_optimizer
from .writing import (ShardedSave, begin_save, checkpoint_process_group, gradients_inside_window_error,
                      next_step_follows, save)

__all__ = ['SUFFIX', 'MARKER', 'TRAIN_STATE_FILE', 'FOLDER_KEY', 'folder_name', 'is_sharded_checkpoint',
           'checkpoint_folder', 'checkpoint_process_group', 'HostStager', 'new_stager', 'close_stager', 'ShardedSave',
           'begin_save', 'next_step_follows', 'step_wait_seconds', 'save', 'upload_order', 'download',
           'load_train_state', 'load_model_and_optimizer', 'full_state', 'load_full_state', 'index_keyed',
           'gradients_inside_window_error']
