"""One creating call's watch on one rank, run by the threads that wait, with no thread
of its own.

Every wait of a creating call (a group's rendezvous, a gloo construction, the closing
round) is cut into slices (``_compat/interruptible.py``); at each slice's end the
waiting thread asks ``cancelled``, which

* asks its kernel about the link to the rank's successor on the ring of the call's
  ranks (``ring.py``, ``links.py``: one ``recv`` that does not wait), after the call's
  first second (a call that ends sooner makes no link and reads no address);
* reads the call's verdict ``P+"end"`` once per interval;
* keeps the slow path of a long wait (``arrivals.py``: the ranks present, a warning
  a minute, the call's timeout).

A successor gone (its port refused, or its host silent for ``silence`` seconds) makes
the watcher walk on along the ring to the next live rank, and declare every rank it
passed lost (``_declare``). A rank that learns that it was declared lost, or that
cannot reach the store any more, was *given up on*. The verdict and its keys stay until
every rank it names has read it (``close``). The protocol: ``docs/design/liveness.md``.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
import time
from typing import TYPE_CHECKING

from .._compat.interruptible import interruptible_store, peek
from .._core.errors import MeshMismatchError
from . import agreement, arrivals, port
from .connections import hardened, thread_store
from .records import ABORT, Ticket, append, wait_get
from .ring import Ring
from .verdicts import found_by, given_up, lost_ranks, peer_lost

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._compat import Store

__all__ = ["GRACE", "INTERVAL", "RATE", "SILENCE", "Watch", "settings"]

logger = logging.getLogger("fmesh")

INTERVAL = 1.0
"""The least seconds between two reads of a call's verdict by a waiting rank."""
RATE = 20_000.0
"""Store requests per second that every waiting rank's reads may cost together (the
interval grows with the world to keep to it: ``settings``)."""
SILENCE = 8.0
"""Seconds without an answer from a peer's host (TCP keepalive) before it is lost."""
GRACE = 3.0
"""Seconds a watcher that found a loss waits before publishing the verdict, so that
ranks that died at the same moment, found by other watchers, are named too."""


def settings(ranks: int, timeout: datetime.timedelta | None) -> tuple[float, float]:
    """(interval, silence) in seconds for a call of ``ranks`` ranks: the interval is
    ``max(INTERVAL, 2 * ranks / RATE)`` (a waiting rank sends 2 requests per
    interval), shortened to a quarter of a shorter ``timeout``; the silence is
    ``SILENCE``, or half of a shorter timeout, not under 2 seconds.

    >>> settings(4, None), settings(2**17, None)
    ((1.0, 8.0), (13.1072, 8.0))
    >>> settings(4, datetime.timedelta(seconds=6)), settings(4, datetime.timedelta(seconds=2))
    ((1.0, 3.0), (0.5, 2.0))
    """
    interval = max(INTERVAL, 2 * ranks / RATE)
    silence = SILENCE
    if timeout is not None:
        t = timeout.total_seconds()
        interval = max(0.05, min(interval, t / 4))
        silence = max(2.0, min(SILENCE, t / 2))
    return interval, silence


class Watch:
    """One creating call's watch on this rank (module docstring)."""

    def __init__(
        self,
        ticket: Ticket,
        patience: datetime.timedelta,
        timeout: datetime.timedelta | None,
        liveness: bool,
    ) -> None:
        self.ticket = ticket
        self.n = ticket.n
        self.p = ticket.prefix
        self.interval, self.silence = settings(self.n, timeout)
        self.patience = patience
        self.liveness = liveness
        self.start = time.monotonic()
        self._last_read = self.start
        self.ring = Ring(ticket.ranks, ticket.rank, self.silence, self.interval)
        self.ring.due = self.start + min(self.interval, INTERVAL)
        self._hardening: contextlib.ExitStack | None = None
        """Open from the call's first second on: its connections' timeout."""
        self._broken = False
        self._given_up = ""
        """Why the other ranks give up on this one ("" while they do not)."""
        self._ok = False
        self._lock = threading.Lock()
        self.arrivals = arrivals.Arrivals(ticket, patience.total_seconds(), self.interval)

    # -- the waiting threads ----------------------------------------------------------

    def store_for(self, conn: Store, patient: bool = True) -> Store:
        """``conn`` with its waits cut into slices that end once the call is given up
        (each slice's end asks ``cancelled`` on ``conn``); ``patient``: they last until
        then, whatever timeout they are given (the call's timeout is the watch's,
        ``arrivals.py``: a rank missing then, not the one a group's rendezvous counts
        from this rank's own start)."""
        why = "fmesh: this call was given up (a rank was lost or failed): waiting stopped"
        return interruptible_store(
            conn, lambda: self.cancelled(conn), self.interval, why, patient=patient
        )

    def cancelled(self, conn: Store) -> bool:
        """Whether the call was given up (see the module docstring); ``conn`` is the
        calling thread's own connection."""
        import torch.distributed as dist

        if self._broken or not self._lock.acquire(blocking=False):
            return self._broken  # another thread is checking right now
        try:
            now = time.monotonic()
            if self.liveness and now >= self.ring.due:
                late = now - self.ring.due
                self._harden()
                lost, why, first = self.ring.check(conn, now)
                # The call's first read of an address stands for this interval's read
                # of the verdict, unless this check is late: a rank that was stopped
                # (or frozen) reads the verdict before it goes on, or it could pass a
                # rendezvous its peers left and wait in gloo's native connect.
                if first and late < INTERVAL:
                    self._last_read = now
                if lost:
                    self._declare(conn, lost, why)
            if not self._broken and now - self._last_read >= self.interval:
                self._last_read = now
                end = peek(conn, self.p + "end")
                if end == b"census":
                    self.arrivals.present(conn)
                elif end:  # b"": a census called off
                    self._broken = True
            if not self._broken and self.arrivals.tick(conn, now - self.start):
                self._broken = True
        except dist.DistError as err:  # the store is out of reach: this rank is cut off
            self._cut_off(err)
        finally:
            self._lock.release()
        return self._broken

    def _harden(self) -> None:
        """A call that lasts: its rank's connections to the store get their timeout
        for the rest of it (``connections.hardened``), and the port its thread."""
        if self._hardening is None:
            self._hardening = contextlib.ExitStack()
            self._hardening.enter_context(hardened(self.ticket.store))
            self._serve()

    def _cut_off(self, err: BaseException) -> None:
        first = (str(err).splitlines() or [type(err).__name__])[0][:200]
        self._given_up = self._given_up or f"it lost its connection to the store ({first})"
        self._broken = True

    # -- the link to the successor ----------------------------------------------------

    def _declare(self, conn: Store, lost: list[int], why: str) -> None:
        """Mark the call failed and name ``lost``; publish the verdict after ``GRACE``
        seconds. Nothing if the call had ended well or its verdict is out (ranks that
        left the call since are not lost); if another rank declared first and named
        this one, this rank was given up on."""
        t = self.ticket
        v = conn.add(self.p + "n", ABORT)
        if v % ABORT >= self.n:
            return  # every rank was out: the next call meets the loss
        self._broken = True
        if v >= 2 * ABORT:  # another rank ended the call first
            if t.rank in self.lost(conn):
                self._given_up = "the other ranks declared it lost"
                return
            if peek(conn, self.p + "end") is not None:
                return  # its verdict is out: ranks that left since are not lost
        append(conn, self.p + "lost", ",".join(map(str, lost)) + ",")
        conn.compare_set(self.p + "by", "", f"{t.rank}\x1f{why}")
        time.sleep(GRACE)
        conn.compare_set(self.p + "end", "", "lost")
        t.mark_failed(conn)

    # -- the verdict ------------------------------------------------------------------

    def lost(self, conn: Store) -> tuple[int, ...]:
        return lost_ranks(conn, self.p)

    def error(self, doing: str, cause: object) -> Exception | None:
        """The error to raise after ``doing`` failed with ``cause``, if the call was
        given up (waiting for the verdict a little: a peer's loss may be found after
        torch's own timeout fired); ``None`` if it was not."""
        import torch.distributed as dist

        t = self.ticket
        where = f"{t.where} ({t.summary})"
        conn = thread_store(t.store)  # this thread's (a worker's, or the caller's)
        try:
            # A creation that waited in native code asked nothing meanwhile: ask now.
            self.cancelled(conn)
            if not self._given_up:
                wait = (0.0 if self._broken else self.silence) + GRACE + 2 * self.interval
                raw = wait_get(conn, self.p + "end", wait)
                if not raw:
                    return None
                verdict = raw.decode()
                if verdict == "lost":
                    lost, found = self.lost(conn), found_by(conn, self.p)
                    if t.rank not in lost:
                        return peer_lost(t.rank, where, lost, found, doing, cause)
                    self._given_up = f"the other ranks declared it lost{found}"
                elif verdict.startswith("fail:"):
                    return MeshMismatchError(
                        f"rank {t.rank} stopped {doing} at {where}: another rank gave up "
                        f"on the call: {verdict[5:]}"
                    )
                elif verdict == "mm":
                    return agreement.explain(conn, t)
                elif verdict == "census":  # a timeout's census: this rank is here
                    self.arrivals.present(conn)
                    if self._census_outcome(conn) != "timeout":
                        return None  # called off: every rank was there
                    return self.arrivals.verdict(conn)
                elif verdict == "timeout":
                    return self.arrivals.verdict(conn)
                else:
                    return None
        except dist.DistError as err:
            self._cut_off(err)
        return given_up(t.rank, where, self._given_up, doing)

    def _census_outcome(self, conn: Store) -> str:
        """The verdict a census in progress ends in (``""``: called off)."""
        deadline = time.monotonic() + 4 * (GRACE + 2 * self.interval)
        while time.monotonic() < deadline:
            raw = peek(conn, self.p + "end")
            if raw != b"census":
                return "" if raw is None else raw.decode()
            time.sleep(min(0.2, self.interval))
        return ""

    def finish(
        self, timeout: datetime.timedelta, meanwhile: Callable[[], object] | None = None
    ) -> None:
        """The closing round: count this rank out; the last rank out sets ``ok`` (and
        removes the stream's previous call's keys), the others wait for it; raise if
        the call was given up. ``meanwhile`` runs once this rank is counted (before
        its wait, after the last rank's ``ok``): what the caller makes of the call's
        groups is made while the slowest rank finishes, not after it, by every rank
        at once on the host's CPUs."""
        import torch.distributed as dist

        t, conn = self.ticket, self.ticket.conn
        doing = "waiting for the other ranks to finish creating their groups"
        cause: object = f"no outcome after {timeout.total_seconds():g}s"
        try:
            if not self.cancelled(conn):
                v = conn.add(self.p + "n", 1)
                if v == self.n:
                    conn.set(self.p + "ok", "1")
                    self._ok = True
                    arrivals.clean_previous(t, last=True)
                    if meanwhile is not None:
                        meanwhile()
                    return
                if v < self.n:
                    self._serve()
                    if meanwhile is not None:
                        meanwhile()
                    # Nobody but the last rank touches "ok": a wait that returns found it.
                    self.store_for(conn).wait([self.p + "ok"], timeout)
                    self._ok = True
                    arrivals.clean_previous(t, last=False)
                    return
        except dist.DistError as err:
            cause = err
        self._broken = True
        found = self.error(doing, cause)
        if found is not None:
            raise found from None
        raise MeshMismatchError(
            f"rank {t.rank} waited {timeout.total_seconds():g}s at the end of {t.where} "
            f"for ranks that are alive but never finished creating their groups "
            f"({t.summary}): {cause}"
        )

    def fail(self, err: BaseException) -> None:
        """This rank gives up on the call (not for a lost peer): tell the others."""
        first = (str(err).splitlines() or [type(err).__name__])[0][:500]
        conn = self.ticket.conn
        with contextlib.suppress(Exception):
            if conn.add(self.p + "n", ABORT) % ABORT < self.n:
                conn.compare_set(self.p + "end", "", f"fail:rank {self.ticket.rank}: {first}")
                self.ticket.mark_failed(conn)
        self._broken = True

    def _serve(self) -> None:
        """The port's thread, once per process, started as the first watched call waits
        for its last rank (or ends)."""
        if self.liveness:
            p = port.started()
            if p is not None:
                p.serve()

    def close(self) -> None:
        """Keepalive off on the link; after a failure, count this rank out of the call
        (``arrivals.leave``: the keys go once every rank is out, the verdict once every
        rank it names has read it)."""
        self.ring.close()
        if self._hardening is not None:
            self._hardening.close()
        self._serve()
        if self._ok:
            with contextlib.suppress(Exception):
                self.arrivals.tidy(self.ticket.conn)
        else:
            conn = self.ticket.conn
            with contextlib.suppress(Exception):
                arrivals.leave(self.ticket, bool(self._given_up), self.lost(conn))
