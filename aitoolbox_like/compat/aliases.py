"""AIToolbox 1.8.0's module layout, mapped onto aitoolbox_like: the only place that knows it.

Each key is an AIToolbox module path relative to ``aitoolbox`` (``''`` is ``aitoolbox`` itself). Its value is
either the name of one of our modules, which is then importable under the AIToolbox path as the very same
module object, or a dict of the names that AIToolbox module offers, each mapped to the module of ours that
defines it (the alias module is then built from those names, lazily). A key with other keys below it is a
package. ``UNSUPPORTED`` names import, and raise a clear error when used.

Both ``aitoolbox.<key>`` (under ``python -m aitoolbox_like.compat`` / ``install()``) and
``aitoolbox_like.<key>`` (code where ``aitoolbox`` was replaced by ``aitoolbox_like``) resolve from here.
"""
from typing import Dict, Union

_CB = 'aitoolbox_like.callbacks'
_SCHED = 'aitoolbox_like.callbacks.train_schedule'
_SAVERS = 'aitoolbox_like.results.savers'
_LOADER = 'aitoolbox_like.results.model_loader'
_REPORTING = 'aitoolbox_like.results.reporting'
_UTILS = 'aitoolbox_like.compat.utils'
_CLOUD = 'aitoolbox_like.compat.cloud'
_GCLOUD = 'aitoolbox_like.compat.google_cloud'
# AIToolbox's loops: ours with its defaults (the end-of-epoch evaluation of the training set).
_LOOPS = 'aitoolbox_like.compat.loops'
_NLP_METRICS = 'aitoolbox_like.nlp.metrics'
_NLP_PACKAGES = 'aitoolbox_like.nlp.packages'


class Unsupported:
    """A name AIToolbox has and we deliberately do not implement; using it raises ``reason``."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


_KERAS = Unsupported('Keras models are not supported by aitoolbox_like (it trains PyTorch models only)')

Target = Union[str, Unsupported]
Alias = Union[str, Dict[str, Target]]


def _names(module: str, *names: str) -> Dict[str, Target]:
    return {name: module for name in names}


_TORCHTRAIN_EXPORTS: Dict[str, Target] = {
    **_names('aitoolbox_like.model', 'TTModel', 'MultiGPUModelWrap', 'ModelWrap', 'AbstractModelFeedDefinition'),
    **_names('aitoolbox_like.distributed.parallel', 'TTDataParallel'),
    **_names(_LOOPS, 'TrainLoop', 'TrainLoopCheckpoint', 'TrainLoopEndSave', 'TrainLoopCheckpointEndSave'),
    **_names('aitoolbox_like.model.multi_loss_optim', 'MultiLoss', 'MultiOptimizer'),
    **_names('aitoolbox_like.model.datasets', 'BasicDataset'),
}

_CALLBACKS_EXPORTS: Dict[str, Target] = {
    **_names(f'{_CB}.abstract', 'AbstractCallback', 'AbstractExperimentCallback'),
    **_names(f'{_CB}.basic', 'EarlyStopping', 'ThresholdEarlyStopping', 'EmailNotification', 'TerminateOnNaN',
             'AllPredictionsSame', 'LogUpload'),
    **_names(f'{_CB}.performance_eval', 'ModelPerformanceEvaluation', 'ModelPerformancePrintReport',
             'ModelTrainHistoryFileWriter', 'ModelTrainHistoryPlot'),
    **_names(f'{_CB}.gradient', 'GradNormClip', 'GradValueClip'),
    **_names(f'{_CB}.tensorboard', 'TensorboardFullTracking', 'TensorboardTrainHistoryMetric'),
    **_names(f'{_CB}.wandb', 'WandBTracking'),
    **_names(_SCHED, 'LinearWithWarmupScheduler', 'ReduceLROnPlateauScheduler', 'ReduceLROnPlateauMetricScheduler'),
}

_EXPERIMENT_EXPORTS: Dict[str, Target] = _names(
    'aitoolbox_like.results.basic', 'BinaryClassificationResultPackage', 'ClassificationResultPackage',
    'RegressionResultPackage')

_BASIC_SCHEDULERS = _names(_SCHED, 'AbstractScheduler', 'GeneralLRSchedulerCallback', 'ReduceLROnPlateauScheduler',
                           'ReduceLROnPlateauMetricScheduler', 'LambdaLRScheduler', 'StepLRScheduler',
                           'MultiStepLRScheduler')
_WARMUP_SCHEDULERS = _names(_SCHED, 'ConstantWithWarmupScheduler', 'CosineWithWarmupScheduler',
                            'HardRestartsCosineWithWarmupScheduler', 'LinearWithWarmupScheduler')

MODULES: Dict[str, Alias] = {
    '': {**_TORCHTRAIN_EXPORTS, **_CALLBACKS_EXPORTS, **_EXPERIMENT_EXPORTS},

    # ---- torchtrain
    'torchtrain': dict(_TORCHTRAIN_EXPORTS),
    'torchtrain.model': 'aitoolbox_like.model',
    'torchtrain.parallel': 'aitoolbox_like.distributed.parallel',
    'torchtrain.model_predict': 'aitoolbox_like.model_predict',
    'torchtrain.multi_loss_optim': 'aitoolbox_like.model.multi_loss_optim',
    'torchtrain.data': {},
    'torchtrain.data.batch_model_feed_defs': _names('aitoolbox_like.model', 'AbstractModelFeedDefinition'),
    'torchtrain.data.dataset': 'aitoolbox_like.model.datasets',
    'torchtrain.train_loop': _names(_LOOPS, 'TrainLoop', 'TrainLoopCheckpoint', 'TrainLoopEndSave',
                                    'TrainLoopCheckpointEndSave'),
    'torchtrain.train_loop.train_loop': _names(_LOOPS, 'TrainLoop'),
    'torchtrain.train_loop.train_loop_tracking': _names(_LOOPS, 'TrainLoopCheckpoint', 'TrainLoopEndSave',
                                                        'TrainLoopCheckpointEndSave'),
    'torchtrain.train_loop.components': {},
    'torchtrain.train_loop.components.callback_handler': _names('aitoolbox_like.compat.handler', 'CallbacksHandler'),
    'torchtrain.train_loop.components.ddp_handler': {
        'DDPHandler': Unsupported("DDPHandler is internal to AIToolbox's DDP mode; aitoolbox_like's DDP needs no "
                                  "handler object: use TrainLoop(..., gpu_mode='ddp') and, for gathering, "
                                  "aitoolbox_like.distributed.gather_predictions")},
    'torchtrain.train_loop.components.message_passing': 'aitoolbox_like.engine.message_passing',
    'torchtrain.train_loop.components.model_prediction_store': {
        'ModelPredictionStore': Unsupported("ModelPredictionStore is internal to AIToolbox's TrainLoop; "
                                            "aitoolbox_like caches predictions itself (predict_on_*_set(force_"
                                            "prediction=True) recomputes, purge_prediction_cache() forgets)")},
    'torchtrain.train_loop.components.pred_collate_fns': 'aitoolbox_like.model.predictions',
    'torchtrain.callbacks': dict(_CALLBACKS_EXPORTS),
    **{f'torchtrain.callbacks.{name}': f'{_CB}.{name}'
       for name in ('abstract', 'basic', 'ddp', 'gradient', 'model_load', 'model_save', 'performance_eval',
                    'tensorboard', 'train_schedule', 'wandb')},
    'torchtrain.schedulers': {},
    'torchtrain.schedulers.basic': _BASIC_SCHEDULERS,
    'torchtrain.schedulers.warmup': _WARMUP_SCHEDULERS,

    # ---- experiment
    'experiment': dict(_EXPERIMENT_EXPORTS),
    'experiment.training_history': 'aitoolbox_like.engine.history',
    'experiment.result_package': {},
    'experiment.result_package.abstract_result_packages': 'aitoolbox_like.results.abstract',
    'experiment.result_package.basic_packages': 'aitoolbox_like.results.basic',
    'experiment.result_package.torch_metrics_packages': _names('aitoolbox_like.results.basic',
                                                               'TorchMetricsPackage'),
    'experiment.result_package.hf_evaluate_packages': _names('aitoolbox_like.results.basic',
                                                             'HFEvaluateResultPackage'),
    'experiment.core_metrics': {},
    'experiment.core_metrics.abstract_metric': _names('aitoolbox_like.results.metrics', 'AbstractBaseMetric'),
    'experiment.core_metrics.classification': _names(
        'aitoolbox_like.results.metrics', 'AccuracyMetric', 'ROCAUCMetric', 'PrecisionRecallCurveAUCMetric',
        'F1ScoreMetric', 'PrecisionMetric', 'RecallMetric'),
    'experiment.core_metrics.regression': _names('aitoolbox_like.results.metrics', 'MeanSquaredErrorMetric',
                                                 'MeanAbsoluteErrorMetric'),
    'experiment.local_load': {},
    'experiment.local_load.local_model_load': _names(_LOADER, 'AbstractLocalModelLoader', 'PyTorchLocalModelLoader'),
    'experiment.local_save': {},
    'experiment.local_save.folder_create': _names(_SAVERS, 'ExperimentFolder'),
    'experiment.local_save.local_model_save': {
        **_names(_SAVERS, 'AbstractLocalModelSaver', 'BaseLocalModelSaver', 'PyTorchLocalModelSaver',
                 'LocalSubOptimalModelRemover'),
        'KerasLocalModelSaver': _KERAS},
    'experiment.local_save.local_results_save': _names(_SAVERS, 'AbstractLocalResultsSaver', 'BaseLocalResultsSaver',
                                                       'LocalResultsSaver'),
    'experiment.experiment_saver': {
        **_names(_SAVERS, 'AbstractExperimentSaver', 'BaseFullExperimentSaver'),
        **_names(_SAVERS, 'BaseFullExperimentS3Saver', 'FullPyTorchExperimentS3Saver',
                 'BaseFullExperimentGoogleStorageSaver', 'FullPyTorchExperimentGoogleStorageSaver'),
        'FullKerasExperimentS3Saver': _KERAS, 'FullKerasExperimentGoogleStorageSaver': _KERAS},
    'experiment.local_experiment_saver': {
        **_names(_SAVERS, 'BaseFullExperimentLocalSaver', 'FullPyTorchExperimentLocalSaver'),
        'FullKerasExperimentLocalSaver': _KERAS},
    'experiment.result_reporting': {},
    'experiment.result_reporting.hyperparam_reporter': _names(_REPORTING, 'HyperParamSourceReporter'),
    'experiment.result_reporting.report_generator': _names(_REPORTING, 'TrainingHistoryPlotter',
                                                           'TrainingHistoryWriter', 'GradientPlotter'),

    # ---- utils
    'utils': {},
    'utils.util': _names(_UTILS, 'function_exists', 'copy_function', 'is_empty_function', 'flatten_list_of_lists'),
    'utils.dict_util': _names(_UTILS, 'combine_prediction_metadata_batches', 'flatten_dict', 'combine_dict_elements',
                              'flatten_combine_dict'),
    'utils.file_system': _names(_UTILS, 'create_folder_hierarchy', 'zip_folder', 'unzip_file'),

    # ---- cloud
    'cloud': _names(_CLOUD, 's3_available_options', 'gcs_available_options'),
    'cloud.AWS': {},
    'cloud.AWS.data_access': _names(_CLOUD, 'BaseDataSaver', 'BaseDataLoader', 'AbstractDatasetFetcher'),
    'cloud.AWS.model_save': {**_names(_CLOUD, 'AbstractModelSaver', 'BaseModelSaver', 'PyTorchS3ModelSaver'),
                             'KerasS3ModelSaver': _KERAS},
    'cloud.AWS.model_load': _names(_CLOUD, 'BaseModelLoader', 'PyTorchS3ModelLoader'),
    'cloud.AWS.results_save': _names(_CLOUD, 'AbstractResultsSaver', 'BaseResultsSaver', 'S3ResultsSaver'),
    'cloud.AWS.simple_email_service': _names(_CLOUD, 'SESSender'),
    'cloud.GoogleCloud': {},
    'cloud.GoogleCloud.data_access': _names(_GCLOUD, 'BaseGoogleStorageDataSaver', 'BaseGoogleStorageDataLoader'),
    'cloud.GoogleCloud.model_load': _names(_GCLOUD, 'BaseModelGoogleStorageLoader', 'PyTorchGoogleStorageModelLoader'),
    'cloud.GoogleCloud.model_save': {**_names(_GCLOUD, 'BaseModelGoogleStorageSaver', 'PyTorchGoogleStorageModelSaver'),
                                     'KerasGoogleStorageModelSaver': _KERAS},
    'cloud.GoogleCloud.results_save': _names(_GCLOUD, 'BaseResultsGoogleStorageSaver', 'GoogleStorageResultsSaver'),

    # ---- nlp (aitoolbox_like.nlp is AIToolbox's aitoolbox.nlp package itself; its sub-paths are served from here)
    'nlp': 'aitoolbox_like.nlp',
    'nlp.core': {},
    'nlp.core.core': 'aitoolbox_like.nlp.text',
    'nlp.core.vocabulary': 'aitoolbox_like.nlp.vocabulary',
    'nlp.torch_collate_fns': 'aitoolbox_like.nlp.collate',
    'nlp.experiment_evaluation': {},
    'nlp.experiment_evaluation.NLP_metrics': {
        **_names('aitoolbox_like.results.metrics', 'AbstractBaseMetric'),
        **_names(f'{_NLP_METRICS}.rouge', 'ROUGEMetric', 'ROUGEPerlMetric'),
        **_names(f'{_NLP_METRICS}.squad', 'ExactMatchTextMetric', 'F1TextMetric'),
        **_names(f'{_NLP_METRICS}.bleu', 'BLEUSentenceScoreMetric', 'BLEUCorpusScoreMetric',
                 'BLEUScoreStrTorchNLPMetric'),
        **_names(f'{_NLP_METRICS}.perplexity', 'PerplexityMetric'),
        **_names(f'{_NLP_METRICS}.glue', 'GLUEMetric', 'XNLIMetric', 'glue_compute_metrics', 'xnli_compute_metrics')},
    'nlp.experiment_evaluation.NLP_result_package': {
        **_names(f'{_NLP_PACKAGES}.question_answering', 'QuestionAnswerResultPackage',
                 'QuestionAnswerSpanClassificationResultPackage'),
        **_names(f'{_NLP_PACKAGES}.summarization', 'TextSummarizationResultPackage'),
        **_names(f'{_NLP_PACKAGES}.translation', 'MachineTranslationResultPackage'),
        **_names(f'{_NLP_PACKAGES}.benchmarks', 'GLUEResultPackage', 'XNLIResultPackage')},
    'nlp.experiment_evaluation.attention_heatmap': f'{_NLP_METRICS}.attention_heatmap',
}

# Our own modules that AIToolbox's package __init__ files add names to, for code where ``aitoolbox`` was
# renamed ``aitoolbox_like``: ``aitoolbox_like`` (AIToolbox's top level) and ``aitoolbox_like.experiment``.
EXTENDED_OWN_MODULES = {'': 'aitoolbox_like', 'experiment': 'aitoolbox_like.experiment'}
