"""Functions ``tests/test_plan.py`` plans: trainer code as users write it, with torch's
``init_device_mesh`` imported at the top of the module (so ``fmesh plan`` must reach
into this module to route it)."""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import fmesh

SEEN: list[Any] = []
"""What ``init_device_mesh`` was when :func:`torch_trainer` ran."""


def _world_rank() -> tuple[int, int]:
    return int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])


def torch_trainer() -> dict[str, Any]:
    """torch's own API, as a trainer starts: its default group (NCCL, which this
    machine may not have), then a 2-d mesh, a slice, a flatten."""
    SEEN.append(init_device_mesh)
    dist.init_process_group("nccl")
    world, _ = _world_rank()
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    return {"mesh": mesh, "tp": mesh["tp"], "flat": mesh["dp", "tp"]._flatten("flat")}


def fmesh_trainer() -> dict[str, Any]:
    """fmesh's own API: a realized mesh and a realized flatten, returned by name."""
    world, _ = _world_rank()
    mesh = fmesh.make_mesh({"dp": 2, "cp": 2, "tp": world // 4})
    flat = fmesh.flatten(mesh, ("dp", "cp"), "dp_cp")
    return {"mesh": fmesh.realize(mesh), "dp_cp": fmesh.realize(fmesh.slice(flat, "dp_cp"))}


def extra_hit_on_last_rank() -> None:
    """The last rank realizes a mesh it already has once more: only the memo-hit
    history differs at the next creating call."""
    world, rank = _world_rank()
    mesh = fmesh.make_mesh({"dp": 2, "tp": world // 2})
    fmesh.realize(mesh)
    if rank == world - 1:
        fmesh.realize(mesh)
    fmesh.realize(fmesh.make_mesh({"a": world // 2, "b": 2}))


def last_rank_skips_a_call() -> None:
    """The last rank skips the second creating call: the others would wait for it."""
    world, rank = _world_rank()
    fmesh.realize(fmesh.make_mesh({"dp": 2, "tp": world // 2}))
    if rank != world - 1:
        fmesh.realize(fmesh.make_mesh({"a": world // 2, "b": 2}))


def raises() -> None:
    raise RuntimeError("the trainer's own bug")
