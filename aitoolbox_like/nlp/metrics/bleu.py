"""BLEU (AIToolbox's ``BLEUSentenceScoreMetric``, ``BLEUCorpusScoreMetric`` and ``BLEUScoreStrTorchNLPMetric``).

The sentence and corpus scores are nltk's ``sentence_bleu`` / ``corpus_bleu`` with their defaults (uniform 1- to
4-gram weights, no smoothing), on a 0-1 scale, as in AIToolbox. The third, which AIToolbox computed by downloading
Moses' ``multi-bleu.perl`` through pytorch-nlp (both unmaintained), is sacrebleu's BLEU with Moses' settings (the
tokens as given, no smoothing), per sentence, on a 0-100 scale. Two repairs: AIToolbox handed the true sentence to
the script as the hypothesis and the prediction as the reference, and kept only the two decimals the script prints;
here the prediction is the hypothesis and the score keeps its precision.
"""
import os
from typing import Any, List, Optional, Sequence

import numpy as np

from ...results.metrics import AbstractBaseMetric
from .._requires import require
from .text_dump import fresh_folder

__all__ = ['BLEUSentenceScoreMetric', 'BLEUCorpusScoreMetric', 'BLEUScoreStrTorchNLPMetric']


def check_transl_sent_num_match(sent_types: Sequence[Sequence[Any]]) -> None:
    """Raise ValueError unless all the lists have the same length (one entry per sentence)."""
    lengths = [len(sentences) for sentences in sent_types]
    if len(set(lengths)) > 1:
        raise ValueError(f'The lists of sentences differ in length ({", ".join(map(str, lengths))}): pass one '
                         f'predicted sentence per true sentence (and per source sentence).')


def dump_translation_text_to_disk(source_sents: Sequence[Any], pred_translations: Sequence[str],
                                  true_translations: Sequence[str], sentence_bleu_results: Sequence[Any],
                                  output_text_dir: str) -> None:
    """One file per sentence, ``transl_<i>.txt``: its source, predicted and true translation and its BLEU."""
    check_transl_sent_num_match([pred_translations, true_translations, source_sents, sentence_bleu_results])
    fresh_folder(output_text_dir)
    for i, (source, pred, true, bleu) in enumerate(zip(source_sents, pred_translations, true_translations,
                                                       sentence_bleu_results)):
        with open(os.path.join(output_text_dir, f'transl_{i}.txt'), 'w', encoding='utf-8') as file:
            file.write(f'Source:\t{source}\nPredicted:\t{pred}\nTrue:\t{true}\nBLEU: {bleu}\n')


def _joined(sentences: Sequence[Sequence[Any]]) -> List[str]:
    return [' '.join(map(str, sentence)) for sentence in sentences]


class _TranslationMetric(AbstractBaseMetric):
    def __init__(self, y_true: Sequence[Sequence[str]], y_predicted: Sequence[Sequence[str]], metric_name: str,
                 source_sents: Optional[Sequence[Any]], output_text_dir: Optional[str]) -> None:
        if output_text_dir is not None and source_sents is None:
            raise ValueError('output_text_dir is given but source_sents is None: writing the translations to disk '
                             'needs the source sentences too.')
        self.output_text_dir = output_text_dir
        self.source_sents = source_sents
        super().__init__(y_true, y_predicted, metric_name=metric_name, np_array=False)

    def _dump(self, scores: Sequence[Any]) -> None:
        if self.output_text_dir is not None and self.source_sents is not None:
            dump_translation_text_to_disk(self.source_sents, _joined(self.y_predicted), _joined(self.y_true), scores,
                                          self.output_text_dir)

    @staticmethod
    def check_transl_sent_num_match(sent_types: Sequence[Sequence[Any]]) -> None:
        """Raise ValueError unless all the lists have the same length"""
        check_transl_sent_num_match(sent_types)

    @staticmethod
    def dump_translation_text_to_disk(source_sents: Sequence[Any], pred_translations: Sequence[str],
                                      true_translations: Sequence[str], sentence_bleu_results: Sequence[Any],
                                      output_text_dir: str) -> None:
        """Write each sentence's source, predicted and true translation and BLEU to ``transl_<i>.txt``"""
        dump_translation_text_to_disk(source_sents, pred_translations, true_translations, sentence_bleu_results,
                                      output_text_dir)


class BLEUSentenceScoreMetric(_TranslationMetric):
    """Mean of nltk's ``sentence_bleu`` of each predicted sentence against its true sentence (0-1)."""

    def __init__(self, y_true: Sequence[Sequence[str]], y_predicted: Sequence[Sequence[str]],
                 source_sents: Optional[Sequence[Any]] = None, output_text_dir: Optional[str] = None) -> None:
        """Mean sentence-level BLEU

        Args:
            y_true (list): the true sentences, as token lists
            y_predicted (list): the predicted sentences, as token lists
            source_sents (list or None): the source sentences (needed with ``output_text_dir``)
            output_text_dir (str or None): also write each sentence and its score there

        Raises:
            ValueError: the lists differ in length, or ``output_text_dir`` without ``source_sents``
        """
        super().__init__(y_true, y_predicted, 'BLEU_sentence_score', source_sents, output_text_dir)

    def calculate_metric(self) -> float:
        check_transl_sent_num_match([self.y_true, self.y_predicted])
        bleu_score = require('nltk.translate.bleu_score', 'nltk', 'BLEUSentenceScoreMetric')
        scores = [bleu_score.sentence_bleu([list(true)], list(pred)) for true, pred in zip(self.y_true,
                                                                                            self.y_predicted)]
        self._dump(scores)
        return float(np.mean(scores))


class BLEUCorpusScoreMetric(_TranslationMetric):
    """nltk's ``corpus_bleu`` of the predicted sentences, one true sentence each (0-1)."""

    def __init__(self, y_true: Sequence[Sequence[str]], y_predicted: Sequence[Sequence[str]],
                 source_sents: Optional[Sequence[Any]] = None, output_text_dir: Optional[str] = None) -> None:
        """Corpus-level BLEU

        Args:
            y_true (list): the true sentences, as token lists
            y_predicted (list): the predicted sentences, as token lists
            source_sents (list or None): the source sentences (needed with ``output_text_dir``)
            output_text_dir (str or None): also write each sentence there

        Raises:
            ValueError: the lists differ in length, or ``output_text_dir`` without ``source_sents``
        """
        super().__init__(y_true, y_predicted, 'BLEU_corpus_score', source_sents, output_text_dir)

    def calculate_metric(self) -> float:
        check_transl_sent_num_match([self.y_true, self.y_predicted])
        bleu_score = require('nltk.translate.bleu_score', 'nltk', 'BLEUCorpusScoreMetric')
        self._dump(['na'] * len(self.y_predicted))
        return float(bleu_score.corpus_bleu([[list(true)] for true in self.y_true],
                                            [list(pred) for pred in self.y_predicted]))


class BLEUScoreStrTorchNLPMetric(_TranslationMetric):
    """Mean per-sentence BLEU with Moses' ``multi-bleu.perl`` settings, computed by sacrebleu (0-100)."""

    def __init__(self, y_true: Sequence[Sequence[str]], y_predicted: Sequence[Sequence[str]], lowercase: bool = False,
                 source_sents: Optional[Sequence[Any]] = None, output_text_dir: Optional[str] = None) -> None:
        """Mean sentence BLEU as Moses' multi-bleu.perl scores it (sacrebleu: tokens as given, no smoothing)

        Args:
            y_true (list): the true sentences, as token lists
            y_predicted (list): the predicted sentences, as token lists
            lowercase (bool): compare lower-cased (multi-bleu.perl's ``-lc``)
            source_sents (list or None): the source sentences (needed with ``output_text_dir``)
            output_text_dir (str or None): also write each sentence and its score there

        Raises:
            ValueError: the lists differ in length, or ``output_text_dir`` without ``source_sents``
        """
        self.lowercase = lowercase
        super().__init__(y_true, y_predicted, 'BLEU_str_torchNLP_score', source_sents, output_text_dir)

    def calculate_metric(self) -> float:
        check_transl_sent_num_match([self.y_true, self.y_predicted])
        sacrebleu = require('sacrebleu.metrics', 'sacrebleu', 'BLEUScoreStrTorchNLPMetric')
        bleu = sacrebleu.BLEU(tokenize='none', smooth_method='none', lowercase=self.lowercase, force=True)
        scores = [bleu.corpus_score([pred], [[true]]).score
                  for true, pred in zip(_joined(self.y_true), _joined(self.y_predicted))]
        self._dump(scores)
        return float(np.mean(scores))
