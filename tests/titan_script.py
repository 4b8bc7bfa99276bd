"""A trainer as its authors wrote it: torchtitan's meshes and training loop, torch's
imports only (no line of fmesh).

tests/test_route_clients.py runs it unchanged under ``torchrun ... -m fmesh.route``
and as plain torch, and compares what every rank wrote: ``OUT/rank<r>.json`` with the
meshes ``ParallelDims.build_mesh``'s calls built (titan_recipe.py), the losses and
parameters of FSDP2 + tensor parallel, HSDP and FSDP2 with an int
``reshard_after_forward``, and how many times torch's ``new_group`` ran.

Usage: ``torchrun --nproc-per-node 4 [-m fmesh.route] tests/titan_script.py OUT``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist
from titan_recipe import (
    CONFIG,
    OTHER,
    build,
    count_new_group,
    full_params,
    mlp,
    sgd_losses,
    tp_plan,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import parallelize_module

FSDP4 = (1, 1, 4, 1, 1)
"""(pp, dp_replicate, dp_shard, cp, tp): FSDP over the 4 ranks."""


def describe(mesh: DeviceMesh) -> dict[str, Any]:
    """What a trainer sees of a mesh: ranks, names, coordinate, each dim's group."""
    return {
        "mesh": mesh.mesh.tolist(),
        "names": mesh.mesh_dim_names,
        "coordinate": mesh.get_coordinate(),
        "groups": [dist.get_process_group_ranks(mesh.get_group(d)) for d in range(mesh.ndim)],
        "local": [mesh.get_local_rank(d) for d in range(mesh.ndim)],
    }


def train(out: Path) -> None:
    dist.init_process_group("gloo")
    new_groups = count_new_group()
    meshes = build(init_device_mesh, CONFIG)  # dp_shard=2 x tp=2
    tp, dp_shard = meshes["tp"], meshes["dp_shard"]
    facts: dict[str, Any] = {"meshes": {k: describe(m) for k, m in meshes.items()}}

    # FSDP2 over tensor parallel (torchtitan's 2-d).
    model = mlp()
    parallelize_module(model, tp, tp_plan())
    fully_shard(model, mesh=dp_shard, reshard_after_forward=True)
    facts["fsdp_tp"] = {
        "losses": sgd_losses(model, seed=dp_shard.get_local_rank(), steps=3),
        "params": full_params(model),
    }

    # HSDP on (dp_replicate=2, dp_shard=2), a second root.
    hsdp_mesh = build(init_device_mesh, OTHER)["dense"]["dp_replicate", "dp_shard"]
    hsdp = mlp()
    fully_shard(hsdp, mesh=hsdp_mesh)
    facts["hsdp"] = {
        "mesh": describe(hsdp_mesh),
        "losses": sgd_losses(hsdp, seed=dist.get_rank(), steps=3),
        "params": full_params(hsdp),
    }

    # FSDP2 with reshard_after_forward=2: FSDP builds its own post-forward mesh.
    fsdp4_mesh = build(init_device_mesh, FSDP4)["dp_shard"]
    fsdp4 = mlp()
    for layer in (fsdp4.w1, fsdp4.w2):
        fully_shard(layer, mesh=fsdp4_mesh, reshard_after_forward=2)
    fully_shard(fsdp4, mesh=fsdp4_mesh)
    facts["fsdp_int"] = {
        "losses": sgd_losses(fsdp4, seed=dist.get_rank(), steps=3),
        "params": full_params(fsdp4),
    }
    facts["new_group"] = new_groups[0]
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(facts))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    train(Path(sys.argv[1]))
