"""The value realize hands back: ``RealizedMesh``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, final

import attrs

from .._core.axes import axis_position
from .._core.errors import MeshError
from .._core.mesh import Mesh
from .hooks import to_device_mesh

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["RealizedMesh"]


@final
@attrs.frozen(slots=True, eq=False)
class RealizedMesh:
    """A mesh with the process groups of the calling rank (from [`realize`][fmesh.realize])."""

    mesh: Mesh
    """The mesh value that was realized."""
    rank: int
    """Global rank of this process."""
    coordinate: tuple[int, ...] | None
    """This rank's coordinate, or ``None`` when the rank is not in the mesh."""
    groups: Mapping[str, ProcessGroup]
    """Axis name -> this rank's group along that axis (empty for non-members)."""
    created: int = 0
    """Groups this realize call created (the rest came from the memo)."""

    def group(self, axis_name: str) -> ProcessGroup:
        """This rank's process group along ``axis_name``."""
        axis_position(self.mesh, axis_name, "RealizedMesh.group")
        if self.coordinate is None:
            raise MeshError(
                f"rank {self.rank} is not in {self.mesh!r}, so it has no group along "
                f"{axis_name!r}; check `realized.coordinate is not None` first"
            )
        return self.groups[axis_name]

    def local_rank(self, axis_name: str) -> int:
        """This rank's position along ``axis_name`` (== its rank in that group)."""
        pos = axis_position(self.mesh, axis_name, "RealizedMesh.local_rank")
        if self.coordinate is None:
            raise MeshError(
                f"rank {self.rank} is not in {self.mesh!r}; it has no local rank "
                f"along {axis_name!r}"
            )
        return self.coordinate[pos]

    def to_device_mesh(self, device_type: str | None = None) -> DeviceMesh:
        """A torch ``DeviceMesh`` for this mesh, using fmesh's groups.

        Like a mesh torch builds itself, its root spans the whole world (every
        instance of the mesh), so torch's own operations on it (slicing, ``_flatten``,
        ``_unflatten``, ``_concatenate``) behave as on torch's mesh; flattened axes that
        fmesh has realized are registered where ``_flatten`` looks first, so they are
        not created again. DTensor, FSDP2 (``fully_shard``), tensor parallel
        (``parallelize_module``) and DCP accept it. Memoized per mesh and device type.

        Args:
            device_type: ``"cpu"``, ``"cuda"``, ...; default ``"cuda"`` when the world
                uses NCCL and CUDA is available, else ``"cpu"``.

        Raises:
            MeshError: for a device type torch cannot use in this process.
        """
        return to_device_mesh(self.mesh, self.coordinate, self.groups, device_type)

    def __repr__(self) -> str:
        return f"RealizedMesh({self.mesh!r}, rank={self.rank}, coordinate={self.coordinate})"
