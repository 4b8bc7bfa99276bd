"""A new realize call carried out: agreed, this rank's groups made, all or none.

A call laid out by ``call.py`` that creates groups puts its record in first
(``_protocol/agreement.py``: one ``compare_set``, which finds a rank that makes
another call at once); then each axis's group comes from the axis memo or is created
once per process (``groups.py``: a thread that finds another creating the same group
waits for it), while the call's watch (``_protocol/watch.py``) cuts the waits short if
a peer dies or the call fails elsewhere; the call ends at the closing round, where
every rank learns that every rank made the same call and its groups. A call whose
creation is a collective of the whole world (NCCL's split) runs that round before
creating instead. A call that fails keeps none of the groups it made. The protocol:
``docs/design/agreement-protocol.md``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .._core.errors import PeerLostError
from .._protocol import liveness
from .._protocol.agreement import open_call
from .._protocol.records import KEY_ROOT, Entry, Record, Ticket
from .groups import axis_group, collective
from .hooks import run_creating_call_hooks
from .memo import state

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.distributed import ProcessGroup

    from .call import Call

__all__ = ["create_groups"]

logger = logging.getLogger("fmesh")


def create_groups(
    call: Call, meanwhile: Callable[[dict[str, ProcessGroup], int], object] | None = None
) -> tuple[dict[str, ProcessGroup], int]:
    """Carry out ``call``: put its record in if it creates groups, then this rank's
    group along every axis under the call's watch, and the closing round. Returns
    (axis name -> group, how many groups it created); on failure, forgets and destroys
    the groups it created, and raises. ``meanwhile(groups, created)`` runs once the
    groups exist, before the closing round's wait where there is one (what it makes
    is dropped if the call then fails)."""
    from .._compat import default_timeout

    world, timeout = call.world, call.args.timeout
    # Without a timeout, a late rank is waited for as long as torch's ``new_group``
    # would: its default for the backend (the longest of the call's backends).
    backends = {r.backend for r in call.requests} or {world.backend}
    patience = timeout or max(default_timeout(b) for b in backends)
    ticket = _open(call)
    groups: dict[str, ProcessGroup] = {}
    made: list[ProcessGroup] = []

    def then() -> None:
        if meanwhile is not None:
            meanwhile(groups, len(made))

    if ticket is None:
        _create(call, None, groups, made)
        then()
        return groups, len(made)
    first = any(collective(r, world) for r in call.requests)
    with liveness.watching(ticket, patience, timeout) as watch:
        try:
            if watch is not None and first:  # agree before a world-wide collective
                watch.finish(patience)
            _create(call, ticket, groups, made)
            if watch is not None and not first:
                # Every peer's creation of each group is bounded by the timeout, and a
                # peer that fails or dies says so at once: wait for the slowest.
                watch.finish(patience * (len(call.requests) + 1), then)
            else:
                then()
        except BaseException as err:
            if watch is not None and not isinstance(err, PeerLostError):
                watch.fail(err)
            _forget(made)
            raise
    return groups, len(made)


def _create(
    call: Call,
    ticket: Ticket | None,
    groups: dict[str, ProcessGroup],
    made: list[ProcessGroup],
) -> None:
    for request in call.requests:
        pg, fresh = axis_group(request, call.world, ticket)
        if fresh and pg is not None:
            made.append(pg)
        if pg is not None:
            groups[request.name] = pg


def _open(call: Call) -> Ticket | None:
    """Put this rank's record of ``call`` in if it creates groups (``fmesh plan``'s
    hooks see every such call, fake worlds included); ``None`` if nobody needs to."""
    if not call.agrees:
        return None
    turn, summary, world = call.turn, call.summary, call.world
    run_creating_call_hooks(turn.number, turn.code, summary, turn.history)
    if world.fake or world.size <= 1:
        return None
    from .._compat import default_store

    me = world.rank
    store = default_store()
    if len(call.ranks) > 1 and liveness.enabled():  # its port open, its address out
        liveness.prepare(store, me)
    root = f"{KEY_ROOT}{call.generation}/"
    return open_call(
        store,
        rank=me,
        ranks=call.ranks,
        # The drop-in's calls compare the axis names apart: torch lets them differ.
        entry=Entry(
            turn.number,
            turn.code,
            me,
            ",".join(call.args.mesh.axis_names) if turn.lenient else "",
        ),
        record=lambda: Record(me, turn.code, str(summary), turn.history),
        stream=root + turn.key.split("/")[0] + "/",
        prefix=root + turn.key,
        where=turn.where,
    )


def _forget(made: list[ProcessGroup]) -> None:
    """A failed call keeps none of the groups it made: out of the memo, destroyed."""
    if not made:
        return
    import torch.distributed as dist

    ids = {id(pg) for pg in made}
    with state.lock:
        for key, pg in list(state.group_memo.items()):
            if id(pg) in ids:
                del state.group_memo[key]
        for axis, value in list(state.axis_memo.items()):
            if value is not None and id(value) in ids:
                del state.axis_memo[axis]
        state.created_pgs[:] = [pg for pg in state.created_pgs if id(pg) not in ids]
        state.created -= len(made)
    for pg in made:
        try:
            dist.destroy_process_group(pg)
        except (RuntimeError, ValueError) as err:  # already gone
            logger.debug("fmesh: destroying a group of a failed call: %s", err)
