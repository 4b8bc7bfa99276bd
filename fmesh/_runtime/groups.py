"""Creating this rank's group along one axis of a realize call (``creation.py`` goes
through the call's axes and keeps what is made).

Each group is created once per process, with its ranks in coordinate order; how NCCL,
gloo and size-1 axes are made: ``docs/design/agreement-protocol.md``. Nothing here
holds the process lock while waiting on peers.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import logging
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, final

import attrs

from .._core.errors import MeshMismatchError
from .._core.layout import Layout
from .._core.mesh import Mesh
from .._core.rank_map import rank_map_info
from .._protocol import agreement as _agree
from .._protocol import liveness
from .._protocol.records import Ticket
from .._protocol.stream import ranks_digest
from .launch import World
from .memo import GroupKey, state

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


__all__ = ["AxisRequest", "axis_group", "describing_groups"]

logger = logging.getLogger("fmesh")

_describe: contextvars.ContextVar[Callable[[str], str] | None] = contextvars.ContextVar(
    "fmesh_group_desc", default=None
)


@contextlib.contextmanager
def describing_groups(describe: Callable[[str], str]) -> Iterator[None]:
    """Groups created inside (in this thread) get ``describe(axis name)`` as their
    ``group_desc``, instead of ``fmesh:<axis>``: the caller's own naming (the DeviceMesh
    interop passes torch's ``mesh_<dim>``). A group the memo already holds keeps the
    description of the call that created it."""
    token = _describe.set(describe)
    try:
        yield
    finally:
        _describe.reset(token)


def _desc(axis: str) -> str:
    describe = _describe.get()
    return f"fmesh:{axis}" if describe is None else describe(axis)


@final
@attrs.frozen(slots=True)
class AxisRequest:
    """One axis of a realize call, as this rank needs it."""

    mesh: Mesh
    name: str
    layout: Layout
    member: bool
    """This rank is in the mesh (so it has a group along the axis)."""
    backend: str
    options: object
    options_id: int
    explicit: bool
    """The backend was named for this axis (per-axis mapping), not inherited."""
    ranks: tuple[int, ...]
    """This rank's group along the axis in coordinate order; off the mesh, the group at
    the mesh's first index (a non-member's part in a world-wide split); ``()`` where
    the default group serves the axis."""
    key: Hashable
    """The axis memo's key, the same on every rank that realizes the axis: (layout,
    index space size, rank-map digest, backend, options id); ``call.py`` lays it out."""
    timeout: datetime.timedelta | None = None
    """The call's timeout: a group made with one is not the default group (and its
    ``options_id`` tells it from groups made without, see ``call.py``)."""
    served: bool = False
    """The default group is this axis's group on every rank (no timeout of the call's
    own, ``launch.serves``): no second communicator."""

    @property
    def members(self) -> tuple[int, ...] | None:
        """This rank's group in coordinate order; ``None`` off the mesh."""
        return self.ranks if self.member else None


# -- one axis ------------------------------------------------------------------------------


def collective(request: AxisRequest, world: World) -> bool:
    """Whether every rank of the world takes part in creating ``request``'s groups.

    With an eagerly initialized NCCL world, torch makes every NCCL group by splitting
    the world communicator, a collective over all ranks; other axes are made by their
    members alone. After a loss the world holds dead ranks: groups are made by their
    members. Every rank decides this alike."""
    backend = _size_one_backend(request, world)[0]
    return (
        world.eager
        and world.intact
        and "nccl" in backend
        and request.layout.size > 1
        and not world.fake
        and not (request.member and request.served)
    )


def _size_one_backend(request: AxisRequest, world: World) -> tuple[str, object, int]:
    """A size-1 axis needs no communicator: a one-member gloo (fake) group, unless
    the user named a backend for this very axis."""
    if request.layout.size > 1 or request.explicit:
        return request.backend, request.options, request.options_id
    return ("fake" if world.fake else "gloo"), None, 0


def axis_group(
    request: AxisRequest, world: World, ticket: Ticket | None
) -> tuple[ProcessGroup | None, int]:
    """This rank's group along one axis: from the axis memo, else created once per
    process (a thread that finds another creating it waits for that creation, then
    looks again). Returns (group, 1 if this call created it else 0)."""
    key = request.key
    while True:
        with state.lock:
            if key in state.axis_memo:
                state.reused += 1
                return state.axis_memo[key], 0
            event = state.in_flight.get(key)
            mine = event is None
            if event is None:
                event = state.in_flight[key] = threading.Event()
        if mine:
            break
        event.wait()
    try:
        pg, made = _create(request, world, ticket)
        with state.lock:
            state.axis_memo[key] = pg
            if made:
                assert pg is not None
                state.created_pgs.append(pg)
                state.created += 1
            else:
                state.reused += 1
        return pg, made
    finally:
        with state.lock:
            del state.in_flight[key]
        event.set()


def _create(
    request: AxisRequest, world: World, ticket: Ticket | None
) -> tuple[ProcessGroup | None, int]:
    """Make (or find) this rank's group along one axis; returns (group, 1 if created
    else 0). The caller keeps it in the axis memo (``axis_group``)."""
    from .._compat import default_timeout

    if request.member and request.served:
        # The whole world in rank order is the default group: no second communicator.
        # Every rank is a member, so every rank decides this alike (no collective).
        return world.pg, 0
    backend, options, options_id = _size_one_backend(request, world)
    members = request.members
    world_collective = collective(request, world)
    group_key = None if members is None else (members, backend, options_id)
    if group_key is not None and not world_collective:
        from .._compat import is_live

        with state.lock:
            pg = state.group_memo.get(group_key)
            if pg is not None and not is_live(pg):  # destroyed or aborted: make anew
                state.forget_groups({id(pg): pg})
                pg = None
        if pg is not None:
            return pg, 0
    desc = _desc(request.name)
    timeout = request.timeout
    wait = timeout if timeout is not None else default_timeout(backend)
    if world_collective:
        pg = _split(request, world, backend, options, options_id, timeout, wait, desc)
    elif group_key is not None and (shrunk := _shrunk(group_key)) is not None:
        pg = shrunk
    elif members is not None:
        pg = _new_group(
            request.name, members, world.rank, backend, options, options_id, wait, desc, ticket
        )
    else:
        pg = None
    if pg is None or members is None or group_key is None:
        return None, 0
    with state.lock:
        state.group_memo[group_key] = pg
    logger.debug(
        "fmesh: created group %s of %d ranks %s (%s)",
        desc,
        len(members),
        list(members) if len(members) <= 16 else f"[{members[0]}, ..., {members[-1]}]",
        backend,
    )
    return pg, 1


def _shrunk(key: GroupKey) -> ProcessGroup | None:
    """After a loss, on NCCL: the group shrunk from a retired one whose survivors are
    exactly ``key``'s members, in the same order (no new rendezvous); else ``None``.
    Every member finds the same retired group: retirement is the same on survivors."""
    from .._compat import shrink_from

    members, backend, options_id = key
    if "nccl" not in backend:
        return None
    with state.lock:
        lost = state.loss.lost
        found = [
            (old, pg)
            for old, pg in state.loss.retired.items()
            if old[1:] == (backend, options_id)
            and tuple(r for r in old[0] if r not in lost) == members
        ]
    for (old_members, _, _), pg in sorted(found, key=lambda item: item[0][0]):
        exclude = [i for i, r in enumerate(old_members) if r in lost]
        shrunk = shrink_from(pg, exclude)
        if shrunk is not None:
            return shrunk
    return None


def _group_name(
    ranks: tuple[int, ...], backend: str, options_id: int, call: str | None = None
) -> str:
    """The group's name, which is also its rendezvous keys' prefix in the store. Under
    an agreed call it names the call too (every member makes the same call): a call
    that failed may have left a member's address under the name (a peer that saw the
    failure first never connected), and the next attempt must not read it."""
    parts = (backend, options_id) if call is None else (backend, options_id, call)
    name = f"fmesh_g{state.generation}_{ranks_digest(ranks, *parts)[:20]}"
    # A group made again after the first died gets a name (and rendezvous keys) of its
    # own; every member forgot the dead one alike.
    again = state.reborn.get((ranks, backend, options_id), 0)
    return f"{name}_{again}" if again else name


def _new_group(
    axis: str,
    ranks: tuple[int, ...],
    me: int,
    backend: str,
    options: object,
    options_id: int,
    timeout: datetime.timedelta,
    desc: str,
    ticket: Ticket | None,
) -> ProcessGroup | None:
    """Create one group with ranks in coordinate order, explaining failures."""
    from .._compat import default_store, memory_store, new_named_group

    name = _group_name(ranks, backend, options_id, None if ticket is None else ticket.prefix)
    try:
        if len(ranks) == 1:
            # A group of one meets nobody: rendezvous in a store of its own, in memory.
            return new_named_group(
                ranks, me, backend, options, timeout, name, desc, memory_store()
            )
        if ticket is None:
            return new_named_group(ranks, me, backend, options, timeout, name, desc, None)
        # The rendezvous waits in the store, each thread on a connection of its own;
        # under the call's watch its waits are sliced in this thread and end when the
        # call is given up (gloo's pairs then connect in native code that nothing
        # cancels): _protocol/liveness.creating.
        return liveness.creating(
            backend,
            default_store(),
            lambda store: new_named_group(
                ranks, me, backend, options, timeout, name, desc, store
            ),
        )
    except Exception as err:  # a peer that never joins shows up as a store timeout
        if ticket is None:
            raise
        watch = liveness.current()
        found = (
            None if watch is None else watch.error(f"creating the group {list(ranks)}", err)
        )
        if found is not None:
            raise found from err
        gave_up = _agree.give_up(
            ticket,
            f"it could not create the group {list(ranks)}: {err}",
            among=ranks,
            grace=min(timeout.total_seconds(), 5.0),
        )
        others = [r for r in ranks if r != me]
        why = (
            "; ".join(f"rank {r} gave up: {m}" for r, m in sorted(gave_up.items()))
            if gave_up
            else f"no other member reported a failure, so one of ranks {others} died or "
            "is stuck"
        )
        raise MeshMismatchError(
            f"creating the group {list(ranks)} of axis {axis!r} failed on rank {me} after "
            f"every rank made its record of {ticket.where} ({ticket.summary}): {why} "
            f"(torch said: {err})"
        ) from err


def _split(
    request: AxisRequest,
    world: World,
    backend: str,
    options: object,
    options_id: int,
    timeout: datetime.timedelta | None,
    wait: datetime.timedelta,
    desc: str,
) -> ProcessGroup | None:
    """World-collective creation from the eagerly initialized NCCL world group.

    Every rank of the world calls this once per axis (non-members pass a group they
    are not in, which makes them take part in the split without joining).
    """
    from .._compat import new_named_group, split_from_world

    mesh = request.mesh
    some = request.ranks
    increasing = mesh.rank_map is None or rank_map_info(mesh.rank_map).is_increasing
    if request.layout.is_ascending and increasing:
        return split_from_world(some, backend, options, timeout, desc)
    # split_group sorts ranks; keep coordinate order with torch's own split-from-world
    # constructor, which every rank of the world enters once.
    name = _group_name(some, backend, options_id)
    return new_named_group(some, world.rank, backend, options, wait, name, desc, None)
