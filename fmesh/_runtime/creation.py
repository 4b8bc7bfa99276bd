"""A new realize call carried out: agreed, then this rank's groups made, all or none.

A call laid out by ``call.py`` that creates groups first agrees with every rank
(``_protocol/agreement.py``); then each axis's group comes from the axis memo or is
created once per process (``groups.py``: a thread that finds another creating the same
group waits for it), while the peer watch (``_protocol/liveness.py``) cuts the waits
short if a peer dies; the call ends at the watch's closing barrier. A call that fails
keeps none of the groups it made. The protocol: ``docs/design/agreement-protocol.md``.
"""

from __future__ import annotations

import datetime
import logging
from typing import TYPE_CHECKING

from .._core.errors import PeerLostError
from .._protocol import liveness
from .._protocol.agreement import KEY_ROOT, Record, Ticket, agree
from .groups import axis_group
from .hooks import run_creating_call_hooks
from .memo import state

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from .call import Call

__all__ = ["create_groups"]

logger = logging.getLogger("fmesh")


def create_groups(call: Call) -> tuple[dict[str, ProcessGroup], int]:
    """Carry out ``call``: agree if it creates groups, then this rank's group along
    every axis under the peer watch, waiting at the end for every rank to have made
    its own. Returns (axis name -> group, how many groups it created); on failure,
    forgets and destroys the groups it created, and raises."""
    from .._compat import default_timeout

    world, timeout = call.world, call.args.timeout
    # Without a timeout, a late rank is waited for as long as torch's ``new_group``
    # would: its default for the backend (the longest of the call's backends).
    backends = {r.backend for r in call.requests} or {world.backend}
    patience = timeout or max(default_timeout(b) for b in backends)
    ticket = _agree(call, patience)
    groups: dict[str, ProcessGroup] = {}
    made: list[ProcessGroup] = []
    watch = None
    try:
        with liveness.watching(ticket, timeout) as watch:
            for request in call.requests:
                pg, fresh = axis_group(request, world, ticket)
                if fresh and pg is not None:
                    made.append(pg)
                if pg is not None:
                    groups[request.name] = pg
            if watch is not None:
                # Every peer's creation of each group is bounded by the timeout, and a
                # peer that fails or dies says so at once: wait for the slowest.
                watch.finish(patience * (len(call.requests) + 1))
    except BaseException as err:
        if watch is not None:
            if not isinstance(err, PeerLostError):
                watch.fail(err)
            watch.close()
        _forget(made)
        raise
    if watch is not None:
        watch.close()
    return groups, len(made)


def _agree(call: Call, timeout: datetime.timedelta) -> Ticket | None:
    """Agree on ``call`` with every rank if it creates groups (``fmesh plan``'s hooks
    see every such call, fake worlds included); ``None`` if nobody needs to."""
    if not call.agrees:
        return None
    turn, summary, world = call.turn, call.summary, call.world
    run_creating_call_hooks(turn.number, turn.code, summary, turn.history)
    if world.fake or world.size <= 1:
        return None
    from .._compat import default_store

    me = world.rank
    store = default_store()
    watched = len(call.ranks) > 1 and liveness.enabled()
    if watched:  # this rank's sentinel runs, its address published
        liveness.prepare(store, me)
    ticket = agree(
        store,
        rank=me,
        ranks=call.ranks,
        code=turn.code,
        record=lambda: Record(me, turn.code, str(summary), turn.history),
        timeout=timeout,
        prefix=f"{KEY_ROOT}{call.generation}/{turn.key}",
        where=turn.where,
        closing=watched,
    )
    liveness.after_agreement(ticket)
    return ticket


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
