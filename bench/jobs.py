"""The real-gloo jobs with phases of their own (run on every rank), and ``fmesh plan`` as
a user runs it. A rank returns ``{impl: figures}``; the runner combines the ranks' (the
slowest rank's time, the mean of its requests, ...).
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import torch_ref
from .counting import CountingStore, by_call, delta
from .shared import Json
from .work import OPS, RECIPES, hit_timer, three_axes

# world_1d first: later, a flatten of the 5-d mesh may cover the world in rank order
# (then fmesh's memo already holds that axis).
PHASES = {"fmesh": ("world_1d", "new", "memo"), "torch": ("world_1d", "new")}
RECIPE = {"world_1d": "world_1d", "new": "trainer5", "memo": "trainer5"}


def realize(spec: Json) -> Json:
    """One rank: every phase of ``spec["impl"]``, each between barriers (gloo
    collectives: no store traffic), then memo hits. Per phase: the rank's wall time,
    groups, calls; rank 0 reads the rendezvous store's key count before and after, and
    fmesh's agreement keys left. In a counting job (``spec["count"]``) every request
    of the rank's store client is counted (by :class:`bench.counting.CountingStore`,
    Python on every request: the times come from the other jobs)."""
    import torch.distributed as dist

    import fmesh
    from fmesh._protocol.agreement import count_keys

    rank, impl = int(os.environ["RANK"]), spec["impl"]
    shape, count = spec["shape"], spec["count"]
    given = torch_ref.init_gloo(spec, CountingStore if count else None)
    store = given if count else CountingStore(given)
    raw = store.inner
    out: Json = {"rank": rank}
    keep: list[object] = []

    def phase(run: Callable[[], Json]) -> Json:
        dist.barrier()
        keys0 = raw.num_keys() if rank == 0 else 0
        groups0, created0 = torch_ref.group_counters()[0], fmesh.cache_stats().created
        counts, keys = store.snapshot(), store.key_snapshot()
        dist.barrier()
        start = time.perf_counter()
        result = run()
        result.setdefault("seconds", time.perf_counter() - start)
        result["groups"] = torch_ref.group_counters()[0] - groups0
        result["created"] = fmesh.cache_stats().created - created0
        if count:
            calls, watched, addresses = by_call(delta(store.key_snapshot(), keys))
            result["requests"] = sum(delta(store.snapshot(), counts).values())
            result["agree"], result["agreements"] = sum(calls.values()), len(calls)
            result["agree_max"] = max(calls.values(), default=0)
            result["watch"] = sum(watched.values()) + addresses
            result["watches"] = len(watched)
        dist.barrier()
        result["keys"] = raw.num_keys() - keys0 if rank == 0 else 0
        result["agree_left"] = count_keys(raw) if rank == 0 else 0
        return result

    def recipe(name: str) -> Json:
        keep.append(meshes := RECIPES[RECIPE[name]](OPS[impl], shape))
        return {"calls": len(meshes)}

    for name in PHASES[impl]:
        out[name] = phase(functools.partial(recipe, name))
    dist.barrier()
    out["hit"] = phase(hit_timer(impl, three_axes(shape), spec["rounds"], spec["budget_s"]))
    dist.barrier()
    return {impl: out}


VICTIM, KILL_STEP, STEPS = 5, 2, 4
COLLECTIVE_S, RECOVER_S = 3.0, 6.0


def elastic(spec: Json) -> Json:
    """One of 8 ranks training on ``dp x fsdp x tp`` = 2x2x2; rank 5 SIGKILLs itself at
    step 2. A survivor catches the failed collective, calls ``fmesh.recover``, shrinks
    the mesh along ``dp``, realizes it and retries the step. Its cost: from the failed
    collective to the end of its first good step after it, less the time ``recover``
    waited for the dead rank to check in."""
    import torch
    import torch.distributed as dist

    import fmesh

    rank, timeout = int(os.environ["RANK"]), datetime.timedelta(seconds=COLLECTIVE_S)
    torch_ref.init_gloo(spec, store_s=60.0, group_s=COLLECTIVE_S)
    mesh = fmesh.make_mesh({"dp": 2, "fsdp": 2, "tp": 2})
    # First without the short timeout: a process's first creating call on 8 ranks
    # sharing 2 CPUs can take longer than the 3 s the run measures with.
    fmesh.realize(mesh)
    realized = fmesh.realize(mesh, timeout=timeout)
    step, failed_at, in_recover = 0, None, 0.0
    while step < STEPS and fmesh.coordinate(mesh, rank) is not None:
        if rank == VICTIM and step == KILL_STEP:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            x = torch.ones(1)
            for axis in reversed(mesh.axis_names):
                dist.all_reduce(x, group=realized.group(axis))
            step += 1
            if failed_at is not None:
                cost = time.monotonic() - failed_at - in_recover
                return {"fmesh": {"rank": rank, "cost": cost}}
        except RuntimeError:
            failed_at = failed_at or time.monotonic()
            began = time.monotonic()
            lost = fmesh.recover(timeout=datetime.timedelta(seconds=RECOVER_S))
            in_recover += time.monotonic() - began
            held = {r for r in lost if fmesh.coordinate(mesh, r) is not None}
            mesh = fmesh.shrink(mesh, held, axis="dp")
            realized = fmesh.realize(mesh, timeout=timeout)
    return {"fmesh": {"rank": rank, "cost": None}}


PLAN_TARGET = "examples/parallel_dims.py:torchtitan"
PLAN_RANKS = 16


def plan(spec: Json) -> Json:
    """``fmesh plan --world W --rank sample:16`` of torchtitan's recipe as a subprocess
    (importing torch included): its wall time and the largest peak RSS it measured."""
    argv = ["plan", "--world", str(spec["world"]), "--rank", f"sample:{PLAN_RANKS}", "--json"]
    start = time.perf_counter()
    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "fmesh", *argv, PLAN_TARGET]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"fmesh plan failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    report = json.loads(proc.stdout)
    ranks = report["ranks"]
    if report["ok"] is not True or len(ranks) != PLAN_RANKS:
        raise RuntimeError(f"fmesh plan: {report['divergence']}, {len(ranks)} ranks")
    peak = max(int(r["peak_memory"] or 0) for r in ranks)
    return {"fmesh": {"seconds": seconds, "peak_rss": peak}}
