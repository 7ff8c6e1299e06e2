"""An AIToolbox NLP script: a tiny attention seq2seq model learns a word-for-word translation, evaluated each epoch by
MachineTranslationResultPackage through ModelPerformanceEvaluation (BLEU, perplexity, attention heat maps), with the
Vocabulary and normalize_string of aitoolbox.nlp.core.

Usage: python s23_machine_translation.py OUT_DIR
"""
import json
import os
import random
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox.torchtrain.train_loop import TrainLoop
from aitoolbox.torchtrain.model import TTModel
from aitoolbox.torchtrain.callbacks.performance_eval import ModelPerformanceEvaluation
from aitoolbox.nlp.core.core import normalize_string
from aitoolbox.nlp.core.vocabulary import Vocabulary
from aitoolbox.nlp.experiment_evaluation.NLP_result_package import MachineTranslationResultPackage

OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('AITB_COMPAT_OUT', 'compat_out')
random.seed(0)
np.random.seed(0)
torch.manual_seed(0)

SOURCE_WORDS = 'zero one two three four five six seven'.split()
TARGET_WORDS = 'null eins zwei drei vier fünf sechs sieben'.split()
MAX_LEN = 9

rng = random.Random(0)
pairs = []
for _ in range(68):
    words = [rng.randrange(len(SOURCE_WORDS)) for _ in range(rng.randint(4, 6))]
    pairs.append((normalize_string(' '.join(SOURCE_WORDS[w] for w in words) + '.'),
                  normalize_string(' '.join(TARGET_WORDS[w] for w in words) + '.')))

source_vocab, target_vocab = Vocabulary('en'), Vocabulary('de')
for source, target in pairs:
    source_vocab.add_sentence(source.split())
    target_vocab.add_sentence(target.split())


def to_ids(vocab, sentence):
    ids = vocab.convert_sent2idx_sent(sentence.split())
    return ids + [vocab.PAD_token] * (MAX_LEN - len(ids))


sources = torch.tensor([to_ids(source_vocab, s) for s, _ in pairs])
targets = torch.tensor([to_ids(target_vocab, t) for _, t in pairs])
train_loader = DataLoader(TensorDataset(sources[:64], targets[:64]), batch_size=8, shuffle=True)
val_loader = DataLoader(TensorDataset(sources[64:], targets[64:]), batch_size=4)


class AttentionSeq2Seq(TTModel):
    def __init__(self, source_size, target_size, hidden=32):
        super().__init__()
        self.source_embedding = nn.Embedding(source_size, hidden, padding_idx=0)
        self.target_embedding = nn.Embedding(target_size, hidden, padding_idx=0)
        self.encoder = nn.GRU(hidden, hidden, batch_first=True)
        self.decoder = nn.GRUCell(hidden, hidden)
        self.out = nn.Linear(2 * hidden, target_size)

    def decode(self, source, steps, teacher=None):
        encoded, last = self.encoder(self.source_embedding(source))
        hidden = last[0]
        token = torch.full((source.size(0),), target_vocab.SOS_token, dtype=torch.long)
        logits, attentions = [], []
        for step in range(steps):
            hidden = self.decoder(self.target_embedding(token), hidden)
            scores = torch.bmm(encoded, hidden.unsqueeze(2)).squeeze(2).masked_fill(source == 0, -1e9)
            attention = F.softmax(scores, dim=1)
            context = torch.bmm(attention.unsqueeze(1), encoded).squeeze(1)
            step_logits = self.out(torch.cat([hidden, context], dim=1))
            logits.append(step_logits)
            attentions.append(attention)
            token = teacher[:, step] if teacher is not None else step_logits.argmax(dim=1)
        return torch.stack(logits, dim=1), torch.stack(attentions, dim=1)

    def get_loss(self, batch_data, criterion, device):
        source, target = batch_data
        logits, _ = self.decode(source, MAX_LEN - 1, teacher=target[:, 1:])
        return criterion(logits.reshape(-1, logits.size(-1)), target[:, 1:].reshape(-1))

    def get_predictions(self, batch_data, device):
        source, target = batch_data
        logits, attention = self.decode(source, MAX_LEN - 1)
        predicted = logits.argmax(dim=2)
        ended = (predicted == target_vocab.EOS_token).cumsum(dim=1) > 0
        predicted = predicted.masked_fill(ended, target_vocab.PAD_token)
        return predicted, target[:, 1:], {'attention_matrices': attention, 'source_sent_text': source}


model = AttentionSeq2Seq(source_vocab.num_words, target_vocab.num_words)
package = MachineTranslationResultPackage(target_vocab, source_vocab=source_vocab,
                                          output_attn_heatmap_dir=os.path.join(os.path.abspath(OUT_DIR), 'attention'))
train_loop = TrainLoop(model, train_loader, val_loader, None, optim.Adam(model.parameters(), lr=0.01),
                       nn.CrossEntropyLoss(ignore_index=0))
train_loop.fit(num_epochs=6, callbacks=[ModelPerformanceEvaluation(package, {'lr': 0.01}, on_train_data=False,
                                                                   on_val_data=True)])

history = train_loop.train_history
plots = sorted(os.listdir(os.path.join(OUT_DIR, 'attention', 'attention_heatmaps')))
print(json.dumps({
    'val_BLEU_corpus_score': [round(v, 8) for v in history['val_BLEU_corpus_score']],
    'val_BLEU_sentence_score': [round(v, 8) for v in history['val_BLEU_sentence_score']],
    'val_Perplexity': [round(v, 6) for v in history['val_Perplexity']],
    'val_loss': [round(v, 6) for v in history['val_loss']],
    'heatmaps_per_epoch': [len(paths) for paths in history['val_Attention_HeatMap']],
    'plots': plots,
    'perplexity_is_exp_val_loss': bool(np.allclose(history['val_Perplexity'], np.exp(history['val_loss']))),
}))
