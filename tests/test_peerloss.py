"""A rank that dies while a realize call creates groups (DESIGN.md section 11, "No rank
waits for a dead peer"): every survivor raises :class:`fmesh.PeerLostError` naming it,
within bounds, keeps nothing of the call, and carries on after ``fmesh.recover``.

Real gloo processes launched torchrun-style by ``_dist.run_spawn`` (whose store lives
in the parent, as torchrun's agent hosts it). The death is injected in the worker: a
wrapper around ``fmesh._runtime.groups._new_group`` calls ``os._exit`` at the start of
this rank's Nth group creation, after every rank put its record of the call in.
"""

from __future__ import annotations

import collections
import datetime
import gc
import os
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from _dist import Job, run_spawn

import fmesh
from fmesh._protocol import liveness, watch

if TYPE_CHECKING:
    from fmesh._compat import Store

JOB_TIMEOUT = 100.0
DEFAULT_BOUND = 30.0
"""At default settings every survivor raises within this many seconds (the contract)."""
DIED = 7
"""The exit code of an injected death."""


# -- worker side --------------------------------------------------------------------------


def _launcher_store() -> Store:
    import torch.distributed as dist

    tcp: Any = dist.TCPStore  # type: ignore[attr-defined]  # implicit re-export
    return cast(
        "Store",
        tcp(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 1, is_master=False),
    )


def _barrier(store: Store, name: str, ranks: list[int], me: int) -> None:
    store.set(f"peerloss/{name}/{me}", "1")
    store.wait([f"peerloss/{name}/{r}" for r in ranks], datetime.timedelta(seconds=90))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


VERDICT = {"end", "lost", "by", "gone", "read"}
"""What a failed call leaves while the rank it names has not read it (a dead one never
does: ``fmesh.recover`` among the survivors carries on without it)."""


def _keys_left(store: Store) -> dict[str, list[str]]:
    """The protocol's keys by call (its prefix), the streams' records apart."""
    out: dict[str, list[str]] = {}
    for key in store.list_keys():
        if "fmesh/a/" in key and not key.endswith("/c"):
            call, _, last = key.rpartition("/")
            out.setdefault(call.rpartition("fmesh/a/")[2], []).append(last)
    return {call: sorted(keys) for call, keys in out.items()}


def _inject(rank: int, deaths: dict[int, int], naps: dict[int, tuple[int, float]]) -> None:
    """This rank exits at the start of its ``deaths[rank]``-th group creation, or
    sleeps ``naps[rank][1]`` seconds at the start of its ``naps[rank][0]``-th."""
    from fmesh._runtime import groups

    real = groups._new_group
    count = [0]

    def new_group(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        if deaths.get(rank) == count[0]:
            os._exit(DIED)
        if rank in naps and naps[rank][0] == count[0]:
            time.sleep(naps[rank][1])
        return real(*args, **kwargs)

    groups._new_group = new_group


def _call(how: str, shape: dict[str, int], timeout_s: float | None) -> None:
    import torch.distributed as dist

    names = tuple(shape)
    sizes = tuple(shape.values())
    timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    if how == "realize":
        fmesh.realize(fmesh.make_mesh(shape), timeout=timeout)
    elif how == "init_device_mesh":
        from fmesh.device_mesh import init_device_mesh

        init_device_mesh("cpu", sizes, mesh_dim_names=names)
    elif how == "routed":  # torch's own init_device_mesh, routed (python -m fmesh.route)
        from torch.distributed.device_mesh import init_device_mesh as torch_init

        from fmesh.device_mesh import route

        route()
        torch_init("cpu", sizes, mesh_dim_names=names)
    else:  # torch's own _unflatten on a mesh the drop-in made (routed into realize)
        from fmesh.device_mesh import init_device_mesh

        flat = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("all",))
        flat._unflatten(0, sizes, names)


def loss_job(
    rank: int,
    world: int,
    how: str,
    shape: dict[str, int],
    deaths: dict[int, int],
    timeout_s: float | None,
    naps: dict[int, tuple[int, float]],
) -> dict[str, Any]:
    """Warm up (a creating call, so pooled connections exist), inject the fault, make
    the call; on a survivor's error: check what is left, recover, carry on."""
    import torch
    import torch.distributed as dist

    from fmesh._runtime.memo import state

    fmesh.realize(fmesh.make_mesh({"w": world}), backend="gloo")
    fmesh.realize(fmesh.make_mesh({"x": 2, "y": world // 2}, ranks=list(range(world))[::-1]))
    launcher = _launcher_store()
    everyone = list(range(world))
    _barrier(launcher, "warm", everyone, rank)
    gc.collect()
    threads, fds = collections.Counter(t.name for t in threading.enumerate()), _fds()
    with state.lock:
        memo = set(state.group_memo)
    _inject(rank, deaths, naps)
    start = time.monotonic()
    out: dict[str, Any] = {}
    watches = liveness.started
    try:
        _call(how, shape, timeout_s)
        out["error"] = None
        out["watches"] = liveness.started - watches
        _call(how, shape, timeout_s)  # a memo hit: no watch, no thread
        out["hit_watches"] = liveness.started - watches - out["watches"]
    except Exception as err:
        out.update(error=type(err).__name__, message=str(err), lost=getattr(err, "lost", None))
        out["traceback"] = traceback.format_exc()
    out["elapsed"] = time.monotonic() - start
    gc.collect()
    survivors = [r for r in everyone if r not in deaths]
    if out["error"] is None:
        return out
    # Nothing of the failed call is left in this process.
    with state.lock:
        out["memo_extra"] = len(set(state.group_memo) - memo)
    now = collections.Counter(t.name for t in threading.enumerate())
    out["threads_extra"] = sorted((now - threads).elements())
    out["fds_extra"] = _fds() - fds
    _barrier(launcher, "raised", survivors, rank)
    out["keys_left"] = _keys_left(launcher)
    lost = fmesh.recover(timeout=datetime.timedelta(seconds=3))
    out["recovered_lost"] = sorted(lost)
    # Carry on without them: a mesh of the survivors, and a collective on it.
    mesh = fmesh.make_mesh({"s": len(survivors)}, ranks=survivors)
    group = fmesh.realize(mesh, backend="gloo").groups["s"]
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    out["sum"] = int(t.item())
    return out


# -- parent side ----------------------------------------------------------------------------


def _run(
    tmp_path: Path,
    world: int,
    how: str,
    shape: dict[str, int],
    deaths: dict[int, int],
    timeout_s: float | None = None,
    naps: dict[int, tuple[int, float]] | None = None,
) -> Job:
    return run_spawn(
        loss_job,
        world,
        how,
        shape,
        deaths,
        timeout_s,
        naps or {},
        tmp_path=tmp_path,
        linger=False,
        timeout=JOB_TIMEOUT,
    )


def _check_survivors(job: Job, deaths: dict[int, int], bound: float) -> None:
    dead = sorted(deaths)
    for rank in deaths:
        assert job.outcomes[rank].exitcode == DIED, job.describe()
    for o in job.outcomes:
        if o.rank in deaths:
            continue
        assert o.ok, job.describe()
        out = o.value
        assert out["error"] == "PeerLostError", (o.rank, out.get("traceback"))
        assert out["lost"] == tuple(dead), (o.rank, out)
        assert f"rank(s) {dead} died during realize call #" in out["message"], out
        assert "fmesh.recover" in out["message"], out
        assert out["elapsed"] < bound, (o.rank, out)
        assert out["memo_extra"] == 0, (o.rank, out)
        assert out["threads_extra"] == [], (o.rank, out)
        # A link to the next live rank on the ring, kept for later calls, and the
        # port's end of a watcher's new link: no more (descriptors of its groups are
        # gone with them, and the call's hold on the store connections ended).
        assert out["fds_extra"] <= 2, (o.rank, out)
        # The failed call's verdict (for the dead, who never read it), and per stream
        # the last call that ended well's count and "ok" (its next call removes them).
        calls = out["keys_left"]
        failed = [c for c, keys in calls.items() if "end" in keys]
        assert len(failed) == 1 and set(calls[failed[0]]) == VERDICT, (o.rank, calls)
        assert all(keys == ["n", "ok"] for c, keys in calls.items() if c not in failed), calls
        assert out["recovered_lost"] == dead, (o.rank, out)
        assert out["sum"] == len(job.outcomes) - len(dead), (o.rank, out)


def test_death_at_the_start_of_creation_at_default_settings(tmp_path: Path) -> None:
    # dp x tp = 2 x 2: rank 3 dies as it starts its first group; ranks 1 and 2 wait for
    # it there, rank 0 for ranks that gave up. All raise within the contract's 30 s.
    deaths = {3: 1}
    job = _run(tmp_path, 4, "realize", {"dp": 2, "tp": 2}, deaths)
    _check_survivors(job, deaths, DEFAULT_BOUND)


def test_death_in_the_middle_with_a_short_timeout(tmp_path: Path) -> None:
    # Rank 1 made its dp group, then dies at its tp group: the groups already made
    # by the call are dropped on every survivor. Found within about the timeout.
    deaths = {1: 2}
    job = _run(tmp_path, 4, "realize", {"dp": 2, "tp": 2}, deaths, timeout_s=6.0)
    _check_survivors(job, deaths, 6.0 + 12.0)


def test_two_ranks_die_at_once_on_eight_ranks(tmp_path: Path) -> None:
    # Each is found by the members of its first group; both are named everywhere.
    deaths = {2: 1, 5: 1}
    job = _run(tmp_path, 8, "realize", {"a": 2, "b": 2, "c": 2}, deaths, timeout_s=8.0)
    _check_survivors(job, deaths, 8.0 + 12.0)


@pytest.mark.parametrize("how", ["init_device_mesh", "routed", "_unflatten"])
def test_torchs_own_entry_points_raise_it_too(tmp_path: Path, how: str) -> None:
    # The drop-in takes no timeout: default settings, found by end of file.
    deaths = {2: 1}
    job = _run(tmp_path, 4, how, {"dp": 2, "tp": 2}, deaths)
    _check_survivors(job, deaths, DEFAULT_BOUND)


def test_a_slow_peer_that_is_alive_is_not_lost(tmp_path: Path) -> None:
    # Rank 2 sleeps longer than the silence (7 s at timeout=14 s) before its first
    # group, but within the timeout: its port is there, the call completes everywhere.
    interval, silence = watch.settings(4, datetime.timedelta(seconds=14))
    naps = {2: (1, silence + 2 * interval + 1.0)}
    job = _run(tmp_path, 4, "realize", {"dp": 2, "tp": 2}, {}, timeout_s=14.0, naps=naps)
    for o in job.outcomes:
        assert o.ok and o.value["error"] is None, job.describe()
        assert (o.value["watches"], o.value["hit_watches"]) == (1, 0), o.value
    assert job.outcomes[2].value["elapsed"] >= naps[2][1]
