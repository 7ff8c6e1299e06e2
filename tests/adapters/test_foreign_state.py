"""The state of other libraries' callbacks (aitoolbox_like.adapters.foreign_state): what a callback holds in its
attributes goes into a weights_only checkpoint and back into the callback of the resumed run, after that callback
reset itself; the loop's own objects and settings stay out; a setting changed for the resumed run wins; what cannot
be saved is named."""
import collections
import enum
import io
import logging
import operator
import random

import numpy as np
import torch
from torch import nn

from aitoolbox_like.adapters.foreign_state import Encoder, ForeignState


class Mode(enum.Enum):
    MIN = 'min'
    MAX = 'max'


class History:
    def __init__(self):
        self.metrics = collections.defaultdict(list)
        self.epoch = 1


class Slotted:
    __slots__ = ('value',)


class ForeignCallback:
    """A callback of another library: plain attributes, no state_dict, reset at the start of a run."""

    def __init__(self, patience, shared_model):
        self.patience = patience
        self.operator = operator.lt                   # a setting
        self.model = shared_model                     # the loop's: never saved here
        self.reset()

    def reset(self):
        self.counter, self.best = 0, None
        self.history = History()
        self.window = collections.deque(maxlen=3)
        self.mode = Mode.MIN
        self.generator = random.Random(0)
        self.average = nn.Linear(2, 2)
        self.scores = np.zeros(3)
        self.seen = {'epochs': [], 'last': torch.zeros(2)}


def train(callback):
    callback.counter, callback.best = 2, torch.tensor(0.25)
    callback.history.metrics['loss'] += [1.0, 0.5]
    callback.history.epoch = 3
    callback.window.extend([1, 2, 3, 4])
    callback.mode = Mode.MAX
    callback.generator.random()
    with torch.no_grad():
        callback.average.weight.fill_(7.0)
    callback.scores[:] = [1.0, 2.0, 3.0]
    callback.seen['epochs'].append(2)
    callback.seen['last'] += 1


def saved_and_loaded(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_a_callbacks_attributes_survive_a_checkpoint_into_the_resumed_callback_after_its_reset():
    model = nn.Linear(3, 1)
    encoder = Encoder([model])
    original = ForeignCallback(5, model)
    state = ForeignState('ForeignCallback')
    state.record_initial(original, encoder)
    train(original)
    saved = saved_and_loaded(state.state(original, encoder))     # weights_only: plain data only
    assert 'model' not in saved['attributes'] and 'operator' not in saved['attributes']

    resumed = ForeignCallback(5, model)                           # a new process: built again, then reset by its run
    fresh = ForeignState('ForeignCallback')
    fresh.record_initial(resumed, encoder)
    history, window = resumed.history, resumed.window
    fresh.apply(resumed, saved)
    assert (resumed.counter, float(resumed.best)) == (2, 0.25)
    assert resumed.history is history and resumed.history.metrics == {'loss': [1.0, 0.5]}
    assert isinstance(resumed.history.metrics, collections.defaultdict) and resumed.history.epoch == 3
    assert resumed.window is window and list(window) == [2, 3, 4] and window.maxlen == 3
    assert resumed.mode is Mode.MAX and resumed.generator.random() == original.generator.random()
    assert torch.equal(resumed.average.weight, original.average.weight)
    assert isinstance(resumed.scores, np.ndarray) and resumed.scores.tolist() == [1.0, 2.0, 3.0]
    assert resumed.seen['epochs'] == [2] and torch.equal(resumed.seen['last'], torch.ones(2))
    assert resumed.model is model and resumed.operator is operator.lt


def test_a_setting_changed_for_the_resumed_run_keeps_its_new_value_and_is_named(caplog):
    encoder = Encoder()
    original = ForeignCallback(5, None)
    state = ForeignState('ForeignCallback')
    state.record_initial(original, encoder)
    train(original)
    saved = saved_and_loaded(state.state(original, encoder))
    resumed = ForeignCallback(8, None)                            # patience raised for the resumed run
    fresh = ForeignState('ForeignCallback')
    fresh.record_initial(resumed, encoder)
    with caplog.at_level(logging.WARNING):
        fresh.apply(resumed, saved)
    assert resumed.patience == 8 and resumed.counter == 2
    assert any('ForeignCallback: patience set otherwise' in record.getMessage() for record in caplog.records)


def test_what_a_checkpoint_cannot_hold_is_named_once(caplog):
    callback = ForeignCallback(1, None)
    callback.handle = Slotted()
    state = ForeignState('ForeignCallback')
    with caplog.at_level(logging.WARNING):
        state.state(callback, Encoder())
        state.state(callback, Encoder())
    named = [r.getMessage() for r in caplog.records if 'cannot be saved' in r.getMessage()]
    assert len(named) == 1 and 'handle (Slotted)' in named[0]
