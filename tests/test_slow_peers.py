"""Lost means dead (issue 33): a rank stopped for 20 s (SIGSTOP) or whose thread holds
the GIL for 20 s in the middle of group creation is slow, not dead, so every rank
finishes; a rank the others gave up on (its sentinel killed while it was stopped)
raises at once when it runs again, saying why; a rank blocked in a group construction
that nothing can cancel (gloo's native connect) raises with the others and leaves the
construction behind.

Real gloo processes (``_dist.run_spawn``). The faults are injected at the start of a
rank's first group creation of the call, after every rank agreed on it (a wrapper
around ``fmesh._runtime.groups._new_group``); a stopped rank is resumed by a shell it
started before stopping itself.
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

from _dist import run_spawn

import fmesh
from fmesh._protocol import liveness

WORLD = 4
STALL = 20
"""Seconds a rank is stopped or holds the GIL."""
JOB_TIMEOUT = 120.0
_resumed: list[float] = []
"""When this rank ran again after being stopped (worker side)."""


def _at_first_group(rank: int, fault: dict[int, str]) -> None:
    """Rank ``rank`` plays ``fault[rank]`` as it starts its first group of the call."""
    from fmesh._protocol import sentinel
    from fmesh._runtime import groups

    real = groups._new_group
    done = [False]

    def new_group(*args: Any, **kwargs: Any) -> Any:
        what = fault.get(rank)
        if what is not None and not done[0]:
            done[0] = True
            me = os.getpid()
            if what == "stop":
                subprocess.Popen(["sh", "-c", f"sleep {STALL}; kill -CONT {me}"])
                os.kill(me, signal.SIGSTOP)
            elif what == "gil":
                # libc's sleep through PyDLL keeps the GIL: every thread of this
                # process, the watch's included, stands still while it runs.
                hold = ctypes.PyDLL(None).sleep
                threading.Timer(0.3, hold, (STALL,)).start()
            elif what == "given-up":
                s = sentinel.started()
                assert s is not None
                script = f"sleep 1; kill -KILL {s.proc.pid}; sleep 14; kill -CONT {me}"
                subprocess.Popen(["sh", "-c", script])
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


def stall_job(rank: int, world: int, how: str, fault: dict[int, str]) -> dict[str, Any]:
    """A warm-up creating call, then the faulty call (and the same call again, a hit)."""
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
    out["abandoned"] = liveness.abandoned
    return out


def _values(job: Any) -> list[dict[str, Any]]:
    return [o.value for o in job.outcomes if o.ok] if all(o.ok for o in job.outcomes) else []


def test_a_stopped_rank_and_a_rank_holding_the_gil_are_slow_not_lost(tmp_path: Path) -> None:
    # Rank 1 is stopped for 20 s and rank 3 holds the GIL for 20 s, both in the middle
    # of their first group: torch would wait, so do the others; nobody is lost.
    fault = {1: "stop", 3: "gil"}
    job = run_spawn(stall_job, WORLD, "realize", fault, tmp_path=tmp_path, timeout=JOB_TIMEOUT)
    outs = _values(job)
    assert outs, job.describe()
    for rank, out in enumerate(outs):
        assert out["error"] is None, (rank, out)
        assert (out["watches"], out["hit_watches"]) == (1, 0), (rank, out)
        assert out["elapsed"] >= STALL - 1, (rank, out)  # every rank waited for them


def test_the_drop_in_waits_for_a_stopped_rank(tmp_path: Path) -> None:
    fault = {2: "stop"}
    job = run_spawn(
        stall_job, WORLD, "init_device_mesh", fault, tmp_path=tmp_path, timeout=JOB_TIMEOUT
    )
    outs = _values(job)
    assert outs, job.describe()
    for rank, out in enumerate(outs):
        assert out["error"] is None, (rank, out)
        assert out["elapsed"] >= STALL - 1, (rank, out)


def test_a_rank_given_up_on_raises_at_once_when_it_runs_again(tmp_path: Path) -> None:
    # Rank 2 stops; its sentinel is killed a second later, so rank 1 (its watcher)
    # declares it lost and the others raise; rank 2 resumes 14 s later and raises at
    # once, saying why, instead of waiting in a rendezvous or gloo's connect.
    fault = {2: "given-up"}
    job = run_spawn(stall_job, WORLD, "realize", fault, tmp_path=tmp_path, timeout=JOB_TIMEOUT)
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
    assert "was killed by SIGKILL" in given_up["message"], given_up
    assert given_up["after_resume"] < 10.0, given_up


def blocked_job(rank: int, world: int, dead: int, blocked: int) -> dict[str, Any]:
    """Rank ``dead`` exits at its first group; rank ``blocked``'s group construction
    never returns (a stand-in for gloo's native connect, which releases the GIL)."""
    from fmesh import _compat

    fmesh.realize(fmesh.make_mesh({"x": 2, "y": world // 2}, ranks=list(range(world))[::-1]))
    if rank == dead:
        _compat.new_named_group = lambda *a, **k: os._exit(5)
    elif rank == blocked:
        _compat.new_named_group = lambda *a, **k: time.sleep(600)
    start = time.monotonic()
    out: dict[str, Any] = {"error": None}
    try:
        fmesh.realize(
            fmesh.make_mesh({"dp": 2, "tp": 2}), timeout=datetime.timedelta(seconds=600)
        )
    except Exception as err:
        out.update(error=type(err).__name__, message=str(err), lost=getattr(err, "lost", None))
    out["elapsed"] = time.monotonic() - start
    out["abandoned"] = liveness.abandoned
    return out


def test_a_rank_blocked_in_an_uncancellable_construction_raises_with_the_others(
    tmp_path: Path,
) -> None:
    job = run_spawn(blocked_job, WORLD, 1, 3, tmp_path=tmp_path, timeout=JOB_TIMEOUT)
    assert job.outcomes[1].exitcode == 5, job.describe()
    for rank in (0, 2, 3):
        o = job.outcomes[rank]
        assert o.ok, job.describe()
        assert o.value["error"] == "PeerLostError" and o.value["lost"] == (1,), o.value
        assert o.value["elapsed"] < 30.0, o.value
    assert job.outcomes[3].value["abandoned"] == 1, job.outcomes[3].value


def off_job(rank: int, world: int) -> dict[str, Any]:
    """``FMESH_PEER_WATCH=0``: creating calls run no watch and start no sentinel."""
    import torch.distributed as dist

    from fmesh._protocol import sentinel
    from fmesh._protocol.agreement import count_keys

    os.environ["FMESH_PEER_WATCH"] = "0"
    fmesh.realize(fmesh.make_mesh({"dp": 2, "tp": 2}))
    fmesh.realize(fmesh.make_mesh({"x": 2, "y": 2}, ranks=(3, 2, 1, 0)))
    dist.barrier()
    from fmesh._compat import default_store

    return {
        "watches": liveness.started,
        "sentinel": sentinel.started() is not None,
        "left": count_keys(default_store()) if rank == 0 else 0,
    }


def test_the_watch_off_starts_no_sentinel_and_leaves_no_key(tmp_path: Path) -> None:
    outs = _values(run_spawn(off_job, WORLD, tmp_path=tmp_path, timeout=JOB_TIMEOUT))
    assert outs
    for out in outs:
        assert out == {"watches": 0, "sentinel": False, "left": 0}, outs
