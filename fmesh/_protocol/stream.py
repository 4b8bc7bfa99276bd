"""How ranks match their realize calls: streams, call codes, numbering and history.

A stream is an order of realize calls that every rank makes alike. By default there
is one per process: calls are matched across ranks by the order each rank makes them,
whatever thread makes them (as torch's ``new_group`` requires). Inside
``stream`` blocks, calls belong to the stream of that name, ordered on their own.
Here is what every rank computes alike: a call's code, its number among the agreed
calls, the running hash of the calls since the last agreement, and the call's place
in the agreement's keys. What a process keeps per stream besides (its calls waiting
for their turn, the axes and calls realized) is in ``_runtime/memo.py``;
``_runtime/turns.py`` serves repeats and orders the rest. Pure Python; the caller holds
the memo lock around every method.
"""

from __future__ import annotations

import array
import collections
import contextlib
import contextvars
import hashlib
import sys
import urllib.parse
from collections.abc import Iterator

import attrs

__all__ = [
    "PROCESS",
    "Stream",
    "Turn",
    "call_code",
    "combine",
    "current_stream",
    "digest",
    "stream",
    "stream_key",
    "stream_words",
]

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
    history: str
    """The calls since the last agreement, in words (for messages)."""
    where: str = ""
    """The call in messages: ``realize call #3`` (of stream ``name``)."""
    key: str = ""
    """The call's part of its agreement keys, after the key root and the generation:
    ``<stream>/<number>/`` (``stream_key``)."""
    names: int = 0
    """The code of the call's axis names (``call_code(axis_names)``)."""
    lenient: bool = False
    """A call made for torch's API (the drop-in, torch's DeviceMesh methods): its
    ``code`` is what determines the groups (layouts, rank map, backends, options),
    without the axis names and without the history (its memo hits join no history
    either), as torch's own group creation depends on nothing else. The protocol
    compares ``names`` apart: ranks that name the same groups otherwise are warned,
    not failed."""


@attrs.define
class Stream:
    """One stream's numbering on this rank, since the last reset: what every rank that
    made the same calls computes alike.

    >>> t = Stream("t").turn(7, "Mesh(a=2)", True)
    >>> print(t.number, t.key, t.where)
    1 st/1/ realize call #1 of stream 't'
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

    def turn(
        self,
        code: int,
        summary: object,
        agrees: bool,
        *,
        lenient: bool = False,
        names: int = 0,
    ) -> Turn:
        """Place a new call: one that agrees gets the next number and carries the
        history since the last agreement; any other joins that history as a hit. A
        ``lenient`` call (``Turn.lenient``) carries no history and joins none, though
        one that agrees starts the history again like any other.

        >>> s = Stream("t"); s.turn(1, "Mesh(a=2)", False).number
        0
        >>> t = s.turn(2, "Mesh(b=2)", True); t.number, t.code == combine(combine(0, 1), 2)
        (1, True)
        >>> _ = s.turn(3, "Mesh(c=2)", False, lenient=True); s.hits
        0
        >>> s.hit(1, "Mesh(a=2)"); t = s.turn(2, "Mesh(b=2)", True, lenient=True)
        >>> t.number, t.code == combine(0, 2), t.history, s.hits
        (2, True, '', 0)
        """
        if not agrees:
            if not lenient:
                self.hit(code, summary)
            return Turn(0, 0, "", names=names, lenient=lenient)
        number, history, text = self.number()
        if lenient:
            history, text = 0, ""
        return Turn(
            number,
            combine(history, code),
            text,
            f"realize call #{number}{stream_words(self.name)}",
            f"{stream_key(self.name)}/{number}/",
            names,
            lenient,
        )

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

        >>> s = Stream("t"); s.hit(1, "Mesh(a=2)"); s.hit(2, "Mesh(b=2)")
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
