"""The process-wide memo of process groups, and the lock discipline around it.

One ``State`` per process. Its lock guards only dictionary updates: nothing
holds it while waiting on peers (group creation, the cross-rank agreement), so
``cache_stats()``, ``destroy()`` and realize calls from other threads stay
responsive. A group being created by one thread is marked *in flight*; another
thread that needs the same group waits for that creation instead of making it twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from .._core.mesh import Mesh
from .._core.rank_map import rank_map_info
from .hooks import run_loss_hooks, run_reset_hooks
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
    loss: Loss = attrs.field(factory=Loss)
    """Ranks lost so far and the groups retired with them (``loss.py``)."""
    created: int = 0
    reused: int = 0

    def reset(self) -> None:
        self.loss = Loss()
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
