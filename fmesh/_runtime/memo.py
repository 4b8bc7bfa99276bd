"""The process-wide memo of process groups, and the lock discipline around it.

One ``State`` per process. Its lock guards only dictionary updates: nothing
holds it while waiting on peers (group creation, the cross-rank agreement), so
``cache_stats()``, ``destroy()`` and realize calls from other threads stay
responsive. A group being created by one thread is marked *in flight*; another
thread that needs the same group waits for that creation instead of making it twice.

A group torch no longer holds (destroyed, aborted) is forgotten when a call meets it
(``State.forget_dead``); the next call that needs it creates a fresh one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Container, Hashable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from .._core.mesh import Mesh
from .._core.rank_map import rank_map_info
from .hooks import run_dead_hooks, run_loss_hooks, run_reset_hooks
from .loss import GroupKey, Loss
from .stream import Stream

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "GroupKey",
    "State",
    "WorldKey",
    "rank_map_key",
    "state",
    "world_key",
]

logger = logging.getLogger("fmesh")

T = TypeVar("T")
WorldKey = tuple[int, str]
"""(index space size, rank-map digest): the rank space a mesh lives in."""


def rank_map_key(mesh: Mesh) -> str:
    return "" if mesh.rank_map is None else rank_map_info(mesh.rank_map).digest


def world_key(mesh: Mesh) -> WorldKey:
    return (mesh.index_size, rank_map_key(mesh))


@attrs.define
class State:
    """Everything fmesh holds per process (reset by ``destroy``)."""

    lock: threading.Lock = attrs.field(factory=threading.Lock)
    turns: threading.Condition = attrs.field(
        default=attrs.Factory(lambda self: threading.Condition(self.lock), takes_self=True)
    )
    """Signalled (under ``lock``) when a stream's call is done (``Stream.leave``)."""
    world: object | None = None
    """The default group the memo belongs to."""
    generation: int = 0
    axis_memo: dict[Hashable, ProcessGroup | None] = attrs.field(factory=dict)
    group_memo: dict[GroupKey, ProcessGroup] = attrs.field(factory=dict)
    """(members in coordinate order, backend, options ordinal) -> group."""
    in_flight: dict[Hashable, threading.Event] = attrs.field(factory=dict)
    created_pgs: list[ProcessGroup] = attrs.field(factory=list)
    options_ids: dict[int, tuple[object, int]] = attrs.field(factory=dict)
    streams: dict[str, Stream[Any]] = attrs.field(factory=dict)
    """Per stream (``stream.py``): numbering, hit history and the calls made."""
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

    def stream(self, name: str) -> Stream[Any]:
        """The stream ``name`` (made on first use; under the lock)."""
        found = self.streams.get(name)
        if found is None:
            found = self.streams[name] = Stream(name)
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
                if any(id(pg) in dead for pg in getattr(value, "groups", {}).values())
            ]
            for call in stale:
                del stream.calls[call]
        self.created_pgs[:] = [pg for pg in self.created_pgs if id(pg) not in dead]
        logger.info("fmesh: forgot %d destroyed or aborted groups", len(dead))
        run_dead_hooks(frozenset(dead))

    def options_ordinal(self, options: object) -> int:
        """A rank-independent id for an options object: its order of first use."""
        if options is None:
            return 0
        entry = self.options_ids.get(id(options))
        if entry is None or entry[0] is not options:
            entry = (options, len(self.options_ids) + 1)
            self.options_ids[id(options)] = entry
        return entry[1]

    def axis(
        self, key: Hashable, make: Callable[[], tuple[ProcessGroup | None, int]]
    ) -> tuple[ProcessGroup | None, int]:
        """This rank's group along the axis ``key``, from the axis memo, else made once:
        ``make`` returns (group, 1 if it created one else 0)."""

        def lookup() -> tuple[ProcessGroup | None, int] | None:
            if key not in self.axis_memo:
                return None
            self.reused += 1
            return self.axis_memo[key], 0

        def store(value: tuple[ProcessGroup | None, int]) -> None:
            pg, made = value
            self.axis_memo[key] = pg
            if made:
                assert pg is not None
                self.created_pgs.append(pg)
                self.created += 1
            else:
                self.reused += 1

        return self.once(("axis", key), lookup, make, store)

    def once(
        self,
        key: Hashable,
        lookup: Callable[[], T | None],
        make: Callable[[], T],
        store: Callable[[T], None],
    ) -> T:
        """The memoized value for ``key``: ``lookup`` under the lock, else ``make`` it.

        ``make`` runs without the lock, at most once at a time per key: a thread that
        finds another one making the same key waits for it and looks up again.
        ``store`` records the made value, under the lock.
        """
        while True:
            with self.lock:
                found = lookup()
                if found is not None:
                    return found
                event = self.in_flight.get(key)
                mine = event is None
                if event is None:
                    event = self.in_flight[key] = threading.Event()
            if mine:
                break
            event.wait()
        try:
            value = make()
            with self.lock:
                store(value)
            return value
        finally:
            with self.lock:
                del self.in_flight[key]
            event.set()


state = State()
