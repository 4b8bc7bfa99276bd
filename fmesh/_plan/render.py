"""A ``PlanReport`` as text (``fmesh plan``) and as JSON (``fmesh plan --json``).

Pure. Groups print as their first members and the last one; JSON lists a group's
members in full up to ``JSON_MEMBERS`` ranks (``null`` beyond: compute them with
``fmesh.group``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .events import ranks_head
from .report import MeshPlan, PlannedCall, PlanReport, RankPlan

__all__ = [
    "JSON_MEMBERS",
    "SHOWN_RANKS",
    "launch_words",
    "plan_json",
    "plan_text",
    "rank_line",
]

JSON_MEMBERS = 1024
"""Groups up to this size list every member in ``--json``."""
SHOWN_RANKS = 16
"""Up to this many planned ranks print their meshes; beyond, the first half of that
does, and every other rank prints its one line."""


def _ranks(head: Sequence[int], size: int) -> str:
    """``[0, 1, 2]``, or ``[0, 8, 16, 24, ..., 120]`` when ``head`` skips members."""
    if size != len(head):
        return "[" + ", ".join(map(str, head[:-1])) + f", ..., {head[-1]}]"
    return "[" + ", ".join(map(str, head)) + "]"


def _mib(n: int | None, sign: str = "") -> str:
    return "?" if n is None else f"{sign}{n / 2**20:.1f} MiB"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    ]


def rank_line(p: RankPlan) -> str:
    """One line per planned rank: what it cost and holds (also the progress line)."""
    outside = len(p.torch_calls)
    torch = (
        f", {outside} group-creating call{'s' if outside > 1 else ''} of torch's own"
        if outside
        else ""
    )
    return (
        f"rank {p.rank}: {len(p.meshes)} meshes, {len(p.realize_calls)} creating realize "
        f"calls{torch}, {p.created} groups created by fmesh, {p.held} held by its meshes "
        f"({p.communicators} of more than one "
        f"rank), {p.seconds:.2f} s, peak memory {_mib(p.peak_memory)} "
        f"({_mib(p.memory_growth, '+')} during the call)"
    )


def _mesh_rows(
    m: MeshPlan, rank: int, shown: dict[tuple[object, str], str]
) -> list[list[str]]:
    """A mesh's rows: one per axis; a group an earlier row showed says so (``shown``:
    (source mesh, axis) -> where it was shown, updated here)."""
    shape = ", ".join(f"{n}={s}" for n, s in zip(m.axis_names, m.sizes, strict=True))
    if m.outside:
        coord = "" if m.coordinate is None else ", ".join(map(str, m.coordinate))
        return [[m.name, shape, "", "", coord, "groups made by torch itself (below)"]]
    if m.coordinate is None:
        return [[m.name, shape, "", "", "", f"rank {rank} is not in this mesh"]]
    rows = []
    for i, g in enumerate(m.groups):
        where = shown.setdefault((g.source, g.source_axis), f"{m.name}.{g.axis}")
        same = "" if where == f"{m.name}.{g.axis}" else f"  (the group of {where})"
        rows.append(
            [
                m.name if i == 0 else "",
                shape if i == 0 else "",
                g.axis,
                str(g.size),
                str(g.group_rank),
                _ranks(g.head(), g.size) + same,
            ]
        )
    return rows


def launch_words(report: PlanReport) -> str:
    """The launch a report predicts, in words (its first line says it)."""
    torch = f"torch {report.torch_version}" if report.torch_version else "torch"
    if report.launch == "torch":
        return (
            f"predicts a plain torchrun launch on {torch} (--launch torch: torch's own "
            "init_device_mesh and DeviceMesh methods)"
        )
    return (
        f"predicts a launch under torchrun ... -m fmesh.route on {torch} (--launch "
        "route: torch's init_device_mesh and DeviceMesh methods routed through fmesh, "
        "captured copies included)"
    )


def plan_text(report: PlanReport) -> str:
    """The report ``fmesh plan module:function`` prints."""
    planned = len(report.ranks)
    out = [
        f"fmesh plan {report.target} {launch_words(report)}: {planned} of {report.world} "
        "ranks, each on a fresh fake world (torch's 'fake' backend standing in for the "
        "backends asked for)",
    ]
    brief = len(report.ranks) > SHOWN_RANKS
    for i, p in enumerate(report.ranks):
        if brief and i == SHOWN_RANKS // 2:
            out += [
                "",
                f"... the other {planned - i} planned ranks, one line each (their meshes "
                "and groups: --json)",
            ]
        if brief and i >= SHOWN_RANKS // 2:
            out.append(rank_line(p))
            continue
        out += ["", rank_line(p)]
        out += _rank_body(p)
    out.append("")
    out += [f"warning: {w}" for w in report.warnings]
    if report.divergence is not None:
        out.append(f"cross-rank check FAILED: {report.divergence.message}")
    elif planned < 2:
        out.append(
            "cross-rank check: only one rank planned; plan several (--rank sample:K or "
            "--rank all) to compare them"
        )
    else:
        realize = max(len(p.realize_calls) for p in report.ranks)
        torch = max(len(p.torch_calls) for p in report.ranks)
        also = (
            f" and {torch} group-creating calls of torch's own (same ranks, backends and "
            "options)"
            if torch
            else ""
        )
        out.append(
            f"cross-rank check: the {planned} planned ranks make the same {realize} "
            f"creating realize calls{also} in the same order (the digests a launch's "
            "agreement compares)"
        )
    return "\n".join(out) + "\n"


def _rank_body(p: RankPlan) -> list[str]:
    """A rank's meshes (a table), the views over groups shown above, and the groups
    torch made itself."""
    out: list[str] = []
    shown: dict[tuple[object, str], str] = {}
    rows: list[list[str]] = []
    views: dict[bool, list[str]] = {True: [], False: []}
    for m in p.meshes:
        seen = [shown.get((g.source, g.source_axis)) for g in m.groups]
        if m.groups and m.new_groups == 0 and all(seen):
            # A view of groups shown above (torchtitan's 1-d meshes): one mention.
            views[m.returned].append(f"{m.name} = {' x '.join(s for s in seen if s)}")
            continue
        rows += _mesh_rows(m, p.rank, shown)
    if rows:
        header = ["mesh", "shape", "axis", "size", "coord", f"group of rank {p.rank}"]
        out += ["  " + line for line in _table(header, rows, right={3, 4})]
    if views[True]:
        out.append(f"  also returned, over the groups above: {', '.join(views[True])}")
    if views[False]:
        out.append(f"  also realized, over the groups above: {', '.join(views[False])}")
    if p.torch_calls:
        out.append(
            "  groups fmesh did not make (torch's own calls; compared across ranks too):"
        )
        for c in p.torch_calls:
            mine = "" if c.held is None else f"; rank {p.rank}'s group {ranks_head(c.held)}"
            out.append(f"    {c.kind} #{c.number}: {c.summary}{mine}")
    return out


def plan_json(report: PlanReport) -> str:
    """The report as JSON (``fmesh plan --json``): one object on one line."""
    d = report.divergence
    payload: dict[str, Any] = {
        "fmesh_plan": 1,
        "target": report.target,
        "world": report.world,
        "launch": report.launch,
        "torch": report.torch_version,
        "ok": report.ok,
        "outcome": report.outcome,
        "warnings": list(report.warnings),
        "ranks": [_rank_json(p) for p in report.ranks],
        "divergence": None
        if d is None
        else {
            "call": d.number,
            "ranks": list(d.ranks),
            "calls": [None if c is None else _call_json(c) for c in d.calls],
            "message": d.message,
        },
    }
    return json.dumps(payload) + "\n"


def _call_json(c: PlannedCall) -> dict[str, Any]:
    return {
        "number": c.number,
        "kind": c.kind,
        "code": f"{c.code:016x}",
        "summary": c.summary,
        "history": c.history,
        "members": None if c.members is None else list(c.members[:JSON_MEMBERS]),
        "held": None if c.held is None else list(c.held[:JSON_MEMBERS]),
        "names": list(c.names),
    }


def _rank_json(p: RankPlan) -> dict[str, Any]:
    return {
        "rank": p.rank,
        "created": p.created,
        "held": p.held,
        "communicators": p.communicators,
        "seconds": round(p.seconds, 6),
        "tail": p.tail,
        "peak_memory": p.peak_memory,
        "memory_growth": p.memory_growth,
        "calls": [_call_json(c) for c in p.calls],
        "meshes": [
            {
                "name": m.name,
                "axis_names": list(m.axis_names),
                "sizes": list(m.sizes),
                "coordinate": None if m.coordinate is None else list(m.coordinate),
                "new_groups": m.new_groups,
                "returned": m.returned,
                "outside": m.outside,
                "groups": [
                    {
                        "axis": g.axis,
                        "size": g.size,
                        "group_rank": g.group_rank,
                        "members": list(g.members()) if g.size <= JSON_MEMBERS else None,
                    }
                    for g in m.groups
                ],
            }
            for m in p.meshes
        ],
    }
