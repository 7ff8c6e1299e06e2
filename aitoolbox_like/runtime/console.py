"""The library's log lines on the console when the program configured no logging.

A script that never calls ``logging.basicConfig`` would otherwise see only warnings (Python's last-resort
handler), so a fit run with output redirected to a file, where the progress bar is off, would be silent. While a
fit runs, :func:`default_console_output` gives the ``aitoolbox_like`` logger a handler printing INFO lines (the
per-epoch values, where the experiment folder is) to stderr, only when nothing is configured: the root logger has
no handler, and the ``aitoolbox_like`` logger has neither a handler nor a level. A program that configures logging,
before or during the fit, gets its own configuration untouched (the handler then stays silent).

In a distributed run every process logs: :func:`label_records_with_rank` makes the library say each INFO message
once (rank 0) and put ``[rank k]`` in front of what the other ranks warn about.
"""
import contextlib
import logging
import sys
from typing import Iterator, List

PACKAGE_LOGGER = 'aitoolbox_like'


class _LevelPrefix(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno < logging.WARNING else f'{record.levelname}: {text}'


class DefaultConsoleHandler(logging.StreamHandler):
    """Writes the library's records to stderr while the program has configured no logging of its own."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return          # configured since the fit started: the program's handlers print it
        super().emit(record)


def in_notebook() -> bool:
    """True when this process is a Jupyter kernel (Jupyter, JupyterLab, VS Code's notebooks, Colab): an IPython shell
    with a kernel, which shows a notebook progress bar."""
    ipython = sys.modules.get('IPython')
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, 'get_ipython') else None
    return shell is not None and getattr(shell, 'kernel', None) is not None


def logging_configured() -> bool:
    """True when the program has configured logging that would decide about the library's records."""
    package = logging.getLogger(PACKAGE_LOGGER)
    return bool(logging.getLogger().handlers) or bool(package.handlers) or package.level != logging.NOTSET


@contextlib.contextmanager
def default_console_output() -> Iterator[None]:
    """While inside: the library's INFO lines go to stderr if logging is not configured (nested uses are no-ops)."""
    if logging_configured():
        yield
        return
    package = logging.getLogger(PACKAGE_LOGGER)
    handler = DefaultConsoleHandler(sys.stderr)
    handler.setFormatter(_LevelPrefix('%(message)s'))
    package.addHandler(handler)
    package.setLevel(logging.WARNING if _labelled_rank else logging.INFO)
    _console_level_set.append(handler)
    try:
        yield
    finally:
        _console_level_set.remove(handler)
        package.removeHandler(handler)
        package.setLevel(logging.NOTSET)


_labelled_rank: List[int] = []          # the rank this process's library records are labelled with (set once)
_console_level_set: List[logging.Handler] = []    # while default_console_output set the package's level


def label_records_with_rank(rank: int) -> None:
    """In one process of a distributed run: the library's INFO messages come from rank 0 only (every rank would say
    the same), and its warnings and errors of the other ranks start with ``[rank k]``. Applies whatever the
    program's logging configuration; a level the program set on the ``aitoolbox_like`` logger is kept. Repeated
    calls (a second fit) change nothing."""
    if _labelled_rank or rank == 0:
        return
    _labelled_rank.append(rank)
    package = logging.getLogger(PACKAGE_LOGGER)
    if package.level == logging.NOTSET or _console_level_set:
        package.setLevel(logging.WARNING)
    make_record = logging.getLogRecordFactory()

    def labelled_record(*args: object, **kwargs: object) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        if record.name == PACKAGE_LOGGER or record.name.startswith(PACKAGE_LOGGER + '.'):
            record.msg = f'[rank {rank}] {record.msg}'
        return record

    logging.setLogRecordFactory(labelled_record)
