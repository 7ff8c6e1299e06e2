"""Attention heat maps of a sequence-to-sequence model (AIToolbox's ``AttentionHeatMap``): one PNG per sentence,
the source tokens across, the predicted tokens down."""
import os
from typing import Any, List, Optional, Sequence

import numpy as np

from ...results.metrics import AbstractBaseMetric
from .._requires import require
from .text_dump import fresh_folder

__all__ = ['AttentionHeatMap']


class AttentionHeatMap(AbstractBaseMetric):
    """Plots each attention matrix as a heat map; its result is the list of the PNG paths written."""

    def __init__(self, attention_matrices: Sequence[Any], source_sentences: Sequence[Sequence[str]],
                 target_sentences: Sequence[Sequence[str]], plot_save_dir: str) -> None:
        """Neural attention heat map plotting

        Args:
            attention_matrices (list or numpy.ndarray): one 2-D matrix per sentence, (target steps, source tokens)
            source_sentences (list): each sentence's source tokens
            target_sentences (list): each sentence's predicted tokens (the matrix's rows beyond them are dropped)
            plot_save_dir (str): folder the plots are written to, in ``attention_heatmaps/attn_plot_<i>.png``
                (emptied first)

        Raises:
            ValueError: the three lists differ in length
        """
        lengths = (len(attention_matrices), len(source_sentences), len(target_sentences))
        if len(set(lengths)) > 1:
            raise ValueError(f'attention_matrices, source_sentences and target_sentences differ in length: '
                             f'{lengths[0]}, {lengths[1]}, {lengths[2]}; pass one of each per sentence.')
        self.attention_matrices = attention_matrices
        self.source_sentences = source_sentences
        self.target_sentences = target_sentences
        self.plot_save_dir = plot_save_dir
        super().__init__(None, None, metric_name='Attention_HeatMap', np_array=False)

    def _check_targets_and_predictions(self, y_true: Any, y_predicted: Any) -> None:
        pass    # the inputs are the matrices and sentences, checked in __init__

    def calculate_metric(self) -> List[str]:
        dir_path = self.prepare_folder_for_saving(self.plot_save_dir)
        paths = []
        for i, (matrix, source, target) in enumerate(zip(self.attention_matrices, self.source_sentences,
                                                         self.target_sentences)):
            path = os.path.join(dir_path, f'attn_plot_{i}.png')
            if hasattr(matrix, 'detach'):       # a row of the model's attention tensor
                matrix = matrix.detach().cpu().numpy()
            self.plot_sentence_attention(np.asarray(matrix)[:len(target)], source, target, path)
            paths.append(path)
        return paths

    @staticmethod
    def plot_sentence_attention(attention_matrix: Any, sentence_source: Sequence[str],
                                sentence_target: Sequence[str], plot_file_path: Optional[str] = None) -> Any:
        """Draw one attention matrix as a heat map with a colour bar, and save it as PNG when ``plot_file_path`` is
        given (matplotlib; AIToolbox drew the same picture with seaborn)

        Args:
            attention_matrix (numpy.ndarray): (target tokens, source tokens)
            sentence_source (list): the source tokens (columns, labelled on top)
            sentence_target (list): the predicted tokens (rows, labelled on the right)
            plot_file_path (str or None): where to save the PNG

        Returns:
            matplotlib.figure.Figure: the figure
        """
        require('matplotlib', 'matplotlib', 'AttentionHeatMap')
        from matplotlib.colors import LinearSegmentedColormap
        from matplotlib.figure import Figure     # not pyplot: no GUI backend, no global figure state

        matrix = np.asarray(attention_matrix, dtype=float)
        fig = Figure(figsize=(8, 8))
        grid = fig.add_gridspec(2, 2, width_ratios=[12, 1], height_ratios=[12, 1])
        ax, colorbar_ax = fig.add_subplot(grid[0]), fig.add_subplot(grid[1])
        cmap = LinearSegmentedColormap.from_list('attention', ['#f7f1f0', '#c0392b'])
        image = ax.imshow(matrix, cmap=cmap, aspect='auto', interpolation='nearest')
        fig.colorbar(image, cax=colorbar_ax)
        # a label per column and row that has a token (a padded matrix may be larger than its sentences)
        columns = min(matrix.shape[1], len(sentence_source))
        rows = min(matrix.shape[0], len(sentence_target))
        ax.set_xticks(range(columns), [str(token) for token in sentence_source][:columns], fontsize=12, rotation=60)
        ax.set_yticks(range(rows), [str(token) for token in sentence_target][:rows], fontsize=12, rotation=-90,
                      horizontalalignment='left')
        ax.xaxis.tick_top()
        ax.yaxis.tick_right()
        ax.set_xlabel('Source', size=20)
        ax.set_ylabel('Hypothesis', size=20)
        if plot_file_path:
            fig.savefig(plot_file_path, format='png')
        return fig

    @staticmethod
    def prepare_folder_for_saving(output_plot_dir: str) -> str:
        """Empty ``output_plot_dir`` and create ``attention_heatmaps`` in it

        Returns:
            str: the ``attention_heatmaps`` folder
        """
        fresh_folder(output_plot_dir)
        dir_path = os.path.join(output_plot_dir, 'attention_heatmaps')
        os.makedirs(dir_path)
        return dir_path
