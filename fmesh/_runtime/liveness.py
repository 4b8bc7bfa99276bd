"""No rank waits for a dead peer while a realize call creates groups.

From the agreement to the end of a creating call, every rank runs a *watch*: a daemon
thread that beats (adds 1 to its rank's key, one per rank for the life of the store,
every ``interval``, the first after one: a call that ends sooner costs the thread no
request) and reads the beats of the peers this rank waits for: the members of the
group being created, then, at the call's closing barrier, its neighbours in rank order.
A peer whose beat stands still for ``patience`` seconds is lost: its watcher publishes
the verdict under the call's keys and cancels the creation's waits
(``_compat/interruptible.py``: they wait in slices of one ``interval`` and stop at the
next), so the blocked torch call raises; every other rank's watch sees the verdict at
its next beat and does the same. A slow peer keeps beating (the thread needs neither
its main thread nor its GIL for long), so it is never declared lost.

The watch opens no connection (a new one can stall the store's server for seconds
when every rank opens one at once): its thread shares the calling thread's own, taking
turns with the creation's sliced waits (``Gate``). Memo hits run no watch. On by
default; ``FMESH_PEER_WATCH=0`` turns it off. The protocol:
``docs/design/agreement-protocol.md``.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import threading
import time
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, cast

from .._compat.interruptible import Gate, interruptible_store, peek
from .._core.errors import MeshMismatchError, PeerLostError
from . import agreement as _agree
from .agreement_records import Ticket, append, wait_get

if TYPE_CHECKING:
    from .._compat import Store

__all__ = ["Watch", "current", "settings", "start", "store_for_creation", "waiting_for"]

logger = logging.getLogger("fmesh")

BEATS = "fmesh/hb/"
"""Where each rank's beat lives: one counter per rank for the life of the store, shared
by its calls (so no call deletes O(world) keys when it ends)."""

INTERVAL = 1.0
"""Seconds between two beats at default settings."""
PATIENCE = 8.0
"""Seconds a beat may stand still before its rank is lost, at default settings."""
FLOOR = 4.0
"""The least patience a shorter ``timeout`` brings (a loaded machine can stall a
process's threads for seconds)."""

started = 0
"""Watches started in this process (tests: a memo hit starts none)."""

_local = threading.local()


def settings(timeout: datetime.timedelta | None) -> tuple[float, float]:
    """(interval, patience) in seconds: the defaults, shortened to fit a shorter
    ``timeout``: half of it, but not under ``FLOOR`` seconds (or the whole timeout if
    that is shorter), so that a rank stalled by a loaded machine is not taken for dead.

    >>> settings(None), settings(datetime.timedelta(seconds=3))
    ((1.0, 8.0), (0.75, 3.0))
    >>> settings(datetime.timedelta(seconds=10)), settings(datetime.timedelta(seconds=1))
    ((1.0, 5.0), (0.25, 1.0))
    """
    patience = PATIENCE
    if timeout is not None:
        t = timeout.total_seconds()
        patience = max(0.5, min(PATIENCE, max(t / 2, min(FLOOR, t))))
    return min(INTERVAL, patience / 4), patience


class Watch:
    """One creating call's watch on this rank (see the module docstring)."""

    def __init__(
        self,
        ticket: Ticket,
        timeout: datetime.timedelta | None,
    ) -> None:
        global started
        started += 1
        self.ticket = ticket
        self.p = ticket.prefix + "w/"
        self.interval, self.patience = settings(timeout)
        self._broken = False
        self._ok = False
        """``finish()`` read the call's outcome, and it is ``ok``."""
        why = "fmesh: this call was given up (a peer was lost or failed): waiting stopped"
        self._gate = Gate()
        self._keys = _agree.thread_store(ticket.store)
        """This thread's connection: the watch's short requests, from both threads (the
        watch thread takes its turns on it through ``_gate``)."""
        self.store = interruptible_store(
            self._keys, lambda: self._broken, self.interval, why, self._gate
        )
        """Where this call's creations and its closing barrier wait: the same
        connection, waits sliced."""
        self._lock = threading.Lock()
        self._watching: tuple[int, ...] = ()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"fmesh-watch-{ticket.rank}", daemon=True
        )
        self._thread.start()

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        p, me, conn, turn = self.p, self.ticket.rank, self._keys, self._gate.turn
        seen: dict[int, tuple[int, float]] = {}
        declared: float | None = None
        try:
            # The first beat after one interval: a call that ends sooner costs the
            # thread no request (a peer's watchers allow it ``patience``, four beats).
            while not self._stop.wait(self.interval):
                with turn():
                    conn.add(f"{BEATS}{me}", 1)
                    ended = peek(conn, p + "end")
                if ended is not None:
                    if ended != b"ok":
                        self._break()
                    return
                now = time.monotonic()
                if declared is None:
                    stale = self._stale(conn, seen, now)
                    if stale and self._declare(conn, stale):
                        declared = now
                elif now - declared >= 2 * self.interval:
                    # Other watchers had two beats to add the ranks they lost too.
                    with turn():
                        if conn.compare_set(p + "end", "", "lost") != b"ok":
                            self._break()
                    return
        except Exception as err:  # the store is gone: the caller's own wait says so
            logger.debug("fmesh: watch of rank %d stopped: %s", me, err)

    def _stale(self, conn: Store, seen: dict[int, tuple[int, float]], now: float) -> list[int]:
        """The watched peers whose beat has stood still for ``patience`` seconds."""
        with self._lock:
            watching = self._watching
        with self._gate.turn():
            beats = [(r, conn.add(f"{BEATS}{r}", 0)) for r in watching]
        stale = []
        for r, beat in beats:
            last = seen.get(r)
            if last is None or last[0] != beat:
                seen[r] = (beat, now)
            elif now - last[1] >= self.patience:
                stale.append(r)
        return stale

    def _declare(self, conn: Store, stale: list[int]) -> bool:
        """Publish ``stale`` as lost unless the call already ended. The thread goes on
        beating, and publishes the end two beats later (ranks that died together are
        found by other watchers meanwhile): a declaring rank that stopped beating would
        be taken for dead by its own watchers on a loaded machine."""
        p = self.p
        with self._gate.turn():
            if conn.check([p + "end"]):
                return False
            append(conn, p + "lost", ",".join(map(str, stale)) + ",")
            conn.compare_set(p + "by", "", str(self.ticket.rank))
        return True

    def _break(self) -> None:
        with self._lock:
            self._broken = True

    # -- the caller ---------------------------------------------------------------------

    @contextlib.contextmanager
    def waiting_for(self, ranks: Collection[int]) -> Iterator[None]:
        me = self.ticket.rank
        with self._lock:
            self._watching = tuple(r for r in ranks if r != me)
        try:
            yield
        finally:
            with self._lock:
                self._watching = ()

    def verdict(self, wait: float = 0.0) -> str | None:
        """The call's outcome once published (``ok``, ``lost``, ``fail:...``)."""
        import torch.distributed as dist

        try:
            raw = wait_get(self.store, self.p + "end", wait)
        except dist.DistNetworkError:  # given up meanwhile: the outcome is there
            raw = wait_get(self._keys, self.p + "end", 0.0)
        return None if raw is None else raw.decode()

    def lost(self) -> tuple[int, ...]:
        raw = wait_get(self._keys, self.p + "lost", 0.0)
        text = "" if raw is None else raw.decode()
        return tuple(sorted({int(r) for r in text.split(",") if r}))

    def error(self, doing: str, cause: object) -> MeshMismatchError | None:
        """The error to raise after ``doing`` failed with ``cause``, if a verdict
        explains it (waiting for one a little: a peer's death may be found after
        torch's own timeout fired)."""
        verdict = self.verdict(0.0 if self._broken else self.patience + 2 * self.interval)
        if verdict is None or verdict == "ok":
            return None
        t = self.ticket
        where = f"{t.where} ({t.summary})"
        if verdict.startswith("fail:"):
            return MeshMismatchError(
                f"rank {t.rank} stopped {doing} at {where}: another rank gave up on the "
                f"call after every rank agreed on it: {verdict[5:]}"
            )
        lost = self.lost()
        by = wait_get(self._keys, self.p + "by", 0.0)
        found = "" if by is None else f", found by rank {by.decode()}"
        return PeerLostError(
            f"rank(s) {list(lost)} died during {where}, after every rank agreed on it "
            f"(their heartbeat stopped for {self.patience:g}s{found}); rank {t.rank} was "
            f"{doing}. No group of this call was kept on any survivor: call "
            "fmesh.recover(timeout=...) on every surviving rank and carry on without "
            "them (docs/elastic.md)." + _said(cause),
            lost,
        )

    def finish(self, timeout: datetime.timedelta) -> None:
        """The closing barrier: wait until every rank of the call made its groups,
        watching this rank's neighbours; raise if a rank was lost or gave up."""
        import torch.distributed as dist

        t = self.ticket
        ranks = list(t.ranks)
        n = len(ranks)
        conn = self._keys
        if conn.add(self.p + "out", 1) == n:
            conn.compare_set(self.p + "end", "", "ok")
        i = ranks.index(t.rank)
        doing = "waiting for the other ranks to finish creating their groups"
        seconds = timeout.total_seconds()
        cause: object = f"no outcome after {seconds:g}s"
        with self.waiting_for({ranks[(i - 1) % n], ranks[(i + 1) % n]} - {t.rank}):
            try:
                outcome = wait_get(self.store, self.p + "end", seconds)
            except dist.DistError as err:  # given up: a peer was lost or failed
                outcome, cause = None, err
            if outcome == b"ok":
                self._ok = True
                return
            found = self.error(doing, "" if outcome is not None else cause)
        if found is not None:
            raise found from None
        raise MeshMismatchError(
            f"rank {t.rank} waited {seconds:g}s at the end of {t.where} for ranks that "
            f"are alive but never finished creating their groups ({t.summary}): {cause}"
        )

    def fail(self, err: BaseException) -> None:
        """This rank gives up on the call (not for a lost peer): wake the others."""
        first = (str(err).splitlines() or [type(err).__name__])[0][:500]
        message = f"rank {self.ticket.rank}: {first}"
        with contextlib.suppress(Exception):
            self._keys.compare_set(self.p + "end", "", "fail:" + message)

    def close(self) -> None:
        """Stop the thread; the last rank of the call out deletes the call's keys (the
        beats stay: one per rank, shared by every call)."""
        self._stop.set()
        self._thread.join()
        t = self.ticket
        conn = self._keys
        with contextlib.suppress(Exception):
            alive = len(t.ranks)
            if not self._ok:  # else finish() read the outcome: nobody was lost
                alive -= len(self.lost()) if self.verdict() == "lost" else 0
            if conn.add(self.p + "gone", 1) >= alive:
                # "lost" and "by" can outlive an "ok": a watcher may declare just after
                # the last rank's "out" and before it sees the end.
                for key in ("out", "end", "lost", "by", "gone"):
                    conn.delete_key(self.p + key)
                if not self._ok:
                    conn.delete_key(t.prefix + "failed")


def _said(cause: object) -> str:
    first = (str(cause).splitlines() or [""])[0][:300]
    return f" torch said: {first}" if first else ""


def enabled() -> bool:
    """Whether creating calls run a watch: on unless ``FMESH_PEER_WATCH`` is off (``0``,
    ``false``, ``off``, ``no``; read at each call)."""
    from .._compat.hook import switch

    return switch(
        "FMESH_PEER_WATCH",
        os.environ.get("FMESH_PEER_WATCH"),
        "keep it on",
        "turn the watch for peers lost while groups are created off",
    )


def start(ticket: Ticket | None, timeout: datetime.timedelta | None) -> Watch | None:
    """A watch for a creating call (none without a ticket: nobody to wait for; none
    unless ``enabled()``)."""
    if ticket is None or len(ticket.ranks) <= 1 or not enabled():
        return None
    return Watch(ticket, timeout)


@contextlib.contextmanager
def active(watch: Watch | None) -> Iterator[None]:
    """Make ``watch`` this thread's current one (``current()``) for the block."""
    previous = getattr(_local, "watch", None)
    _local.watch = watch
    try:
        yield
    finally:
        _local.watch = previous


def current() -> Watch | None:
    return cast("Watch | None", getattr(_local, "watch", None))


def waiting_for(
    watch: Watch | None, ranks: Collection[int] | None
) -> contextlib.AbstractContextManager[None]:
    if watch is None or not ranks:
        return contextlib.nullcontext()
    return watch.waiting_for(ranks)


def store_for_creation(store: Store, backend: str) -> Store:
    """The store a group creation should wait in: the current watch's interruptible
    one (gloo's rendezvous ends with its constructor), else this thread's own
    connection. torch's legacy NCCL backend keeps its store for threads of its own (its
    watchdog and monitor read it while the group lives), which must not call into
    Python: its unique-id exchange is not cut short, and raises ``PeerLostError`` at
    its timeout. torch 2.15's nccl2 reads its store only while it is created: it waits
    in the watch's store (``docs/design/nccl.md``)."""
    from .._compat.nccl import creation_waits_in_given_store

    watch = current()
    # NCCL (issue 33, item 6): the one point where a NCCL creation meets the watch.
    nccl = "nccl" in backend.lower()
    if watch is not None and (not nccl or creation_waits_in_given_store(backend)):
        return watch.store
    return _agree.thread_store(store)
