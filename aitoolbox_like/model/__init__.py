"""The model's side of the loop, one room: how a batch reaches the model and its loss comes back (:mod:`.feeds`:
TTModel, ModelWrap, the feed definitions, the one-pass evaluation), what is built around a model (Hugging Face's
models in :mod:`.huggingface`, weight-decay groups in :mod:`.param_groups`, several losses and optimizers in
:mod:`.multi_loss_optim`), the small in-memory datasets (:mod:`.datasets`) and how predictions are collected
(:mod:`.predictions`). ``aitoolbox_like.model`` offers the feed names, AIToolbox's ``torchtrain.model``."""
from .feeds import (AbstractModelFeedDefinition, ModelWrap, MultiGPUModelWrap, TTBasicModel,  # noqa: F401
                    TTBasicMultiGPUModel, TTModel, current_one_pass, one_pass_evaluation)

__all__ = ['AbstractModelFeedDefinition', 'ModelWrap', 'MultiGPUModelWrap', 'TTBasicModel', 'TTBasicMultiGPUModel',
           'TTModel', 'current_one_pass', 'one_pass_evaluation']
