"""``python -m bench``: run the benchmarks, write the results, render the benchmark page.

::

    python -m bench            # full run: bench/results.{json,md}, docs/benchmarks.md
    python -m bench --quick    # smaller sizes, fewer repeats -> bench/out/quick.*
    python -m bench --smoke    # tiny sizes, every code path once -> bench/out/smoke.*
    python -m bench --render   # re-render results.md and docs/benchmarks.md from results.json
    python -m bench --check    # exit 1 unless both are what results.json renders
    python -m bench --section titan   # one section (a module's name) -> see below

``--section NAME`` runs the sections of module ``bench.NAME`` alone. At full size it
replaces that module's rows in the committed ``results.json`` (appended when they are
new), notes the run in the results' machine info, and re-renders ``results.md`` and
``docs/benchmarks.md`` from the merged file; with ``--quick``, ``--smoke`` or
``--out`` it writes ``<mode>-<NAME>.*`` to the output folder instead.
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
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from . import dropin, elastic, fake, gloo, hits, memory, plan, pure, report, store_load, titan
from .launch import WorkerError
from .shared import SHAPES, Bench, Json, Mode, expert_shape

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results.json"
PAGE = ROOT / "docs" / "benchmarks.md"
"""The page whose section between ``report.BEGIN`` and ``report.END`` is rendered."""
OUT = HERE / "out"
"""Where quick and smoke runs write (ignored by git)."""

MODES = {
    "full": Mode(
        "full",
        worlds=(2**10, 2**14, 2**17, 2**20),
        pure_repeats=9,
        pure_target_s=0.03,
        realize_repeats=5,
        titan_world=2**17,
        titan_repeats=3,
        gloo=(((1, 1, 2, 1, 2), 7), ((1, 2, 2, 1, 2), 5), ((2, 2, 2, 1, 2), 3)),
        memory_world=2**20,
        hit_rounds=1000,
        hit_budget_s=0.3,
        store_ranks=(64, 256, 1024),
        store_calls=10,
        store_repeats=3,
    ),
    "quick": Mode(
        "quick",
        worlds=(2**10, 2**14, 2**17),
        pure_repeats=3,
        pure_target_s=0.02,
        realize_repeats=1,
        titan_world=2**17,
        titan_repeats=1,
        gloo=(((1, 1, 2, 1, 2), 1),),
        memory_world=2**14,
        hit_rounds=300,
        hit_budget_s=0.1,
        store_ranks=(64, 256),
        store_calls=5,
        store_repeats=1,
    ),
    "smoke": Mode(
        "smoke",
        worlds=(2**6, 2**8),
        pure_repeats=2,
        pure_target_s=0.002,
        realize_repeats=1,
        titan_world=2**8,
        titan_repeats=1,
        gloo=(((1, 1, 2, 1, 1), 1),),
        memory_world=2**8,
        hit_rounds=20,
        hit_budget_s=0.01,
        store_ranks=(16,),
        store_calls=2,
        store_repeats=1,
    ),
}
SECTIONS: tuple[Callable[[Bench], None], ...] = (
    pure.section,
    fake.section_realize,
    fake.section_interop,
    hits.section,
    gloo.section,
    store_load.section,
    dropin.section,
    elastic.section,
    memory.section,
    titan.section,
    plan.section,
)


def section_name(section: Callable[[Bench], None]) -> str:
    """The name ``--section`` selects a section by: its module's (``titan``)."""
    return section.__module__.rpartition(".")[2]


def machine_info(mode: Mode) -> Json:
    import fmesh

    flag = "" if mode.name == "full" else f" --{mode.name}"
    memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "command": f"python -m bench{flag}",
        "mode": mode.name,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_gib": round(memory_bytes / 2**30, 1),
        "python": platform.python_version(),
        "torch": importlib.metadata.version("torch"),
        "fmesh": fmesh.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "loadavg_start": os.getloadavg(),
    }


def measure(
    mode: Mode, log: Callable[[str], None], only: str | None = None
) -> tuple[Json, list[str]]:
    """Run every section (or those of module ``only``); the results payload and the
    sections that failed."""
    started = time.perf_counter()
    info = machine_info(mode)
    if only is not None:
        info["command"] += f" --section {only}"
    b = Bench(mode, log)
    errors: list[str] = []
    for section in SECTIONS:
        if only is not None and section_name(section) != only:
            continue
        try:
            section(b)
        except WorkerError as err:  # keep the other sections' results; exit 1
            name = f"{section.__module__}.{section.__name__}"
            log(f"{name} FAILED: {err}")
            errors.append(f"{name}: {err}")
    info["loadavg_end"] = os.getloadavg()
    info["seconds"] = round(time.perf_counter() - started, 1)
    payload = {
        "machine": info,
        "shapes": {str(w): SHAPES[w] for w in mode.worlds},
        "titan_world": mode.titan_world,
        "expert_shape": expert_shape(SHAPES[mode.titan_world]),
        "gloo_shapes": [list(shape) for shape, _ in mode.gloo],
        "store_ranks": list(mode.store_ranks),
        "errors": errors,
        "rows": [asdict(r) for r in b.rows],
        "raw": b.raw,
    }
    return payload, errors


def merge(committed: Json, part: Json, only: str) -> Json:
    """``committed`` with the rows and raw results of a ``--section only`` run.

    The part's rows replace those of the same sections (in place; appended when new),
    and the run is recorded in ``machine["merged"]``.
    """
    new_rows: list[Json] = part["rows"]
    sections = {r["section"] for r in new_rows}
    rows: list[Json] = []
    placed = False
    for row in committed["rows"]:
        if row["section"] in sections:
            if not placed:
                rows.extend(new_rows)
                placed = True
            continue
        rows.append(row)
    if not placed:
        rows.extend(new_rows)
    m = part["machine"]
    run = {k: m[k] for k in ("command", "date", "seconds", "loadavg_start", "loadavg_end")}
    run["torch"], run["fmesh"] = m["torch"], m["fmesh"]
    machine = dict(committed["machine"])
    earlier = [r for r in machine.get("merged", []) if r["command"] != run["command"]]
    machine["merged"] = [*earlier, run]
    return {
        **committed,
        "machine": machine,
        "rows": rows,
        "raw": {**committed["raw"], **part["raw"]},
        "errors": [*committed["errors"], *part["errors"]],
    }


def write(payload: Json, json_path: Path, page: Path | None) -> list[Path]:
    """Write the payload, its table and (for the committed results) the benchmark page."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(payload, indent=1) + "\n")
    md = json_path.with_suffix(".md")
    md.write_text(report.results_md(payload))
    block = report.readme_block(payload)
    if page is not None:
        page.write_text(report.with_section(page.read_text(), block))
        return [json_path, md, page]
    section = json_path.with_name(json_path.stem + ".readme.md")
    section.write_text(block)
    return [json_path, md, section]


def check(json_path: Path, page: Path) -> list[str]:
    """Differences between the committed renderings and what ``json_path`` renders."""
    payload = report.load(json_path)
    problems: list[str] = []
    md = json_path.with_suffix(".md")
    pairs = (
        (md, md.read_text(), report.results_md(payload)),
        (page, report.readme_section(page.read_text()), report.readme_block(payload)),
    )
    for path, have, want in pairs:
        if have != want:
            diff = difflib.unified_diff(
                have.splitlines(), want.splitlines(), f"{path} (now)", "rendered", lineterm=""
            )
            problems.append("\n".join(diff))
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="Benchmark fmesh against torch's DeviceMesh."
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--quick", action="store_true", help="smaller sizes -> bench/out/")
    what.add_argument("--smoke", action="store_true", help="tiny sizes -> bench/out/")
    what.add_argument(
        "--render",
        action="store_true",
        help="re-render results.md, docs/benchmarks.md from results.json",
    )
    what.add_argument(
        "--check",
        action="store_true",
        help="exit 1 unless results.md, docs/benchmarks.md are rendered",
    )
    parser.add_argument(
        "--section",
        choices=sorted({section_name(s) for s in SECTIONS}),
        default=None,
        help="run one module's sections; at full size, merge them into the committed "
        "results and re-render",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for the results (default: bench/ for a full run, which also "
        "rewrites docs/benchmarks.md; bench/out/ otherwise)",
    )
    args = parser.parse_args(argv)

    if args.check:
        problems = check(RESULTS, PAGE)
        for p in problems:
            print(p)
        print("bench: renderings are stale" if problems else "bench: renderings match")
        return 1 if problems else 0
    if args.render:
        for path in write(report.load(RESULTS), RESULTS, PAGE):
            print(f"bench: wrote {path}")
        return 0

    mode = MODES["smoke" if args.smoke else "quick" if args.quick else "full"]
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {msg}", file=sys.stderr, flush=True)

    payload, errors = measure(mode, log, args.section)
    # A failed full run does not replace the committed results: it goes to bench/out/.
    committed = mode.name == "full" and args.out is None and not errors
    folder: Path = HERE if committed else (args.out or OUT)
    stem = mode.name if args.section is None else f"{mode.name}-{args.section}"
    json_path = folder / ("results.json" if committed else f"{stem}.json")
    if committed and args.section is not None:
        payload = merge(report.load(RESULTS), payload, args.section)
    for path in write(payload, json_path, PAGE if committed else None):
        log(f"wrote {path}")
    print(report.results_md(payload))
    if errors:
        log(f"{len(errors)} section(s) failed; their rows are missing (see 'errors')")
        return 1
    return 0
