"""Collate function of AIToolbox's ``aitoolbox.nlp.torch_collate_fns`` for extractive question answering batches."""
from typing import List, Sequence, Tuple

import torch

__all__ = ['qa_concat_ctx_span_collate_fn']


def _pad(sequences: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(seq) for seq in sequences], dtype=torch.long)
    padded = torch.zeros(len(sequences), int(lengths.max()), dtype=torch.long)
    for row, seq in enumerate(sequences):
        padded[row, :len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    return padded, lengths


def qa_concat_ctx_span_collate_fn(data: List[Tuple[torch.Tensor, torch.Tensor, Sequence[int]]]
                                  ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A ``DataLoader`` ``collate_fn`` for (paragraph, question, answer span) examples of different lengths

    Paragraphs and questions are zero-padded (0 is ``Vocabulary.PAD_token``) to the longest of the batch.

    Args:
        data (list): ``(paragraph_token_ids, question_token_ids, (span_start, span_end))`` per example

    Returns:
        tuple: ``paragraphs (batch, max_len)``, ``paragraph_lengths (batch,)``, ``questions (batch, max_len)``,
        ``question_lengths (batch,)``, ``spans (batch, 2)``, all ``torch.long``
    """
    paragraphs, questions, spans = zip(*data)
    paragraph_pad, paragraph_lengths = _pad(paragraphs)
    question_pad, question_lengths = _pad(questions)
    span_tensor = torch.stack([torch.as_tensor(span, dtype=torch.long) for span in spans])
    return paragraph_pad, paragraph_lengths, question_pad, question_lengths, span_tensor
