"""Recovery cost: a rank is SIGKILLed mid-training and the survivors carry on in-process.

One real gloo job of 8 ranks, mesh ``dp`` x ``fsdp`` x ``tp`` = 2 x 2 x 2, the store
hosted by this process (as torchrun's agent hosts it). Every step all-reduces over tp,
fsdp and dp; rank 5 kills itself at the start of step 2. Each survivor catches the
failed collective, calls ``fmesh.recover``, shrinks the mesh along ``dp``, realizes it
(survivors the shrunk mesh leaves out realize it too, as non-members) and retries the
step. The figure is, per survivor that trains on, the time from its failed collective
to the end of its first successful step after it, less the time it spent in
``recover`` (its wait for the dead rank to check in); the collective timeout itself is
before the failure is seen. Slowest survivor, median over jobs. torch has no
in-process recovery to compare with: a torch job restarts every worker.
"""

from __future__ import annotations

import datetime
import os
import signal
import statistics
import time

from . import torch_ref
from .launch import WorkerError, finish, start
from .shared import Bench, Json, Row, fmt_value

WORLD = 8
VICTIM = 5
KILL_STEP = 2
STEPS = 4
COLLECTIVE_S = 3.0
RECOVER_S = 6.0


def worker(spec: Json) -> Json:
    """One rank: train, survive the victim's death, report the recovery's cost."""
    import torch
    import torch.distributed as dist

    import fmesh

    rank = int(os.environ["RANK"])
    timeout = datetime.timedelta(seconds=COLLECTIVE_S)
    store = torch_ref.connect_store(spec["port"], WORLD, datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=timeout)
    mesh = fmesh.make_mesh({"dp": 2, "fsdp": 2, "tp": 2})
    # The same mesh without the short timeout first: a process's first creating call
    # (imports, first connections) on 8 ranks sharing 2 CPUs can take longer than the
    # 3 s the run measures with.
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
                return {"rank": rank, "cost": time.monotonic() - failed_at - in_recover}
        except RuntimeError:
            failed_at = failed_at or time.monotonic()
            began = time.monotonic()
            lost = fmesh.recover(timeout=datetime.timedelta(seconds=RECOVER_S))
            in_recover += time.monotonic() - began
            held = {r for r in lost if fmesh.coordinate(mesh, r) is not None}
            mesh = fmesh.shrink(mesh, held, axis="dp")
            realized = fmesh.realize(mesh, timeout=timeout)
    return {"rank": rank, "cost": None}


def _job() -> list[Json]:
    """One job; every survivor's report (the victim's death is the point)."""
    limit = 120.0
    store = torch_ref.host_store(WORLD, datetime.timedelta(seconds=limit))
    env = {
        "WORLD_SIZE": str(WORLD),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port),
    }
    env.setdefault("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    ranks = [
        start(worker, {"port": store.port}, {**env, "RANK": str(r), "LOCAL_RANK": str(r)})
        for r in range(WORLD)
    ]
    deadline = time.monotonic() + limit
    out: list[Json] = []
    for r, started in enumerate(ranks):
        try:
            out.append(finish(started, deadline))
        except WorkerError:
            if r != VICTIM or started.proc.exitcode != -signal.SIGKILL:
                raise
    del store
    return out


def section(b: Bench) -> None:
    repeats = 3 if b.mode.name == "full" else 1
    b.log(f"elastic recovery, {WORLD} ranks x {repeats} ...")
    costs = []
    for _ in range(repeats):
        reports = _job()
        costs.append(max(r["cost"] for r in reports if r["cost"] is not None))
    b.raw["elastic"] = {"cost_s": costs}
    b.rows.append(
        Row(
            "elastic.recovery.seconds",
            "elastic (gloo)",
            "a SIGKILLed rank: failed collective to the first good step after it, less "
            "recover's wait, slowest survivor",
            f"{WORLD} (2{chr(215)}2{chr(215)}2)",
            WORLD,
            "s",
            statistics.median(costs),
            None,
            note=f"recover, shrink along dp, realize among survivors, retry the step "
            f"(collective timeout {COLLECTIVE_S:g} s, recover timeout {RECOVER_S:g} s)",
            skipped="no in-process recovery",
        )
    )


def prose(row: Row | None) -> list[str]:
    """The README's sentence about the recovery row (none without it)."""
    if row is None:
        return []
    return [
        f"When one of {row.world} ranks is SIGKILLed mid-training, the survivors go on "
        "in-process: from the failed collective to the end of the first good step after "
        f"it, {fmt_value(row.fmesh, row.unit)} on the slowest survivor beyond the time "
        "`recover` waits for the dead rank (torch restarts every worker instead)."
    ]
