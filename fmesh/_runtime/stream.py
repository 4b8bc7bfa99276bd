"""Per-stream bookkeeping of realize calls: what makes a call a memo hit, how calls
are numbered, and the running hash of the calls since the last agreement.

A stream is an order of realize calls that every rank makes alike. By default there
is one per process: calls are matched across ranks by the order each rank makes them,
whatever thread makes them (as torch's ``new_group`` requires). Inside
``stream`` blocks, calls belong to the stream of that name, ordered on their own.
Pure Python; the caller holds the memo lock around every method.
"""

from __future__ import annotations

import array
import collections
import contextlib
import contextvars
import hashlib
import sys
import urllib.parse
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Generic, TypeVar

import attrs

from .bounded import bound

__all__ = [
    "PROCESS",
    "Stream",
    "Turn",
    "call_code",
    "combine",
    "current_stream",
    "digest",
    "stream",
]

T = TypeVar("T")

_MASK = (1 << 64) - 1
_RECENT = 3
"""Hits kept per stream for messages (the count is exact)."""

PROCESS = ""
"""The name of the process-wide stream (no name a caller can give)."""

_current: contextvars.ContextVar[str] = contextvars.ContextVar("fmesh_stream", default=PROCESS)


@contextlib.contextmanager
def stream(name: str) -> Iterator[None]:
    """Order the realize calls made inside on their own, as stream ``name``.

    By default every realize call of a process is in one order, whichever thread
    makes it: the k-th call that creates groups on one rank meets the k-th on every
    other rank, as torch's ``new_group`` requires. Threads that realize meshes at the
    same time on every rank, in an order that may differ between ranks, each give
    their calls a stream name of their own, the same on every rank: calls are then
    matched stream by stream, whatever the other streams do meanwhile. The name
    applies to the calling thread (and asyncio task) until the block ends; threads
    started inside do not inherit it.

    Args:
        name: a non-empty name, the same on every rank for the same calls.

    Raises:
        TypeError: ``name`` is not a non-empty string.

    >>> import fmesh
    >>> with fmesh.stream("loader"):
    ...     pass  # fmesh.realize(...) calls here are stream "loader"'s
    """
    if not isinstance(name, str) or not name:
        raise TypeError(
            f"fmesh.stream() needs a non-empty str, the same on every rank; got {name!r}"
        )
    token = _current.set(name)
    try:
        yield
    finally:
        _current.reset(token)


def current_stream() -> str:
    """The stream realize calls of this thread belong to (``PROCESS`` by default)."""
    return _current.get()


def stream_words(name: str) -> str:
    """How messages name a stream's calls (after ``realize call #k``)."""
    return "" if name == PROCESS else f" of stream {name!r}"


def stream_key(name: str) -> str:
    """The stream's part of its agreement keys (no stream name can collide)."""
    return "p" if name == PROCESS else "s" + urllib.parse.quote(name, safe="")


def digest(*parts: object) -> str:
    """A content hash (SHA-1 of the ``repr``), equal on every rank for equal parts.

    ``parts`` must have a rank-independent ``repr`` (no ids, no hash-seeded order).
    """
    return hashlib.sha1(repr(parts).encode(), usedforsecurity=False).hexdigest()


def ranks_digest(ranks: tuple[int, ...], *parts: object) -> str:
    """``digest`` of a group's ranks and ``parts``: the ranks packed as little-endian
    64-bit words, in C (the ``repr`` of a group of thousands of ranks costs about a
    millisecond)."""
    packed = array.array("q", ranks)
    if sys.byteorder != "little":
        packed.byteswap()
    code = hashlib.sha1(packed.tobytes(), usedforsecurity=False)
    code.update(repr(parts).encode())
    return code.hexdigest()


def call_code(*parts: object) -> int:
    """A 64-bit code of a call, equal on every rank for equal parts.

    ``parts`` must have a rank-independent ``repr`` (no ids, no hash-seeded order).

    >>> call_code("a", (2, 4)) == call_code("a", (2, 4)) != call_code("b", (2, 4))
    True
    """
    return int(digest(*parts)[:16], 16)


def combine(history: int, code: int) -> int:
    """The running hash of a call sequence, extended by one call (order matters).

    >>> combine(combine(0, 1), 2) != combine(combine(0, 2), 1)
    True
    """
    return ((history ^ code) * 0x100000001B3 + 0x9E3779B97F4A7C15) & _MASK


@attrs.frozen(slots=True)
class Turn:
    """A new call's place in its stream."""

    number: int
    """The call's number among the agreed calls (0: it agrees with nobody)."""
    code: int
    """What the ranks agree on: the call's code after the history it carries."""
    hits: int = 0
    """The memoized calls since the last agreement."""
    recent: tuple[object, ...] = ()
    """The summaries of the last of them."""

    @property
    def history(self) -> str:
        """The calls since the last agreement, in words (for messages; built only
        when one is needed)."""
        return _describe(self.hits, self.recent)


def _describe(hits: int, recent: Sequence[object]) -> str:
    if not hits:
        return ""
    shown = "; ".join(map(str, recent))
    if hits > len(recent):
        shown = f"the last {len(recent)}: {shown}"
    calls = "call" if hits == 1 else "calls"
    return f"{hits} memoized realize {calls} ({shown})"


@attrs.define
class Stream(Generic[T]):
    """One stream's realize calls on this rank, since the last reset.

    ``T`` is what a hit hands back (a ``RealizedMesh``). Calls that are not repeats
    are carried out one at a time, in the order they started (``enter``/``leave``):
    which calls are hits and what the next agreement carries then depend only on
    that order, never on how threads interleave inside a call.
    """

    name: str
    agreed: int = 0
    """Agreed calls so far: the next one is number ``agreed + 1``."""
    history: int = 0
    """Running hash of the calls since the last agreement (0: none)."""
    hits: int = 0
    """Calls since the last agreement (memo hits)."""
    recent: collections.deque[object] = attrs.field(
        factory=lambda: collections.deque(maxlen=_RECENT)
    )
    known: set[Hashable] = attrs.field(factory=set)
    """Axis keys realized in this stream."""
    calls: collections.OrderedDict[Hashable, tuple[T, int, object]] = attrs.field(
        factory=collections.OrderedDict
    )
    """Call key -> (what a hit returns, call code, summary) of recent calls, least
    recently used first (``bounded.py``); a summary is anything whose ``str``
    describes the call (made only for messages). Dropping one never changes whether
    a call is a hit: ``known`` decides that, alike on every rank; a dropped call is
    only laid out again (microseconds)."""
    queued: int = 0
    """Tickets handed out to calls that are not repeats (``enter``)."""
    served: int = 0
    """The last ticket whose call is done: ticket ``served + 1`` goes next."""
    holder: int | None = None
    """The thread carrying out a call now (a nested call in it does not queue)."""
    doomed_through: int = 0
    """Tickets up to this one were queued behind a call that failed: they fail too."""
    failure: str = ""

    def replay(self, key: Hashable, usable: Callable[[T], bool]) -> T | None:
        """What a call made before hands back, recorded as a hit (``None``: a new
        call, or one whose value is no longer ``usable``)."""
        entry = self.calls.get(key)
        if entry is None or not usable(entry[0]):
            return None
        self.calls.move_to_end(key)
        self.hit(entry[1], entry[2])
        return entry[0]

    def remember(self, key: Hashable, value: T, code: int, summary: object) -> None:
        """Keep a call for the fast repeat (dropping the least recently used)."""
        self.calls[key] = (value, code, summary)
        self.calls.move_to_end(key)
        bound(self.calls)

    def enter(self) -> int:
        """A ticket for a call that is not a repeat: it waits for ``ready``."""
        self.queued += 1
        return self.queued

    def ready(self, ticket: int) -> bool:
        return self.served == ticket - 1

    def doomed(self, ticket: int) -> str:
        """Why a call queued behind a failed one fails with it ("" if it does not)."""
        return self.failure if ticket <= self.doomed_through else ""

    def leave(self, ticket: int, failure: str = "") -> None:
        """The call of ``ticket`` is done; a ``failure`` dooms the calls queued
        behind it (ranks whose calls raced into other orders raise together)."""
        self.served = ticket
        self.holder = None
        if failure and self.queued > ticket:
            self.doomed_through, self.failure = self.queued, failure

    def turn(self, code: int, summary: object, agrees: bool) -> Turn:
        """Place a new call: one that agrees gets the next number and carries the
        history since the last agreement; any other joins that history as a hit.

        >>> s = Stream[int]("t"); s.turn(1, "Mesh(a=2)", False).number
        0
        >>> t = s.turn(2, "Mesh(b=2)", True); t.number, t.code == combine(combine(0, 1), 2)
        (1, True)
        """
        if not agrees:
            self.hit(code, summary)
            return Turn(0, 0)
        number, history, hits, recent = self.number()
        return Turn(number, combine(history, code), hits, recent)

    def hit(self, code: int, summary: object) -> None:
        """Record a call that agreed with nobody (a memo hit)."""
        self.history = combine(self.history, code)
        self.hits += 1
        self.recent.append(summary)

    def number(self) -> tuple[int, int, int, tuple[object, ...]]:
        """Number the next agreed call: (its number, the history hash it carries, the
        memoized calls since the last agreement and the last of their summaries); the
        history starts again after it."""
        self.agreed += 1
        out = (self.agreed, self.history, self.hits, tuple(self.recent))
        self.history, self.hits = 0, 0
        self.recent.clear()
        return out

    def describe_history(self) -> str:
        """The calls since the last agreement, in words ("" if none).

        >>> s = Stream[int]("t"); s.hit(1, "Mesh(a=2)"); s.hit(2, "Mesh(b=2)")
        >>> s.describe_history()
        '2 memoized realize calls (Mesh(a=2); Mesh(b=2))'
        """
        return _describe(self.hits, self.recent)
