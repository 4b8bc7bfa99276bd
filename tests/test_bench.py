"""``bench/run.py --quick`` runs end to end and reports every row with both figures.

Timings are never asserted: the machine is shared and noisy. What is checked is the
shape of the results: every benchmark at every size, fmesh's and torch's figure, and
a ratio that really is torch / fmesh.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "run.py"
SECTIONS = ("pure ops", "realize (fake)", "realize (gloo)", "memory")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "r.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, f"bench/run.py --quick failed:\n{proc.stderr[-4000:]}"
    loaded: dict[str, Any] = json.loads(out.read_text())
    loaded["_markdown"] = out.with_suffix(".md").read_text()
    loaded["_stdout"] = proc.stdout
    return loaded


def test_machine_info(results: dict[str, Any]) -> None:
    machine = results["machine"]
    for key in ("platform", "cpu_count", "python", "torch", "fmesh", "date", "mode"):
        assert machine.get(key), f"machine info lacks {key!r}: {machine}"
    assert machine["mode"] == "quick"


def test_every_row_has_both_figures_and_their_ratio(results: dict[str, Any]) -> None:
    rows = results["rows"]
    assert rows
    for row in rows:
        assert row["skipped"] is None, row
        fm, th = row["fmesh"], row["torch"]
        assert isinstance(fm, int | float) and fm >= 0, row
        assert isinstance(th, int | float) and th >= 0, row
        if fm > 0:
            assert math.isclose(row["ratio"], th / fm, rel_tol=1e-9), row
        else:
            assert row["ratio"] is None, row


def test_every_benchmark_at_every_size(results: dict[str, Any]) -> None:
    worlds: dict[tuple[str, str], set[str]] = defaultdict(set)
    for row in results["rows"]:
        worlds[row["section"], row["bench"]].add(row["world"])
    assert {section for section, _ in worlds} == set(SECTIONS)
    sizes = {f"2^{int(w).bit_length() - 1}" for w in results["shapes"]}
    for (section, bench), seen in worlds.items():
        if section in ("pure ops", "realize (fake)"):
            assert seen == sizes, (section, bench, seen)
        else:
            assert len(seen) >= 1, (section, bench)
    pure = [b for s, b in worlds if s == "pure ops"]
    for op in ("construct", "slice", "flatten", "unflatten", "coordinate"):
        assert any(op in b for b in pure), (op, pure)


def test_markdown_table_matches_json(results: dict[str, Any]) -> None:
    md = results["_markdown"]
    assert md in results["_stdout"]
    lines = md.splitlines()
    assert results["machine"]["torch"] in lines[0]  # caption: machine and torch
    header = "| section | benchmark | ranks | fmesh | torch | torch/fmesh | note |"
    assert header in lines
    body = lines[lines.index(header) + 2 :]
    assert len([line for line in body if line.startswith("| ")]) == len(results["rows"])
