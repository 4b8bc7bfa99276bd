"""What ``fmesh plan`` found, as values: per rank the meshes it built, the groups it
holds, the group-creating calls it made (fmesh's realize calls and torch's own), and
the first call where two planned ranks would disagree at launch.

Pure (attrs and the core's queries): the runner (``run.py``) fills these in, the
renderer (``render.py``) prints them. Group members are computed on demand from the
mesh values, so a report of a 2**20-rank world stays small.
"""

from __future__ import annotations

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
]

_HELP = (
    "Every rank must build the same meshes and process groups in the same order "
    "(SPMD): look for mesh sizes, names, backends or group ranks computed from "
    "something rank-dependent (the rank, the host, a local config file or device "
    "count), and for mesh code run on some ranks only."
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
    returned: bool = False
    """The planned function returned it (by name); else only realized."""
    outside: bool = False
    """A DeviceMesh whose groups fmesh did not make (torch's own calls made them: see
    the rank's calls); ``groups`` is empty then."""

    @property
    def shape(self) -> dict[str, int]:
        """Axis name -> size, in axis order."""
        return dict(zip(self.axis_names, self.sizes, strict=True))


REALIZE = "realize"
"""``PlannedCall.kind`` of fmesh's creating realize calls."""


@final
@attrs.frozen
class PlannedCall:
    """A call that creates process groups, as a launch needs every rank to make it.

    Either fmesh's creating realize call (``kind == "realize"``: what fmesh's
    agreement compares), or a call of torch's own API that made groups fmesh did not
    make: ``init_process_group``, ``new_group``, ``split_group``, ``DeviceMesh`` (the
    groups of one dimension of a DeviceMesh torch built itself, from a tensor or by an
    ``init_device_mesh`` fmesh did not route), ``_new_process_group_helper`` (another
    library's). torch requires every rank to make these in the same order with the
    same ranks, backend and options; the members only, for a ``new_group`` with
    ``use_local_synchronization=True``.
    """

    number: int
    """Its number among the rank's calls of its kind: realize calls (1, 2, ...) as a
    launch's agreement numbers them; torch's calls counted apart."""
    code: int
    """Equal on two ranks exactly when a launch would match the calls: for realize,
    the digest every rank publishes (the call and the memo hits before it); for
    torch's calls, the ranks, the backend and options asked for."""
    summary: str
    """The call in words: for realize the mesh, backends and options; for torch's
    calls what was called, with what."""
    history: str
    """The memo hits since the previous creating realize call, in words ("" if
    none)."""
    kind: str = REALIZE
    members: tuple[int, ...] | None = None
    """The ranks that make the call (the members of a local ``new_group``);
    ``None``: every rank of the world."""
    held: tuple[int, ...] | None = None
    """torch's calls: this rank's group (the first ranks of it for a long one);
    ``None``: not a member, or a realize call."""
    names: tuple[str, ...] = ()
    """Realize calls: the mesh's axis names (a call made for torch's API agrees on
    the groups alone; names that differ are a warning, ``PlanReport.warnings``)."""

    def says(self, rank: int) -> str:
        done = f" after {self.history}" if self.history else ""
        if self.kind == REALIZE:
            return f"rank {rank} realizes {self.summary}{done}"
        return f"rank {rank} calls {self.summary}"

    def involves(self, rank: int) -> bool:
        """Whether ``rank`` must make this call too."""
        return self.members is None or rank in self.members


@final
@attrs.frozen
class RankPlan:
    """What one rank of the fake world built, held and cost."""

    rank: int
    meshes: tuple[MeshPlan, ...]
    calls: tuple[PlannedCall, ...]
    """The group-creating calls, in order (what a launch needs every rank to make)."""
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
    tail: str = ""
    """The memo hits after the last creating realize call, in words ("" if none):
    calls a launch matches with no other rank's, named when another rank creates
    groups there."""

    @property
    def realize_calls(self) -> tuple[PlannedCall, ...]:
        """The creating realize calls (what fmesh's agreement compares)."""
        return tuple(c for c in self.calls if c.kind == REALIZE)

    @property
    def torch_calls(self) -> tuple[PlannedCall, ...]:
        """torch's own group-creating calls: groups fmesh did not make."""
        return tuple(c for c in self.calls if c.kind != REALIZE)


@final
@attrs.frozen
class PlanDivergence:
    """The first group-creating call where two planned ranks differ: a launch would
    raise ``fmesh.MeshMismatchError`` there (fmesh's realize) or hang in torch's group
    creation (torch's own calls, as torch's own DeviceMesh would)."""

    number: int
    """The call's position among the calls both ranks must make (1, 2, ...): the
    realize call's number when only realize calls are made."""
    ranks: tuple[int, int]
    calls: tuple[PlannedCall | None, PlannedCall | None]
    """Each rank's call at ``number`` (``None``: it makes no such call)."""
    tails: tuple[str, str] = ("", "")
    """Each rank's memo hits after its last creating realize call, in words."""

    @property
    def message(self) -> str:
        """The divergence in words, as a launch's ``MeshMismatchError`` would say it."""
        (a, b), (ca, cb) = self.ranks, self.calls
        made = [c for c in (ca, cb) if c is not None]
        realize = all(c.kind == REALIZE for c in made)
        where = (
            f"realize call #{made[0].number}"
            if realize and all(c.number == self.number for c in made)
            else f"group-creating call #{self.number} (fmesh's creating realize calls and "
            "torch's own group calls, in order)"
        )
        if ca is None or cb is None:
            maker, call, idle = (b, cb, a) if ca is None else (a, ca, b)
            assert call is not None
            tail = self.tails[0] if ca is None else self.tails[1]
            count = (
                f"{self.number - 1} creating realize calls"
                if realize
                else (f"{self.number - 1} group-creating calls")
            )
            instead = (
                f" (after them it makes {tail}, which create nothing: a memo hit is "
                "matched with no other rank)"
                if tail
                else ""
            )
            wait = (
                f"on a launch rank {maker} waits for rank {idle} there and raises "
                "MeshMismatchError after the timeout"
                if call.kind == REALIZE
                else f"on a launch torch's group creation on rank {maker} waits for rank "
                f"{idle} there until torch's timeout"
            )
            reason = (
                f"rank {idle} makes only {count}{instead}, while at {where} "
                f"{call.says(maker)}: {wait}"
            )
        elif ca.kind == cb.kind == REALIZE and ca.summary == cb.summary:
            reason = (
                f"ranks {a} and {b} disagree at {where}: both realize {ca.summary}, but not "
                f"after the same calls: rank {a} made {ca.history or 'none'}, rank {b} "
                f"made {cb.history or 'none'}"
            )
        elif ca.summary == cb.summary:
            reason = (
                f"ranks {a} and {b} disagree at {where}: both call {ca.summary}, but the "
                "groups or options differ (on other ranks than these)"
            )
        else:
            reason = f"ranks {a} and {b} disagree at {where}: {ca.says(a)}, {cb.says(b)}"
        return f"{reason}. {_HELP}"

    @property
    def outcome(self) -> str:
        """What the launch does there: ``"MeshMismatchError"`` (fmesh's agreement
        fails on every rank of the call, within seconds) where both ranks make a
        creating realize call, else ``"hang"`` (a rank waits for a call the other
        never makes: torch's group creation until torch's timeout, fmesh's agreement
        until the timeout)."""
        made = [c for c in self.calls if c is not None]
        return (
            "MeshMismatchError"
            if len(made) == 2 and all(c.kind == REALIZE for c in made)
            else "hang"
        )

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
    """The first group-creating call where two ranks differ (``None``: they all
    agree)."""
    launch: str = "route"
    """The launch predicted: ``"route"`` (``torchrun ... -m fmesh.route``: torch's
    DeviceMesh API routed through fmesh) or ``"torch"`` (plain torchrun)."""
    torch_version: str = ""
    """The torch the plan ran (and the launch is predicted) with."""
    warnings: tuple[str, ...] = ()
    """What a launch warns about though the ranks agree: realize calls made for
    torch's API whose groups agree but whose axis names differ between ranks."""

    @property
    def outcome(self) -> str:
        """What the launch does: ``"finished"`` (the ranks agree), or the
        divergence's ``outcome`` (``"MeshMismatchError"`` or ``"hang"``)."""
        return "finished" if self.divergence is None else self.divergence.outcome

    @property
    def ok(self) -> bool:
        """The planned ranks make the same group-creating calls, in the same order."""
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
