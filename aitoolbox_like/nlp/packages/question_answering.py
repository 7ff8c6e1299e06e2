"""Result packages of extractive question answering (AIToolbox's ``QuestionAnswerResultPackage`` and
``QuestionAnswerSpanClassificationResultPackage``). Targets and predictions are answer spans: one row
``(start token, end token)`` (inclusive) per question."""
import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ...results.abstract import AbstractResultPackage
from ...results.metrics import AccuracyMetric
from ..metrics.rouge import ROUGEMetric, ROUGEPerlMetric
from ..metrics.squad import ExactMatchTextMetric, F1TextMetric
from ._common import flatten, inside_experiment

__all__ = ['QuestionAnswerResultPackage', 'QuestionAnswerSpanClassificationResultPackage']


def _spans(values: Any, name: str) -> np.ndarray:
    spans = np.asarray(values)
    if spans.ndim != 2 or spans.shape[1] != 2:
        raise ValueError(f'{name} has shape {spans.shape}: pass one (start, end) token span per question, '
                         f'shape (n_questions, 2).')
    return spans.astype(int)


class QuestionAnswerResultPackage(AbstractResultPackage):
    """ROUGE, exact match and F1 of the answers cut out of the paragraphs by the predicted spans."""

    def __init__(self, paragraph_text_tokens: Sequence[Sequence[Any]],
                 target_actual_text: Optional[Sequence[str]] = None, output_text_dir: Optional[str] = None,
                 use_perl_rouge: bool = False, flatten_result_dict: bool = False, strict_content_check: bool = False,
                 **kwargs: Any) -> None:
        """Question answering task performance evaluation result package

        Results: ``ROGUE`` (AIToolbox's spelling; ``{'rouge-1': {'f', 'p', 'r'}, 'rouge-2': ..., 'rouge-l': ...}``),
        ``EM`` and ``F1`` (percent); with ``flatten_result_dict`` one level: ``ROGUE_rouge-1_f``, ..., ``EM``, ``F1``.

        Args:
            paragraph_text_tokens (list): each question's paragraph, as tokens (converted with ``str``)
            target_actual_text (list or None): the true answers as strings; None cuts them out of the paragraphs
                with the true spans
            output_text_dir (str or None): write the answers there (inside the experiment folder when the package
                belongs to a tracked experiment; zipped with its results)
            use_perl_rouge (bool): ROUGE from the Perl ROUGE-1.5.5 script (:class:`ROUGEPerlMetric`, needs
                ``output_text_dir``) instead of rouge-score
            flatten_result_dict (bool): flatten the nested ROUGE results into one level
            strict_content_check (bool): raise instead of warning on content problems
            **kwargs: package metadata

        Raises:
            ValueError: ``use_perl_rouge`` without ``output_text_dir``, or ``target_actual_text`` of another length
                than ``paragraph_text_tokens``
        """
        if use_perl_rouge and output_text_dir is None:
            raise ValueError('use_perl_rouge=True needs output_text_dir: the Perl ROUGE script reads the answers '
                             'from files written there.')
        if target_actual_text is not None and len(paragraph_text_tokens) != len(target_actual_text):
            raise ValueError(f'target_actual_text has {len(target_actual_text)} answers but paragraph_text_tokens '
                             f'{len(paragraph_text_tokens)} paragraphs: pass one of each per question.')
        super().__init__(pkg_name='QuestionAnswerResult', strict_content_check=strict_content_check, **kwargs)
        self.paragraph_text_tokens: List[List[str]] = [[str(word) for word in paragraph]
                                                        for paragraph in paragraph_text_tokens]
        self.target_actual_text = target_actual_text
        self.use_target_actual_text = target_actual_text is not None
        self.output_text_dir = os.path.expanduser(output_text_dir) if output_text_dir else None
        self.use_perl_rouge = use_perl_rouge
        self.flatten_result_dict = flatten_result_dict

    def _answers(self, spans: np.ndarray) -> List[List[str]]:
        return [paragraph[start:end + 1] for (start, end), paragraph in zip(spans, self.paragraph_text_tokens)]

    def prepare_results_dict(self) -> Dict[str, Any]:
        pred_text = self._answers(_spans(self.y_predicted, 'y_predicted'))
        true_text: Sequence[Any]
        if self.target_actual_text is not None:
            true_text = list(self.target_actual_text)
        else:
            true_text = self._answers(_spans(self.y_true, 'y_true'))
        if self.use_perl_rouge:
            assert self.output_text_dir is not None
            rouge: Any = ROUGEPerlMetric(true_text, pred_text, self.output_text_dir,
                                         target_actual_text=self.use_target_actual_text)
        else:
            rouge = ROUGEMetric(true_text, pred_text, target_actual_text=self.use_target_actual_text,
                                output_text_dir=self.output_text_dir)
        exact_match = ExactMatchTextMetric(true_text, pred_text, target_actual_text=self.use_target_actual_text)
        f1 = F1TextMetric(true_text, pred_text, target_actual_text=self.use_target_actual_text)
        results = {**rouge.get_metric_dict(), **exact_match.get_metric_dict(), **f1.get_metric_dict()}
        return flatten(results) if self.flatten_result_dict else results

    def set_experiment_dir_path_for_additional_results(self, project_name: str, experiment_name: str,
                                                       experiment_timestamp: str,
                                                       local_model_result_folder_path: str) -> None:
        self.output_text_dir = inside_experiment(self.output_text_dir, project_name, experiment_name,
                                                 experiment_timestamp, local_model_result_folder_path)

    def list_additional_results_dump_paths(self) -> Optional[List[List[str]]]:
        if self.output_text_dir is None or not os.path.isdir(self.output_text_dir):
            return None
        zip_path = self.zip_additional_results_dump(self.output_text_dir, self.output_text_dir)
        return [[os.path.basename(zip_path), zip_path]]


class QuestionAnswerSpanClassificationResultPackage(AbstractResultPackage):
    """Accuracy of the predicted answer start and end tokens: ``Accuracy_span_start``, ``Accuracy_span_end``."""

    def __init__(self, strict_content_check: bool = False, **kwargs: Any) -> None:
        """Extractive question answering span classification result package

        Args:
            strict_content_check (bool): raise instead of warning on content problems
            **kwargs: package metadata
        """
        super().__init__(pkg_name='QuestionAnswerSpanClassificationResult',
                         strict_content_check=strict_content_check, **kwargs)

    def prepare_results_dict(self) -> Dict[str, Any]:
        true_spans = _spans(self.y_true, 'y_true')
        pred_spans = _spans(self.y_predicted, 'y_predicted')
        start = AccuracyMetric(true_spans[:, 0], pred_spans[:, 0], positive_class_thresh=None)
        end = AccuracyMetric(true_spans[:, 1], pred_spans[:, 1], positive_class_thresh=None)
        return {f'{start.metric_name}_span_start': start.get_metric(),
                f'{end.metric_name}_span_end': end.get_metric()}
