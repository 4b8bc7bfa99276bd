"""``fmesh plan`` and ``fmesh.plan``: a trainer's mesh code run for chosen ranks of a
fake world, what each rank built, and the first call where two ranks diverge.

Expected groups come from fmesh's pure queries on meshes built independently of the
planned code; the CLI runs as a subprocess (exit status, text, ``--json``); that torch
is left as found is checked in a fresh interpreter, where nothing installed fmesh's
hook before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import attrs
import pytest
from _dist import run_cli

import fmesh
from fmesh._plan.compare import first_divergence
from fmesh._plan.render import JSON_MEMBERS, plan_json, plan_text
from fmesh._plan.sample import spread

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "tests"))
import parallel_dims  # noqa: E402  # examples/, put on the path above
import plan_targets  # noqa: E402  # tests/, put on the path above

TITAN = "examples/parallel_dims.py:torchtitan"
BUGGY = "examples/parallel_dims.py:torchtitan_buggy"


def call(n: int, code: int, summary: str = "", history: str = "") -> fmesh.PlannedCall:
    return fmesh.PlannedCall(n, code, summary or f"Mesh(#{code}) on nccl", history)


def rank_plan(rank: int, *calls: fmesh.PlannedCall) -> fmesh.RankPlan:
    return fmesh.RankPlan(rank, (), calls, 0, 0, 0, 0.0, None, None)


# -- the pure report ---------------------------------------------------------------------


def test_ranks_that_make_the_same_calls_agree() -> None:
    plans = [rank_plan(r, call(1, 7), call(2, 8)) for r in (0, 5, 9)]
    assert first_divergence(plans) is None
    assert first_divergence(plans[:1]) is None
    report = fmesh.PlanReport("m:f", 16, tuple(plans), None)
    assert report.ok
    report.check()  # raises nothing
    assert report.rank(5) is plans[1]
    with pytest.raises(KeyError, match=r"rank 3 was not planned; planned: \[0, 5, 9\]"):
        report.rank(3)


def test_the_first_differing_call_is_named_with_both_ranks_and_meshes() -> None:
    plans = [
        rank_plan(0, call(1, 7), call(2, 8, "Mesh(dp=4, tp=2) on nccl")),
        rank_plan(5, call(1, 7), call(2, 8, "Mesh(dp=4, tp=2) on nccl")),
        rank_plan(9, call(1, 7), call(2, 9, "Mesh(dp=2, tp=4) on nccl")),
    ]
    d = first_divergence(plans)
    assert d is not None
    assert (d.number, d.ranks) == (2, (0, 9))
    assert d.message.startswith(
        "ranks 0 and 9 disagree at realize call #2: rank 0 realizes Mesh(dp=4, tp=2) on "
        "nccl, rank 9 realizes Mesh(dp=2, tp=4) on nccl. Every rank must build"
    )
    report = fmesh.PlanReport("m:f", 16, tuple(plans), d)
    assert not report.ok
    with pytest.raises(fmesh.MeshMismatchError, match="ranks 0 and 9 disagree"):
        report.check()


def test_a_different_hit_history_is_named_as_the_agreement_names_it() -> None:
    same = "Mesh(a=2) on nccl"
    plans = [
        rank_plan(0, call(1, 7, same, "")),
        rank_plan(3, call(1, 8, same, "1 memoized realize call (Mesh(b=2) on nccl)")),
    ]
    d = first_divergence(plans)
    assert d is not None
    assert f"both realize {same}, but not after the same calls" in d.message
    assert "rank 0 made none, rank 3 made 1 memoized realize call" in d.message


def test_a_rank_that_makes_fewer_calls_would_leave_the_others_waiting() -> None:
    d = first_divergence([rank_plan(0, call(1, 7), call(2, 8)), rank_plan(7, call(1, 7))])
    assert d is not None
    assert (d.number, d.ranks, d.calls[1]) == (2, (0, 7), None)
    assert d.message.startswith(
        "rank 7 makes only 1 creating realize calls, while at realize call #2 rank 0 "
        "realizes Mesh(#8) on nccl: on a launch rank 0 waits for rank 7 there"
    )
    # The other way round: the first rank is the one that stops early.
    d = first_divergence([rank_plan(0, call(1, 7)), rank_plan(7, call(1, 7), call(2, 8))])
    assert d is not None and d.calls[0] is None
    assert d.message.startswith("rank 0 makes only 1 creating realize calls")


@pytest.mark.parametrize(
    ("mesh", "rank"),
    [
        (fmesh.make_mesh({"pp": 4, "dp": 8, "tp": 16}), 301),
        (fmesh.make_mesh({"dp": 4, "tp": 2}, ranks=[7, 6, 5, 4, 3, 2, 1, 0]), 2),
        # A slice has several instances: rank 13 is in the fourth.
        (fmesh.slice(fmesh.make_mesh({"dp": 4, "tp": 4}), "tp"), 13),
        (fmesh.flatten(fmesh.make_mesh({"a": 3, "b": 5, "c": 7}), ("c", "a")), 52),
    ],
)
def test_group_members_and_head_are_fmesh_group(mesh: fmesh.Mesh, rank: int) -> None:
    coord = fmesh.coordinate(mesh, rank)
    assert coord is not None
    for axis, c in zip(mesh.axis_names, coord, strict=True):
        g = fmesh.GroupPlan(axis, mesh.shape[axis], c, mesh, axis, rank)
        members = fmesh.group(mesh, axis, rank)
        assert g.members() == members
        assert members[g.group_rank] == rank
        want = members if len(members) <= 4 else (*members[:4], members[-1])
        assert g.head() == want


def test_spread_starts_with_the_ends_and_covers_every_coordinate_when_it_fits() -> None:
    mesh = fmesh.make_mesh({"dp": 4, "cp": 2, "tp": 8})
    for count in (1, 2, 5, 10, 64, 100):
        ranks = spread(64, [mesh], count)
        assert len(ranks) == len(set(ranks)) == min(count, 64)
        assert all(0 <= r < 64 for r in ranks)
        assert ranks[: min(count, 2)] == (0, 63)[: min(count, 2)]
    ranks = spread(64, [mesh], 10)  # 2 ends + the largest axis (8)
    coords = [fmesh.coordinate(mesh, r) for r in ranks]
    for i, size in enumerate(mesh.axis_sizes):
        assert {c[i] for c in coords if c is not None} == set(range(size))
    # Cost is O(count), not O(world): a 2**30-rank world is immediate.
    big = fmesh.make_mesh({"pp": 2**10, "dp": 2**20})
    assert len(spread(2**30, [fmesh.make_mesh({"world": 2**30}), big], 16)) == 16


def _report(world: int = 64) -> fmesh.PlanReport:
    mesh = fmesh.make_mesh({"dp": 2, "tp": world // 2})
    groups = tuple(
        fmesh.GroupPlan(a, mesh.shape[a], c, mesh, a, 3)
        for a, c in zip(mesh.axis_names, (0, 3), strict=True)
    )
    plans = tuple(
        fmesh.RankPlan(
            r,
            (fmesh.MeshPlan("dense", mesh.axis_names, mesh.axis_sizes, (0, 3), groups, 2),),
            (call(1, 0xABC, "Mesh(dp=2, tp=32) on fake"),),
            2,
            2,
            2,
            0.01,
            2**20,
            2**19,
        )
        for r in (3,)
    )
    return fmesh.PlanReport("m:f", world, plans, None)


def test_text_and_json_render_every_mesh_and_group() -> None:
    text = plan_text(_report())
    assert text.startswith(
        "fmesh plan m:f predicts a launch under torchrun ... -m fmesh.route on torch "
        "(--launch route: torch's init_device_mesh and DeviceMesh methods routed through "
        "fmesh, captured copies included): 1 of 64 ranks, each on a fresh fake world"
    )
    plain = plan_text(attrs.evolve(_report(), launch="torch", torch_version="2.13.0"))
    assert plain.startswith(
        "fmesh plan m:f predicts a plain torchrun launch on torch 2.13.0 (--launch torch: "
        "torch's own init_device_mesh and DeviceMesh methods): 1 of 64 ranks"
    )
    assert (
        "rank 3: 1 meshes, 1 creating realize calls, 2 groups created by fmesh, 2 held by "
        "its meshes (2 of more than one rank), 0.01 s, peak memory 1.0 MiB (+0.5 MiB "
        "during the call)"
    ) in text
    assert "  dense  dp=2, tp=32  dp       2      0  [3, 35]" in text
    assert "[0, 1, 2, 3, ..., 31]" in text
    assert text.rstrip().endswith(
        "only one rank planned; plan several (--rank sample:K or --rank all) to compare them"
    )
    payload = json.loads(plan_json(_report()))
    assert payload["ok"] is True and payload["divergence"] is None
    assert (payload["launch"], payload["outcome"], payload["warnings"]) == (
        "route",
        "finished",
        [],
    )
    (r,) = payload["ranks"]
    assert r["calls"] == [
        {
            "number": 1,
            "kind": "realize",
            "code": "0000000000000abc",
            "summary": "Mesh(dp=2, tp=32) on fake",
            "history": "",
            "members": None,
            "held": None,
            "names": [],
        }
    ]
    dp, tp = r["meshes"][0]["groups"]
    assert dp["members"] == [3, 35] and tp["members"] == list(range(32))
    big = json.loads(plan_json(_report(4 * JSON_MEMBERS)))
    assert big["ranks"][0]["meshes"][0]["groups"][1]["members"] is None  # too long


# -- the Python API --------------------------------------------------------------------------


def _no_world_left() -> None:
    import torch.distributed as dist

    assert not dist.is_initialized()
    assert "RANK" not in os.environ and "WORLD_SIZE" not in os.environ


def test_plan_an_fmesh_function() -> None:
    report = fmesh.plan(plan_targets.fmesh_trainer, world=16, ranks=[0, 6, 15])
    _no_world_left()
    assert report.ok and report.world == 16
    assert report.target == "plan_targets:fmesh_trainer"
    mesh = fmesh.make_mesh({"dp": 2, "cp": 2, "tp": 4})
    flat = fmesh.slice(fmesh.flatten(mesh, ("dp", "cp"), "dp_cp"), "dp_cp")
    for p in report.ranks:
        assert [m.name for m in p.meshes] == ["mesh", "dp_cp"]
        for m, want in zip(p.meshes, (mesh, flat), strict=True):
            assert m.coordinate == fmesh.coordinate(want, p.rank)
            assert [g.members() for g in m.groups] == [
                fmesh.group(want, a, p.rank) for a in want.axis_names
            ]
        assert p.created == p.held == p.communicators == 4
        assert [c.number for c in p.calls] == [1, 2]
        assert p.seconds > 0
        if sys.platform == "linux":
            assert p.peak_memory is not None and p.peak_memory > 2**20


def test_plan_torchtitans_recipe_gives_fmesh_groups() -> None:
    world = 512
    ranks = [0, 77, 300, 511]
    report = fmesh.plan(parallel_dims.torchtitan, world=world, ranks=ranks)
    _no_world_left()
    assert report.ok, report.divergence
    d = parallel_dims.ParallelDims.resolve(world, **parallel_dims.TITAN_DEGREES)
    root = fmesh.make_mesh({"world": world})

    def unflatten(**sizes: int) -> fmesh.Mesh:
        return fmesh.unflatten(root, "world", sizes)

    batch, efsdp = d.dp_replicate * d.dp_shard, d.dp_shard * d.cp * d.tp // d.ep
    loading = unflatten(pp=d.pp, batch=batch, cp=d.cp, tp=d.tp)
    dense = unflatten(
        pp=d.pp, dp_replicate=d.dp_replicate, dp_shard=d.dp_shard, cp=d.cp, tp=d.tp
    )
    fwdbwd = unflatten(pp=d.pp, dp=batch, cp=d.cp, tp=d.tp)
    sparse = unflatten(pp=d.pp, dp_replicate=d.dp_replicate, efsdp=efsdp, ep=d.ep)
    loss = fmesh.flatten(loading["batch", "cp"], ("batch", "cp"), "loss_mesh")
    # torchtitan's build_mesh at b5bcd76c6 keeps these (spmd_types, ep > 1).
    want = {
        "world": root,
        "dataloading": loading,
        "loss": loss,
        "dense": dense,
        "sparse": sparse,
        "spmd_dense_for_fwdbwd": fwdbwd["dp", "cp", "tp"],
        "spmd_sparse_for_fwdbwd": sparse["dp_replicate", "efsdp", "ep"],
        "pp": loading["pp"],
        "batch": loading["batch"],
        "dp_replicate": dense["dp_replicate"],
        "cp": loading["cp"],
        "tp": loading["tp"],
        "ep": sparse["ep"],
        "efsdp": sparse["efsdp"],
        "dp": fwdbwd["dp"],
        "dp_shard": dense["dp_shard"],
    }
    for p in report.ranks:
        by_name = {n: m for m in p.meshes for n in m.name.split(", ")}
        assert set(want) <= set(by_name), set(want) - set(by_name)
        for name, mesh in want.items():
            got = by_name[name]
            assert got.returned
            assert got.shape == dict(mesh.shape), name
            assert got.coordinate == fmesh.coordinate(mesh, p.rank)
            for g in got.groups:
                assert g.members() == fmesh.group(mesh, g.axis, p.rank), (p.rank, name)
        # The unflattens into the loading view, the loss flatten, the dense storage
        # and the sparse views; the forward/backward view is a memo hit (the loading
        # view's groups). torch makes no group itself.
        summaries = [c.summary for c in p.calls]
        assert [s.split("(")[1].split(",")[0] for s in summaries] == [
            "pp=8",
            "loss_mesh=8",
            "pp=8",
            "pp=8",
        ]
        assert p.torch_calls == ()
    assert [p.rank for p in report.ranks] == ranks


def test_plan_finds_the_planted_divergence() -> None:
    report = fmesh.plan(parallel_dims.torchtitan_buggy, world=512, sample=4)
    _no_world_left()
    assert [p.rank for p in report.ranks][:2] == [0, 511]
    d = report.divergence
    assert d is not None and (d.number, d.ranks) == (1, (0, 511))
    assert d.calls[0] is not None and d.calls[1] is not None
    assert "tp=8" in d.calls[0].summary and "tp=4" in d.calls[1].summary
    with pytest.raises(
        fmesh.MeshMismatchError, match=r"ranks 0 and 511 disagree at realize call #1"
    ):
        report.check()


def test_plan_names_hit_histories_and_missing_calls() -> None:
    hit = fmesh.plan(plan_targets.extra_hit_on_last_rank, world=8, ranks=[0, 7])
    assert hit.divergence is not None and hit.divergence.number == 2
    assert "not after the same calls" in hit.divergence.message
    skip = fmesh.plan(plan_targets.last_rank_skips_a_call, world=8, ranks=[0, 3, 7])
    assert skip.divergence is not None
    assert (skip.divergence.number, skip.divergence.ranks) == (2, (0, 7))
    assert "rank 7 makes only 1 creating realize calls" in skip.divergence.message
    _no_world_left()


def test_plan_passes_on_the_functions_error_and_cleans_up() -> None:
    with pytest.raises(RuntimeError, match="the trainer's own bug") as info:
        fmesh.plan(plan_targets.raises, world=8, ranks=[3])
    assert any("raised on rank 3 of a fake world of 8" in n for n in info.value.__notes__)
    _no_world_left()


def test_plan_refuses_bad_arguments() -> None:
    with pytest.raises(TypeError, match="ranks or sample, not both"):
        fmesh.plan(plan_targets.raises, world=8, ranks=[0], sample=2)
    with pytest.raises(fmesh.MeshError, match=r"world is 0; expected 1\.\."):
        fmesh.plan(plan_targets.raises, world=0)
    with pytest.raises(fmesh.MeshError, match=r"expected one or more ranks in 0\.\.7"):
        fmesh.plan(plan_targets.raises, world=8, ranks=[8])
    with pytest.raises(TypeError, match="sequence of ints"):
        fmesh.plan(plan_targets.raises, world=8, ranks=3)  # type: ignore[arg-type]  # the error under test
    import torch.distributed as dist

    fmesh.init_fake_world(8, 0)
    try:
        with pytest.raises(fmesh.MeshError, match="has a default process group already"):
            fmesh.plan(plan_targets.raises, world=8)
    finally:
        dist.destroy_process_group()


RESTORED = """
import sys
sys.path.insert(0, "tests")
import torch.distributed as dist
import torch.distributed.device_mesh as tdm
from torch.distributed import distributed_c10d as c10d
from torch.distributed.device_mesh import DeviceMesh
import fmesh, fmesh.device_mesh
from fmesh._compat import hook
import plan_targets

def torch_state():
    methods = DeviceMesh.__dict__
    return (tdm.init_device_mesh, dist.init_device_mesh, plan_targets.init_device_mesh,
            methods["__init__"], methods["_init_process_groups"].__func__,
            dist.init_process_group, c10d.init_process_group,
            methods["_init_one_process_group"].__func__, c10d._new_process_group_helper,
            c10d._new_group_with_tag, dist.split_group, c10d.split_group, tdm.split_group)

before = torch_state()
report = fmesh.plan(plan_targets.torch_trainer, world=8, ranks=[0, 5])
after = torch_state()
print("restored", [a is b for a, b in zip(before, after)])
print("hook", hook.installed())
print("routed", [f is fmesh.device_mesh.init_device_mesh for f in plan_targets.SEEN])
print("kept", fmesh.device_mesh.init_device_mesh is not before[0])
p = report.rank(5)
print("mesh", [(m.name, m.sizes, m.coordinate) for m in p.meshes])
print("members", [g.members() for m in p.meshes for g in m.groups])
print("created", p.created, report.ok)
"""


def test_torch_is_routed_for_the_plan_and_restored_after() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RESTORED)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    # torch's functions everywhere (init_process_group too: the planned trainer
    # started its own NCCL group, which the fake world stood in for), DeviceMesh's
    # own methods, and the c10d functions the plan observes group creation in.
    assert lines["restored"] == str([True] * 13)
    assert lines["hook"] == "False"  # fmesh's hook was not installed before: it is gone
    assert lines["routed"] == "[True, True]"  # the module-level import saw the drop-in
    assert lines["kept"] == "True"
    assert lines["mesh"] == (
        "[('mesh', (2, 4), (1, 1)), ('flat', (8,), (5,)), ('tp', (4,), (1,))]"
    )
    assert lines["members"] == "[(1, 5), (4, 5, 6, 7), (0, 1, 2, 3, 4, 5, 6, 7), (4, 5, 6, 7)]"
    assert lines["created"] == "2 True"


# -- the command line -----------------------------------------------------------------------


def test_cli_plans_torchtitan_and_finds_the_planted_bug() -> None:
    good = run_cli("plan", "--world", "512", "--rank", "sample:4", TITAN)
    assert good.returncode == 0, good.stderr
    assert good.stdout.startswith(f"fmesh plan {TITAN} predicts a launch under torchrun")
    assert ": 4 of 512 ranks, each on a fresh fake world" in good.stdout.splitlines()[0]
    assert (
        "cross-rank check: the 4 planned ranks make the same 4 creating realize calls"
        in good.stdout
    )
    assert good.stdout.count("\nrank ") == 4
    bad = run_cli("plan", "--world", "512", "--rank", "sample:4", BUGGY)
    assert bad.returncode == 1, bad.stderr
    verdict = bad.stdout.rstrip().splitlines()[-1]
    # torch's API through fmesh: the world mesh before (a memo hit) is no part of it.
    assert verdict.startswith(
        "cross-rank check FAILED: ranks 0 and 511 disagree at realize call #1: rank 0 "
        "realizes Mesh(pp=8, batch=4, cp=2, tp=8) on cpu:gloo,cuda:nccl, rank 511 "
        "realizes Mesh(pp=8, batch=8, cp=2, tp=4)"
    )


def test_cli_json_is_one_object_with_the_exit_status() -> None:
    good = run_cli("plan", "--world", "512", "--rank", "0,200,511", "--json", TITAN)
    assert good.returncode == 0, good.stderr
    payload: dict[str, Any] = json.loads(good.stdout)
    assert payload["ok"] is True and payload["world"] == 512 and payload["target"] == TITAN
    assert [r["rank"] for r in payload["ranks"]] == [0, 200, 511]
    tp = next(m for m in payload["ranks"][1]["meshes"] if m["name"] == "tp")
    assert tp["groups"][0]["members"] == list(range(200, 208))
    bad = run_cli("plan", "--world", "512", "--rank", "0,511", "--json", BUGGY)
    assert bad.returncode == 1
    divergence = json.loads(bad.stdout)["divergence"]
    assert divergence["ranks"] == [0, 511] and divergence["call"] == 1


def test_cli_function_that_raises_exits_1_with_its_traceback() -> None:
    result = run_cli("plan", "--world", "8", "--rank", "2", "tests/plan_targets.py:raises")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "RuntimeError: the trainer's own bug" in result.stderr
    assert "raised on rank 2 of a fake world of 8" in result.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("plan", TITAN), "needs --world N"),
        (("plan", "--world", "8", "--rank", "sample:0", TITAN), "sample:K needs K >= 1"),
        (
            ("plan", "--world", "8", "--rank", "some:3", TITAN),
            "neither ranks, sample:K nor all",
        ),
        (("plan", "--world", "8", "--rank", "9", TITAN), "not in the world of 8 ranks"),
        (("plan", "--world", "8", "--flatten", "a,b", TITAN), "--flatten is for a mesh spec"),
        (("plan", "--world", "8", "examples/nothing.py:f"), "no file examples/nothing.py"),
        (("plan", "--world", "8", "examples/parallel_dims.py:nope"), "no function 'nope'"),
        (("plan", "--world", "8", "no_such_module_x:f"), "no module 'no_such_module_x'"),
        (("plan", "--json", "dp=2,tp=4"), "plan --json is for module:function"),
        (
            ("describe", "--ranks", "4", "dp=4"),
            "unrecognized argument --ranks; did you mean --rank?",
        ),
        (("plan", "--wrld", "8", "dp=4"), "did you mean --world?"),
    ],
)
def test_cli_bad_arguments_give_one_error_line(args: tuple[str, ...], needle: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2, result.stdout
    assert result.stdout == ""
    lines = [
        ln for ln in result.stderr.splitlines() if ln != "fmesh plan: importing torch ..."
    ]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("fmesh: error: ") and needle in lines[0], lines[0]


def test_cli_plan_of_a_spec_defaults_the_world_to_the_mesh() -> None:
    result = run_cli("plan", "dp=2,tp=4", "--rank", "5")
    assert result.returncode == 0, result.stderr
    assert "rank 5 of an 8-rank world" in result.stdout
    assert "the mesh covers" not in result.stdout  # the whole world


def test_cli_prints_a_progress_line_per_rank_on_a_tty() -> None:
    import pty

    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fmesh",
            "plan",
            "--world",
            "8",
            "--rank",
            "0,3,7",
            "tests/plan_targets.py:fmesh_trainer",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=follower,
        env=env,
    ) as proc:
        os.close(follower)
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            seen += chunk
        assert proc.wait(timeout=120) == 0
    os.close(leader)
    progress = [ln for ln in seen.decode().splitlines() if ln.startswith("[")]
    assert [ln.split(" ", 3)[:3] for ln in progress] == [
        ["[1/3]", "rank", "0:"],
        ["[2/3]", "rank", "3:"],
        ["[3/3]", "rank", "7:"],
    ]
