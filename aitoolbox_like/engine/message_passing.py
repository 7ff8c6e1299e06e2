"""Messages between callbacks: a key -> list-of-values store owned by the TrainLoop (``loop.message_service``,
``callback.message_service``), with a lifetime chosen per message.

One callback writes (``write_message('plots_paths', path)``), others read by key (``read_messages``). The store
is only cleaned at the end of an epoch and at the end of ``fit``, so it costs nothing per training step.

In a distributed run each process has its own store: messages do not cross processes.
"""
import logging
from enum import Enum
from typing import Any, Dict, List, Optional, Sequence, Union

logger = logging.getLogger(__name__)


class MessageHandling(Enum):
    """How long a message stays in the :class:`MessageService`.

    - ``KEEP_FOREVER``: until the service is discarded (also across several ``fit`` calls).
    - ``UNTIL_END_OF_EPOCH``: removed after the ``on_epoch_end`` callbacks of the epoch it was written in ran
      (a message written after the last epoch, e.g. in ``on_train_end``, is removed at the end of ``fit``).
    - ``UNTIL_READ``: removed by the first ``read_messages`` of its key.
    - ``OVERWRITE``: the message replaces every message stored under its key; combine it with one of the
      others (``[MessageHandling.OVERWRITE, MessageHandling.UNTIL_READ]``) to set the replacement's lifetime.
    """
    KEEP_FOREVER = 'keep_forever'
    UNTIL_END_OF_EPOCH = 'until_end_of_epoch'
    UNTIL_READ = 'until_read'
    OVERWRITE = 'overwrite'


MsgHandlingSettings = Union[MessageHandling, Sequence[MessageHandling]]


class Message:
    """One value in the :class:`MessageService` together with its lifetime settings.

    Args:
        key: the key it is stored under.
        value: any object.
        msg_handling_settings: one :class:`MessageHandling` or a list of them; kept as a list.
    """

    def __init__(self, key: str, value: Any, msg_handling_settings: MsgHandlingSettings):
        self.key = key
        self.value = value
        self.msg_handling_settings: List[MessageHandling] = \
            [msg_handling_settings] if isinstance(msg_handling_settings, MessageHandling) \
            else list(msg_handling_settings)

    def __repr__(self) -> str:
        return f'Message({self.key!r}, {self.value!r}, {[s.name for s in self.msg_handling_settings]})'


class MessageService:
    """Key -> messages store through which callbacks share data during a run.

    The TrainLoop creates one (``loop.message_service``); every registered callback sees it as
    ``self.message_service``. Messages under one key are kept in the order they were written.
    """

    def __init__(self):
        self.message_store: Dict[str, List[Message]] = {}

    def read_messages(self, key: str) -> Optional[List[Any]]:
        """Values of the messages stored under ``key``, oldest first; ``UNTIL_READ`` messages are removed by
        this read.

        Returns:
            the list of values, or None when nothing was ever written under ``key`` (or its messages were all
            cleaned up at the end of an epoch / of fit). After every message of a key was consumed by reads the
            key stays, empty, until the next clean-up, so reading it returns ``[]`` meanwhile (as in AIToolbox).
        """
        messages = self.message_store.get(key)
        if messages is None:
            return None
        values = [msg.value for msg in messages]
        self.message_store[key] = [msg for msg in messages
                                   if MessageHandling.UNTIL_READ not in msg.msg_handling_settings]
        return values

    def write_message(self, key: str, value: Any,
                      msg_handling_settings: MsgHandlingSettings = MessageHandling.UNTIL_END_OF_EPOCH) -> None:
        """Store ``value`` under ``key``, after the messages already there (or replacing them with
        ``OVERWRITE``).

        Args:
            key: message key, shared by writer and readers.
            value: any object (in a distributed spawn run written before fit, it must be picklable).
            msg_handling_settings: the message's lifetime, a :class:`MessageHandling` or a list of them
                (see :class:`MessageHandling`; only ``OVERWRITE`` combines with another setting).

        Raises:
            TypeError: a setting is not a MessageHandling member.
            ValueError: an empty or incompatible combination of settings.
        """
        settings = self.validate_msg_handling_settings(msg_handling_settings)
        message = Message(key, value, settings)
        if MessageHandling.OVERWRITE in settings:
            self.message_store[key] = [message]
        else:
            self.message_store.setdefault(key, []).append(message)

    def end_of_epoch_trigger(self) -> None:
        """Remove the ``UNTIL_END_OF_EPOCH`` messages and the keys left empty.

        Called by the TrainLoop once per epoch, after the ``on_epoch_end`` callbacks ran.
        """
        self._purge(MessageHandling.UNTIL_END_OF_EPOCH)

    def end_of_training_trigger(self) -> None:
        """Remove the ``UNTIL_END_OF_EPOCH`` messages written after the last epoch's clean-up (in the end of
        training evaluation or ``on_train_end``), so a following ``fit`` does not start with them.

        Called by the TrainLoop at the end of ``fit``, after the ``on_train_end`` callbacks ran. ``KEEP_FOREVER``
        and unread ``UNTIL_READ`` messages are kept for the next ``fit``.
        """
        self._purge(MessageHandling.UNTIL_END_OF_EPOCH)

    def _purge(self, setting: MessageHandling) -> None:
        for key in list(self.message_store):
            kept = [msg for msg in self.message_store[key] if setting not in msg.msg_handling_settings]
            if kept:
                self.message_store[key] = kept
            else:
                del self.message_store[key]

    @staticmethod
    def validate_msg_handling_settings(msg_handling_settings: MsgHandlingSettings) -> List[MessageHandling]:
        """Check ``msg_handling_settings`` and return it as a list.

        Raises:
            TypeError: a setting is not a MessageHandling member.
            ValueError: an empty list, or two settings of which neither is ``OVERWRITE``.
        """
        if isinstance(msg_handling_settings, MessageHandling):
            return [msg_handling_settings]
        if not isinstance(msg_handling_settings, (list, tuple)):
            raise TypeError(f'msg_handling_settings must be a MessageHandling member or a list of them, got '
                            f'{msg_handling_settings!r} ({type(msg_handling_settings).__qualname__})')
        settings = list(msg_handling_settings)
        for setting in settings:
            if not isinstance(setting, MessageHandling):
                raise TypeError(f'msg_handling_settings contains {setting!r} ({type(setting).__qualname__}); '
                                f'every setting must be a MessageHandling member')
        if not settings:
            raise ValueError('msg_handling_settings is an empty list; give at least one MessageHandling setting')
        if len(settings) > 1 and MessageHandling.OVERWRITE not in settings:
            raise ValueError(f'msg_handling_settings {[s.name for s in settings]} cannot be combined: only '
                             f'OVERWRITE combines with another setting')
        return settings

    def __repr__(self) -> str:
        return f'MessageService({ {key: len(msgs) for key, msgs in self.message_store.items()} })'
