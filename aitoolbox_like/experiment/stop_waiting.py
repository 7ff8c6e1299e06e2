"""A wait that a stop signal cuts short: the end of fit waits for the experiment's uploads (up to ten minutes), and
a scheduler's SIGTERM or a Ctrl-C then must not spend the grace period in it.

While :meth:`SignalsCutWaits.waiting` is active in the main thread, SIGTERM and SIGINT raise :class:`WaitCutShort`
inside the wait; once the wait's outcome is reported, :meth:`SignalsCutWaits.redeliver` gives the signal to the handler
that was there before (the default SIGTERM ends the process, Ctrl-C raises KeyboardInterrupt), so the process ends as
the signal asks. What was not uploaded stays in the upload journal, for the resumed run or the sync command.
"""
import signal
import threading
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class WaitCutShort(Exception):
    """Raised inside a wait by a stop signal."""


class SignalsCutWaits:
    """The signals that cut this process's waits short; ``signum`` is the first one received, or None."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._previous: Dict[int, Any] = {}
        self._in_wait = False

    @contextmanager
    def installed(self) -> Iterator['SignalsCutWaits']:
        """Handle SIGTERM / SIGINT inside the block (main thread only: elsewhere signals keep their handlers)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        for stop_signal in SIGNALS:
            self._previous[stop_signal] = signal.getsignal(stop_signal)
            signal.signal(stop_signal, self._handle)
        try:
            yield self
        finally:
            for number, previous in self._previous.items():
                signal.signal(number, previous if previous is not None else signal.SIG_DFL)

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """The block is a wait a signal may cut short (it raises WaitCutShort there)."""
        self._in_wait = self.signum is None
        try:
            yield
        finally:
            self._in_wait = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        if self._in_wait:
            self._in_wait = False
            raise WaitCutShort(signal.Signals(signum).name)

    def redeliver(self) -> None:
        """Give the signal received (if any) to the handler that was there before: call it after the handlers are
        put back (outside :meth:`installed`)."""
        if self.signum is not None:
            signum, self.signum = self.signum, None
            signal.raise_signal(signum)
