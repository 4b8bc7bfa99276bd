"""A creating call's long waits and its ends: late ranks waited for as long as torch
would and named, the call's timeout, and the keys a call leaves.

A rank waits for its peers inside a creating call (their groups' rendezvous, the
closing round) up to the call's timeout: torch's default for the backend (30 minutes
on gloo, 10 on NCCL), as torch's own group creation waits for a late rank. torch waits
in silence; fmesh logs a warning on the ``fmesh`` logger every ``WARN_INTERVAL``
seconds of a rank's wait, naming the ranks that have not arrived. Who is present is
kept only for calls that wait long, at a constant cost per waiting rank:

* a wait shorter than a quarter of ``WARN_INTERVAL`` costs nothing more;
* past it, a waiting rank lists itself in ``P+"arr"`` (the first to do so is the
  *reporter*: it reads the list once an interval and publishes the ranks missing from
  it in ``P+"late"``, the only O(world) read, and every warning reads that short key);
* at the timeout, the first rank to get there coordinates a census: it sets the
  verdict to ``census`` (every waiting rank lists itself at its next read) and reads
  the list once. If a rank is missing, it adds ``POISON`` to the count (a late rank
  reads it there) and publishes the ranks missing (``timeout``); if every rank is
  there, only slow, it calls the census off (the verdict ``""``) and holds another a
  timeout later.

A call that ended well leaves its count and ``ok`` to its stream's next call (whose
last rank out removes them: it knows every rank left this one). A failed call's keys
go once every rank of it is out, except the verdict, which stays until every rank it
names (lost, or missing) has read it. The protocol: ``docs/design/agreement-protocol.md``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

from .._compat.interruptible import peek
from .._core.errors import MeshMismatchError
from .records import ABORT, POISON, Ticket, append, wait_get

if TYPE_CHECKING:
    from .._compat import Store

__all__ = [
    "WARN_INTERVAL",
    "Arrivals",
    "clean_previous",
    "forget_pending",
    "leave",
    "timeout_error",
]

logger = logging.getLogger("fmesh")

WARN_INTERVAL = 60.0
"""Seconds between two warnings of a rank waiting for late ranks (tests shorten it)."""
_MAX_LISTED = 32
"""Late ranks named one by one in a message; the rest are counted."""
_KEYS = ("n", "ok", "mm", "full", "arr", "late", "to", "failed")
_VERDICT = ("end", "lost", "by", "miss", "verdict", "gone", "read")

MISSING_HELP = (
    "Every rank must make the same realize() calls in the same order (per process, or "
    "per fmesh.stream(name) block). Check the missing ranks' logs; "
    "if they are only slow (e.g. still loading data), pass a longer "
    "realize(timeout=...)."
)


def _grace(n: int, interval: float) -> float:
    """Seconds to wait for peers that are known to be awake (failure paths)."""
    return 2 * interval + 2.0 + n / 2000


def _ranks(raw: bytes | None) -> set[int]:
    return {int(r) for r in (raw or b"").decode().split(",") if r}


def _listed(ranks: list[int]) -> str:
    text = ", ".join(map(str, ranks[:_MAX_LISTED]))
    if len(ranks) > _MAX_LISTED:
        text += f", ... ({len(ranks)} in all)"
    return text


class Arrivals:
    """One rank's slow path of a call's waits (module docstring)."""

    def __init__(self, ticket: Ticket, patience: float, interval: float) -> None:
        self.t = ticket
        self.patience = patience
        self.interval = interval
        self.listed = False
        self.reporter = False
        self.report_at = math.inf
        self.warn_at = WARN_INTERVAL
        self.report: str | None = None
        self.census_at = patience

    def tick(self, conn: Store, waited: float) -> bool:
        """At a slice's end, ``waited`` seconds into the call: at most one request of
        the slow path; whether the call is over (its timeout's verdict is out)."""
        if waited >= self.census_at:
            return self._timed_out(conn, waited)
        if not self.listed and waited >= WARN_INTERVAL / 4:
            if self.present(conn):
                self.reporter, self.report_at = True, WARN_INTERVAL * 2 / 3
        elif self.reporter and waited >= self.report_at:
            self.report = self._report(conn)
            self.report_at += WARN_INTERVAL
        elif waited >= self.warn_at:
            self._warn(conn, waited)
            self.warn_at += WARN_INTERVAL
        return False

    def present(self, conn: Store) -> bool:
        """List this rank as present (once); whether it opened the list."""
        if self.listed:
            return False
        self.listed = True
        p, me = self.t.prefix, f"{self.t.rank},"
        if conn.compare_set(p + "arr", "", me).decode() == me:
            return True
        append(conn, p + "arr", me)
        return False

    def tidy(self, conn: Store) -> None:
        """The call ended well: the rank that opened the list of ranks present or
        coordinated a census removes what they left."""
        if self.reporter:
            for key in ("arr", "late", "to", "end"):
                conn.delete_key(self.t.prefix + key)

    def _report(self, conn: Store) -> str:
        """The reporter: publish the ranks missing from the list."""
        here = _ranks(peek(conn, self.t.prefix + "arr"))
        text = _listed([r for r in self.t.ranks if r not in here])
        conn.set(self.t.prefix + "late", text)
        return text

    def _warn(self, conn: Store, waited: float) -> None:
        report = self.report
        if report is None:
            raw = peek(conn, self.t.prefix + "late")
            report = None if raw is None else raw.decode()
        if report == "":
            return  # every rank is there: the outcome is on its way
        who = "ranks not known yet" if report is None else f"ranks [{report}]"
        logger.warning(
            "fmesh: rank %d has waited %.0f s at %s (%s) for %s, which have not reached "
            "it; it waits up to %.0f s in all (the call's timeout), then raises "
            "MeshMismatchError naming them",
            self.t.rank,
            waited,
            self.t.where,
            self.t.summary,
            who,
            self.patience,
        )

    def _timed_out(self, conn: Store, waited: float) -> bool:
        """The call's timeout: the first rank there coordinates a census; every rank
        present lists itself. If every rank is present (only slow), the census is
        called off and held again a timeout later; else the call ends, naming the
        ranks missing. The others follow its verdict."""
        t, p = self.t, self.t.prefix
        if waited < self.census_at:
            return False
        self.census_at += self.patience
        me = f"T{t.rank}"
        if conn.compare_set(p + "to", "", me).decode() != me:
            return False  # another rank coordinates: its verdict comes with the reads
        self.reporter = True  # it removes what the census left if the call ends well
        if conn.compare_set(p + "end", "", "census").decode() != "census":
            return True  # another verdict came first
        self.present(conn)
        time.sleep(_grace(t.n, self.interval))
        here = _ranks(peek(conn, p + "arr"))
        missing = [r for r in t.ranks if r not in here]
        if not missing:  # every rank is here, only slow: wait on
            conn.compare_set(p + "end", "census", "")
            return False
        if conn.add(p + "n", POISON) % ABORT >= t.n:
            conn.compare_set(p + "end", "census", "")
            return False  # the last rank got out meanwhile: the call succeeded
        conn.set(p + "miss", ",".join(map(str, missing)))
        conn.set(
            p + "verdict",
            f"ranks [{_listed(missing)}] never reached {t.where} within "
            f"{self.patience:g}s (rank {t.rank} waited, realizing {t.summary}). They may "
            "have died, be stuck, have skipped this call, or have realized a mesh they "
            "already had (a memo hit, which takes no part in agreement: such a rank "
            "raises at its next realize call that creates groups). " + MISSING_HELP,
        )
        conn.compare_set(p + "end", "census", "timeout")
        t.mark_failed(conn)
        return True

    def verdict(self, conn: Store) -> MeshMismatchError:
        """The error of a call its ranks gave up on at its timeout."""
        return timeout_error(conn, self.t, 2 * _grace(self.t.n, self.interval))


def timeout_error(conn: Store, t: Ticket, wait: float) -> MeshMismatchError:
    """The error of a call its ranks gave up on at its timeout (waiting ``wait``
    seconds for the coordinator's verdict): this rank stopped at it, or arrived after."""
    raw = wait_get(conn, t.prefix + "verdict", wait)
    late = t.rank in _ranks(peek(conn, t.prefix + "miss"))
    mine = t.record()
    if raw is None:
        why = (
            "the call was aborted after a timeout, and the rank coordinating the "
            f"abort published no verdict (it may have died). {MISSING_HELP}"
        )
    else:
        why = raw.decode()
    when = "arrived after the other ranks gave up on" if late else "stopped at"
    history = f" (after {mine.history} since its last agreement)" if mine.history else ""
    return MeshMismatchError(f"rank {t.rank} {when} {t.where}{history}: {why}")


_pending: dict[tuple[str, int], tuple[object, tuple[str, ...]]] = {}
"""Per stream (and rank: tests play several ranks in one process): the store and the
keys of its last call that ended well."""


def forget_pending() -> None:
    """The runtime's memo was reset: its calls' keys belong to another world."""
    _pending.clear()


def clean_previous(ticket: Ticket, last: bool) -> None:
    """This rank is out of a call that ended well: the last rank out removes the
    stream's previous call's keys (every rank left it); this call's keys wait for the
    next call."""
    stream = (ticket.stream, ticket.rank)
    store, keys = _pending.get(stream, (None, ()))
    if last and store is ticket.store:
        for key in keys:
            ticket.conn.delete_key(key)
    _pending[stream] = (ticket.store, (ticket.prefix + "n", ticket.prefix + "ok"))


def leave(ticket: Ticket, named: bool, lost: tuple[int, ...]) -> None:
    """This rank is out of a failed call. Its keys go once every other rank of it is
    out (``P+"gone"`` counts them); its verdict once, besides, every rank the verdict
    names (``lost``, or missing at a timeout) has read it (``P+"read"``): ``named``
    says this rank is one of them."""
    conn, p = ticket.conn, ticket.prefix
    accused = set(lost) | _ranks(peek(conn, p + "miss"))
    if named or ticket.rank in accused:
        if conn.add(p + "read", 1) >= len(accused) and conn.add(p + "gone", 0) >= (
            ticket.n - len(accused)
        ):
            for key in _KEYS + _VERDICT:  # a late rank's count re-made "n"
                conn.delete_key(p + key)
        return
    if conn.add(p + "gone", 1) < ticket.n - len(accused):
        return
    for key in _KEYS:
        conn.delete_key(p + key)
    if conn.add(p + "read", 0) >= len(accused):
        for key in _VERDICT:
            conn.delete_key(p + key)
