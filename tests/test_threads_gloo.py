"""Meshes built in threads, on 4 real gloo ranks.

Calls are matched across ranks by the order each rank makes them, never by a thread's
name: a worker thread whose default name differs between ranks (rank 0 started an
unrelated thread first) builds its mesh at once, as on torch. Threads racing to build
the same mesh create each group once. Threads racing to build different meshes in
different orders on different ranks raise ``MeshMismatchError``, never hang.
"""

from __future__ import annotations

import datetime
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _dist import run_spawn

import fmesh

WORLD = 4
THREADS = 3
JOB_TIMEOUT = 120.0


def _sums(dm: Any) -> dict[str, tuple[int, list[int]]]:
    """Per dim: (all_reduce of 2**rank over its group, the group's ranks)."""
    import torch
    import torch.distributed as dist

    out = {}
    for name in dm.mesh_dim_names:
        pg = dm.get_group(name)
        bits = torch.tensor([1 << dist.get_rank()], dtype=torch.int64)
        dist.all_reduce(bits, group=pg)
        out[name] = (int(bits.item()), dist.get_process_group_ranks(pg))
    return out


def named_thread_job(rank: int, world: int) -> dict[str, Any]:
    """Each rank builds a (2, 2) mesh with the drop-in in a worker thread; rank 0
    started an unrelated thread first, so its worker's default name differs."""
    import torch.distributed as dist

    from fmesh.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    if rank == 0:
        extra = threading.Thread(target=lambda: None)
        extra.start()
        extra.join()
    out: dict[str, Any] = {}

    def build() -> None:
        start = time.monotonic()
        try:
            dm = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
            out["sums"] = _sums(dm)
        except Exception as err:
            out["error"] = f"{type(err).__name__}: {err}"
        out["seconds"] = time.monotonic() - start

    worker = threading.Thread(target=build)
    out["thread"] = worker.name
    worker.start()
    worker.join(JOB_TIMEOUT)
    dist.barrier()
    return out


def test_threads_with_different_default_names_build_at_once(tmp_path: Path) -> None:
    job = run_spawn(named_thread_job, WORLD, tmp_path=tmp_path, timeout=JOB_TIMEOUT)
    outs = job.values()
    assert outs[0]["thread"] != outs[1]["thread"], outs  # the case of the issue
    for rank, out in enumerate(outs):
        assert "error" not in out, (rank, out)
        assert out["seconds"] < 30.0, (rank, out)  # was 300 s (the agreement timeout)
        dp = [r for r in range(WORLD) if r % 2 == rank % 2]
        tp = [r for r in range(WORLD) if r // 2 == rank // 2]
        assert out["sums"] == {
            "dp": (sum(1 << r for r in dp), dp),
            "tp": (sum(1 << r for r in tp), tp),
        }, (rank, out)


def concurrent_job(rank: int, world: int) -> dict[str, Any]:
    """THREADS threads per rank build the same (2, 2) mesh with the drop-in at once."""
    import torch.distributed as dist

    from fmesh.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    fmesh.realize(fmesh.make_mesh({"world": world}))  # the world: no group made
    before = fmesh.cache_stats().created
    start = threading.Barrier(THREADS)
    meshes: list[Any] = []
    errors: list[str] = []

    def build() -> None:
        start.wait()
        try:
            meshes.append(init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")))
        except Exception as err:
            errors.append(f"{type(err).__name__}: {err}")

    threads = [threading.Thread(target=build) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOB_TIMEOUT)
    out: dict[str, Any] = {"errors": errors, "created": fmesh.cache_stats().created - before}
    if not errors:
        out["same_groups"] = all(
            m.get_group(n) is meshes[0].get_group(n) for m in meshes for n in ("dp", "tp")
        )
        out["sums"] = _sums(meshes[-1])
    dist.barrier()
    return out


def test_concurrent_threads_create_each_group_once(tmp_path: Path) -> None:
    job = run_spawn(concurrent_job, WORLD, tmp_path=tmp_path, timeout=JOB_TIMEOUT)
    for rank, out in enumerate(job.values()):
        assert out["errors"] == [], (rank, out)
        assert out["created"] == 2, (rank, out)  # this rank's dp and tp groups, once
        assert out["same_groups"] is True, (rank, out)
        assert out["sums"]["dp"][0] == sum(1 << r for r in range(WORLD) if r % 2 == rank % 2)
        assert out["sums"]["tp"][0] == sum(1 << r for r in range(WORLD) if r // 2 == rank // 2)


RACE_TIMEOUT = 10.0


def race_job(rank: int, world: int) -> dict[str, Any]:
    """Two threads per rank realize two new meshes, in opposite orders on even and
    odd ranks (no fmesh.stream): the ranks' orders differ. The second thread starts
    once the first has taken its turn in the stream (``turns.enter``), which sets the
    order of their calls."""
    import torch.distributed as dist

    from fmesh._runtime import turns
    from fmesh._runtime.memo import StreamState

    dist.init_process_group("gloo")
    fmesh.realize(fmesh.make_mesh({"world": world}))
    meshes = {
        "a": fmesh.make_mesh({"x": 2, "y": 2}),
        "b": fmesh.make_mesh({"x": 2, "y": 2}, ranks=(3, 1, 2, 0)),
    }
    out: dict[str, Any] = {}
    timeout = datetime.timedelta(seconds=RACE_TIMEOUT)

    def run(name: str) -> None:
        start = time.monotonic()
        try:
            fmesh.realize(meshes[name], timeout=timeout)
            out[name] = ("ok", time.monotonic() - start, "")
        except Exception as err:
            out[name] = (type(err).__name__, time.monotonic() - start, str(err))

    entered = threading.Event()
    enter = turns.enter

    def entering(stream: StreamState) -> int:
        ticket = enter(stream)
        entered.set()
        return ticket

    turns.enter = entering  # this worker process only
    order = ("a", "b") if rank % 2 == 0 else ("b", "a")
    threads = {n: threading.Thread(target=run, args=(n,)) for n in order}
    threads[order[0]].start()
    assert entered.wait(60), "the first thread never took its turn"
    threads[order[1]].start()
    for t in threads.values():
        t.join(JOB_TIMEOUT)
    out["alive"] = any(t.is_alive() for t in threads.values())
    return out


def test_threads_that_race_into_other_orders_raise(tmp_path: Path) -> None:
    job = run_spawn(race_job, WORLD, tmp_path=tmp_path, timeout=JOB_TIMEOUT)
    for rank, out in enumerate(job.values()):
        assert out["alive"] is False, (rank, out)
        for name in ("a", "b"):
            kind, seconds, _ = out[name]
            # No order can agree (even ranks realize b second, odd ranks a): every
            # call raises, the first where the orders differ within seconds, the rest
            # with it or at their timeout; none hangs.
            assert kind == "MeshMismatchError", (rank, out)
            assert seconds < RACE_TIMEOUT + 15.0, (rank, out)
        assert min(out[n][1] for n in ("a", "b")) < RACE_TIMEOUT, (rank, out)


def test_a_streams_calls_take_turns_and_a_failure_dooms_those_queued() -> None:
    """The turn bookkeeping alone (``turns.enter`` ... ``leave`` on a ``StreamState``;
    ``turns.turn`` holds the lock around it)."""
    from fmesh._protocol.stream import Stream
    from fmesh._runtime.memo import StreamState
    from fmesh._runtime.turns import doomed_by, enter, leave, ready

    s = StreamState(Stream("t"))
    first, second = enter(s), enter(s)
    assert ready(s, first) and not ready(s, second)
    leave(s, first, "ranks 0 and 1 disagree at realize call #1")
    assert ready(s, second)
    assert doomed_by(s, second) == "ranks 0 and 1 disagree at realize call #1"
    leave(s, second)
    later = enter(s)  # started after the failure: it goes ahead
    assert ready(s, later) and doomed_by(s, later) == ""
    leave(s, later)
    alone = enter(s)
    leave(s, alone, "a failure with nobody queued")
    assert doomed_by(s, enter(s)) == ""


def test_stream_names_are_checked() -> None:
    from fmesh._protocol.stream import PROCESS, current_stream

    for bad in ("", None, 3):
        block = fmesh.stream(bad)  # type: ignore[arg-type]  # the wrong types on purpose
        with pytest.raises(TypeError, match=r"fmesh\.stream\(\) needs a non-empty str"):
            block.__enter__()

    with fmesh.stream("loader"):
        assert current_stream() == "loader"
        with fmesh.stream("inner"):
            assert current_stream() == "inner"
        assert current_stream() == "loader"
    assert current_stream() == PROCESS
