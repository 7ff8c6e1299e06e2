"""Result package of machine translation (AIToolbox's ``MachineTranslationResultPackage``): corpus and mean sentence
BLEU, perplexity, and optionally the attention heat maps and the translations written out."""
import os
from typing import Any, Dict, List, Optional, Sequence

from ...results.abstract import AbstractResultPackage
from ..metrics.attention_heatmap import AttentionHeatMap
from ..metrics.bleu import BLEUCorpusScoreMetric, BLEUSentenceScoreMetric
from ..metrics.perplexity import PerplexityMetric
from ..vocabulary import Vocabulary
from ._common import id_rows, inside_experiment

__all__ = ['MachineTranslationResultPackage']


class MachineTranslationResultPackage(AbstractResultPackage):
    """``BLEU_corpus_score``, ``BLEU_sentence_score`` (nltk, 0-1) and ``Perplexity`` (of the loss), plus
    ``Attention_HeatMap`` (the PNG paths) when ``output_attn_heatmap_dir`` is given.

    Targets and predictions are token id sequences (a padded tensor, as a ``TTModel.get_predictions`` returns them,
    or lists); the reserved tokens of ``target_vocab`` (padding, start and end markers, OOV) are dropped before
    scoring. The package asks the loop for the loss (``requires_loss``): the evaluation callback and
    ``PyTorchModelPredictor`` put it into ``additional_results``, with the model's prediction metadata.
    """

    def __init__(self, target_vocab: Vocabulary, source_vocab: Optional[Vocabulary] = None,
                 source_sents: Optional[Sequence[Any]] = None, output_text_dir: Optional[str] = None,
                 output_attn_heatmap_dir: Optional[str] = None, strict_content_check: bool = False,
                 **kwargs: Any) -> None:
        """Machine translation task performance evaluation package

        Args:
            target_vocab (Vocabulary): turns the predicted and true token ids into words
            source_vocab (Vocabulary or None): turns the source token ids into words (for the heat maps' axes and
                the written translations)
            source_sents (list or None): the source sentences, written beside their translations
            output_text_dir (str or None): write each translation and its BLEU there (needs ``source_vocab`` and
                ``source_sents``); inside the experiment folder when the package belongs to a tracked experiment
            output_attn_heatmap_dir (str or None): plot each sentence's attention there; the model's
                ``get_predictions`` metadata must then hold ``'attention_matrices'`` (one (target, source) matrix per
                sentence) and ``'source_sent_text'`` (the source token ids)
            strict_content_check (bool): raise instead of warning on content problems
            **kwargs: package metadata

        Raises:
            ValueError: ``output_text_dir`` without ``source_vocab`` and ``source_sents``
        """
        if output_text_dir is not None and (source_vocab is None or source_sents is None):
            raise ValueError(f'output_text_dir={output_text_dir!r} writes the translations with their sources, which '
                             f'needs source_vocab and source_sents too (source_vocab={source_vocab!r}, '
                             f'source_sents is {"None" if source_sents is None else "given"}).')
        super().__init__(pkg_name='MachineTranslationResult', strict_content_check=strict_content_check,
                         np_array=False, **kwargs)
        self.requires_loss = True
        self.target_vocab = target_vocab
        self.source_vocab = source_vocab
        self.source_sents = source_sents
        self.output_text_dir = output_text_dir
        self.output_attn_heatmap_dir = output_attn_heatmap_dir
        self.attention_matrices: Any = None
        self.y_true_text: Optional[List[List[str]]] = None
        self.y_predicted_text: Optional[List[List[str]]] = None

    def _model_outputs(self) -> Dict[str, Any]:
        """The loss and metadata the loop passed (``additional_results={...}``), or what was passed directly."""
        passed = self.additional_results or {}
        inner = passed.get('additional_results')
        return dict(inner) if isinstance(inner, dict) else dict(passed)

    def prepare_results_dict(self) -> Dict[str, Any]:
        self.y_true_text = [self.target_vocab.convert_idx_sent2sent(row, rm_default_tokens=True)
                            for row in id_rows(self.y_true)]
        self.y_predicted_text = [self.target_vocab.convert_idx_sent2sent(row, rm_default_tokens=True)
                                 for row in id_rows(self.y_predicted)]
        outputs = self._model_outputs()
        if 'loss' not in outputs:
            raise ValueError('MachineTranslationResultPackage needs the loss for its perplexity: evaluate it with '
                             'ModelPerformanceEvaluation or PyTorchModelPredictor (they pass it), or call '
                             'prepare_result_package(..., additional_results={"loss": loss}).')
        results = {**BLEUCorpusScoreMetric(self.y_true_text, self.y_predicted_text).get_metric_dict(),
                   **BLEUSentenceScoreMetric(self.y_true_text, self.y_predicted_text, self.source_sents,
                                             self.output_text_dir).get_metric_dict(),
                   **PerplexityMetric(outputs['loss']).get_metric_dict()}
        if self.output_attn_heatmap_dir is not None:
            results.update(self._attention_heatmaps(outputs).get_metric_dict())
        return results

    def _attention_heatmaps(self, outputs: Dict[str, Any]) -> AttentionHeatMap:
        missing = [key for key in ('attention_matrices', 'source_sent_text') if key not in outputs]
        if missing or self.source_vocab is None:
            raise ValueError(f'output_attn_heatmap_dir needs source_vocab and the model\'s prediction metadata '
                             f'"attention_matrices" and "source_sent_text" (missing: {", ".join(missing) or "none"}; '
                             f'source_vocab is {"None" if self.source_vocab is None else "given"}).')
        self.attention_matrices = outputs['attention_matrices']
        source_vocab = self.source_vocab
        source_text = [source_vocab.convert_idx_sent2sent(row, rm_default_tokens=False)
                       for row in id_rows(outputs['source_sent_text'])]
        assert self.output_attn_heatmap_dir is not None and self.y_predicted_text is not None
        return AttentionHeatMap(self.attention_matrices, source_text, self.y_predicted_text,
                                self.output_attn_heatmap_dir)

    def set_experiment_dir_path_for_additional_results(self, project_name: str, experiment_name: str,
                                                       experiment_timestamp: str,
                                                       local_model_result_folder_path: str) -> None:
        self.output_text_dir = inside_experiment(self.output_text_dir, project_name, experiment_name,
                                                 experiment_timestamp, local_model_result_folder_path)
        self.output_attn_heatmap_dir = inside_experiment(self.output_attn_heatmap_dir, project_name, experiment_name,
                                                         experiment_timestamp, local_model_result_folder_path)

    def list_additional_results_dump_paths(self) -> Optional[List[List[str]]]:
        paths = []
        for folder in (self.output_text_dir, self.output_attn_heatmap_dir):
            if folder is not None and os.path.isdir(folder):
                zip_path = self.zip_additional_results_dump(folder, folder)
                paths.append([os.path.basename(zip_path), zip_path])
        return paths or None
