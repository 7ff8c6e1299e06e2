"""Integrations with other training frameworks, each an optional extra that is imported only when used.

- :mod:`aitoolbox_like.adapters.ray`: a TrainLoop inside Ray Train's ``TorchTrainer`` workers
  (``pip install 'aitoolbox_like[ray]'``).
"""
