"""Perplexity (AIToolbox's ``PerplexityMetric``): e to the mean of the losses."""
from typing import Any, Sequence, Union

import numpy as np

from ...results.metrics import AbstractBaseMetric

__all__ = ['PerplexityMetric']


class PerplexityMetric(AbstractBaseMetric):
    """``exp(mean(batch_losses))``: the perplexity of a language or translation model whose loss is the mean
    token cross-entropy in nats."""

    def __init__(self, batch_losses: Union[float, Sequence[float], Any]) -> None:
        """Perplexity metric used in machine translation

        Args:
            batch_losses (float or list or numpy.ndarray): the (batch) losses, or one mean loss
        """
        super().__init__(None, batch_losses, metric_name='Perplexity', np_array=False)

    def _check_targets_and_predictions(self, y_true: Any, y_predicted: Any) -> None:
        losses = np.asarray(y_predicted, dtype=float)
        if losses.size == 0:
            raise ValueError('PerplexityMetric got no losses: pass the batch losses (or the mean loss).')

    def calculate_metric(self) -> float:
        return float(np.exp(np.mean(np.asarray(self.y_predicted, dtype=float))))
