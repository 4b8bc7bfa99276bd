"""A realize call, checked and laid out before anything is created.

``checked`` validates the arguments and keys the call in its stream's memo (all a
repeated call needs, ``turns.py``). ``expand`` turns a new call, in its turn, into
what ``creation.py`` carries out: the world it runs in, the ranks that agree, one
request per axis (with its key in the axis memo), the call's code and its number in
the stream (``_protocol/stream.py``), and whether it agrees with every rank.
"""

from __future__ import annotations

import datetime
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, final

import attrs

from .._core.axes import axis_position
from .._core.errors import MeshError
from .._core.mesh import Mesh, require_mesh
from .._core.queries import index_of, placement
from .._core.rank_map import rank_map_info, rank_map_key
from .._protocol.stream import Turn, call_code, current_stream
from .checks import check_backend, check_timeout
from .groups import AxisRequest
from .launch import World, current_world, serves
from .memo import state

if TYPE_CHECKING:
    from .memo import StreamState

__all__ = ["Arguments", "Call", "Summary", "checked", "expand"]


@final
@attrs.frozen(slots=True)
class Arguments:
    """A realize call's arguments, checked, with its key in the stream's memo."""

    mesh: Mesh
    backend: object
    options: object
    timeout: datetime.timedelta | None
    check: bool
    stream_name: str
    """The call's stream (``_protocol/stream.py``): calls are matched across ranks
    stream by stream, in the order each rank makes them."""
    key: Hashable | None
    """What identifies the call in its stream's memo (``None``: not memoizable)."""
    lenient: bool = False
    """Made for torch's API (the drop-in, torch's DeviceMesh methods on fmesh's
    meshes): the ranks agree on what determines the groups only, neither on the axis
    names nor on the memo hits before (``Turn.lenient``); ``realize`` is strict."""


def checked(
    mesh: Mesh,
    backend: object,
    options: object,
    timeout: datetime.timedelta | None,
    check: bool,
    lenient: bool = False,
) -> Arguments:
    """The arguments of ``realize`` checked (only what a repeated call needs)."""
    require_mesh(mesh, "realize")
    if timeout is not None:
        check_timeout(timeout, "realize")
    key: Hashable | None
    try:
        memo_backend = backend
        memo_options = options
        if isinstance(backend, Mapping):
            memo_backend = tuple(sorted(backend.items(), key=lambda kv: str(kv[0])))
        if isinstance(options, Mapping):
            memo_options = tuple(sorted(options.items(), key=lambda kv: str(kv[0])))
        # A repeat replays its code into the history: strict and lenient calls of
        # the same mesh are other entries.
        key = (mesh, memo_backend, memo_options, timeout, lenient)
        hash(key)
    except TypeError:
        key = None
    return Arguments(mesh, backend, options, timeout, check, current_stream(), key, lenient)


@final
@attrs.frozen(slots=True)
class Call:
    """A new realize call, laid out: what ``realize`` agrees on and creates."""

    args: Arguments
    world: World
    ranks: Sequence[int]
    """The ranks that agree: the world less the ranks declared lost."""
    coordinate: tuple[int, ...] | None
    """This rank's coordinate (``None``: not in the mesh)."""
    requests: tuple[AxisRequest, ...]
    code: int
    """The call's code, equal on every rank that makes the same call."""
    summary: Summary
    stream: StreamState
    """This process's side of the call's stream (``memo.py``)."""
    turn: Turn
    """The call's number and history in its stream (number 0: agrees with nobody)."""
    agrees: bool
    """The call agrees with every rank before creating anything."""
    generation: int
    """The memo generation the call was laid out in."""


def expand(args: Arguments) -> Call:
    """Lay out a call that is not a repeat: check the per-axis arguments, start (or
    find) the world and check the mesh against it, make one request per axis, code
    the call and take its turn in the stream."""
    mesh = args.mesh
    axis_args = _per_axis(mesh, args.backend, args.options)
    world = current_world(args.backend)
    top = (
        mesh.index_size - 1 if mesh.rank_map is None else rank_map_info(mesh.rank_map).max_rank
    )
    if top >= world.size:
        raise MeshError(
            f"{mesh!r} uses global rank {top}, but the world has only {world.size} ranks "
            f"(0..{world.size - 1}); shrink the mesh or launch more processes"
        )
    with state.lock:
        lost, survivors = state.loss.lost, state.loss.survivors
    ranks: Sequence[int] = range(world.size) if survivors is None else survivors
    if survivors is not None:
        held = sorted(r for r in lost if index_of(mesh, r) is not None)
        if held:
            raise MeshError(
                f"{mesh!r} holds rank(s) {held}, which fmesh.recover() declared lost; "
                "realize a mesh of survivors instead, e.g. "
                "fmesh.shrink(mesh, lost, axis='dp') or fmesh.replace(mesh, {lost: spare})"
            )
        if world.rank in lost:
            raise MeshError(
                f"rank {world.rank} was declared lost by the other ranks' fmesh.recover() "
                "(it did not check in within their timeout); it cannot realize meshes "
                "with them any more: exit and rejoin through a restart"
            )
    backends = tuple(world.backend if b is None else str(b) for b, _ in axis_args[0])
    served = tuple(
        serves(world, mesh, layout, b, o) and args.timeout is None
        for layout, b, (o, _) in zip(mesh.axes, backends, axis_args[1])
    )
    # The axes the default group serves need no group: their members are not listed.
    coord, ranks_per_axis = placement(mesh, world.rank, tuple(not s for s in served))
    rank_map = rank_map_key(mesh)
    from .._compat import live_groups

    live = live_groups()
    with state.lock:
        stream = state.stream(args.stream_name)
        ids = [state.options_id(o, args.timeout) for o, _ in axis_args[1]]
        requests = tuple(
            AxisRequest(
                mesh=mesh,
                name=name,
                layout=layout,
                member=coord is not None,
                backend=b,
                options=o,
                options_id=oid,
                explicit=named,
                ranks=members,
                key=(layout, mesh.index_size, rank_map, b, oid),
                timeout=args.timeout,
                served=s,
            )
            for name, layout, b, (_, named), (o, _), oid, members, s in zip(
                mesh.axis_names, mesh.axes, backends, *axis_args, ids, ranks_per_axis, served
            )
        )
        # A group destroyed or aborted since is forgotten: its axis is new again.
        state.forget_dead(live, (r.key for r in requests))
        # What determines the groups; a strict call's code names the axes too.
        groups = (
            tuple(layout.modes for layout in mesh.axes),
            mesh.index_size,
            rank_map,
            tuple(r.backend for r in requests),
            tuple(r.options_id for r in requests),
        )
        code = call_code(*groups) if args.lenient else call_code(mesh.axis_names, *groups)
        summary = Summary(
            mesh,
            tuple((r.name, r.backend, r.options_id if r.options else 0) for r in requests),
            args.timeout,
        )
        hit = all(r.key in stream.known or s for r, s in zip(requests, served))
        # Debug mode makes fmesh's own hits agree, not torch's: torch's hits talk to
        # no peer either.
        agrees = not hit or args.check or (state.debug and not args.lenient)
        turn = stream.stream.turn(
            code, summary, agrees, lenient=args.lenient, names=call_code(mesh.axis_names)
        )
        generation = state.generation
    return Call(
        args, world, ranks, coord, requests, code, summary, stream, turn, agrees, generation
    )


PerAxis = tuple[tuple[object, bool], ...]
"""Per axis: (the value for the axis, whether the axis was named in a mapping)."""


def _per_axis(mesh: Mesh, backend: object, options: object) -> tuple[PerAxis, PerAxis]:
    """The backend and options per axis (each given globally or as a mapping from
    axis name); the backends checked."""
    out: list[PerAxis] = []
    for spec, what in ((backend, "backend"), (options, "options")):
        if isinstance(spec, Mapping):
            for key in spec:
                axis_position(mesh, key, f"realize({what}=...)")
            out.append(tuple((spec.get(n), n in spec) for n in mesh.axis_names))
        else:
            out.append(((spec, False),) * mesh.ndim)
        if what == "backend":
            for b, _ in out[0]:
                if b is not None:
                    check_backend(b, "realize(backend=...)")
    return out[0], out[1]


@final
@attrs.frozen(slots=True)
class Summary:
    """A call in words, made only when a message needs it (a hit must stay cheap)."""

    mesh: Mesh
    axes: tuple[tuple[str, str, int], ...]
    """(axis name, backend, options ordinal or 0 without options) per axis."""
    timeout: datetime.timedelta | None = None

    def __str__(self) -> str:
        backends = {b for _, b, _ in self.axes}
        if len(backends) == 1:
            text = f"{self.mesh!r} on {backends.pop()}"
        else:
            text = f"{self.mesh!r} with backends {dict((n, b) for n, b, _ in self.axes)}"
        if any(o for _, _, o in self.axes):
            text += f" and options #{[o for _, _, o in self.axes]}"
        if self.timeout is not None:
            text += f", timeout {self.timeout}"
        return text
