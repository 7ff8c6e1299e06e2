"""The text metrics of AIToolbox's ``aitoolbox.nlp.experiment_evaluation.NLP_metrics`` and its attention heat map,
computed with maintained packages (the ``nlp`` extra: ``pip install "aitoolbox_like[nlp]"``)."""
from .attention_heatmap import AttentionHeatMap
from .bleu import BLEUCorpusScoreMetric, BLEUScoreStrTorchNLPMetric, BLEUSentenceScoreMetric
from .glue import GLUEMetric, XNLIMetric, glue_compute_metrics, xnli_compute_metrics
from .perplexity import PerplexityMetric
from .rouge import ROUGEMetric, ROUGEPerlMetric
from .squad import ExactMatchTextMetric, F1TextMetric

__all__ = ['ROUGEMetric', 'ROUGEPerlMetric', 'ExactMatchTextMetric', 'F1TextMetric', 'BLEUSentenceScoreMetric',
           'BLEUCorpusScoreMetric', 'BLEUScoreStrTorchNLPMetric', 'PerplexityMetric', 'GLUEMetric', 'XNLIMetric',
           'glue_compute_metrics', 'xnli_compute_metrics', 'AttentionHeatMap']
