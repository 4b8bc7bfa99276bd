"""fmesh: functional, immutable device meshes for PyTorch distributed.

The pure core (layouts, meshes, transformations, rank queries) needs no torch; only
``realize`` and the DeviceMesh interop import torch, on first use.
"""

import typing as _typing

from ._core.elastic import replace as replace
from ._core.elastic import shrink as shrink
from ._core.errors import AxisNotFoundError as AxisNotFoundError
from ._core.errors import LaunchError as LaunchError
from ._core.errors import MeshError as MeshError
from ._core.errors import MeshMismatchError as MeshMismatchError
from ._core.errors import PeerLostError as PeerLostError
from ._core.errors import UnrepresentableSplitError as UnrepresentableSplitError
from ._core.hosts import AxisHosts as AxisHosts
from ._core.hosts import HostReport as HostReport
from ._core.hosts import host_report as host_report
from ._core.hosts import make_hybrid_mesh as make_hybrid_mesh
from ._core.layout import Layout as Layout
from ._core.mesh import Mesh as Mesh
from ._core.mesh import RanksLike as RanksLike
from ._core.mesh import make_mesh as make_mesh
from ._core.ops import flatten as flatten
from ._core.ops import rename as rename
from ._core.ops import slice as slice  # noqa: A004 - the contract's name; shadows builtin
from ._core.ops import unflatten as unflatten
from ._core.partition_spec import P as P
from ._core.partition_spec import PartitionSpec as PartitionSpec
from ._core.queries import coordinate as coordinate
from ._core.queries import group as group
from ._core.queries import instance as instance
from ._core.queries import instances as instances
from ._core.queries import rank_at as rank_at
from ._core.views import same_groups as same_groups
from ._core.views import same_ranks as same_ranks
from ._plan.report import GroupPlan as GroupPlan
from ._plan.report import MeshPlan as MeshPlan
from ._plan.report import PlanDivergence as PlanDivergence
from ._plan.report import PlannedCall as PlannedCall
from ._plan.report import PlanReport as PlanReport
from ._plan.report import RankPlan as RankPlan
from ._plan.run import plan as plan
from ._protocol.stream import stream as stream
from ._runtime.cache import CacheStats as CacheStats
from ._runtime.cache import cache_stats as cache_stats
from ._runtime.cache import destroy as destroy
from ._runtime.launch import init_fake_world as init_fake_world
from ._runtime.realize import realize as realize
from ._runtime.realized_mesh import RealizedMesh as RealizedMesh
from ._runtime.recover import recover as recover
from ._torch.convert import from_device_mesh as from_device_mesh
from ._torch.distribute import distribute as distribute
from ._torch.distribute import placements as placements
from ._torch.distribute import spec_of as spec_of

if _typing.TYPE_CHECKING:
    # torch's options class, for annotating realize(options=...); at run time it is
    # looked up on first access (below), so `import fmesh` does not import torch.
    from ._compat import BackendOptions as BackendOptions

__version__ = "0.5.0"


def __getattr__(name: str) -> object:
    if name == "BackendOptions":
        from ._compat import backend_options_type

        return backend_options_type()
    raise AttributeError(f"module 'fmesh' has no attribute {name!r}")


__all__ = [
    "AxisHosts",
    "AxisNotFoundError",
    "BackendOptions",
    "CacheStats",
    "GroupPlan",
    "HostReport",
    "LaunchError",
    "Layout",
    "Mesh",
    "MeshError",
    "MeshMismatchError",
    "MeshPlan",
    "P",
    "PartitionSpec",
    "PeerLostError",
    "PlanDivergence",
    "PlanReport",
    "PlannedCall",
    "RankPlan",
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
    "plan",
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
    "stream",
    "unflatten",
]
