"""The cross-rank protocol of ``fmesh/_protocol/agreement.py`` and ``watch.py`` on a
real TCPStore, with no group to create (``_protocol.call``).

Two kinds of jobs:

* real processes (``run_spawn``), each a plain client of the job's TCPStore with no
  process group, for what crosses process boundaries: request counts per rank, a rank
  that disagrees, a rank that never comes, a late rank;
* ranks played by threads of this process, each with its own client, for the races
  that need a precise interleaving (a timeout racing the last arrival), forced with a
  store wrapper that parks a chosen request until a chosen moment.

Requests are counted by ``bench.counting.CountingStore`` as they go on the wire (a
``get`` is two), and leftover keys with the store's own ``list_keys``. The liveness
port and links are off here (``FMESH_PEER_WATCH=0``): ``tests/test_liveness.py``.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from _dist import Job, run_spawn
from _protocol import call, keys, no_liveness, protocol_only

from bench.counting import CountingStore
from fmesh import MeshMismatchError, PeerLostError
from fmesh._protocol import agreement
from fmesh._protocol.records import ABORT, Ticket
from fmesh._protocol.watch import Watch

SURFACE = 12.0
"""Bound on the seconds a mismatch may take to reach every rank."""


def _tcp(port: int = 0, *, master: bool = False) -> Any:
    import torch.distributed as dist

    tcp: Any = dist.TCPStore  # type: ignore[attr-defined]  # implicit re-export
    return tcp("127.0.0.1", port, 1, is_master=master, wait_for_workers=False)


def _attempt(fn: Callable[[], object]) -> dict[str, Any]:
    start = time.monotonic()
    try:
        fn()
    except MeshMismatchError as err:
        return {"error": True, "message": str(err), "elapsed": time.monotonic() - start}
    return {"error": False, "elapsed": time.monotonic() - start}


def _barrier(store: Any, name: str, world: int, me: int) -> None:
    store.set(f"test/{name}/{me}", "1")
    store.wait([f"test/{name}/{r}" for r in range(world)], datetime.timedelta(seconds=60))


def _client() -> Any:
    no_liveness()
    return _tcp(int(os.environ["MASTER_PORT"]))


class OwnClient(CountingStore):
    """The client of one rank: never cloned (the protocol then uses it as it is)."""

    def clone(self) -> CountingStore:
        return self


# -- process jobs ---------------------------------------------------------------------------


def ok_job(rank: int, world: int, calls: int) -> dict[str, Any]:
    """``calls`` calls in a row; the requests each one cost this rank."""
    raw = _client()
    store = OwnClient(raw)
    per_call = []
    for number in range(1, calls + 1):
        # Every rank starts each call together (a meeting on the raw client, not
        # counted): a rank that waits past a slice of its wait (1 s: process start-up,
        # or CPU, on a loaded machine) would make another request.
        _barrier(raw, f"call{number}", world, rank)
        before = store.snapshot().get("agree", 0)
        call(store, rank, world, code=42, number=number)
        per_call.append(store.snapshot().get("agree", 0) - before)
    _barrier(raw, "done", world, rank)
    return {"per_call": per_call, "left": keys(raw) if rank == 0 else []}


def mismatch_job(rank: int, world: int, odd: int, history_only: bool) -> dict[str, Any]:
    """Rank ``odd`` makes another call: another mesh, or the same mesh after other
    memo hits."""
    raw = _client()
    if history_only:
        summary, history = "Mesh(a=4)", ("2 memoized calls" if rank == odd else "")
    else:
        summary, history = ("Mesh(odd=4)" if rank == odd else "Mesh(a=4)"), ""
    code = 7 if rank == odd else 5
    if rank == odd:
        time.sleep(0.3 if odd else 0.0)  # rank 0 is odd and first, or others are first
    out = _attempt(lambda: call(raw, rank, world, code, summary=summary, history=history))
    _barrier(raw, "done", world, rank)
    out["left"] = keys(raw) if rank == 0 else []
    return out


def missing_job(rank: int, world: int, late: int, timeout_s: float) -> dict[str, Any]:
    """Rank ``late`` comes only after the others gave up; the list of ranks present is
    read once."""
    raw = _client()
    store = OwnClient(raw)
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == late:
        raw.wait(["test/gave-up"], datetime.timedelta(seconds=60))
    out = _attempt(lambda: call(store, rank, world, 3, timeout=timeout))
    if rank != late and raw.add("test/gave-up-count", 1) == world - 1:
        raw.set("test/gave-up", "1")
    out["arr_reads"] = store.key_reads("/arr")
    _barrier(raw, "done", world, rank)
    out["left"] = keys(raw) if rank == 0 else []
    return out


def _values(job: Job) -> list[dict[str, Any]]:
    return cast("list[dict[str, Any]]", job.values())


# -- process tests --------------------------------------------------------------------------


def test_a_call_costs_three_requests_a_rank_and_two_for_the_last_one(tmp_path: Path) -> None:
    world, calls = 8, 5
    outs = _values(run_spawn(ok_job, world, calls, tmp_path=tmp_path, timeout=60))
    for number in range(calls):
        per_rank = [out["per_call"][number] for out in outs]
        # The record (compare_set), the count (add), the wait; the last rank out sets
        # "ok" in place of the wait, and removes the previous call's two keys.
        removed = 2 if number else 0
        assert sorted(per_rank) == [3] * (world - 1) + [3 + removed], per_rank
    # Left: the stream's record, and the last call's count and "ok" (the next call's).
    assert outs[0]["left"] == sorted(["c", f"{calls}/n", f"{calls}/ok"]), outs[0]


@pytest.mark.parametrize("odd", [0, 3], ids=["odd-rank-first", "odd-rank-later"])
def test_one_rank_different_every_rank_raises_naming_both(tmp_path: Path, odd: int) -> None:
    outs = _values(run_spawn(mismatch_job, 4, odd, False, tmp_path=tmp_path, timeout=60))
    for rank, out in enumerate(outs):
        assert out["error"] and out["elapsed"] < SURFACE, (rank, out)
        assert "Mesh(odd=4)" in out["message"] and "Mesh(a=4)" in out["message"], out
        assert re.search(
            rf"ranks ({odd} and \d|\d and {odd}) disagree at call #1", out["message"]
        ), out
    assert outs[0]["left"] == ["c"], outs[0]  # every rank out: the call's keys are gone


def test_same_mesh_after_other_hits_is_a_mismatch(tmp_path: Path) -> None:
    outs = _values(run_spawn(mismatch_job, 4, 2, True, tmp_path=tmp_path, timeout=60))
    for out in outs:
        assert out["error"] and out["elapsed"] < SURFACE, out
        assert "both realize Mesh(a=4), but not after the same calls" in out["message"], out
        assert "rank 2 made 2 memoized calls" in out["message"], out
    assert outs[0]["left"] == ["c"], outs[0]


def test_missing_rank_named_list_read_once_late_rank_raises(tmp_path: Path) -> None:
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
                in (out["message"])
            )
        else:
            # A waiting rank raises when the first rank's timeout fires: its own clock
            # started up to a process start-up later on a loaded machine.
            assert timeout_s - 1.0 < out["elapsed"] < timeout_s + SURFACE, out
        assert f"ranks [{late}] never reached call #1 of 's' within 2s" in out["message"], out
    # One rank (the census's coordinator) read the list of ranks present, once.
    assert sum(out["arr_reads"] for out in outs) == 1, outs
    # Every rank is out, the late one included (it read the verdict): nothing is left.
    assert outs[0]["left"] == ["c"], outs[0]


# -- thread tests ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _protocol_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with protocol_only(monkeypatch):
        yield


class Gate:
    """Parks the ``nth`` request ``op`` on a key ending with ``suffix``."""

    def __init__(self, op: str, suffix: str, nth: int = 1) -> None:
        self.op, self.suffix, self.nth = op, suffix, nth
        self.seen = 0
        self.reached = threading.Event()
        self.release = threading.Event()


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


def _store_port() -> tuple[Any, int]:
    master = _tcp(master=True)
    return master, int(master.port)


def test_a_timeout_racing_the_last_arrival_finds_the_call_done() -> None:
    """Rank 0 waits past its timeout and coordinates a census; rank 1 arrives while
    it runs and completes the call, then the census would poison it. Both ranks must
    succeed, and only what the next call removes is left."""
    master, port = _store_port()
    poison = Gate("add", "/n", nth=2)  # rank 0's second add of the count: the poison
    rank0 = ParkingStore(_tcp(port), poison)
    rank1 = OwnClient(_tcp(port))
    done = threading.Event()

    def last() -> None:
        master.wait(["fmesh/a/t/s/1/end"], datetime.timedelta(seconds=30))  # census on
        call(rank1, 1, 2, 9)
        done.set()

    def conductor() -> None:
        assert done.wait(30)
        poison.release.set()  # the poison lands on a complete count

    threading.Thread(target=conductor, daemon=True).start()
    short = datetime.timedelta(seconds=1)
    outs = _run_threads({0: lambda: call(rank0, 0, 2, 9, timeout=short), 1: last})
    assert not outs[0]["error"] and not outs[1]["error"], outs
    assert keys(master) == ["1/n", "1/ok", "c"], master.list_keys()


def test_census_of_many_ranks_reads_the_list_once() -> None:
    """32 ranks, 3 never come: each waiting rank raises naming those three, every
    rank the same ranks (one verdict), and the list of ranks present is read by one
    rank, once. (A rank that is there but gets no CPU for the census's grace, 4 s here,
    is named too: 29 threads of one process on a loaded machine can be.)"""
    _master, port = _store_port()
    world, missing = 32, (5, 17, 30)
    stores = {r: OwnClient(_tcp(port)) for r in range(world) if r not in missing}
    timeout = datetime.timedelta(seconds=4)

    def play(r: int) -> Callable[[], object]:
        return lambda: call(stores[r], r, world, 1, timeout=timeout)

    outs = _run_threads({r: play(r) for r in stores})
    named = set()
    for r, out in outs.items():
        assert out["error"], (r, out)
        found = re.search(r"ranks \[([\d, ]+)\] never reached call #1", out["message"])
        assert found, out
        named.add(found.group(1))
    (ranks,) = named
    assert {5, 17, 30} <= {int(r) for r in ranks.split(", ")}, ranks
    assert sum(s.key_reads("/arr") for s in stores.values()) == 1


def test_ranks_only_slow_at_the_timeout_are_waited_for() -> None:
    """Every rank is there at the timeout, one of them still creating its groups (a
    wait of 4 s, in the call's store): the census is called off, and the call ends
    well."""
    master, port = _store_port()
    conns = {r: OwnClient(_tcp(port)) for r in range(2)}
    timeout = datetime.timedelta(seconds=1)
    threading.Timer(4.0, master.set, ("test/created", "1")).start()

    def creating(watch: Watch, ticket: Ticket) -> None:
        watch.store_for(ticket.conn).wait(["test/created"], timeout)

    outs = _run_threads(
        {
            0: lambda: call(conns[0], 0, 2, 4, timeout=timeout),
            1: lambda: call(conns[1], 1, 2, 4, timeout=timeout, during=creating),
        }
    )
    assert not outs[0]["error"] and not outs[1]["error"], outs
    assert keys(master) == ["1/n", "1/ok", "c"], master.list_keys()


def test_world_of_one_touches_nothing() -> None:
    _master, port = _store_port()
    store = OwnClient(_tcp(port))
    call(store, 0, 1, 5)
    assert store.snapshot() == {}


def test_streams_meet_independently_of_interleaving() -> None:
    """Two streams per rank, entered in opposite orders on the two ranks."""
    master, port = _store_port()
    conns = {r: OwnClient(_tcp(port)) for r in range(4)}

    def two_streams(rank: int) -> None:
        order = ("x", "y") if rank == 0 else ("y", "x")

        def enter(i: int, stream: str) -> Callable[[], object]:
            return lambda: call(conns[2 * rank + i], rank, 2, 11, stream=stream)

        inner = _run_threads({i: enter(i, s) for i, s in enumerate(order)})
        assert all(not o["error"] for o in inner.values()), inner

    outs = _run_threads({0: lambda: two_streams(0), 1: lambda: two_streams(1)})
    assert all(not o["error"] for o in outs.values()), outs
    assert agreement.count_keys(master) == 2 * 3  # per stream: its record, n, ok


def test_a_rank_whose_record_of_the_stream_is_stale_swaps_again() -> None:
    """Rank 1 forgot what the stream's record holds (it never read call #1's): it
    swaps again once, and the ranks agree on call #2."""
    _master, port = _store_port()
    conns = {r: OwnClient(_tcp(port)) for r in range(2)}
    stream = uuid.uuid4().hex

    def first(r: int) -> Callable[[], object]:
        return lambda: call(conns[r], r, 2, 3, stream=stream)

    outs = _run_threads({r: first(r) for r in conns})
    assert not any(o["error"] for o in outs.values()), outs
    agreement.forget_streams()  # both forget; rank 1 comes first to call #2
    before = conns[1].snapshot().get("agree", 0)

    def later() -> None:
        time.sleep(0.5)
        call(conns[0], 0, 2, 5, 2, stream=stream)

    outs = _run_threads({1: lambda: call(conns[1], 1, 2, 5, 2, stream=stream), 0: later})
    assert not any(o["error"] for o in outs.values()), outs
    assert conns[1].snapshot().get("agree", 0) - before <= 3 + 1 + 2, conns[1].snapshot()


def test_dim_names_compared_apart_are_a_warning_naming_both(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="fmesh")
    master, port = _store_port()
    conns = {r: OwnClient(_tcp(port)) for r in range(2)}
    names = {0: "dp,tp", 1: "tp,dp"}

    def second() -> None:
        # Rank 0's record is the stream's first: rank 1 warns, naming rank 0's first.
        master.wait(["fmesh/a/t/s/c"], datetime.timedelta(seconds=30))
        call(conns[1], 1, 2, 8, names=names[1])

    outs = _run_threads({0: lambda: call(conns[0], 0, 2, 8, names=names[0]), 1: second})
    assert not any(o["error"] for o in outs.values()), outs
    said = [r.getMessage() for r in caplog.records if r.name == "fmesh"]
    assert any(
        "ranks 0 and 1 name the dims of the same groups differently" in m
        and "rank 0 calls them (dp,tp), rank 1 (tp,dp)" in m
        for m in said
    ), said


def _mismatch_then_agree(
    master: Any,
    port: int,
    odd: int,
    before: Callable[[int], object],
    between: Callable[[int], object],
    created: list[int],
) -> dict[int, dict[str, Any]]:
    """Three thread-played ranks: call #1, where rank ``odd`` makes another call, then
    call #2, the same on all. ``before(r)`` runs before rank r's call #1, ``between(r)``
    after it; ``created`` lists the ranks that started creating at call #1. Every rank
    must raise at call #1 naming both sides and agree at call #2; returns what each
    raised at call #1."""
    conns = {r: OwnClient(_tcp(port)) for r in range(3)}
    got: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    def play(r: int) -> Callable[[], object]:
        def run() -> None:
            before(r)
            code, summary = (7, "Mesh(odd=6)") if r == odd else (5, "Mesh(a=6)")
            first = _attempt(
                lambda: call(
                    conns[r], r, 3, code, summary=summary, during=lambda *_: created.append(r)
                )
            )
            between(r)
            got[r] = first, _attempt(lambda: call(conns[r], r, 3, 9, 2))

        return run

    outs = _run_threads({r: play(r) for r in conns})
    assert not any(o["error"] for o in outs.values()), outs
    assert sorted(got) == [0, 1, 2], got
    for r, (first, second) in got.items():
        assert first["error"], (r, first)
        assert "Mesh(odd=6)" in first["message"] and "Mesh(a=6)" in first["message"], first
        assert "disagree at call #1" in first["message"], first
        assert not second["error"], (r, second)
    return {r: first for r, (first, _) in got.items()}


def test_a_rank_that_comes_after_the_others_ended_the_call_leaves_their_next_call() -> None:
    """Ranks 0 and 1 disagree at call #1 and go on to call #2 before rank 2 makes its
    call #1 (CI saw it on a loaded machine): rank 2 finds the stream at call #2, raises
    call #1's mismatch as the others did, and does not fail their call #2, which all
    three then make."""
    master, port = _store_port()

    def before(r: int) -> None:
        if r == 2:  # the others are at call #2 already
            deadline = time.monotonic() + 30
            while not bytes(master.get("fmesh/a/t/s/c")).startswith(b"2|"):
                assert time.monotonic() < deadline, master.get("fmesh/a/t/s/c")
                time.sleep(0.05)

    _mismatch_then_agree(master, port, 0, before, lambda r: None, [])
    # Call #1's keys are gone once every rank is out of it, verdict included.
    assert [k for k in keys(master) if k.startswith("1/")] == [], master.list_keys()


def test_a_rank_that_comes_after_the_verdict_raises_it_before_it_creates_anything() -> None:
    """Ranks 0 and 1 disagree at call #1 and raise; rank 2, which makes rank 0's call,
    comes only then: the stream's record is marked failed, so it raises the mismatch
    from its record's answer, without starting its groups (which could pass a
    rendezvous whose other ranks left). All three then agree on call #2."""
    master, port = _store_port()
    out_of_call_1 = {r: threading.Event() for r in range(3)}

    def before(r: int) -> None:
        if r == 1:  # rank 0's record is the stream's first
            master.wait(["fmesh/a/t/s/c"], datetime.timedelta(seconds=30))
        if r == 2:
            assert out_of_call_1[0].wait(30) and out_of_call_1[1].wait(30)

    def between(r: int) -> None:
        out_of_call_1[r].set()
        assert all(e.wait(30) for e in out_of_call_1.values())

    created: list[int] = []
    firsts = _mismatch_then_agree(master, port, 1, before, between, created)
    assert "ranks 2 and 1 disagree at call #1" in firsts[2]["message"], firsts[2]
    assert 2 not in created, created
    assert keys(master) == ["2/n", "2/ok", "c"], master.list_keys()


@pytest.mark.parametrize(
    ("verdict", "rank", "error", "says"),
    [
        ("lost", 2, PeerLostError, "rank 2 was given up on during call #1"),
        ("lost", 3, PeerLostError, "rank(s) [2] died during call #1"),
        (
            "fail:rank 1: boom",
            3,
            MeshMismatchError,
            "another rank gave up on the call: rank 1: boom",
        ),
    ],
)
@pytest.mark.parametrize("record", ["2|9|0|", "!1|5|0|"], ids=["went-on", "marked"])
def test_a_rank_that_comes_after_a_verdict_raises_it_and_counts_itself_out(
    verdict: str, rank: int, error: type[Exception], says: str, record: str
) -> None:
    """The keys a loss or a failed creation leaves at call #1 of a 4-rank stream,
    whose record is of the ranks' call #2 (they went on) or call #1's, marked failed:
    a rank that comes to call #1 now raises its verdict, counts itself out, and
    leaves the stream's record as it is."""
    master, port = _store_port()
    p = "fmesh/a/t/s/1/"
    for key, value in {"end": verdict, "lost": "2,", "by": "1\x1fits port refused"}.items():
        master.set(p + key, value)
    master.add(p + "n", ABORT)
    master.add(p + "gone", 2)  # ranks 0 and 1 are out; one more is yet to come
    master.set("fmesh/a/t/s/c", record)
    with pytest.raises(error, match=re.escape(says)):
        call(OwnClient(_tcp(port)), rank, 4, 5)
    assert bytes(master.get("fmesh/a/t/s/c")) == record.encode()
    assert not master.check(["fmesh/a/t/s/2/end"])  # call #2 is not failed
    gone, read = master.add(p + "gone", 0), master.add(p + "read", 0)
    assert (gone, read) == ((2, 1) if rank == 2 else (3, 0)), (gone, read)
