"""realize: the one side-effecting step, from a Mesh value to process groups.

A call that creates nothing is a dictionary lookup; one that creates groups first
agrees with every rank (``agreement.py``), then ``groups.py`` creates this rank's
groups. Details: ``docs/design/agreement-protocol.md``.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
import types
import urllib.parse
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, final

import attrs

from .._compat import debug_detail
from .._core.axes import axis_position
from .._core.errors import MeshError
from .._core.mesh import Mesh, require_mesh
from .._core.queries import coordinate, index_of
from .._core.rank_map import rank_map_info
from . import agreement as _agree
from .checks import check_backend, check_timeout
from .groups import AxisRequest, World, axis_group
from .hooks import run_realized_hooks
from .launch import ensure_default_group
from .memo import rank_map_key, state
from .realized_mesh import RealizedMesh
from .stream import Stream, call_code, combine

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from .._compat import BackendOptions

__all__ = ["realize"]

logger = logging.getLogger("fmesh")

DEFAULT_CHECK_TIMEOUT = datetime.timedelta(minutes=5)

_init_lock = threading.Lock()
"""Serializes the first initialization of the default group (which waits on peers,
so it is not the memo lock)."""


def _call_key(mesh: Mesh, backend: object, options: object) -> Hashable | None:
    """What identifies a call in a stream's memo (``None``: not memoizable)."""
    try:
        if isinstance(backend, Mapping):
            backend = tuple(sorted(backend.items(), key=lambda kv: str(kv[0])))
        if isinstance(options, Mapping):
            options = tuple(sorted(options.items(), key=lambda kv: str(kv[0])))
        key = (mesh, backend, options)
        hash(key)
    except TypeError:
        return None
    return key


def realize(
    mesh: Mesh,
    *,
    backend: str | Mapping[str, str | None] | None = None,
    options: BackendOptions | Mapping[str, BackendOptions | None] | None = None,
    timeout: datetime.timedelta | None = None,
    check: bool = False,
) -> RealizedMesh:
    """Create (or reuse) the process groups the calling rank needs for ``mesh``.

    Every rank calls ``realize`` with the same mesh, in the same order (SPMD); ranks
    outside the mesh get a :class:`RealizedMesh` with ``coordinate is None`` and no
    groups. A call that creates nothing (every axis realized before in this thread, or
    served by the default group) is a local lookup: no store request, no peer. A call
    that creates groups first agrees with every rank, so ranks that disagree raise
    instead of hanging. If no default process group exists, one is initialized from
    the torchrun environment: with ``backend`` when it is a single string, else NCCL
    with a bound device when CUDA is available and gloo otherwise.

    Args:
        mesh: the mesh to realize.
        backend: ``None`` (the default group's backend), a backend string such as
            ``"gloo"``, ``"nccl"`` or ``"cpu:gloo,cuda:nccl"``, or a mapping from axis
            name to backend for per-axis overrides.
        options: backend options (e.g. ``ProcessGroupNCCL.Options``), global or as a
            mapping from axis name to options.
        timeout: how long group creation and the cross-rank agreement may wait for
            peers (default: torch's backend timeout for creation, 5 minutes for the
            agreement). Groups fmesh creates keep it as their collective timeout.
        check: agree with every rank even if the call creates nothing (debugging;
            every rank must pass it for the same call). ``TORCH_DISTRIBUTED_DEBUG=DETAIL``
            does this for every call.

    Returns:
        A :class:`RealizedMesh`.

    Raises:
        MeshMismatchError: ranks disagree about this call, or about the calls made
            since the last agreement; a rank never arrived within the timeout.
        LaunchError: no process group and no usable torchrun environment.
        MeshError: the mesh needs ranks the world does not have; an unknown backend;
            a non-positive timeout.
    """
    require_mesh(mesh, "realize")
    if timeout is not None:
        check_timeout(timeout, "realize")
    stream_name = threading.current_thread().name
    key = _call_key(mesh, backend, options)
    if key is not None and not check and state.world is not None:
        import torch.distributed as dist

        with state.lock:
            stream = state.streams.get(stream_name)
            if stream is not None and not state.debug and state.world is dist.group.WORLD:
                entry = stream.calls.get(key)
                if entry is not None:
                    realized: RealizedMesh = entry[0]
                    code, summary = entry[1], entry[2]
                    stream.hit(code, summary)
                    state.reused += mesh.ndim
                    return realized
    return _realize(mesh, backend, options, timeout, check, stream_name, key)


def _per_axis(spec: object, mesh: Mesh, what: str) -> tuple[tuple[object, bool], ...]:
    """Expand a global-or-per-axis argument into (value, named for this axis)."""
    if isinstance(spec, Mapping):
        for key in spec:
            axis_position(mesh, key, f"realize({what}=...)")
        return tuple((spec.get(n), n in spec) for n in mesh.axis_names)
    return ((spec, False),) * mesh.ndim


def _check_world(mesh: Mesh, world: int) -> None:
    top = (
        mesh.index_size - 1 if mesh.rank_map is None else rank_map_info(mesh.rank_map).max_rank
    )
    if top >= world:
        raise MeshError(
            f"{mesh!r} uses global rank {top}, but the world has only {world} ranks "
            f"(0..{world - 1}); shrink the mesh or launch more processes"
        )


def _world(backend: object) -> World:
    """The default group (started from the torchrun environment if needed); the memo
    is reset when it changed."""
    import torch.distributed as dist

    with _init_lock:
        ensure_default_group(backend if isinstance(backend, str) else None)
    world_pg = dist.group.WORLD
    assert world_pg is not None
    world_backend = str(dist.get_backend())
    if world_backend == "threaded":
        raise MeshError(
            "fmesh.realize() cannot run on torch's threaded test world: every rank is a "
            "thread of one process, but fmesh's memo is per process and its calls are "
            "matched per thread name. Use real processes (torchrun, or the 'fake' "
            "backend via fmesh.init_fake_world for dry runs); "
            "fmesh.device_mesh.init_device_mesh hands threaded worlds to torch."
        )
    with state.lock:
        if state.world is not world_pg:
            if state.world is not None:
                logger.info("fmesh: the default process group changed; memo reset")
            state.reset()
            state.world = world_pg
        state.debug = debug_detail()
        intact = not state.loss.lost
    return World(
        pg=world_pg,
        size=dist.get_world_size(),
        rank=dist.get_rank(),
        backend=world_backend,
        fake=world_backend == "fake",
        eager=getattr(world_pg, "bound_device_id", None) is not None,
        intact=intact,
    )


def _agreeing(mesh: Mesh, world: World) -> Sequence[int]:
    """The ranks that agree (the world less lost ranks); a clear error for a mesh
    that holds a lost rank, or for a rank that was declared lost itself."""
    with state.lock:
        lost, survivors = state.loss.lost, state.loss.survivors
    if survivors is None:
        return range(world.size)
    me = world.rank
    held = sorted(r for r in lost if index_of(mesh, r) is not None)
    if held:
        raise MeshError(
            f"{mesh!r} holds rank(s) {held}, which fmesh.recover() declared lost; "
            "realize a mesh of survivors instead, e.g. "
            "fmesh.shrink(mesh, lost, axis='dp') or fmesh.replace(mesh, {lost: spare})"
        )
    if me in lost:
        raise MeshError(
            f"rank {me} was declared lost by the other ranks' fmesh.recover() (it did "
            "not check in within their timeout); it cannot realize meshes with them "
            "any more: exit and rejoin through a restart"
        )
    return survivors


def _realize(
    mesh: Mesh,
    backend: object,
    options: object,
    timeout: datetime.timedelta | None,
    check: bool,
    stream_name: str,
    key: Hashable | None,
) -> RealizedMesh:
    """Everything but a repeated hit: validate, decide, agree, create."""
    backends_in = _per_axis(backend, mesh, "backend")
    for b, _ in backends_in:
        if b is not None:
            check_backend(b, "realize(backend=...)")
    options_in = _per_axis(options, mesh, "options")
    start = time.perf_counter()
    world = _world(backend)
    _check_world(mesh, world.size)
    ranks = _agreeing(mesh, world)
    me = world.rank
    coord = coordinate(mesh, me)
    with state.lock:
        stream: Stream[RealizedMesh] = state.streams.setdefault(
            stream_name, Stream(stream_name)
        )
        requests = tuple(
            AxisRequest(
                mesh=mesh,
                name=name,
                layout=layout,
                member=coord is not None,
                backend=world.backend if b is None else str(b),
                options=o,
                options_id=state.options_ordinal(o),
                explicit=named,
            )
            for name, layout, (b, named), (o, _) in zip(
                mesh.axis_names, mesh.axes, backends_in, options_in
            )
        )
        code = call_code(
            mesh.axis_names,
            tuple(layout.modes for layout in mesh.axes),
            mesh.index_size,
            rank_map_key(mesh),
            tuple(r.backend for r in requests),
            tuple(r.options_id for r in requests),
        )
        summary = _Summary(mesh, tuple((r.name, r.backend, r.options_id) for r in requests))
        hit = all(r.key in stream.known or r.served_by_world(world) for r in requests)
        agrees = not hit or check or state.debug
        number, history, history_text = stream.number() if agrees else (0, 0, "")
        generation = state.generation

    ticket: _agree.Ticket | None = None
    if agrees and not world.fake and world.size > 1:
        from .._compat import default_store

        where = f"realize call #{number} of thread {stream_name!r}"
        ticket = _agree.agree(
            default_store(),
            rank=me,
            ranks=ranks,
            code=combine(history, code),
            record=lambda: _agree.Record(
                me, combine(history, code), str(summary), history_text
            ),
            timeout=timeout or DEFAULT_CHECK_TIMEOUT,
            prefix=(
                f"{_agree.KEY_ROOT}{generation}/"
                f"{urllib.parse.quote(stream_name, safe='')}/{number}/"
            ),
            where=where,
        )

    groups: dict[str, ProcessGroup] = {}
    created = 0
    for request in requests:
        pg, made = axis_group(request, world, timeout, ticket)
        created += made
        if pg is not None:
            groups[request.name] = pg
    realized = RealizedMesh(
        mesh=mesh,
        rank=me,
        coordinate=coord,
        groups=types.MappingProxyType(groups),
        created=created,
    )
    with state.lock:
        if state.generation == generation:
            stream.known.update(r.key for r in requests)
            if key is not None:
                hit_value = realized if created == 0 else _as_hit(realized)
                stream.calls[key] = (hit_value, code, summary)
            if not agrees:
                stream.hit(code, summary)
    run_realized_hooks(mesh, groups)
    logger.info(
        "fmesh.realize %r on rank %d: %d groups created, %d from memo, %.1f ms",
        mesh,
        me,
        created,
        len(groups) - created,
        (time.perf_counter() - start) * 1e3,
    )
    return realized


def _as_hit(realized: RealizedMesh) -> RealizedMesh:
    """The value a later hit of the same call returns (it creates nothing)."""
    return RealizedMesh(
        mesh=realized.mesh,
        rank=realized.rank,
        coordinate=realized.coordinate,
        groups=realized.groups,
        created=0,
    )


@final
@attrs.frozen(slots=True)
class _Summary:
    """A call in words, made only when a message needs it (a hit must stay cheap)."""

    mesh: Mesh
    axes: tuple[tuple[str, str, int], ...]
    """(axis name, backend, options ordinal) per axis."""

    def __str__(self) -> str:
        backends = {b for _, b, _ in self.axes}
        if len(backends) == 1:
            text = f"{self.mesh!r} on {backends.pop()}"
        else:
            text = f"{self.mesh!r} with backends {dict((n, b) for n, b, _ in self.axes)}"
        if any(o for _, _, o in self.axes):
            text += f" and options #{[o for _, _, o in self.axes]}"
        return text
