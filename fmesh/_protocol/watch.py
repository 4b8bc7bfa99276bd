"""One creating call's watch on one rank: the thread that watches the next rank's
sentinel, the verdict it publishes, the closing barrier, and the waits that end when
the call is given up.

The keys of a call with agreement prefix ``P`` (``n`` ranks): ``P+"done"`` counts the
ranks that read the agreement's outcome, then (to ``2n``) the ranks that made their
groups, and takes ``LOSS`` from a rank that ends the call badly (so the last rank
out and a watcher that finds a loss cannot both win); ``P+"w/ok"`` wakes the closing
barrier (only the last rank out writes it, and nobody reads it without waiting: a
``compare_set`` of a missing key wakes its waiters on torch's store); ``P+"w/end"``
is the verdict (``lost`` or ``fail:<why>``), ``lost`` and ``by`` name the lost ranks
and their finder, ``gone`` counts survivors out of a failed call. The protocol:
``docs/design/liveness.md``.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
import time

from .._compat.interruptible import Gate, interruptible_store, peek
from .._core.errors import MeshMismatchError, PeerLostError
from . import agreement as _agree
from . import sentinel as _sentinel
from .records import Ticket, append

__all__ = [
    "GRACE",
    "INTERVAL",
    "LOSS",
    "RATE",
    "SILENCE",
    "Watch",
    "forget_addresses",
    "pending",
    "settings",
    "stream_of",
]

logger = logging.getLogger("fmesh")

INTERVAL = 1.0
"""The least seconds between two reads of a call's outcome by a waiting rank."""
RATE = 20_000.0
"""Store requests per second that every waiting rank's reads may cost together (the
interval grows with the world to keep to it: ``settings``)."""
SILENCE = 10.0
"""Seconds a sentinel may send nothing before its rank is lost (its host or network
is gone; a dead process is found at once, by end of file)."""
FLOOR = 4.0
"""The least silence a shorter ``timeout`` brings."""
GRACE = 3.0
"""Seconds a watcher that found a loss waits before publishing the end, so that
ranks that died at the same moment, found by other watchers, are named too."""
LOSS = 1 << 24
"""Added to the call's counter by a rank that ends the call badly: more than any
count of its ranks, far less than the agreement's ``ABORT``."""


_addresses: dict[int, _sentinel.Address] = {}
"""Peers' sentinel addresses read so far (one read per peer, not per call)."""
pending: dict[str, tuple[object, tuple[str, ...]]] = {}
"""Per stream: the store and the keys of its last call that ended well, deleted by
its next agreed call (whose agreement proves every rank left it)."""


def forget_addresses() -> None:
    """Read every peer's sentinel address anew: the runtime calls this when its memo
    is reset (``destroy``, a new default process group), whose ranks may be other
    processes."""
    _addresses.clear()


def settings(ranks: int, timeout: datetime.timedelta | None) -> tuple[float, float]:
    """(interval, silence) in seconds for a call of ``ranks`` ranks: the interval is
    ``max(INTERVAL, 2 * ranks / RATE)`` (a waiting rank sends 2 requests per
    interval), shortened to a quarter of a shorter ``timeout``; the silence is
    ``SILENCE``, or half of a shorter timeout but not under ``FLOOR`` seconds.

    >>> settings(4, None), settings(2**17, None)
    ((1.0, 10.0), (13.1072, 10.0))
    >>> settings(4, datetime.timedelta(seconds=6)), settings(4, datetime.timedelta(seconds=2))
    ((1.0, 4.0), (0.5, 2.0))
    """
    interval = max(INTERVAL, 2 * ranks / RATE)
    silence = SILENCE
    if timeout is not None:
        t = timeout.total_seconds()
        interval = max(0.05, min(interval, t / 4))
        silence = max(0.5, min(SILENCE, max(t / 2, min(FLOOR, t))))
    return interval, silence


class Watch:
    """One creating call's watch on this rank (see the module docstring)."""

    def __init__(self, ticket: Ticket, timeout: datetime.timedelta | None) -> None:
        self.ticket = ticket
        self.n = len(ticket.ranks)
        self.p = ticket.prefix + "w/"
        self.count = ticket.prefix + "done"
        """The agreement's count of ranks that read its outcome, then (to ``2n``) of
        ranks that made their groups; ``LOSS`` once the call ended badly."""
        self.interval, self.silence = settings(self.n, timeout)
        self._sentinel = _sentinel.started()
        self._broken = False
        self._given_up = ""
        """Why the other ranks give up on this one (its sentinel died)."""
        self._ok = False
        self._lock = threading.Lock()
        self._last_read = time.monotonic()
        """The last read of the interval's budget: the outcome, or an address (first)."""
        if ticket.ranks[(ticket.ranks.index(ticket.rank) + 1) % self.n] not in _addresses:
            self._last_read += min(self.interval, INTERVAL)  # its first: ``_address``
        self._gate = Gate()
        self._conn = ticket.conn
        """This thread's connection, shared with the watch thread (turns: ``_gate``)."""
        why = "fmesh: this call was given up (a rank was lost or failed): waiting stopped"
        self.store = interruptible_store(
            self._conn, self.cancelled, self.interval, why, self._gate
        )
        """Where this call's gloo creations and closing barrier wait: the same
        connection, waits sliced, each slice end reading the outcome once per interval."""
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"fmesh-watch-{ticket.rank}", daemon=True
        )
        self._thread.start()

    # -- the waiting threads ------------------------------------------------------------

    def cancelled(self) -> bool:
        """Whether the call was given up; reads its outcome once per interval."""
        if self._broken:
            return True
        s = self._sentinel
        if s is not None and not s.alive():
            self._give_up(s.why())
            return True
        now = time.monotonic()
        with self._lock:
            if now - self._last_read < self.interval:
                return False
            self._last_read = now
        with self._gate.turn():
            end = peek(self._conn, self.p + "end")
        if end is not None:
            self._break()
        return self._broken

    # -- the watch thread ---------------------------------------------------------------

    def _run(self) -> None:
        t = self.ticket
        ranks = list(t.ranks)
        me = ranks.index(t.rank)
        own = self._sentinel
        step, found, why = 1, [], ""
        link: _sentinel.Link | None = None
        try:
            while not self._stop.is_set():
                if link is None:
                    peer = ranks[(me + step) % self.n]
                    if peer == t.rank:  # every other rank is gone
                        break
                    link = self._connect(peer)
                    if link is None:
                        return
                if link.closed:
                    found.append(peer)
                    why = why or link.closed
                    link, step = None, step + 1
                    continue  # the next rank along the ring at once
                if found:
                    self._declare(found, why)
                    return
                self._listen(link, own)
                if self._given_up:  # its own watcher sees its sentinel's end too
                    return
        except Exception as err:  # the store is gone: the caller's own wait says so
            logger.debug("fmesh: watch of rank %d stopped: %s", t.rank, err)
        finally:
            if link is not None:
                link.close()
        if found:
            with contextlib.suppress(Exception):
                self._declare(found, why)

    def _connect(self, peer: int) -> _sentinel.Link | None:
        """A link to ``peer``'s sentinel (its address read once per process, after a
        second: a shorter call costs no read); ``None`` if the watch stopped first."""
        cached = _addresses.get(peer)
        if cached is None:
            if self._stop.wait(min(self.interval, INTERVAL)):
                return None
            cached = self._address(peer)
        link = _sentinel.Link(cached, self.silence)
        if link.closed:  # a stale address? (the peer may have started a new sentinel)
            fresh = self._address(peer)
            if fresh != cached:
                link = _sentinel.Link(fresh, self.silence)
        return link

    def _address(self, peer: int) -> _sentinel.Address:
        key = _sentinel.KEY + str(peer)
        with self._gate.turn():
            raw = peek(self._conn, key)
        with self._lock:  # in place of the interval's read of the outcome
            self._last_read = time.monotonic()
        if raw is None:  # published before its agreement: only a store that lost it
            raw = self._read(key, self.silence) or b"?|0|?"
        address = _sentinel.Address.parse(raw)
        _addresses[peer] = address
        return address

    def _listen(self, link: _sentinel.Link, own: _sentinel.Sentinel | None) -> None:
        """Wait up to half a beat for the peer's bytes, or for this rank's own
        sentinel's end (its stdout pipe reaches end of file)."""
        ready = link.wait([own.stdout] if own is not None else [], _sentinel.BEAT / 2)
        if own is not None and ready and own.ended():
            self._give_up(own.why())

    def _declare(self, lost: list[int], why: str) -> None:
        """Mark the call lost, name ``lost``, and publish the end after ``GRACE``
        seconds (at once if the call is closing meanwhile); nothing if the call had
        already ended well (the next call meets the loss in its agreement)."""
        conn, p = self._conn, self.p
        with self._gate.turn():
            if conn.add(self.count, LOSS) % LOSS >= 2 * self.n:
                return
            append(conn, p + "lost", ",".join(map(str, lost)) + ",")
            conn.compare_set(p + "by", "", f"{self.ticket.rank}\x1f{why}")
        self._break()
        self._stop.wait(GRACE)
        with self._gate.turn():
            conn.compare_set(p + "end", "", "lost")

    def _give_up(self, why: str) -> None:
        with self._lock:
            if not self._given_up:
                self._given_up = why
            self._broken = True

    def _break(self) -> None:
        with self._lock:
            self._broken = True

    def _read(self, key: str, seconds: float) -> bytes | None:
        """The value of ``key`` once it exists, waiting at most ``seconds``, in slices
        of one interval between which the other thread may use the connection."""
        import torch.distributed as dist

        deadline = time.monotonic() + seconds
        while True:
            with self._gate.turn():
                raw = peek(self._conn, key)
            left = deadline - time.monotonic()
            if raw is not None or left <= 0:
                return raw
            step = datetime.timedelta(seconds=min(self.interval, left))
            with contextlib.suppress(dist.DistStoreError), self._gate.slice():
                self._conn.wait([key], step)

    # -- the caller ---------------------------------------------------------------------

    def verdict(self, wait: float = 0.0) -> str | None:
        """The call's outcome once published (``ok``, ``lost``, ``fail:...``)."""
        raw = self._read(self.p + "end", wait)
        return None if raw is None else raw.decode()

    def lost(self) -> tuple[int, ...]:
        raw = self._read(self.p + "lost", 0.0)
        text = "" if raw is None else raw.decode()
        return tuple(sorted({int(r) for r in text.split(",") if r}))

    def error(self, doing: str, cause: object) -> MeshMismatchError | None:
        """The error to raise after ``doing`` failed with ``cause``, if the call was
        given up (waiting for the verdict a little: a peer's death may be found after
        torch's own timeout fired)."""
        t = self.ticket
        where = f"{t.where} ({t.summary})"
        if self._given_up:
            return _given_up(t.rank, where, self._given_up, doing)
        # Given up: the verdict follows within GRACE. Else torch's own error may have
        # come first: a silent peer is declared after SILENCE.
        patience = 0.0 if self._broken else self.silence
        verdict = self.verdict(patience + GRACE + 2 * self.interval)
        if verdict is None or verdict == "ok":
            return None
        if verdict.startswith("fail:"):
            return MeshMismatchError(
                f"rank {t.rank} stopped {doing} at {where}: another rank gave up on the "
                f"call after every rank agreed on it: {verdict[5:]}"
            )
        lost = self.lost()
        raw = self._read(self.p + "by", 0.0)
        by, _, how = ("" if raw is None else raw.decode()).partition("\x1f")
        found = f" (found by rank {by}: {how})" if by else ""
        if t.rank in lost:
            return _given_up(t.rank, where, f"the other ranks declared it lost{found}", doing)
        return PeerLostError(
            f"rank(s) {list(lost)} died during {where}, after every rank agreed on it"
            f"{found}; rank {t.rank} was {doing}. No group of this call was kept on any "
            "survivor: call fmesh.recover(timeout=...) on every surviving rank and carry "
            "on without them (docs/elastic.md)." + _said(cause),
            lost,
        )

    def finish(self, timeout: datetime.timedelta) -> None:
        """The closing barrier: count this rank's groups made; the last rank of the
        call sets ``ok``, the others wait for it (watched); raise if the call was
        given up."""
        import torch.distributed as dist

        t = self.ticket
        doing = "waiting for the other ranks to finish creating their groups"
        seconds = timeout.total_seconds()
        cause: object = f"no outcome after {seconds:g}s"
        if not self.cancelled():
            with self._gate.turn():
                arrived = self._conn.add(self.count, 1)
            if arrived == 2 * self.n:
                with self._gate.turn():
                    self._conn.set(self.p + "ok", "1")
                self._ok = True
                return
            if arrived < LOSS:
                try:
                    # Nobody but the last rank touches "ok": a wait that returns found it.
                    self.store.wait([self.p + "ok"], timeout)
                    self._ok = True
                    return
                except dist.DistError as err:  # given up, or torch's timeout
                    cause = err
            self._break()
        found = self.error(doing, cause)
        if found is not None:
            raise found from None
        raise MeshMismatchError(
            f"rank {t.rank} waited {seconds:g}s at the end of {t.where} for ranks that "
            f"are alive but never finished creating their groups ({t.summary}): {cause}"
        )

    def fail(self, err: BaseException) -> None:
        """This rank gives up on the call (not for a lost peer): wake the others."""
        first = (str(err).splitlines() or [type(err).__name__])[0][:500]
        with contextlib.suppress(Exception), self._gate.turn():
            if self._conn.add(self.count, LOSS) % LOSS < 2 * self.n:
                self._conn.compare_set(
                    self.p + "end", "", f"fail:rank {self.ticket.rank}: {first}"
                )
        self._break()

    def close(self) -> None:
        """Stop the thread. A call that ended well leaves its counter and ``ok`` to
        its stream's next agreed call; after a failure the last survivor out deletes
        the call's keys (a rank given up on does not count itself)."""
        self._stop.set()
        self._thread.join()
        t = self.ticket
        if self._ok:
            pending[stream_of(t.prefix)] = (t.store, (self.count, self.p + "ok"))
            if t.listed:  # every rank is past the agreement: nobody reads the list
                with contextlib.suppress(Exception):
                    self._conn.delete_key(t.prefix + "arr")
                    self._conn.delete_key(t.prefix + "late")
            return
        with contextlib.suppress(Exception):
            lost = self.lost()
            if t.rank in lost or self._given_up:
                return
            if self._conn.add(self.p + "gone", 1) >= self.n - len(lost):
                for key in ("end", "lost", "by", "gone"):
                    self._conn.delete_key(self.p + key)
                for key in ("done", "failed", "arr", "late"):
                    self._conn.delete_key(t.prefix + key)


def _given_up(rank: int, where: str, why: str, doing: str) -> PeerLostError:
    return PeerLostError(
        f"rank {rank} was given up on during {where}: {why}, so the other ranks raise "
        f"PeerLostError naming it; rank {rank} was {doing}. Its groups of this call are "
        "not kept. It cannot go on with the others in this call: exit and rejoin through "
        "a restart, or call fmesh.recover(timeout=...) on every rank (it is kept if it "
        "checks in within the others' timeout).",
        (rank,),
    )


def _said(cause: object) -> str:
    first = (str(cause).splitlines() or [""])[0][:300]
    return f" torch said: {first}" if first and not first.startswith("fmesh:") else ""


def stream_of(prefix: str) -> str:
    """The stream of an agreement prefix ``fmesh/a/<generation>/<stream>/<number>/``."""
    return prefix[len(_agree.KEY_ROOT) :].split("/")[1]
