"""Threads that construct gloo groups for creating calls, kept for the life of the process.

gloo's ``ProcessGroupGloo`` constructor connects its pairs in native code after its
store rendezvous, and nothing cancels that: a rank that waited there for a peer the
others gave up on would wait for the group's timeout (30 minutes by default). So a
creating call under a watch hands each gloo construction to a worker thread and waits
for it in slices (``liveness.creating``): once the call is given up, the caller raises
at once and leaves the worker to end at the group's timeout (a group it makes then is
destroyed, never handed out). Workers are kept and reused: a call starts no thread
unless every worker is still busy with an abandoned construction.
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

__all__ = ["Handle", "started", "submit"]

T = TypeVar("T")

started = [0]
"""Worker threads this process started (tests: calls reuse them)."""


class Handle(Generic[T]):
    """One construction handed to a worker."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._abandoned = False
        self._on_late: Callable[[T], None] | None = None
        self._lock = threading.Lock()

    def wait(self, seconds: float) -> bool:
        return self.done.wait(seconds)

    def result(self) -> T:
        if self._error is not None:
            raise self._error
        return cast("T", self._value)

    def abandon(self, on_late: Callable[[T], None]) -> bool:
        """Leave the construction to its worker (``on_late(value)`` if it makes one
        after all); ``False`` if it finished meanwhile (take its result instead)."""
        with self._lock:
            if self.done.is_set():
                return False
            self._abandoned, self._on_late = True, on_late
            return True

    def _finish(self, value: Any, error: BaseException | None) -> None:
        with self._lock:
            self._value, self._error = value, error
            self.done.set()
            late = self._on_late if self._abandoned else None
        if late is not None and error is None and value is not None:
            late(cast("T", value))


class _Worker:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Handle[Any]]] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._run, name="fmesh-create", daemon=True).start()

    def _run(self) -> None:
        while True:
            self._one(*self.jobs.get())

    def _one(self, fn: Callable[[], Any], handle: Handle[Any]) -> None:
        """One job; its frame, and with it the group it made, goes when it ends (a
        group destroyed after its call failed must not stay alive here)."""
        try:
            value, error = fn(), None
        except BaseException as err:  # handed to the caller, or dropped if late
            value, error = None, err
        with _lock:
            _idle.append(self)
        handle._finish(value, error)


_lock = threading.Lock()
_idle: list[_Worker] = []


def submit(fn: Callable[[], T]) -> Handle[T]:
    """Run ``fn()`` on an idle worker (a new one if none is idle), in the caller's
    context (its context variables: group descriptions, the stream)."""
    handle: Handle[T] = Handle()
    context = contextvars.copy_context()
    with _lock:
        worker = _idle.pop() if _idle else None
    if worker is None:
        worker = _Worker()
        started[0] += 1
    worker.jobs.put((lambda: context.run(fn), handle))
    return handle


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _idle.clear()  # their threads do not exist in the child


os.register_at_fork(after_in_child=_after_fork_in_child)
