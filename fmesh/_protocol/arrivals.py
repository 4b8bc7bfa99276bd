"""Waiting for late ranks at an agreement, as long as torch would, and saying so.

A rank that has published its weight (``agreement.py``) waits for the call's outcome up
to the call's timeout: torch's default for the backend (30 minutes on gloo, 10 on
NCCL), as torch's own group creation waits for a late rank. torch waits in silence;
fmesh logs a warning on the ``fmesh`` logger every ``WARN_INTERVAL`` seconds of a
rank's wait, naming the ranks that have not arrived and the call.

Who has arrived is not in the decision register (a sum of weights counts ranks, it
does not name them), and asking every rank would cost O(world) requests. So the list
is kept only for calls that wait long, at a constant cost per waiting rank:

* A wait shorter than a quarter of ``WARN_INTERVAL`` costs nothing more (the common
  case: one wait, as before).
* Past it, a waiting rank appends itself to ``P+"arr"``. The first to do so creates the
  key (``compare_set``) and adds ``CENSUS`` to the sum: every rank that arrives later
  reads that in its sum and lists itself at once. So after two thirds of an interval
  the list holds every rank that has arrived.
* That first rank, the *reporter*, reads the list at two thirds of an interval into
  its wait and once an interval after, and publishes the ranks missing from it in
  ``P+"late"`` (at most ``_MAX_LISTED`` named, then a count): the only O(world) read, one
  per interval for the whole call. Every waiting rank's warning reads that short key.
* The reporter adds ``LISTED`` to ``P+"done"`` with its read, and the last reader
  removes both keys; a failed call's last rank removes them with the others.

So a waiting rank makes 1 or 2 requests for its listing, and 1 per warning; the
reporter 2 more per interval. The protocol: ``docs/design/agreement-protocol.md``.
"""

from __future__ import annotations

import datetime
import logging
import math
import time
from typing import TYPE_CHECKING

from .._compat.interruptible import peek
from .records import CENSUS, Ticket, append, read_done, timed_out, wait_get

if TYPE_CHECKING:
    from .._compat import Store

__all__ = ["WARN_INTERVAL", "wait_done"]

logger = logging.getLogger("fmesh")

WARN_INTERVAL = 60.0
"""Seconds between two warnings of a rank waiting for late ranks (tests shorten it)."""

_MAX_LISTED = 32
"""Late ranks named one by one in a warning; the rest are counted."""


def wait_done(
    conn: Store, ticket: Ticket, w: int, timeout: datetime.timedelta, listing: bool
) -> Ticket:
    """Wait for the outcome of ``ticket``'s call up to ``timeout``, warning each
    ``WARN_INTERVAL`` (see the module docstring). ``listing``: this rank's sum carried
    ``CENSUS``, so it lists itself at once."""
    import torch.distributed as dist

    p, total, interval = ticket.prefix, timeout.total_seconds(), WARN_INTERVAL
    start = time.monotonic()
    if listing:
        append(conn, p + "arr", f"{ticket.rank},")
    first = min(total, interval / 4)
    try:
        conn.wait([p + "done"], datetime.timedelta(seconds=first))
        return read_done(conn, ticket)
    except dist.DistStoreError:
        if first >= total:
            return timed_out(conn, ticket, w, timeout)
    opened = False
    report_at = math.inf
    warn_at = interval
    report: str | None = None
    while True:
        now = time.monotonic() - start
        if now >= total:
            return timed_out(conn, ticket, w, timeout, opened)
        if not listing:
            listing = True
            opened = _list(conn, ticket)
            report_at = interval * 2 / 3 if opened else math.inf
        elif now >= report_at:
            report = _report(conn, ticket)
            report_at += interval
        elif now >= warn_at:
            _warn(conn, ticket, now, total, report)
            warn_at += interval
        elif wait_get(conn, p + "done", min(total, warn_at, report_at) - now) is not None:
            # A wait of this client timed out: trust no wait, read (wait_get does).
            return read_done(conn, ticket, opened)


def _list(conn: Store, ticket: Ticket) -> bool:
    """Append this rank to the list of arrivals; whether it opened the list."""
    p, me = ticket.prefix, f"{ticket.rank},"
    if conn.compare_set(p + "arr", "", me).decode() != me:
        append(conn, p + "arr", me)
        return False
    if conn.add(p + "n", CENSUS) == CENSUS:  # the call completed and its sum is gone
        conn.delete_key(p + "n")
    return True


def _report(conn: Store, ticket: Ticket) -> str:
    """The reporter: publish the ranks missing from the list of arrivals."""
    raw = peek(conn, ticket.prefix + "arr")
    here = {int(r) for r in (raw or b"").decode().split(",") if r}
    missing = [r for r in ticket.ranks if r not in here]
    text = ", ".join(map(str, missing[:_MAX_LISTED]))
    if len(missing) > _MAX_LISTED:
        text += f", ... ({len(missing)} in all)"
    conn.set(ticket.prefix + "late", text)
    return text


def _warn(
    conn: Store, ticket: Ticket, waited: float, total: float, report: str | None
) -> None:
    """Log that this rank is still waiting, naming the ranks not there (as the
    reporter last published them)."""
    if report is None:
        raw = peek(conn, ticket.prefix + "late")
        report = None if raw is None else raw.decode()
    if report == "":
        return  # every rank is there: the outcome is on its way
    who = "ranks not known yet" if report is None else f"ranks [{report}]"
    logger.warning(
        "fmesh: rank %d has waited %.0f s at %s (%s) for %s, which have not reached it; "
        "it waits up to %.0f s in all (the call's timeout), then raises "
        "MeshMismatchError naming them",
        ticket.rank,
        waited,
        ticket.where,
        ticket.summary,
        who,
        total,
    )
