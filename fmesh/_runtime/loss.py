"""The loss state: ranks ``fmesh.recover`` declared lost, the survivors, and the
groups retired because they held a lost rank."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["GroupKey", "Loss"]

GroupKey = tuple[tuple[int, ...], str, int]
"""A group by its members (in coordinate order), backend and options ordinal."""


@attrs.define
class Loss:
    """What fmesh knows of lost ranks in this process (held by the memo's state)."""

    lost: frozenset[int] = frozenset()
    """World ranks declared lost by ``fmesh.recover`` (never used again)."""
    survivors: tuple[int, ...] | None = None
    """The ranks that agree after a loss, ascending (``None``: the whole world)."""
    recoveries: int = 0
    """Recoveries so far: every survivor counts the same."""
    retired: dict[GroupKey, ProcessGroup] = attrs.field(factory=dict)
    """Groups that held a lost rank: never handed out, but an NCCL one may be shrunk
    into a group of its survivors."""

    def declare(self, lost: frozenset[int], world: int) -> None:
        """One more recovery, which declared ``lost`` (maybe empty) lost."""
        self.lost = self.lost | lost
        self.survivors = tuple(r for r in range(world) if r not in self.lost)
        self.recoveries += 1
