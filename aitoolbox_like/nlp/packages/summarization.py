"""Result package of text summarisation (AIToolbox's ``TextSummarizationResultPackage``, which raised
NotImplementedError): ROUGE-1, ROUGE-2 and ROUGE-L of the predicted summaries."""
from typing import Any, Dict, List, Optional

from ...results.abstract import AbstractResultPackage
from ..metrics.rouge import ROUGEMetric
from ..vocabulary import Vocabulary
from ._common import flatten, id_rows

__all__ = ['TextSummarizationResultPackage']


class TextSummarizationResultPackage(AbstractResultPackage):
    """Mean ROUGE F-score, precision and recall of the summaries, one level deep: ``ROGUE_rouge-1_f``, ...,
    ``ROGUE_rouge-l_r``."""

    def __init__(self, strict_content_check: bool = False, target_vocab: Optional[Vocabulary] = None,
                 use_stemmer: bool = False, **kwargs: Any) -> None:
        """Text summarisation task performance evaluation package

        Targets and predictions are summaries as token lists, or as token ids when ``target_vocab`` is given
        (the reserved tokens, padding included, are dropped).

        Args:
            strict_content_check (bool): raise instead of warning on content problems
            target_vocab (Vocabulary or None): turns token ids back into words
            use_stemmer (bool): Porter-stem the words before matching (ROUGE-1.5.5's ``-m``)
            **kwargs: package metadata
        """
        super().__init__(pkg_name='TextSummarizationResult', strict_content_check=strict_content_check,
                         np_array=False, **kwargs)
        self.target_vocab = target_vocab
        self.use_stemmer = use_stemmer

    def _texts(self, values: Any) -> List[List[str]]:
        if self.target_vocab is None:
            return [[str(token) for token in summary] for summary in values]
        return [self.target_vocab.convert_idx_sent2sent(row, rm_default_tokens=True) for row in id_rows(values)]

    def prepare_results_dict(self) -> Dict[str, Any]:
        rouge = ROUGEMetric(self._texts(self.y_true), self._texts(self.y_predicted), use_stemmer=self.use_stemmer)
        return flatten(rouge.get_metric_dict())
