"""torch's side of every comparison, and the worlds both sides run in: the one bench
module that uses torch's private modules and functions.

The baselines are what torch users write today (``init_device_mesh``, and the private
``_flatten`` / ``_unflatten`` methods that torchtitan calls, which :mod:`bench.work`
calls too), plus counters read from c10d's process-global registry. Keeping them here
means a torch release that moves a private module or function breaks one file.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from unittest import mock

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
WARM_UP = 64
"""The world a fake-world worker warms up on before building its measured one."""


def init_fake(world: int) -> None:
    """The default group on torch's ``fake`` backend, as rank 0 of ``world``."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


def fake_world(
    world: int, warm_up: Callable[[int], object] | None = None, freeze: bool = False
) -> None:
    """Rank 0 of a fake world of ``world`` ranks, after ``warm_up(WARM_UP)`` on a small
    one, torn down (neither library's one-time costs, first-use imports and code run
    for the first time, are timed); with ``freeze``, what exists then is moved out of
    the collector's reach (a full collection would otherwise copy the fork server's
    heap)."""
    import torch.distributed as dist

    import fmesh

    preload_lazy_imports()
    if warm_up is not None:
        init_fake(WARM_UP)
        warm_up(WARM_UP)
        fmesh.destroy()
        dist.destroy_process_group()
    init_fake(world)
    if freeze:
        gc.collect()
        gc.freeze()


def init_gloo(
    spec: Mapping[str, Any], wrap: Callable[[TCPStore], Any] | None = None, **timeouts: float
) -> Any:
    """A gloo worker's default group on the job's store (``spec["port"]``,
    ``spec["timeout_s"]``, or ``timeouts``' ``store_s`` and ``group_s``), as this
    process's torchrun rank, through ``wrap(store)`` where given; torch's lazy imports
    done. Returns the store given to the group."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    default = float(spec.get("timeout_s", 60.0))
    store_s, group_s = (timeouts.get(k, default) for k in ("store_s", "group_s"))
    raw = tcp_store(int(spec["port"]), world, datetime.timedelta(seconds=store_s))
    store = raw if wrap is None else wrap(raw)
    timeout = datetime.timedelta(seconds=group_s)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    preload_lazy_imports()
    return store


def tcp_store(
    port: int, world: int | None, timeout: datetime.timedelta, master: bool = False
) -> TCPStore:
    """A TCPStore on localhost: the server (``master``; port 0: the OS picks one),
    listening before any rank starts, or a client (``world`` None: a plain client,
    which sends nothing when it connects)."""
    from torch._C._distributed_c10d import TCPStore

    wait = {} if world is not None and not master else {"wait_for_workers": False}
    return TCPStore("127.0.0.1", port, world, is_master=master, timeout=timeout, **wait)


def preload_lazy_imports() -> None:
    """Import what torch's mesh code and fmesh's realize import on first use: one-time
    program costs, not part of building a mesh."""
    import torch.distributed.device_mesh
    import torch.fx.experimental.proxy_tensor  # noqa: F401

    import fmesh

    fmesh.cache_stats()  # imports fmesh's torch-facing module


# -- torch's meshes -----------------------------------------------------------------------


def init_mesh(shape: Sequence[int], names: Sequence[str]) -> DeviceMesh:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", tuple(shape), mesh_dim_names=tuple(names))


OPS = types.SimpleNamespace(
    mesh=init_mesh,
    unflatten=lambda dm, sizes, names: dm._unflatten(0, tuple(sizes), tuple(names)),
    done=list,
    flatten=lambda dm, axes, name: dm[axes]._flatten(name),
)
"""The steps of a recipe (:mod:`bench.work`) with torch: each creates its groups."""


def mesh_without_groups(
    world: int, shape: tuple[int, ...], names: tuple[str, ...]
) -> DeviceMesh:
    """torch's DeviceMesh over ranks 0..world-1 with no process groups: what
    ``init_device_mesh`` builds before it creates groups (private constructor
    arguments, as it uses them; torch before 2.13 takes the rank tensor instead)."""
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


def clear_flattens(dm: DeviceMesh) -> None:  # torch's slicing scans them
    dm._flatten_mapping.clear()


def coordinate_uncached(dm: DeviceMesh) -> object:  # what every construction runs
    return dm._compute_coordinate_on_dim()


def sub_mesh_exprs(dm: DeviceMesh, names: Sequence[str]) -> list[Callable[[], object]]:
    """torch's expressions for the sub-meshes of a 3-d mesh that a trainer asks for
    again and again: each axis, both adjacent pairs, and the flattens of the pairs and
    of all three (after its first call, ``_flatten`` returns the mesh it cached)."""
    a, b, c = names
    # fmt: off
    return [lambda: dm[a], lambda: dm[b], lambda: dm[c], lambda: dm[a, b], lambda: dm[b, c],
            lambda: dm[a, b]._flatten(f"{a}_{b}"), lambda: dm[b, c]._flatten(f"{b}_{c}"),
            lambda: dm._flatten(f"{a}_{b}_{c}")]
    # fmt: on


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


# -- counters -----------------------------------------------------------------------------


def group_counters() -> tuple[int, int]:
    """(groups registered in this process, ``new_group`` calls so far): torch counts
    every ``new_group`` call, members or not, in ``group_count``."""
    from torch.distributed import distributed_c10d as c10d

    return len(c10d._world.pg_names), c10d._world.group_count


@contextlib.contextmanager
def counting_group_creation() -> Iterator[dict[str, int]]:
    """Count, while inside, torch ``new_group`` calls and process groups constructed.

    ``new_group`` is wrapped where torch binds it: ``torch.distributed``,
    ``distributed_c10d`` and ``device_mesh`` (which imports it by name). Every group,
    whoever asks for it, is constructed by ``distributed_c10d._new_process_group_helper``;
    its calls that return a group count as ``groups`` (a rank outside the group gets
    torch's non-member sentinel instead, counted in ``non_member``).
    """
    import torch.distributed as dist
    from torch.distributed import device_mesh as dm_mod
    from torch.distributed import distributed_c10d as c10d

    counts = {"new_group": 0, "groups": 0, "non_member": 0}
    real_new_group, real_helper = c10d.new_group, c10d._new_process_group_helper

    def new_group(*args: Any, **kwargs: Any) -> Any:
        counts["new_group"] += 1
        return real_new_group(*args, **kwargs)

    def helper(*args: Any, **kwargs: Any) -> Any:
        result = real_helper(*args, **kwargs)
        pg = result[0] if isinstance(result, tuple) else result
        counts["groups" if isinstance(pg, dist.ProcessGroup) else "non_member"] += 1
        return result

    with contextlib.ExitStack() as patched:
        for module in (dist, c10d, dm_mod):
            if getattr(module, "new_group", None) is real_new_group:
                patched.enter_context(mock.patch.object(module, "new_group", new_group))
        patched.enter_context(mock.patch.object(c10d, "_new_process_group_helper", helper))
        yield counts
