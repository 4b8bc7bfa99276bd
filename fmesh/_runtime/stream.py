"""Per-stream bookkeeping of realize calls: what makes a call a memo hit, how calls
are numbered, and the running hash of the calls since the last agreement.

A stream is the calling thread's name; calls are matched across ranks stream by
stream. Pure Python; the caller holds the memo lock around every method.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Hashable
from typing import Generic, TypeVar

import attrs

__all__ = ["Stream", "Turn", "call_code", "combine", "digest"]

T = TypeVar("T")

_MASK = (1 << 64) - 1
_RECENT = 3
"""Hits kept per stream for messages (the count is exact)."""


def digest(*parts: object) -> str:
    """A content hash (SHA-1 of the ``repr``), equal on every rank for equal parts.

    ``parts`` must have a rank-independent ``repr`` (no ids, no hash-seeded order).
    """
    return hashlib.sha1(repr(parts).encode(), usedforsecurity=False).hexdigest()


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
    history: str
    """The calls since the last agreement, in words (for messages)."""


@attrs.define
class Stream(Generic[T]):
    """One thread name's realize calls on this rank, since the last reset.

    ``T`` is what a hit hands back (a ``RealizedMesh``).
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
    calls: dict[Hashable, tuple[T, int, object]] = attrs.field(factory=dict)
    """Call key -> (what a hit returns, call code, summary) of calls made before; a
    summary is anything whose ``str`` describes the call (made only for messages)."""

    def replay(self, key: Hashable) -> T | None:
        """What a call made before hands back, recorded as a hit (``None``: a new
        call)."""
        entry = self.calls.get(key)
        if entry is None:
            return None
        self.hit(entry[1], entry[2])
        return entry[0]

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
            return Turn(0, 0, "")
        number, history, text = self.number()
        return Turn(number, combine(history, code), text)

    def hit(self, code: int, summary: object) -> None:
        """Record a call that agreed with nobody (a memo hit)."""
        self.history = combine(self.history, code)
        self.hits += 1
        self.recent.append(summary)

    def number(self) -> tuple[int, int, str]:
        """Number the next agreed call: (its number, the history hash it carries, the
        history in words); the history starts again after it."""
        self.agreed += 1
        out = (self.agreed, self.history, self.describe_history())
        self.history, self.hits = 0, 0
        self.recent.clear()
        return out

    def describe_history(self) -> str:
        """The calls since the last agreement, in words ("" if none).

        >>> s = Stream[int]("t"); s.hit(1, "Mesh(a=2)"); s.hit(2, "Mesh(b=2)")
        >>> s.describe_history()
        '2 memoized realize calls (Mesh(a=2); Mesh(b=2))'
        """
        if not self.hits:
            return ""
        shown = "; ".join(map(str, self.recent))
        if self.hits > len(self.recent):
            shown = f"the last {len(self.recent)}: {shown}"
        calls = "call" if self.hits == 1 else "calls"
        return f"{self.hits} memoized realize {calls} ({shown})"
