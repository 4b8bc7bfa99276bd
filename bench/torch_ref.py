"""torch's side of every comparison: the one bench module that uses private torch names.

The baselines are what torch users write today (``init_device_mesh``, and the
private ``_flatten`` / ``_unflatten`` that torchtitan calls), plus counters read from
c10d's process-global registry. Keeping them here means a torch release that moves
one of these names breaks one file.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .shared import EXPERT_NAMES, FLATTENS, NAMES, TRAINER_FLATTENS, expert_shape

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore
    from torch.distributed.device_mesh import DeviceMesh

PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.device_mesh",
    "torch.fx.experimental.proxy_tensor",
    "torch.testing._internal.distributed.fake_pg",
)
"""Modules a measurement process should find already imported."""


def init_fake(world: int) -> None:
    """The default process group on torch's ``fake`` backend, as rank 0 of ``world``."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


def preload_lazy_imports() -> None:
    """Import what torch's mesh code and fmesh's realize import on first use.

    A worker measures one cold call; these imports are one-time program costs, not
    part of building a mesh.
    """
    import torch.distributed.device_mesh
    import torch.fx.experimental.proxy_tensor  # noqa: F401

    import fmesh

    fmesh.cache_stats()  # imports fmesh's torch-facing module


def mesh_without_groups(
    world: int, shape: tuple[int, ...], names: tuple[str, ...]
) -> DeviceMesh:
    """torch's DeviceMesh over ranks 0..world-1 with no process groups.

    This is what ``init_device_mesh`` builds before it creates groups (private
    constructor arguments, as ``init_device_mesh`` itself uses them; torch before
    2.13 has no ``from_sizes_strides`` and gets the rank tensor instead).
    """
    import torch
    from torch.distributed._mesh_layout import _MeshLayout
    from torch.distributed.device_mesh import DeviceMesh

    if not hasattr(_MeshLayout, "from_sizes_strides"):
        ranks = torch.arange(world, dtype=torch.int).view(shape)
        return DeviceMesh("cpu", ranks, mesh_dim_names=names, _init_backend=False)
    return DeviceMesh(
        "cpu",
        _layout=_MeshLayout.from_sizes_strides(shape),
        _rank_map=torch.arange(world, dtype=torch.int),
        mesh_dim_names=names,
        _init_backend=False,
    )


def init_mesh(shape: Sequence[int], names: Sequence[str]) -> DeviceMesh:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", tuple(shape), mesh_dim_names=tuple(names))


def flatten(dm: DeviceMesh, axes: tuple[str, ...], name: str) -> DeviceMesh:
    return dm[axes]._flatten(name)


def unflatten(dm: DeviceMesh, sizes: Sequence[int], names: Sequence[str]) -> DeviceMesh:
    return dm._unflatten(0, tuple(sizes), tuple(names))


def clear_flattens(dm: DeviceMesh) -> None:
    """Forget the root mesh's flattens (torch's slicing scans them)."""
    dm._flatten_mapping.clear()


def coordinate_uncached(dm: DeviceMesh) -> object:
    """The O(world) coordinate search every DeviceMesh construction and slice runs."""
    return dm._compute_coordinate_on_dim()


def trainer5(shape: Sequence[int]) -> object:
    """``init_device_mesh`` of the 5-d mesh plus its three flattens."""
    dm = init_mesh(shape, NAMES)
    return dm, [flatten(dm, axes, name) for axes, name in FLATTENS]


def titan(shape: Sequence[int]) -> object:
    """torchtitan's ParallelDims recipe: a 1-d world mesh unflattened into the dense
    and expert views, and the three flattens of the dense view."""
    world_mesh = init_mesh((math.prod(shape),), ("world",))
    dense = unflatten(world_mesh, shape, NAMES)
    expert = unflatten(world_mesh, expert_shape(shape), EXPERT_NAMES)
    flats = [flatten(dense, axes, name) for axes, name in TRAINER_FLATTENS]
    return world_mesh, dense, expert, flats


def world_1d(shape: Sequence[int]) -> object:
    """A 1-d mesh over the whole world (torch reuses the default group for it)."""
    return init_mesh((math.prod(shape),), ("world",))


def sub_mesh_exprs(dm: DeviceMesh, names: Sequence[str]) -> list[Callable[[], object]]:
    """torch's expressions for the sub-meshes of a 3-d mesh that a trainer asks for
    again and again: each axis, both adjacent pairs, and the flattens of the pairs and
    of all three (after its first call, ``_flatten`` returns the mesh it cached)."""
    a, b, c = names
    return [
        lambda: dm[a],
        lambda: dm[b],
        lambda: dm[c],
        lambda: dm[a, b],
        lambda: dm[b, c],
        lambda: dm[a, b]._flatten(f"{a}_{b}"),
        lambda: dm[b, c]._flatten(f"{b}_{c}"),
        lambda: dm._flatten(f"{a}_{b}_{c}"),
    ]


def store_based_barrier(
    rank: int, store: object, name: str, count: int, timeout: datetime.timedelta
) -> None:
    """torch's own store barrier, what ``init_process_group`` and ``new_group`` run
    when ``TORCH_DIST_INIT_BARRIER=1`` (off by default): add, add, wait per rank, and
    a set by each rank whose second add reads the full count."""
    from torch.distributed import distributed_c10d as c10d

    group_name: Any = name  # a GroupName (a NewType of str) where torch has one
    typed: Any = store  # a torch Store; 2.15 annotates the parameter, earlier ones not
    c10d._store_based_barrier(rank, typed, group_name, count, timeout)


def group_counters() -> tuple[int, int]:
    """(groups registered in this process, ``new_group`` calls so far).

    torch counts every ``new_group`` call, members or not, in ``group_count``.
    """
    from torch.distributed import distributed_c10d as c10d

    return len(c10d._world.pg_names), c10d._world.group_count


def host_store(world: int, timeout: datetime.timedelta) -> TCPStore:
    """A TCPStore server on a port the OS picks, listening before any rank starts."""
    from torch._C._distributed_c10d import TCPStore

    return TCPStore(
        "127.0.0.1", 0, world, is_master=True, wait_for_workers=False, timeout=timeout
    )


def connect_store(port: int, world: int, timeout: datetime.timedelta) -> TCPStore:
    from torch._C._distributed_c10d import TCPStore

    return TCPStore("127.0.0.1", port, world, is_master=False, timeout=timeout)


def plain_client(port: int, timeout: datetime.timedelta) -> TCPStore:
    """A client that sends nothing when it connects (no worker count)."""
    from torch._C._distributed_c10d import TCPStore

    return TCPStore(
        "127.0.0.1", port, None, is_master=False, timeout=timeout, wait_for_workers=False
    )
