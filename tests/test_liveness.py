"""The watch's verdict, in-process: three ranks' watches on one torch ``HashStore``,
rank 2 never beats. The watchers name rank 2 alone, and the rank that declares it goes
on beating until it publishes the end (a declaring rank that went quiet was taken for
lost by its own watchers on a loaded CI machine). Real gloo ranks that lose a peer:
``tests/test_peerloss.py``.
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Any

import pytest

from fmesh._compat import memory_store
from fmesh._compat.interruptible import peek
from fmesh._runtime import liveness
from fmesh._runtime.agreement_records import Record, Ticket


def _record() -> Record:
    return Record(0, 0, "mesh {'a': 3}", "")


def test_the_declaring_rank_beats_on_until_the_end_is_published() -> None:
    store = memory_store()
    store.set_timeout(datetime.timedelta(seconds=5))
    ranks = (0, 1, 2)
    tickets = [Ticket(store, r, ranks, "t/", "realize call #1", _record) for r in (0, 1)]
    timeout = datetime.timedelta(seconds=1)  # patience 1 s, interval 0.25 s
    interval, patience = liveness.settings(timeout)
    watches = [liveness.Watch(t, timeout) for t in tickets]
    p = watches[0].p
    try:
        # Each live rank waits for the other and for rank 2.
        with watches[0].waiting_for({1, 2}), watches[1].waiting_for({0, 2}):
            deadline = time.monotonic() + patience + 10 * interval + 5.0
            while not store.check([p + "lost"]):
                assert time.monotonic() < deadline, "rank 2 was never declared lost"
                time.sleep(0.01)
            by = int(store.get(p + "by"))
            beat_at_verdict = store.add(f"{liveness.BEATS}{by}", 0)
            while not store.check([p + "end"]):
                assert time.monotonic() < deadline, "the end was never published"
                time.sleep(0.01)
            beat_at_end = store.add(f"{liveness.BEATS}{by}", 0)
        assert store.get(p + "end") == b"lost"
        assert [w.lost() for w in watches] == [(2,), (2,)]
        assert beat_at_end > beat_at_verdict, (beat_at_verdict, beat_at_end)
        for w in watches:
            assert w.verdict() == "lost"
            assert "rank(s) [2] died" in str(w.error("creating a group", "")), w
    finally:
        for w in watches:
            w.close()


def _store(kind: str, tmp: Path) -> Any:
    import torch.distributed as dist

    d: Any = dist  # TCPStore, FileStore, PrefixStore: implicit re-exports
    if kind == "hash":
        return memory_store()
    if kind == "file":
        return d.FileStore(str(tmp / "store"), 1)
    tcp = d.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    return tcp if kind == "tcp" else d.PrefixStore("default_pg", tcp)


@pytest.mark.parametrize("kind", ["hash", "tcp", "file", "prefix"])
def test_peek_reads_a_key_without_waiting_and_never_creates_one(
    kind: str, tmp_path: Path
) -> None:
    # The watch reads a call's outcome with one request (a get would wait first).
    store = _store(kind, tmp_path)
    assert peek(store, "missing") is None
    assert not store.check(["missing"])
    store.set("end", "ok")
    assert peek(store, "end") == b"ok"
    assert store.get("end") == b"ok"
    assert store.add("n", 3) == 3
    assert peek(store, "n") == b"3"
    assert store.add("n", 0) == 3
