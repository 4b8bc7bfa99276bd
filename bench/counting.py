"""A store that forwards every operation to another and counts the requests it sends.

Wrap the store a process group is created with (``init_process_group(store=...)``)
to count what fmesh's agreement and torch's rendezvous ask of the store, request by
request as they go on the wire: a ``get`` is two (TCPStore waits for the key, then
reads it), every other operation one. Counts are kept per key class (:func:`kind`);
clones share their parent's counter.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from torch._C._distributed_c10d import Store

from fmesh._protocol import port

AGREE = "fmesh/a/"
"""What every key of fmesh's agreement contains."""
WATCH = ("end", "lost", "by", "miss", "verdict", "arr", "late", "to", "gone", "read")
"""The last parts of a call's keys that the watch reads or writes (its verdict, the
ranks present and late), apart from the record, the count and ``ok``."""
ADDRESSES = port.KEY
"""What every rank's liveness-port address key contains (one per rank, written once
per process and read once per watcher)."""


def kind(key: str) -> str:
    """``"watch"`` for the watch's keys (port addresses included), ``"agree"`` for the
    rest of fmesh's agreement keys (the stream's record, the call's count and ``ok``),
    ``"other"`` for the rest."""
    if ADDRESSES in key:
        return "watch"
    if AGREE not in key:
        return "other"
    return "watch" if key.rpartition("/")[2] in WATCH else "agree"


def delta(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """Counts added between two snapshots (keys with none left out)."""
    out = {k: n - before.get(k, 0) for k, n in after.items()}
    return {k: n for k, n in out.items() if n}


def by_call(keys: Mapping[str, int]) -> tuple[dict[str, float], dict[str, int], int]:
    """Of per-key request counts: the agreement's requests per call (by the prefix every
    key of one call shares; the stream's record ``S+"c"``, swapped once by each call,
    shared evenly among the stream's calls), the watch's per call, and the requests on
    port addresses (they belong to no one call)."""
    agree: Counter[str] = Counter()
    watch: Counter[str] = Counter()
    records: Counter[str] = Counter()
    for key, n in keys.items():
        call = key.rpartition("/")[0]
        if kind(key) == "agree" and key.endswith("/c"):
            records[call + "/"] += n
        elif kind(key) == "agree":
            agree[call] += n
        elif kind(key) == "watch" and ADDRESSES not in key:
            watch[call] += n
    shared: dict[str, float] = dict(agree)
    for stream, n in records.items():
        calls = [c for c in agree if c.startswith(stream)]
        for c in calls:
            shared[c] += n / len(calls)
    addresses = sum(n for key, n in keys.items() if ADDRESSES in key)
    return shared, dict(watch), addresses


class CountingStore(Store):
    """Forwards to ``inner``; ``counts[kind]`` is the number of requests sent, ``keys``
    the requests per key (a multi-key request counts for its first), ``reads`` the
    ``get`` requests per key."""

    def __init__(self, inner: Any, parent: CountingStore | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.counts: Counter[str] = parent.counts if parent is not None else Counter()
        self.reads: Counter[str] = parent.reads if parent is not None else Counter()
        self.keys: Counter[str] = parent.keys if parent is not None else Counter()
        self.peeks: Counter[str] = parent.peeks if parent is not None else Counter()
        self._lock: threading.Lock = parent._lock if parent is not None else threading.Lock()

    def _n(self, keys: str | list[str], n: int = 1) -> None:
        key = keys if isinstance(keys, str) else (keys[0] if keys else "")
        with self._lock:
            self.counts[kind(key)] += n
            self.keys[key] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def key_snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.keys)

    def key_reads(self, suffix: str) -> int:
        """``get`` requests, and reads that do not wait (fmesh's ``peek``: a
        ``compare_set`` that changes nothing), of keys ending with ``suffix``."""
        with self._lock:
            got = sum(n for key, n in self.reads.items() if key.endswith(suffix))
            return got + sum(n for key, n in self.peeks.items() if key.endswith(suffix))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        if expected == desired == "\x00":  # fmesh's peek
            with self._lock:
                self.peeks[key] += 1
        self._n(key)
        return bytes(self.inner.compare_set(key, expected, desired))

    def get(self, key: str) -> bytes:
        with self._lock:
            self.reads[key] += 1
        self._n(key, 2)
        return bytes(self.inner.get(key))

    def append(self, key: str, value: Any) -> None:  # not in torch's Store stubs
        self._n(key)
        self.inner.append(key, value)

    # The C++ side calls these two by their C++ names.
    def deleteKey(self, key: str) -> bool:
        return self.delete_key(key)

    def listKeys(self) -> list[str]:
        return self.list_keys()

    def list_keys(self) -> list[str]:
        return list(self.inner.list_keys())

    def has_extended_api(self) -> bool:
        return True

    def clone(self) -> CountingStore:
        return CountingStore(self.inner.clone(), self)


def _forward(name: str, requests: int) -> Callable[..., Any]:
    def method(self: CountingStore, *args: Any) -> Any:
        self._n(args[0] if args else "", requests)
        return getattr(self.inner, name)(*args)

    method.__name__ = method.__qualname__ = name
    return method


# Every other operation: counted by its first key (num_keys: none), then forwarded.
_OPS = {"set": 1, "add": 1, "check": 1, "wait": 1, "delete_key": 1}
_OPS |= {"num_keys": 1, "multi_get": 2, "multi_set": 1}
for _name, _requests in _OPS.items():
    setattr(CountingStore, _name, _forward(_name, _requests))
