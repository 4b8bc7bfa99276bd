"""``fmesh plan`` sees every group a rank's code makes, and says "agree" only where a
launch would: fmesh's realize calls with the backends and options they ask for,
torch's own ``new_group``/``split_group``, a DeviceMesh torch builds from a tensor or
(on a plain launch, ``--launch torch``) through an ``init_device_mesh`` a registry
captured at import, real backends played by the fake one, and the variables torchrun
sets.

Every planted divergence is in ``tests/plan_targets.py``; the CLI runs as a
subprocess. Where a divergence shows in fmesh's agreement, a real 4-rank gloo launch of
the same code (routed through fmesh's drop-in, as the plan routes it) checks that the
launch fails exactly where the plan says so; ``tests/test_plan_launch.py`` launches
issue 42's cases with torchrun, plain and routed.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _dist import run_cli, run_spawn

import fmesh
from fmesh._plan.compare import first_divergence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import plan_targets  # noqa: E402  # tests/, put on the path above

TARGETS = "tests/plan_targets.py"


def verdict(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout.rstrip().splitlines()[-1]


# -- planted divergences: exit 1, both ranks and both calls named -------------------------


@pytest.mark.parametrize(
    ("target", "calls"),
    [
        (
            "gloo_override_on_one_rank",
            (
                "rank 0 realizes Mesh(a=2, b=4) on cpu:gloo,cuda:nccl",
                "rank 1 realizes Mesh(a=2, b=4) with backends {'a': 'gloo', 'b': "
                "'cpu:gloo,cuda:nccl'}",
            ),
        ),
        (
            # A plain launch: torch's init_device_mesh, captured at import, is torch's.
            "factory_mesh_on_one_rank --launch torch",
            (
                "rank 0 calls torch's DeviceMesh making the groups of dim 'dp' itself: 8 "
                "new_group calls, groups of 1 rank",
                "rank 1 calls torch's DeviceMesh making the groups of dim 'dp' itself: 4 "
                "new_group calls, groups of 2 ranks",
            ),
        ),
        (
            "tensor_mesh_on_one_rank",
            (
                "rank 0 calls torch's DeviceMesh making the groups of dim 'dp' itself: 8 "
                "new_group calls",
                "rank 1 calls torch's DeviceMesh making the groups of dim 'dp' itself: 4 "
                "new_group calls",
            ),
        ),
        (
            "new_group_on_one_rank",
            (
                "rank 0 calls torch's new_group([0, 1])",
                "rank 1 calls torch's new_group([0, 1, 2])",
            ),
        ),
        (
            "local_group_after_another",
            (
                "rank 0 calls torch's new_group([0, 1], use_local_synchronization=True) "
                "holding 2 groups",
                "rank 1 calls torch's new_group([0, 1], use_local_synchronization=True) "
                "holding 1 group ",
            ),
        ),
    ],
)
def test_a_planted_divergence_exits_1_naming_both_ranks_and_calls(
    target: str, calls: tuple[str, str]
) -> None:
    target, *launch = target.split()
    result = run_cli("plan", "--world", "8", "--rank", "0,1,2", f"{TARGETS}:{target}", *launch)
    assert result.returncode == 1, result.stdout + result.stderr
    last = verdict(result)
    assert last.startswith("cross-rank check FAILED: ranks 0 and 1 disagree at "), last
    for words in calls:
        assert words in last, (words, last)


def test_a_memo_hit_where_another_rank_creates_is_named() -> None:
    report = fmesh.plan(plan_targets.hit_where_others_create, world=8, ranks=[0, 1])
    d = report.divergence
    assert d is not None and d.ranks == (0, 1) and d.calls[1] is None
    assert d.message.startswith(
        "rank 1 makes only 1 creating realize calls (after them it makes 1 memoized "
        "realize call (Mesh(dp=2, tp=4) on cpu:gloo,cuda:nccl), which create nothing"
    )
    assert "at realize call #2 rank 0 realizes Mesh(x=4, y=2) on cpu:gloo,cuda:nccl" in (
        d.message
    )
    assert report.rank(1).tail.startswith("1 memoized realize call (Mesh(dp=2, tp=4)")


def test_two_ranks_that_differ_only_in_a_local_group_are_found_pairwise() -> None:
    def local(n: int, code: int, *members: int) -> fmesh.PlannedCall:
        return fmesh.PlannedCall(
            n, code, f"torch's new_group({list(members)})", "", "new_group", members
        )

    world = fmesh.PlannedCall(1, 7, "Mesh(a=8) on nccl", "")
    plans = [
        fmesh.RankPlan(0, (), (world, local(1, 1, 0, 1)), 0, 0, 0, 0.0, None, None),
        fmesh.RankPlan(1, (), (world, local(1, 1, 0, 1)), 0, 0, 0, 0.0, None, None),
        fmesh.RankPlan(2, (), (world, local(1, 2, 2, 3)), 0, 0, 0, 0.0, None, None),
        fmesh.RankPlan(3, (), (world, local(1, 3, 2, 3)), 0, 0, 0, 0.0, None, None),
    ]
    d = first_divergence(plans)
    assert d is not None and (d.ranks, d.number) == ((2, 3), 2)
    assert first_divergence(plans[:3]) is None  # rank 2's pair partner not planned


# -- agreeing code still agrees, real backends included ------------------------------------


@pytest.mark.parametrize(
    "target",
    [
        "nccl_override_on_every_rank",
        "real_backends_everywhere",
        "factory_mesh",
        "torch_groups",
    ],
)
def test_agreeing_code_with_real_backends_and_torch_groups_exits_0(target: str) -> None:
    result = run_cli("plan", "--world", "8", "--rank", "0,1,5,7", f"{TARGETS}:{target}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert verdict(result).startswith("cross-rank check: the 4 planned ranks make the same")
    assert "Traceback" not in result.stderr


def test_groups_fmesh_did_not_make_are_named_with_what_was_asked() -> None:
    report = fmesh.plan(plan_targets.real_backends_everywhere, world=8, ranks=[0, 5])
    assert report.ok, report.divergence
    p = report.rank(5)
    assert [c.kind for c in p.calls] == [
        "init_process_group",
        "realize",
        "realize",
        "new_group",
    ]
    init, mesh, realize, group = p.calls
    assert init.summary == "torch's init_process_group('cpu:gloo,cuda:nccl')"
    # The backends asked for, not the fake one that played them.
    assert (
        mesh.summary == "Mesh(a=2, b=4) with backends {'a': 'cpu:gloo,cuda:nccl', 'b': 'gloo'}"
    )
    assert realize.summary == "Mesh(x=4, y=2) on nccl"
    assert group.summary == "torch's new_group([0, 1, 2, 3], backend='gloo')"
    assert group.held is None  # rank 5 is not in it
    assert report.rank(0).calls[-1].held == (0, 1, 2, 3)
    torch = fmesh.plan(plan_targets.torch_groups, world=8, ranks=[2, 3])
    assert torch.ok, torch.divergence
    kinds = [(c.kind, c.members) for c in torch.rank(3).calls]
    assert kinds == [
        ("init_process_group", None),  # a device bound: split_group needs one
        ("new_group", None),
        *[("new_group", None)] * 4,  # new_subgroups(2): one call per subgroup
        ("split_group", None),
        ("new_group", (2, 3)),  # local: its members make it
    ]
    assert torch.rank(3).calls[6].summary == (
        "torch's split_group([[0, 1, 2, 3], [4, 5, 6, 7]] (2 splits))"
    )
    assert torch.rank(3).calls[6].held == (0, 1, 2, 3)
    text = run_cli("plan", "--world", "8", "--rank", "3", f"{TARGETS}:torch_groups").stdout
    assert "groups fmesh did not make (torch's own calls; compared across ranks too):" in text
    assert "split_group #7: torch's split_group(" in text
    assert "rank 3's group [2, 3]" in text


def test_a_returned_device_mesh_torch_built_is_listed_with_its_groups_outside() -> None:
    # -m fmesh.route routes the copy a registry captured at import: fmesh's mesh.
    routed = fmesh.plan(plan_targets.factory_mesh, world=16, ranks=[9])
    (mesh,) = routed.rank(9).meshes
    assert (mesh.name, mesh.outside, [c.kind for c in routed.rank(9).calls]) == (
        "mesh",
        False,
        ["realize"],
    )
    # On a plain launch it is torch's own.
    report = fmesh.plan(plan_targets.factory_mesh, world=16, ranks=[9], launch="torch")
    (mesh,) = report.rank(9).meshes
    assert (mesh.name, mesh.outside, mesh.coordinate, mesh.groups) == (
        "mesh",
        True,
        (1, 1),
        (),
    )
    dims = [c.summary.split(":")[0] for c in report.rank(9).calls]
    assert dims == [
        f"torch's DeviceMesh making the groups of dim {d!r} itself" for d in ["dp", "tp"]
    ]
    assert [c.held for c in report.rank(9).calls] == [(1, 9), (8, 9, 10, 11, 12, 13, 14, 15)]


def test_also_returned_only_for_meshes_that_were_returned() -> None:
    result = run_cli("plan", "--world", "8", "--rank", "0", f"{TARGETS}:views_returning_none")
    assert result.returncode == 0, result.stderr
    assert "also returned" not in result.stdout
    assert "  also realized, over the groups above: tp = dp,tp.tp" in result.stdout


# -- the plan agrees exactly where a launch agrees -------------------------------------------


def launch(rank: int, world: int, target: str) -> str:
    """``target`` as a launch runs it, routed through fmesh's drop-in as the plan
    routes it."""
    import fmesh.device_mesh

    plan_targets.route(fmesh.device_mesh.init_device_mesh)
    return str(getattr(plan_targets, target)())


@pytest.mark.parametrize(
    ("target", "agrees"),
    [("gloo_override_on_one_rank", True), ("cpu_gloo_override_on_one_rank", False)],
)
def test_a_rank_dependent_override_diverges_where_a_gloo_launch_does(
    tmp_path: Path, target: str, agrees: bool
) -> None:
    # The launch's default group is gloo: an override naming gloo changes nothing,
    # one naming cpu:gloo is another backend in fmesh's agreement.
    report = fmesh.plan(getattr(plan_targets, target), world=4, ranks=range(4), backend="gloo")
    job = run_spawn(launch, 4, target, tmp_path=tmp_path, timeout=120)
    assert report.ok == agrees, report.divergence
    if agrees:
        job.values()
        return
    assert report.divergence is not None and report.divergence.ranks == (0, 1)
    for o in job.outcomes:
        assert o.error == "MeshMismatchError", job.describe()
        assert "rank 1 realizes Mesh(a=2, b=2) with backends {'a': 'cpu:gloo'" in o.message


# -- what a rank sees: torchrun's variables ------------------------------------------------


def _torchrun_variables() -> set[str]:
    """The variables torch's elastic agent sets for every worker, read from its
    source (``LocalElasticAgent._start_workers``) in the installed torch."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    source = inspect.getsource(LocalElasticAgent._start_workers)
    found = set(re.findall(r'"([A-Z][A-Z0-9_]+)":', source))
    assert {"RANK", "MASTER_ADDR", "TORCHELASTIC_RUN_ID"} <= found, found
    # Set elsewhere: LOCAL_RANK (_set_local_rank_env), the error file (the
    # multiprocessing context).
    return found | {"LOCAL_RANK", "TORCHELASTIC_ERROR_FILE"}


def test_every_variable_torchrun_sets_is_set_and_restored_after() -> None:
    before, hook = dict(os.environ), sys.excepthook
    plan_targets.ENVIRONMENT.clear()
    fmesh.plan(plan_targets.environment, world=32, ranks=[13, 14])
    assert dict(os.environ) == before
    # torch's init_process_group prefixes the excepthook with the rank: once a launch,
    # and not once per planned rank.
    assert sys.excepthook is hook
    seen = plan_targets.ENVIRONMENT[0]
    missing = _torchrun_variables() - set(seen)
    assert not missing, missing
    assert {k: seen[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == {
        "RANK": "13",
        "LOCAL_RANK": "5",
        "WORLD_SIZE": "32",
        "LOCAL_WORLD_SIZE": "8",
    }
    assert (seen["GROUP_RANK"], seen["GROUP_WORLD_SIZE"], seen["ROLE_RANK"]) == (
        "1",
        "4",
        "13",
    )
    assert (seen["MASTER_ADDR"], seen["MASTER_PORT"]) == ("127.0.0.1", "29500")
    assert seen["TORCHELASTIC_ERROR_FILE"].endswith("error.json")


# -- --rank all, and what a sample misses ----------------------------------------------------


def test_rank_all_finds_a_lone_rank_a_sample_misses() -> None:
    target = f"{TARGETS}:lone_rank_diverges"
    sampled = run_cli("plan", "--world", "8", "--rank", "sample:5", target)
    assert sampled.returncode == 0, sampled.stdout  # ranks 0, 7, 6, 1, 3: not 5
    every = run_cli("plan", "--world", "8", "--rank", "all", target)
    assert every.returncode == 1, every.stdout
    assert verdict(every).startswith("cross-rank check FAILED: ranks 0 and 5 disagree")
    assert every.stdout.startswith(f"fmesh plan {target} predicts a launch under torchrun")
    assert ": 8 of 8 ranks" in every.stdout.splitlines()[0]


def test_rank_all_refuses_a_world_beyond_its_limit() -> None:
    result = run_cli(
        "plan", "--world", "2**13", "--rank", "all", f"{TARGETS}:lone_rank_diverges"
    )
    assert result.returncode == 2
    assert "--rank all plans each of the 8192 ranks in turn; it takes worlds up to 4096" in (
        result.stderr
    )


def test_many_ranks_print_one_line_each_past_the_first_eight() -> None:
    result = run_cli("plan", "--world", "32", "--rank", "all", f"{TARGETS}:fmesh_trainer")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert (
        "... the other 24 planned ranks, one line each (their meshes and groups: --json)"
        in lines
    )
    assert sum(line.startswith("rank ") for line in lines) == 32
    assert sum("group of rank" in line for line in lines) == 8  # table headers


# -- the command line a newcomer meets -------------------------------------------------------


def test_help_says_what_plan_does_for_a_trainer() -> None:
    text = " ".join(run_cli("--help").stdout.split())
    assert "dry-run realize for one rank" not in text
    assert "or run a trainer's own mesh code for chosen ranks and compare them" in text


def test_a_missing_function_lists_only_the_modules_own_functions() -> None:
    result = run_cli("plan", "--world", "8", f"{TARGETS}:nosuchfn")
    assert result.returncode == 2
    (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("fmesh: error")]
    listed = line.split("its functions: ")[1].split(", ")
    assert "fmesh_trainer" in listed and "raises" in listed
    # Imported names are not candidates: torch's init_device_mesh, fmesh, Any.
    assert not {"init_device_mesh", "fmesh", "dist", "Any"} & set(listed), listed


def test_a_flag_of_plan_given_to_describe_says_it_is_plans() -> None:
    result = run_cli("describe", "dp=4", "--world", "8")
    assert result.returncode == 2
    assert (
        "fmesh: error: unrecognized argument --world; --world is an option of 'fmesh plan' "
        "(fmesh plan --world N ...), not of 'fmesh describe'"
    ) in result.stderr
