"""realize: the one side-effecting step, from a Mesh value to process groups.

Everything that touches ``torch.distributed`` lives here. torch is imported when a
function here first runs, never by ``import fmesh``.

How groups are made, per axis of the mesh, for the calling rank only:

* One process-wide memo, keyed by the axis (canonical layout, index space, rank map,
  backend, options), holds the group this rank got; a second level keyed by the
  group itself (its ranks in coordinate order, backend, options) means the same group
  reached from any mesh -- a slice, a flatten, an unflatten -- is created once.
* Group rank == coordinate: groups are created with their ranks in coordinate
  order (never sorted).
* With an eagerly initialized NCCL world (a bound device), axes whose groups are
  ascending are made with ``split_group`` (one collective per axis over the world);
  other axes go through the same world-collective split, keeping rank order.
* Otherwise only members take part (local synchronization), in mesh axis order, so
  overlapping creations cannot deadlock. Group names are derived from the group
  itself, not from how many groups a process happens to hold, so members agree.
* Size-1 axes get a one-member gloo (or fake) group: no NCCL communicator.
* Before creating anything, ranks compare a digest of what they are realizing with
  their group neighbours through the store (``_check.py``), so a mismatched mesh
  fails fast with a :class:`~fmesh.MeshMismatchError` instead of hanging.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import threading
import time
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, final

import attrs

from ._check import CallRecord, compare_with_neighbours, diagnose
from ._errors import LaunchError, MeshError
from ._layout import Layout
from ._mesh import Mesh
from ._ops import axis_position, coordinate, group, instance, rank_of
from ._rankmap import rank_map_info

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Backend as C10dBackend
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

    BackendOptions = C10dBackend.Options

__all__ = [
    "CacheStats",
    "RealizedMesh",
    "cache_stats",
    "destroy",
    "from_device_mesh",
    "realize",
]

logger = logging.getLogger("fmesh")

DEFAULT_CHECK_TIMEOUT = datetime.timedelta(minutes=5)

_LAUNCH_HELP = """\
fmesh.realize() found no default process group and cannot create one: the torchrun
environment variables {missing} are not set.

Launch the script with torchrun, which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
and MASTER_PORT for every process, e.g.

    torchrun --standalone --nproc-per-node 4 train.py

or call torch.distributed.init_process_group(...) yourself before realize()."""


# -- public values ----------------------------------------------------------------------


@final
@attrs.frozen(slots=True)
class CacheStats:
    """Counters of the process-wide group memo."""

    created: int
    """Process groups fmesh created in this process (since the last destroy)."""
    reused: int
    """Group requests answered from the memo instead of creating a group."""
    live: int
    """Groups fmesh holds now."""


@final
@attrs.frozen(slots=True, eq=False)
class RealizedMesh:
    """A mesh with the process groups of the calling rank (from :func:`realize`)."""

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
        """A torch ``DeviceMesh`` over this rank's instance, using fmesh's groups.

        DTensor, FSDP2 (``fully_shard``) and tensor parallel
        (``parallelize_module``) accept it. ``device_type`` defaults to ``"cuda"``
        when the world uses NCCL and CUDA is available, else ``"cpu"``.
        """
        import torch
        from torch.distributed.device_mesh import DeviceMesh

        if self.coordinate is None:
            raise MeshError(
                f"rank {self.rank} is not in {self.mesh!r}; only member ranks can "
                "build a DeviceMesh from it"
            )
        ranks = torch.from_numpy(instance(self.mesh, self.rank)).to(torch.int)
        return DeviceMesh.from_group(
            [self.groups[n] for n in self.mesh.axis_names],
            device_type or _default_device_type(),
            mesh=ranks,
            mesh_dim_names=self.mesh.axis_names,
        )

    def __repr__(self) -> str:
        return f"RealizedMesh({self.mesh!r}, rank={self.rank}, coordinate={self.coordinate})"


# -- process-wide state -------------------------------------------------------------------


@attrs.define
class _State:
    lock: threading.RLock = attrs.field(factory=threading.RLock)
    world: object | None = None  # the default group the memo belongs to
    generation: int = 0
    calls: int = 0
    axis_memo: dict[tuple[object, ...], ProcessGroup | None] = attrs.field(factory=dict)
    group_memo: dict[tuple[object, ...], ProcessGroup] = attrs.field(factory=dict)
    created_pgs: list[ProcessGroup] = attrs.field(factory=list)
    options_ids: dict[int, tuple[object, int]] = attrs.field(factory=dict)
    created: int = 0
    reused: int = 0
    check: CallRecord | None = None  # what this rank published for its last call

    def reset(self) -> None:
        self.axis_memo.clear()
        self.group_memo.clear()
        self.created_pgs.clear()
        self.options_ids.clear()
        self.calls = 0
        self.generation += 1


_state = _State()


def cache_stats() -> CacheStats:
    """Counters of groups created and reused by :func:`realize` in this process."""
    with _state.lock:
        return CacheStats(
            created=_state.created, reused=_state.reused, live=len(_state.created_pgs)
        )


def destroy() -> None:
    """Destroy every process group fmesh created; a later :func:`realize` works again.

    The default (world) group is left alone, even when fmesh initialized it; tear it
    down with ``torch.distributed.destroy_process_group()``.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    with _state.lock:
        for pg in _state.created_pgs:
            if pg in c10d._world.pg_map:
                dist.destroy_process_group(pg)
        logger.info("fmesh.destroy: destroyed %d groups", len(_state.created_pgs))
        _state.reset()
        _state.created = 0
        _state.reused = 0


# -- helpers ------------------------------------------------------------------------------


def _default_device_type() -> str:
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available() and "nccl" in str(dist.get_backend()):
        return "cuda"
    return "cpu"


def _ensure_default_group() -> None:
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    needed = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    missing = [v for v in needed if v not in os.environ]
    if missing:
        raise LaunchError(_LAUNCH_HELP.format(missing=", ".join(missing)))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group(backend="cpu:gloo,cuda:nccl", device_id=device)
    else:
        dist.init_process_group(backend="gloo")
    logger.info(
        "fmesh: initialized the default process group (%s) from the torchrun "
        "environment, rank %d of %d",
        dist.get_backend(),
        dist.get_rank(),
        dist.get_world_size(),
    )


def _per_axis(spec: object, mesh: Mesh, what: str) -> tuple[object, ...]:
    """Expand a global-or-per-axis argument into one value per axis."""
    if isinstance(spec, Mapping):
        for key in spec:
            axis_position(mesh, key, f"realize({what}=...)")
        return tuple(spec.get(n) for n in mesh.axis_names)
    return (spec,) * mesh.ndim


def _options_ordinal(options: object) -> int:
    """A rank-independent id for an options object: its order of first use."""
    if options is None:
        return 0
    entry = _state.options_ids.get(id(options))
    if entry is None or entry[0] is not options:
        entry = (options, len(_state.options_ids) + 1)
        _state.options_ids[id(options)] = entry
    return entry[1]


def _rank_map_key(mesh: Mesh) -> str:
    return "" if mesh.rank_map is None else rank_map_info(mesh.rank_map).digest


def _digest(*parts: object) -> str:
    return hashlib.sha1(repr(parts).encode(), usedforsecurity=False).hexdigest()


def _group_name(ranks: tuple[int, ...], backend: str, options_id: int) -> str:
    return f"fmesh_g{_state.generation}_{_digest(ranks, backend, options_id)[:20]}"


def _new_group(
    ranks: tuple[int, ...],
    me: int,
    backend: str,
    options: object,
    timeout: datetime.timedelta | None,
    name: str,
    desc: str,
) -> ProcessGroup | None:
    """Create one group with ranks in the given order (never sorted).

    Uses torch's group constructor directly so the name is ours: torch's own
    local-synchronization names hash the number of groups a process already holds,
    which differs between ranks of different meshes and would split the rendezvous.
    """
    from torch.distributed import Backend
    from torch.distributed import distributed_c10d as c10d

    pg: ProcessGroup
    be = Backend(backend)
    default_pg = c10d._get_default_group()
    try:
        pg, _ = c10d._new_process_group_helper(
            len(ranks),
            ranks.index(me) if me in ranks else -1,
            list(ranks),
            be,
            c10d._get_default_store(),
            group_name=c10d.GroupName(name),
            backend_options=options,
            timeout=timeout if timeout is not None else c10d._get_default_timeout(be),
            group_desc=desc,
            device_id=default_pg.bound_device_id,
        )
    except Exception as err:  # a peer that never joins shows up as a store timeout
        record = _state.check
        if record is None:
            raise
        store = c10d._get_default_store()
        grace = (timeout if timeout is not None else DEFAULT_CHECK_TIMEOUT).total_seconds()
        diagnosis = diagnose(store, record, ranks, me, err, min(grace, 30.0))
        if diagnosis is err:
            raise
        # Ranks waiting on this one in later groups learn why it never came.
        store.set(f"{record.prefix}failed/{me}", str(diagnosis))
        raise diagnosis from err
    if me not in ranks:
        return None
    c10d._world.pg_group_ranks[pg] = {g: i for i, g in enumerate(ranks)}
    return pg


def _check_world(mesh: Mesh, world: int) -> None:
    top = (
        mesh.index_size - 1 if mesh.rank_map is None else rank_map_info(mesh.rank_map).max_rank
    )
    if top >= world:
        raise MeshError(
            f"{mesh!r} uses global rank {top}, but the world has only {world} ranks "
            f"(0..{world - 1}); shrink the mesh or launch more processes"
        )


# -- realize --------------------------------------------------------------------------------


def realize(
    mesh: Mesh,
    *,
    backend: str | Mapping[str, str | None] | None = None,
    options: BackendOptions | Mapping[str, BackendOptions | None] | None = None,
    timeout: datetime.timedelta | None = None,
) -> RealizedMesh:
    """Create (or reuse) the process groups the calling rank needs for ``mesh``.

    Every rank calls ``realize`` with the same mesh, in the same order (SPMD); ranks
    outside the mesh get a :class:`RealizedMesh` with ``coordinate is None`` and no
    groups. If no default process group exists, one is initialized from the
    torchrun environment (NCCL + bound device on CUDA, gloo on CPU).

    Args:
        mesh: the mesh to realize.
        backend: ``None`` (the default group's backend), a backend string such as
            ``"gloo"``, ``"nccl"`` or ``"cpu:gloo,cuda:nccl"``, or a mapping from axis
            name to backend for per-axis overrides.
        options: backend options (e.g. ``ProcessGroupNCCL.Options``), global or as a
            mapping from axis name to options.
        timeout: how long group creation and the cross-rank mesh check may wait for
            peers (default: torch's backend timeout for creation, 5 minutes for the
            check).

    Returns:
        A :class:`RealizedMesh`.

    Raises:
        MeshMismatchError: ranks disagree about the mesh (instead of a hang).
        LaunchError: no process group and no torchrun environment.
        MeshError: the mesh needs ranks the world does not have.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not isinstance(mesh, Mesh):
        raise TypeError(f"realize() needs an fmesh.Mesh, got {type(mesh).__name__}")
    if timeout is not None and not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"realize() timeout must be a datetime.timedelta, got {timeout!r}")
    backends_in = _per_axis(backend, mesh, "backend")
    for b in backends_in:
        if b is not None and not isinstance(b, str):
            raise TypeError(f"realize() backend must be a str, got {b!r}")
    options_in = _per_axis(options, mesh, "options")

    start = time.perf_counter()
    with _state.lock:
        # Under the lock: threads racing to the first realize must not each
        # initialize the world.
        _ensure_default_group()
        world_pg = c10d._get_default_group()
        if _state.world is not world_pg:
            if _state.world is not None:
                logger.info("fmesh: the default process group changed; memo reset")
            _state.reset()
            _state.world = world_pg
        world = dist.get_world_size()
        me = dist.get_rank()
        _check_world(mesh, world)
        world_backend = str(dist.get_backend())
        fake_world = world_backend == "fake"
        backends = tuple(world_backend if b is None else str(b) for b in backends_in)
        opt_ids = tuple(_options_ordinal(o) for o in options_in)

        rmap_key = _rank_map_key(mesh)
        digest = _digest(
            mesh.axis_names,
            tuple(layout.modes for layout in mesh.axes),
            mesh.index_size,
            rmap_key,
            backends,
            opt_ids,
        )
        cached = all(
            _axis_key(mesh, layout, rmap_key, b, o) in _state.axis_memo
            for layout, b, o in zip(mesh.axes, backends, opt_ids)
        )
        # The check guards group creation; a fully memoized mesh creates nothing
        # (and every rank that realized the same calls knows it), so skip the trip.
        if not fake_world and world > 1 and not cached:
            record = CallRecord(
                prefix=f"fmesh/{_state.generation}/realize/{_state.calls}/",
                call=_state.calls,
                digest=digest,
                summary=f"{mesh!r} with backends {dict(zip(mesh.axis_names, backends))}",
            )
            _state.check = record
            try:
                compare_with_neighbours(
                    c10d._get_default_store(),
                    record,
                    mesh,
                    me,
                    timeout or DEFAULT_CHECK_TIMEOUT,
                )
            finally:
                _state.calls += 1  # keep call numbers aligned even after a failure
        else:
            _state.calls += 1

        coord = coordinate(mesh, me)
        world_info = _World(
            pg=world_pg,
            size=world,
            backend=world_backend,
            fake=fake_world,
            eager=getattr(world_pg, "bound_device_id", None) is not None,
        )
        groups: dict[str, ProcessGroup] = {}
        created = 0
        for axis, (name, layout) in enumerate(zip(mesh.axis_names, mesh.axes)):
            pg, made = _axis_group(
                mesh,
                axis,
                layout,
                me,
                coord,
                backends[axis],
                options_in[axis],
                opt_ids[axis],
                rmap_key,
                timeout,
                world_info,
            )
            created += made
            if pg is not None:
                groups[name] = pg
        elapsed = time.perf_counter() - start
        logger.info(
            "fmesh.realize %r on rank %d: %d groups created, %d from memo, %.1f ms",
            mesh,
            me,
            created,
            len(groups) - created,
            elapsed * 1e3,
        )
        return RealizedMesh(
            mesh=mesh,
            rank=me,
            coordinate=coord,
            groups=types.MappingProxyType(groups),
            created=created,
        )


@final
@attrs.frozen(slots=True)
class _World:
    """Facts about the default process group that shape every creation."""

    pg: ProcessGroup
    size: int
    backend: str
    fake: bool
    eager: bool
    """The default group has a bound device (eagerly initialized NCCL)."""


def _axis_key(
    mesh: Mesh, layout: Layout, rmap_key: str, backend: str, options_id: int
) -> tuple[object, ...]:
    """The memo key of one axis: the same on every rank that realizes it."""
    return (layout, mesh.index_size, rmap_key, backend, options_id)


def _axis_group(
    mesh: Mesh,
    axis: int,
    layout: Layout,
    me: int,
    coord: tuple[int, ...] | None,
    backend: str,
    options: object,
    options_id: int,
    rmap_key: str,
    timeout: datetime.timedelta | None,
    world: _World,
) -> tuple[ProcessGroup | None, int]:
    """This rank's group along one axis, from the memo or newly created."""
    name = mesh.axis_names[axis]
    axis_key = _axis_key(mesh, layout, rmap_key, backend, options_id)
    if axis_key in _state.axis_memo:
        _state.reused += 1
        return _state.axis_memo[axis_key], 0

    members = group(mesh, name, me) if coord is not None else None
    # With an eagerly initialized NCCL world, torch makes every NCCL group by
    # splitting the world communicator, a collective over all ranks; an axis with a
    # non-NCCL backend (say gloo), or of size 1, is made by its members alone.
    world_collective = world.eager and "nccl" in backend and layout.size > 1 and not world.fake
    if layout.size == 1:
        # One member: nothing to communicate, so no NCCL communicator; DTensor skips
        # collectives on size-1 mesh dims but still needs a group per dimension.
        backend, options, options_id = ("fake" if world.fake else "gloo"), None, 0
    if members is not None and not world_collective:
        pg = _state.group_memo.get((members, backend, options_id))
        if pg is not None:
            _state.reused += 1
            _state.axis_memo[axis_key] = pg
            return pg, 0
    if (
        members is not None
        and options is None
        and backend == world.backend
        and len(members) == world.size
        and members == tuple(range(world.size))
    ):
        # The whole world in rank order is the default group: no second communicator.
        # Every rank is a member, so every rank decides this alike (no collective).
        _state.reused += 1
        _state.axis_memo[axis_key] = world.pg
        return world.pg, 0

    desc = f"fmesh:{name}"
    if world_collective:
        pg = _split(
            mesh, name, layout, me, members, backend, options, options_id, timeout, desc
        )
    elif members is not None:
        pg = _new_group(
            members,
            me,
            backend,
            options,
            timeout,
            _group_name(members, backend, options_id),
            desc,
        )
    else:
        pg = None

    _state.axis_memo[axis_key] = pg
    if pg is None or members is None:
        return None, 0
    _state.group_memo[(members, backend, options_id)] = pg
    _state.created_pgs.append(pg)
    _state.created += 1
    logger.debug(
        "fmesh: created group %s of %d ranks %s (%s)",
        desc,
        len(members),
        list(members) if len(members) <= 16 else f"[{members[0]}, ..., {members[-1]}]",
        backend,
    )
    return pg, 1


def _split(
    mesh: Mesh,
    name: str,
    layout: Layout,
    me: int,
    members: tuple[int, ...] | None,
    backend: str,
    options: object,
    options_id: int,
    timeout: datetime.timedelta | None,
    desc: str,
) -> ProcessGroup | None:
    """World-collective creation from the eagerly initialized NCCL world group.

    Every rank of the world calls this once per axis (non-members pass a group they
    are not in, which makes them take part in the split without joining).
    """
    import torch.distributed as dist

    some = members if members is not None else group(mesh, name, rank_of(mesh, 0))
    increasing = mesh.rank_map is None or rank_map_info(mesh.rank_map).is_increasing
    if layout.is_ascending and increasing:
        pg = dist.split_group(
            split_ranks=[list(some)],
            timeout=timeout,
            pg_options=options,
            group_desc=desc,
        )
        return pg
    # split_group sorts ranks; keep coordinate order with torch's own split-from-world
    # constructor, which every rank of the world enters once.
    return _new_group(
        some,
        me,
        backend,
        options,
        timeout,
        _group_name(some, backend, options_id),
        desc,
    )


# -- interop ----------------------------------------------------------------------------------


def from_device_mesh(device_mesh: DeviceMesh) -> Mesh:
    """The fmesh value of a torch ``DeviceMesh`` (its layout, ranks and names).

    Unnamed dimensions are called ``dim0``, ``dim1``, ...
    """
    names = device_mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(device_mesh.ndim))
    layout = getattr(device_mesh, "_layout", None)
    rank_map = getattr(device_mesh, "_rank_map", None)
    if layout is not None and rank_map is not None:
        axes = tuple(Layout.of(ax.shape, ax.stride) for ax in layout)
        flat = tuple(int(r) for r in rank_map.tolist())
        return Mesh(tuple(names), axes, len(flat), flat)
    return Mesh.from_ranks(device_mesh.mesh.cpu().numpy(), tuple(names))
