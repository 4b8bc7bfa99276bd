"""The store group creation waits in under a watch: waits end at the next slice once
cancelled, and otherwise behave as the store's own (a value, or torch's timeout error).

In-process, on torch's ``HashStore``; the same store under real gloo ranks that lose a
peer is exercised in ``tests/test_peerloss.py``.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import TYPE_CHECKING, cast

import pytest
import torch.distributed as dist

from fmesh._compat import memory_store  # torch's HashStore
from fmesh._compat.interruptible import interruptible_store
from fmesh._protocol.records import wait_get

if TYPE_CHECKING:
    from fmesh._compat import Store


def _store(cancelled: threading.Event, slice_s: float = 0.05) -> Store:
    inner = memory_store()
    inner.set_timeout(datetime.timedelta(seconds=5))
    return interruptible_store(inner, cancelled.is_set, slice_s, "given up")


def test_a_get_returns_the_value_set_by_another_thread_after_several_slices() -> None:
    store = _store(threading.Event())
    threading.Timer(0.3, store.set, ("k", b"v")).start()
    assert store.get("k") == b"v"


def test_a_cancelled_wait_raises_within_one_slice() -> None:
    cancelled = threading.Event()
    store = _store(cancelled)
    at: list[float] = []

    def cancel() -> None:
        at.append(time.monotonic())
        cancelled.set()

    threading.Timer(0.2, cancel).start()
    with pytest.raises(dist.DistNetworkError, match="given up"):
        store.get("never")
    # Within a slice (0.05 s) of the cancel, and a loaded machine's scheduling.
    assert time.monotonic() - at[0] < 1.0


def test_a_wait_past_its_timeout_raises_torchs_timeout_error() -> None:
    store = _store(threading.Event())
    start = time.monotonic()
    with pytest.raises(dist.DistStoreError):
        store.wait(["never"], datetime.timedelta(seconds=0.3))
    assert 0.25 <= time.monotonic() - start < 1.5  # the store keeps its own clock


def test_other_operations_are_forwarded() -> None:
    store = _store(threading.Event())
    store.set("a", "1")
    assert store.add("n", 2) == 2
    assert store.compare_set("a", "1", "2") == b"2"
    assert store.check(["a", "n"]) and not store.check(["b"])
    assert store.multi_get(["a", "n"]) == [b"2", b"2"]
    assert store.delete_key("a") and not store.check(["a"])


def test_a_patient_wait_outlasts_its_timeout_until_the_key_or_the_cancel() -> None:
    # A group's rendezvous counts its timeout from this rank's start: a patient store
    # waits on past it (the call's watch decides), until the key comes or a cancel.
    cancelled = threading.Event()
    inner = memory_store()
    store = interruptible_store(inner, cancelled.is_set, 0.05, "given up", patient=True)
    start = time.monotonic()
    threading.Timer(0.4, inner.set, ("k", b"v")).start()
    store.wait(["k"], datetime.timedelta(seconds=0.1))
    assert 0.3 < time.monotonic() - start < 3.0
    threading.Timer(0.4, cancelled.set).start()
    with pytest.raises(dist.DistNetworkError, match="given up"):
        store.wait(["never"], datetime.timedelta(seconds=0.1))


class _Counting:
    """A stand-in for the caller's connection: forwards to ``inner``, names each call;
    ``early`` waits return at once, whether the key exists or not (as torch's store
    client can after an earlier wait of its timed out)."""

    timeout = datetime.timedelta(seconds=5)

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.calls: list[str] = []
        self.early = 0

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
        self.calls.append("wait")
        if self.early:
            self.early -= 1
            return
        self.inner.wait(keys, timeout)

    def __getattr__(self, name: str) -> object:
        self.calls.append(name)
        return getattr(self.inner, name)


def test_a_get_after_a_wait_for_its_key_sends_one_request() -> None:
    # gloo's rendezvous waits for a key, then gets it: the get reads without waiting
    # again (one compare_set, where the store's own get waits first); a get of any
    # other key waits first (in slices, cancellable).
    conn = _Counting(memory_store())
    store = interruptible_store(cast("Store", conn), threading.Event().is_set, 0.05, "x")
    store.set("k", "v")
    store.set("other", "w")
    conn.calls.clear()
    store.wait(["k"])
    assert store.get("k") == b"v"
    assert conn.calls == ["wait", "compare_set"]
    conn.calls.clear()
    assert store.get("other") == b"w"
    assert conn.calls == ["wait", "compare_set"]


def test_a_wait_that_returns_before_its_key_exists_is_waited_again() -> None:
    # The get neither returns a value that is not there nor blocks uncancellably: it
    # finds the key missing and waits again, in slices, until it is set.
    conn = _Counting(memory_store())
    store = interruptible_store(cast("Store", conn), threading.Event().is_set, 0.05, "x")
    conn.early = 1
    start = time.monotonic()
    threading.Timer(0.3, conn.inner.set, ("late", "v")).start()
    assert store.get("late") == b"v"
    assert time.monotonic() - start >= 0.25
    assert conn.calls[:2] == ["wait", "compare_set"]
    assert conn.calls.count("wait") >= 2


def test_wait_get_waits_again_after_a_wait_that_returned_early() -> None:
    # The protocol's reads (the closing barrier's outcome, a verdict) get the same care.
    conn = _Counting(memory_store())
    conn.early = 2
    threading.Timer(0.3, conn.inner.set, ("end", "ok")).start()
    assert wait_get(cast("Store", conn), "end", 5.0) == b"ok"
    assert conn.calls.count("wait") >= 3
    conn.early = 1
    start = time.monotonic()
    assert wait_get(cast("Store", conn), "never", 0.3) is None
    assert 0.25 <= time.monotonic() - start < 2.0
