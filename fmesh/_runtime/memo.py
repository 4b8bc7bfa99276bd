"""The process-wide memo: groups, axes and streams, and the lock discipline around it.

One ``State`` per process: what every step of a realize call reads and writes
(``turns.py`` the streams, ``call.py`` the options ids and dead groups,
``creation.py`` the axis and group memos), and what ``destroy``, ``recover`` and
``cache_stats`` reset or count. Its lock guards only dictionary updates: nothing
holds it while waiting on peers (group creation, the cross-rank agreement), so
``cache_stats()``, ``destroy()`` and realize calls from other threads stay
responsive. A group being created by one thread is marked *in flight*
(``in_flight``); another thread that needs the same group waits for that creation
instead of making it twice.

A group torch no longer holds (destroyed, aborted) is forgotten when a call meets it
(``State.forget_dead``); the next call that needs it creates a fresh one.
"""

from __future__ import annotations

import collections
import datetime
import logging
import threading
from collections.abc import Container, Hashable, Iterable
from typing import TYPE_CHECKING

import attrs

# Re-exported for the DeviceMesh interop (its imports name this module).
from .._core.rank_map import WorldKey as WorldKey
from .._core.rank_map import world_key as world_key
from .._protocol import agreement, arrivals, connections, ring
from .._protocol.stream import Stream
from .hooks import run_dead_hooks, run_loss_hooks, run_reset_hooks
from .loss import GroupKey, Loss

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from .realized_mesh import RealizedMesh

__all__ = [
    "GroupKey",
    "State",
    "StreamState",
    "WorldKey",
    "state",
    "world_key",
]

logger = logging.getLogger("fmesh")


@attrs.define
class StreamState:
    """What this process keeps per stream: the numbering every rank computes alike
    (``stream``), the axes and calls realized in it, and its calls that are not
    repeats, carried out one at a time in the order they started (``turns.py``):
    which calls are hits and what the next agreement carries then depend
    only on that order, never on how threads interleave inside a call. Under the lock.
    """

    stream: Stream
    known: set[Hashable] = attrs.field(factory=set)
    """Axis keys realized in this stream."""
    calls: collections.OrderedDict[Hashable, tuple[RealizedMesh, int, object]] = attrs.field(
        factory=collections.OrderedDict
    )
    """Call key -> (what a hit returns, call code, summary) of recent calls, least
    recently used first (``bounded.py``); a summary is anything whose ``str``
    describes the call (made only for messages). Dropping one never changes whether
    a call is a hit: ``known`` decides that, alike on every rank; a dropped call is
    only laid out again (microseconds)."""
    queued: int = 0
    """Tickets handed out to calls that are not repeats (``turns.enter``)."""
    served: int = 0
    """The last ticket whose call is done: ticket ``served + 1`` goes next."""
    holder: int | None = None
    """The thread carrying out a call now (a nested call in it does not queue)."""
    doomed_through: int = 0
    """Tickets up to this one were queued behind a call that failed: they fail too."""
    failure: str = ""


_timeout_tags: dict[tuple[int, datetime.timedelta], object] = {}


@attrs.define
class State:
    """Everything fmesh holds per process (reset by ``destroy``)."""

    lock: threading.Lock = attrs.field(factory=threading.Lock)
    turns: threading.Condition = attrs.field(
        default=attrs.Factory(lambda self: threading.Condition(self.lock), takes_self=True)
    )
    """Signalled (under ``lock``) when a stream's call is done (``turns.leave``)."""
    world: object | None = None
    """The default group the memo belongs to."""
    generation: int = 0
    axis_memo: dict[Hashable, ProcessGroup | None] = attrs.field(factory=dict)
    group_memo: dict[GroupKey, ProcessGroup] = attrs.field(factory=dict)
    """(members in coordinate order, backend, options ordinal) -> group."""
    in_flight: dict[Hashable, threading.Event] = attrs.field(factory=dict)
    created_pgs: list[ProcessGroup] = attrs.field(factory=list)
    options_ids: dict[int, tuple[object, int]] = attrs.field(factory=dict)
    streams: dict[str, StreamState] = attrs.field(factory=dict)
    """Per stream: its numbering, the calls made and waiting (``StreamState``)."""
    reborn: dict[GroupKey, int] = attrs.field(factory=dict)
    """Groups forgotten dead and created again: how many times (in their names)."""
    debug: bool = False
    """torch's ``TORCH_DISTRIBUTED_DEBUG=DETAIL``: every call agrees."""
    loss: Loss = attrs.field(factory=Loss)
    """Ranks lost so far and the groups retired with them (``loss.py``)."""
    created: int = 0
    reused: int = 0

    def reset(self) -> None:
        self.loss = Loss()
        self.streams.clear()
        self.reborn.clear()
        self.axis_memo.clear()
        self.group_memo.clear()
        self.created_pgs.clear()
        self.options_ids.clear()
        self.generation += 1
        connections.forget_connections()  # the protocol's caches of the old world
        ring.forget_addresses()
        agreement.forget_streams()
        arrivals.forget_pending()
        run_reset_hooks()

    def forget_lost(self, lost: frozenset[int], world: int) -> None:
        """After a recovery (``lost`` may be empty): never hand out a group that holds
        a lost rank again; keep the groups among survivors; number agreements anew (a
        new key generation, every stream from 1) among the survivors only. Every
        survivor does this alike."""
        self.loss.declare(lost, world)
        self.generation += 1
        self.streams.clear()
        gone = [key for key in self.group_memo if not self.loss.lost.isdisjoint(key[0])]
        self.loss.retired.update((key, self.group_memo[key]) for key in gone)
        self.drop_groups(gone)
        run_loss_hooks()

    def drop_groups(self, keys: list[GroupKey]) -> None:
        """Never hand out these groups again. Kept: the other groups among survivors.
        Dropped too: the default group (after a loss it holds lost ranks) and
        non-member entries (cheap to redo)."""
        for key in keys:
            del self.group_memo[key]
        kept = {id(pg) for pg in self.group_memo.values()}
        for axis, pg in list(self.axis_memo.items()):
            if pg is None or id(pg) not in kept:
                del self.axis_memo[axis]

    def stream(self, name: str) -> StreamState:
        """The stream ``name`` (made on first use; under the lock)."""
        found = self.streams.get(name)
        if found is None:
            found = self.streams[name] = StreamState(Stream(name))
        return found

    def forget_dead(self, live: Container[object], axes: Iterable[Hashable]) -> bool:
        """Forget every group of the axes ``axes`` that torch no longer holds (not in
        ``live``), and with it everything that hands it out: the axis and group memos,
        the streams' realized axes and calls. O(number of axes) when all are live.
        Returns whether any was forgotten. Under the lock."""
        dead = {
            id(pg): pg
            for pg in (self.axis_memo.get(key) for key in axes)
            if pg is not None and pg not in live
        }
        if not dead:
            return False
        self.forget_groups(dead)
        return True

    def forget_groups(self, dead: dict[int, ProcessGroup]) -> None:
        """Forget the groups ``dead`` (by id). Rare: it scans the memo. Under the lock."""
        for group in [k for k, pg in self.group_memo.items() if id(pg) in dead]:
            del self.group_memo[group]
            self.reborn[group] = self.reborn.get(group, 0) + 1
        axes = {k for k, pg in self.axis_memo.items() if pg is not None and id(pg) in dead}
        for axis in axes:
            del self.axis_memo[axis]
        for stream in self.streams.values():
            stream.known -= axes
            stale = [
                call
                for call, (value, _, _) in stream.calls.items()
                if any(id(pg) in dead for pg in value.groups.values())
            ]
            for call in stale:
                del stream.calls[call]
        self.created_pgs[:] = [pg for pg in self.created_pgs if id(pg) not in dead]
        logger.info("fmesh: forgot %d destroyed or aborted groups", len(dead))
        run_dead_hooks(frozenset(dead))

    def options_id(self, options: object, timeout: datetime.timedelta | None) -> int:
        """A rank-independent id for an axis's options: their order of first use; with
        a timeout, that of (options, timeout): groups made with another timeout are
        other groups, in the memo, in their names and in the agreement's code. Under
        the lock."""
        ordinal = self.options_ordinal(options)
        if timeout is None:
            return ordinal
        tag = _timeout_tags.setdefault((ordinal, timeout), object())
        return self.options_ordinal(tag)

    def options_ordinal(self, options: object) -> int:
        """A rank-independent id for an options object: its order of first use."""
        if options is None:
            return 0
        entry = self.options_ids.get(id(options))
        if entry is None or entry[0] is not options:
            entry = (options, len(self.options_ids) + 1)
            self.options_ids[id(options)] = entry
        return entry[1]


state = State()
