"""Alive until exited (issues 33, 40): a rank stopped for 20 s together with the
process it started (SIGSTOP to the tree), frozen with it by a cgroup v2 freeze (where
this machine lets the test make one), or whose thread holds the GIL for 20 s, in the
middle of group creation, is slow, not dead: every rank finishes, through ``realize``
and through the drop-in. A rank the others gave up on (its port closed while it was
stopped: to its peers, a process gone) raises the documented ``PeerLostError`` at once
when it runs again, saying why; a rank blocked in a group construction that nothing
can cancel (gloo's native connect) does not hold the others back, and raises the same
error once the construction returns.

Real gloo processes (``_dist.run_spawn``). The faults are injected at the start of a
rank's first group creation of the call (a wrapper around
``fmesh._runtime.groups._new_group``); a stopped or frozen rank is resumed by a shell
it started before.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _dist import run_spawn, wait_for_peers

import fmesh
from fmesh._protocol import liveness

WORLD = 4
STALL = 20
"""Seconds a rank is stopped or holds the GIL."""
JOB_TIMEOUT = 120.0
_resumed: list[float] = []
"""When this rank ran again after being stopped (worker side)."""


FREEZER = Path("/sys/fs/cgroup/unified")
"""Where this machine mounts cgroup v2 (next to v1's controllers); else the root."""


def cgroup_v2() -> Path | None:
    """A cgroup v2 hierarchy this test can make a freezable cgroup in, or ``None``."""
    for root in (FREEZER, Path("/sys/fs/cgroup")):
        probe = root / f"fmesh-probe-{os.getpid()}"
        try:
            probe.mkdir()
        except OSError:
            continue
        try:
            if (probe / "cgroup.freeze").exists():
                return root
        finally:
            probe.rmdir()
    return None


def _freeze_with_child(me: int, child: int, root: Path) -> None:
    """Freeze this rank and the process it started, together, for ``STALL`` seconds
    (a cgroup v2 freeze, as ``docker pause`` or a suspended job step does)."""
    group = root / f"fmesh-frozen-{me}"
    script = (
        f"mkdir {group}; echo {me} > {group}/cgroup.procs; "
        f"echo {child} > {group}/cgroup.procs; echo 1 > {group}/cgroup.freeze; "
        f"sleep {STALL}; echo 0 > {group}/cgroup.freeze; "
        f"echo {me} > {root}/cgroup.procs; echo {child} > {root}/cgroup.procs; "
        f"rmdir {group}"
    )
    subprocess.Popen(["sh", "-c", script])
    # Go on only once frozen and thawed (a jump of the clock), however long the shell
    # takes to start on a loaded machine.
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        before = time.monotonic()
        time.sleep(0.05)
        if time.monotonic() - before > STALL / 2:
            return


def _at_first_group(rank: int, fault: dict[int, str]) -> None:
    """Rank ``rank`` plays ``fault[rank]`` as it starts its first group of the call."""
    from fmesh._protocol import port
    from fmesh._runtime import groups

    real = groups._new_group
    done = [False]

    def new_group(*args: Any, **kwargs: Any) -> Any:
        what = fault.get(rank)
        if what is not None and not done[0]:
            done[0] = True
            me = os.getpid()
            if what in ("stop-tree", "freeze"):
                # A process this rank started (a data loader, a compiler): stopped or
                # frozen with it, as a cgroup freeze or SLURM's suspend does.
                child = subprocess.Popen(["sleep", str(4 * STALL)]).pid
                root = cgroup_v2() if what == "freeze" else None
                if root is not None:
                    _freeze_with_child(me, child, root)
                else:
                    script = f"sleep {STALL}; kill -CONT {child}; kill -CONT {me}"
                    subprocess.Popen(["sh", "-c", script])
                    os.kill(child, signal.SIGSTOP)
                    os.kill(me, signal.SIGSTOP)
            elif what == "gil":
                # libc's sleep through PyDLL keeps the GIL: every thread of this
                # process, the watch's included, stands still while it runs.
                hold = ctypes.PyDLL(None).sleep
                threading.Timer(0.3, hold, (STALL,)).start()
            elif what == "given-up":
                # Its port closed while it is stopped: to its peers, a process gone
                # (as when its host is cut off; tests/test_hosts_netns.py cuts one).
                p = port.started()
                assert p is not None
                p.close()
                subprocess.Popen(["sh", "-c", f"sleep 14; kill -CONT {me}"])
                os.kill(me, signal.SIGSTOP)
                _resumed.append(time.monotonic())
        return real(*args, **kwargs)

    groups._new_group = new_group


def _call(how: str) -> None:
    if how == "realize":
        fmesh.realize(fmesh.make_mesh({"dp": 2, "tp": 2}))
    else:
        from fmesh.device_mesh import init_device_mesh

        init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))


def stall_job(
    rank: int, world: int, how: str, fault: dict[int, str], stay: bool = False
) -> dict[str, Any]:
    """A warm-up creating call, then the faulty call (and the same call again, a hit);
    ``stay``: every rank lives on until all have returned (as survivors that carry on
    do), instead of exiting."""
    fmesh.realize(fmesh.make_mesh({"x": 2, "y": world // 2}, ranks=list(range(world))[::-1]))
    _at_first_group(rank, fault)
    watches = liveness.started
    start = time.monotonic()
    out: dict[str, Any] = {"error": None}
    try:
        _call(how)
        out["watches"] = liveness.started - watches
        _call(how)
        out["hit_watches"] = liveness.started - watches - out["watches"]
    except Exception as err:
        out.update(error=type(err).__name__, message=str(err), lost=getattr(err, "lost", None))
    out["elapsed"] = time.monotonic() - start
    if _resumed:
        out["after_resume"] = time.monotonic() - _resumed[0]
    if stay:  # alive, with whatever gloo kept of the failed call, until all are done
        wait_for_peers(JOB_TIMEOUT / 2)
    return out


def _values(job: Any) -> list[dict[str, Any]]:
    return [o.value for o in job.outcomes if o.ok] if all(o.ok for o in job.outcomes) else []


def test_a_rank_stopped_with_its_child_and_a_rank_holding_the_gil_are_slow_not_lost(
    tmp_path: Path,
) -> None:
    # Rank 1 is stopped with the process it started for 20 s and rank 3 holds the GIL
    # for 20 s, both in the middle of their first group: torch would wait, so do the
    # others; nobody is lost.
    fault = {1: "stop-tree", 3: "gil"}
    job = run_spawn(
        stall_job,
        WORLD,
        "realize",
        fault,
        tmp_path=tmp_path,
        linger=False,
        timeout=JOB_TIMEOUT,
    )
    outs = _values(job)
    assert outs, job.describe()
    for rank, out in enumerate(outs):
        assert out["error"] is None, (rank, out)
        assert (out["watches"], out["hit_watches"]) == (1, 0), (rank, out)
        assert out["elapsed"] >= STALL - 1, (rank, out)  # every rank waited for them


def test_the_drop_in_waits_for_a_rank_frozen_with_its_child(tmp_path: Path) -> None:
    # A cgroup v2 freeze of the rank and its child where this machine allows one (root
    # with cgroup v2 mounted read-write: CI's and this project's machines), else both
    # stopped with SIGSTOP; the job says which.
    fault = {2: "freeze"}
    job = run_spawn(
        stall_job,
        WORLD,
        "init_device_mesh",
        fault,
        tmp_path=tmp_path,
        linger=False,
        timeout=JOB_TIMEOUT,
    )
    outs = _values(job)
    assert outs, job.describe()
    for rank, out in enumerate(outs):
        assert out["error"] is None, (rank, out)
        assert out["elapsed"] >= STALL - 1, (rank, out)


@pytest.mark.parametrize("survivors", ["exit", "stay"])
def test_a_rank_given_up_on_raises_at_once_when_it_runs_again(
    tmp_path: Path, survivors: str
) -> None:
    # Rank 2 closes its port and stops, so rank 1 (its watcher) finds the port refusing
    # and declares it lost, and the others raise; rank 2 resumes 14 s later and raises
    # the documented error at once, saying why, instead of waiting in a rendezvous or
    # gloo's connect. Survivors that stay alive keep what gloo kept of the failed
    # groups (a listener that accepts and never answers): rank 2, which finds every
    # rendezvous key there, must read the verdict before it connects.
    fault = {2: "given-up"}
    job = run_spawn(
        stall_job,
        WORLD,
        "realize",
        fault,
        survivors == "stay",
        tmp_path=tmp_path,
        linger=False,
        timeout=JOB_TIMEOUT,
    )
    outs = _values(job)
    assert outs, job.describe()
    for rank in (0, 1, 3):
        out = outs[rank]
        assert out["error"] == "PeerLostError", (rank, out)
        assert out["lost"] == (2,), (rank, out)
        assert "rank(s) [2] died during realize call #" in out["message"], out
        assert out["elapsed"] < 30.0, (rank, out)
    given_up = outs[2]
    assert given_up["error"] == "PeerLostError" and given_up["lost"] == (2,), given_up
    assert "rank 2 was given up on during realize call #" in given_up["message"], given_up
    assert (
        "the other ranks declared it lost (found by rank 1: its port refused"
        in (given_up["message"])
    ), given_up
    assert given_up["after_resume"] < 10.0, given_up


def blocked_job(rank: int, world: int, dead: int, blocked: int) -> dict[str, Any]:
    """Rank ``dead`` exits at its first group; rank ``blocked``'s group construction
    never returns (a stand-in for gloo's native connect, which releases the GIL)."""
    from fmesh import _compat

    fmesh.realize(fmesh.make_mesh({"x": 2, "y": world // 2}, ranks=list(range(world))[::-1]))
    if rank == dead:
        _compat.new_named_group = lambda *a, **k: os._exit(5)
    elif rank == blocked:  # its first: blocked, then nothing made (the others: real)
        real, first = _compat.new_named_group, [True]

        def blocked_once(*args: Any, **kwargs: Any) -> Any:
            if first[0]:
                first[0] = False
                time.sleep(BLOCKED)
                return None
            return real(*args, **kwargs)

        _compat.new_named_group = blocked_once
    start = time.monotonic()
    out: dict[str, Any] = {"error": None}
    try:
        fmesh.realize(
            fmesh.make_mesh({"dp": 2, "tp": 2}), timeout=datetime.timedelta(seconds=600)
        )
    except Exception as err:
        out.update(error=type(err).__name__, message=str(err), lost=getattr(err, "lost", None))
    out["elapsed"] = time.monotonic() - start
    return out


BLOCKED = 20.0
"""Seconds rank 3's stand-in for gloo's native connect blocks."""


def test_a_rank_blocked_in_an_uncancellable_construction_raises_once_it_returns(
    tmp_path: Path,
) -> None:
    # Rank 1 dies; rank 3 is held in a construction nothing can cancel (a stand-in for
    # gloo's native connect, past its rendezvous): the others raise at once, without
    # waiting for it; rank 3 raises the same documented error as soon as it returns.
    job = run_spawn(
        blocked_job, WORLD, 1, 3, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT
    )
    assert job.outcomes[1].exitcode == 5, job.describe()
    for rank in (0, 2, 3):
        o = job.outcomes[rank]
        assert o.ok, job.describe()
        assert o.value["error"] == "PeerLostError" and o.value["lost"] == (1,), o.value
        if rank == 3:
            assert BLOCKED <= o.value["elapsed"] < BLOCKED + 15.0, o.value
        else:
            assert o.value["elapsed"] < 30.0, o.value


def off_job(rank: int, world: int) -> dict[str, Any]:
    """``FMESH_PEER_WATCH=0``: creating calls open no port and publish no address."""
    import torch.distributed as dist

    from fmesh._compat import default_store
    from fmesh._protocol import port

    os.environ["FMESH_PEER_WATCH"] = "0"
    fmesh.realize(fmesh.make_mesh({"dp": 2, "tp": 2}))
    fmesh.realize(fmesh.make_mesh({"x": 2, "y": 2}, ranks=(3, 2, 1, 0)))
    dist.barrier()
    keys = default_store().list_keys() if rank == 0 else []
    return {
        "port": port.started() is not None,
        "addresses": [k for k in keys if port.KEY in k],
        "left": sorted(k.rpartition("/p/")[2] for k in keys if "fmesh/a/" in k),
    }


def test_the_watch_off_opens_no_port_and_leaves_no_address(tmp_path: Path) -> None:
    outs = _values(
        run_spawn(off_job, WORLD, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT)
    )
    assert outs
    for rank, out in enumerate(outs):
        left = ["2/n", "2/ok", "c"] if rank == 0 else []
        assert out == {"port": False, "addresses": [], "left": left}, outs
