"""MessageService: what callbacks exchanging data through ``self.message_service`` rely on (the lifetimes of
AIToolbox's MessageHandling settings), and that a TrainLoop cleans the store only at epoch / fit ends."""
import pytest
import torch
from torch.utils.data import DataLoader

from aitoolbox_like import AbstractCallback, TrainLoop
from aitoolbox_like.engine.message_passing import Message, MessageHandling, MessageService
from helpers import MLP, classification_data

KEEP, EPOCH, READ, OVERWRITE = (MessageHandling.KEEP_FOREVER, MessageHandling.UNTIL_END_OF_EPOCH,
                                MessageHandling.UNTIL_READ, MessageHandling.OVERWRITE)


def test_unknown_key_reads_none_and_messages_come_back_in_write_order():
    service = MessageService()
    assert service.read_messages('paths') is None
    service.write_message('paths', 'a.png')
    service.write_message('paths', 'b.png')
    assert service.read_messages('paths') == ['a.png', 'b.png']
    # The default lifetime is the epoch: reading does not consume.
    assert service.read_messages('paths') == ['a.png', 'b.png']


def test_end_of_epoch_removes_only_epoch_messages():
    service = MessageService()
    service.write_message('k', 1)                       # default: UNTIL_END_OF_EPOCH
    service.write_message('k', 2, KEEP)
    service.write_message('only_epoch', 3, EPOCH)
    service.write_message('unread', 4, READ)
    service.end_of_epoch_trigger()
    assert service.read_messages('k') == [2]
    assert service.read_messages('only_epoch') is None  # key removed once empty
    assert service.read_messages('unread') == [4]       # survives the epoch until it is read


def test_until_read_is_consumed_by_the_first_read_and_others_stay():
    service = MessageService()
    service.write_message('k', 'once', READ)
    service.write_message('k', 'forever', KEEP)
    assert service.read_messages('k') == ['once', 'forever']
    assert service.read_messages('k') == ['forever']
    service.write_message('only_once', 1, READ)
    assert service.read_messages('only_once') == [1]
    # As in AIToolbox: a consumed key reads as empty until the next clean-up removes it.
    assert service.read_messages('only_once') == []
    service.end_of_epoch_trigger()
    assert service.read_messages('only_once') is None


def test_overwrite_replaces_all_messages_of_its_key_and_keeps_its_own_lifetime():
    service = MessageService()
    service.write_message('best', 0.9, KEEP)
    service.write_message('best', 0.8, KEEP)
    service.write_message('other', 'x', KEEP)
    service.write_message('best', 0.5, [OVERWRITE, READ])
    assert service.read_messages('best') == [0.5]
    assert service.read_messages('best') == []          # it was UNTIL_READ
    assert service.read_messages('other') == ['x']
    service.write_message('best', 0.4, OVERWRITE)       # OVERWRITE alone: removed by no clean-up
    service.end_of_epoch_trigger()
    service.end_of_training_trigger()
    assert service.read_messages('best') == [0.4]


def test_end_of_training_drops_epoch_messages_and_keeps_the_rest_for_the_next_fit():
    service = MessageService()
    service.write_message('written_in_on_train_end', 'x')
    service.write_message('forever', 1, KEEP)
    service.write_message('unread', 2, READ)
    service.end_of_training_trigger()
    assert service.read_messages('written_in_on_train_end') is None
    assert service.read_messages('forever') == [1]
    assert service.read_messages('unread') == [2]


@pytest.mark.parametrize('settings, error', [
    ('until_read', TypeError),
    ([READ, 'overwrite'], TypeError),
    ([], ValueError),
    ([READ, KEEP], ValueError),
])
def test_invalid_settings_are_refused_and_nothing_is_written(settings, error):
    service = MessageService()
    with pytest.raises(error):
        service.write_message('k', 1, settings)
    assert service.read_messages('k') is None


def test_message_keeps_settings_as_a_list():
    assert Message('k', 1, READ).msg_handling_settings == [READ]
    assert Message('k', 1, [OVERWRITE, KEEP]).msg_handling_settings == [OVERWRITE, KEEP]


class _FakeLoop:
    def __init__(self):
        self.message_service = MessageService()


class _RegistersWithoutSuper(AbstractCallback):
    """Like the schedulers: overrides register_train_loop_object and does not call super()."""

    def __init__(self):
        super().__init__('no super')

    def register_train_loop_object(self, train_loop_obj):
        self.train_loop_obj = train_loop_obj
        return self


def test_callbacks_see_the_loops_service_even_without_calling_super():
    loop = _FakeLoop()
    plain, no_super = AbstractCallback('plain'), _RegistersWithoutSuper()
    assert plain.message_service is None                # before registration
    plain.register_train_loop_object(loop)
    no_super.register_train_loop_object(loop)
    assert plain.message_service is loop.message_service
    assert no_super.message_service is loop.message_service


def test_an_assigned_service_is_used_as_aitoolbox_callbacks_do():
    callback = AbstractCallback('cb')
    own = MessageService()
    callback.message_service = own
    callback.register_train_loop_object(_FakeLoop())
    assert callback.message_service is own


# ---- TrainLoop integration ------------------------------------------------------------------


class _Writer(AbstractCallback):
    def __init__(self):
        super().__init__('writer', execution_order=0)

    def on_epoch_end(self):
        epoch = self.train_loop_obj.epoch
        self.message_service.write_message('epoch_note', epoch)
        self.message_service.write_message('all_epochs', epoch, KEEP)

    def on_train_end(self):
        self.message_service.write_message('train_end_note', 'done')


class _Reader(AbstractCallback):
    def __init__(self):
        super().__init__('reader', execution_order=1)
        self.at_epoch_begin, self.at_epoch_end, self.at_train_end = [], [], None

    def on_epoch_begin(self):
        self.at_epoch_begin.append(self.message_service.read_messages('epoch_note'))

    def on_epoch_end(self):
        self.at_epoch_end.append(self.message_service.read_messages('epoch_note'))

    def on_train_end(self):
        self.at_train_end = (self.message_service.read_messages('train_end_note'),
                             self.message_service.read_messages('all_epochs'))


class _CountingService(MessageService):
    def __init__(self):
        super().__init__()
        self.epoch_triggers = 0
        self.training_triggers = 0

    def end_of_epoch_trigger(self):
        self.epoch_triggers += 1
        super().end_of_epoch_trigger()

    def end_of_training_trigger(self):
        self.training_triggers += 1
        super().end_of_training_trigger()


def _loop():
    torch.manual_seed(0)
    model = MLP()
    train = DataLoader(classification_data(40), batch_size=8)
    return TrainLoop(model, train, None, None, torch.optim.SGD(model.parameters(), lr=0.1),
                     torch.nn.CrossEntropyLoss(), progress_bar=False)


def test_train_loop_cleans_epoch_messages_after_on_epoch_end_and_at_the_end_of_fit():
    loop = _loop()
    assert isinstance(loop.message_service, MessageService)
    service = loop.message_service = _CountingService()
    reader = _Reader()
    loop.fit(num_epochs=3, callbacks=[_Writer(), reader])

    # A later on_epoch_end callback reads what an earlier one wrote; the next epoch starts clean.
    assert reader.at_epoch_end == [[0], [1], [2]]
    assert reader.at_epoch_begin == [None, None, None]
    assert reader.at_train_end == (['done'], [0, 1, 2])
    # Cleaned once per epoch and once per fit, never per batch (5 batches per epoch here).
    assert (service.epoch_triggers, service.training_triggers) == (3, 1)
    assert service.read_messages('train_end_note') is None
    assert service.read_messages('all_epochs') == [0, 1, 2]
