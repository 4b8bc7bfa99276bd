"""The NCCL paths on real GPUs, one rank per GPU (run by tests/test_gpu.py under
torchrun). Prints one JSON line of facts per rank; the test asserts them."""

from __future__ import annotations

import json
import sys
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
    facts: dict[str, Any] = {
        "rank": realized.rank,
        "world_backend": str(dist.get_backend()),
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


if __name__ == "__main__":
    sys.exit(main())
