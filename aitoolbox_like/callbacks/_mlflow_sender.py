"""The background thread of MLflowTracking: every MLflow call of one callback, in order, retried while the tracking
server is down (:class:`Sender`), one :class:`Operation` at a time."""
import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Optional, Tuple

# The logger of MLflowTracking's module: its outage warnings are the callback's own messages.
logger = logging.getLogger('aitoolbox_like.callbacks.mlflow')

# HTTP statuses worth retrying: the server (or a proxy before it) is down, overloaded or restarting.
_RETRY_STATUSES = {408, 429, 500, 502, 503, 504}


def is_transient_error(error: BaseException) -> bool:
    """True for an error worth retrying: the server is unreachable, timing out, overloaded or failing (5xx);
    False for a refusal of the request itself (a 4xx answer: invalid value, unknown run, no permission)."""
    status: Optional[int] = None
    get_status = getattr(error, 'get_http_status_code', None)       # MlflowException / RestException
    if callable(get_status):
        try:
            status = int(get_status())
        except (TypeError, ValueError):
            status = None
    response = getattr(error, 'response', None)                      # requests.HTTPError (artifact uploads)
    if status is None and response is not None and getattr(response, 'status_code', None) is not None:
        status = int(response.status_code)
    if status is None:
        return not isinstance(error, (ValueError, TypeError, FileNotFoundError, IsADirectoryError))
    return status >= 500 or status in _RETRY_STATUSES


@dataclass
class Operation:
    """One call to MLflow, made by the sender thread."""
    kind: str                                   # 'start' | 'batch' | 'artifact' | 'terminate'
    metrics: List[Tuple[str, float, int, int]] = field(default_factory=list)   # (key, value, timestamp_ms, step)
    params: Dict[str, str] = field(default_factory=dict)
    tags: Dict[str, str] = field(default_factory=dict)
    path: str = ''
    artifact_path: Optional[str] = None
    status: str = 'FINISHED'

    def describe(self) -> str:
        if self.kind == 'batch':
            parts = [f'{len(self.metrics)} metric value(s)' if self.metrics else '',
                     f'{len(self.params)} param(s)' if self.params else '',
                     f'{len(self.tags)} tag(s)' if self.tags else '']
            return ', '.join(p for p in parts if p) or 'an empty batch'
        if self.kind == 'artifact':
            return f'artifact {self.path}'
        if self.kind == 'terminate':
            return f'run status {self.status}'
        return 'run start'


class Sender:
    """The background thread that makes every MLflow call of one callback, in order.

    A call that fails with a transient error (server down) is retried, with a growing pause, until it succeeds or
    the sender is closed; the first failure of an outage is one warning, the recovery one info message. A call
    the server refuses (4xx) is dropped with an error message.
    """

    def __init__(self, execute: Callable[[Operation], None], describe_server: Callable[[], str],
                 retry_interval_s: float, max_retry_interval_s: float, stall_warning_s: float) -> None:
        self._execute = execute
        self._describe_server = describe_server
        self.retry_interval_s = retry_interval_s
        self.max_retry_interval_s = max_retry_interval_s
        self.stall_warning_s = stall_warning_s
        self._queue: Deque[Operation] = collections.deque()
        self._condition = threading.Condition()
        self._closed = False
        self._busy_since: Optional[float] = None
        self.down = False            # True from the first failed call of an outage until a call succeeds again
        self.outages = 0
        self.dropped: List[str] = []  # what the server refused (not retried)
        self.last_error: Optional[str] = None
        self._thread = threading.Thread(target=self._run, name='MLflowTracking sender', daemon=True)
        self._thread.start()

    def submit(self, operation: Operation) -> None:
        with self._condition:
            self._queue.append(operation)
            self._condition.notify_all()

    def pending(self) -> List[Operation]:
        """The operations not done yet (the one in progress first)."""
        with self._condition:
            return list(self._queue)

    def wait(self, timeout: Optional[float]) -> bool:
        """Wait until every submitted operation is done (or dropped); False when ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._condition:
            while self._queue:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._condition.wait(remaining if remaining is None else min(remaining, 0.5))
        return True

    def check_stalled(self) -> None:
        """Warn (once per outage) when one call has been waiting for the server longer than stall_warning_s: MLflow's
        own HTTP retries (MLFLOW_HTTP_REQUEST_MAX_RETRIES) can keep a call going for minutes before it fails."""
        busy_since = self._busy_since
        if busy_since is not None and not self.down and time.monotonic() - busy_since > self.stall_warning_s:
            self._mark_down(f'no answer for {time.monotonic() - busy_since:.0f} s')

    def close(self) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify_all()

    def _mark_down(self, reason: str) -> None:
        with self._condition:
            if self.down:
                return
            self.down = True
            self.outages += 1
        logger.warning('MLflowTracking: the MLflow tracking server %s is not answering (%s); training goes on, and '
                       'what is not logged yet is queued and sent when the server is back', self._describe_server(),
                       reason)

    def _run(self) -> None:
        pause = self.retry_interval_s
        while True:
            with self._condition:
                while not self._queue and not self._closed:
                    self._condition.wait()
                if not self._queue:
                    return
                operation = self._queue[0]
                self._busy_since = time.monotonic()
            try:
                self._execute(operation)
            except Exception as error:                      # the training must never see it
                self.last_error = f'{type(error).__name__}: {error}'
                if is_transient_error(error):
                    self._mark_down(self.last_error[:300])
                    with self._condition:
                        self._busy_since = None
                        if self._closed:
                            return
                        self._condition.wait(pause)
                    pause = min(pause * 2, self.max_retry_interval_s)
                    continue
                logger.error('MLflowTracking: the MLflow server refused %s; it is not logged (%s)',
                             operation.describe(), self.last_error)
                self.dropped.append(f'{operation.describe()} ({self.last_error})')
            else:
                if self.down:
                    logger.info('MLflowTracking: the MLflow tracking server %s answers again; sending the %d queued '
                                'operation(s)', self._describe_server(), len(self._queue) - 1)
                    self.down = False
                pause = self.retry_interval_s
            with self._condition:
                self._busy_since = None
                if self._queue and self._queue[0] is operation:
                    self._queue.popleft()
                self._condition.notify_all()
