"""``python -m bench``: run the benchmarks, write the results, render the benchmark page.

::

    python -m bench            # full run: bench/results.{json,md}, docs/benchmarks.md
    python -m bench --quick    # smaller sizes, fewer repeats -> bench/out/quick.*
    python -m bench --smoke    # tiny sizes, every code path once -> bench/out/smoke.*
    python -m bench --render   # re-render results.md and docs/benchmarks.md from results.json
    python -m bench --check    # exit 1 unless both are what results.json renders
    python -m bench --section titan   # the cases of one name (bench/cases.py)

``--section NAME`` runs the cases named NAME alone. At full size it replaces their
sections' rows in the committed ``results.json`` (appended when new), notes the run in
the results' machine info, and re-renders ``results.md`` and ``docs/benchmarks.md``;
with ``--quick``, ``--smoke`` or ``--out`` it writes ``<mode>-<NAME>.*`` to the output
folder instead.
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

from . import report
from .cases import BIG, CASES, GLOO, WORLDS
from .launch import WorkerError
from .runners import run_case
from .shared import SHAPES, Bench, Json, expert_shape

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.json"
PAGE = HERE.parent / "docs" / "benchmarks.md"
"""The page whose section between ``report.BEGIN`` and ``report.END`` is rendered."""
OUT = HERE / "out"
"""Where quick and smoke runs write (ignored by git)."""


def machine_info(mode: str) -> Json:
    import fmesh

    return {
        "command": "python -m bench" + ("" if mode == "full" else f" --{mode}"),
        "mode": mode,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_gib": round(
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1
        ),
        "python": platform.python_version(),
        "torch": importlib.metadata.version("torch"),
        "fmesh": fmesh.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "loadavg_start": os.getloadavg(),
    }


def measure(
    mode: str, log: Callable[[str], None], only: str | None = None
) -> tuple[Json, list[str]]:
    """Run every case (or those named ``only``); the results and the cases that failed."""
    started = time.perf_counter()
    info = machine_info(mode)
    if only is not None:
        info["command"] += f" --section {only}"
    b = Bench(mode, log)
    errors: list[str] = []
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
    payload = {
        "machine": info,
        "shapes": {str(w): SHAPES[w] for w in WORLDS[mode]},
        "titan_world": titan,
        "expert_shape": expert_shape(SHAPES[titan]),
        "gloo_shapes": [list(shape) for shape in GLOO[mode]],
        "errors": errors,
        "rows": [asdict(r) for r in b.rows],
        "raw": b.raw,
    }
    return payload, errors


def merge(committed: Json, part: Json) -> Json:
    """``committed`` with the rows and raw results of a ``--section`` run: its rows
    replace those of the same table sections (in place; appended when new), and the
    run is noted in ``machine["merged"]``."""
    new_rows: list[Json] = part["rows"]
    sections = {r["section"] for r in new_rows}
    rows: list[Json] = []
    placed = False
    for row in committed["rows"]:
        if row["section"] not in sections:
            rows.append(row)
        elif not placed:
            rows.extend(new_rows)
            placed = True
    if not placed:
        rows.extend(new_rows)
    m = part["machine"]
    run = {
        k: m[k]
        for k in (
            "command",
            "date",
            "seconds",
            "loadavg_start",
            "loadavg_end",
            "torch",
            "fmesh",
        )
    }
    machine = dict(committed["machine"])
    machine["merged"] = [
        *(r for r in machine.get("merged", []) if r["command"] != run["command"]),
        run,
    ]
    return {
        **committed,
        "machine": machine,
        "rows": rows,
        "raw": {**committed["raw"], **part["raw"]},
        "errors": [*committed["errors"], *part["errors"]],
    }


def write(payload: Json, json_path: Path, page: Path | None) -> list[Path]:
    """Write the payload, its table, and the benchmark page's section (to ``page`` for
    the committed results, else beside the payload)."""
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
    md = json_path.with_suffix(".md")
    problems = []
    for path, have, want in (
        (md, md.read_text(), report.results_md(payload)),
        (page, report.readme_section(page.read_text()), report.readme_block(payload)),
    ):
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
    # fmt: off
    for flag, text in (
        ("--quick", "smaller sizes -> bench/out/"),
        ("--smoke", "tiny sizes -> bench/out/"),
        ("--render", "re-render results.md, docs/benchmarks.md from results.json"),
        ("--check", "exit 1 unless results.md, docs/benchmarks.md are rendered"),
    ):
        what.add_argument(flag, action="store_true", help=text)
    parser.add_argument("--section", choices=sorted({c.name for c in CASES}),
                        help="run the cases of one name; at full size, merge them into "
                        "the committed results and re-render")
    parser.add_argument("--out", type=Path, help="folder for the results (default: bench/ "
                        "for a full run, which also rewrites docs/benchmarks.md; bench/out/ "
                        "otherwise)")
    # fmt: on
    args = parser.parse_args(argv)
    if args.check:
        problems = check(RESULTS, PAGE)
        verdict = "bench: renderings are stale" if problems else "bench: renderings match"
        print("\n".join([*problems, verdict]))
        return 1 if problems else 0
    if args.render:
        for path in write(report.load(RESULTS), RESULTS, PAGE):
            print(f"bench: wrote {path}")
        return 0

    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {msg}", file=sys.stderr, flush=True)

    payload, errors = measure(mode, log, args.section)
    # A failed full run does not replace the committed results: it goes to bench/out/.
    committed = mode == "full" and args.out is None and not errors
    folder: Path = HERE if committed else (args.out or OUT)
    stem = mode if args.section is None else f"{mode}-{args.section}"
    json_path = folder / ("results.json" if committed else f"{stem}.json")
    if committed and args.section is not None:
        payload = merge(report.load(RESULTS), payload)
    for path in write(payload, json_path, PAGE if committed else None):
        log(f"wrote {path}")
    print(report.results_md(payload))
    if errors:
        log(f"{len(errors)} case(s) failed; their rows are missing (see 'errors')")
        return 1
    return 0
