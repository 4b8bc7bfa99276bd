"""PartitionSpec <-> DTensor: placements, ``distribute`` and ``spec_of``.

The torch-facing half of ``fmesh._core.partition_spec``. Torch is imported inside the
functions, so ``import fmesh`` stays torch-free. A realized mesh's DeviceMesh has exactly the
mesh's axes in the mesh's order and reports fmesh coordinates, so the placements
depend only on axis names and sizes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .._compat import explicit_shard_order, strided_shard, strided_shard_parts
from .._core.errors import MeshError
from .._core.mesh import Mesh, require_mesh
from .._core.partition_spec import (
    PartitionSpec,
    ShardPlan,
    plan_from_spec,
    spec_dims,
    spec_from_plan,
)
from .._runtime.realized_mesh import RealizedMesh

if TYPE_CHECKING:
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Placement

__all__ = ["distribute", "placements", "spec_of"]


def _abstract(mesh: object, fn: str) -> Mesh:
    if isinstance(mesh, RealizedMesh):
        return mesh.mesh
    return require_mesh(mesh, fn, needs=f"{fn}() needs an fmesh.Mesh or fmesh.RealizedMesh")


def _to_placements(plan: ShardPlan) -> tuple[Placement, ...]:
    from torch.distributed.tensor import Replicate, Shard

    out: list[Placement] = []
    for step in plan:
        if step is None:
            out.append(Replicate())
        elif step[1] == 1:
            out.append(Shard(step[0]))
        else:
            out.append(strided_shard(*step))
    return tuple(out)


def placements(
    mesh: Mesh | RealizedMesh, spec: PartitionSpec, ndim: int
) -> tuple[Placement, ...]:
    """DTensor placements, one per mesh axis in axis order, that shard like ``spec``.

    A dim split over axes in ascending mesh order gets plain ``Shard`` placements;
    other orders get DTensor's strided shards (the encoding FSDP2 + TP uses).

    Args:
        mesh: the mesh (or realized mesh) whose DeviceMesh the placements are for.
        spec: one entry per tensor dim (fewer is fine: the rest are not split).
        ndim: the tensor's number of dimensions.

    Returns:
        A tuple of ``torch.distributed.tensor`` placements, ``len == mesh.ndim``.

    Raises:
        TypeError: wrong argument types.
        MeshError: more entries than ``ndim``.
        AxisNotFoundError: the spec names an axis the mesh lacks.

    >>> from fmesh import P, make_mesh, placements
    >>> mesh = make_mesh({"dp": 2, "tp": 4})
    >>> placements(mesh, P(None, "tp"), 2)
    (Replicate(), Shard(dim=1))
    >>> placements(mesh, P(("dp", "tp")), 1)
    (Shard(dim=0), Shard(dim=0))
    >>> placements(mesh, P(("tp", "dp")), 1)
    (_StridedShard(dim=0, sf=4), Shard(dim=0))
    """
    return _to_placements(plan_from_spec(_abstract(mesh, "placements"), spec, ndim))


def distribute(
    tensor: torch.Tensor,
    realized: RealizedMesh,
    spec: PartitionSpec,
    *,
    src_data_rank: int | None = 0,
) -> DTensor:
    """Shard ``tensor`` over ``realized`` as ``spec`` says (JAX's ``device_put``).

    Every rank passes the full tensor, as with torch's ``distribute_tensor``; the
    result is a DTensor on ``realized.to_device_mesh()`` in torch's own representation,
    so DTensor ops, ``redistribute``, ``full_tensor`` and DCP work on it.

    Args:
        tensor: the full (global) tensor, the same on every rank.
        realized: a realized mesh this rank is a member of.
        spec: JAX semantics: a dim named with axes ``(a1, ..., ak)`` is cut into
            ``size(a1)*...*size(ak)`` equal blocks and a rank holds the block at the
            row-major index of its coordinates along ``(a1, ..., ak)``.
        src_data_rank: passed to ``distribute_tensor``: the group rank whose data is
            scattered (default 0), or ``None`` to slice each rank's own copy.

    Returns:
        A ``DTensor`` whose local shard on each rank is its block.

    Raises:
        TypeError: wrong argument types.
        MeshError: a bad spec (see [`placements`][fmesh.placements]), or a split dim
            whose size is not divisible by its number of blocks.
    """
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(realized, RealizedMesh):
        raise TypeError(
            f"distribute() needs an fmesh.RealizedMesh (from fmesh.realize), got "
            f"{type(realized).__name__}"
        )
    if isinstance(tensor, DTensor):
        raise TypeError(
            "distribute() takes the full tensor, got a DTensor; to change its sharding "
            "use dtensor.redistribute(placements=fmesh.placements(mesh, spec, ndim))"
        )
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"distribute() needs a torch.Tensor, got {type(tensor).__name__}")
    mesh = realized.mesh
    dims = spec_dims(mesh, spec, tensor.ndim)
    for dim, axes in enumerate(dims):
        blocks = math.prod(mesh.axis_sizes[a] for a in axes)
        if tensor.shape[dim] % blocks:
            names = tuple(mesh.axis_names[a] for a in axes)
            raise MeshError(
                f"tensor dim {dim} has size {tensor.shape[dim]}, which {spec!r} splits "
                f"over axes {names} into {blocks} blocks; it is not divisible by "
                f"{blocks}: pad the dim to a multiple of {blocks} or split it over fewer "
                "axes"
            )
    return distribute_tensor(
        tensor,
        realized.to_device_mesh(),
        placements(mesh, spec, tensor.ndim),
        src_data_rank=src_data_rank,
    )


def spec_of(dtensor: DTensor, mesh: Mesh | RealizedMesh) -> PartitionSpec:
    """The spec of ``dtensor`` on ``mesh``: the inverse of [`distribute`][fmesh.distribute].

    Trailing unsplit dims are left out: ``spec_of`` of ``P('dp', None)`` gives
    ``P('dp')``.

    Args:
        dtensor: a DTensor on the DeviceMesh of ``mesh`` (same axis names and sizes).
        mesh: the fmesh mesh (or realized mesh) the DTensor lives on.

    Returns:
        The shortest [`PartitionSpec`][fmesh.PartitionSpec] that shards like ``dtensor``.

    Raises:
        TypeError: ``dtensor`` is not a DTensor.
        MeshError: the DeviceMesh does not match ``mesh``, or the sharding has no
            PartitionSpec (a pending reduction ``Partial``, or an interleaved sharding
            such as the one a ``view`` can leave).
    """
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(dtensor, DTensor):
        raise TypeError(f"spec_of() needs a DTensor, got {type(dtensor).__name__}")
    abstract = _abstract(mesh, "spec_of")
    device_mesh = dtensor.device_mesh
    names = device_mesh.mesh_dim_names
    if tuple(device_mesh.shape) != abstract.axis_sizes or (
        names is not None and tuple(names) != abstract.axis_names
    ):
        raise MeshError(
            f"the DTensor lives on a DeviceMesh with shape {tuple(device_mesh.shape)} and "
            f"dim names {names}, which does not match {abstract!r}; pass the mesh the "
            "DTensor was distributed on"
        )
    ndim = dtensor.ndim
    plan: list[tuple[int, int] | None] = []
    for axis, placement in zip(abstract.axis_names, dtensor.placements):
        strided = strided_shard_parts(placement)
        if strided is not None:
            dim, factor = strided
            plan.append((dim % ndim, factor))
        elif isinstance(placement, Shard):
            plan.append((placement.dim % ndim, 1))
        elif isinstance(placement, Replicate):
            plan.append(None)
        else:
            raise MeshError(
                f"the DTensor is {placement} along axis {axis!r}; a PartitionSpec only "
                "expresses Shard and Replicate: redistribute to Replicate() along that "
                "axis first"
            )
    order = explicit_shard_order(dtensor)
    if order is not None:
        return _spec_from_order(abstract, plan, order)
    return spec_from_plan(abstract, tuple(plan))


def _spec_from_order(
    mesh: Mesh,
    plan: list[tuple[int, int] | None],
    order: tuple[tuple[int, tuple[int, ...]], ...],
) -> PartitionSpec:
    """The spec of plain ``Shard`` placements applied in an explicit shard order."""
    if any(step is not None and step[1] != 1 for step in plan):
        raise MeshError(
            "the DTensor mixes strided shards with an explicit shard order; fmesh cannot "
            "tell which blocks each rank holds, so it gives no PartitionSpec"
        )
    by_dim = {dim: axes for dim, axes in order}
    if sorted(a for axes in by_dim.values() for a in axes) != sorted(
        a for a, step in enumerate(plan) if step is not None
    ) or any(plan[a] != (dim, 1) for dim, axes in by_dim.items() for a in axes):
        raise MeshError(
            f"the DTensor's shard order {order} does not match its placements; fmesh "
            "gives no PartitionSpec for it"
        )
    ndim = max(by_dim, default=-1) + 1
    entries: list[str | tuple[str, ...] | None] = []
    for dim in range(ndim):
        names = tuple(mesh.axis_names[a] for a in by_dim.get(dim, ()))
        entries.append(None if not names else names[0] if len(names) == 1 else names)
    return PartitionSpec(*entries)
