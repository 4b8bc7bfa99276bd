"""Functions ``tests/test_plan.py`` plans: trainer code as users write it, with torch's
``init_device_mesh`` imported at the top of the module (so ``fmesh plan`` must reach
into this module to route it)."""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
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


# -- what a launch checks beyond fmesh's realize calls (tests/test_plan_groups.py) ----------

FACTORY: dict[str, Any] = {"mesh": init_device_mesh}
"""A registry filled at import, before any plan routes torch: it keeps torch's own
``init_device_mesh``, as a factory in a library would."""

DIVERGENT = 1
"""The rank that alone does something else in the ``*_on_one_rank`` targets."""


def _one_rank() -> tuple[int, bool]:
    world, rank = _world_rank()
    return world, rank == DIVERGENT


def route(init: Any) -> None:
    """Point this module's ``init_device_mesh`` at ``init`` (a launch through fmesh's
    drop-in)."""
    global init_device_mesh
    init_device_mesh = init


def _override(backend: str | None) -> dict[str, Any]:
    world, _ = _world_rank()
    override: dict[int | str, Any] | None = None if backend is None else {"a": backend}
    mesh = init_device_mesh(
        "cpu", (2, world // 2), mesh_dim_names=("a", "b"), backend_override=override
    )
    return {"mesh": mesh}


def gloo_override_on_one_rank() -> dict[str, Any]:
    """Rank 1 alone gives dim ``a`` the gloo backend."""
    _, odd = _one_rank()
    return _override("gloo" if odd else None)


def cpu_gloo_override_on_one_rank() -> dict[str, Any]:
    """Rank 1 alone gives dim ``a`` the backend ``cpu:gloo``."""
    _, odd = _one_rank()
    return _override("cpu:gloo" if odd else None)


def nccl_override_on_every_rank() -> dict[str, Any]:
    """Every rank gives dim ``a`` NCCL (which this machine need not have)."""
    return _override("nccl")


def real_backends_everywhere() -> dict[str, Any]:
    """A GPU trainer's calls: its own default group on cpu:gloo,cuda:nccl, a cuda mesh
    with a gloo override, fmesh realize on nccl, torch's new_group on gloo."""
    world, _ = _world_rank()
    dist.init_process_group("cpu:gloo,cuda:nccl")
    mesh = init_device_mesh(
        "cuda", (2, world // 2), mesh_dim_names=("a", "b"), backend_override={"b": "gloo"}
    )
    fmesh.realize(fmesh.make_mesh({"x": world // 2, "y": 2}), backend="nccl")
    dist.new_group(list(range(world // 2)), backend="gloo")
    return {"mesh": mesh}


def factory_mesh_on_one_rank() -> None:
    """``init_device_mesh`` reached through the registry: rank 1 builds another shape."""
    world, odd = _one_rank()
    shape = (world // 4, 4) if odd else (world // 8, 8)
    FACTORY["mesh"]("cpu", shape, mesh_dim_names=("dp", "tp"))


def factory_mesh() -> dict[str, Any]:
    """The registry's ``init_device_mesh``, alike on every rank."""
    world, _ = _world_rank()
    return {"mesh": FACTORY["mesh"]("cpu", (world // 8, 8), mesh_dim_names=("dp", "tp"))}


def tensor_mesh_on_one_rank() -> None:
    """A DeviceMesh built from a tensor: rank 1's tensor has another shape."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    world, odd = _one_rank()
    shape = (world // 4, 4) if odd else (world // 8, 8)
    DeviceMesh("cpu", torch.arange(world).reshape(shape), mesh_dim_names=("dp", "tp"))


def new_group_on_one_rank() -> None:
    """torch's new_group: rank 1 asks for one more rank."""
    _, odd = _one_rank()
    dist.new_group(list(range(3 if odd else 2)))


def torch_groups() -> None:
    """torch's own group calls, alike on every rank, in a GPU trainer whose default
    group has a device bound (which torch's split_group needs): new_group,
    new_subgroups, split_group, and a local new_group per pair of ranks."""
    world, rank = _world_rank()
    local = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("cpu:gloo,cuda:nccl", device_id=torch.device("cuda", local))
    dist.new_group(list(range(world // 2)), backend="gloo")
    dist.new_subgroups(2)  # type: ignore[no-untyped-call]  # torch leaves it untyped
    dist.split_group(split_ranks=[list(range(world // 2)), list(range(world // 2, world))])
    pair = [rank - rank % 2, rank - rank % 2 + 1]
    dist.new_group(pair, use_local_synchronization=True)


def local_group_after_another() -> None:
    """Rank 0 makes a group of its own first, so it holds one more group than rank 1
    when the two make their local pair: torch names the pair's group differently on
    the two ranks (by the count), and their rendezvous would not meet."""
    _, rank = _world_rank()
    if rank == 0:
        dist.new_group([0], use_local_synchronization=True)
    if rank in (0, 1):
        dist.new_group([0, 1], use_local_synchronization=True)


def hit_where_others_create() -> None:
    """Rank 1 realizes its first mesh again (a memo hit) where the others realize a
    new one."""
    world, odd = _one_rank()
    mesh = fmesh.make_mesh({"dp": 2, "tp": world // 2})
    fmesh.realize(mesh)
    fmesh.realize(mesh if odd else fmesh.make_mesh({"x": world // 2, "y": 2}))


def views_returning_none() -> None:
    """A mesh and a slice of it realized, nothing returned."""
    world, _ = _world_rank()
    mesh = fmesh.make_mesh({"dp": 2, "tp": world // 2})
    fmesh.realize(mesh)
    fmesh.realize(fmesh.slice(mesh, "tp"))


ENVIRONMENT: list[dict[str, str]] = []
"""What :func:`environment` saw."""


def environment() -> None:
    ENVIRONMENT.append(dict(os.environ))


def lone_rank_diverges() -> None:
    """Rank 5 alone builds another mesh: on 8 ranks, ``sample:5`` (the ends, then
    ranks along the mesh's diagonal: 0, 7, 6, 1, 3) never plans it."""
    world, rank = _world_rank()
    shape = {"dp": 2, "tp": world // 2} if rank != 5 else {"dp": world // 2, "tp": 2}
    fmesh.realize(fmesh.make_mesh(shape))


# -- issue 42: where plain torch and a routed launch part ways (tests/test_plan_launch.py) --
# Each runs on 4 gloo ranks, plain and under -m fmesh.route, and is planned for both.


def _meshes(**meshes: Any) -> dict[str, Any]:
    return meshes


def world_mesh_first_on_one_rank() -> dict[str, Any]:
    """Rank 1 builds the 1-d world mesh first (the default group: torch makes no
    group, fmesh's call is a memo hit), then every rank the same 2-d mesh."""
    world, odd = _one_rank()
    first = _meshes(world=init_device_mesh("cpu", (world,))) if odd else {}
    return {
        **first,
        "mesh": init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp")),
    }


def factory_world_mesh_first_on_one_rank() -> dict[str, Any]:
    """As ``world_mesh_first_on_one_rank``, through the registry captured at import."""
    world, odd = _one_rank()
    build = FACTORY["mesh"]
    first = _meshes(world=build("cpu", (world,))) if odd else {}
    return {**first, "mesh": build("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))}


def dim_names_reordered_on_one_rank() -> dict[str, Any]:
    """Rank 1 names the dims of the same 2-d mesh in the other order (every rank uses
    the dims by index): the same groups."""
    world, odd = _one_rank()
    names = ("tp", "dp") if odd else ("dp", "tp")
    return {"mesh": init_device_mesh("cpu", (2, world // 2), mesh_dim_names=names)}


def unnamed_on_one_rank() -> dict[str, Any]:
    """Rank 1 builds the same 2-d mesh without dim names (used by index everywhere)."""
    world, odd = _one_rank()
    names = None if odd else ("dp", "tp")
    return {"mesh": init_device_mesh("cpu", (2, world // 2), mesh_dim_names=names)}


def unflatten_other_names_on_one_rank() -> dict[str, Any]:
    """Every rank unflattens the 1-d world mesh alike, rank 1 under other names."""
    world, odd = _one_rank()
    root = init_device_mesh("cpu", (world,), mesh_dim_names=("world",))
    names = ("x", "y") if odd else ("dp", "tp")
    return {"world": root, "mesh": root._unflatten(0, (2, world // 2), names)}


def same_mesh_twice_on_one_rank() -> dict[str, Any]:
    """Rank 1 builds the same 2-d mesh twice: torch's second ``init_device_mesh`` makes
    its groups again, on rank 1 alone; fmesh's is a memo hit."""
    world, odd = _one_rank()
    meshes = {"mesh": init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))}
    if odd:
        meshes["again"] = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    return meshes


def split_group_on_every_rank() -> None:
    """torch's split_group, alike on every rank of a job whose default group has no
    device bound (every CPU launch: torch binds only accelerators)."""
    world, _ = _world_rank()
    dist.split_group(split_ranks=[list(range(world // 2)), list(range(world // 2, world))])


def fmesh_timeout_on_every_rank() -> dict[str, Any]:
    """fmesh's ``timeout=`` given to torch's ``init_device_mesh`` (only the routed launch
    knows it)."""
    world, _ = _world_rank()
    timeout = datetime.timedelta(minutes=5)
    mesh = init_device_mesh(  # type: ignore[call-arg]  # fmesh's keyword, not torch's
        "cpu", (2, world // 2), mesh_dim_names=("dp", "tp"), timeout=timeout
    )
    return {"mesh": mesh}


def flatten_reversed_on_one_rank() -> dict[str, Any]:
    """Rank 2 flattens ``tp`` and ``dp`` in the other order: torch sorts each group's
    ranks, so it makes the same groups (and runs), but rank 2 takes place 2 along the
    flattened dim, where the others put rank 4 (and rank 2 at 1); fmesh's groups are in
    coordinate order, so they differ, and the routed launch refuses it (8 ranks)."""
    from torch.distributed.device_mesh import DeviceMesh

    world, rank = _world_rank()
    root = init_device_mesh("cpu", (2, 2, world // 4), mesh_dim_names=("dp", "tp", "cp"))
    if rank == 2:
        flat = DeviceMesh._concatenate([root["tp"], root["dp"]])._flatten("dp_tp")
    else:
        flat = root["dp", "tp"]._flatten("dp_tp")
    return {"root": root, "flat": flat}
