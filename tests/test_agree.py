"""The agreement protocol of ``fmesh/_agree.py`` on real processes and a real TCPStore.

Each job runs in fresh processes (``run_spawn``) that connect to the job's TCPStore as
plain clients, without any process group, and play one scenario: agreement, a rank
that disagrees, a memoized (non-blocking) rank that disagrees, a rank that dies, two
threads per rank, a wait while other work goes on. What every rank saw (outcome,
message, elapsed seconds, store keys) comes back to the parent, which checks it
against what the scenario implies. Store keys are counted with the store's own
``list_keys``, independently of ``count_keys``.
"""

from __future__ import annotations

import datetime
import os
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from _dist import Job, run_spawn

from fmesh import MeshMismatchError, _agree

if TYPE_CHECKING:
    from fmesh._c10d import Store

LONG = datetime.timedelta(seconds=60)
"""A timeout no healthy scenario gets near: failures must surface long before it."""
SURFACE = 15.0
"""Generous bound on the seconds a mismatch may take to reach a rank."""
MIN_OPS_PER_CALL = 6
"""Store operations of one agreed call on every rank: compare_set, append, add, wait,
get, add (read)."""
MAX_OPS_PER_CALL = MIN_OPS_PER_CALL + 1 + 5
"""... plus, on one rank, the last arrival's compare_set of done, and on one rank, the
last reader's five deletes. A constant, whatever the world size."""


# -- worker side --------------------------------------------------------------------------


def _tcp_store(host: str, port: int, *, is_master: bool) -> Store:
    """A TCPStore (public, but torch's stubs re-export it implicitly only)."""
    import torch.distributed as dist

    tcp: Any = dist.TCPStore  # type: ignore[attr-defined]  # implicit re-export
    return cast("Store", tcp(host, port, 1, is_master=is_master, wait_for_workers=False))


def _connect() -> Store:
    return _tcp_store(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False
    )


def _barrier(store: Store, name: str, ranks: range | tuple[int, ...], me: int) -> None:
    store.set(f"test/{name}/{me}", "1")
    store.wait([f"test/{name}/{r}" for r in ranks], LONG)


def _fmesh_keys(store: Store) -> int:
    """Keys of the agreement protocol, counted by the store itself."""
    return sum(1 for key in store.list_keys() if key.startswith("fmesh/"))


def _attempt(fn: Any) -> dict[str, Any]:
    """Run ``fn``; report whether it raised MeshMismatchError, its message, the time."""
    start = time.monotonic()
    try:
        value = fn()
    except MeshMismatchError as err:
        return {"error": True, "message": str(err), "elapsed": time.monotonic() - start}
    # A Ticket holds its store, which does not pickle; report plain values only.
    plain = value if isinstance(value, int | str) else None
    return {"error": False, "value": plain, "elapsed": time.monotonic() - start}


class _Counting:
    """A store that counts the operations made on it and on its clones."""

    def __init__(self, inner: Any, counter: list[int]) -> None:
        self.inner = inner
        self.counter = counter

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        def counted(*args: Any) -> Any:
            self.counter[0] += 1
            result = method(*args)
            return _Counting(result, self.counter) if name == "clone" else result

        return counted


def ok_job(rank: int, world: int) -> dict[str, Any]:
    store = _connect()
    counter = [0]
    counting = cast("Store", _Counting(store, counter))
    _barrier(store, "start", range(world), rank)
    calls = []
    for k in range(1, 4):
        ticket = _agree.agree(
            counting, rank=rank, world=world, digest=f"d{k}", summary=f"mesh {k}", timeout=LONG
        )
        calls.append((ticket.stream, ticket.call, ticket.prefix))
    ops = counter[0]
    _barrier(store, "agreed", range(world), rank)
    out: dict[str, Any] = {
        "calls": calls,
        "ops": ops,
        "keys_after": _fmesh_keys(store),
        "count_keys_after": _agree.count_keys(store),
    }
    _barrier(store, "counted", range(world), rank)
    # After agreement: the last rank's group creation fails; rank 0 reads why.
    if rank == world - 1:
        _agree.abort(ticket, "creating group [0, 1] failed here: boom")
    if rank == 0:
        out["failures"] = _agree.failures(ticket, wait=30.0)
    _barrier(store, "aborted", range(world), rank)
    out["keys_after_abort"] = _fmesh_keys(store)
    return out


def mismatch_job(rank: int, world: int, odd: int) -> dict[str, Any]:
    """Rank ``odd`` realizes mesh B, a second after the others published mesh A."""
    store = _connect()
    _barrier(store, "start", range(world), rank)
    if rank == odd:
        time.sleep(1.0)
    digest = "B" if rank == odd else "A"
    out = _attempt(
        lambda: _agree.agree(
            store,
            rank=rank,
            world=world,
            digest=digest,
            summary=f"mesh {digest}",
            timeout=LONG,
        )
    )
    _barrier(store, "end", range(world), rank)
    out["keys"] = _fmesh_keys(store)
    return out


def memo_job(rank: int, world: int, memo_first: bool) -> dict[str, Any]:
    """Call 1: everyone A. Call 2: rank 0 A without blocking (memoized), others B."""
    store = _connect()
    _barrier(store, "start", range(world), rank)
    a = _agree.agree(store, rank=rank, world=world, digest="A", summary="mesh A", timeout=LONG)
    out: dict[str, Any] = {"call1": a.call}
    _barrier(store, "call1", range(world), rank)
    if (rank == 0) != memo_first:
        time.sleep(1.0)  # let the other side publish first
    if rank == 0:
        out["call2"] = _attempt(
            lambda: (
                _agree.agree(
                    store,
                    rank=0,
                    world=world,
                    digest="A",
                    summary="mesh A",
                    timeout=LONG,
                    blocking=False,
                ).call
            )
        )
    else:
        out["call2"] = _attempt(
            lambda: _agree.agree(
                store, rank=rank, world=world, digest="B", summary="mesh B", timeout=LONG
            )
        )
    _barrier(store, "call2", range(world), rank)
    if rank == 0 and not out["call2"]["error"]:
        out["keys_pending"] = _fmesh_keys(store)
        # The next call notices the abort without publishing (a short timeout makes a
        # wrong implementation, which would wait for peers, fail with a timeout).
        out["call3"] = _attempt(
            lambda: _agree.agree(
                store,
                rank=0,
                world=world,
                digest="C",
                summary="mesh C",
                timeout=datetime.timedelta(seconds=3),
            )
        )
        out["next_number"] = _agree.next_call("MainThread")
    _barrier(store, "end", range(world), rank)
    out["keys"] = _fmesh_keys(store)
    return out


def death_job(rank: int, world: int, dead: int, timeout_s: float) -> dict[str, Any]:
    """Call 1: everyone. Then rank ``dead`` exits; the others start call 2."""
    store = _connect()
    _barrier(store, "start", range(world), rank)
    _agree.agree(store, rank=rank, world=world, digest="A", summary="mesh A", timeout=LONG)
    _barrier(store, "call1", range(world), rank)
    if rank == dead:
        time.sleep(0.5)  # the others are waiting in call 2 by now
        os._exit(3)
    out = _attempt(
        lambda: _agree.agree(
            store,
            rank=rank,
            world=world,
            digest="A",
            summary="mesh A",
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    )
    alive = tuple(r for r in range(world) if r != dead)
    _barrier(store, "end", alive, rank)
    out["keys"] = _fmesh_keys(store)
    out["count_keys"] = _agree.count_keys(store)
    return out


def threads_job(rank: int, world: int) -> dict[str, Any]:
    """Two named threads per rank, each with its own stream, started in opposite
    orders on even and odd ranks; every call blocks until all ranks agree."""
    store = _connect()
    _barrier(store, "start", range(world), rank)
    results: dict[str, Any] = {}

    def run(stream: str) -> None:
        calls: list[tuple[str, int | str]] = []
        try:
            for k in range(1, 4):
                ticket = _agree.agree(
                    store,
                    rank=rank,
                    world=world,
                    digest=f"{stream}{k}",
                    summary=f"mesh {stream}{k}",
                    timeout=datetime.timedelta(seconds=30),
                )
                calls.append((ticket.stream, ticket.call))
        except MeshMismatchError as err:
            calls.append(("error", str(err)))
        results[stream] = calls

    order = ("alpha", "beta") if rank % 2 == 0 else ("beta", "alpha")
    threads = [threading.Thread(target=run, args=(s,), name=s) for s in order]
    threads[0].start()
    time.sleep(0.5)  # the first thread is waiting for its peers' first thread by now
    threads[1].start()
    for t in threads:
        t.join(60)
    _barrier(store, "end", range(world), rank)
    return {"results": results, "keys": _fmesh_keys(store)}


def busy_job(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 joins stream "slow" 3 s late; meanwhile rank 0's main thread agrees on
    stream "fast" with it and uses the module, while its thread "slow" waits."""
    store = _connect()
    _barrier(store, "start", range(world), rank)
    slow: dict[str, Any] = {}

    def run_slow() -> None:
        slow.update(
            _attempt(
                lambda: _agree.agree(
                    store,
                    rank=rank,
                    world=world,
                    digest="S",
                    summary="mesh S",
                    timeout=LONG,
                    stream="slow",
                )
            )
        )

    out: dict[str, Any] = {}
    if rank == 0:
        thread = threading.Thread(target=run_slow)
        thread.start()
        time.sleep(0.5)
        start = time.monotonic()
        _agree.agree(
            store,
            rank=rank,
            world=world,
            digest="F",
            summary="mesh F",
            timeout=LONG,
            stream="fast",
        )
        _agree.confirm_pending()
        out["other_numbers"] = (_agree.next_call("other"), _agree.next_call("other"))
        out["busy_elapsed"] = time.monotonic() - start
        out["slow_still_waiting"] = thread.is_alive()
        thread.join(60)
    else:
        _agree.agree(
            store,
            rank=rank,
            world=world,
            digest="F",
            summary="mesh F",
            timeout=LONG,
            stream="fast",
        )
        time.sleep(3.0)
        run_slow()
    out["slow"] = slow
    return out


# -- parent side ----------------------------------------------------------------------------


def _values(job: Job) -> list[dict[str, Any]]:
    values = job.values()
    return cast("list[dict[str, Any]]", values)


def test_agreement_is_constant_round_trips_and_cleans_up(tmp_path: Path) -> None:
    world = 8
    outs = _values(run_spawn(ok_job, world, tmp_path=tmp_path, timeout=90))
    for out in outs:
        assert [c[:2] for c in out["calls"]] == [("MainThread", k) for k in (1, 2, 3)]
        assert out["calls"][0][2] != out["calls"][1][2]
        # The main thread uses the store itself (no clone): at most MAX_OPS_PER_CALL
        # per call, whatever the world size.
        assert 3 * MIN_OPS_PER_CALL <= out["ops"] <= 3 * MAX_OPS_PER_CALL
        assert out["keys_after"] == 0
        assert out["count_keys_after"] == 0
    # Exactly one rank removed each call's keys (five deletes) and set done.
    assert sum(out["ops"] - 3 * MIN_OPS_PER_CALL for out in outs) == 3 * (1 + 5)
    assert outs[0]["failures"] == {world - 1: "creating group [0, 1] failed here: boom"}
    # The failure record of an agreed call stays (one key).
    assert {out["keys_after_abort"] for out in outs} == {1}


@pytest.mark.parametrize("odd", [3, 0])
def test_one_rank_different_every_rank_raises(tmp_path: Path, odd: int) -> None:
    world = 4
    outs = _values(run_spawn(mismatch_job, world, odd, tmp_path=tmp_path, timeout=90))
    others = "|".join(str(r) for r in range(world) if r != odd)
    detected = re.compile(
        rf"ranks {odd} and ({others}) disagree at realize call #1 of thread 'MainThread': "
        rf"rank {odd} realizes mesh B, rank \1 realizes mesh A\. Every rank must call"
    )
    first = detected.match(outs[odd]["message"])
    assert first is not None, outs[odd]
    for rank, out in enumerate(outs):
        assert out["error"], out
        assert out["elapsed"] < SURFACE, out
        if rank != odd:
            assert out["message"].startswith(
                f"rank {rank} stopped at realize call #1 of thread 'MainThread' (mesh A) "
                f"because {first.group(0)}"
            ), out["message"]
        assert out["keys"] == 0


@pytest.mark.parametrize("memo_first", [True, False], ids=["memo-first", "memo-later"])
def test_memoized_rank_that_disagrees(tmp_path: Path, memo_first: bool) -> None:
    world = 4
    outs = _values(run_spawn(memo_job, world, memo_first, tmp_path=tmp_path, timeout=90))
    assert [out["call1"] for out in outs] == [1] * world
    zero = outs[0]
    if memo_first:
        # Rank 0 published first and does not wait: its call returns; each other rank
        # compares with rank 0's record and raises at once.
        assert zero["call2"] == {
            "error": False,
            "value": 2,
            "elapsed": zero["call2"]["elapsed"],
        }
        assert zero["keys_pending"] > 0  # rank 0 has not read the outcome yet
        for rank in range(1, world):
            message = outs[rank]["call2"]["message"]
            assert message.startswith(
                f"ranks {rank} and 0 disagree at realize call #2 of thread 'MainThread': "
                f"rank {rank} realizes mesh B, rank 0 realizes mesh A."
            ), message
            assert outs[rank]["call2"]["elapsed"] < SURFACE
        # Rank 0 raises at its next call, without waiting and without numbering it.
        call3 = zero["call3"]
        assert call3["error"]
        assert call3["elapsed"] < 2.0, call3
        assert re.match(
            r"rank 0 stopped at realize call #2 of thread 'MainThread' \(mesh A\) because "
            r"ranks ([123]) and 0 disagree at realize call #2 of thread 'MainThread': "
            r"rank \1 realizes mesh B, rank 0 realizes mesh A\.",
            call3["message"],
        ), call3["message"]
        assert zero["next_number"] == 3
    else:
        # The others published B first: rank 0 sees it at once and aborts the call.
        call2 = zero["call2"]
        assert call2["error"]
        detected = re.match(
            r"ranks 0 and ([123]) disagree at realize call #2 of thread 'MainThread': "
            r"rank 0 realizes mesh A, rank \1 realizes mesh B\.",
            call2["message"],
        )
        assert detected, call2["message"]
        for rank in range(1, world):
            out = outs[rank]["call2"]
            assert out["error"]
            assert out["elapsed"] < SURFACE
            assert out["message"].startswith(
                f"rank {rank} stopped at realize call #2 of thread 'MainThread' (mesh B) "
                f"because {detected.group(0)}"
            ), out["message"]
    # Every rank read the outcome of every call: nothing is left behind.
    assert [out["keys"] for out in outs] == [0] * world


def test_rank_that_dies_is_named(tmp_path: Path) -> None:
    world, dead, timeout_s = 4, 2, 4.0
    job = run_spawn(death_job, world, dead, timeout_s, tmp_path=tmp_path, timeout=90)
    assert job.outcomes[dead].exitcode == 3
    for rank in (0, 1, 3):
        report = job.outcomes[rank]
        assert report.ok, job.describe()
        out = report.value
        assert out["error"], out
        assert timeout_s - 0.5 <= out["elapsed"] < timeout_s + SURFACE, out
        assert re.match(
            rf"rank {rank} stopped at realize call #2 of thread 'MainThread' \(mesh A\) "
            rf"because ranks \[{dead}\] never reached realize call #2 of thread "
            r"'MainThread' within 4s \(rank [013] waited, realizing mesh A\); they may have "
            r"died, be stuck, skipped this call, or made it from a thread with another "
            r"name\. Every rank must call fmesh\.realize\(\) the same number of times",
            out["message"],
        ), out["message"]
        # The dead rank never read the outcome: the call's keys stay, and count_keys
        # sees the same number as the store.
        assert out["keys"] == out["count_keys"] == 5


def test_two_threads_two_streams_any_interleaving(tmp_path: Path) -> None:
    world = 4
    outs = _values(run_spawn(threads_job, world, tmp_path=tmp_path, timeout=90))
    for out in outs:
        assert out["results"] == {s: [(s, 1), (s, 2), (s, 3)] for s in ("alpha", "beta")}, out
        assert out["keys"] == 0


def test_a_wait_holds_nothing(tmp_path: Path) -> None:
    outs = _values(run_spawn(busy_job, 2, tmp_path=tmp_path, timeout=90))
    zero = outs[0]
    assert zero["slow_still_waiting"], zero
    assert zero["busy_elapsed"] < 2.0, zero
    assert zero["other_numbers"] == (1, 2)
    assert [out["slow"]["error"] for out in outs] == [False, False], outs
    assert zero["slow"]["elapsed"] > 2.0  # it really waited for rank 1


# -- in one process -------------------------------------------------------------------------


@pytest.fixture
def store() -> Store:
    _agree.reset()
    return _tcp_store("127.0.0.1", 0, is_master=True)


def test_world_of_one_touches_nothing(store: Store) -> None:
    ticket = _agree.agree(store, rank=0, world=1, digest="x", summary="m", timeout=LONG)
    assert (ticket.call, ticket.where) == (1, "realize call #1 of thread 'MainThread'")
    assert store.list_keys() == []


def test_numbering_per_stream_and_reset() -> None:
    _agree.reset()
    assert [_agree.next_call(s) for s in ("a", "b", "a", "a", "b")] == [1, 1, 2, 3, 2]
    _agree.reset()
    assert _agree.next_call("a") == 1


def test_stream_names_cannot_collide(store: Store) -> None:
    # "s/1" call 2 and "s" call 1 must use different keys ("s/1/2/" vs "s/1/...").
    common: dict[str, Any] = {"rank": 0, "world": 2, "timeout": LONG, "blocking": False}
    t1 = _agree.agree(store, digest="x", summary="m", stream="s/1", call=2, **common)
    t2 = _agree.agree(store, digest="y", summary="n", stream="s", call=1, **common)
    assert not t2.prefix.startswith(t1.prefix) and not t1.prefix.startswith(t2.prefix)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rank": 2, "world": 2}, r"agree\(\) needs 0 <= rank < world, got rank=2, world=2"),
        ({"rank": -1, "world": 2}, r"got rank=-1"),
        ({"digest": "a\nb"}, r"one-line, non-empty digest, got 'a\\nb'"),
        ({"digest": ""}, r"non-empty digest, got ''"),
    ],
)
def test_bad_arguments(store: Store, kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"rank": 0, "world": 2, "digest": "d", **kwargs}
    with pytest.raises(ValueError, match=match):
        _agree.agree(store, summary="m", timeout=LONG, **args)


def test_timeout_when_nobody_else_comes(store: Store) -> None:
    with pytest.raises(
        MeshMismatchError,
        match=r"^rank 1 stopped at realize call #1 of thread 'w' \(mesh Q\) because ranks "
        r"\[0, 2\] never reached realize call #1 of thread 'w' within 0\.5s",
    ):
        _agree.agree(
            store,
            rank=1,
            world=3,
            digest="q",
            summary="mesh Q",
            timeout=datetime.timedelta(seconds=0.5),
            stream="w",
        )
    # A latecomer learns at once that the call was given up.
    start = time.monotonic()
    with pytest.raises(MeshMismatchError, match=r"^rank 0 stopped .* ranks \[0, 2\] never"):
        _agree.agree(
            store,
            rank=0,
            world=3,
            digest="q",
            summary="mesh Q",
            timeout=LONG,
            stream="w",
            call=1,
        )
    assert time.monotonic() - start < SURFACE
