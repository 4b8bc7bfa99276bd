"""fmesh: functional, immutable device meshes for PyTorch distributed.

The pure core (layouts, meshes, transformations, rank queries) needs no torch; only
:func:`realize` and the DeviceMesh interop import torch, on first use.
"""

import typing as _typing

from ._distribute import distribute as distribute
from ._distribute import placements as placements
from ._distribute import spec_of as spec_of
from ._elastic import replace as replace
from ._elastic import shrink as shrink
from ._errors import AxisNotFoundError as AxisNotFoundError
from ._errors import LaunchError as LaunchError
from ._errors import MeshError as MeshError
from ._errors import MeshMismatchError as MeshMismatchError
from ._errors import UnrepresentableSplitError as UnrepresentableSplitError
from ._hosts import AxisHosts as AxisHosts
from ._hosts import HostReport as HostReport
from ._hosts import host_report as host_report
from ._hosts import make_hybrid_mesh as make_hybrid_mesh
from ._interop import from_device_mesh as from_device_mesh
from ._launch import init_fake_world as init_fake_world
from ._layout import Layout as Layout
from ._memo import CacheStats as CacheStats
from ._memo import cache_stats as cache_stats
from ._memo import destroy as destroy
from ._mesh import Mesh as Mesh
from ._mesh import RanksLike as RanksLike
from ._mesh import make_mesh as make_mesh
from ._ops import flatten as flatten
from ._ops import rename as rename
from ._ops import slice as slice  # noqa: A004 - the contract's name; shadows builtin
from ._ops import unflatten as unflatten
from ._queries import coordinate as coordinate
from ._queries import group as group
from ._queries import instance as instance
from ._queries import instances as instances
from ._queries import rank_at as rank_at
from ._realize import realize as realize
from ._realized import RealizedMesh as RealizedMesh
from ._recover import recover as recover
from ._spec import P as P
from ._spec import PartitionSpec as PartitionSpec
from ._views import same_groups as same_groups
from ._views import same_ranks as same_ranks

if _typing.TYPE_CHECKING:
    # torch's options class, for annotating realize(options=...); at run time it is
    # looked up on first access (below), so `import fmesh` does not import torch.
    from ._c10d import BackendOptions as BackendOptions

__version__ = "0.3.0"


def __getattr__(name: str) -> object:
    if name == "BackendOptions":
        from ._c10d import backend_options_type

        return backend_options_type()
    raise AttributeError(f"module 'fmesh' has no attribute {name!r}")


__all__ = [
    "AxisHosts",
    "AxisNotFoundError",
    "BackendOptions",
    "CacheStats",
    "HostReport",
    "LaunchError",
    "Layout",
    "Mesh",
    "MeshError",
    "MeshMismatchError",
    "P",
    "PartitionSpec",
    "RanksLike",
    "RealizedMesh",
    "UnrepresentableSplitError",
    "cache_stats",
    "coordinate",
    "destroy",
    "distribute",
    "flatten",
    "from_device_mesh",
    "group",
    "host_report",
    "init_fake_world",
    "instance",
    "instances",
    "make_hybrid_mesh",
    "make_mesh",
    "placements",
    "rank_at",
    "realize",
    "recover",
    "rename",
    "replace",
    "same_groups",
    "same_ranks",
    "shrink",
    "slice",
    "spec_of",
    "unflatten",
]
