"""What ``fmesh plan`` found, as values: per rank the meshes it built and the groups it
holds, and the first realize call where two planned ranks would disagree.

Pure (attrs and the core's queries): the runner (``run.py``) fills these in, the
renderer (``render.py``) prints them. Group members are computed on demand from the
mesh values, so a report of a 2**20-rank world stays small.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

import attrs

from .._core.errors import MeshMismatchError
from .._core.mesh import Mesh
from .._core.queries import group, index_of, rank_of

__all__ = [
    "GroupPlan",
    "MeshPlan",
    "PlanDivergence",
    "PlanReport",
    "PlannedCall",
    "RankPlan",
    "first_divergence",
]

_HELP = (
    "Every rank must build the same meshes in the same order (SPMD): look for mesh "
    "sizes or names computed from something rank-dependent (the rank, the host, a "
    "local config file or device count), and for mesh code run on some ranks only."
)


@final
@attrs.frozen
class GroupPlan:
    """One process group a planned rank holds along one axis of a mesh."""

    axis: str
    """The axis (dimension) name in the mesh that uses the group."""
    size: int
    """How many ranks the group has."""
    group_rank: int
    """This rank's position in the group (its coordinate along the axis)."""
    source: Mesh = attrs.field(repr=False)
    """The mesh realized with the group (members are computed from it)."""
    source_axis: str = attrs.field(repr=False)
    """The axis of ``source`` along which the group lies."""
    rank: int = attrs.field(repr=False)
    """The planned rank."""

    def members(self) -> tuple[int, ...]:
        """The group's global ranks in coordinate order (O(group size))."""
        return group(self.source, self.source_axis, self.rank)

    def head(self, count: int = 4) -> tuple[int, ...]:
        """The first ``count`` members and, for a longer group, the last one
        (O(count · modes), whatever the group's size)."""
        index = index_of(self.source, self.rank)
        if index is None:
            return ()
        layout = self.source.axes[self.source.axis_names.index(self.source_axis)]
        base = layout.group_base(index)
        shown = list(range(min(count, self.size)))
        if self.size > count:
            shown.append(self.size - 1)
        return tuple(rank_of(self.source, base + layout(i)) for i in shown)


@final
@attrs.frozen
class MeshPlan:
    """One mesh a planned rank built (realized, or returned by the planned function)."""

    name: str
    """The key the function returned it under, else its axis names joined by ``,``."""
    axis_names: tuple[str, ...]
    sizes: tuple[int, ...]
    coordinate: tuple[int, ...] | None
    """This rank's coordinate (``None``: the rank is not in the mesh)."""
    groups: tuple[GroupPlan, ...]
    """This rank's group along each axis (empty off the mesh)."""
    new_groups: int
    """Groups this mesh brought that no earlier mesh of the rank used."""

    @property
    def shape(self) -> dict[str, int]:
        """Axis name -> size, in axis order."""
        return dict(zip(self.axis_names, self.sizes, strict=True))


@final
@attrs.frozen
class PlannedCall:
    """A realize call that creates groups, as the agreement of a launch sees it."""

    number: int
    """Its number among the rank's creating calls (1, 2, ...)."""
    code: int
    """The digest every rank must publish alike (the call and the memo hits before it)."""
    summary: str
    """The mesh, backends and options, in words."""
    history: str
    """The memo hits since the previous creating call, in words ("" if none)."""

    def says(self, rank: int) -> str:
        done = f" after {self.history}" if self.history else ""
        return f"rank {rank} realizes {self.summary}{done}"


@final
@attrs.frozen
class RankPlan:
    """What one rank of the fake world built, held and cost."""

    rank: int
    meshes: tuple[MeshPlan, ...]
    calls: tuple[PlannedCall, ...]
    """The creating realize calls, in order (what a launch agrees on)."""
    created: int
    """Process groups fmesh created for this rank (``fmesh.cache_stats().created``)."""
    held: int
    """Distinct process groups the rank's meshes use (the default group included)."""
    communicators: int
    """Of ``held``, the groups of more than one rank (each a communicator on NCCL)."""
    seconds: float
    """Wall time of the planned function on this rank."""
    peak_memory: int | None
    """Peak resident memory of the process while the function ran, in bytes
    (``None`` where the platform cannot reset the peak: not Linux)."""
    memory_growth: int | None
    """``peak_memory`` less the resident memory before the call, in bytes."""


@final
@attrs.frozen
class PlanDivergence:
    """The first creating call where two planned ranks differ: a launch would raise
    ``fmesh.MeshMismatchError`` there (torch's own DeviceMesh would hang)."""

    number: int
    """The creating call's number (1, 2, ...)."""
    ranks: tuple[int, int]
    calls: tuple[PlannedCall | None, PlannedCall | None]
    """Each rank's call at ``number`` (``None``: it makes no such call)."""

    @property
    def message(self) -> str:
        """The divergence in words, as a launch's ``MeshMismatchError`` would say it."""
        (a, b), (ca, cb) = self.ranks, self.calls
        where = f"realize call #{self.number}"
        if ca is None or cb is None:
            maker, made, idle = (b, cb, a) if ca is None else (a, ca, b)
            assert made is not None
            reason = (
                f"rank {idle} makes only {self.number - 1} creating realize calls, while "
                f"at {where} {made.says(maker)}: on a launch rank {maker} waits for rank "
                f"{idle} there and raises MeshMismatchError after the timeout"
            )
        elif ca.summary == cb.summary:
            reason = (
                f"ranks {a} and {b} disagree at {where}: both realize {ca.summary}, but not "
                f"after the same calls: rank {a} made {ca.history or 'none'}, rank {b} "
                f"made {cb.history or 'none'}"
            )
        else:
            reason = f"ranks {a} and {b} disagree at {where}: {ca.says(a)}, {cb.says(b)}"
        return f"{reason}. {_HELP}"

    def error(self) -> MeshMismatchError:
        """The error ``PlanReport.check()`` raises."""
        return MeshMismatchError(self.message)


@final
@attrs.frozen
class PlanReport:
    """Everything ``fmesh.plan`` found: one ``RankPlan`` per planned rank and the
    cross-rank check."""

    target: str
    """What was planned (``module:function``)."""
    world: int
    ranks: tuple[RankPlan, ...]
    divergence: PlanDivergence | None
    """The first creating call where two ranks differ (``None``: they all agree)."""

    @property
    def ok(self) -> bool:
        """The planned ranks make the same creating calls, in the same order."""
        return self.divergence is None

    def rank(self, rank: int) -> RankPlan:
        """The plan of one planned rank."""
        for r in self.ranks:
            if r.rank == rank:
                return r
        raise KeyError(f"rank {rank} was not planned; planned: {[r.rank for r in self.ranks]}")

    def check(self) -> None:
        """Raise ``fmesh.MeshMismatchError`` if two planned ranks differ."""
        if self.divergence is not None:
            raise self.divergence.error()


def first_divergence(plans: Sequence[RankPlan]) -> PlanDivergence | None:
    """The earliest creating call where a planned rank differs from the first one.

    >>> c = lambda n, code: PlannedCall(n, code, f"Mesh(#{code})", "")
    >>> p = lambda r, *calls: RankPlan(r, (), calls, 0, 0, 0, 0.0, None, None)
    >>> first_divergence([p(0, c(1, 7)), p(5, c(1, 7))]) is None
    True
    >>> first_divergence([p(0, c(1, 7), c(2, 8)), p(5, c(1, 7), c(2, 9))]).ranks
    (0, 5)
    """
    if len(plans) < 2:
        return None
    base = plans[0]
    longest = max(len(p.calls) for p in plans)
    for i in range(longest):
        mine = base.calls[i] if i < len(base.calls) else None
        for other in plans[1:]:
            theirs = other.calls[i] if i < len(other.calls) else None
            if (mine is None) != (theirs is None) or (
                mine is not None and theirs is not None and mine.code != theirs.code
            ):
                return PlanDivergence(i + 1, (base.rank, other.rank), (mine, theirs))
    return None
