"""A realize call's turn in its stream, on this process: repeats served, the rest in order.

A repeated call is a *hit*: its value comes from the stream's table of calls, if torch
still holds its groups (no peer, no store; O(number of axes)). Any other call waits
for its *turn*: the calls of one stream that are not repeats are carried out one at a
time, in the order they started, so which calls are hits and what the next agreement
carries depend only on that order (``_protocol/stream.py`` numbers them alike on every
rank).
A call queued behind one that failed to agree fails with it; a nested call of the
thread carrying one out (a hook) goes on. A call carried out is kept in the table for
the fast repeat when its turn ends well (``remember``). The tables live in ``memo.py``
(``StreamState``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import attrs

from .._compat import live_groups
from .._core.errors import MeshMismatchError
from .._protocol.stream import stream_words
from .bounded import bound
from .memo import state

if TYPE_CHECKING:
    from .call import Arguments, Call
    from .memo import StreamState
    from .realized_mesh import RealizedMesh

__all__ = ["Slot", "doomed_by", "enter", "leave", "ready", "remember", "replay", "turn"]


@attrs.define(slots=True)
class Slot:
    """A call's turn, as the block of ``turn`` sees it."""

    repeat: RealizedMesh | None
    """A repeat's value: the block returns it and carries nothing out."""
    kept: tuple[Call, RealizedMesh] | None = None
    """What the block carried out, set by the block: kept for the fast repeat
    (``remember``) when the block ends well."""


@contextlib.contextmanager
def turn(args: Arguments) -> Iterator[Slot]:
    """A repeat's value (a hit, without waiting), else the call's turn in its stream
    once it has come (or a repeat's value if another thread made the same call
    meanwhile): the block then carries the call out, sets ``Slot.kept``, and the next
    call goes after it. What the block carried out is kept for the fast repeat when it
    ends well; a ``MeshMismatchError`` out of it dooms the calls queued behind it."""
    repeat = replay(args)
    if repeat is not None:
        yield Slot(repeat)
        return
    me = threading.get_ident()
    name = args.stream_name
    with state.lock:
        stream = state.stream(name)
        nested = stream.holder == me
        if not nested:
            ticket = enter(stream)
            state.turns.wait_for(lambda: ready(stream, ticket))
            stream.holder = me
            doomed = doomed_by(stream, ticket)
            if doomed:
                leave(stream, ticket)
                state.turns.notify_all()
    if nested:
        slot = Slot(replay(args))
        yield slot
        if slot.kept is not None:
            remember(*slot.kept)
        return
    if doomed:
        raise MeshMismatchError(
            f"this realize call{stream_words(name)} was waiting for its turn behind one "
            f"that failed ({doomed}), so it cannot be matched across ranks either. If "
            "threads of this process realize meshes at the same time, their order can "
            "differ between ranks: give each thread's calls a stream of their own, "
            "with fmesh.stream(name), the same name on every rank"
        )
    failure = ""
    try:
        # Another thread may have made the same call while this one waited its turn.
        slot = Slot(replay(args))
        yield slot
        if slot.kept is not None:
            remember(*slot.kept)
    except MeshMismatchError as err:
        failure = str(err).split(";")[0][:200]
        raise
    finally:
        with state.lock:
            leave(stream, ticket, failure)
            state.turns.notify_all()


# -- a stream's queue of calls that are not repeats, under the lock -----------------------


def enter(stream: StreamState) -> int:
    """A ticket for a call that is not a repeat: it waits for ``ready``."""
    stream.queued += 1
    return stream.queued


def ready(stream: StreamState, ticket: int) -> bool:
    return stream.served == ticket - 1


def doomed_by(stream: StreamState, ticket: int) -> str:
    """Why a call queued behind a failed one fails with it ("" if it does not)."""
    return stream.failure if ticket <= stream.doomed_through else ""


def leave(stream: StreamState, ticket: int, failure: str = "") -> None:
    """The call of ``ticket`` is done; a ``failure`` dooms the calls queued behind it
    (ranks whose calls raced into other orders raise together)."""
    stream.served = ticket
    stream.holder = None
    if failure and stream.queued > ticket:
        stream.doomed_through, stream.failure = stream.queued, failure


def replay(args: Arguments) -> RealizedMesh | None:
    """A repeated call's value if torch still holds its groups, recorded as a hit in
    its stream; else ``None``."""
    if args.key is None or args.check or state.world is None:
        return None
    import torch.distributed as dist

    with state.lock:
        stream = state.streams.get(args.stream_name)
        if stream is None or state.debug or state.world is not dist.group.WORLD:
            return None
        entry = stream.calls.get(args.key)
        if entry is None:
            return None
        realized, code, summary = entry
        live = live_groups()
        if not all(pg in live for pg in realized.groups.values()):
            return None
        stream.calls.move_to_end(args.key)
        if not args.lenient:  # torch's hits join no history (``Turn.lenient``)
            stream.stream.hit(code, summary)
        state.reused += args.mesh.ndim
        return realized


def remember(call: Call, realized: RealizedMesh) -> None:
    """Keep a call carried out in its stream: its axes are realized there, and a
    repeat of it returns ``realized`` (as creating nothing), dropping the least
    recently used call beyond the bound. Not after a reset or a recovery."""
    with state.lock:
        if state.generation != call.generation:
            return
        stream = call.stream
        stream.known.update(r.key for r in call.requests)
        key = call.args.key
        if key is not None:
            value = realized if realized.created == 0 else attrs.evolve(realized, created=0)
            stream.calls[key] = (value, call.code, call.summary)
            stream.calls.move_to_end(key)
            bound(stream.calls)
