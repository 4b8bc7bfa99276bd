"""``fmesh.plan``: run a function that builds meshes as chosen ranks of a fake world.

For each rank, in turn and independently: a fresh ``fake`` default group of ``world``
ranks, torch's ``init_device_mesh`` and DeviceMesh methods routed through fmesh
(``patch.py``), the torchrun variables set, then the function; what it realized is
recorded through the runtime's hooks, and everything is torn down before the next
rank. torch is imported on first use, never by ``import fmesh``.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._core.errors import MeshError
from .._core.mesh import Mesh
from .._core.queries import coordinate
from .._runtime.cache import cache_stats, destroy
from .._runtime.hooks import on_creating_call, on_realized
from .._runtime.launch import init_fake_world
from .._runtime.realized_mesh import RealizedMesh
from .patch import routed_torch
from .report import GroupPlan, MeshPlan, PlannedCall, PlanReport, RankPlan, first_divergence
from .sample import spread

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["plan"]

MAX_WORLD = 2**31 - 1
"""c10d ranks and world sizes are 32-bit ints."""
DEFAULT_SAMPLE = 8
LOCAL_WORLD_SIZE = 8
"""``LOCAL_RANK`` is set as on hosts of this many ranks."""


def plan(
    fn: Callable[[], object],
    *,
    world: int,
    ranks: Sequence[int] | None = None,
    sample: int | None = None,
    on_rank: Callable[[RankPlan], None] | None = None,
) -> PlanReport:
    """Run ``fn()`` as each of some ranks of a fake world and report what it built.

    For each rank, in turn: a fresh default group of ``world`` ranks on torch's
    ``fake`` backend (``fmesh.init_fake_world()``), ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` set as torchrun would (hosts of 8), and
    torch's own ``init_device_mesh`` and DeviceMesh methods routed through fmesh, so
    unmodified trainer code is planned too. Then ``fn()`` runs; its meshes, groups,
    wall time and peak memory are recorded, and everything is torn down (torch's
    functions restored, ``fmesh.destroy()``, the default group destroyed). Finally the
    ranks' creating realize calls are compared, as a launch's agreement would.

    Args:
        fn: builds the meshes (through fmesh or torch's DeviceMesh API); takes no
            arguments: read the world size and rank as a trainer would (the
            environment, or ``torch.distributed``). If it returns a mapping of names
            to meshes (``DeviceMesh``, ``Mesh`` or ``RealizedMesh``), they are
            reported under those names.
        world: the world size to play, e.g. ``2**17``.
        ranks: the ranks to plan.
        sample: instead of ``ranks``, plan this many ranks spread over the world: the
            first, the last, and ranks at distinct coordinates of every axis of the
            meshes rank 0 built (default: 8 when ``ranks`` is not given either).
        on_rank: called with each rank's plan as soon as it is done (progress).

    Returns:
        A ``PlanReport``, whose ``check()`` raises ``MeshMismatchError`` when
            two ranks would disagree at launch.

    Raises:
        MeshError: a world or rank out of range; a default process group exists.
        TypeError: ``ranks`` and ``sample`` both given, or arguments of the wrong type.
        Exception: whatever ``fn`` raised, with a note naming the rank.

    Example:
        >>> import fmesh
        >>> def build():
        ...     fmesh.realize(fmesh.make_mesh({"dp": 4, "tp": 2}))
        >>> report = fmesh.plan(build, world=8, ranks=[0, 7])
        >>> report.ok, [r.created for r in report.ranks]
        (True, [2, 2])
    """
    world = _check_int(world, "world")
    if not 1 <= world <= MAX_WORLD:
        raise MeshError(f"plan() world is {world}; expected 1..{MAX_WORLD} ranks")
    if ranks is not None and sample is not None:
        raise TypeError("plan() takes ranks or sample, not both")
    wanted: list[int] | None = None
    if ranks is not None:
        if isinstance(ranks, int | str):
            raise TypeError(f"plan() ranks must be a sequence of ints, got {ranks!r}")
        wanted = list(dict.fromkeys(_check_int(r, "ranks entry") for r in ranks))
        outside = [r for r in wanted if not 0 <= r < world]
        if not wanted or outside:
            raise MeshError(
                f"plan() ranks {list(ranks)}: expected one or more ranks in 0..{world - 1}"
            )
    count = DEFAULT_SAMPLE if sample is None else _check_int(sample, "sample")
    if count < 1:
        raise MeshError(f"plan() sample is {count}; expected at least 1 rank")
    import torch.distributed as dist

    if dist.is_initialized():
        raise MeshError(
            "fmesh.plan() plays each rank on a fresh fake world, but this process has a "
            "default process group already; call it before init_process_group(), or "
            "after torch.distributed.destroy_process_group()"
        )
    plans: list[RankPlan] = []
    queue = list(wanted) if wanted is not None else [0]
    # Routed once for all ranks: finding every module that holds torch's function
    # scans all modules (tens of ms with torch loaded).
    with routed_torch():
        while queue:
            rank = queue.pop(0)
            rank_plan, meshes = _plan_rank(fn, world, rank)
            plans.append(rank_plan)
            if on_rank is not None:
                on_rank(rank_plan)
            if wanted is None and len(plans) == 1:
                queue = [r for r in spread(world, meshes, count) if r != rank]
    target = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
    return PlanReport(target, world, tuple(plans), first_divergence(plans))


def _check_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"plan() {what} must be int, got {value!r}")
    return value


# -- one rank ---------------------------------------------------------------------------


class _Recorder:
    """What one rank's function realized, fed by the runtime's hooks."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.calls: list[PlannedCall] = []
        self.realized: list[tuple[Mesh, dict[str, ProcessGroup]]] = []


_active: list[_Recorder] = []


def _on_call(number: int, code: int, summary: object, history: Callable[[], str]) -> None:
    if _active:
        _active[-1].calls.append(PlannedCall(number, code, str(summary), history()))


def _on_realized(mesh: Mesh, groups: Mapping[str, ProcessGroup]) -> None:
    if _active:
        _active[-1].realized.append((mesh, dict(groups)))


on_creating_call(_on_call)
on_realized(_on_realized)


def _plan_rank(fn: Callable[[], object], world: int, rank: int) -> tuple[RankPlan, list[Mesh]]:
    """Plan one rank; returns its plan and the meshes it realized."""
    import torch.distributed as dist

    recorder = _Recorder(rank)
    with _torchrun_environment(world, rank):
        init_fake_world(world, rank)
        _active.append(recorder)
        try:
            before = cache_stats().created
            resident = _reset_peak()
            start = time.perf_counter()
            try:
                result = fn()
            except Exception as err:
                err.add_note(f"fmesh.plan: raised on rank {rank} of a fake world of {world}")
                raise
            seconds = time.perf_counter() - start
            peak = _peak()
            created = cache_stats().created - before
            meshes, held, comms = _meshes(recorder, result)
        finally:
            _active.remove(recorder)
            destroy()
            if dist.is_initialized():  # the function may have torn it down itself
                dist.destroy_process_group()
    growth = None if peak is None or resident is None else max(peak - resident, 0)
    rank_plan = RankPlan(
        rank=rank,
        meshes=tuple(meshes),
        calls=tuple(recorder.calls),
        created=created,
        held=held,
        communicators=comms,
        seconds=seconds,
        peak_memory=peak,
        memory_growth=growth,
    )
    return rank_plan, [m for m, _ in recorder.realized]


@contextlib.contextmanager
def _torchrun_environment(world: int, rank: int) -> Iterator[None]:
    values = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank % LOCAL_WORLD_SIZE),
        "LOCAL_WORLD_SIZE": str(min(LOCAL_WORLD_SIZE, world)),
    }
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _meshes(recorder: _Recorder, result: object) -> tuple[list[MeshPlan], int, int]:
    """The rank's meshes (each realized mesh once, in order, named by what the function
    returned), and how many distinct groups they hold, communicators among them."""
    rank = recorder.rank
    where: dict[int, tuple[Mesh, str]] = {}
    """id(group) -> the first (mesh, axis) realized with it."""
    sizes: dict[int, int] = {}
    plans: list[MeshPlan] = []
    seen: set[Mesh] = set()
    for mesh, groups in recorder.realized:
        if mesh in seen:
            continue
        seen.add(mesh)
        fresh = 0
        for axis, pg in groups.items():
            if id(pg) not in where:
                where[id(pg)] = (mesh, axis)
                sizes[id(pg)] = mesh.shape[axis]
                fresh += 1
        coord = coordinate(mesh, rank)
        plans.append(
            MeshPlan(
                name=",".join(mesh.axis_names),
                axis_names=mesh.axis_names,
                sizes=mesh.axis_sizes,
                coordinate=coord,
                groups=_groups(mesh.axis_names, coord, groups, where, rank),
                new_groups=fresh,
            )
        )
    held = len(where)
    comms = sum(1 for s in sizes.values() if s > 1)
    if isinstance(result, Mapping):
        for name, value in result.items():
            _name(plans, str(name), _returned(value, recorder, where))
    return plans, held, comms


def _groups(
    names: Sequence[str],
    coord: tuple[int, ...] | None,
    groups: Mapping[str, ProcessGroup],
    where: Mapping[int, tuple[Mesh, str]],
    rank: int,
) -> tuple[GroupPlan, ...]:
    if coord is None:
        return ()
    out = []
    for name, c in zip(names, coord, strict=True):
        source, axis = where[id(groups[name])]
        out.append(GroupPlan(name, source.shape[axis], c, source, axis, rank))
    return tuple(out)


def _name(plans: list[MeshPlan], name: str, entry: Returned | None) -> None:
    """Name the plan of a returned mesh (or add one, for a slice nobody realized)."""
    if entry is None:
        return
    names, sizes, coord, groups = entry
    for i, p in enumerate(plans):
        same = p.axis_names == names and p.sizes == sizes and p.groups == groups
        if same and p.coordinate == coord:
            label = name if p.name == ",".join(p.axis_names) else f"{p.name}, {name}"
            plans[i] = MeshPlan(label, names, sizes, coord, groups, p.new_groups)
            return
    plans.append(MeshPlan(name, names, sizes, coord, groups, 0))


Returned = tuple[
    tuple[str, ...], tuple[int, ...], "tuple[int, ...] | None", tuple[GroupPlan, ...]
]


def _returned(
    value: object, recorder: _Recorder, where: Mapping[int, tuple[Mesh, str]]
) -> Returned | None:
    """A returned mesh's names, sizes, coordinate and groups (``None``: not a mesh, or
    one whose groups the plan did not see being realized)."""
    rank = recorder.rank
    if isinstance(value, RealizedMesh):
        mesh, groups = value.mesh, dict(value.groups)
    elif isinstance(value, Mesh):
        mesh = value
        found = [g for m, g in recorder.realized if m == mesh]
        if not found:
            return None
        groups = found[0]
    else:
        return _device_mesh(value, where, rank)
    coord = coordinate(mesh, rank)
    if coord is not None and any(id(groups.get(n)) not in where for n in mesh.axis_names):
        return None
    return (
        mesh.axis_names,
        mesh.axis_sizes,
        coord,
        _groups(mesh.axis_names, coord, groups, where, rank),
    )


def _device_mesh(
    value: object, where: Mapping[int, tuple[Mesh, str]], rank: int
) -> Returned | None:
    module = sys.modules.get("torch.distributed.device_mesh")
    if module is None or not isinstance(value, module.DeviceMesh):
        return None
    dm: Any = value
    ndim = int(dm.ndim)
    names = tuple(dm.mesh_dim_names or (f"dim{i}" for i in range(ndim)))
    sizes = tuple(int(dm.size(i)) for i in range(ndim))
    coord = dm.get_coordinate()
    if coord is None:
        return names, sizes, None, ()
    coord = tuple(int(c) for c in coord)
    out = []
    for i, (name, c) in enumerate(zip(names, coord, strict=True)):
        pg = dm.get_group(i)
        if id(pg) not in where:
            return None
        source, axis = where[id(pg)]
        out.append(GroupPlan(name, sizes[i], c, source, axis, rank))
    return names, sizes, coord, tuple(out)


# -- memory -----------------------------------------------------------------------------


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            text = f.read()
    except OSError:
        return None
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return None if m is None else int(m.group(1))


def _reset_peak() -> int | None:
    """Reset the process's peak resident memory (Linux); the resident memory now."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    now = _status_kib("VmRSS")
    return None if now is None else now * 1024


def _peak() -> int | None:
    """The peak resident memory since ``_reset_peak()``, in bytes."""
    kib = _status_kib("VmHWM")
    if kib is None:
        return None
    return kib * 1024
