"""``fmesh plan``: torchtitan's recipe checked before launch, as a user runs it.

``fmesh plan --world W --rank sample:16 examples/parallel_dims.py:torchtitan`` as a
subprocess: importing torch, 16 ranks each on a fresh fake world with torch's own
``init_device_mesh`` and ``DeviceMesh._unflatten``/``_flatten`` routed through fmesh,
and the cross-rank check. Rows: the command's wall time (imports included; median of
runs) and its peak resident memory. torch has no planner to compare with: its own
DeviceMesh on the fake backend plays one rank per process and compares nothing.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .launch import WorkerError
from .shared import Bench, Row, world_str

__all__ = ["RANKS", "TARGET", "section"]

TARGET = "examples/parallel_dims.py:torchtitan"
RANKS = 16
"""Ranks planned per run (``--rank sample:16``)."""
ROOT = Path(__file__).resolve().parent.parent
SECTION = "plan (fake)"
SKIPPED = "torch has no planner"


def worlds(mode: str) -> tuple[int, ...]:
    """World sizes to plan: the issue's targets in a full run (the recipe needs a
    multiple of 512 ranks)."""
    return {"full": (2**17, 2**20), "quick": (2**17,)}.get(mode, (2**9,))


def run_plan(world: int) -> tuple[float, int, dict[str, Any]]:
    """(wall seconds, peak RSS in bytes, the JSON report) of one ``fmesh plan``.

    The peak is the largest the plan itself measured: per rank, the process's peak
    resident memory while the recipe ran (the kernel's mark, reset before each rank).
    """
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fmesh",
            "plan",
            "--world",
            str(world),
            "--rank",
            f"sample:{RANKS}",
            "--json",
            TARGET,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise WorkerError(f"fmesh plan failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(proc.stdout)
    peak = max(int(r["peak_memory"] or 0) for r in report["ranks"])
    return seconds, peak, report


def section(b: Bench) -> None:
    repeats = b.mode.titan_repeats
    for world in worlds(b.mode.name):
        w = world_str(world)
        b.log(f"fmesh plan {TARGET} at {w}, {RANKS} ranks x {repeats} ...")
        runs = [run_plan(world) for _ in range(repeats)]
        report = runs[-1][2]
        ranks = report["ranks"]
        if report["ok"] is not True or len(ranks) != RANKS:
            raise WorkerError(f"fmesh plan at {w}: {report['divergence']}, {len(ranks)} ranks")
        b.raw[f"plan.{world}"] = {
            "seconds": [s for s, _, _ in runs],
            "peak_rss": [p for _, p, _ in runs],
            "rank_seconds": [r["seconds"] for r in ranks],
        }
        for key, what, unit, values, note, resolution in (
            (
                "seconds",
                "wall time",
                "s",
                [s for s, _, _ in runs],
                "the whole command as a subprocess, importing torch included; each rank on "
                "a fresh fake world; target: under 10 s at 2^17",
                0.0,
            ),
            (
                "peak_rss",
                "peak RSS",
                "B",
                [p for _, p, _ in runs],
                "largest resident set of the command (torch's DeviceMesh holds an O(world) "
                "rank map per root)",
                float(2**20),
            ),
        ):
            b.rows.append(
                Row(
                    f"plan.titan.{key}",
                    section=SECTION,
                    world=w,
                    ranks=world,
                    torch=None,
                    skipped=SKIPPED,
                    bench=f"fmesh plan of torchtitan's recipe, {RANKS} ranks, {what}",
                    unit=unit,
                    fmesh=statistics.median(values),
                    note=note,
                    resolution=resolution,
                )
            )
