"""The watch in-process: simulated ranks' watches on one store, with real sentinels
(this process's own for live ranks, a killed one for a dead rank). A dead successor
is declared and named by every watch; the last rank out wakes the others and leaves
two keys, which the stream's next agreement deletes; a waiting rank's requests per
interval do not grow with the group; a sentinel tells a dead process from a stopped
one, and a stalled watcher does not take a live peer for dead. Real gloo ranks:
``tests/test_peerloss.py`` (deaths) and ``tests/test_slow_peers.py`` (live ranks that
are stopped or hold the GIL, a rank given up on).
"""

from __future__ import annotations

import datetime
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch.distributed as dist

from bench.counting import CountingStore
from fmesh import PeerLostError
from fmesh._compat import memory_store
from fmesh._compat.interruptible import peek
from fmesh._protocol import liveness, sentinel, watch
from fmesh._protocol.records import Record, Ticket

if TYPE_CHECKING:
    from fmesh._compat import Store


def _record() -> Record:
    return Record(0, 0, "mesh {'a': 3}", "")


def _ticket(store: Store, rank: int, n: int, prefix: str = "fmesh/a/1/p/1/") -> Ticket:
    return Ticket(store, rank, range(n), prefix, "realize call #1", _record, closing=True)


@pytest.fixture
def live() -> Iterator[sentinel.Sentinel]:
    watch._addresses.clear()
    yield sentinel.mine()
    watch._addresses.clear()


def _publish(store: Store, ranks: range, address: sentinel.Address) -> None:
    for r in ranks:
        store.set(sentinel.KEY + str(r), address.text())


Outcomes = dict[int, tuple[object, float]]


def _finish(w: watch.Watch, out: Outcomes) -> None:
    start = time.monotonic()
    try:
        w.finish(datetime.timedelta(seconds=60))
        out[w.ticket.rank] = ("ok", time.monotonic() - start)
    except Exception as err:
        out[w.ticket.rank] = (err, time.monotonic() - start)


def test_a_dead_successor_is_declared_and_every_watch_raises_naming_it(
    live: sentinel.Sentinel,
) -> None:
    store = memory_store()
    store.set_timeout(datetime.timedelta(seconds=10))
    dead = sentinel.Sentinel("127.0.0.1")
    _publish(store, range(2), live.address)
    _publish(store, range(2, 3), dead.address)
    dead.proc.kill()
    dead.proc.wait()
    tickets = [_ticket(store, r, 3) for r in (0, 1)]
    store.add(tickets[0].prefix + "done", 3)  # the agreement's three reads
    watches = [watch.Watch(t, None) for t in tickets]
    out: Outcomes = {}
    threads = [threading.Thread(target=_finish, args=(w, out)) for w in watches]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for w in watches:
        w.close()
    for rank in (0, 1):
        err, elapsed = out[rank]
        assert isinstance(err, PeerLostError), out
        assert err.lost == (2,), err
        assert "rank(s) [2] died during realize call #1" in str(err), err
        assert "(found by rank 1: its sentinel's port refused the connection" in str(err)
        assert elapsed < 15.0, out
    left = [k for k in ("done", "w/end", "w/lost", "w/by", "w/gone", "w/ok")]
    assert [peek(store, tickets[0].prefix + k) for k in left] == [None] * len(left)


def test_the_last_rank_out_wakes_the_others_and_the_next_call_cleans_up(
    live: sentinel.Sentinel,
) -> None:
    store = memory_store()
    _publish(store, range(3), live.address)
    tickets = [_ticket(store, r, 3) for r in range(3)]
    store.add(tickets[0].prefix + "done", 3)
    watches = [watch.Watch(t, None) for t in tickets]
    out: Outcomes = {}
    threads = [threading.Thread(target=_finish, args=(w, out)) for w in watches]
    for t in threads:
        t.start()
        time.sleep(0.2)
    for t in threads:
        t.join(30)
    for w in watches:
        w.close()
    assert [out[r][0] for r in range(3)] == ["ok"] * 3, out
    p = tickets[0].prefix
    assert peek(store, p + "done") == b"6" and peek(store, p + "w/ok") == b"1"
    # The stream's next agreement proves every rank left: its first rank deletes both.
    nxt = [_ticket(store, r, 3, "fmesh/a/1/p/2/") for r in range(3)]
    for ticket in nxt:
        liveness.after_agreement(ticket)
    assert peek(store, p + "done") is None and peek(store, p + "w/ok") is None


@pytest.mark.parametrize("n", [4, 16])
def test_a_waiting_ranks_requests_per_interval_do_not_grow_with_the_group(
    live: sentinel.Sentinel, n: int
) -> None:
    # Rank 0 waits for a key that never comes, in the call's sliced store: per
    # interval one slice and one read of the outcome, whatever the group's size.
    inner = memory_store()
    _publish(inner, range(n), live.address)
    counting = CountingStore(inner)
    w = watch.Watch(_ticket(counting, 0, n), datetime.timedelta(seconds=2))
    assert w.interval == 0.5
    seconds = 2.9  # slices start at 0, 0.5, ..., 2.5: each may read the outcome
    try:
        with pytest.raises(dist.DistStoreError):
            w.store.wait(["never"], datetime.timedelta(seconds=seconds))
    finally:
        w._stop.set()
        w._thread.join()
    requests = sum(counting.snapshot().values())
    keys = counting.key_snapshot()
    intervals = seconds / w.interval
    # The successor's address, read once per process, is one of those reads: it takes
    # the place of a read of the outcome (at most one read per interval).
    assert keys.get(sentinel.KEY + "1") == 1, keys
    assert keys[sentinel.KEY + "1"] + keys.get(w.p + "end", 0) <= intervals, keys
    assert requests <= 2 * intervals + 1, keys  # and a last, shorter slice


def test_a_stopped_sentinel_falls_silent_and_a_dead_one_closes() -> None:
    s = sentinel.Sentinel("127.0.0.1")
    link = sentinel.Link(s.address, silence=1.5)
    try:
        link.wait([], 0.5)
        assert not link.closed
        os.kill(s.proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not link.closed and time.monotonic() < deadline:
            link.wait([], 0.25)
        why: str = link.closed
        assert why == "its sentinel sent nothing for 1.5s", why
        again = sentinel.Link(s.address, silence=5.0)  # the kernel still accepts
        os.kill(s.proc.pid, signal.SIGKILL)
        s.proc.wait()
        again.wait([], 1.0)
        assert again.closed.startswith("its sentinel's connection"), again.closed
    finally:
        s.proc.kill()
        s.proc.wait()


def test_a_stalled_watcher_does_not_take_a_live_peer_for_dead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = sentinel.Sentinel("127.0.0.1")
    link = sentinel.Link(s.address, silence=1.0)
    try:
        link.wait([], 0.2)
        # The watcher's own process stalls for 3 s (a wait far longer than asked, as
        # when it is stopped): the peer's buffered bytes count once it wakes.
        original = select.select

        def stalled(*args: Any) -> Any:
            time.sleep(3.0)
            return original(*args)

        monkeypatch.setattr(select, "select", stalled)
        link.wait([], 0.2)
        monkeypatch.setattr(select, "select", original)
        assert not link.closed, link.closed
        link.wait([], 0.2)
        assert not link.closed, link.closed
    finally:
        s.proc.kill()
        s.proc.wait()


def test_a_sentinel_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).parents[1])!r})\n"
        "from fmesh._protocol import sentinel\n"
        "s = sentinel.Sentinel('127.0.0.1')\n"
        "print(s.proc.pid, s.address.port, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline().split()[0])
    os.kill(pid, 0)  # running
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"the sentinel {pid} outlived its parent by 10 s")


def test_a_rank_whose_sentinel_died_is_given_up_on(live: sentinel.Sentinel) -> None:
    store = memory_store()
    _publish(store, range(2), live.address)
    w = watch.Watch(_ticket(store, 0, 2), None)
    try:
        assert not w.cancelled()
        live.proc.kill()
        live.proc.wait()
        assert w.cancelled()
        err = w.error("creating a group", "")
    finally:
        w._stop.set()
        w._thread.join()
    assert isinstance(err, PeerLostError) and err.lost == (0,), err
    assert "rank 0 was given up on during realize call #1" in str(err), err
    assert "was killed by SIGKILL" in str(err), err
    assert sentinel.mine() is not live  # the next call starts another


def _store(kind: str, tmp: Path) -> Any:
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


def test_torchs_store_wakes_a_keys_waiters_on_a_compare_set_of_it() -> None:
    # Why nobody reads "ok" without waiting: on torch's TCPStore, a compare_set of a
    # missing key (what peek sends) wakes the clients waiting for that key, which then
    # return from their wait as if it existed.
    d: Any = dist
    server = d.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    waiter = d.TCPStore("127.0.0.1", server.port, 1, is_master=False)
    threading.Timer(0.3, peek, (server, "missing")).start()
    start = time.monotonic()
    waiter.wait(["missing"], datetime.timedelta(seconds=10))
    assert time.monotonic() - start < 5.0
    assert not waiter.check(["missing"])


def test_a_rank_the_verdict_names_learns_it_was_given_up_on(live: sentinel.Sentinel) -> None:
    # Its sentinel lives (the network cut it from its watcher): the verdict names it.
    store = memory_store()
    _publish(store, range(2), live.address)
    ticket = _ticket(store, 0, 2)
    store.set(ticket.prefix + "w/lost", "0,")
    store.set(ticket.prefix + "w/by", "1\x1fits sentinel sent nothing for 10s")
    store.set(ticket.prefix + "w/end", "lost")
    w = watch.Watch(ticket, datetime.timedelta(seconds=2))
    try:
        with pytest.raises(dist.DistNetworkError):
            w.store.wait(["never"], datetime.timedelta(seconds=5))
        err = w.error("creating a group", "")
    finally:
        w._stop.set()
        w._thread.join()
    assert isinstance(err, PeerLostError) and err.lost == (0,), err
    assert "rank 0 was given up on during realize call #1" in str(err), err
    assert "found by rank 1: its sentinel sent nothing for 10s" in str(err), err
