"""Paths of the experiment folder (AIToolbox's ``local_save.folder_create``).

A module of its own so that both the savers and the reporters can use it without importing each other (the
results saver draws the training-history plots with :mod:`.reporting`, which names experiment folders too).
"""
from __future__ import annotations

import os
from typing import Tuple

from ..storage.base import validate_key_part


class ExperimentFolder:
    """Paths of the experiment folder ``<local_model_result_folder_path>/<project>/<experiment>_<timestamp>``."""

    @staticmethod
    def get_base_folder_paths(project_name: str, experiment_name: str, experiment_timestamp: str,
                              local_model_result_folder_path: str) -> Tuple[str, str]:
        """``(project folder, experiment folder)`` paths; nothing is created. The names must be plain names
        (no path separators, not '..'), so the folders stay inside ``local_model_result_folder_path``."""
        root = os.path.abspath(os.path.expanduser(os.fspath(local_model_result_folder_path)))
        # AIToolbox joined the paths, so the project folder's own path (already inside the root) worked as a name
        if os.path.isabs(project_name) and os.path.dirname(os.path.normpath(project_name)) == root:
            project_name = os.path.basename(os.path.normpath(project_name))
        validate_key_part(project_name, 'project_name')
        validate_key_part(experiment_name, 'experiment_name')
        validate_key_part(f'{experiment_name}_{experiment_timestamp}', 'experiment_timestamp')
        project_dir = os.path.join(root, project_name)
        return project_dir, os.path.join(project_dir, f'{experiment_name}_{experiment_timestamp}')

    @staticmethod
    def create_base_folder(project_name: str, experiment_name: str, experiment_timestamp: str,
                           local_model_result_folder_path: str) -> str:
        """Create the experiment folder (and its parents) if missing; returns its path."""
        _, experiment_dir = ExperimentFolder.get_base_folder_paths(project_name, experiment_name,
                                                                    experiment_timestamp,
                                                                    local_model_result_folder_path)
        os.makedirs(experiment_dir, exist_ok=True)
        return experiment_dir
