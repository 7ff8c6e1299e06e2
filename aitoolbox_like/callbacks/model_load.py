"""ModelLoadContinueTraining: continue training from a saved checkpoint of an earlier experiment."""
import copy
import logging
import os
from typing import Any, Dict, Optional, Tuple

from ..checkpoint import sharded as sharded_checkpoint
from ..engine import loop_state
from ..experiment import Experiment, get_experiment, is_cloud_mode, model_file_name
from ..storage.base import join_key
from ..storage.urls import storage_for_mode
from .abstract import AbstractExperimentCallback

logger = logging.getLogger(__name__)


class ModelLoadContinueTraining(AbstractExperimentCallback):
    """Load a checkpoint saved by ModelCheckpoint / ModelIterationCheckpoint / ModelTrainEndSave and continue
    training from it; the run keeps writing to the checkpoint's experiment folder.

    As in AIToolbox, the weights, the optimizer state and the grad scaler are loaded when the callback is
    registered (so a loop can predict with them without training); the rest when ``fit`` starts.

    The training state is restored (weights, optimizer, schedulers, grad scaler, counters, callbacks' state, RNG,
    position in the epoch), so the weights equal the uninterrupted run's. The training history is AIToolbox's: it
    holds the epochs trained after the checkpoint was loaded (AIToolbox code reads it so), unless
    ``restore_history=True``, which restores the saved history too, so that it holds every epoch of the run, as
    ``fit(resume_from=...)`` does.

    Args:
        saved_experiment_timestamp (str): timestamp of the experiment folder to load from.
        saved_model_dir (str): 'checkpoint_model' (checkpoints) or 'model' (the model saved at the end).
        epoch_num (int or None): load the checkpoint of this epoch; None: the latest one (named by
            ``latest_checkpoint.txt`` in the experiment's bookkeeping folder,
            ``<local_model_result_folder_path>/.aitoolbox_like/<project>/<experiment>_<timestamp>/``).
        ignore_saved_schedulers (bool): do not restore the schedulers' state.
        ignore_missing_saved_schedulers (bool): accepted for AIToolbox compatibility (missing scheduler state
            is never an error here: schedulers without saved state start fresh).
        used_data_parallel (bool): strip the 'module.' prefix of weights saved from a DataParallel model.
        custom_local_loader_class: not supported (AIToolbox's loader classes are replaced by one function).
        project_name: as for every experiment callback; taken from a tracking TrainLoop when None (as are the
            following five).
        experiment_name: see project_name.
        local_model_result_folder_path: see project_name.
        cloud_save_mode: see project_name.
        bucket_name: see project_name.
        cloud_dir_prefix: see project_name.
        restore_history (bool): also restore the checkpoint's training history (keyword only; default False,
            AIToolbox's result: the history of the continued fit only).
        **kwargs: ``endpoint_url`` (the cloud's endpoint; None: the client's own resolution), ``map_location``
            (default 'cpu'), ``allow_unsafe_pickle`` (default False: a checkpoint that holds pickled Python
            objects is refused; only set it for files you trust).
    """

    # Read by the loop before callbacks register (loop_state.prepare_fit): this callback names the experiment and
    # continues its folder rather than starting a new one.
    defines_experiment = True
    continues_experiment = True

    def __init__(self, saved_experiment_timestamp: str, saved_model_dir: str = 'checkpoint_model',
                 epoch_num: Optional[int] = None, ignore_saved_schedulers: bool = False,
                 ignore_missing_saved_schedulers: bool = False, used_data_parallel: bool = False,
                 custom_local_loader_class: Any = None, project_name: Optional[str] = None,
                 experiment_name: Optional[str] = None, local_model_result_folder_path: Optional[str] = None,
                 cloud_save_mode: Optional[str] = None, bucket_name: Optional[str] = None,
                 cloud_dir_prefix: Optional[str] = None, *, restore_history: bool = False, **kwargs: Any) -> None:
        super().__init__('Model loading and initialization from checkpoint before training', project_name,
                         experiment_name, local_model_result_folder_path, cloud_save_mode, bucket_name,
                         cloud_dir_prefix, execution_order=-10, device_idx_execution=None)
        if custom_local_loader_class is not None:
            raise ValueError('ModelLoadContinueTraining: custom_local_loader_class is not supported; load the '
                             'checkpoint yourself and pass it as fit(resume_from=<path>)')
        unknown = set(kwargs) - {'map_location', 'allow_unsafe_pickle', 'endpoint_url'}
        if unknown:
            raise TypeError(f'ModelLoadContinueTraining got unexpected arguments {sorted(unknown)}')
        self.saved_experiment_timestamp = saved_experiment_timestamp
        self.saved_model_dir = saved_model_dir
        self.epoch_num = epoch_num
        self.ignore_saved_schedulers = ignore_saved_schedulers
        self.ignore_missing_saved_schedulers = ignore_missing_saved_schedulers
        self.used_data_parallel = used_data_parallel
        self.restore_history = restore_history
        self.map_location = kwargs.get('map_location', 'cpu')
        self.allow_unsafe_pickle = kwargs.get('allow_unsafe_pickle', False)
        self.endpoint_url = kwargs.get('endpoint_url')
        self.loaded_from: Optional[str] = None     # the checkpoint's path (or S3 URL), once loaded

    def on_train_loop_registration(self) -> None:
        """Load the checkpoint and hand it to the loop (``loop.resume_plan``), which applies it once every
        callback is registered."""
        self.try_infer_experiment_details(infer_cloud_details=True)
        loop = self.train_loop_obj
        checkpoint, source = self._load()
        if self.used_data_parallel:
            checkpoint['model_state_dict'] = {k[len('module.'):] if k.startswith('module.') else k: v
                                              for k, v in checkpoint['model_state_dict'].items()}
        if self.ignore_saved_schedulers:
            checkpoint['schedulers_state_dict'] = []
            schedulers = {cb.state_key for cb in loop.get_schedulers()}
            checkpoint['callbacks'] = {k: v for k, v in checkpoint.get('callbacks', {}).items()
                                       if k.split('#')[0] not in schedulers}
        if not self.restore_history and checkpoint.get('kind') == loop_state.CHECKPOINT_KIND:
            # AIToolbox's continued run keeps the loop's own history, which then holds the epochs trained from here.
            checkpoint['train_history'] = copy.deepcopy(loop.train_history.state_dict())
        # The loop's own experiment (None on a plain TrainLoop without savers); adopted only when it is the one
        # the checkpoint came from.
        experiment = get_experiment(loop)
        # Registered first (execution order -10): the experiment folder is set before the saving callbacks
        # register; the loop applies the state itself once every callback is registered.
        plan = loop_state.ResumePlan(source, checkpoint)
        plan.load(loop, experiment)
        # As AIToolbox: the weights and optimizer are loaded at registration (a loop that only predicts uses them;
        # schedulers registered next build on the saved optimizer state); the rest waits for fit.
        plan.load_weights_now(loop)
        loop.resume_plan = plan
        self.loaded_from = source

    def _relative_path(self) -> str:
        return f'{self.project_name}/{self.experiment_name}_{self.saved_experiment_timestamp}/{self.saved_model_dir}'

    def _file_name(self) -> Optional[str]:
        """The file to load; None: the newest checkpoint of the folder (its ``latest`` pointer)."""
        if self.epoch_num is None and self.saved_model_dir != 'model':
            return None
        return model_file_name(self.experiment_name, self.saved_experiment_timestamp, self.epoch_num)

    def _load(self) -> Tuple[Dict[str, Any], str]:
        loop = self.train_loop_obj
        rel_dir = self._relative_path()
        file_name = self._file_name()
        local_dir = os.path.join(self.local_model_result_folder_path, *rel_dir.split('/'))
        path = self._local_file(local_dir, file_name)
        if path is not None:
            return loop_state.load_resume_checkpoint(loop, path, map_location=self.map_location,
                                                     allow_unsafe_pickle=self.allow_unsafe_pickle)
        if is_cloud_mode(self.cloud_save_mode):
            return self._load_from_cloud(rel_dir, file_name)
        raise FileNotFoundError(f'ModelLoadContinueTraining: no checkpoint found in {local_dir} (epoch_num='
                                f'{self.epoch_num})')

    def _load_from_cloud(self, rel_dir: str, file_name: Optional[str]) -> Tuple[Dict[str, Any], str]:
        loop = self.train_loop_obj
        target = join_key(self.cloud_dir_prefix or '', rel_dir, file_name or '')     # join_key skips empty parts
        storage = storage_for_mode(self.cloud_save_mode, self.bucket_name, endpoint_url=self.endpoint_url)
        if file_name is not None:
            if not storage.exists(target):
                # A sharded (FSDP) checkpoint of that epoch is a folder: counted once its marker is there.
                folder = sharded_checkpoint.folder_name(target)
                if not storage.exists(join_key(folder, sharded_checkpoint.MARKER)):
                    where = storage.uri(join_key(self.cloud_dir_prefix or '', rel_dir))
                    raise FileNotFoundError(f'ModelLoadContinueTraining: no checkpoint of epoch_num={self.epoch_num} '
                                            f'in {where} (neither {file_name} nor a complete '
                                            f'{sharded_checkpoint.folder_name(file_name)}/)')
                target = folder
        # A sharded checkpoint is downloaded to its place under local_model_result_folder_path (the folder this
        # run continues) before it is read.
        download_to = get_experiment(loop) or Experiment(loop, self.project_name, self.experiment_name,
                                                         self.local_model_result_folder_path)
        return loop_state.load_resume_checkpoint(loop, storage.uri(target), experiment=download_to,
                                                 map_location=self.map_location,
                                                 allow_unsafe_pickle=self.allow_unsafe_pickle,
                                                 endpoint_url=self.endpoint_url)

    @staticmethod
    def _local_file(local_dir: str, file_name: Optional[str]) -> Optional[str]:
        """The checkpoint file (or a sharded checkpoint's marker) to load; None when there is none here."""
        if file_name is None:
            return loop_state.find_checkpoint_in_dir(local_dir)
        path = os.path.join(local_dir, file_name)
        if os.path.isfile(path):
            return path
        folder = os.path.join(local_dir, sharded_checkpoint.folder_name(file_name))
        return os.path.join(folder, sharded_checkpoint.MARKER) if sharded_checkpoint.is_sharded_checkpoint(folder) \
            else None
