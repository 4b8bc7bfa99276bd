"""``fmesh plan --launch torch|route`` predicts the launch it names (issue 42).

Each target of issue 42 (``tests/plan_targets.py``) runs for real on 4 gloo ranks, in
two launches of ``tests/plan_launch.py``, one target after the other: plain
``torchrun`` and ``torchrun -m fmesh.route``, side by side. Each target is planned
for both launches too, and the plan's verdict (``finished``, the error it raises, or
``hang``) must be the launch's outcome, target by target. A hang is told by a bounded
wait: the launch's ranks stop writing progress for ``GRACE_S`` seconds while the job
still runs (group creation and the checking collectives take well under a second
each), and the job is killed.

Where plain torch runs to completion the routed launch runs too, with the same meshes,
groups, local ranks and collectives over them (item 1 of the issue).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _dist import kill_tree, run_cli, run_spawn

import fmesh

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import plan_targets  # noqa: E402  # tests/, put on the path above

WORLD = 4
GRACE_S = 20.0
"""A launch whose ranks all write nothing for this long is hung (killed)."""
LAUNCH_TIMEOUT_S = 300.0
"""No launch runs longer (torch imports included, on a loaded machine)."""
TARGETS = (
    "world_mesh_first_on_one_rank",
    "factory_world_mesh_first_on_one_rank",
    "dim_names_reordered_on_one_rank",
    "unnamed_on_one_rank",
    "unflatten_other_names_on_one_rank",
    "fmesh_timeout_on_every_rank",
    "split_group_on_every_rank",
    "gloo_override_on_one_rank",
    "cpu_gloo_override_on_one_rank",
    "same_mesh_twice_on_one_rank",  # last: it hangs the plain launch
)
LAUNCHES = ("torch", "route")


def _torch_takes_timeout() -> bool:
    from torch.distributed.device_mesh import init_device_mesh

    return "timeout" in inspect.signature(init_device_mesh).parameters


def _split() -> str:
    """A CPU launch's ``split_group``: torch 2.11 to 2.14 need a bound device."""
    from fmesh._compat import torch_version

    return "finished" if torch_version() >= (2, 15) else "RuntimeError"


EXPECTED = {
    "torch": {
        "world_mesh_first_on_one_rank": "finished",
        "factory_world_mesh_first_on_one_rank": "finished",
        "dim_names_reordered_on_one_rank": "finished",
        "unnamed_on_one_rank": "finished",
        "unflatten_other_names_on_one_rank": "finished",
        "fmesh_timeout_on_every_rank": "finished" if _torch_takes_timeout() else "TypeError",
        "split_group_on_every_rank": _split(),
        "gloo_override_on_one_rank": "finished",
        "cpu_gloo_override_on_one_rank": "finished",  # torch's gloo groups meet
        "same_mesh_twice_on_one_rank": "hang",
    },
    "route": {
        **dict.fromkeys(TARGETS, "finished"),
        "split_group_on_every_rank": _split(),
        "cpu_gloo_override_on_one_rank": "MeshMismatchError",  # backends as named
    },
}
"""What each launch does on a CPU machine (the torch of this run): the verdicts the
plan must give; both launches also agree with the plan target by target."""


class Launch:
    """One torchrun job of ``tests/plan_launch.py`` over ``TARGETS``, running."""

    def __init__(self, launch: str, folder: Path) -> None:
        folder.mkdir(parents=True)
        self.launch, self.folder = launch, folder
        route = ["-m", "fmesh.route"] if launch == "route" else []
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--standalone", "--nproc-per-node", str(WORLD),
            *route, "tests/plan_launch.py", str(folder), ",".join(TARGETS),
        ]  # fmt: skip
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", GLOO_SOCKET_IFNAME="lo")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        self.stderr_path = folder / "stderr.txt"
        with open(folder / "stdout.txt", "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, stdout=out, stderr=err, env=env, start_new_session=True
            )
        self.start = time.monotonic()
        self.hung = False
        self.seconds = 0.0

    def events(self) -> list[list[dict[str, Any]]]:
        """Each rank's lines so far."""
        out = []
        for rank in range(WORLD):
            path = self.folder / f"rank{rank}.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            out.append([json.loads(line) for line in lines if line.endswith("}")])
        return out

    def poll(self, seen: dict[str, float]) -> bool:
        """Whether the job is over: it exited, or stalled past ``GRACE_S`` (killed)."""
        now = time.monotonic()
        if self.proc.poll() is not None:
            self.seconds = now - self.start
            return True
        count = sum(len(e) for e in self.events())
        if count and seen.get(f"{self.launch}/count") != count:
            seen[f"{self.launch}/count"], seen[self.launch] = count, now
        stalled = self.launch in seen and now - seen[self.launch] > GRACE_S
        if stalled or now - self.start > LAUNCH_TIMEOUT_S:
            self.hung = True
            kill_tree(self.proc.pid)
            self.proc.wait()
            self.seconds = now - self.start
            return True
        return False

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def outcome(self, target: str) -> str:
        """``finished``, the error every rank raised, or ``hang`` (a rank never
        returned from the target: the job stalled there)."""
        last: list[dict[str, Any] | None] = []
        for rank_events in self.events():
            mine = [e for e in rank_events if e.get("target") == target]
            last.append(mine[-1] if mine else None)
        if any(e is None or e["event"] in ("start", "returned") for e in last):
            assert self.hung, (target, last, self.stderr[-3000:])
            return "hang"
        kinds = {e["error"] if e["event"] == "raised" else "finished" for e in last if e}
        assert len(kinds) == 1, (target, last)
        return kinds.pop()

    def meshes(self, target: str) -> list[dict[str, Any]]:
        """What each rank's target built (it finished)."""
        return [
            next(e for e in r if e.get("target") == target and e["event"] == "finished")[
                "meshes"
            ]
            for r in self.events()
        ]


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Launch]:
    """Both launches, side by side (their ranks mostly wait: one hangs by design)."""
    folder = tmp_path_factory.mktemp("plan-launch")
    jobs = {launch: Launch(launch, folder / launch) for launch in LAUNCHES}
    seen: dict[str, float] = {}
    running = set(LAUNCHES)
    while running:
        running = {launch for launch in running if not jobs[launch].poll(seen)}
        time.sleep(0.25)
    return jobs


def planned(target: str, launch: str) -> str:
    """The plan's verdict for ``target`` under ``launch``: ``finished``, ``hang`` or
    ``MeshMismatchError`` (its report), or the error the planned function raised."""
    try:
        report = fmesh.plan(
            getattr(plan_targets, target),
            world=WORLD,
            ranks=range(WORLD),
            backend="gloo",  # the launch's own init_process_group("gloo")
            launch=launch,
        )
    except Exception as err:
        return type(err).__name__
    return report.outcome


@pytest.mark.parametrize("launch", LAUNCHES)
def test_the_plan_of_each_target_ends_as_the_launch_it_names(
    launches: dict[str, Launch], launch: str
) -> None:
    job = launches[launch]
    verdicts = {t: (planned(t, launch), job.outcome(t)) for t in TARGETS}
    assert {t: v for t, v in verdicts.items() if v[0] != v[1]} == {}, job.stderr[-3000:]
    assert {t: v for t, (v, _) in verdicts.items()} == EXPECTED[launch]
    # Bounded: the plain launch is killed GRACE_S after it stalls, not at torch's
    # 30-minute timeout.
    assert job.hung == (launch == "torch")
    assert job.seconds < LAUNCH_TIMEOUT_S


def test_routed_meshes_are_torchs_wherever_torch_runs(launches: dict[str, Launch]) -> None:
    finished = [
        t
        for t in TARGETS
        if launches["torch"].outcome(t) == launches["route"].outcome(t) == "finished"
    ]
    assert len(finished) >= 6
    for target in finished:
        plain, routed = launches["torch"].meshes(target), launches["route"].meshes(target)
        # Every rank: the same meshes, names, coordinates, local ranks, group members,
        # and the all_reduce over every group summed the same ranks.
        assert routed == plain, target
    # Not vacuous: rank 1 kept its own names for the same groups.
    rank1 = launches["route"].meshes("dim_names_reordered_on_one_rank")[1]["mesh"]
    assert rank1["names"] == ["tp", "dp"] and rank1["groups"] == [[1, 3], [0, 1]]


def _warned(stderr: str, rank: int, first: tuple[str, str], second: tuple[str, str]) -> bool:
    """A line of ``stderr`` names ``rank``, another rank and both orders of names."""
    pattern = [
        re.compile(r"\b" + r"\W+".join(map(re.escape, n)) + r"\b") for n in (first, second)
    ]
    for line in stderr.splitlines():
        others = set(re.findall(r"\brank (\d+)", line)) - {str(rank)}
        if f"rank {rank}" in line and others and all(p.search(line) for p in pattern):
            return True
    return False


def test_routed_dim_names_that_differ_are_a_warning_naming_both_ranks_and_names(
    launches: dict[str, Launch],
) -> None:
    stderr = launches["route"].stderr
    assert _warned(stderr, 1, ("tp", "dp"), ("dp", "tp")), stderr[-3000:]
    assert _warned(stderr, 1, ("x", "y"), ("dp", "tp")), stderr[-3000:]


def test_the_report_says_which_launch_it_predicts() -> None:
    target = "tests/plan_targets.py:same_mesh_twice_on_one_rank"
    args = ("plan", "--world", "4", "--rank", "all", "--backend", "gloo", target)
    routed, plain = run_cli(*args), run_cli(*args, "--launch", "torch")
    assert routed.returncode == 0, routed.stdout + routed.stderr
    assert routed.stdout.startswith(
        f"fmesh plan {target} predicts a launch under torchrun ... -m fmesh.route on torch "
    )
    assert plain.returncode == 1, plain.stdout + plain.stderr
    first, last = plain.stdout.splitlines()[0], plain.stdout.rstrip().splitlines()[-1]
    assert first.startswith(f"fmesh plan {target} predicts a plain torchrun launch on torch ")
    assert last.startswith(
        "cross-rank check FAILED: rank 0 makes only 2 group-creating calls, while at "
        "group-creating call #3 (fmesh's creating realize calls and torch's own group "
        "calls, in order) rank 1 calls torch's DeviceMesh making the groups of dim 'dp' "
        "itself"
    ), last
    assert "torch's group creation on rank 1 waits for rank 0 there until torch's timeout" in (
        last
    )
    # --launch is the report's, for a module:function target only.
    spec = run_cli("plan", "dp=2,tp=2", "--launch", "torch")
    assert spec.returncode == 2 and "plan --launch is for module:function targets" in (
        spec.stderr
    )
    bad = run_cli(*args, "--launch", "slurm")
    assert bad.returncode == 2 and "--launch" in bad.stderr


def test_names_that_differ_over_the_same_groups_are_a_warning_in_the_plan() -> None:
    report = fmesh.plan(
        plan_targets.dim_names_reordered_on_one_rank, world=WORLD, ranks=[0, 1, 2]
    )
    assert report.ok and report.outcome == "finished"
    assert report.warnings == (
        "ranks 0 and 1 name the axes of realize call #1 differently: ('dp', 'tp') and "
        "('tp', 'dp') (the same groups: a launch warns, and each rank's mesh keeps its "
        "own names)",
    )
    # fmesh's own realize stays strict: the names are part of what ranks agree on.
    strict = fmesh.plan(_names_reordered_through_realize, world=WORLD, ranks=[0, 1])
    assert strict.outcome == "MeshMismatchError" and not strict.warnings
    with pytest.raises(ValueError, match="launch must be 'route' or 'torch'"):
        fmesh.plan(plan_targets.fmesh_trainer, world=WORLD, launch="slurm")


def _names_reordered_through_realize() -> None:
    """Rank 1 names the axes of the same groups in the other order, through fmesh."""
    odd = os.environ["RANK"] == "1"
    fmesh.realize(fmesh.make_mesh({"tp": 2, "dp": 2} if odd else {"dp": 2, "tp": 2}))


def test_a_flatten_in_another_order_on_one_rank_runs_on_torch_and_is_refused_routed() -> None:
    # docs/device-mesh.md lists it: torch's sorted groups are the same, the job runs
    # with rank 2's coordinate along the flattened dim not the one the others see.
    target = plan_targets.flatten_reversed_on_one_rank
    plain = fmesh.plan(target, world=8, ranks=range(8), backend="gloo", launch="torch")
    routed = fmesh.plan(target, world=8, ranks=range(8), backend="gloo")
    assert (plain.outcome, routed.outcome) == ("finished", "MeshMismatchError")
    # On plain torch ranks 2 and 4 both hold place 2 of their dp_tp group [0, 2, 4, 6]
    # (rank 2 is at 1 in the others' order): a DTensor sharded along it is wrong.
    flat = {r.rank: r.meshes[1].coordinate for r in plain.ranks}
    assert [flat[r] for r in (0, 2, 4, 6)] == [(0,), (2,), (2,), (3,)]
    assert routed.divergence is not None and routed.divergence.ranks == (0, 2)


def routed_process_job(_: int, __: int) -> dict[str, object]:
    """A process that routed torch itself plans a plain launch: torch's own function
    for the plan, routed again after."""
    from fmesh._compat import swap
    from fmesh.device_mesh import route

    route()
    out: dict[str, object] = {}
    try:
        fmesh.plan(
            plan_targets.fmesh_timeout_on_every_rank, world=4, ranks=[0], launch="torch"
        )
    except TypeError as err:
        out["plain"] = str(err)
    out["routed_after"] = swap.routed()
    out["route"] = fmesh.plan(
        plan_targets.fmesh_timeout_on_every_rank, world=4, ranks=[0]
    ).outcome
    out["still_routed"] = swap.routed()
    return out


def test_a_routed_process_plans_a_plain_launch_with_torchs_own_function(
    tmp_path: Path,
) -> None:
    (out,) = run_spawn(routed_process_job, 1, tmp_path=tmp_path, launch_env=False).values()
    assert out == {
        "plain": "init_device_mesh() got an unexpected keyword argument 'timeout'",
        "routed_after": True,
        "route": "finished",
        "still_routed": True,
    }
