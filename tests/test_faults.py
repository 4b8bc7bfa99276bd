"""Failure semantics of ``fmesh.realize`` end to end: ranks that disagree, stall, die,
race or diverge among memo hits never hang (4 gloo ranks launched torchrun-style).

Each job first realizes a whole-world mesh on every rank (which initializes the default
group), meets at a barrier on the launcher's store, and then plays one scenario. What
each rank saw comes back to the parent: whether ``realize`` raised, the message, and
when (wall-clock, comparable across ranks on one machine). Expected facts come from
the scenario itself and from fmesh's pure queries (``fmesh.group``).
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

import fmesh

if TYPE_CHECKING:
    from fmesh._compat import Store

WORLD = 4
JOB_TIMEOUT = 45.0
"""Seconds before a job's ranks are killed and reported hung (a hang is a failure)."""
SURFACE = 10.0
"""Seconds within which every rank must raise once the first one did."""


def mesh_a() -> fmesh.Mesh:
    return fmesh.make_mesh({"dp": 2, "tp": 2})


def mesh_b() -> fmesh.Mesh:
    """Different from A, and none of its groups is one of A's (ranks reversed)."""
    return fmesh.make_mesh({"x": 2, "y": 2}, ranks=(3, 2, 1, 0))


# -- worker side --------------------------------------------------------------------------


def _start(rank: int) -> Store:
    """Initialize the world through realize, then meet every rank on the launcher's
    store (a barrier that does not go through fmesh)."""
    import torch.distributed as dist

    fmesh.realize(fmesh.make_mesh({"w": WORLD}))
    tcp: Any = dist.TCPStore  # type: ignore[attr-defined]  # implicit re-export
    store = cast(
        "Store",
        tcp(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 1, is_master=False),
    )
    _barrier(store, "start", range(WORLD), rank)
    return store


def _barrier(store: Store, name: str, ranks: range | tuple[int, ...], me: int) -> None:
    store.set(f"faults/{name}/{me}", "1")
    store.wait([f"faults/{name}/{r}" for r in ranks], datetime.timedelta(seconds=60))


def _attempt(fn: Any) -> dict[str, Any]:
    """Run ``fn``; report whether it raised MeshMismatchError, its message and when."""
    start = time.monotonic()
    try:
        fn()
    except fmesh.MeshMismatchError as err:
        return {
            "error": True,
            "message": str(err),
            "elapsed": time.monotonic() - start,
            "at": time.time(),
        }
    return {"error": False, "elapsed": time.monotonic() - start, "at": time.time()}


def mismatch_job(rank: int, world: int) -> dict[str, Any]:
    """Rank 3 realizes B while the others realize A, at default timeouts."""
    _start(rank)
    mesh = mesh_b() if rank == 3 else mesh_a()
    return _attempt(lambda: fmesh.realize(mesh))


def mesh_c() -> fmesh.Mesh:
    """New to every rank: none of its axes was realized before."""
    return fmesh.make_mesh({"u": 4}, ranks=(1, 0, 3, 2))


def hidden_divergence_job(rank: int, world: int) -> dict[str, Any]:
    """The hang of issue 17: all realize A and B; then rank 0 realizes A while the
    others realize B (memo hits for everyone); then all realize C, at default
    timeouts."""
    store = _start(rank)
    fmesh.realize(mesh_a())
    fmesh.realize(mesh_b())
    _barrier(store, "ab", range(world), rank)
    hit = fmesh.realize(mesh_a() if rank == 0 else mesh_b())
    out = {"hit_created": hit.created}
    out.update(_attempt(lambda: fmesh.realize(mesh_c())))
    _barrier(store, "end", range(world), rank)
    return out


def skipped_job(rank: int, world: int, timeout_s: float) -> dict[str, Any]:
    """All realize A; then rank 0 realizes A again (a hit) while the others realize B
    (which creates groups); after the others gave up, rank 0 realizes C."""
    store = _start(rank)
    # One timeout throughout: it is part of a group's identity, so A again is a hit.
    timeout = datetime.timedelta(seconds=timeout_s)
    fmesh.realize(mesh_a(), timeout=timeout)
    _barrier(store, "a", range(world), rank)
    out: dict[str, Any] = {}
    if rank == 0:
        out["hit"] = _attempt(lambda: fmesh.realize(mesh_a(), timeout=timeout))
        _barrier(store, "gave-up", range(world), rank)
        out["next"] = _attempt(lambda: fmesh.realize(mesh_c(), timeout=timeout))
    else:
        out["b"] = _attempt(lambda: fmesh.realize(mesh_b(), timeout=timeout))
        _barrier(store, "gave-up", range(world), rank)
    _barrier(store, "end", range(world), rank)
    return out


def debug_job(rank: int, world: int, how: str) -> dict[str, Any]:
    """All realize A and B; then rank 0 realizes A while the others realize B, in
    debug mode (``check=True``, or torch's ``TORCH_DISTRIBUTED_DEBUG=DETAIL``)."""
    from torch._C._distributed_c10d import set_debug_level_from_env

    if how == "env":
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        set_debug_level_from_env()  # torch read it when the worker imported c10d
    store = _start(rank)
    fmesh.realize(mesh_a())
    fmesh.realize(mesh_b())
    _barrier(store, "ab", range(world), rank)
    check = how == "check"
    out = _attempt(lambda: fmesh.realize(mesh_a() if rank == 0 else mesh_b(), check=check))
    _barrier(store, "end", range(world), rank)
    return out


def busy_job(rank: int, world: int) -> dict[str, Any]:
    """Every rank realizes A in a thread named "realizer"; ranks 1-3 come once rank 0's
    main thread, meanwhile, has asked for cache_stats() 15 times (about 2 s)."""
    store = _start(rank)
    result: dict[str, Any] = {}

    def realize_a() -> None:
        result.update(_attempt(lambda: fmesh.realize(mesh_a())))

    thread = threading.Thread(target=realize_a, name="realizer")
    out: dict[str, Any] = {}
    if rank == 0:
        thread.start()
        time.sleep(0.3)
        latencies = []
        alive = []
        for _ in range(15):
            start = time.monotonic()
            fmesh.cache_stats()
            latencies.append(time.monotonic() - start)
            alive.append(thread.is_alive())
            time.sleep(0.1)
        out["latencies"] = latencies
        out["realize_was_waiting"] = all(alive)
        store.set("faults/busy/polled", "1")
    else:
        store.wait(["faults/busy/polled"], datetime.timedelta(seconds=60))
        thread.start()
    thread.join(JOB_TIMEOUT)
    out["realize"] = result
    _barrier(store, "end", range(world), rank)
    return out


def _group_sums(realized: fmesh.RealizedMesh) -> dict[str, tuple[int, int]]:
    """Per axis: (all_reduce of 2**rank over the group, the sum fmesh.group predicts)."""
    import torch
    import torch.distributed as dist

    out = {}
    for axis in realized.mesh.axis_names:
        bits = torch.tensor([1 << realized.rank], dtype=torch.int64)
        dist.all_reduce(bits, group=realized.group(axis))
        expected = sum(1 << r for r in fmesh.group(realized.mesh, axis, realized.rank))
        out[axis] = (int(bits.item()), expected)
    return out


def threads_job(rank: int, world: int) -> dict[str, Any]:
    """Threads "ta" (mesh A) and "tb" (mesh B) on every rank, started in opposite
    orders on even and odd ranks. Each thread is a stream of its own
    (``fmesh.stream(name)``, the same name on every rank): it realizes its
    mesh, then slices of it (hits), then a flatten (new in ta, and in tb, whichever
    thread created the group first on this rank), then its mesh again (a hit)."""
    store = _start(rank)
    results: dict[str, Any] = {}

    def run(name: str, mesh: fmesh.Mesh) -> None:
        timeout = datetime.timedelta(seconds=30)
        try:
            with fmesh.stream(name):
                realized = fmesh.realize(mesh, timeout=timeout)
                for axis in mesh.axis_names:
                    fmesh.realize(mesh[axis], timeout=timeout)
                flat = fmesh.realize(
                    fmesh.flatten(mesh, mesh.axis_names[::-1]), timeout=timeout
                )
                again = fmesh.realize(mesh, timeout=timeout)
            results[name] = {**_group_sums(realized), **_group_sums(flat)}
            results[name + "_again_created"] = again.created
        except Exception as err:
            results[name] = f"{type(err).__name__}: {err}"

    threads = {
        "ta": threading.Thread(target=run, args=("ta", mesh_a()), name="ta"),
        "tb": threading.Thread(target=run, args=("tb", mesh_b()), name="tb"),
    }
    first, second = ("ta", "tb") if rank % 2 == 0 else ("tb", "ta")
    threads[first].start()
    time.sleep(0.5)  # the first thread waits for its peers' first thread by now
    threads[second].start()
    for t in threads.values():
        t.join(JOB_TIMEOUT)
    _barrier(store, "end", range(world), rank)
    return results


def death_job(rank: int, world: int, dead: int, timeout_s: float) -> dict[str, Any]:
    """Rank ``dead`` exits while the others realize A."""
    _start(rank)
    if rank == dead:
        time.sleep(0.5)
        os._exit(3)
    return _attempt(
        lambda: fmesh.realize(mesh_a(), timeout=datetime.timedelta(seconds=timeout_s))
    )


def death_in_creation_job(
    rank: int, world: int, dead: int, timeout_s: float
) -> dict[str, Any]:
    """Every rank agrees on A; rank ``dead`` then exits as it starts creating a group."""
    from fmesh import _compat as _c10d

    _start(rank)
    if rank == dead:

        def exit_now(*args: Any, **kwargs: Any) -> None:
            os._exit(4)

        _c10d.new_named_group = exit_now  # the fault: dies after agreeing
    return _attempt(
        lambda: fmesh.realize(mesh_a(), timeout=datetime.timedelta(seconds=timeout_s))
    )


# -- parent side ----------------------------------------------------------------------------


def mesh_pairs() -> fmesh.Mesh:
    """Axis ``x`` pairs ranks [0, 1] and [2, 3]; ``y`` pairs [0, 2] and [1, 3]."""
    return fmesh.make_mesh({"x": 2, "y": 2}, ranks=(0, 2, 1, 3))


def retry_job(rank: int, world: int) -> dict[str, Any]:
    """Ranks 1-3 realize the pairs mesh while rank 0, late, realizes B: ranks 2 and 3
    create x's group [2, 3] before rank 0's record shows the disagreement, and rank 1
    starts x's [0, 1]. Then every rank realizes the pairs mesh again (rank 3 a moment
    after rank 2, so that rank 2 would read whatever rank 3 left of the failed call),
    and sums over each axis."""
    import torch
    import torch.distributed as dist

    store = _start(rank)
    if rank == 0:
        time.sleep(1.5)
    first = _attempt(lambda: fmesh.realize(mesh_b() if rank == 0 else mesh_pairs()))
    _barrier(store, "failed", range(world), rank)
    if rank == 3:
        time.sleep(1.0)
    realized = fmesh.realize(mesh_pairs())
    sums = {}
    for axis in ("x", "y"):
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=realized.group(axis))
        sums[axis] = t.item()
    return {"first": first, "sums": sums, "created": realized.created}


def _values(job: Job) -> list[dict[str, Any]]:
    return cast("list[dict[str, Any]]", job.values())


def _names_both(message: str) -> bool:
    return repr(mesh_a()) in message and repr(mesh_b()) in message


def test_one_rank_different_all_raise_fast_at_default_timeouts(tmp_path: Path) -> None:
    outs = _values(
        run_spawn(mismatch_job, WORLD, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT)
    )
    assert all(out["error"] for out in outs), outs
    first = min(out["at"] for out in outs)
    for out in outs:
        assert out["at"] - first < SURFACE, outs
        message = out["message"]
        assert _names_both(message), message
        assert "rank 3" in message, message
        assert "never reached" not in message, message


def test_divergence_among_hits_surfaces_at_the_next_creating_call(tmp_path: Path) -> None:
    outs = _values(
        run_spawn(
            hidden_divergence_job, WORLD, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT
        )
    )
    assert all(out["hit_created"] == 0 for out in outs), outs
    assert all(out["error"] for out in outs), outs
    first = min(out["at"] for out in outs)
    for rank, out in enumerate(outs):
        message = out["message"]
        assert out["at"] - first < SURFACE, outs
        # Both sides named: rank 0 and one of the others, with what they realized.
        assert re.search(
            r"ranks (0 and [123]|[123] and 0) disagree at realize call #\d+", message
        )
        assert "not after the same calls since their last agreement" in message, message
        assert f"1 memoized realize call ({mesh_a()!r} on gloo)" in message, message
        assert f"1 memoized realize call ({mesh_b()!r} on gloo)" in message, message
        assert repr(mesh_c()) in message, message
        assert "never reached" not in message, (rank, message)


def test_a_rank_that_diverged_into_a_hit_is_named_and_raises_next(tmp_path: Path) -> None:
    timeout_s = 4.0
    outs = _values(
        run_spawn(
            skipped_job, WORLD, timeout_s, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT
        )
    )
    zero = outs[0]
    assert zero["hit"]["error"] is False and zero["hit"]["elapsed"] < 1.0, zero
    for rank in (1, 2, 3):
        b = outs[rank]["b"]
        assert b["error"], outs[rank]
        assert timeout_s - 0.5 < b["elapsed"] < timeout_s + SURFACE, b
        assert re.search(r"ranks \[0\] never reached realize call #\d+", b["message"]), b
        assert "realized a mesh they already had (a memo hit" in b["message"], b
    # Rank 0 raises at its next call that creates groups, at once, with the verdict.
    nxt = zero["next"]
    assert nxt["error"] and nxt["elapsed"] < SURFACE, zero
    assert "rank 0 arrived after the other ranks gave up on realize call #" in nxt["message"]
    assert "ranks [0] never reached" in nxt["message"], nxt
    assert (
        f"1 memoized realize call ({mesh_a()!r} on gloo, timeout 0:00:04)" in nxt["message"]
    ), nxt


@pytest.mark.parametrize("how", ["check", "env"])
def test_debug_mode_makes_every_call_agree(tmp_path: Path, how: str) -> None:
    outs = _values(
        run_spawn(debug_job, WORLD, how, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT)
    )
    assert all(out["error"] for out in outs), outs
    first = min(out["at"] for out in outs)
    for out in outs:
        assert out["at"] - first < SURFACE, outs
        assert _names_both(out["message"]) and "rank 0" in out["message"], out
        assert "never reached" not in out["message"], out


def test_cache_stats_stays_responsive_while_realize_waits(tmp_path: Path) -> None:
    outs = _values(
        run_spawn(busy_job, WORLD, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT)
    )
    zero = outs[0]
    assert zero["realize_was_waiting"], zero
    # Answered while realize waits: a call that blocked on it would wait until realize
    # ended, which it does not before the polls end (the other ranks wait for them).
    assert max(zero["latencies"]) < 3.0, zero
    for out in outs:
        assert out["realize"]["error"] is False, out


def test_two_threads_two_meshes_succeed(tmp_path: Path) -> None:
    outs = _values(
        run_spawn(threads_job, WORLD, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT)
    )
    for out in outs:
        for name in ("ta", "tb"):
            sums = out[name]
            assert isinstance(sums, dict), out
            assert len(sums) == 3 and all(got == want for got, want in sums.values()), sums
            assert out[name + "_again_created"] == 0, out


def test_peer_that_exits_is_named(tmp_path: Path) -> None:
    dead, timeout_s = 2, 5.0
    job = run_spawn(
        death_job, WORLD, dead, timeout_s, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT
    )
    assert job.outcomes[dead].exitcode == 3, job.describe()
    for rank in (0, 1, 3):
        report = job.outcomes[rank]
        assert report.ok, job.describe()
        out = report.value
        assert out["error"], out
        assert out["elapsed"] < timeout_s + 20.0, out
        assert re.search(rf"ranks \[{dead}\] never reached realize call #\d+", out["message"])


def test_peer_that_exits_during_group_creation_is_reported(tmp_path: Path) -> None:
    # Mesh A (dp=2, tp=2): rank 2 dies in its first group, dp [0, 2]. Rank 0 waits
    # for it there and rank 3 in tp [2, 3]; their watches find it lost and every
    # survivor, rank 1 included, raises PeerLostError naming it (tests/test_peerloss.py
    # covers the rest).
    dead, timeout_s = 2, 5.0
    job = run_spawn(
        death_in_creation_job,
        WORLD,
        dead,
        timeout_s,
        tmp_path=tmp_path,
        linger=False,
        timeout=JOB_TIMEOUT,
    )
    assert job.outcomes[dead].exitcode == 4, job.describe()
    outs = {r: job.outcomes[r].value for r in (0, 1, 3)}
    for rank, out in outs.items():
        assert job.outcomes[rank].ok, job.describe()
        assert out["error"], (rank, out)
        assert "rank(s) [2] died during realize call #" in out["message"], out
        assert "(found by rank " in out["message"], out
        assert out["elapsed"] < timeout_s + 20.0, out
    for rank in (0, 3):
        group = fmesh.group(mesh_a(), "dp" if rank == 0 else "tp", rank)
        assert f"creating the group {list(group)}" in outs[rank]["message"]


def test_groups_made_by_a_failed_call_are_made_anew_by_the_next(tmp_path: Path) -> None:
    # Each group's rendezvous keys are named by the call that makes it: the second
    # call's [2, 3] never meets the address rank 3 left under the failed one's.
    outs = _values(
        run_spawn(retry_job, WORLD, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT)
    )
    for rank, out in enumerate(outs):
        assert out["first"]["error"], (rank, out)
        assert "disagree at realize call #" in out["first"]["message"], out
        assert out["created"] == 2, (rank, out)
        expected = {
            axis: float(sum(fmesh.group(mesh_pairs(), axis, rank))) for axis in ("x", "y")
        }
        assert out["sums"] == expected, (rank, out)
