"""A torch ``DeviceMesh`` as an fmesh value (``fmesh.from_device_mesh``).

``import fmesh`` imports this module, and this module imports the interop, which
registers its DeviceMesh converter with the runtime (``RealizedMesh.to_device_mesh``)
on import; neither imports torch until first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._compat.mesh import device_mesh_axes, device_mesh_rank_map
from .._core.errors import MeshError
from .._core.layout import Layout
from .._core.mesh import Mesh
from . import interop  # noqa: F401  (registers the DeviceMesh converter)

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["from_device_mesh"]


def from_device_mesh(device_mesh: DeviceMesh) -> Mesh:
    """The fmesh value of a torch ``DeviceMesh`` (its layout, ranks and names).

    Works for every DeviceMesh torch makes: roots, slices, flattens, unflattens and
    meshes built from groups. Unnamed dimensions are called ``dim0``, ``dim1``, ...

    Raises:
        TypeError: for anything but a DeviceMesh.
    """
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(device_mesh, DeviceMesh):
        raise TypeError(
            f"from_device_mesh() needs a torch DeviceMesh, got {type(device_mesh).__name__}"
        )
    names = device_mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(device_mesh.ndim))
    axes = tuple(Layout._from_modes(m) for m in device_mesh_axes(device_mesh))
    flat = device_mesh_rank_map(device_mesh)
    try:
        return Mesh(tuple(names), axes, len(flat), flat)
    except MeshError:
        # A rank map longer than the layout's span (torch allows it): keep what the
        # layout reaches, as its own rank space.
        return Mesh.from_ranks(device_mesh.mesh.cpu().numpy(), tuple(names))
