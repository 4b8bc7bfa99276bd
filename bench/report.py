"""Render a results file: the full table (``results.md``) and the benchmark page's section.

Everything here is a function of the results payload alone (what ``results.json``
holds), so ``docs/benchmarks.md`` can be checked against the committed results: every
number between its markers is rendered from a row.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from .shared import EXPERT_NAMES, NAMES, Json, Row, fmt_ratio, fmt_value, shape_str, world_str

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
HEADER = (
    "| section | benchmark | ranks | fmesh | torch | torch/fmesh | note |",
    "|---|---|---|--:|--:|--:|---|",
)


def load(path: Path) -> Json:
    payload: Json = json.loads(path.read_text())
    return payload


def rows_of(payload: Json) -> list[Row]:
    return [Row(**r) for r in payload["rows"]]


def ahead_note(row: Row) -> str:
    """The row's note, prefixed with a plain verdict where fmesh is not ahead."""
    both = (row.fmesh, row.torch)
    if None not in both and max(v or 0.0 for v in both) < row.resolution:
        return f"**below resolution** ({fmt_value(row.resolution, row.unit)}): {row.note}"
    if row.ratio is None or row.ratio > 1.05:
        return row.note
    if row.ratio >= 0.95:
        verdict = "**par**" if row.unit != "count" or row.ratio != 1 else "**equal**"
    else:
        verdict = "**torch ahead**"
    return f"{verdict}: {row.note}"


def caption(payload: Json) -> str:
    m = payload["machine"]
    shapes = ", ".join(
        f"{world_str(int(w))} = {shape_str(s)}" for w, s in payload["shapes"].items()
    )
    load_avg = (
        f"{m['loadavg_start'][0]:.1f} at the start and {m['loadavg_end'][0]:.1f} at the end"
    )
    merged = "".join(
        f" Rows of `{r['command']}` (fmesh {r['fmesh']}, torch {r['torch']}): that run, "
        f"{r['date'][:10]}, load average {r['loadavg_start'][0]:.1f} at the start and "
        f"{r['loadavg_end'][0]:.1f} at the end."
        for r in m.get("merged", [])
    )
    return (
        f"*fmesh {m['fmesh']} vs torch {m['torch']} `DeviceMesh`, `{m['command']}` on "
        f"{m['platform']}, {m['cpus_usable']} CPUs, {m['memory_gib']} GiB, Python "
        f"{m['python']}, {m['date'][:10]} (shared machine, load average {load_avg}: "
        "medians of repeats; pure ops: batches interleaved, gc off in a batch). "
        "Ratio = torch / fmesh: above 1, fmesh is faster or smaller. Mesh "
        f"{shape_str(NAMES)}: {shapes}; flattens dp = (dp_replicate, dp_shard), dp_shard_cp "
        "= (dp_shard, cp), dp_cp = (dp_replicate, dp_shard, cp). torchtitan's meshes at "
        f"{world_str(int(payload['titan_world']))}: the dense mesh above and the expert view "
        f"{shape_str(EXPERT_NAMES)} = {shape_str(payload['expert_shape'])}, flattens batch, "
        "loss and fsdp of the dense one. Memo hits: the 3-axis mesh "
        f"{shape_str(('dp', 'fsdp', 'tp'))} = "
        f"{shape_str(('(pp·dp_replicate)', '(dp_shard·cp)', 'tp'))} of each shape.{merged}*"
    )


def table(rows: list[Row]) -> list[str]:
    lines = list(HEADER)
    for r in rows:
        torch = fmt_value(r.torch, r.unit) if r.skipped is None else r.skipped
        lines.append(
            f"| {r.section} | {r.bench} | {r.world} | {fmt_value(r.fmesh, r.unit)} | "
            f"{torch} | {fmt_ratio(r.ratio)} | {ahead_note(r)} |"
        )
    return lines


def results_md(payload: Json) -> str:
    """``results.md``: the caption and every row."""
    return "\n".join([caption(payload), "", *table(rows_of(payload))]) + "\n"


def shown_rows(rows: list[Row]) -> list[Row]:
    """Each benchmark at its largest size, and ``every_size`` ones at every size."""
    largest: dict[str, int] = {}
    for r in rows:
        largest[r.key] = max(largest.get(r.key, 0), r.ranks)
    return [r for r in rows if r.every_size or r.ranks == largest[r.key]]


# -- prose ------------------------------------------------------------------------------


def verdicts(shown: list[Row]) -> list[str]:
    """Where torch is ahead, and where fmesh is only at par, among the rows shown."""
    behind = [r for r in shown if r.ratio is not None and r.ratio < 0.95]
    par = [r for r in shown if r.ratio is not None and 0.95 <= r.ratio <= 1.05]
    out = [f"fmesh is ahead or at par in all {len(shown)} rows shown."]
    if behind:
        labels = "; ".join(f"{r.bench} at {r.world} ({fmt_ratio(r.ratio)})" for r in behind)
        out = [f"torch is ahead in {len(behind)} of the {len(shown)} rows shown: {labels}."]
        if any(r.key == "pure.coordinate_cached" for r in behind):
            out[0] += (
                " For the coordinate, torch returns the tuple it cached when it built the "
                "mesh (an O(world) search, the row above it); fmesh computes it in O(number "
                "of axes), and a `RealizedMesh` holds it as `.coordinate`."
            )
    if par:
        labels = "; ".join(f"{r.bench} at {r.world} ({fmt_ratio(r.ratio)})" for r in par)
        out.append(f"fmesh is only at par (within 5%) or equal in {len(par)}: {labels}.")
    return out


def readme_block(payload: Json) -> str:
    """The page's benchmark section, between the markers (markers excluded)."""
    shown = shown_rows(rows_of(payload))
    seconds = payload["machine"]["seconds"]
    took = f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} minutes"
    worlds = [int(w) for w in payload["shapes"]]
    intro = (
        "`python -m bench` measures fmesh and torch's `DeviceMesh` side by side in one run "
        "and rewrites `bench/results.json`, `bench/results.md` and this section (the run "
        f"below took {took}); `python -m bench --quick` and `--smoke` write to `bench/out/` "
        "(ignored by git) instead. `tests/test_bench.py` checks that this section is what "
        "`bench/results.json` renders. Shown: each benchmark at its largest size, and at "
        "every size the real-gloo wall times, groups and memo hits, the fake-backend memo "
        "hits, the store load's main rows and its extrapolations (`docs/design/store-load.md` "
        "explains them); `bench/results.md` has every size "
        f"({world_str(min(worlds))} to {world_str(max(worlds))} ranks on the fake backend)."
    )
    parts = [intro, *verdicts(shown)]
    wrapped = [
        textwrap.fill(p, 88, break_long_words=False, break_on_hyphens=False) for p in parts
    ]
    table_block = "\n".join([caption(payload), "", *table(shown)])
    return "\n" + "\n\n".join([wrapped[0], table_block, *wrapped[1:]]) + "\n"


def readme_section(page: str) -> str:
    """What the page holds between the markers."""
    if page.count(BEGIN) != 1 or page.count(END) != 1:
        raise ValueError(f"the page must hold {BEGIN} and {END} once each")
    return page[page.index(BEGIN) + len(BEGIN) : page.index(END)]


def with_section(page: str, block: str) -> str:
    """The page with ``block`` between the markers."""
    readme_section(page)  # checks the markers
    head, rest = page.split(BEGIN)
    return f"{head}{BEGIN}{block}{END}{rest.split(END)[1]}"
