"""The benchmark machinery runs, and the committed results are what the docs show.

Timings are never asserted: the machine is shared and noisy. Checked instead:

* ``python -m bench --smoke`` runs every benchmark once at tiny sizes, writes only to
  the ignored ``bench/out/`` (the committed results stay as they are), and reports
  every row with both figures and a ratio that really is torch / fmesh; its store load
  (16 simulated ranks on one real TCPStore) counts what each side sends and finds the
  rank whose process it kills;
* the committed ``bench/results.json`` comes from a full run of the current
  benchmark set (every benchmark the smoke run has, at every size), and
  ``bench/results.md`` and the section of ``docs/benchmarks.md`` are exactly what it
  renders (``python -m bench --check``), so no figure there is typed by hand.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import fmesh

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
COMMITTED = (BENCH / "results.json", BENCH / "results.md", ROOT / "docs" / "benchmarks.md")
SECTIONS = {
    "pure ops",
    "realize (fake)",
    "interop (fake)",
    "memo hit (fake)",
    "realize (gloo)",
    "store load",
    "drop-in (fake)",
    "drop-in (gloo)",
    "elastic (gloo)",
    "memory",
    "torchtitan (fake)",
    "torchtitan (gloo)",
    "plan (fake)",
}
EXTRAPOLATED = {2**17, 2**20}
"""World sizes the store load is extrapolated to."""
STORE_EXTRAPOLATED = (
    "store.watch.server_extrapolated",
    "store.call.cpu_per_call_extrapolated",
)


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
    )


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def smoke() -> dict[str, Any]:
    before = {p: _digest(p) for p in COMMITTED}
    proc = _bench("--smoke")
    assert proc.returncode == 0, f"python -m bench --smoke failed:\n{proc.stderr[-4000:]}"
    assert {p: _digest(p) for p in COMMITTED} == before, "a smoke run changed committed files"
    out = BENCH / "out"
    loaded: dict[str, Any] = json.loads((out / "smoke.json").read_text())
    loaded["_markdown"] = (out / "smoke.md").read_text()
    loaded["_stdout"] = proc.stdout
    return loaded


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((BENCH / "results.json").read_text())
    return loaded


def test_smoke_output_is_ignored_by_git() -> None:
    proc = subprocess.run(
        ["git", "check-ignore", "-q", "bench/out/smoke.json"], cwd=ROOT, check=False
    )
    assert proc.returncode == 0, "bench/out/ must be in .gitignore"


@pytest.mark.parametrize("which", ["smoke", "committed"])
def test_results_record_versions_machine_and_date(
    which: str, request: pytest.FixtureRequest
) -> None:
    results: dict[str, Any] = request.getfixturevalue(which)
    machine = results["machine"]
    for key in ("torch", "fmesh", "platform", "cpus_usable", "memory_gib", "python", "date"):
        assert machine.get(key), f"machine info lacks {key!r}: {machine}"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT.*", machine["date"])
    assert machine["mode"] == ("smoke" if which == "smoke" else "full")
    assert results["errors"] == []


def test_committed_results_are_of_this_fmesh_version(committed: dict[str, Any]) -> None:
    assert committed["machine"]["fmesh"] == fmesh.__version__


def test_every_row_has_both_figures_and_their_ratio(smoke: dict[str, Any]) -> None:
    rows = smoke["rows"]
    assert rows
    for row in rows:
        fm, th = row["fmesh"], row["torch"]
        assert isinstance(fm, int | float) and fm >= 0, row
        if row["skipped"] is not None:  # fmesh-only rows (torch has no memo, no check)
            assert th is None and row["ratio"] is None, row
            continue
        assert isinstance(th, int | float) and th >= 0, row
        if fm > 0:
            assert math.isclose(row["ratio"], th / fm, rel_tol=1e-9), row
        else:
            assert row["ratio"] is None, row


def test_every_benchmark_at_every_size(smoke: dict[str, Any]) -> None:
    sizes: dict[str, set[int]] = defaultdict(set)
    sections = set()
    for row in smoke["rows"]:
        sizes[row["key"]].add(row["ranks"])
        sections.add(row["section"])
    assert sections == SECTIONS
    worlds = {int(w) for w in smoke["shapes"]}
    gloo = {math.prod(s) for s in smoke["gloo_shapes"]}
    store = {int(n) for n in smoke["raw"]["store.call"]}
    for key, seen in sizes.items():
        if key.startswith(("pure.", "fake.trainer5.")):
            assert seen == worlds, (key, seen)
        elif key.startswith(("fake.titan.", "interop.", "dropin.fake.")):
            assert seen == {smoke["titan_world"]}, (key, seen)
        elif key.startswith(("gloo.", "dropin.gloo.")):
            assert seen == gloo, (key, seen)
        elif key.startswith("fake.hit"):
            assert seen == worlds, (key, seen)
        elif key.startswith(("titan.fake.", "titan.partial_dtensor.")):
            assert seen == ({2**6} if key.endswith("growth") else {2**4, 2**6}), (key, seen)
        elif key.startswith("titan.gloo."):
            assert seen == {4}, (key, seen)
        elif key.startswith("plan."):
            assert seen == {2**9}, (key, seen)
        elif key in STORE_EXTRAPOLATED:
            assert seen == EXTRAPOLATED, (key, seen)
        elif key.startswith("store."):
            assert seen == store == {16}, (key, seen)
    pure = {k for k in sizes if k.startswith("pure.")}
    for op in ("construct", "slice", "flatten", "unflatten", "coordinate"):
        assert any(op in k for k in pure), (op, pure)


def _gloo_ranks(smoke: dict[str, Any], impl: str, counted: bool) -> list[dict[str, Any]]:
    """Every rank of every job of ``impl``: the counting jobs', or the timed jobs'."""
    sizes = smoke["raw"]["gloo.trainer5"].values()
    ranks = [r for size in sizes for job in size["runs"][impl] for r in job]
    chosen = [r for r in ranks if r["counted"] == counted]
    assert chosen, (impl, counted)
    return chosen


def test_gloo_memo_hits_send_no_store_request(smoke: dict[str, Any]) -> None:
    # A hit is a lookup in the process's memo: nothing goes to the store, on
    # any rank (the whole world in rank order is served by the default group).
    for rank in _gloo_ranks(smoke, "fmesh", counted=True):
        for phase in ("world_1d", "memo", "hit"):
            assert rank[phase]["requests"] == 0, (phase, rank)
            assert rank[phase]["agreements"] == 0, (phase, rank)
        assert rank["memo"]["calls"] == 4  # realize + 3 flattens
        assert rank["memo"]["created"] == 0
        assert rank["hit"]["calls"] > 0
    rows = {r["key"]: r for r in smoke["rows"]}
    for key in ("gloo.memo.requests", "gloo.world_1d.requests", "gloo.hit.requests"):
        assert rows[key]["fmesh"] == 0, rows[key]


def test_gloo_creating_calls_agree_in_a_handful_of_requests(smoke: dict[str, Any]) -> None:
    # 3 requests per rank and call (the record's compare_set, the closing round's add,
    # and its wait or, on the last rank in, its set), and the previous call's two keys
    # removed by one rank; never more than 5. A call that ended well leaves its stream's
    # record and its own count and ``ok`` to the stream's next creating call: every
    # phase ends with at most those three.
    for rank in _gloo_ranks(smoke, "fmesh", counted=True):
        new = rank["new"]
        assert new["agreements"] >= 1, new  # the 5-d mesh creates groups
        assert 1 <= new["agree_max"] <= 5, new
        assert new["agree"] <= 5 * new["agreements"], new
    for counted in (True, False):
        for rank in _gloo_ranks(smoke, "fmesh", counted):
            for phase in ("world_1d", "new", "memo", "hit"):
                assert rank[phase]["agree_left"] <= 3, (phase, rank)
    for rank in _gloo_ranks(smoke, "torch", counted=True):
        assert rank["new"]["agree"] == 0  # torch never touches fmesh's keys
    rows = {r["key"]: r for r in smoke["rows"]}
    assert 3 <= rows["gloo.trainer5.agree"]["fmesh"] <= 5
    # The liveness watch of a creating call: the port's address once per process, its
    # successor's address read once, two reads per interval of a wait longer than one
    # (1 s).
    assert 0 <= rows["gloo.trainer5.watch"]["fmesh"] <= 10
    assert rows["gloo.agree.keys_left"]["fmesh"] == 3
    # Creating groups on real gloo leaves rendezvous keys (torch makes 8 groups).
    assert rows["gloo.trainer5.keys"]["torch"] > 0


def test_store_load_runs_fmesh_and_torch_side_by_side(smoke: dict[str, Any]) -> None:
    # 16 simulated ranks in groups of 8, each its own client of one real TCPStore.
    (size,) = smoke["raw"]["store.call"].values()
    ((fm,),) = size["runs"]["fmesh"]
    ((th,),) = size["runs"]["torch"]
    # gloo's rendezvous of an 8-rank group: a set, then a wait and a get (2 requests on
    # the wire) for each member, itself included: 1 + 3 * 8 per rank.
    assert th["requests"] == 25
    # NCCL's unique id: group rank 0 sets it, the 7 others get it (2 requests each).
    assert th["nccl"] == (1 + 7 * 2) / 8
    # torch's opt-in new_group barrier: add, add, wait, and a set by the last rank(s).
    assert 3 <= th["per_barrier"] <= 4
    assert th["barrier"] == th["per_barrier"] * 16 / 8
    # fmesh's own part is 3 per rank (each call here is its stream's first and last, so
    # no later call removes its keys; the bound is 4), and its call costs the
    # rendezvous (through its sliced store) plus its own part.
    assert 3 <= fm["own"] <= 4
    assert fm["requests"] >= fm["own"] + 8
    # Both leave gloo's 16 address keys (one per rank) and nothing else.
    assert fm["keys_left"] == th["keys_left"] == 16
    # The victim's process was SIGKILLed while every rank waited in its creation: every
    # survivor raised PeerLostError naming it, well within 30 s.
    assert fm["survivors"] == fm["peer_lost"] == 15, fm
    assert fm["early"] == 0, fm
    assert 0 < fm["find_s"] < 30, fm
    assert fm["watch_rank"] > 0 and fm["watch_cpu"] > 0
    rows = {(r["key"], r["ranks"]): r for r in smoke["rows"] if r["key"].startswith("store.")}
    for key in STORE_EXTRAPOLATED:
        for n in EXTRAPOLATED:
            assert rows[key, n]["note"].startswith("extrapolated ("), rows[key, n]


def test_markdown_table_has_one_line_per_row(smoke: dict[str, Any]) -> None:
    md = smoke["_markdown"]
    assert md in smoke["_stdout"]
    lines = md.splitlines()
    assert smoke["machine"]["torch"] in lines[0]  # caption: machine and torch
    assert "python -m bench --smoke" in lines[0]
    header = "| section | benchmark | ranks | fmesh | torch | torch/fmesh | note |"
    body = lines[lines.index(header) + 2 :]
    assert len([line for line in body if line.startswith("| ")]) == len(smoke["rows"])


def test_committed_results_cover_the_current_benchmarks(
    smoke: dict[str, Any], committed: dict[str, Any]
) -> None:
    # A benchmark added or renamed since the last full run shows up here.
    have = {r["key"] for r in committed["rows"]}
    want = {r["key"] for r in smoke["rows"]}
    assert want - have == set(), "regenerate with `python -m bench`"
    assert have - want == set(), "regenerate with `python -m bench`"


def test_benchmark_page_and_results_md_are_what_the_committed_results_render() -> None:
    proc = _bench("--check")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_benchmark_page_rows_are_rows_of_the_full_table() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    block = page[page.index("<!-- bench:begin -->") : page.index("<!-- bench:end -->")]
    rows = [ln for ln in block.splitlines() if ln.startswith("| ")]
    full = (BENCH / "results.md").read_text().splitlines()
    assert len(rows) > 10
    assert [row for row in rows if row not in full] == []


def test_titan_rows_check_that_both_libraries_built_the_same_meshes(
    smoke: dict[str, Any],
) -> None:
    from bench.runners import same_meshes
    from bench.shared import world_str

    for backend in ("fake", "partial_dtensor", "gloo"):
        for size in smoke["raw"][f"titan.{backend}"].values():
            assert same_meshes(size["runs"]) is True, size
    rows = {(r["key"], r["ranks"]): r for r in smoke["rows"] if r["key"].startswith("titan.")}
    for (key, _), row in rows.items():
        if key.endswith((".new_group", ".groups")):
            assert row["torch"] > 0, row  # torch's recipe makes groups on every rank
    for backend in ("fake", "partial_dtensor"):  # the drop-in's growth, torch's beside it
        for growth, read in (("growth", "seconds"), ("cpu_growth", "cpu")):
            grew = rows[f"titan.{backend}.{growth}", 2**6]
            lo, hi = (rows[f"titan.{backend}.{read}", n] for n in (2**4, 2**6))
            assert math.isclose(grew["fmesh"], hi["fmesh"] / lo["fmesh"]), grew
            assert math.isclose(grew["torch"], hi["torch"] / lo["torch"]), grew
        # Each size in several fresh processes, torch's beside fmesh's in the same run.
        for n in (2**4, 2**6):
            runs = smoke["raw"][f"titan.{backend}"][world_str(n)]["runs"]
            assert len(runs["fmesh"]) == len(runs["torch"]) == 2, runs
            # The CPU row is the least of the processes (noise only adds time).
            for impl in ("fmesh", "torch"):
                least = min(job[0]["cpu"] for job in runs[impl])
                assert math.isclose(rows[f"titan.{backend}.cpu", n][impl], least), runs


_TITAN_SCRIPT = """
import json, sys
import torch.distributed as dist
import fmesh
from bench import titan, torch_ref, work
out = {}
for spmd in ("spmd_types", "partial_dtensor"):
    for impl in ("torch", "fmesh"):
        torch_ref.init_fake(64)
        with torch_ref.counting_group_creation() as counts:
            meshes = titan.build_mesh(work.init_device_mesh_of(impl), 64, spmd)
        out[f"{spmd}/{impl}"] = {"meshes": titan.describe(meshes), "counts": dict(counts)}
        del meshes
        fmesh.destroy()
        dist.destroy_process_group()
json.dump(out, sys.stdout)
"""


def test_titan_recipe_builds_the_same_meshes_with_torch_and_fmesh() -> None:
    # torchtitan's build_mesh (examples/parallel_dims.py) as the bench runs it, on a
    # 64-rank fake world, with either spmd backend: torch's init_device_mesh and fmesh's
    # give the same ranks, local ranks and groups.
    proc = subprocess.run(
        [sys.executable, "-c", _TITAN_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    for spmd, dp in (("spmd_types", "dp"), ("partial_dtensor", "fsdp")):
        torch_side = out[f"{spmd}/torch"]["meshes"]
        assert set(torch_side) >= {"world", "dataloading", "loss", dp, "efsdp"}
        assert out[f"{spmd}/fmesh"]["meshes"] == torch_side
        # pp=2 x batch=8 x cp=2 x tp=2: loss = batch x cp, 16 ranks at stride tp.
        assert torch_side["loss"]["mesh"] == list(range(0, 32, 2))
        assert out[f"{spmd}/torch"]["counts"]["new_group"] > 0
        assert out[f"{spmd}/fmesh"]["counts"]["new_group"] == 0


def test_titan_configs_are_valid_parallel_dims() -> None:
    from bench import titan
    from bench.cases import CASES

    for world in titan.CONFIGS:
        d = titan.dims(world)  # ParallelDims.resolve checks them as torchtitan does
        assert d.pp * d.dp_replicate * d.dp_shard * d.cp * d.tp == world
    for case in CASES:
        if case.name == "titan":
            for sizes in case.sizes.values():
                assert set(sizes) <= set(titan.CONFIGS), (case.section, sizes)


def test_a_section_run_merges_into_the_committed_results() -> None:
    from bench.cli import merge

    def row(key: str, section: str) -> dict[str, Any]:
        return {"key": key, "section": section}

    machine = {"command": "python -m bench", "date": "2026-01-01T00:00:00+00:00"}
    committed = {
        "machine": machine,
        "rows": [row("a", "A"), row("t.1", "T"), row("t.2", "T"), row("z", "Z")],
        "raw": {"a": 1, "titan": {"old": True}},
        "errors": [],
    }
    run = {
        "command": "python -m bench --section titan",
        "date": "2026-02-01T00:00:00+00:00",
        "seconds": 9.0,
        "loadavg_start": [1.0],
        "loadavg_end": [2.0],
        "torch": "2.13",
        "fmesh": "0.3",
    }
    part = {
        "machine": run,
        "rows": [row("t.1", "T"), row("t.3", "T")],
        "raw": {"titan": {"new": True}},
        "errors": [],
    }
    merged = merge(committed, part)
    assert [r["key"] for r in merged["rows"]] == ["a", "t.1", "t.3", "z"]
    assert merged["raw"] == {"a": 1, "titan": {"new": True}}
    assert merged["machine"]["command"] == "python -m bench"
    assert [r["date"] for r in merged["machine"]["merged"]] == [run["date"]]
    again = merge(merged, part)  # the same section again replaces its note
    assert len(again["machine"]["merged"]) == 1
    new = merge(committed, {**part, "rows": [row("n", "N")]})
    assert [r["key"] for r in new["rows"]] == ["a", "t.1", "t.2", "z", "n"]
