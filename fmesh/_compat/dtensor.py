"""Private torch names for DTensor: ``_StridedShard`` and the spec's shard order."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Placement

__all__ = ["explicit_shard_order", "strided_shard", "strided_shard_parts"]

# -- DTensor ----------------------------------------------------------------------------
# ``_StridedShard`` and ``DTensorSpec.shard_order`` are the same on torch 2.11-2.15.


def strided_shard(dim: int, split_factor: int) -> Placement:
    """DTensor's ``_StridedShard(dim, split_factor=split_factor)``."""
    from torch.distributed.tensor.placement_types import _StridedShard

    return _StridedShard(dim, split_factor=split_factor)


def strided_shard_parts(placement: Placement) -> tuple[int, int] | None:
    """``(dim, split_factor)`` of a ``_StridedShard``; ``None`` for any other placement."""
    from torch.distributed.tensor.placement_types import _StridedShard

    if not isinstance(placement, _StridedShard):
        return None
    return int(placement.dim), int(placement.split_factor)


def explicit_shard_order(dtensor: DTensor) -> tuple[tuple[int, tuple[int, ...]], ...] | None:
    """The DTensor's shard order when its spec carries one that its placements do not
    show: plain ``Shard`` placements applied in a non-ascending mesh-dim order.

    ``None`` when the order is the default (ascending mesh dims per tensor dim) or is
    encoded by ``_StridedShard`` placements. ``DTensorSpec.shard_order`` and
    ``use_strided_shard_as_shard_order`` exist on torch 2.11 through 2.15.
    """
    spec = dtensor._spec
    if spec.use_strided_shard_as_shard_order or spec.shard_order is None:
        return None
    order = tuple(
        (int(e.tensor_dim), tuple(int(m) for m in e.mesh_dims)) for e in spec.shard_order
    )
    if all(list(mesh_dims) == sorted(mesh_dims) for _, mesh_dims in order):
        return None
    return order
