"""AIToolbox's ``nlp`` package on today's libraries: text helpers, a vocabulary, a question-answering collate
function, the text metrics (ROUGE, BLEU, exact match and F1, perplexity, GLUE, XNLI, attention heat maps) and the
result packages of question answering, summarisation, machine translation, GLUE and XNLI.

The metrics compute with optional packages (``pip install "aitoolbox_like[nlp]"``: rouge-score, nltk, sacrebleu,
scikit-learn, scipy, matplotlib), imported when a metric first runs; a missing one raises an ImportError
that names the install. AIToolbox's module paths (``aitoolbox.nlp.core.vocabulary``,
``aitoolbox.nlp.experiment_evaluation.NLP_metrics``, ...) are served by :mod:`aitoolbox_like.compat`.
"""
from .collate import qa_concat_ctx_span_collate_fn
from .metrics import (AttentionHeatMap, BLEUCorpusScoreMetric, BLEUScoreStrTorchNLPMetric, BLEUSentenceScoreMetric,
                      ExactMatchTextMetric, F1TextMetric, GLUEMetric, PerplexityMetric, ROUGEMetric, ROUGEPerlMetric,
                      XNLIMetric, glue_compute_metrics, xnli_compute_metrics)
from .packages import (GLUEResultPackage, MachineTranslationResultPackage, QuestionAnswerResultPackage,
                       QuestionAnswerSpanClassificationResultPackage, TextSummarizationResultPackage,
                       XNLIResultPackage)
from .text import find_sub_list, normalize_string, str2bool, unicode_to_ascii
from .vocabulary import Vocabulary

__all__ = ['Vocabulary', 'unicode_to_ascii', 'normalize_string', 'str2bool', 'find_sub_list',
           'qa_concat_ctx_span_collate_fn', 'ROUGEMetric', 'ROUGEPerlMetric', 'ExactMatchTextMetric', 'F1TextMetric',
           'BLEUSentenceScoreMetric', 'BLEUCorpusScoreMetric', 'BLEUScoreStrTorchNLPMetric', 'PerplexityMetric',
           'GLUEMetric', 'XNLIMetric', 'glue_compute_metrics', 'xnli_compute_metrics', 'AttentionHeatMap',
           'QuestionAnswerResultPackage', 'QuestionAnswerSpanClassificationResultPackage',
           'TextSummarizationResultPackage', 'MachineTranslationResultPackage', 'GLUEResultPackage',
           'XNLIResultPackage']
