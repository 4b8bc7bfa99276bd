"""Agreement among the ranks of a realize call that creates groups.

Ranks that disagree, stall, die or skip a call get a ``MeshMismatchError``,
never a hang; a call that agrees costs each rank about as much of the store as torch's
own barrier. A late rank is waited for up to the timeout, with a warning each minute
(``arrivals.py``). The protocol: ``docs/design/agreement-protocol.md``.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from .._core.errors import MeshMismatchError
from . import records as _records
from .arrivals import wait_done
from .records import CENSUS, POISON, Record, Ticket, append, wait_get

if TYPE_CHECKING:
    from .._compat import Store

__all__ = [
    "KEY_ROOT",
    "POISON",
    "Record",
    "Ticket",
    "abort",
    "agree",
    "count_keys",
    "failures",
    "forget_connections",
    "give_up",
    "new_connection",
    "thread_store",
    "weight",
]

KEY_ROOT = "fmesh/a/"
"""Every key of this protocol contains this string."""


def weight(code: int, n: int) -> int:
    """The odd weight of ``code`` among ``n`` ranks: ``n * weight < 2**58``.

    >>> w = weight(12345, 4); w % 2, 4 * w < 2**58, w == weight(12345, 4)
    (1, True, True)
    """
    bits = 58 - n.bit_length()
    return ((code % (1 << (bits - 2))) << 1) | (1 << (bits - 1)) | 1


# -- connections ------------------------------------------------------------------------

_local = threading.local()
_generation = [0]


def forget_connections() -> None:
    """Make every thread clone its store connection anew: the runtime calls this when
    its memo is reset (``destroy``, a new default process group), whose store may be
    another one at the same address."""
    _generation[0] += 1


def _conn(store: Store) -> Store:
    """The connection this thread uses: ``store`` itself on the main thread, a clone
    (cached per thread) on any other.

    A TCPStore client serializes its operations, and a wait holds it: threads sharing
    one would stall each other. A clone is made once per thread: connecting costs a
    round trip and, when many ranks connect at once, can stall on the accept queue.
    """
    if threading.current_thread() is threading.main_thread():
        return store
    entry: tuple[Store, Store, int] | None = getattr(_local, "conn", None)
    if entry is not None and entry[0] is store and entry[2] == _generation[0]:
        return entry[1]
    clone = new_connection(store)
    _local.conn = (store, clone, _generation[0])
    return clone


def thread_store(store: Store) -> Store:
    """The connection to ``store`` for this thread; give it to each group creation
    (torch's gloo rendezvous waits in the store, so threads must not share one)."""
    return _conn(store)


def new_connection(store: Store) -> Store:
    """A new client of the same store (the store itself if it cannot clone)."""
    try:
        return cast("_records.Untyped", store).clone()
    except (RuntimeError, NotImplementedError):
        return store


def count_keys(store: Store) -> int:
    """How many keys of this protocol ``store`` holds (hygiene checks in tests)."""
    return sum(KEY_ROOT in key for key in store.list_keys())


# -- agree ------------------------------------------------------------------------------


def agree(
    store: Store,
    *,
    rank: int,
    ranks: Sequence[int],
    code: int,
    record: Callable[[], Record],
    timeout: datetime.timedelta,
    prefix: str,
    where: str,
    closing: bool = False,
) -> Ticket:
    """Agree with every rank of ``ranks`` on this call (see the module docstring).

    Args:
        store: the store every rank of ``ranks`` reaches.
        rank: this rank, a member of ``ranks``.
        ranks: the ranks that must agree, ascending (``range(world)`` in the common
            case: only ``len`` is used on success).
        code: what must be equal on every rank (a hash of the call and of the calls
            made since the last agreement).
        record: this rank's call in words, for messages (called on failure only).
        timeout: how long to wait for the other ranks.
        prefix: the call's key prefix, unique per call and equal on every rank.
        where: the call in words (``realize call #3``).
        closing: a closing barrier follows and counts on ``P+"done"`` (the
            liveness watch, ``watch.py``): leave that key to it.

    Raises:
        MeshMismatchError: ranks published different codes, some never arrived
            within ``timeout``, or the store is gone.
    """
    import torch.distributed as dist

    conn = _conn(store)
    ticket = Ticket(store, rank, ranks, prefix, where, record, closing, conn=conn)
    n = len(ranks)
    if n <= 1:
        return ticket
    w = weight(code, n)
    try:
        s = conn.add(prefix + "n", w)
        if s >= POISON:
            raise _records.late(conn, ticket)
        # CENSUS: a rank waited long and opened the list of arrivals (arrivals.py).
        weights = s % CENSUS
        if weights == n * w:  # the last of n ranks with the same code
            conn.add(prefix + "done", 1)
            conn.delete_key(prefix + "n")
            return ticket
        if weights % w or weights > n * w:
            raise _records.mismatch(conn, ticket)
        return wait_done(conn, ticket, w, timeout, listing=s >= CENSUS)
    except dist.DistError as err:
        raise _store_error(ticket, err) from err


def _store_error(ticket: Ticket, err: Exception) -> MeshMismatchError:
    return MeshMismatchError(
        f"rank {ticket.rank} lost the store during {ticket.where} ({ticket.summary}): "
        f"{err}. The process hosting the store (rank 0 or the torchrun agent) may have "
        "died; see its logs."
    )


# -- after agreement --------------------------------------------------------------------


def give_up(ticket: Ticket, why: str, among: Sequence[int], grace: float) -> dict[int, str]:
    """This rank gives up on ``ticket``'s agreed call (``why``: its group creation
    failed), telling the others; returns why members of ``among`` gave up on it, by
    rank, waiting up to ``grace`` seconds for a first report (a peer's own timeout can
    end a moment after ours)."""
    abort(ticket, why)
    deadline = time.monotonic() + grace
    while True:
        found = {r: m for r, m in failures(ticket).items() if r != ticket.rank and r in among}
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)


def abort(ticket: Ticket, message: str) -> None:
    """Tell the other ranks why this rank gave up on ``ticket``'s call after it was
    agreed (group creation failed here); they read it with ``failures``."""
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
