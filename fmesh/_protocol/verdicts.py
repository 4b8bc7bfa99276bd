"""A failed call's verdict in the words a rank raises.

``watch.py`` raises these for a call a rank took part in; ``agreement.py`` for a call
a rank comes to after its verdict is out (the stream's record marked failed, or at a
later call). The keys of a verdict (``P+"end"``, ``lost``, ``by``): ``records.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._compat.interruptible import peek
from .._core.errors import PeerLostError

if TYPE_CHECKING:
    from .._compat import Store

__all__ = ["found_by", "given_up", "lost_ranks", "peer_lost"]


def lost_ranks(conn: Store, prefix: str) -> tuple[int, ...]:
    """The ranks a ``lost`` verdict of the call at ``prefix`` names, ascending."""
    raw = peek(conn, prefix + "lost")
    text = "" if raw is None else raw.decode()
    return tuple(sorted({int(r) for r in text.split(",") if r}))


def found_by(conn: Store, prefix: str) -> str:
    """`` (found by rank R: how)``, or ``""`` if the finder is not known."""
    raw = peek(conn, prefix + "by")
    by, _, how = ("" if raw is None else raw.decode()).partition("\x1f")
    return f" (found by rank {by}: {how})" if by else ""


def peer_lost(
    rank: int, where: str, lost: tuple[int, ...], found: str, doing: str, cause: object
) -> PeerLostError:
    """The error of a survivor of ``lost`` (``doing``: what it was doing then)."""
    first = (str(cause).splitlines() or [""])[0][:300]
    said = f" torch said: {first}" if first and not first.startswith("fmesh:") else ""
    return PeerLostError(
        f"rank(s) {list(lost)} died during {where}{found}; rank {rank} was {doing}. No "
        "group of this call was kept on any survivor: call fmesh.recover(timeout=...) on "
        "every surviving rank and carry on without them (docs/elastic.md)." + said,
        lost,
    )


def given_up(rank: int, where: str, why: str, doing: str) -> PeerLostError:
    """The error of a rank the others gave up on (``why``: how it learned it)."""
    return PeerLostError(
        f"rank {rank} was given up on during {where}: {why or 'the call was given up'}, "
        f"so the other ranks raise PeerLostError naming it; rank {rank} was {doing}. Its "
        "groups of this call are not kept. It cannot go on with the others in this "
        "call: exit and rejoin through a restart, or call fmesh.recover(timeout=...) on "
        "every rank (it is kept if it checks in within the others' timeout).",
        (rank,),
    )
