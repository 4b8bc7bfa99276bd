"""A soak on 4 gloo ranks: leaks and crashes, not timings (not a ``python -m bench``
section, and nothing here is written to ``results.*``).

::

    python -m bench.soak                       # 200 cycles, 50 builds, 5 trainings each
    python -m bench.soak --cycles 10 --builds 5 --trainings 2 --steps 3

1. **Realize/destroy cycles**: every rank realizes a ``dp x tp`` mesh (a creating call:
   agreement, the liveness watch, gloo groups) and destroys it, ``--cycles`` times.
2. **Drop-in builds with torch's own methods**: ``fmesh.device_mesh.init_device_mesh``,
   then torch's ``_flatten`` and ``_unflatten`` on the result (routed into realize),
   then ``fmesh.destroy()``, ``--builds`` times.

Each rank reports its open file descriptors, threads and RSS at the start, after the
cycles, and at the end (before and after a garbage collection).

3. **Crash count, side by side**: a small DTensor model trained in bf16 with tensor
   parallelism (``ColwiseParallel``/``RowwiseParallel``) and FSDP2 (``fully_shard``) on a
   2 x 2 mesh made by torch's ``init_device_mesh``, and by fmesh's drop-in, ``--trainings``
   jobs of ``--steps`` steps each. A job crashes when a rank dies (a signal or a
   non-zero exit); its stacks come from ``faulthandler`` (``PYTHONFAULTHANDLER=1``
   semantics, one file per rank). gloo's ``malloc(): unaligned tcache chunk detected``
   in ``ProcessGroupGloo::runLoop`` is torch's: see ``docs/troubleshooting.md``.

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import gc
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import torch_ref
from .launch import Worker, WorkerError, finish, start
from .shared import Json

WORLD = 4


def _usage() -> Json:
    rss_kb = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
        "rss_mb": round(rss_kb / 1024, 1),
    }


def _faults(spec: Json, what: str) -> None:
    rank = os.environ["RANK"]
    path = Path(str(spec["dir"])) / f"{what}-rank{rank}.txt"
    faulthandler.enable(file=open(path, "w"))  # noqa: SIM115 - kept open for a crash


def soak_worker(spec: Json) -> Json:
    """One rank: realize/destroy cycles, then drop-in builds; usage before and after."""
    import fmesh
    from fmesh.device_mesh import init_device_mesh

    _faults(spec, "soak")
    torch_ref.init_gloo_worker(spec)
    before = _usage()
    mesh = fmesh.make_mesh({"dp": 2, "tp": 2})
    timeout = datetime.timedelta(seconds=60)
    created = 0
    t0 = time.monotonic()
    for _ in range(int(str(spec["cycles"]))):
        created += fmesh.realize(mesh, timeout=timeout).created
        fmesh.destroy()
    cycles_s = time.monotonic() - t0
    after_cycles = _usage()
    t0 = time.monotonic()
    for _ in range(int(str(spec["builds"]))):
        dm = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        flat = dm["dp", "tp"]._flatten("dp_tp")
        flat._unflatten(0, (2, 2), ("a", "b"))
        del dm, flat
        fmesh.destroy()
    builds_s = time.monotonic() - t0
    # torch's DeviceMesh objects form reference cycles that hold their groups (and
    # gloo's sockets) until the collector runs: measure before and after it.
    before_gc = _usage()
    gc.collect()
    return {
        "rank": int(os.environ["RANK"]),
        "start": before,
        "after_cycles": after_cycles,
        "end_before_gc": before_gc,
        "end": _usage(),
        "groups_created_in_cycles": created,
        "cycles_s": round(cycles_s, 1),
        "builds_s": round(builds_s, 1),
    }


def train_worker(spec: Json) -> Json:
    """One rank: a DTensor TP + FSDP2 model trained in bf16 on a 2 x 2 mesh."""
    import torch
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    _faults(spec, f"train-{spec['maker']}-{spec['job']}")
    torch_ref.init_gloo_worker(spec)
    import torch.distributed.device_mesh as torch_mesh

    import fmesh.device_mesh as fmesh_mesh

    maker = fmesh_mesh if spec["maker"] == "fmesh" else torch_mesh
    mesh = maker.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 64)
    ).to(torch.bfloat16)
    parallelize_module(
        model,
        mesh["tp"],
        {"0": ColwiseParallel(), "2": RowwiseParallel(), "4": ColwiseParallel()},
    )
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(int(str(spec["steps"]))):
        torch.manual_seed(100 + step + 10 * mesh["dp"].get_local_rank())
        loss = model(torch.randn(16, 64, dtype=torch.bfloat16)).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(round(loss.item(), 4))
    return {"rank": int(os.environ["RANK"]), "losses": losses}


def _job(worker: Worker, spec: Json, limit_s: float) -> tuple[list[Json], list[str]]:
    """Run one 4-rank job; (the ranks' results, the failures of those that crashed)."""
    store = torch_ref.host_store(WORLD, datetime.timedelta(seconds=limit_s))
    spec = {**spec, "port": store.port, "timeout_s": limit_s}
    env = {
        "WORLD_SIZE": str(WORLD),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port),
    }
    env.setdefault("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    ranks = [
        start(worker, spec, {**env, "RANK": str(r), "LOCAL_RANK": str(r)})
        for r in range(WORLD)
    ]
    deadline = time.monotonic() + limit_s
    out: list[Json] = []
    crashes: list[str] = []
    for r, started in enumerate(ranks):
        try:
            out.append(finish(started, deadline))
        except WorkerError as err:
            crashes.append(f"rank {r} (exit code {started.proc.exitcode}): {err}"[:2000])
    for started in ranks:  # a crashed rank leaves its peers waiting: stop them
        if started.proc.is_alive():
            started.proc.kill()
            started.proc.join(10)
    del store
    return out, crashes


def _stacks(folder: Path, prefix: str) -> dict[str, str]:
    return {
        p.name: p.read_text()[-4000:]
        for p in sorted(folder.glob(prefix + "*.txt"))
        if p.stat().st_size
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--builds", type=int, default=50)
    parser.add_argument("--trainings", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="fmesh-soak-"))
    report: Json = {"stacks_dir": str(folder)}
    spec: Json = {"cycles": args.cycles, "builds": args.builds, "dir": str(folder)}
    ranks, crashes = _job(soak_worker, spec, 600.0 + 2.0 * (args.cycles + args.builds))
    report["soak"] = {"ranks": ranks, "crashes": crashes, "stacks": _stacks(folder, "soak")}
    for maker in ("torch", "fmesh"):
        runs = []
        for job in range(args.trainings):
            spec = {"maker": maker, "job": job, "steps": args.steps, "dir": str(folder)}
            results, failed = _job(train_worker, spec, 300.0)
            runs.append({"ok": not failed, "crashes": failed})
            if not failed:
                runs[-1]["losses_rank0"] = results[0]["losses"]
        report[f"training_{maker}"] = {
            "jobs": len(runs),
            "crashed_jobs": sum(not r["ok"] for r in runs),
            "runs": runs,
            "stacks": _stacks(folder, f"train-{maker}"),
        }
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
