"""A rank's watch of its successor on the ring of a creating call's ranks, and the walk
along the ring past ranks that are gone (``watch.py`` declares them).

Each rank watches the next rank of the call (ascending, the last one the first) through
a link to its liveness port (``links.py``), made once per process and peer and kept
across calls: its address is read once per process, after the call's first second (a
call that ends sooner reads nothing). A link that closed is made again once: a port
that refuses belongs to no process any more; one whose host does not answer for
``silence`` seconds is gone with its host. A successor gone, the watcher connects to
the next ranks along the ring, several at once (one connect timeout for a whole host
gone with its ranks), up to the first that is alive or not here yet, and names every
rank it passed. A peer that has published no address has not reached its first
creating call: it is not here yet, not lost (a rank missing from a call is the
timeout's to name, ``arrivals.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._compat.interruptible import peek
from . import links, port

if TYPE_CHECKING:
    from .._compat import Store

__all__ = ["Ring", "forget_addresses"]

_WALK = 8
"""Ranks connected to at once when walking the ring past dead ones."""

_addresses: dict[int, port.Address] = {}
"""Peers' port addresses read so far (one read per peer, not per call)."""
_links: dict[int, links.Link] = {}
"""This process's links to its peers' ports, kept across calls."""


def forget_addresses() -> None:
    """Forget every peer's address and link: the runtime calls this when its memo is
    reset (``destroy``, a new default process group), whose ranks may be other
    processes."""
    _addresses.clear()
    for link in _links.values():
        link.close()
    _links.clear()


class Ring:
    """This rank's part of one call's ring (module docstring)."""

    def __init__(
        self, ranks: Sequence[int], rank: int, silence: float, interval: float
    ) -> None:
        self.ranks = ranks  # a range unless ranks were lost: no copy, index in O(1)
        self.me = ranks.index(rank)
        self.n = len(self.ranks)
        self.peer = self.ranks[(self.me + 1) % self.n]
        self.silence = silence
        self.interval = interval
        self.due = 0.0
        """When to look next (the watch sets the first time)."""
        self._link: links.Link | None = None
        self._asked = False
        """An address was read in this call already."""

    def check(self, conn: Store, now: float) -> tuple[list[int], str, bool]:
        """(the ranks found gone, why, whether this was the call's first read of an
        address): asks the kernel about the link to the successor (no request), and
        walks on if it is gone."""
        first = not self._asked
        if self._link is None:
            link = _links.get(self.peer)
            if link is None or link.sock is None:
                got = self._connect(conn, [self.peer])[self.peer]
                if not isinstance(got, links.Link):
                    if got[0] == "unknown":  # not here yet: ask again later
                        self.due = now + 2 * self.interval
                        return [], "", first and self._asked
                    return self._walk(conn, [self.peer], got[1]), got[1], first and self._asked
                link = _links[self.peer] = got
            link.watching(self.silence)
            self._link = link
        kind, why = self._link.check()
        if kind == "closed":  # its process ended, or its port made room: ask again
            got = self._connect(conn, [self.peer])[self.peer]
            if isinstance(got, links.Link):
                got.watching(self.silence)
                self._link = _links[self.peer] = got
                return [], "", first and self._asked
            kind, why = got
        if not kind:
            return [], "", first and self._asked
        self._link = None
        _links.pop(self.peer, None)
        return self._walk(conn, [self.peer], why), why, first and self._asked

    def close(self) -> None:
        """The call is over: keepalive off on the link (no traffic between calls)."""
        if self._link is not None:
            self._link.watching(None)

    def _connect(
        self, conn: Store, peers: list[int]
    ) -> dict[int, links.Link | tuple[str, str]]:
        """Links to ``peers`` (their addresses read once per process); a refused cached
        address is read again once (the peer may have opened its port anew). A peer
        with no address yet is ``("unknown", ...)``."""
        fresh = [p for p in peers if p not in _addresses]
        for p in fresh:
            raw = peek(conn, port.KEY + str(p))
            if raw is not None:
                _addresses[p] = port.Address.parse(raw)
        self._asked = self._asked or bool(fresh)
        known = [(p, _addresses[p]) for p in peers if p in _addresses]
        # A host that answers at all answers a connect within milliseconds (its
        # kernel): half the silence is ample, and a walk past several ranks of a host
        # that went away costs that once.
        out = links.connect_all(known, self.silence / 2)
        for p, got in list(out.items()):
            if isinstance(got, tuple) and got[0] == "dead" and p not in fresh:
                raw = peek(conn, port.KEY + str(p))
                if raw is not None and port.Address.parse(raw) != _addresses[p]:
                    _addresses[p] = port.Address.parse(raw)
                    out.update(links.connect_all([(p, _addresses[p])], self.silence / 2))
        for p in peers:
            out.setdefault(p, ("unknown", "it has not published its address yet"))
        return out

    def _walk(self, conn: Store, lost: list[int], why: str) -> list[int]:
        """The ranks after ``lost`` along the ring, several at once, up to the first
        that is alive or not here yet (watched from the next check, if alive): every
        rank passed."""
        step = len(lost) + 1
        while step < self.n:
            batch = [
                self.ranks[(self.me + s) % self.n]
                for s in range(step, min(step + _WALK, self.n))
            ]
            got = self._connect(conn, batch)
            for i, p in enumerate(batch):
                found = got[p]
                if isinstance(found, links.Link) or found[0] == "unknown":
                    if isinstance(found, links.Link):
                        _links.setdefault(p, found)
                    for q in batch[i + 1 :]:
                        other = got[q]
                        if isinstance(other, links.Link):
                            other.close()
                    return lost
                lost.append(p)
            step += len(batch)
        return lost
