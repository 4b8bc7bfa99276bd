"""Private torch names needed by ``examples/parallel_dims.py`` and its tests.

To be folded into ``fmesh/_c10d.py``. Checked on torch 2.11, 2.13 and 2.15, where
these names and signatures are the same:

* ``torch.testing._internal.distributed.fake_pg.FakeStore``: importing that module
  registers the ``fake`` backend; ``FakeStore`` is the store it expects.
* ``DeviceMesh._unflatten(dim, mesh_sizes, mesh_dim_names)`` and
  ``DeviceMesh._flatten(mesh_dim_name)``: torch's own recipe, as torchtitan's
  ``ParallelDims.build_mesh`` uses it, which the tests compare fmesh with.
* ``DeviceMesh(..., _init_backend=False)``: a mesh that creates no process groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "device_mesh_flatten",
    "device_mesh_unflatten",
    "device_mesh_without_groups",
    "init_fake_world",
]


def init_fake_world(rank: int, world: int) -> None:
    """Initialize the default process group on torch's ``fake`` backend.

    One process plays ``rank`` of a ``world``-rank world: group creation works,
    nothing is communicated, and collectives return without data.
    """
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)


def device_mesh_unflatten(
    device_mesh: DeviceMesh, dim: int | str, sizes: Sequence[int], names: Sequence[str]
) -> DeviceMesh:
    """``device_mesh._unflatten(dim, sizes, names)``: split one dimension, row-major."""
    return device_mesh._unflatten(dim, tuple(sizes), tuple(names))


def device_mesh_flatten(device_mesh: DeviceMesh, name: str) -> DeviceMesh:
    """``device_mesh._flatten(name)``: one dimension over all of the mesh's dimensions."""
    return device_mesh._flatten(name)


def device_mesh_without_groups(world: int, name: str) -> DeviceMesh:
    """A 1-d ``DeviceMesh`` over ranks ``0..world-1`` that creates no process groups.

    Its ``_unflatten`` results create none either: torch's layout algebra alone, for
    worlds where torch's recipe would call ``new_group`` hundreds of thousands of
    times. (Slicing such a mesh fails in torch; read ``.mesh`` instead.)
    """
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", torch.arange(world), mesh_dim_names=(name,), _init_backend=False)
