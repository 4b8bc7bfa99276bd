"""The process-wide memo of process groups, and the lock discipline around it.

One :class:`State` per process. Its lock guards only dictionary updates: nothing
holds it while waiting on peers (group creation, the cross-rank agreement), so
``cache_stats()``, ``destroy()`` and realize calls from other threads stay
responsive. A group being created by one thread is marked *in flight*; another
thread that needs the same group waits for that creation instead of making it twice.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar, final

import attrs

from .._core.mesh import Mesh
from .._core.rank_map import rank_map_info
from .hooks import run_loss_hooks, run_reset_hooks
from .stream import Stream

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "CacheStats",
    "State",
    "WorldKey",
    "cache_stats",
    "destroy",
    "digest",
    "rank_map_key",
    "state",
    "world_key",
]

logger = logging.getLogger("fmesh")

T = TypeVar("T")
GroupKey = tuple[tuple[int, ...], str, int]
"""A group by its members (in coordinate order), backend and options ordinal."""
WorldKey = tuple[int, str]
"""(index space size, rank-map digest): the rank space a mesh lives in."""


def digest(*parts: object) -> str:
    """A short content hash, equal on every rank for equal inputs."""
    return hashlib.sha1(repr(parts).encode(), usedforsecurity=False).hexdigest()


def rank_map_key(mesh: Mesh) -> str:
    return "" if mesh.rank_map is None else rank_map_info(mesh.rank_map).digest


def world_key(mesh: Mesh) -> WorldKey:
    return (mesh.index_size, rank_map_key(mesh))


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


@attrs.define
class State:
    """Everything fmesh holds per process (reset by :func:`destroy`)."""

    lock: threading.Lock = attrs.field(factory=threading.Lock)
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
    """Per thread name: numbering, hit history and the calls made (``_stream.py``)."""
    debug: bool = False
    """torch's ``TORCH_DISTRIBUTED_DEBUG=DETAIL``: every call agrees."""
    lost: frozenset[int] = frozenset()
    """World ranks declared lost by :func:`fmesh.recover` (never used again)."""
    survivors: tuple[int, ...] | None = None
    """The ranks that agree after a loss, ascending (``None``: the whole world)."""
    recoveries: int = 0
    """Recoveries so far: every survivor counts the same."""
    retired: dict[GroupKey, ProcessGroup] = attrs.field(factory=dict)
    """Groups that held a lost rank: never handed out, but an NCCL one may be shrunk
    into a group of its survivors."""
    created: int = 0
    reused: int = 0

    def reset(self) -> None:
        self.lost, self.survivors, self.recoveries = frozenset(), None, 0
        self.retired.clear()
        self.streams.clear()
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
        self.lost = self.lost | lost
        self.survivors = tuple(r for r in range(world) if r not in self.lost)
        self.recoveries += 1
        self.generation += 1
        self.streams.clear()
        gone = [key for key in self.group_memo if not self.lost.isdisjoint(key[0])]
        self.retired.update((key, self.group_memo[key]) for key in gone)
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

    def options_ordinal(self, options: object) -> int:
        """A rank-independent id for an options object: its order of first use."""
        if options is None:
            return 0
        entry = self.options_ids.get(id(options))
        if entry is None or entry[0] is not options:
            entry = (options, len(self.options_ids) + 1)
            self.options_ids[id(options)] = entry
        return entry[1]

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


def cache_stats() -> CacheStats:
    """Counters of groups created and reused by :func:`realize` in this process.

    >>> from fmesh import cache_stats
    >>> cache_stats().created >= 0
    True
    """
    with state.lock:
        return CacheStats(
            created=state.created, reused=state.reused, live=len(state.created_pgs)
        )


def destroy() -> None:
    """Destroy every process group fmesh created; a later :func:`realize` works again.

    The default (world) group is left alone, even when fmesh initialized it; tear it
    down with ``torch.distributed.destroy_process_group()``.
    """
    import torch.distributed as dist

    from .._compat import is_live

    with state.lock:
        pgs = list(state.created_pgs)
        state.reset()
        state.created = 0
        state.reused = 0
    for pg in pgs:
        if is_live(pg):
            dist.destroy_process_group(pg)
    logger.info("fmesh.destroy: destroyed %d groups", len(pgs))
