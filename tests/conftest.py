"""Suite-wide pytest hooks: each test file's line ends with its wall time.

The suite takes minutes on two cores and some files spawn gloo processes for tens of
seconds, so ``python -m pytest`` prints, for example::

    tests/test_agree.py ..................                 (41 s) [  6%]

Only in pytest's default output (one line per file); ``-q`` and ``-v`` are unchanged.
"""

from __future__ import annotations

import time

import pytest


class FileTimes:
    """Writes ``(N s)`` when pytest's terminal line for a file ends."""

    def __init__(self, reporter: pytest.TerminalReporter) -> None:
        self.reporter = reporter
        self.path: str | None = None
        self.start = 0.0
        self.finished = 0
        self.collected = 0

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected = len(session.items)

    def _end_file(self) -> None:
        if self.path is not None:
            self.reporter.write(f" ({time.monotonic() - self.start:.0f} s)")

    @pytest.hookimpl(tryfirst=True)  # before the reporter starts the next file's line
    def pytest_runtest_logstart(self, nodeid: str) -> None:
        path = nodeid.split("::")[0]
        if path != self.path:
            self._end_file()
            self.path, self.start = path, time.monotonic()

    @pytest.hookimpl(tryfirst=True)  # before the reporter's final "[100%]"
    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.finished += 1
        if self.finished == self.collected:
            self._end_file()
            self.path = None


def pytest_sessionstart(session: pytest.Session) -> None:
    # Here, not in pytest_configure: the terminal reporter is registered by now.
    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if getattr(config.option, "numprocesses", None):  # pytest-xdist: no file lines
        return
    if isinstance(reporter, pytest.TerminalReporter) and config.get_verbosity() == 0:
        config.pluginmanager.register(FileTimes(reporter), "fmesh-file-times")
