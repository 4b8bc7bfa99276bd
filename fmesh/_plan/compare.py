"""The cross-rank check of a plan: the first group-creating call where two planned
ranks would disagree at launch, and what a launch warns about where they agree.

Pure: compares the ``RankPlan`` values the runner recorded (``report.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from .report import PlanDivergence, RankPlan

__all__ = ["first_divergence", "name_warnings"]


def first_divergence(plans: Sequence[RankPlan]) -> PlanDivergence | None:
    """The earliest call where a planned rank differs from the first one (then, where
    some calls involve only their members, where any two planned ranks differ).

    Two ranks must make, in the same order, the calls that involve both: every call
    but a local ``new_group``, which only its members make.

    >>> from fmesh import PlannedCall
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
    found = _earliest(base, plans[1:])
    if found is not None:
        return found
    # Every rank then makes the same calls of the whole world as the first one; two
    # other ranks can still differ in a local call that both make.
    by_rank = {p.rank: p for p in plans}
    pairs: set[tuple[int, int]] = set()
    for p in plans[1:]:
        for c in p.calls:
            for r in c.members or ():
                if r in by_rank and r not in (p.rank, base.rank):
                    pairs.add((min(p.rank, r), max(p.rank, r)))
    for a, b in sorted(pairs):
        found = _earliest(by_rank[a], [by_rank[b]])
        if found is not None:
            return found
    return None


def name_warnings(plans: Sequence[RankPlan]) -> tuple[str, ...]:
    """Realize calls whose groups agree (equal codes) where the ranks name the axes
    differently (only calls made for torch's API can: a strict call's code holds
    the names), each against the first planned rank, once per call.

    >>> from fmesh import PlannedCall
    >>> c = lambda names: PlannedCall(1, 7, "Mesh", "", names=names)
    >>> p = lambda r, *calls: RankPlan(r, (), calls, 0, 0, 0, 0.0, None, None)
    >>> print(name_warnings([p(0, c(("a", "b"))), p(3, c(("b", "a")))])[0][:86])
    ranks 0 and 3 name the axes of realize call #1 differently: ('a', 'b') and ('b', 'a')
    """
    out: dict[int, str] = {}
    base = plans[0] if plans else None
    for other in plans[1:]:
        assert base is not None
        for x, y in zip(base.realize_calls, other.realize_calls, strict=False):
            if x.code == y.code and x.names != y.names and x.number not in out:
                out[x.number] = (
                    f"ranks {base.rank} and {other.rank} name the axes of realize call "
                    f"#{x.number} differently: {x.names} and {y.names} (the same groups: "
                    "a launch warns, and each rank's mesh keeps its own names)"
                )
    return tuple(out[n] for n in sorted(out))


def _earliest(base: RankPlan, others: Sequence[RankPlan]) -> PlanDivergence | None:
    """The earliest position where ``base`` and one of ``others`` differ, comparing
    the calls that involve both, in order."""
    best: PlanDivergence | None = None
    for other in others:
        mine = [c for c in base.calls if c.involves(other.rank)]
        theirs = [c for c in other.calls if c.involves(base.rank)]
        for i in range(max(len(mine), len(theirs))):
            if best is not None and i + 1 >= best.number:
                break
            x = mine[i] if i < len(mine) else None
            y = theirs[i] if i < len(theirs) else None
            if x is None or y is None or x.code != y.code:
                best = PlanDivergence(
                    i + 1, (base.rank, other.rank), (x, y), (base.tail, other.tail)
                )
                break
    return best
