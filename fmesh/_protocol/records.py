"""What the ranks of a creating call write to the store, and the call's ticket.

A creating call's keys (``docs/design/agreement-protocol.md``), under its stream's
prefix ``S = fmesh/a/<generation>/<stream>/`` and its own ``P = S + "<number>/"``:

* ``S+"c"``: the short record (``Entry``) of the first rank of the stream's last call.
  Each rank of a call swaps its own in with one ``compare_set`` and reads the first
  rank's back: it disagrees at once if they differ.
* ``P+"n"``: the count of ranks done with the call (each adds 1), plus ``ABORT`` from a
  rank that ends the call badly or ``POISON`` from a timeout's coordinator: the rank
  that reads exactly the number of ranks is the last one out, and sets ``P+"ok"``,
  which the others wait for.
* On failure only: ``P+"end"`` (the verdict: ``lost``, ``mm``, ``fail:...``, ``census``
  then ``timeout``), ``lost`` and ``by`` (who died, who found it), ``mm`` and ``full``
  (the two sides of a mismatch, in full), ``arr`` (ranks present), ``late`` (ranks not
  there yet, for warnings), ``to`` and ``verdict`` (a timeout's), ``gone`` and ``read``
  (ranks out of the failed call, and named ranks that read the verdict).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, cast, final

import attrs

from .._compat.interruptible import peek

if TYPE_CHECKING:
    from .._compat import Store

__all__ = [
    "ABORT",
    "KEY_ROOT",
    "POISON",
    "Entry",
    "Record",
    "Ticket",
    "Untyped",
    "append",
    "wait_get",
    "weight",
]

KEY_ROOT = "fmesh/a/"
"""Every key of the agreement protocol contains this string."""
ABORT = 1 << 40
"""Added to ``P+"n"`` by a rank that ends the call badly: more than any count of
ranks, so the last rank out and a rank that gives up cannot both win."""
POISON = 1 << 60
"""Added to ``P+"n"`` by a timeout's coordinator (a late rank reads it there)."""
_MAX_SUMMARY = 2000
_MAX_NAMES = 300


@final
@attrs.frozen(slots=True)
class Entry:
    """One rank's short record of a call: what must be equal on every rank (the call's
    number in its stream and its code), and the axis names, compared apart where they
    may differ (the drop-in's calls)."""

    number: int
    code: int
    rank: int
    names: str = ""
    gave_up: bool = False
    """The stream's record of a call that failed, its verdict out (``!`` in front,
    ``Ticket.mark_failed``): a rank that comes to it later learns so from its own
    record's request."""

    def text(self) -> str:
        mark = "!" if self.gave_up else ""
        return f"{mark}{self.number}|{self.code:x}|{self.rank}|{self.names[:_MAX_NAMES]}"

    @classmethod
    def parse(cls, raw: bytes | str) -> Entry | None:
        """The entry in ``raw``, or ``None`` if it is none (no record there yet)."""
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        gave_up = text.startswith("!")
        parts = text.removeprefix("!").split("|", 3)
        if len(parts) != 4:
            return None
        try:
            return cls(int(parts[0]), int(parts[1], 16), int(parts[2]), parts[3], gave_up)
        except ValueError:
            return None


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
    """One creating call on this rank, once its record is in."""

    store: Store
    """The default store (what the call's groups rendezvous in)."""
    conn: Store
    """This thread's own connection to it (``connections.thread_store``)."""
    rank: int
    ranks: Sequence[int]
    """The ranks of the call (the world less ranks declared lost), ascending."""
    prefix: str
    """``P``: the call's own keys."""
    where: str
    """``realize call #k`` (``... of stream 'S'``), for messages."""
    entry: Entry
    """This rank's short record."""
    record: Callable[[], Record]
    """This rank's full record, computed only when a message needs it."""
    first: Entry
    """The first rank's short record (this rank's own if it was first)."""

    @property
    def summary(self) -> str:
        return self.record().summary

    @property
    def n(self) -> int:
        return len(self.ranks)

    @property
    def stream(self) -> str:
        """The call's stream's prefix (its record is ``stream + "c"``)."""
        return self.prefix.rstrip("/").rpartition("/")[0] + "/"

    def mark_failed(self, conn: Store) -> None:
        """Once the call's verdict (``P+"end"``) is out: the stream's record says the
        call failed (``Entry.gave_up``), if it is still this call's. A rank that comes
        to the call later reads it in the answer to its own record's request and raises
        the verdict before it creates anything (rather than pass a group's rendezvous
        whose other ranks left, and wait in gloo's connect)."""
        if self.first.number == self.entry.number and not self.first.gave_up:
            marked = attrs.evolve(self.first, gave_up=True)
            conn.compare_set(self.stream + "c", self.first.text(), marked.text())


class Untyped(Protocol):
    """Store methods that exist on torch 2.11..2.15 but are missing from its stubs."""

    def append(self, key: str, value: str) -> None: ...
    def clone(self) -> Store: ...


def append(store: Store, key: str, value: str) -> None:
    cast("Untyped", store).append(key, value)


def weight(code: int, n: int) -> int:
    """The odd weight of ``code`` among ``n`` ranks, ``n * weight < 2**58``: equal
    codes give equal weights, and a sum of ``n`` weights equals ``n`` times one of them
    only if all are equal (save for a chance of about ``2**-50``; ``recover`` uses it).

    >>> w = weight(12345, 4); w % 2, 4 * w < 2**58, w == weight(12345, 4)
    (1, True, True)
    """
    bits = 58 - n.bit_length()
    return ((code % (1 << (bits - 2))) << 1) | (1 << (bits - 1)) | 1


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
