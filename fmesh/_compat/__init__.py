"""The compat package: every private torch name fmesh uses, gated where torch changed.

fmesh supports torch 2.11 through 2.15. The rest of the package calls these small typed
functions and torch's public API only; ``tests/test_static.py`` fails if a private torch
name appears outside this package. ``c10d.py``: process groups and stores;
``interruptible.py``: a store whose waits another thread can cancel, and ``peek``, a
read that never waits (it imports no torch until a store is made); ``dtensor.py``:
DTensor placements; ``mesh.py``: DeviceMesh; ``hook.py``: the routing of torch's
DeviceMesh methods (and the environment switches); ``nccl.py``: which NCCL backend
makes a group, and whether its creation may wait in the watch's store; ``planning.py``:
every group torch makes on ``fmesh plan``'s fake world, observed and played by the fake
backend; ``swap.py``: torch's ``init_device_mesh`` function made to run fmesh's
drop-in (``route()``).
"""

from typing import TYPE_CHECKING

from .c10d import backend_options_type as backend_options_type
from .c10d import debug_detail as debug_detail
from .c10d import default_store as default_store
from .c10d import default_timeout as default_timeout
from .c10d import fake_store as fake_store
from .c10d import init_fake_world as init_fake_world
from .c10d import is_live as is_live
from .c10d import live_groups as live_groups
from .c10d import memory_store as memory_store
from .c10d import new_named_group as new_named_group
from .c10d import shrink_from as shrink_from
from .c10d import split_from_world as split_from_world
from .c10d import torch_version as torch_version
from .dtensor import explicit_shard_order as explicit_shard_order
from .dtensor import strided_shard as strided_shard
from .dtensor import strided_shard_parts as strided_shard_parts

if TYPE_CHECKING:
    from .c10d import BackendOptions as BackendOptions
    from .c10d import Store as Store

__all__ = [
    "BackendOptions",
    "Store",
    "backend_options_type",
    "debug_detail",
    "default_store",
    "default_timeout",
    "explicit_shard_order",
    "fake_store",
    "init_fake_world",
    "is_live",
    "live_groups",
    "memory_store",
    "new_named_group",
    "shrink_from",
    "split_from_world",
    "strided_shard",
    "strided_shard_parts",
    "torch_version",
]
