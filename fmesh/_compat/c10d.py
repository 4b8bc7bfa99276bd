"""Private torch names for process groups and stores, gated where torch changed.

The process-group part of the compat package (``dtensor.py`` and ``mesh.py`` hold the
others). What changed across torch 2.11-2.15:

* ``_new_process_group_helper`` returns ``ProcessGroup | Literal[-100]`` (2.14) or a
  ``_NonGroupMember`` (2.15) for non-members instead of ``None`` (2.11-2.13).
* ``split_group`` takes ``backend=`` from 2.13 on; 2.15 returns a non-member sentinel.
* ``shrink_group`` is used where it exists and the group's backend supports shrinking.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Container, Sequence
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Backend as _C10dBackend
    from torch._C._distributed_c10d import Store
    from torch.distributed import ProcessGroup

__all__ = [
    "BackendOptions",
    "backend_options_type",
    "debug_detail",
    "Store",
    "default_store",
    "default_timeout",
    "fake_store",
    "group_timeout",
    "init_fake_world",
    "is_live",
    "live_groups",
    "memory_store",
    "new_named_group",
    "shrink_from",
    "split_from_world",
    "torch_version",
]

if TYPE_CHECKING:
    BackendOptions = _C10dBackend.Options
    """Options for a c10d backend (e.g. ``ProcessGroupNCCL.Options``)."""


@functools.cache
@functools.cache
def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch."""
    import torch

    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


# -- c10d -------------------------------------------------------------------------------


def backend_options_type() -> type:
    """torch's class of backend options (``ProcessGroupNCCL.Options`` derives from it)."""
    from torch._C._distributed_c10d import Backend

    return Backend.Options


def default_store() -> Store:
    """The default group's store (where torch's own rendezvous keys live)."""
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_store()


def memory_store() -> Store:
    """A new in-process store (torch's ``HashStore``): rendezvous with nobody else."""
    from torch._C._distributed_c10d import HashStore

    return HashStore()


def default_timeout(backend: str) -> datetime.timedelta:
    """torch's default creation/collective timeout for ``backend``."""
    from torch.distributed import Backend
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_timeout(Backend(backend))


def debug_detail() -> bool:
    """torch's own debug switch is at DETAIL (``TORCH_DISTRIBUTED_DEBUG=DETAIL``)."""
    from torch._C._distributed_c10d import DebugLevel, get_debug_level

    return bool(get_debug_level() == DebugLevel.DETAIL)


def is_live(pg: ProcessGroup) -> bool:
    """Whether torch still holds ``pg`` (not destroyed)."""
    from torch.distributed import distributed_c10d as c10d

    return pg in c10d._world.pg_map


def live_groups() -> Container[object]:
    """The groups torch holds now (``pg in live_groups()``, O(1) each): a group
    destroyed (``destroy_process_group``) or aborted (``DeviceMesh.abort``) is not.
    Cheap enough for every memo hit."""
    live: Container[object] = _c10d_module()._world.pg_map
    return live


@functools.cache
def _c10d_module() -> Any:
    from torch.distributed import distributed_c10d

    return distributed_c10d


def _member_or_none(pg: object) -> ProcessGroup | None:
    from torch.distributed import ProcessGroup

    return pg if isinstance(pg, ProcessGroup) else None


def new_named_group(
    ranks: Sequence[int],
    me: int,
    backend: str,
    options: object,
    timeout: datetime.timedelta,
    name: str,
    desc: str,
    store: Store | None,
) -> ProcessGroup | None:
    """Create one group, ranks in the order given (never sorted), under our name.

    torch's own local-synchronization names hash the number of groups a process
    already holds, which differs between ranks of different meshes and would split the
    rendezvous; so fmesh names groups itself through torch's group constructor.
    Non-members get ``None``. ``store`` defaults to the default group's store.
    """
    from torch.distributed import Backend, group
    from torch.distributed import distributed_c10d as c10d

    world = group.WORLD
    assert world is not None  # realize initialized it
    pg, _ = c10d._new_process_group_helper(
        len(ranks),
        ranks.index(me) if me in ranks else -1,
        list(ranks),
        Backend(backend),
        store if store is not None else c10d._get_default_store(),
        group_name=c10d.GroupName(name),
        backend_options=options,
        timeout=timeout,
        group_desc=desc,
        device_id=world.bound_device_id,
    )
    member = _member_or_none(pg)
    if member is None or me not in ranks:
        return None
    # Keep coordinate order: torch reads group ranks from this table.
    c10d._world.pg_group_ranks[member] = dict(zip(ranks, range(len(ranks))))
    return member


def split_from_world(
    ranks: Sequence[int],
    backend: str,
    options: object,
    timeout: datetime.timedelta | None,
    desc: str,
) -> ProcessGroup | None:
    """``split_group`` of the eagerly initialized world (sorts ranks; collective).

    torch 2.11's ``split_group`` takes no ``backend``: the new group splits the world's
    NCCL communicator and keeps the world's backends.
    """
    import torch.distributed as dist

    kwargs: dict[str, Any] = {}
    if torch_version() >= (2, 13):
        kwargs["backend"] = backend
    pg = dist.split_group(
        split_ranks=[list(ranks)],
        timeout=timeout,
        pg_options=cast(Any, options),
        group_desc=desc,
        **kwargs,
    )
    return _member_or_none(pg)


def shrink_from(parent: ProcessGroup, exclude: Sequence[int]) -> ProcessGroup | None:
    """``shrink_group`` of ``parent`` without its group ranks ``exclude`` (NCCL's
    communicator shrink: no new rendezvous), or ``None`` where torch or the backend
    cannot shrink it. The remaining ranks keep their order."""
    import torch
    import torch.distributed as dist

    shrink = getattr(dist, "shrink_group", None)
    if shrink is None:
        return None
    try:
        device = parent.bound_device_id or torch.device("cuda")
        backend: Any = parent._get_backend(device)
        if not getattr(backend, "supports_shrinking", False):  # not in every version
            return None
    except (RuntimeError, AttributeError):
        return None
    return _member_or_none(shrink(list(exclude), group=parent))


def fake_store() -> Store:
    """A store for torch's ``fake`` backend (one process plays one rank).

    Importing torch's fake_pg module registers the ``fake`` backend.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


def init_fake_world(rank: int, world: int) -> None:
    """Initialize the default process group on torch's ``fake`` backend."""
    import torch.distributed as dist

    dist.init_process_group("fake", store=fake_store(), rank=rank, world_size=world)


def group_timeout(pg: ProcessGroup) -> datetime.timedelta | None:
    """The timeout ``pg``'s backend was created with, read back from its options
    (torch has no public getter; 2.11-2.15 keep it in ``options._timeout``);
    ``None`` where no backend of ``pg`` reports one (a fake group)."""
    import torch

    for device in ("cpu", "cuda"):
        try:
            backend = cast(Any, pg)._get_backend(torch.device(device))
        except RuntimeError:  # no backend for this device type
            continue
        timeout = getattr(getattr(backend, "options", None), "_timeout", None)
        if isinstance(timeout, datetime.timedelta):
            return timeout
    return None
