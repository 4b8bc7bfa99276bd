"""Agreement among the ranks of a creating call, in the same round trip as the record.

Each rank swaps its short record (``records.Entry``: the call's number in its stream,
its code, the rank, and the axis names where they are compared apart) into its
stream's key ``S+"c"`` with one ``compare_set``, which answers the record of the first
rank of the call: a rank whose call differs from the first rank's knows at once, names
both, and ends the call for every rank (``P+"end"`` = ``mm``, read by the others at
their next read of the verdict). Nothing else is waited for here: the ranks create
their groups at once, and the call's closing round (``watch.Watch.finish``: one count
and one wait) is where every rank learns that all ranks made the same call and made
their groups. A world-collective creation (NCCL's split of the world communicator)
must not start before every rank agrees: such a call runs the closing round first.

The key ``S+"c"`` is never deleted, only swapped: each rank knows its value (the first
record of the stream's last call, answered to every rank of it) and expects it; a rank
whose expectation is stale (it made no record at that call) swaps again once. A rank
that finds the stream's record marked failed (``!``), or at a later call with a
verdict at its own, comes after the others ended its call: it raises that verdict
before it creates anything, and leaves their later call alone. Costs and
the rest of the protocol: ``docs/design/agreement-protocol.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs

from .._compat.interruptible import peek
from .._core.errors import MeshMismatchError
from .arrivals import leave, timeout_error
from .connections import thread_store
from .records import ABORT, KEY_ROOT, Entry, Record, Ticket, append, wait_get
from .verdicts import found_by, given_up, lost_ranks, peer_lost

if TYPE_CHECKING:
    from .._compat import Store

__all__ = [
    "MISMATCH_HELP",
    "abort",
    "count_keys",
    "explain",
    "failures",
    "forget_streams",
    "give_up",
    "open_call",
]

logger = logging.getLogger("fmesh")

MISMATCH_HELP = (
    "Every rank must call fmesh.realize() with the same mesh, backend and options, in "
    "the same order (SPMD), memo hits included. Check for rank-dependent mesh "
    "construction (e.g. sizes computed from the local device count) and for realize() "
    "calls made on some ranks only."
)
_GRACE = 5.0
"""Seconds a rank that found a mismatch waits for the first rank's full record."""

_expected: dict[tuple[str, int], str] = {}
"""Per stream prefix (and rank: tests play several ranks in one process): the value of
its ``c`` key as this rank last read it."""


def count_keys(store: Store) -> int:
    """How many keys of this protocol ``store`` holds (hygiene checks in tests)."""
    return sum(KEY_ROOT in key for key in store.list_keys())


def forget_streams() -> None:
    """The runtime's memo was reset: streams start again in the new generation."""
    _expected.clear()


def open_call(
    store: Store,
    *,
    rank: int,
    ranks: Sequence[int],
    entry: Entry,
    record: Callable[[], Record],
    stream: str,
    prefix: str,
    where: str,
) -> Ticket:
    """Put this rank's record in; the call's ticket, or ``MeshMismatchError`` if the
    first rank of the call made another call (see the module docstring).

    Args:
        store: the store every rank of ``ranks`` reaches (the default store).
        rank: this rank, a member of ``ranks``.
        ranks: the ranks of the call, ascending.
        entry: this rank's short record (``entry.rank == rank``).
        record: this rank's call in words (called on failure paths only).
        stream: the stream's key prefix ``S`` (``fmesh/a/<generation>/<stream>/``).
        prefix: the call's own key prefix ``P`` (``S + "<number>/"``).
        where: the call in words (``realize call #3``).
    """
    import torch.distributed as dist

    conn = thread_store(store)
    ticket = Ticket(store, conn, rank, ranks, prefix, where, entry, record, entry)
    if len(ranks) <= 1:
        return ticket
    mine = entry.text()
    try:
        got = mine
        for _ in range(3):
            expected = _expected.get((stream, rank), "")
            got = bytes(conn.compare_set(stream + "c", expected, mine)).decode()
            first = Entry.parse(got)
            _expected[stream, rank] = got
            if got == mine or first is None or first.number >= entry.number:
                break
            # A record of an earlier call: this rank's expectation was stale.
    except dist.DistError as err:
        raise MeshMismatchError(
            f"rank {rank} lost the store during {where}: {err}. The process hosting "
            "the store (rank 0 or the torchrun agent) may have died; see its logs."
        ) from err
    first = Entry.parse(got) or entry
    ticket = Ticket(store, conn, rank, ranks, prefix, where, entry, record, first)
    if first.number > entry.number:
        end = peek(conn, prefix + "end")
        if end:  # the others ended this call without this rank, and went on
            _expected[stream, rank] = expected  # it is to meet their next call
            raise _came_after(ticket, end)
    if first.gave_up and first.number == entry.number:  # its verdict is out
        raise _came_after(ticket, peek(conn, prefix + "end") or b"timeout")
    if first.number != entry.number or first.code != entry.code:
        if peek(conn, prefix + "end") in (b"census", b"timeout"):
            # The others gave up on this call at its timeout before this rank came.
            raise timeout_error(conn, ticket, _GRACE)
        raise _mismatch(ticket)
    if first.names != entry.names:
        logger.warning(
            "fmesh: ranks %d and %d name the dims of the same groups differently at %s: "
            "rank %d calls them (%s), rank %d (%s). torch lets the names differ, and the "
            "groups are the same, so this call goes on; a dim looked up by name then "
            "means another dim on each of them",
            first.rank,
            rank,
            where,
            first.rank,
            first.names,
            rank,
            entry.names,
        )
    return ticket


def _mismatch(ticket: Ticket) -> MeshMismatchError:
    """This rank's call differs from the first rank's: end the call for every rank
    (the first rank's call too, if it is at another number), record this side in full,
    and name both sides."""
    conn, p = ticket.conn, ticket.prefix
    for prefix in dict.fromkeys((p, f"{ticket.stream}{ticket.first.number}/")):
        conn.add(prefix + "n", ABORT)
        conn.compare_set(prefix + "mm", "", ticket.record().text())
        conn.compare_set(prefix + "end", "", "mm")
    ticket.mark_failed(conn)
    error = explain(conn, ticket)
    leave(ticket, False, ())
    return error


def _came_after(ticket: Ticket, end: bytes) -> Exception:
    """The error of a rank that comes to a call after its verdict (``end``) is out
    (the stream's record is marked failed, or at a later call): the verdict, as the
    others raised it. A later call is theirs and this rank's next one: it is left
    alone. This rank is counted out of the call."""
    conn, p, rank = ticket.conn, ticket.prefix, ticket.rank
    lost = lost_ranks(conn, p) if end == b"lost" else ()
    where = f"{ticket.where} ({ticket.summary})"
    doing = "coming to it after the other ranks had ended it"
    error: Exception
    if end == b"mm":
        raw = wait_get(conn, p + "full", _GRACE)  # the first rank's side
        if raw is None:
            error = MeshMismatchError(
                f"rank {rank} came to {ticket.where} after the other ranks had ended it "
                "on a mismatch (the first rank published no record of its own: it may "
                f"have died), while {ticket.record().says()}. {MISMATCH_HELP}"
            )
        else:
            first = Record.parse(raw)
            entry = Entry(ticket.entry.number, first.code, first.rank)
            error = explain(conn, attrs.evolve(ticket, first=entry))
    elif end in (b"census", b"timeout"):
        error = timeout_error(conn, ticket, _GRACE)
    elif rank in lost:
        why = f"the other ranks declared it lost{found_by(conn, p)}"
        error = given_up(rank, where, why, doing)
    elif lost:
        error = peer_lost(rank, where, lost, found_by(conn, p), doing, "")
    else:  # fail:<why>, a rank's creation failed
        error = MeshMismatchError(
            f"rank {rank} came to {where} after the other ranks had ended it: another "
            f"rank gave up on the call: {end.decode(errors='replace').removeprefix('fail:')}"
        )
    leave(ticket, False, lost)  # a rank named lost or missing counts as having read it
    return error


def explain(conn: Store, ticket: Ticket) -> MeshMismatchError:
    """Name both sides of a mismatch: the first rank's call and one that differs from
    it (``P+"mm"``). The first rank publishes its own call in full (``P+"full"``) when
    it learns of the mismatch; the others wait for it if they are on the other side."""
    p, mine, first = ticket.prefix, ticket.record(), ticket.first
    if first.number != ticket.entry.number:
        return MeshMismatchError(
            f"ranks {ticket.rank} and {first.rank} are at different creating calls: rank "
            f"{ticket.rank} makes {ticket.where}, rank {first.rank} its realize call "
            f"#{first.number} of the same stream: they made different numbers of realize "
            f"calls that create groups before it. {MISMATCH_HELP}"
        )
    if first.rank == ticket.rank:
        conn.compare_set(p + "full", "", mine.text())
    on_first_side = first.code == ticket.entry.code
    raw = wait_get(conn, p + ("mm" if on_first_side else "full"), _GRACE)
    other = None if raw is None else Record.parse(raw)
    if other is None:
        reason = (
            f"rank {first.rank} realizes something else at {ticket.where}, while {mine.says()}"
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
    return MeshMismatchError(f"{reason}. {MISMATCH_HELP}")


# -- a creation that failed after every rank made its record -----------------------


def give_up(ticket: Ticket, why: str, among: Sequence[int], grace: float) -> dict[int, str]:
    """This rank gives up on ``ticket``'s call (``why``: its group creation failed),
    telling the others; returns why members of ``among`` gave up on it, by rank,
    waiting up to ``grace`` seconds for a first report (a peer's own timeout can end a
    moment after ours)."""
    abort(ticket, why)
    deadline = time.monotonic() + grace
    while True:
        found = {r: m for r, m in failures(ticket).items() if r != ticket.rank and r in among}
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)


def abort(ticket: Ticket, message: str) -> None:
    """Tell the other ranks why this rank gave up on ``ticket``'s call; they read it
    with ``failures``."""
    append(ticket.conn, ticket.prefix + "failed", f"{ticket.rank}\x1f{message}\x1e")


def failures(ticket: Ticket) -> dict[int, str]:
    """Why ranks gave up on ``ticket``'s call so far (``abort``), by rank."""
    raw = wait_get(ticket.conn, ticket.prefix + "failed", 0.0)
    if raw is None:
        return {}
    out: dict[int, str] = {}
    for item in raw.decode().split("\x1e"):
        if item:
            r, _, message = item.partition("\x1f")
            out.setdefault(int(r), message)
    return out
