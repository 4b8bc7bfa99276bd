"""The agreement's shared records and store helpers, and what ranks do when a call
does not simply succeed (a mismatch, a timeout's census, a late rank).

Used by ``agreement.py`` and ``_runtime/recover.py``; every function takes the calling
thread's connection and the call's ticket.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, cast, final

import attrs

from .._compat.interruptible import peek
from .._core.errors import MeshMismatchError

if TYPE_CHECKING:
    from .._compat import Store

__all__ = [
    "ABORT",
    "CENSUS",
    "LISTED",
    "POISON",
    "Record",
    "Ticket",
    "Untyped",
    "append",
    "late",
    "mismatch",
    "read_done",
    "timed_out",
    "wait_get",
]

POISON = 1 << 60
"""Added to ``P+"n"`` by a timeout coordinator: no sum of weights reaches it."""
ABORT = 1 << 40
"""Added to ``P+"done"`` to abort a call: more than any count of readers."""
CENSUS = 1 << 59
"""Added to ``P+"n"`` once, by the rank that opens the list of arrivals ``P+"arr"``
after waiting a while (``arrivals.py``): a rank that arrives later reads it in its sum
and lists itself. Above any sum of weights, below ``POISON``."""
LISTED = 1 << 30
"""Added to ``P+"done"`` with its read by the rank that opened ``P+"arr"``: the last
reader then removes the list. Above any count of readers, far below ``ABORT``."""

_KEYS = (
    "n",
    "done",
    "mm",
    "other",
    "to",
    "who",
    "wc",
    "verdict",
    "fin",
    "failed",
    "arr",
    "late",
)
_MAX_SUMMARY = 2000
_MAX_LISTED = 32
"""Missing ranks named one by one in a verdict; the rest are counted."""

_MISMATCH_HELP = (
    "Every rank must call fmesh.realize() with the same mesh, backend and options, in "
    "the same order (SPMD), memo hits included. Check for rank-dependent mesh "
    "construction (e.g. sizes computed from the local device count) and for realize() "
    "calls made on some ranks only."
)
_MISSING_HELP = (
    "Every rank must make the same realize() calls in the same order (per process, or "
    "per fmesh.stream(name) block). Check the missing ranks' logs; "
    "if they are only slow (e.g. still loading data), pass a longer "
    "realize(timeout=...)."
)


def _grace(n: int) -> float:
    """Seconds to wait for peers that are known to be awake (failure paths)."""
    return 5.0 + n / 2000


@final
@attrs.frozen(slots=True)
class Record:
    """What one rank realizes at a call, in words (read only on failure paths)."""

    rank: int
    code: int
    summary: str
    """The mesh, backends and options of the call."""
    history: str
    """The realize calls this rank made since its last agreement (memo hits), or ""."""

    def text(self) -> str:
        summary = self.summary
        if len(summary) > _MAX_SUMMARY:
            summary = summary[: _MAX_SUMMARY - 1] + "…"
        return "\x1f".join((str(self.rank), str(self.code), summary, self.history))

    @classmethod
    def parse(cls, raw: bytes) -> Record:
        rank, code, summary, history = raw.decode().split("\x1f", 3)
        return cls(int(rank), int(code), summary, history)

    def says(self) -> str:
        done = f" after {self.history} since its last agreement" if self.history else ""
        return f"rank {self.rank} realizes {self.summary}{done}"


@final
@attrs.frozen(slots=True, eq=False)
class Ticket:
    """One agreed call on this rank."""

    store: Store
    rank: int
    ranks: Sequence[int]
    """The ranks that agree (the world less ranks declared lost), ascending."""
    prefix: str
    where: str
    """``realize call #k`` (``... of stream 'S'``), for messages."""
    record: Callable[[], Record]
    """This rank's record, computed only when a message needs it."""
    closing: bool = False
    """A closing barrier follows (``watch.py``): it goes on counting on ``P+"done"``,
    which the agreement then leaves in place."""
    listed: bool = False
    """This rank opened the list of arrivals (``arrivals.py``) of a call with a closing
    barrier: it removes ``P+"arr"`` and ``P+"late"`` once the call is over."""
    conn: Store = attrs.field(
        kw_only=True, default=attrs.Factory(lambda self: self.store, takes_self=True)
    )
    """The connection of the thread that agreed (``agreement.thread_store``): the call's
    watch and its failure reports use it too (the store itself on the main thread)."""

    @property
    def summary(self) -> str:
        return self.record().summary


class Untyped(Protocol):
    """Store methods that exist on torch 2.11..2.15 but are missing from its stubs."""

    def append(self, key: str, value: str) -> None: ...
    def clone(self) -> Store: ...


def append(store: Store, key: str, value: str) -> None:
    cast("Untyped", store).append(key, value)


def read_done(conn: Store, ticket: Ticket, opened: bool = False) -> Ticket:
    """Count this rank as having read the outcome; raise if the call was aborted.
    ``opened``: this rank opened the list of arrivals (the last reader removes it)."""
    # Under a closing barrier (``watch.py``) the counter goes on to ``2n``: the opener
    # removes the list itself once every rank is out (``Ticket.listed``).
    tag = LISTED if opened and not ticket.closing else 0
    r = conn.add(ticket.prefix + "done", 1 + tag)
    if r < ABORT:
        if r % LISTED == len(ticket.ranks) and not ticket.closing:
            conn.delete_key(ticket.prefix + "done")
            if r >= LISTED:
                conn.delete_key(ticket.prefix + "arr")
                conn.delete_key(ticket.prefix + "late")
        return attrs.evolve(ticket, listed=True) if opened and not tag else ticket
    raise _aborted(conn, ticket)


def _finish(conn: Store, ticket: Ticket) -> None:
    """This rank is done with a failed call; the last of its ranks removes the keys."""
    if conn.add(ticket.prefix + "fin", 1) == len(ticket.ranks):
        for key in _KEYS:
            conn.delete_key(ticket.prefix + key)


def wait_get(conn: Store, key: str, seconds: float) -> bytes | None:
    """The value of ``key`` once it exists, waiting at most ``seconds`` (0: no wait).

    Each wait is followed by a read that does not wait, and waited again if that finds
    nothing: torch's store client can return from a wait before its key exists (seen
    after an earlier wait of the same client timed out)."""
    import torch.distributed as dist

    if seconds <= 0:
        return peek(conn, key)
    deadline = time.monotonic() + seconds
    left = seconds
    while left > 0:
        try:
            conn.wait([key], datetime.timedelta(seconds=left))
        except dist.DistStoreError:
            return None
        raw = peek(conn, key)
        if raw is not None:
            return raw
        left = deadline - time.monotonic()
    return None


# -- mismatch ---------------------------------------------------------------------------


def mismatch(conn: Store, ticket: Ticket) -> MeshMismatchError:
    """This rank's weight differs from an earlier one: record it, wake everyone."""
    mine = ticket.record()
    first = Record.parse(conn.compare_set(ticket.prefix + "mm", "", mine.text()))
    conn.add(ticket.prefix + "done", ABORT)
    return _explain(conn, ticket, first)


def _aborted(conn: Store, ticket: Ticket) -> MeshMismatchError:
    """The call was aborted while this rank waited: a mismatch, or a timeout census."""
    if conn.check([ticket.prefix + "mm"]):
        return _explain(conn, ticket, Record.parse(conn.get(ticket.prefix + "mm")))
    append(conn, ticket.prefix + "who", f"{ticket.rank},")
    conn.add(ticket.prefix + "wc", 1)
    return _verdict(conn, ticket, 2 * _grace(len(ticket.ranks)), late=False)


def _explain(conn: Store, ticket: Ticket, first: Record) -> MeshMismatchError:
    """Name both sides of a mismatch: ``first`` and a rank that differs from it."""
    mine = ticket.record()
    other: Record | None = first
    if first.code == mine.code:
        # This rank is on the recorded side: wait for one from the other side.
        raw = wait_get(conn, ticket.prefix + "other", _grace(len(ticket.ranks)))
        other = None if raw is None else Record.parse(raw)
    else:
        conn.compare_set(ticket.prefix + "other", "", mine.text())
    _finish(conn, ticket)
    if other is None:
        reason = (
            f"an earlier rank realizes something else at {ticket.where}, while {mine.says()}"
        )
    elif other.summary == mine.summary:
        reason = (
            f"ranks {mine.rank} and {other.rank} disagree at {ticket.where}: both realize "
            f"{mine.summary}, but not after the same calls since their last agreement: "
            f"rank {mine.rank} made {mine.history or 'none'}, rank {other.rank} made "
            f"{other.history or 'none'}"
        )
    else:
        reason = (
            f"ranks {mine.rank} and {other.rank} disagree at {ticket.where}: "
            f"{mine.says()}, {other.says()}"
        )
    return MeshMismatchError(f"{reason}. {_MISMATCH_HELP}")


# -- timeout ----------------------------------------------------------------------------


def timed_out(
    conn: Store, ticket: Ticket, w: int, timeout: datetime.timedelta, opened: bool = False
) -> Ticket:
    """This rank waited ``timeout``: coordinate the abort, or follow whoever does.
    ``opened``: as for ``read_done``."""
    p, n = ticket.prefix, len(ticket.ranks)
    me = f"T{ticket.rank}"
    if conn.compare_set(p + "to", "", me).decode() != me:
        # Another waiter coordinates (or found the call complete): its outcome.
        if wait_get(conn, p + "done", 2 * _grace(n)) is None:
            raise _verdict(conn, ticket, 0.0, late=False)
        return read_done(conn, ticket, opened)
    s = (conn.add(p + "n", POISON) - POISON) % CENSUS
    if s in (0, n * w):  # the last rank arrived meanwhile: the call succeeded
        if s == 0:
            conn.delete_key(p + "n")  # it was deleted; the poison re-created it
        conn.delete_key(p + "to")
        conn.wait([p + "done"], datetime.timedelta(seconds=_grace(n)))
        return read_done(conn, ticket, opened)
    conn.add(p + "done", ABORT)
    if s % w:
        raise _aborted(conn, ticket)  # a mismatch is being reported
    raise _census(conn, ticket, s // w, timeout)


def _census(
    conn: Store, ticket: Ticket, arrived: int, timeout: datetime.timedelta
) -> Exception:
    """The coordinator: find out who arrived, publish the verdict, raise it."""
    p, ranks = ticket.prefix, ticket.ranks
    append(conn, p + "who", f"{ticket.rank},")
    conn.add(p + "wc", 1)
    deadline = time.monotonic() + _grace(len(ranks))
    while conn.add(p + "wc", 0) < arrived and time.monotonic() < deadline:
        time.sleep(0.02)
    here = {int(r) for r in conn.get(p + "who").decode().split(",") if r}
    missing = [r for r in ranks if r not in here]
    listed = ", ".join(map(str, missing[:_MAX_LISTED]))
    if len(missing) > _MAX_LISTED:
        listed += f", ... ({len(missing)} in all)"
    verdict = (
        f"ranks [{listed}] never reached {ticket.where} within "
        f"{timeout.total_seconds():g}s (rank {ticket.rank} waited, realizing "
        f"{ticket.summary}). They may have died, be stuck, have skipped this call, or "
        "have realized a mesh they already had (a memo hit, which takes no part in "
        "agreement: such a rank raises at its next realize call that creates groups). "
        + _MISSING_HELP
    )
    conn.set(p + "verdict", verdict)
    return _verdict(conn, ticket, 0.0, late=False)


def late(conn: Store, ticket: Ticket) -> MeshMismatchError:
    """This rank arrived after the call was aborted."""
    if conn.check([ticket.prefix + "mm"]):
        return _explain(conn, ticket, Record.parse(conn.get(ticket.prefix + "mm")))
    return _verdict(conn, ticket, 2 * _grace(len(ticket.ranks)), late=True)


def _verdict(conn: Store, ticket: Ticket, wait: float, late: bool) -> MeshMismatchError:
    raw = wait_get(conn, ticket.prefix + "verdict", wait)
    mine = ticket.record()
    _finish(conn, ticket)
    if raw is None:
        why = (
            f"the call was aborted after a timeout, and the rank coordinating the abort "
            f"published no verdict (it may have died). {_MISSING_HELP}"
        )
    else:
        why = raw.decode()
    when = "arrived after the other ranks gave up on" if late else "stopped at"
    history = f" (after {mine.history} since its last agreement)" if mine.history else ""
    return MeshMismatchError(f"rank {ticket.rank} {when} {ticket.where}{history}: {why}")
