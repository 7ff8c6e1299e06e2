"""Message passing between custom callbacks through self.message_service
(docs/source/torchtrain/adv/message_passing.rst) with every MessageHandling lifecycle setting.

Usage: python s17_message_passing.py OUT_DIR
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
from aitoolbox.torchtrain.callbacks.abstract import AbstractCallback
from aitoolbox.torchtrain.train_loop.components.message_passing import MessageService, MessageHandling

OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('AITB_COMPAT_OUT', 'compat_out')
random.seed(0)
np.random.seed(0)
torch.manual_seed(0)


class TinyNet(TTModel):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(x)

    def get_loss(self, batch_data, criterion, device):
        x, y = batch_data
        return criterion(self(x.to(device)), y.to(device))

    def get_predictions(self, batch_data, device):
        x, y = batch_data
        return self(x.to(device)).argmax(dim=1).cpu(), y, {}


class Sender(AbstractCallback):
    def __init__(self):
        super().__init__('sender')

    def on_epoch_begin(self):
        epoch = self.train_loop_obj.epoch
        self.message_service.write_message('forever', f'f{epoch}', msg_handling_settings=MessageHandling.KEEP_FOREVER)
        self.message_service.write_message('epoch_only', f'e{epoch}')  # default: UNTIL_END_OF_EPOCH
        self.message_service.write_message('read_once', f'r{epoch}', msg_handling_settings=MessageHandling.UNTIL_READ)
        self.message_service.write_message('latest', f'l{epoch}',
                                           msg_handling_settings=[MessageHandling.OVERWRITE,
                                                                  MessageHandling.KEEP_FOREVER])


class Receiver(AbstractCallback):
    def __init__(self):
        super().__init__('receiver', execution_order=5)
        self.log = []

    def on_epoch_begin(self):
        # Messages written by an earlier-executed callback at the same position are visible at once
        self.log.append(('begin', self.train_loop_obj.epoch,
                         self.message_service.read_messages('epoch_only')))

    def on_epoch_end(self):
        ms = self.message_service
        self.log.append(('end', self.train_loop_obj.epoch,
                         ms.read_messages('forever'), ms.read_messages('epoch_only'),
                         ms.read_messages('read_once'), ms.read_messages('read_once'),
                         ms.read_messages('latest'), ms.read_messages('never_written')))


x = torch.randn(64, 8)
y = torch.randint(0, 3, (64,))
loader = DataLoader(TensorDataset(x, y), batch_size=16)
model = TinyNet()
receiver = Receiver()
tl = TrainLoop(model, loader, None, None, optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
tl.fit(num_epochs=3, callbacks=[receiver, Sender()])

assert isinstance(tl.message_service, MessageService)
assert receiver.message_service is tl.message_service
ends = [entry for entry in receiver.log if entry[0] == 'end']
assert ends[0] == ('end', 0, ['f0'], ['e0'], ['r0'], [], ['l0'], None), ends[0]
assert ends[2] == ('end', 2, ['f0', 'f1', 'f2'], ['e2'], ['r2'], [], ['l2'], None), ends[2]
begins = [entry for entry in receiver.log if entry[0] == 'begin']
assert begins == [('begin', 0, ['e0']), ('begin', 1, ['e1']), ('begin', 2, ['e2'])], begins
# after training: UNTIL_END_OF_EPOCH messages purged, KEEP_FOREVER kept
assert tl.message_service.read_messages('epoch_only') is None
assert tl.message_service.read_messages('forever') == ['f0', 'f1', 'f2']

# The service on its own
ms = MessageService()
ms.write_message('k', 1, msg_handling_settings=MessageHandling.UNTIL_READ)
ms.write_message('k', 2, msg_handling_settings=MessageHandling.KEEP_FOREVER)
assert ms.read_messages('k') == [1, 2] and ms.read_messages('k') == [2]
ms.end_of_epoch_trigger()
assert ms.read_messages('k') == [2]
try:
    ms.write_message('bad', 0, msg_handling_settings='keep_forever')
    raise AssertionError('string settings must be rejected')
except TypeError:
    pass

print(json.dumps({'log': [[e if not isinstance(e, tuple) else list(e) for e in entry] for entry in receiver.log]},
                 sort_keys=True))
