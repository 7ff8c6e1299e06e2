"""Optimizer parameter groups: weight decay on the weights only, as Hugging Face's Trainer decides it.

Transformers' ``Trainer`` gives its optimizer two groups: the parameters that get ``weight_decay`` and those that
get none (biases, and the weights of normalisation layers). :func:`weight_decay_param_groups` builds the same two
groups for any model, so an optimizer built here matches the one the Trainer builds::

    optimizer = torch.optim.AdamW(weight_decay_param_groups(model, weight_decay=0.01), lr=5e-5)

The rule is transformers' ``Trainer.get_decay_parameter_names`` (5.x), written out here: a parameter gets no decay
when it belongs to an ``nn.LayerNorm`` (at any depth), or when its name, lower-cased, contains ``bias``,
``layernorm`` or ``rmsnorm``, or has a ``norm`` or ``..._norm`` component (``model.norm.weight``,
``final_layer_norm.weight``: RMSNorm and other normalisation layers that are not ``nn.LayerNorm``).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from torch import nn

#: Name patterns (searched in the lower-cased parameter name) of the parameters that get no weight decay.
NO_DECAY_NAME_PATTERNS: tuple[str, ...] = (r'bias', r'layernorm', r'rmsnorm', r'(?:^|\.)norm(?:$|\.)',
                                           r'_norm(?:$|\.)')
#: Module types whose parameters get no weight decay.
NO_DECAY_MODULE_TYPES: tuple[type[nn.Module], ...] = (nn.LayerNorm,)


def decay_parameter_names(model: nn.Module,
                          no_decay_module_types: Sequence[type[nn.Module]] = NO_DECAY_MODULE_TYPES,
                          no_decay_name_patterns: Sequence[str] = NO_DECAY_NAME_PATTERNS) -> list[str]:
    """The names (as ``model.named_parameters()`` gives them) of the parameters that get weight decay.

    Args:
        model: the network.
        no_decay_module_types: modules whose parameters, at any depth, get no decay (default ``nn.LayerNorm``).
        no_decay_name_patterns: regular expressions; a parameter whose lower-cased name matches one gets no decay.
    """
    patterns = [re.compile(pattern) for pattern in no_decay_name_patterns]
    module_types = tuple(no_decay_module_types)
    # The prefixes of the parameters that live inside an excluded module (the model itself aside, as transformers
    # looks only at its children).
    excluded = tuple(f'{name}.' for name, module in model.named_modules() if name and isinstance(module, module_types))
    return [name for name, _ in model.named_parameters()
            if not name.startswith(excluded) and not any(pattern.search(name.lower()) for pattern in patterns)]


def weight_decay_param_groups(model: nn.Module, weight_decay: float,
                              no_decay_module_types: Sequence[type[nn.Module]] = NO_DECAY_MODULE_TYPES,
                              no_decay_name_patterns: Sequence[str] = NO_DECAY_NAME_PATTERNS) -> list[dict[str, Any]]:
    """The two parameter groups of transformers' Trainer: ``[{'params': decayed, 'weight_decay': weight_decay},
    {'params': the others, 'weight_decay': 0.0}]``, each in ``model.named_parameters()`` order, trainable
    parameters only (``requires_grad``). Pass them to the optimizer in place of ``model.parameters()``.

    Both groups are returned even when one is empty, as the Trainer does, so the optimizer's groups (and
    ``LRMonitor``'s history keys ``lr_0_0``, ``lr_0_1``) are the same for every model.

    Args:
        model: the network.
        weight_decay (float): the decay of the first group (``TrainingArguments.weight_decay``).
        no_decay_module_types: see :func:`decay_parameter_names`.
        no_decay_name_patterns: see :func:`decay_parameter_names`.

    Raises:
        ValueError: ``weight_decay`` is negative.
    """
    if weight_decay < 0:
        raise ValueError(f'weight_decay_param_groups: weight_decay must be >= 0, got {weight_decay!r}')
    decayed = set(decay_parameter_names(model, no_decay_module_types, no_decay_name_patterns))
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    return [{'params': [p for name, p in trainable if name in decayed], 'weight_decay': weight_decay},
            {'params': [p for name, p in trainable if name not in decayed], 'weight_decay': 0.0}]
