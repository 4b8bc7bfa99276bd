"""A store whose waits a creating call's watch cuts short, for group creation.

torch's store waits (and the gloo rendezvous, which waits in the store) block in C++
until the key appears or the timeout passes; nothing in torch's API cancels them.
``InterruptibleStore`` forwards every operation to a connection the caller already
holds, and splits each wait into slices of ``slice_s`` seconds: between two slices it
asks ``cancelled()`` (the call's watch: ``_protocol/watch.py``), and raises
``DistNetworkError`` once that says yes. A *patient* store ignores the timeout its
waits are given (a group's own, counted from this rank's start): the call's watch
decides when to stop waiting (a rank missing at the call's timeout, a rank lost), so a
rank that reaches a group early is not failed by a peer that is only late. The slices
cost one request each, only while a wait lasts.

The module imports no torch (``fmesh.realize`` imports it with the package, so the first
creating call compiles nothing); the store class is built on first use.
"""

from __future__ import annotations

import datetime
import functools
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

__all__ = ["interruptible_store", "peek"]

_ABSENT = "\x00"
"""A value no key of fmesh or of a rendezvous holds."""


def peek(store: Store, key: str) -> bytes | None:
    """The value of ``key``, or ``None`` if it does not exist, in one request and
    without waiting: a ``compare_set`` that expects a value no key holds changes
    nothing and answers the key's value (or, for a missing key, what it expected). A
    ``get`` waits for the key first: two requests on a TCPStore, and a missing key
    blocks it, uncancellably, up to the store's timeout. Never peek a key that other
    clients wait for: on torch's TCPStore a ``compare_set`` of a missing key wakes the
    clients waiting for it, whose wait then returns as if it existed."""
    raw = bytes(store.compare_set(key, _ABSENT, _ABSENT))
    return None if raw == _ABSENT.encode() else raw


def interruptible_store(
    inner: Store,
    cancelled: Callable[[], bool],
    slice_s: float,
    why: str,
    patient: bool = False,
) -> Store:
    """A store that forwards to ``inner``, its waits cut into slices of ``slice_s``
    seconds that end (``DistNetworkError(why)``) once ``cancelled()``; ``patient``:
    its waits ignore the timeouts they are given and last until the key exists or the
    call is given up."""
    return _store_class()(inner, cancelled, slice_s, why, patient)


@functools.cache
def _store_class() -> Callable[[Store, Callable[[], bool], float, str, bool], Store]:
    from torch._C._distributed_c10d import Store

    class InterruptibleStore(Store):
        """Forwards to ``inner``; waits are cut into slices, ended once ``cancelled()``."""

        def __init__(
            self,
            inner: Store,
            cancelled: Callable[[], bool],
            slice_s: float,
            why: str,
            patient: bool = False,
        ) -> None:
            super().__init__()
            self.inner: Any = inner
            self._cancelled = cancelled
            self._slice = datetime.timedelta(seconds=slice_s)
            self._why = why
            self._patient = patient
            self.set_timeout(cast(Any, inner).timeout)
            self._present: frozenset[str] = frozenset()
            """The keys of the last wait that found them: gloo's rendezvous waits for a
            key, then gets it; the get need not wait again (one request, not three)."""

        def _raise_if_cancelled(self) -> None:
            import torch.distributed as dist

            if self._cancelled():
                raise dist.DistNetworkError(self._why)

        def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
            import torch.distributed as dist

            limit: datetime.timedelta = self.inner.timeout if timeout is None else timeout
            deadline = math.inf if self._patient else time.monotonic() + limit.total_seconds()
            while True:
                self._raise_if_cancelled()
                left = deadline - time.monotonic()
                step = min(self._slice, datetime.timedelta(seconds=max(min(left, 1e6), 0.001)))
                try:
                    self.inner.wait(keys, step)
                    self._present = frozenset(keys)
                    return
                except dist.DistStoreError:
                    if left <= step.total_seconds():
                        raise

        def get(self, key: str) -> bytes:
            # Read without waiting once a wait found the key, and wait again (in
            # slices) if it is not there: torch's store client can return from a
            # wait before its key exists (seen after an earlier wait of the same
            # client timed out), and its own get would then block uncancellably.
            while True:
                if key in self._present:
                    raw = peek(self.inner, key)
                    if raw is not None:
                        return raw
                    self._present = frozenset()
                self.wait([key])

        def set(self, key: str, value: Any) -> None:
            self.inner.set(key, value)

        def add(self, key: str, value: int) -> int:
            return int(self.inner.add(key, value))

        def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
            return bytes(self.inner.compare_set(key, expected, desired))

        def check(self, keys: list[str]) -> bool:
            return bool(self.inner.check(keys))

        def delete_key(self, key: str) -> bool:
            self._present = self._present - {key}
            return bool(self.inner.delete_key(key))

        def deleteKey(self, key: str) -> bool:  # the C++ side's name
            return self.delete_key(key)

        def num_keys(self) -> int:
            return int(self.inner.num_keys())

        def multi_get(self, keys: list[str]) -> list[bytes]:
            self.wait(keys)
            return [bytes(v) for v in self.inner.multi_get(keys)]

        def multi_set(self, keys: list[str], values: list[Any]) -> None:
            self.inner.multi_set(keys, values)

        def append(self, key: str, value: Any) -> None:
            self.inner.append(key, value)

        def has_extended_api(self) -> bool:
            return bool(self.inner.has_extended_api())

    return InterruptibleStore
