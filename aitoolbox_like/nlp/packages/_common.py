"""What the nlp result packages share: rows of token ids as Python lists, flat result dicts, and the folders they
write their texts and plots to inside the experiment folder."""
import os
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from ...experiment.folder import ExperimentFolder


def id_rows(values: Any) -> List[List[int]]:
    """Token id sequences (a list of lists, a 2-D array or tensor, padded or ragged) as lists of Python ints."""
    if hasattr(values, 'detach'):
        values = values.detach().cpu().numpy()
    return [[int(index) for index in np.asarray(row).reshape(-1)] for row in values]


def flatten(nested: Mapping[str, Any], prefix: str = '') -> Dict[str, Any]:
    """``{'ROGUE': {'rouge-1': {'f': 1.0}}}`` -> ``{'ROGUE_rouge-1_f': 1.0}`` (AIToolbox's ``flatten_dict``)."""
    flat: Dict[str, Any] = {}
    for key, value in nested.items():
        name = f'{prefix}_{key}' if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


def inside_experiment(path: Optional[str], project_name: str, experiment_name: str, experiment_timestamp: str,
                      local_model_result_folder_path: str) -> Optional[str]:
    """A relative output folder placed inside the experiment's folder (an absolute one stays where it is)."""
    if path is None:
        return None
    _, experiment_dir = ExperimentFolder.get_base_folder_paths(project_name, experiment_name, experiment_timestamp,
                                                               local_model_result_folder_path)
    return os.path.join(experiment_dir, path)
