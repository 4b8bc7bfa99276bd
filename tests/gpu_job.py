"""The NCCL paths on real GPUs, one rank per GPU (run by tests/test_gpu.py under
torchrun). Prints one JSON line of facts per rank; the test asserts them.

``--creation`` (no torchrun, one GPU): rank 1 of a two-rank NCCL group whose rank 0
never comes, made directly with torch's backend classes, each in a child process with
a deadline: how the unique-id wait ends on the legacy backend (a plain store) and on
torch 2.15's nccl2 (a plain store, and the watch's interruptible store cancelled after
2 s), and whether the constructor lets Python threads run meanwhile
(``docs/design/nccl.md``).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

import fmesh


def _collectives(realized: fmesh.RealizedMesh) -> dict[str, Any]:
    """An all_reduce of this rank's bit on every axis group, on CUDA and on CPU."""
    out: dict[str, Any] = {}
    for axis in realized.mesh.axis_names:
        pg = realized.group(axis)
        facts: dict[str, Any] = {"backend": str(dist.get_backend(pg)), "size": pg.size()}
        for device in ("cuda", "cpu"):
            x = torch.tensor([1 << realized.rank], device=device)
            try:
                dist.all_reduce(x, group=pg)
                facts[device] = int(x.item())
            except Exception as err:  # recorded, asserted by the test
                facts[device] = f"{type(err).__name__}: {err}"[:200]
        out[axis] = facts
    return out


def _fsdp_tp(dm: Any) -> list[float]:
    """A few FSDP2 (over dp) x TP (over tp) steps on CUDA; the losses."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).cuda()
    parallelize_module(model, dm["tp"], {"0": ColwiseParallel()})
    fully_shard(model, mesh=dm["dp"])
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16, device="cuda")
    y = torch.randn(8, 4, device="cuda")
    losses = []
    for _ in range(3):
        loss = nn.functional.mse_loss(model(x), y)
        torch.autograd.backward(loss)
        optim.step()
        optim.zero_grad()
        losses.append(float(loss.item()))
    return losses


def main() -> int:
    mesh = fmesh.make_mesh({"pp": 1, "dp": 1, "tp": 1})
    realized = fmesh.realize(mesh)  # initializes NCCL, device bound (eager init)
    world = dist.group.WORLD
    assert world is not None
    from fmesh._compat.nccl import flavor

    facts: dict[str, Any] = {
        "rank": realized.rank,
        "world_backend": str(dist.get_backend()),
        "world_nccl_class": type(world._get_backend(torch.device("cuda"))).__name__,
        "fmesh_flavor": flavor("nccl"),
        "bound_device": str(world.bound_device_id),
        "current_device": torch.cuda.current_device(),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "collectives": _collectives(realized),
    }
    nccl_axis = fmesh.realize(mesh, backend={"tp": "nccl"})
    facts["explicit_nccl_tp"] = _collectives(nccl_axis)["tp"]

    dm = realized.to_device_mesh()
    facts["device_mesh"] = {"device_type": dm.device_type, "shape": list(dm.shape)}
    full = torch.arange(32.0, device="cuda").reshape(4, 8)
    dt = distribute_tensor(full, dm, [Replicate(), Shard(0), Shard(1)])
    facts["dtensor_round_trip"] = bool(torch.equal(dt.full_tensor(), full))
    total = dt.sum()
    assert isinstance(total, DTensor)
    facts["dtensor_sum"] = float(total.full_tensor().item())
    facts["fsdp_tp_losses"] = _fsdp_tp(dm)

    before = fmesh.cache_stats()
    old = realized.group("dp")
    fmesh.destroy()
    again = fmesh.realize(mesh)
    facts["destroy"] = {
        "live_before": before.live,
        "live_after": fmesh.cache_stats().live,
        "new_group": again.group("dp") is not old,
        "collectives": _collectives(again),
    }
    print("FACTS " + json.dumps(facts), flush=True)
    fmesh.destroy()
    dist.destroy_process_group()
    return 0


# -- --creation: a blocked unique-id exchange on one GPU ------------------------------------

CANCEL_AFTER = 2.0
"""Seconds before the watch-like predicate gives the creation up."""
PLAIN_TIMEOUT = 5.0
"""The plain store's (and the group's) timeout in the control cases."""


def _one(case: str) -> dict[str, Any]:
    """Rank 1 of a group of two whose rank 0 never publishes the NCCL id."""
    from fmesh._compat import memory_store
    from fmesh._compat.interruptible import interruptible_store

    inner = memory_store()
    inner.set_timeout(datetime.timedelta(seconds=PLAIN_TIMEOUT))
    store: Any = inner
    if case == "nccl2_watch":
        inner.set_timeout(datetime.timedelta(seconds=60))
        cancelled = threading.Event()
        threading.Timer(CANCEL_AFTER, cancelled.set).start()
        store = interruptible_store(inner, cancelled.is_set, 0.5, "given up by the watch")
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = datetime.timedelta(seconds=60 if case == "nccl2_watch" else PLAIN_TIMEOUT)
    ticks = [0]
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.01)

    threading.Thread(target=tick, daemon=True).start()
    device = torch.device("cuda", 0)
    start = time.monotonic()
    out: dict[str, Any] = {"case": case}
    try:
        if case == "legacy_plain":
            pg = dist.ProcessGroupNCCL(store, 1, 2, opts)
            pg.eager_connect_single_device(device)
        else:
            nccl2 = getattr(dist, "ProcessGroupNCCL2", None)
            if nccl2 is None:
                return {"case": case, "absent": True}
            nccl2(store, 1, 2, opts, device)
        out["error"] = None
    except Exception as err:
        out["error"] = f"{type(err).__name__}: {err}"[:400]
    out["seconds"] = round(time.monotonic() - start, 2)
    stop.set()
    out["python_ticks_per_s"] = round(ticks[0] / max(out["seconds"], 1e-3), 1)
    return out


def creation() -> int:
    cases: list[dict[str, Any]] = []
    for case in ("legacy_plain", "nccl2_plain", "nccl2_watch"):
        try:
            proc = subprocess.run(
                [sys.executable, __file__, "--creation-one", case],
                capture_output=True,
                text=True,
                timeout=90,
                check=False,
            )
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CASE ")]
            got = (
                json.loads(lines[0].removeprefix("CASE "))
                if lines
                else {"case": case, "crashed": proc.returncode, "stderr": proc.stderr[-800:]}
            )
        except subprocess.TimeoutExpired:
            got = {"case": case, "hung": True}
        cases.append(got)
    facts = {"torch": torch.__version__, "cases": cases}
    print("CREATION " + json.dumps(facts), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--creation"]:
        sys.exit(creation())
    if sys.argv[1:2] == ["--creation-one"]:
        print("CASE " + json.dumps(_one(sys.argv[2])), flush=True)
        sys.exit(0)
    sys.exit(main())
