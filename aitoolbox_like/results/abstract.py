"""Base classes of the result packages.

A result package turns ground-truth targets and model predictions into a flat dict of
``metric_name -> value``. The values are plain Python numbers (or lists / dicts of them), so
the dict can go straight into a training history and be written out as JSON.

Life cycle::

    pkg = SomeResultPackage()
    pkg.prepare_result_package(y_true, y_predicted, hyperparameters=args)
    pkg.get_results()        # metrics computed here on the first call, then cached
    pkg.get_results()        # cached dict (a fresh copy each call)

Calling ``prepare_result_package()`` again (next epoch) drops the cached results.

Compared with AIToolbox 1.8.0 the following are fixed:

* ``get_hyperparameters()`` crashed with ``TypeError`` when no hyperparameters were given;
* warnings were ``print``-ed; they are now :class:`UserWarning` (or ``ValueError`` with
  ``strict_content_check=True``);
* ``np_array='auto'`` crashed on a 1-D list of numbers and on ragged input;
* numpy scalars leaked into the results dict (not JSON-serialisable); values are now plain Python;
* ``str(pkg)`` raised before the package was prepared;
* ``MultipleResultPackageWrapper.get_additional_results_dump_paths()`` grew the sub-package path
  list on every call.

As in AIToolbox, ``pkg_a + pkg_b`` nests each package's results under its name (a
:class:`MultipleResultPackageWrapper`), and adding anything but a package or a dict raises
:class:`ResultPackageAdditionError`, both a ``ValueError`` (AIToolbox's) and a ``TypeError``.

The conversions of targets, predictions and results live in :mod:`.conversion`.
"""
from __future__ import annotations

import copy
import numbers
import os
import shutil
import warnings
from abc import ABC, abstractmethod
from typing import Any, Dict, List, Optional, Sequence, Union, cast

# is_torch_tensor, to_numpy, to_python, check_targets_and_predictions: importable from here, where they were defined.
from .conversion import (auto_to_numpy, check_targets_and_predictions, is_torch_tensor, to_numpy,  # noqa: F401
                         to_python)

__all__ = ['AbstractResultPackage', 'PreCalculatedResultPackage', 'MultipleResultPackageWrapper',
           'ResultPackageAdditionError']


class ResultPackageAdditionError(TypeError, ValueError):
    """A result package was added to something that is neither a result package nor a dict. A TypeError, and a
    ValueError as AIToolbox raised there, so either ``except`` catches it."""


def _addition_error(other: object) -> ResultPackageAdditionError:
    return ResultPackageAdditionError(f'Addition is supported between result packages and dicts; '
                                      f'got {type(other).__name__}.')


class AbstractResultPackage(ABC):
    """Turns targets and predictions into a ``{metric_name: value}`` dict (see ``__init__`` and the module)."""

    def __init__(self, pkg_name: Optional[str] = None, strict_content_check: bool = False,
                 np_array: Union[bool, str] = True, **kwargs: Any) -> None:
        """Base result package from which the specific result packages are derived

        Override in a subclass:
            - ``prepare_results_dict()`` (required): compute the metrics from ``self.y_true`` /
              ``self.y_predicted`` and return ``{metric_name: value}``
            - ``list_additional_results_dump_paths()`` (optional)
            - ``set_experiment_dir_path_for_additional_results()`` (optional)

        Args:
            pkg_name (str or None): result package name, used for clarity and to prefix clashing metric
                names when packages are combined with ``+``
            strict_content_check (bool): on a content problem (missing / empty results, missing
                hyperparameters) raise ``ValueError`` instead of issuing a ``UserWarning``
            np_array (bool or str): ``True``: convert y_true / y_predicted (lists, numpy arrays, torch
                tensors on any device) to numpy arrays; ``False``: keep them as given; ``'auto'``: convert
                only when they form a regular (non-ragged) array
            **kwargs: additional package metadata, kept in ``self.package_metadata``
        """
        if not (np_array is True or np_array is False or np_array == 'auto'):
            raise ValueError(f"np_array must be True, False or 'auto'; got {np_array!r}.")
        self.pkg_name = pkg_name
        self.strict_content_check = strict_content_check
        self.np_array = np_array

        self.y_true: Any = None
        self.y_predicted: Any = None
        self.additional_results: Optional[Dict[str, Any]] = None
        self.additional_results_dump_paths: Optional[List[List[str]]] = None
        self._results_pending = False
        self.results_dict = None

        self.requires_loss = False

        self.hyperparameters: Any = None   # a dict, or None when not given
        self.package_metadata = kwargs

    # --- results cache ------------------------------------------------------------------------

    @property
    def results_dict(self) -> Optional[Dict[str, Any]]:
        """Computed results (computed on first access after ``prepare_result_package()``), or None"""
        if self.__dict__.get('_results_pending', False):
            self._compute_results()
        return self.__dict__.get('_results_dict')

    @results_dict.setter
    def results_dict(self, value: Optional[Dict[str, Any]]) -> None:
        self._results_dict = value
        self._results_pending = False

    def _compute_results(self) -> None:
        # not pending while computing, so a prepare_results_dict() that reads self.results_dict does not recurse
        self._results_pending = False
        try:
            results = self.prepare_results_dict()
        except BaseException:
            self._results_pending = True  # retried on the next access
            raise
        if not isinstance(results, dict):
            raise TypeError(f'{type(self).__name__}.prepare_results_dict() returned {type(results).__name__}; '
                            f'it must return a dict of metric_name -> value.')
        self._results_dict = to_python(results)
        self._results_pending = False
        if len(self._results_dict) == 0:
            self.warn_about_result_data_problem(
                f'{type(self).__name__} produced an empty results dict: check that its metrics list is not empty.')

    @abstractmethod
    def prepare_results_dict(self) -> Dict[str, Any]:
        """Calculate the metrics of this package

        Use ``self.y_true`` and ``self.y_predicted`` (and ``self.additional_results``). To combine several
        metrics return ``{**metric_dict_1, **metric_dict_2}`` (or ``metric_1 + metric_2`` for
        :class:`~aitoolbox_like.results.metrics.AbstractBaseMetric` objects).

        Returns:
            dict: metric_name -> value
        """

    def import_dependencies(self) -> None:
        """Import now what computing the results will need, ahead of the first evaluation. ModelPerformanceEvaluation
        calls it when a fit starts, so that a slow import (scikit-learn with SciPy take seconds) does not land in
        the middle of training. Nothing by default; a package whose metrics import a library on first use imports
        it here."""

    def prepare_result_package(self, y_true: Any, y_predicted: Any, hyperparameters: Optional[Dict[str, Any]] = None,
                               **kwargs: Any) -> None:
        """Give the package the targets and predictions to evaluate

        The metrics are computed lazily by the next ``get_results()`` (or any access to the results).

        Args:
            y_true (numpy.ndarray or list or torch.Tensor): ground truth targets
            y_predicted (numpy.ndarray or list or torch.Tensor): predicted targets
            hyperparameters (dict or None): the experiment's hyperparameters
            **kwargs: additional results for the result package, kept in ``self.additional_results``

        Raises:
            ValueError: when y_true / y_predicted are missing, empty or of different lengths
        """
        if self.np_array is True:
            y_true = to_numpy(y_true, 'y_true')
            y_predicted = to_numpy(y_predicted, 'y_predicted')
        elif self.np_array == 'auto':
            y_true = auto_to_numpy(y_true)
            y_predicted = auto_to_numpy(y_predicted)
        self._check_targets_and_predictions(y_true, y_predicted)

        self.y_true = y_true
        self.y_predicted = y_predicted
        self.hyperparameters = hyperparameters
        self.additional_results = kwargs
        self._results_dict = None
        self._results_pending = True

    def _check_targets_and_predictions(self, y_true: Any, y_predicted: Any) -> None:
        """Raise ValueError for targets / predictions that no metric can evaluate (missing, scalar, empty or of
        different lengths); called by :meth:`prepare_result_package`. A package whose metric takes anything may
        override it."""
        check_targets_and_predictions(y_true, y_predicted)

    @staticmethod
    def auto_y_input_array_convert(y_array: Any) -> Any:
        """Convert to numpy array when the input is regular, otherwise return it unchanged (np_array='auto')"""
        return auto_to_numpy(y_array)

    def get_results(self) -> Optional[Dict[str, Any]]:
        """Get the results dict, computing it on the first call after ``prepare_result_package()``

        Returns:
            dict or None: a copy of ``{metric_name: value}`` with plain Python values; None (after a
            warning) when the package has not been prepared yet
        """
        results = self.results_dict
        if results is None:
            self.warn_about_result_data_problem(
                f'Results dict missing in {type(self).__name__}: call prepare_result_package(y_true, y_predicted) '
                f'before get_results().')
            return None
        return dict(results)

    def get_hyperparameters(self) -> Any:
        """Get the hyperparameters given to ``prepare_result_package()`` (after a quality check)

        Returns:
            dict or None: hyperparameters
        """
        self.qa_check_hyperparameters_dict()
        return self.hyperparameters

    def get_additional_results_dump_paths(self) -> Optional[List[List[str]]]:
        """Paths of additional result files produced by the package (e.g. plots)

        Returns:
            list or None: ``[[results_file_name, results_file_local_path], ...]`` or None
        """
        self.additional_results_dump_paths = self.list_additional_results_dump_paths()
        self.qa_check_additional_results_dump_paths()
        return self.additional_results_dump_paths

    def list_additional_results_dump_paths(self) -> Optional[List[List[str]]]:
        """Override to list the additional files to save with the experiment

        Returns:
            list or None: ``[[results_file_name, results_file_local_path], ...]``; None by default
        """
        return None

    def set_experiment_dir_path_for_additional_results(self, project_name: str, experiment_name: str,
                                                       experiment_timestamp: str,
                                                       local_model_result_folder_path: str) -> None:
        """Override to place additional result outputs inside the experiment folder (does nothing by default)

        Args:
            project_name (str): root name of the project
            experiment_name (str): name of the particular experiment
            experiment_timestamp (str): time stamp at the start of training
            local_model_result_folder_path (str): root local path where the project folder is created
        """

    def qa_check_hyperparameters_dict(self) -> None:
        """Quality check of the hyperparameters (warning, or ValueError under strict_content_check)"""
        if self.hyperparameters is None:
            self.warn_about_result_data_problem(
                'Hyperparameters missing: pass hyperparameters=dict(...) to prepare_result_package().')
            return
        if not isinstance(self.hyperparameters, dict):
            self.warn_about_result_data_problem(
                f'Hyperparameters should be a dict; got {type(self.hyperparameters).__name__}.')
            return
        for key in ('bash_script_path', 'python_experiment_file_path'):
            if self.hyperparameters.get(key) is None:
                self.warn_about_result_data_problem(
                    f'{key} missing from the hyperparameters dict. Potential solution: add it to the model config '
                    f'file and parse it with argparse.')

    def qa_check_additional_results_dump_paths(self) -> None:
        """Check the format of ``self.additional_results_dump_paths``

        Raises:
            ValueError: when it is not a list of ``[file_name, file_path]`` string pairs
        """
        paths = self.additional_results_dump_paths
        if paths is None:
            return
        if not isinstance(paths, list):
            raise ValueError(f'Additional results dump paths must be a list of [file_name, file_path] pairs; '
                             f'got {type(paths).__name__}: {paths}')
        for el in paths:
            if not isinstance(el, (list, tuple)):
                raise ValueError(f'Element inside additional results dump paths is not a list: {el}')
            if len(el) != 2:
                raise ValueError(f'Element of additional results dump paths must be a [file_name, file_path] '
                                 f'pair (length 2): {el}')
            if not all(isinstance(part, (str, os.PathLike)) for part in el):
                raise ValueError(f'Both parts of an additional results dump path element must be strings: {el}')

    def warn_about_result_data_problem(self, msg: str) -> None:
        """Issue a UserWarning, or raise ValueError when ``strict_content_check`` is set

        Raises:
            ValueError: under strict_content_check
        """
        if self.strict_content_check:
            raise ValueError(msg)
        warnings.warn(msg, UserWarning, stacklevel=3)

    @staticmethod
    def zip_additional_results_dump(source_dir_path: str, zip_path: str) -> str:
        """Zip a folder

        Args:
            source_dir_path (str): folder to zip
            zip_path (str): path of the zip file to create, without the ``.zip`` extension

        Returns:
            str: full path of the created zip file (``zip_path + '.zip'``)
        """
        if zip_path.endswith('.zip'):
            zip_path = zip_path[:-len('.zip')]
        return shutil.make_archive(zip_path, 'zip', source_dir_path)

    # --- dunder helpers -----------------------------------------------------------------------

    def warn_if_results_dict_not_defined(self) -> None:
        """Raise ValueError when the package has no results yet"""
        if self.results_dict is None:
            raise ValueError(f'{type(self).__name__} has no results yet: call '
                             f'prepare_result_package(y_true, y_predicted) first.')

    def _defined_results(self) -> Dict[str, Any]:
        self.warn_if_results_dict_not_defined()
        # warn_if_results_dict_not_defined raised if it were None.
        return cast(Dict[str, Any], self.results_dict)

    def __str__(self) -> str:
        results = self.results_dict
        if results is None:
            return f'{self.pkg_name or type(self).__name__}: <results not prepared>'
        return '\n'.join(f'{name}: {value}' for name, value in results.items())

    def __len__(self) -> int:
        return len(self._defined_results())

    def __contains__(self, item: object) -> bool:
        return item in self._defined_results()

    def __getitem__(self, item: str) -> Any:
        results = self._defined_results()
        if item in results:
            return results[item]
        raise KeyError(f'Key {item} can not be found in the results_dict. '
                       f'Currently present keys: {list(results.keys())}')

    def __add__(self, other: Union[AbstractResultPackage, Dict[str, Any]]) -> MultipleResultPackageWrapper:
        """Combine with another evaluated package (or a results dict)

        Returns:
            MultipleResultPackageWrapper: each package's results under its name (see the wrapper)
        """
        return self.add_merge_multi_pkg_wrap(other)

    def __radd__(self, other: Union[AbstractResultPackage, Dict[str, Any], int]) -> AbstractResultPackage:
        # 0 + pkg lets sum([pkg_1, pkg_2, ...]) work
        if isinstance(other, numbers.Number) and not isinstance(other, bool) and other == 0:
            self.warn_if_results_dict_not_defined()
            return copy.deepcopy(self)
        # AIToolbox's order: this package first, then the other (dict + pkg keeps pkg's results first); anything but a
        # package or a dict is refused there (ResultPackageAdditionError)
        return self.add_merge_multi_pkg_wrap(cast(Union[AbstractResultPackage, Dict[str, Any]], other))

    def add_merge_multi_pkg_wrap(self, other_object: Union[AbstractResultPackage, Dict[str, Any]]
                                 ) -> MultipleResultPackageWrapper:
        """Wrap copies of this package and ``other_object`` into a MultipleResultPackageWrapper

        Args:
            other_object (AbstractResultPackage or dict): package or results dict to combine with

        Returns:
            MultipleResultPackageWrapper
        """
        self.warn_if_results_dict_not_defined()
        other_pkgs = self._as_package_list(other_object)
        self_copy = copy.deepcopy(self)
        multi_result_pkg = MultipleResultPackageWrapper(strict_content_check=self.strict_content_check)
        multi_result_pkg.prepare_result_package([self_copy] + other_pkgs, self_copy.hyperparameters)
        return multi_result_pkg

    @classmethod
    def _as_package_list(cls, other_object: Union[AbstractResultPackage, Dict[str, Any]]
                         ) -> List[AbstractResultPackage]:
        other_pkg = cls.create_other_object_pkg(other_object)
        if isinstance(other_pkg, MultipleResultPackageWrapper):
            return list(other_pkg._prepared_packages())
        return [other_pkg]

    @staticmethod
    def create_other_object_pkg(other_object: object) -> AbstractResultPackage:
        """Deep copy of an evaluated package, or a dict wrapped into a PreCalculatedResultPackage

        Raises:
            TypeError: for anything but a result package or a dict
        """
        if isinstance(other_object, AbstractResultPackage):
            other_object.warn_if_results_dict_not_defined()
            return copy.deepcopy(other_object)
        if isinstance(other_object, dict):
            return PreCalculatedResultPackage(copy.deepcopy(other_object))
        raise _addition_error(other_object)

    def __iadd__(self, other: Union[AbstractResultPackage, Dict[str, Any]]) -> AbstractResultPackage:
        """Merge another package's (or a dict's) results into this package's results in place

        Raises:
            ValueError: when a metric name is present in both
        """
        return self.add_merge_dicts(other)

    def add_merge_dicts(self, other: Union[AbstractResultPackage, Dict[str, Any]]) -> AbstractResultPackage:
        """Merge the results of ``other`` (package or dict) into this package's results dict"""
        self.warn_if_results_dict_not_defined()
        if isinstance(other, AbstractResultPackage):
            return self.merge_dicts(other._defined_results())
        if isinstance(other, dict):
            return self.merge_dicts(other)
        raise _addition_error(other)

    def merge_dicts(self, other_results_dict: Dict[str, Any]) -> AbstractResultPackage:
        """Add ``other_results_dict`` to the results dict

        Raises:
            ValueError: when a metric name is present in both (use ``+`` to get prefixed names instead)
        """
        # None (no results yet) fails here with a TypeError, as it always did; add_merge_dicts checks first.
        results = cast(Dict[str, Any], self.results_dict)
        duplicated = [name for name in other_results_dict if name in results]
        if duplicated:
            raise ValueError(f'Duplicated metric results {duplicated} when merging results dicts with '
                             f'{list(results.keys())} and {list(other_results_dict.keys())}. '
                             f'Use pkg_a + pkg_b instead of +=, which prefixes clashing names with the package name.')
        self.results_dict = {**results, **to_python(other_results_dict)}
        return self


class PreCalculatedResultPackage(AbstractResultPackage):
    """A result package around an already computed results dict."""

    def __init__(self, results_dict: Dict[str, Any], strict_content_check: bool = False, **kwargs: Any) -> None:
        """Result package holding an already computed results dict (no evaluation logic)

        Args:
            results_dict (dict): pre-calculated ``{metric_name: value}``
            strict_content_check (bool): raise instead of warn on content problems
            **kwargs: additional package metadata
        """
        if not isinstance(results_dict, dict):
            raise TypeError(f'results_dict must be a dict of metric_name -> value; got {type(results_dict).__name__}.')
        AbstractResultPackage.__init__(self, pkg_name='PreCalculatedResult',
                                       strict_content_check=strict_content_check, **kwargs)
        self.results_dict = to_python(results_dict)
        self.hyperparameters = {}

    def prepare_results_dict(self) -> Dict[str, Any]:
        """The given results dict (a copy)."""
        return dict(self.__dict__.get('_results_dict') or {})


class MultipleResultPackageWrapper(AbstractResultPackage):
    """Several evaluated result packages combined into one (what ``pkg_a + pkg_b`` gives)."""

    def __init__(self, strict_content_check: bool = False, **kwargs: Any) -> None:
        """Combines several evaluated result packages into one

        Its results dict holds each package's results under the package's name, as in AIToolbox:
        ``{'<pkg_name>': {metric: value}, ...}`` (packages without a name are called ``ResultPackage<i>``; a
        repeated package name gets its position appended, e.g. ``ClassificationResult1``).

        Usually built with ``pkg_a + pkg_b``.

        Args:
            strict_content_check (bool): raise instead of warn on content problems
            **kwargs: additional package metadata
        """
        AbstractResultPackage.__init__(self, pkg_name='MultipleResultWrapper',
                                       strict_content_check=strict_content_check, **kwargs)
        self.result_packages: Optional[List[AbstractResultPackage]] = None

    # AIToolbox's API: the wrapper is prepared with packages, not with targets and predictions.
    def prepare_result_package(  # type: ignore[override]
            self, result_packages: Sequence[Union[AbstractResultPackage, Dict[str, Any]]],
            hyperparameters: Optional[Dict[str, Any]] = None, **kwargs: Any) -> None:
        """Set the (already prepared) packages to combine; the combined metrics are computed lazily.

        Args:
            result_packages (list): result packages (AbstractResultPackage objects; dicts are wrapped into
                PreCalculatedResultPackage), each already prepared with its own data
            hyperparameters (dict or None): hyperparameters
            **kwargs: additional results
        """
        if not isinstance(result_packages, (list, tuple)) or len(result_packages) == 0:
            raise ValueError('result_packages must be a non-empty list of result packages.')
        packages: List[AbstractResultPackage] = []
        for pkg in result_packages:
            if isinstance(pkg, dict):
                pkg = PreCalculatedResultPackage(pkg)
            if not isinstance(pkg, AbstractResultPackage):
                raise TypeError(f'result_packages may only contain result packages or dicts; '
                                f'got {type(pkg).__name__}.')
            packages.append(pkg)
        self.result_packages = packages
        self.hyperparameters = hyperparameters
        self.additional_results = kwargs
        self._results_dict = None
        self._results_pending = True

    def import_dependencies(self) -> None:
        """Each combined package's dependencies (once the packages are set)."""
        for package in self.result_packages or []:
            package.import_dependencies()

    def _prepared_packages(self) -> List[AbstractResultPackage]:
        # Set by prepare_result_package, which every caller follows (None fails as it always did).
        return cast(List[AbstractResultPackage], self.result_packages)

    def _package_labels(self) -> List[str]:
        labels: List[str] = []
        for i, pkg in enumerate(self._prepared_packages()):
            label = pkg.pkg_name if pkg.pkg_name is not None else f'ResultPackage{i}'
            if label in labels:
                label = f'{label}{i}'
            labels.append(label)
        return labels

    def prepare_results_dict(self) -> Dict[str, Any]:
        """The packages' results nested under their labels, as AIToolbox gives them:
        ``{'<pkg_name>': {metric: value, ...}, ...}``."""
        results_dict: Dict[str, Any] = {}
        self.y_true, self.y_predicted = {}, {}
        own_additional = self.additional_results
        additional: Dict[Any, Any] = {self.pkg_name: own_additional} if own_additional else {}
        self.additional_results = additional
        for label, pkg in zip(self._package_labels(), self._prepared_packages()):
            results = pkg.get_results()
            results_dict[label] = results if results is not None else {}
            self.y_true[label] = pkg.y_true
            self.y_predicted[label] = pkg.y_predicted
            additional[label] = pkg.additional_results
        return results_dict

    def get_additional_results_dump_paths(self) -> Optional[List[List[str]]]:
        """Own additional paths followed by those of all the wrapped packages

        Returns:
            list or None
        """
        own_paths = self.list_additional_results_dump_paths()
        paths = list(own_paths) if own_paths is not None else []
        for pkg in self.result_packages or []:
            pkg_paths = pkg.get_additional_results_dump_paths()
            if pkg_paths is not None:
                paths += pkg_paths
        self.additional_results_dump_paths = paths if (own_paths is not None or paths) else None
        self.qa_check_additional_results_dump_paths()
        return self.additional_results_dump_paths

    def __str__(self) -> str:
        if not self.result_packages:
            return f'{self.pkg_name}: <results not prepared>'
        # each package under its own name (a repeated name is told apart only in the results dict), as in AIToolbox
        return '\n'.join(f'--> {pkg.pkg_name if pkg.pkg_name is not None else label}:\n{pkg}'
                         for label, pkg in zip(self._package_labels(), self.result_packages))

    def __len__(self) -> int:
        """Number of wrapped result packages"""
        self.warn_if_results_dict_not_defined()
        return len(self._prepared_packages())

    def add_merge_multi_pkg_wrap(self, other_object: Union[AbstractResultPackage, Dict[str, Any]]
                                 ) -> MultipleResultPackageWrapper:
        """A copy of this wrapper with ``other_object`` (package, wrapper or dict) appended to its packages."""
        self.warn_if_results_dict_not_defined()
        other_pkgs = self._as_package_list(other_object)
        self_copy = copy.deepcopy(self)
        self_copy.prepare_result_package(self_copy._prepared_packages() + other_pkgs, self_copy.hyperparameters)
        return self_copy

    def __iadd__(self, other: Union[AbstractResultPackage, Dict[str, Any]]) -> MultipleResultPackageWrapper:
        """Append another package (or dict) to the wrapped packages, in place"""
        self.warn_if_results_dict_not_defined()
        other_pkgs = self._as_package_list(other)
        self.prepare_result_package(self._prepared_packages() + other_pkgs, self.hyperparameters)
        return self
