"""Exact match and F1 of question answering (AIToolbox's ``ExactMatchTextMetric`` and ``F1TextMetric``): the answer
normalisation and token F1 of the official SQuAD 2.0 evaluation, in percent."""
import re
import string
from collections import Counter
from typing import Any, List, Optional, Sequence

from ...results.metrics import AbstractBaseMetric
from .text_dump import dump_answer_text_to_disk

__all__ = ['normalize_answer', 'answer_tokens', 'token_f1', 'ExactMatchTextMetric', 'F1TextMetric']

_ARTICLES = re.compile(r'\b(a|an|the)\b', re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, punctuation removed, the articles a/an/the removed, whitespace collapsed (SQuAD's rule)."""
    text = ''.join(char for char in text.lower() if char not in _PUNCTUATION)
    return ' '.join(_ARTICLES.sub(' ', text).split())


def answer_tokens(text: str) -> List[str]:
    """The words of the normalised answer."""
    return normalize_answer(text).split() if text else []


def token_f1(gold: str, prediction: str) -> float:
    """SQuAD's F1 of the words two answers share; two empty answers score 1, one empty answer 0."""
    gold_tokens, pred_tokens = answer_tokens(gold), answer_tokens(prediction)
    if not gold_tokens or not pred_tokens:
        return float(gold_tokens == pred_tokens)
    shared = sum((Counter(gold_tokens) & Counter(pred_tokens)).values())
    if shared == 0:
        return 0.0
    precision = shared / len(pred_tokens)
    recall = shared / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


class _AnswerTextMetric(AbstractBaseMetric):
    def __init__(self, y_true: Sequence[Any], y_predicted: Sequence[Sequence[str]], metric_name: str,
                 target_actual_text: bool, output_text_dir: Optional[str]) -> None:
        if len(y_true) != len(y_predicted):
            raise ValueError(f'len(y_true) != len(y_predicted): {len(y_true)} true answers, {len(y_predicted)} '
                             f'predicted; pass one predicted answer per question.')
        self.target_actual_text = target_actual_text
        self.output_text_dir = output_text_dir
        super().__init__(y_true, y_predicted, metric_name=metric_name, np_array=False)

    def _answer_pairs(self) -> List[Any]:
        if self.output_text_dir is not None:     # for reading only; the metric does not read it back
            dump_answer_text_to_disk(self.y_true, self.y_predicted, self.output_text_dir, [], self.target_actual_text)
        if not self.target_actual_text:
            self.y_true = [' '.join(map(str, answer)) for answer in self.y_true]
        self.y_predicted = [' '.join(map(str, answer)) for answer in self.y_predicted]
        return list(zip(self.y_predicted, self.y_true))


class ExactMatchTextMetric(_AnswerTextMetric):
    """Percentage of predicted answers equal to the true answer after SQuAD's normalisation."""

    def __init__(self, y_true: Sequence[Any], y_predicted: Sequence[Sequence[str]], target_actual_text: bool = False,
                 output_text_dir: Optional[str] = None) -> None:
        """Exact match of answered strings

        Args:
            y_true (list): the true answers, as token lists (or strings when ``target_actual_text``)
            y_predicted (list): the predicted answers, as token lists
            target_actual_text (bool): ``y_true`` holds strings rather than token lists
            output_text_dir (str or None): also write the answers there, one file per question

        Raises:
            ValueError: ``y_true`` and ``y_predicted`` differ in length
        """
        super().__init__(y_true, y_predicted, 'EM', target_actual_text, output_text_dir)

    def calculate_metric(self) -> float:
        pairs = self._answer_pairs()
        matches = sum(normalize_answer(pred) == normalize_answer(true) for pred, true in pairs)
        return 100. * matches / len(pairs)

    @staticmethod
    def normalize_answer(text_str: str) -> str:
        """Lower case, no punctuation, no articles, single spaces"""
        return normalize_answer(text_str)


class F1TextMetric(_AnswerTextMetric):
    """Mean SQuAD token F1 of the predicted answers, in percent."""

    def __init__(self, y_true: Sequence[Any], y_predicted: Sequence[Sequence[str]], target_actual_text: bool = False,
                 output_text_dir: Optional[str] = None) -> None:
        """F1 score of answered strings

        Args:
            y_true (list): the true answers, as token lists (or strings when ``target_actual_text``)
            y_predicted (list): the predicted answers, as token lists
            target_actual_text (bool): ``y_true`` holds strings rather than token lists
            output_text_dir (str or None): also write the answers there, one file per question

        Raises:
            ValueError: ``y_true`` and ``y_predicted`` differ in length
        """
        super().__init__(y_true, y_predicted, 'F1', target_actual_text, output_text_dir)

    def calculate_metric(self) -> float:
        pairs = self._answer_pairs()
        return 100. * sum(token_f1(true, pred) for pred, true in pairs) / len(pairs)

    @staticmethod
    def compute_f1(a_gold: str, a_pred: str) -> float:
        """SQuAD's token F1 of one answer"""
        return token_f1(a_gold, a_pred)

    @staticmethod
    def get_tokens(s: str) -> List[str]:
        """The words of the normalised answer"""
        return answer_tokens(s)
