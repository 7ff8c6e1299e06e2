"""TrainLoop built with None pieces (no loaders, optimizer or criterion) used only as a callback host:
callbacks are registered through callbacks_handler and driven manually with execute_* (no fit()).
The same pattern PyTorchModelPredictor uses internally.

Usage: python s07_none_pieces_callbacks.py OUT_DIR
"""
import json
import os
import sys

import torch
import torch.nn as nn

from aitoolbox.torchtrain.train_loop import TrainLoop
from aitoolbox.torchtrain.model import TTModel
from aitoolbox.torchtrain.callbacks.abstract import AbstractCallback
from aitoolbox.torchtrain.callbacks.basic import FunctionOnTrainLoop

OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('AITB_COMPAT_OUT', 'compat_out')
torch.manual_seed(0)

EVENTS = []


class TinyModel(TTModel):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)

    def get_loss(self, batch_data, criterion, device):
        x, y = batch_data
        return criterion(self(x.to(device)), y.to(device))

    def get_predictions(self, batch_data, device):
        x, y = batch_data
        return self(x.to(device)).argmax(dim=1).cpu(), y, {}


class Recorder(AbstractCallback):
    def __init__(self, name, execution_order=0):
        super().__init__(name, execution_order=execution_order)
        self.registered = False

    def on_train_loop_registration(self):
        self.registered = True
        EVENTS.append((self.callback_name, 'registration'))

    def on_train_begin(self):
        EVENTS.append((self.callback_name, 'train_begin'))

    def on_epoch_begin(self):
        EVENTS.append((self.callback_name, 'epoch_begin'))

    def on_batch_begin(self):
        EVENTS.append((self.callback_name, 'batch_begin'))

    def on_batch_end(self):
        EVENTS.append((self.callback_name, 'batch_end'))

    def on_epoch_end(self):
        EVENTS.append((self.callback_name, 'epoch_end'))

    def on_train_end(self):
        EVENTS.append((self.callback_name, 'train_end'))


class OnlyEpochEnd(AbstractCallback):
    def __init__(self):
        super().__init__('only_epoch_end')

    def on_epoch_end(self):
        EVENTS.append((self.callback_name, 'epoch_end'))


tl = TrainLoop(TinyModel(), None, None, None, None, None)
assert tl.train_loader is None and tl.optimizer is None and tl.criterion is None
assert len(tl.callbacks) == 0

late = Recorder('late', execution_order=10)
early = Recorder('early')
tl.callbacks_handler.register_callbacks([late, early, OnlyEpochEnd()])
assert late.registered and early.registered
assert late.train_loop_obj is tl and early.message_service is tl.message_service
assert len(tl.callbacks_handler) == 3
assert 'late' in tl.callbacks_handler and Recorder in tl.callbacks_handler
assert 'does-not-exist' not in tl.callbacks_handler
# ordered by execution_order, registration order kept among equals
assert [cb.callback_name for cb in tl.callbacks] == ['early', 'only_epoch_end', 'late']

# FunctionOnTrainLoop registered later, through the += operator of the handler
tl.callbacks_handler += [FunctionOnTrainLoop(lambda loop: EVENTS.append(('fn', f'epoch_end@{loop.epoch}')),
                                             epoch_end=True)]
assert len(tl.callbacks) == 4

tl.callbacks_handler.execute_train_begin()
for tl.epoch in range(2):
    tl.callbacks_handler.execute_epoch_begin()
    tl.callbacks_handler.execute_batch_begin()
    tl.callbacks_handler.execute_batch_end()
    tl.callbacks_handler.execute_epoch_end()
tl.callbacks_handler.execute_train_end()

epoch_end_0 = [e for e in EVENTS if e[1].startswith('epoch_end')][:4]
assert epoch_end_0 == [('early', 'epoch_end'), ('only_epoch_end', 'epoch_end'), ('fn', 'epoch_end@0'),
                       ('late', 'epoch_end')], epoch_end_0
# AIToolbox calls on_train_loop_registration in list order, the drop-in library in execution order (a documented
# difference: a callback's registration then sees every earlier-ordered callback registered); both register both.
assert sorted(EVENTS[:2]) == [('early', 'registration'), ('late', 'registration')], EVENTS[:2]
assert ('early', 'train_begin') in EVENTS and EVENTS[-1] == ('late', 'train_end')
assert sum(1 for e in EVENTS if e == ('only_epoch_end', 'epoch_end')) == 2

print(json.dumps({'events': [list(e) for e in EVENTS]}, sort_keys=True))
