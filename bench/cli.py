"""``python -m bench``: run the benchmarks, write the results, render the benchmark page.

::

    python -m bench            # full run: bench/results.{json,md}, docs/benchmarks.md
    python -m bench --quick    # smaller sizes, fewer repeats -> bench/out/quick.*
    python -m bench --smoke    # tiny sizes, every code path once -> bench/out/smoke.*
    python -m bench --render   # re-render results.md and docs/benchmarks.md from results.json
    python -m bench --check    # exit 1 unless both are what results.json renders
    python -m bench --section titan   # the cases of one name (bench/cases.py)
    python -m bench --out DIR  # the results to DIR; nothing committed is rewritten

``--section NAME`` runs the cases named NAME alone. At full size it replaces their
sections' rows in the committed ``results.json`` (appended when new), notes the run in
the results' machine info, and re-renders ``results.md`` and ``docs/benchmarks.md``;
with ``--quick``, ``--smoke`` or ``--out`` it writes ``<mode>-<NAME>.*`` to the output
folder instead. Everything rendered is a function of the results payload alone, so the
page can be checked against the committed results: every number between its markers
is rendered from a row.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import importlib.metadata
import json
import os
import platform
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from . import shared
from .cases import BIG, CASES, GLOO, WORLDS
from .launch import WorkerError
from .runners import run_case
from .shared import Bench, Json, Row, fmt_ratio, fmt_value, shape_str, world_str

HERE = Path(__file__).resolve().parent
RESULTS, OUT = HERE / "results.json", HERE / "out"
"""The committed results; where quick and smoke runs write (ignored by git)."""
PAGE = HERE.parent / "docs" / "benchmarks.md"
"""The page whose section between ``BEGIN`` and ``END`` is rendered."""
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def measure(mode: str, log: Callable[[str], None], only: str | None = None) -> Json:
    """Run every case (or those named ``only``): the results payload."""
    import fmesh

    started, b, errors = time.perf_counter(), Bench(mode, log), []
    gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    # fmt: off
    info: Json = {
        "command": "python -m bench" + ("" if mode == "full" else f" --{mode}"), "mode": mode,
        "platform": platform.platform(), "machine": platform.machine(),
        "processor": platform.processor(), "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)), "memory_gib": round(gib, 1),
        "python": platform.python_version(), "torch": importlib.metadata.version("torch"),
        "fmesh": fmesh.__version__, "loadavg_start": os.getloadavg(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    # fmt: on
    info["command"] += f" --section {only}" if only else ""
    for case in CASES:
        if only in (None, case.name):
            try:
                run_case(b, case)
            except WorkerError as err:  # keep the other cases' results; exit 1
                log(f"{case.raw_key} FAILED: {err}")
                errors.append(f"{case.raw_key}: {err}")
    info["loadavg_end"] = os.getloadavg()
    info["seconds"] = round(time.perf_counter() - started, 1)
    titan = BIG[mode][0]
    # fmt: off
    return {
        "machine": info, "shapes": {str(w): shared.SHAPES[w] for w in WORLDS[mode]},
        "titan_world": titan, "expert_shape": shared.expert_shape(shared.SHAPES[titan]),
        "gloo_shapes": [list(shape) for shape in GLOO[mode]], "errors": errors,
        "rows": [asdict(r) for r in b.rows], "raw": b.raw,
    }
    # fmt: on


def merge(committed: Json, part: Json) -> Json:
    """``committed`` with the rows and raw results of a ``--section`` run: its rows
    replace those of the same table sections (in place; appended when new), and the
    run is noted in ``machine["merged"]``."""
    new_rows: list[Json] = part["rows"]
    sections = {r["section"] for r in new_rows}
    rows = [r for r in committed["rows"] if r["section"] not in sections]
    old = [i for i, r in enumerate(committed["rows"]) if r["section"] in sections]
    at = old[0] if old else len(rows)  # where the sections' old rows began
    rows[at:at] = new_rows
    keep = ("command", "date", "seconds", "loadavg_start", "loadavg_end", "torch", "fmesh")
    run = {k: part["machine"][k] for k in keep}
    machine = dict(committed["machine"])
    others = [r for r in machine.get("merged", []) if r["command"] != run["command"]]
    machine["merged"] = [*others, run]
    raw, errors = {**committed["raw"], **part["raw"]}, [*committed["errors"], *part["errors"]]
    return {**committed, "machine": machine, "rows": rows, "raw": raw, "errors": errors}


# -- rendering ----------------------------------------------------------------------------


def load(path: Path) -> Json:
    return dict(json.loads(path.read_text()))


def ahead_note(row: Row) -> str:
    """The row's note, prefixed with a plain verdict where fmesh is not ahead."""
    both = None not in (row.fmesh, row.torch)
    if both and max(row.fmesh or 0, row.torch or 0) < row.resolution:
        return f"**below resolution** ({fmt_value(row.resolution, row.unit)}): {row.note}"
    if both and row.ratio != 1 and abs((row.fmesh or 0) - (row.torch or 0)) < row.resolution:
        within = fmt_value(row.resolution, row.unit)
        return f"**equal within resolution** ({within}): {row.note}"
    if row.ratio is None or row.ratio > 1.05:
        return row.note
    if row.ratio >= 0.95:
        verdict = "**par**" if row.unit != "count" or row.ratio != 1 else "**equal**"
    else:
        verdict = "**torch ahead**"
    if row.limit and row.ratio < 1:
        verdict += f" (fmesh's floor: {row.limit})"
    return f"{verdict}: {row.note}"


def caption(payload: Json) -> str:
    m, titan, expert = payload["machine"], payload["titan_world"], payload["expert_shape"]
    x = shared.TIMES
    shapes = ", ".join(
        f"{world_str(int(w))} = {shape_str(s)}" for w, s in payload["shapes"].items()
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
        f"{m['python']}, {m['date'][:10]} (shared machine, load average "
        f"{m['loadavg_start'][0]:.1f} at the start and {m['loadavg_end'][0]:.1f} at the end: "
        "medians of repeats; pure ops: batches interleaved, gc off in a batch). "
        "Ratio = torch / fmesh: above 1, fmesh is faster or smaller. Mesh "
        f"{shape_str(shared.NAMES)}: {shapes}; flattens dp = (dp_replicate, dp_shard), "
        "dp_shard_cp = (dp_shard, cp), dp_cp = (dp_replicate, dp_shard, cp). torchtitan's "
        f"meshes at {world_str(int(titan))}: the dense mesh above and the expert view "
        f"{shape_str(shared.EXPERT_NAMES)} = {shape_str(expert)}, flattens batch, loss and "
        f"fsdp of the dense one. Memo hits: the 3-axis mesh dp{x}fsdp{x}tp = "
        f"(pp·dp_replicate){x}(dp_shard·cp){x}tp of each shape.{merged}*"
    )


def table(payload: Json, rows: list[Row]) -> str:
    lines = [
        caption(payload),
        "",
        "| section | benchmark | ranks | fmesh | torch | torch/fmesh | note |",
        "|---|---|---|--:|--:|--:|---|",
    ]
    for r in rows:
        torch = fmt_value(r.torch, r.unit) if r.skipped is None else r.skipped
        lines.append(
            f"| {r.section} | {r.bench} | {r.world} | {fmt_value(r.fmesh, r.unit)} | "
            f"{torch} | {fmt_ratio(r.ratio)} | {ahead_note(r)} |"
        )
    return "\n".join(lines)


def results_md(payload: Json) -> str:
    """``results.md``: the caption and every row."""
    return table(payload, [Row(**r) for r in payload["rows"]]) + "\n"


def verdicts(shown: list[Row]) -> list[str]:
    """Where torch is ahead, and where fmesh is only at par, among the rows shown."""

    def within(r: Row) -> bool:
        return abs((r.fmesh or 0) - (r.torch or 0)) < r.resolution

    behind = [r for r in shown if r.ratio is not None and r.ratio < 0.95 and not within(r)]
    par = [
        r for r in shown if r.ratio is not None and 0.95 <= r.ratio <= 1.05 and not within(r)
    ]
    out = [f"fmesh is ahead or at par in all {len(shown)} rows shown."]
    if behind:
        labels = "; ".join(f"{r.bench} at {r.world} ({fmt_ratio(r.ratio)})" for r in behind)
        out = [f"torch is ahead in {len(behind)} of the {len(shown)} rows shown: {labels}."]
        floors = [r for r in behind if r.limit]
        if floors:
            out[0] += (
                f" In {len(floors)} of them fmesh is at the floor its guarantees set, "
                "named in the row's note."
            )
    if par:
        labels = "; ".join(f"{r.bench} at {r.world} ({fmt_ratio(r.ratio)})" for r in par)
        out.append(f"fmesh is only at par (within 5%) or equal in {len(par)}: {labels}.")
    return out


def readme_block(payload: Json) -> str:
    """The page's benchmark section, between the markers (markers excluded): each
    benchmark at its largest size, and ``every_size`` ones at every size."""
    rows = [Row(**r) for r in payload["rows"]]
    largest: dict[str, int] = {}
    for r in rows:
        largest[r.key] = max(largest.get(r.key, 0), r.ranks)
    shown = [r for r in rows if r.every_size or r.ranks == largest[r.key]]
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
    parts = [textwrap.fill(p, 88, break_long_words=False, break_on_hyphens=False)
             for p in (intro, *verdicts(shown))]  # fmt: skip
    return "\n" + "\n\n".join([parts[0], table(payload, shown), *parts[1:]]) + "\n"


def section(page: str) -> str:
    """What the page holds between the markers."""
    if page.count(BEGIN) != 1 or page.count(END) != 1:
        raise ValueError(f"the page must hold {BEGIN} and {END} once each")
    return page[page.index(BEGIN) + len(BEGIN) : page.index(END)]


def write(payload: Json, json_path: Path, page: Path | None) -> list[Path]:
    """Write the payload, its table, and the benchmark page's section (to ``page`` for
    the committed results, else beside the payload)."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(payload, indent=1) + "\n")
    md = json_path.with_suffix(".md")
    md.write_text(results_md(payload))
    block = readme_block(payload)
    if page is None:
        page = json_path.with_name(json_path.stem + ".readme.md")
        page.write_text(block)
    else:
        text = page.read_text()
        page.write_text(text.replace(f"{BEGIN}{section(text)}{END}", f"{BEGIN}{block}{END}"))
    return [json_path, md, page]


def check(json_path: Path, page: Path) -> list[str]:
    """Differences between the committed renderings and what ``json_path`` renders."""
    payload, md = load(json_path), json_path.with_suffix(".md")
    problems = []
    for path, have, want in (
        (md, md.read_text(), results_md(payload)),
        (page, section(page.read_text()), readme_block(payload)),
    ):
        if have != want:
            diff = difflib.unified_diff(
                have.splitlines(), want.splitlines(), f"{path} (now)", "rendered", lineterm=""
            )
            problems.append("\n".join(diff))
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        "python -m bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    what = parser.add_mutually_exclusive_group()
    for flag in ("--quick", "--smoke", "--render", "--check"):
        what.add_argument(flag, action="store_true")
    parser.add_argument("--section", choices=sorted({c.name for c in CASES}))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.check:
        problems = check(RESULTS, PAGE)
        verdict = "bench: renderings are stale" if problems else "bench: renderings match"
        print("\n".join([*problems, verdict]))
        return 1 if problems else 0
    if args.render:
        for path in write(load(RESULTS), RESULTS, PAGE):
            print(f"bench: wrote {path}")
        return 0

    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {msg}", file=sys.stderr, flush=True)

    payload = measure(mode, log, args.section)
    errors = payload["errors"]
    # A failed full run does not replace the committed results: it goes to bench/out/.
    committed = mode == "full" and args.out is None and not errors
    stem = mode if args.section is None else f"{mode}-{args.section}"
    json_path = RESULTS if committed else (args.out or OUT) / f"{stem}.json"
    if committed and args.section is not None:
        payload = merge(load(RESULTS), payload)
    for path in write(payload, json_path, PAGE if committed else None):
        log(f"wrote {path}")
    print(results_md(payload))
    if errors:
        log(f"{len(errors)} case(s) failed; their rows are missing (see 'errors')")
        return 1
    return 0
