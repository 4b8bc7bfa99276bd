"""The agreement protocol of ``fmesh/_protocol/agreement.py`` on a real TCPStore.

Two kinds of jobs:

* real processes (``run_spawn``), each a plain client of the job's TCPStore with no
  process group, for what crosses process boundaries: request counts per rank, a rank
  that disagrees, a rank that never comes, a late rank;
* ranks played by threads of this process, each with its own client, for the races
  that need a precise interleaving (a timeout racing the last arrival), forced with a
  store wrapper that parks a chosen request until a chosen moment.

Requests are counted by ``bench.counting.CountingStore`` as they go on the wire (a
``get`` is two), and leftover keys with the store's own ``list_keys``.
"""

from __future__ import annotations

import collections
import datetime
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from _dist import Job, run_spawn

from bench.counting import CountingStore
from fmesh import MeshMismatchError
from fmesh._protocol import agreement as _agree

if TYPE_CHECKING:
    from fmesh._compat import Store

LONG = datetime.timedelta(seconds=60)
"""A timeout no healthy scenario gets near: failures must surface long before it."""
SURFACE = 10.0
"""Bound on the seconds a mismatch may take to reach every rank."""


def _tcp(port: int = 0, *, master: bool = False) -> Any:
    import torch.distributed as dist

    tcp: Any = dist.TCPStore  # type: ignore[attr-defined]  # implicit re-export
    return tcp("127.0.0.1", port, 1, is_master=master, wait_for_workers=False)


def _record(rank: int, code: int, summary: str, history: str = "") -> Callable[[], Any]:
    return lambda: _agree.Record(rank, code, summary, history)


def _agree_call(
    store: Any,
    rank: int,
    world: int,
    code: int,
    call: int,
    *,
    summary: str | None = None,
    history: str = "",
    timeout: datetime.timedelta = LONG,
    stream: str = "s",
) -> _agree.Ticket:
    text = summary if summary is not None else f"mesh#{code}"
    return _agree.agree(
        cast("Store", store),
        rank=rank,
        ranks=range(world),
        code=code,
        record=_record(rank, code, text, history),
        timeout=timeout,
        prefix=f"{_agree.KEY_ROOT}t/{stream}/{call}/",
        where=f"call #{call} of {stream!r}",
    )


def _attempt(fn: Callable[[], object]) -> dict[str, Any]:
    start = time.monotonic()
    try:
        fn()
    except MeshMismatchError as err:
        return {"error": True, "message": str(err), "elapsed": time.monotonic() - start}
    return {"error": False, "elapsed": time.monotonic() - start}


def _barrier(store: Any, name: str, world: int, me: int) -> None:
    store.set(f"test/{name}/{me}", "1")
    store.wait([f"test/{name}/{r}" for r in range(world)], LONG)


def _client() -> Any:
    return _tcp(int(os.environ["MASTER_PORT"]))


# -- process jobs ---------------------------------------------------------------------------


def ok_job(rank: int, world: int, calls: int) -> dict[str, Any]:
    """``calls`` agreed calls in a row; the requests each one cost this rank."""
    raw = _client()
    store = CountingStore(raw)
    per_call = []
    for call in range(1, calls + 1):
        before = store.snapshot().get("agree", 0)
        _agree_call(store, rank, world, code=42, call=call)
        per_call.append(store.snapshot().get("agree", 0) - before)
    _barrier(raw, "done", world, rank)
    left = _agree.count_keys(raw) if rank == 0 else 0
    return {"per_call": per_call, "left": left}


def mismatch_job(rank: int, world: int, odd: int, history_only: bool) -> dict[str, Any]:
    """Rank ``odd`` publishes another code: another mesh, or the same mesh after other
    memo hits."""
    raw = _client()
    if history_only:
        summary, history = "Mesh(a=4)", ("2 memoized calls" if rank == odd else "")
    else:
        summary, history = ("Mesh(odd=4)" if rank == odd else "Mesh(a=4)"), ""
    code = 7 if rank == odd else 5
    if rank == odd:
        time.sleep(0.3 if odd else 0.0)  # rank 0 is odd and first, or others are first
    out = _attempt(
        lambda: _agree_call(raw, rank, world, code, 1, summary=summary, history=history)
    )
    _barrier(raw, "done", world, rank)
    out["left"] = _agree.count_keys(raw) if rank == 0 else 0
    return out


def missing_job(rank: int, world: int, late: int, timeout_s: float) -> dict[str, Any]:
    """Rank ``late`` comes only after the others gave up; the who list is read once."""
    raw = _client()
    store = CountingStore(raw)
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == late:
        raw.wait(["test/gave-up"], LONG)
    out = _attempt(lambda: _agree_call(store, rank, world, 3, 1, timeout=timeout))
    if rank != late and raw.add("test/gave-up-count", 1) == world - 1:
        raw.set("test/gave-up", "1")
    out["who_reads"] = store.key_reads("/who")
    _barrier(raw, "done", world, rank)
    out["left"] = _agree.count_keys(raw) if rank == 0 else 0
    return out


def _values(job: Job) -> list[dict[str, Any]]:
    return cast("list[dict[str, Any]]", job.values())


def _store_port() -> tuple[Any, int]:
    master = _tcp(master=True)
    return master, int(master.port)


# -- process tests --------------------------------------------------------------------------


def test_an_agreed_call_costs_torchs_barrier_and_leaves_no_keys(tmp_path: Path) -> None:
    world, calls = 8, 5
    outs = _values(run_spawn(ok_job, world, calls, tmp_path=tmp_path, timeout=60))
    for call in range(calls):
        per_rank = [out["per_call"][call] for out in outs]
        # add + wait + add on most ranks; the last arrival skips the wait and deletes
        # the sum; the last reader deletes the done key.
        assert max(per_rank) <= 4, per_rank
        assert sum(per_rank) == 3 * world + 1, per_rank
    assert outs[0]["left"] == 0, outs[0]


@pytest.mark.parametrize("odd", [0, 3], ids=["odd-rank-first", "odd-rank-later"])
def test_one_rank_different_every_rank_raises_naming_both(tmp_path: Path, odd: int) -> None:
    outs = _values(run_spawn(mismatch_job, 4, odd, False, tmp_path=tmp_path, timeout=60))
    for rank, out in enumerate(outs):
        assert out["error"] and out["elapsed"] < SURFACE, (rank, out)
        assert "Mesh(odd=4)" in out["message"] and "Mesh(a=4)" in out["message"], out
        assert re.search(
            rf"ranks ({odd} and \d|\d and {odd}) disagree at call #1", out["message"]
        )
    assert outs[0]["left"] == 0, outs[0]


def test_same_mesh_after_other_hits_is_a_mismatch(tmp_path: Path) -> None:
    outs = _values(run_spawn(mismatch_job, 4, 2, True, tmp_path=tmp_path, timeout=60))
    for out in outs:
        assert out["error"] and out["elapsed"] < SURFACE, out
        assert "both realize Mesh(a=4), but not after the same calls" in out["message"], out
        assert "rank 2 made 2 memoized calls" in out["message"], out
    assert outs[0]["left"] == 0, outs[0]


def test_missing_rank_named_who_read_once_late_rank_raises(tmp_path: Path) -> None:
    world, late, timeout_s = 4, 1, 2.0
    outs = _values(
        run_spawn(missing_job, world, late, timeout_s, tmp_path=tmp_path, timeout=60)
    )
    for rank, out in enumerate(outs):
        assert out["error"], (rank, out)
        if rank == late:
            assert out["elapsed"] < SURFACE, out
            assert (
                f"rank {late} arrived after the other ranks gave up on call #1"
                in out["message"]
            )
        else:
            # A waiting rank raises when the first rank's timeout fires: its own clock
            # started up to a process start-up later on a loaded machine.
            assert timeout_s - 1.0 < out["elapsed"] < timeout_s + SURFACE, out
        assert f"ranks [{late}] never reached call #1 of 's' within 2s" in out["message"], out
    # One rank (the coordinator) read the list of arrivals, once.
    assert sum(out["who_reads"] for out in outs) == 1, outs
    assert outs[0]["left"] == 0, outs[0]


# -- thread tests ---------------------------------------------------------------------------


class Gate:
    """Parks the ``nth`` request ``op`` on a key ending with ``suffix``."""

    def __init__(self, op: str, suffix: str, nth: int = 1) -> None:
        self.op, self.suffix, self.nth = op, suffix, nth
        self.seen = 0
        self.reached = threading.Event()
        self.release = threading.Event()


class OwnClient(CountingStore):
    """The client of one thread-played rank: made in advance, never cloned (a clone
    connects anew, which can stall when many connect at once)."""

    def clone(self) -> CountingStore:
        return self


class ParkingStore(OwnClient):
    """A client that parks chosen requests until their gate is released."""

    def __init__(self, inner: Any, *gates: Gate) -> None:
        super().__init__(inner)
        self.gates = gates

    def _gate(self, op: str, key: str) -> None:
        for gate in self.gates:
            if gate.op == op and key.endswith(gate.suffix):
                gate.seen += 1
                if gate.seen == gate.nth:
                    gate.reached.set()
                    assert gate.release.wait(30)

    def add(self, key: str, value: int) -> int:
        self._gate("add", key)
        return super().add(key, value)

    def delete_key(self, key: str) -> bool:
        self._gate("delete_key", key)
        return super().delete_key(key)


def _run_threads(targets: dict[int, Callable[[], object]]) -> dict[int, dict[str, Any]]:
    results: dict[int, dict[str, Any]] = {}

    def run(rank: int, fn: Callable[[], object]) -> None:
        results[rank] = _attempt(fn)

    threads = [
        threading.Thread(target=run, args=item, name=f"rank{item[0]}")
        for item in targets.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results


@pytest.mark.parametrize("moment", ["before-cleanup", "after-cleanup"])
def test_timeout_racing_the_last_arrival_finds_the_call_done(moment: str) -> None:
    """Rank 0 times out and takes over as coordinator; just then rank 1 arrives (so
    the call is complete) and deletes the sum before or after rank 0 poisons it.
    Both ranks must succeed, and no key may be left."""
    master, port = _store_port()
    poison = Gate("add", "/n", nth=2)  # rank 0's second add of the sum
    arrive = Gate("add", "/n")
    cleanup = Gate("delete_key", "/n")
    rank0 = ParkingStore(_tcp(port), poison)
    rank1 = ParkingStore(_tcp(port), arrive, cleanup)
    finished = threading.Event()

    def last() -> None:
        _agree_call(rank1, 1, 2, 9, 1)
        finished.set()

    def choreography() -> None:
        assert poison.reached.wait(30)  # rank 0 timed out and won the coordination
        arrive.release.set()  # rank 1's arrival completes the call
        if moment == "before-cleanup":
            assert cleanup.reached.wait(30)
            poison.release.set()  # the poison lands on a complete sum
            time.sleep(0.5)
            cleanup.release.set()
        else:
            cleanup.release.set()
            assert finished.wait(30)  # the sum is gone: the poison re-creates it
            poison.release.set()

    conductor = threading.Thread(target=choreography)
    conductor.start()
    short = datetime.timedelta(seconds=0.5)
    outs = _run_threads({0: lambda: _agree_call(rank0, 0, 2, 9, 1, timeout=short), 1: last})
    conductor.join(30)
    assert not outs[0]["error"] and not outs[1]["error"], outs
    assert _agree.count_keys(master) == 0, master.list_keys()


def test_census_of_many_ranks_reads_the_list_once() -> None:
    """32 ranks, 3 never come: each waiting rank raises naming exactly those three,
    and the list of arrivals is read by one rank, once."""
    _master, port = _store_port()
    world, missing = 32, (5, 17, 30)
    stores = {r: OwnClient(_tcp(port)) for r in range(world) if r not in missing}
    # Long enough for 29 threads to arrive on a loaded machine (a live rank that has
    # not arrived by the timeout is named with the missing ones).
    timeout = datetime.timedelta(seconds=4)

    def play(r: int) -> Callable[[], object]:
        return lambda: _agree_call(stores[r], r, world, 1, 1, timeout=timeout)

    outs = _run_threads({r: play(r) for r in stores})
    for r, out in outs.items():
        assert out["error"], (r, out)
        assert "ranks [5, 17, 30] never reached call #1" in out["message"], out
    assert sum(s.key_reads("/who") for s in stores.values()) == 1


def test_world_of_one_touches_nothing() -> None:
    _master, port = _store_port()
    store = OwnClient(_tcp(port))
    _agree_call(store, 0, 1, 5, 1)
    assert store.snapshot() == {}


def test_streams_meet_independently_of_interleaving() -> None:
    """Two streams per rank, entered in opposite orders on the two ranks."""
    master, port = _store_port()
    conns = {r: OwnClient(_tcp(port)) for r in range(4)}

    def two_streams(rank: int) -> None:
        order = ("x", "y") if rank == 0 else ("y", "x")

        def enter(i: int, stream: str) -> Callable[[], object]:
            return lambda: _agree_call(conns[2 * rank + i], rank, 2, 11, 1, stream=stream)

        inner = _run_threads({i: enter(i, s) for i, s in enumerate(order)})
        assert all(not o["error"] for o in inner.values()), inner

    outs = _run_threads({0: lambda: two_streams(0), 1: lambda: two_streams(1)})
    assert all(not o["error"] for o in outs.values()), outs
    assert _agree.count_keys(master) == 0


def test_weights_are_odd_and_bounded() -> None:
    counts = collections.Counter(_agree.weight(code, 1 << 20) % 2 for code in range(1000))
    assert counts == {1: 1000}
    assert all((1 << 20) * _agree.weight(c, 1 << 20) < 1 << 58 for c in (0, 1 << 70, 12345))
