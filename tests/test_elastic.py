"""Elastic recovery with real processes: a rank is SIGKILLed mid-training, the survivors
see the failed collective, call ``fmesh.recover``, shrink (or patch) the mesh, realize
it and carry on with correct results.

The store is hosted by the launching process, as torchrun's agent hosts it. Each job
trains a few steps of a computation whose result every rank can predict from fmesh's
pure queries: per step, every rank of the mesh contributes ``(rank + 1) * (step + 1)``,
summed over tp and then over dp (and fsdp); the result must be the sum over the rank's
instance. Ranks that the shrunk mesh leaves out are survivors still: they keep making
the same realize and recover calls as non-members (as spares do), waiting between them.
"""

from __future__ import annotations

import datetime
import os
import signal
import time
from pathlib import Path
from typing import Any, cast

from _dist import Job, run_spawn

import fmesh

COLLECTIVE = datetime.timedelta(seconds=3)
"""realize's timeout: the groups' collective timeout, and the agreement's."""
RECOVER = datetime.timedelta(seconds=6)
"""recover's timeout: longer than a collective's, so stuck survivors still arrive."""
STEPS = 6
JOB_TIMEOUT = 120.0


def _store() -> Any:
    import torch.distributed as dist

    tcp: Any = dist.TCPStore  # type: ignore[attr-defined]  # implicit re-export
    return tcp(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 1, is_master=False)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _step(realized: fmesh.RealizedMesh, step: int) -> tuple[float, int]:
    """One step: (what the collectives computed, what the mesh predicts)."""
    import torch
    import torch.distributed as dist

    x = torch.tensor([float((realized.rank + 1) * (step + 1))], dtype=torch.float64)
    for axis in reversed(realized.mesh.axis_names):  # tp first, dp last
        dist.all_reduce(x, group=realized.group(axis))
    ranks = fmesh.instance(realized.mesh, realized.rank).reshape(-1).tolist()
    return float(x.item()), sum((int(r) + 1) * (step + 1) for r in ranks)


def trainer(
    rank: int,
    world: int,
    mesh: fmesh.Mesh,
    kills: dict[int, int],
    *,
    die_in_recover: int | None = None,
    spares: tuple[int, ...] = (),
) -> dict[str, Any]:
    """Train STEPS steps on ``mesh``; rank r dies at step ``kills[r]``. On a failure:
    recover, then shrink along dp (or, with ``spares``, put a spare in each lost
    rank's place). ``die_in_recover`` dies inside its first recover, after checking in.
    """
    store = _store()
    log: dict[str, Any] = {"steps": [], "recoveries": [], "events": []}
    realized = fmesh.realize(mesh, backend="gloo", timeout=COLLECTIVE)
    step = 0
    failed_at: float | None = None
    while True:
        if fmesh.coordinate(mesh, rank) is None:
            # Out of the mesh (a spare, or dropped with its replica): wait for the
            # others to finish or to fail.
            event = _wait_event(store, len(log["recoveries"]))
            if event == "done":
                return log
        else:
            if step == STEPS:
                store.set("test/done", "1")
                return log
            if kills.get(rank) == step:
                _die()
            try:
                got, want = _step(realized, step)
                if failed_at is not None:
                    log["events"].append(("first_ok", time.monotonic() - failed_at))
                    failed_at = None
                log["steps"].append((step, got, want))
                step += 1
                continue
            except RuntimeError as err:  # torch's DistError, or realize's mismatch
                log["events"].append(("failed", type(err).__name__, str(err)[:200]))
                failed_at = failed_at or time.monotonic()
                store.set(f"test/recovering/{len(log['recoveries'])}", "1")
        if rank == die_in_recover and not log["recoveries"]:
            _check_in_then_die()
        start = time.monotonic()
        lost = fmesh.recover(timeout=RECOVER)
        log["recoveries"].append((sorted(lost), time.monotonic() - start))
        in_mesh = {r for r in lost if fmesh.coordinate(mesh, r) is not None}
        if spares:
            free = [s for s in spares if fmesh.coordinate(mesh, s) is None]
            mesh = fmesh.replace(mesh, dict(zip(sorted(in_mesh), free, strict=False)))
        elif in_mesh:
            mesh = fmesh.shrink(mesh, in_mesh, axis=mesh.axis_names[0])
        while True:
            try:
                realized = fmesh.realize(mesh, backend="gloo", timeout=COLLECTIVE)
                break
            except fmesh.MeshMismatchError as err:  # a survivor died since: again
                log["events"].append(("realize failed", str(err)[:200]))
                start = time.monotonic()
                lost = fmesh.recover(timeout=RECOVER)
                log["recoveries"].append((sorted(lost), time.monotonic() - start))
                in_mesh = {r for r in lost if fmesh.coordinate(mesh, r) is not None}
                if in_mesh:
                    mesh = fmesh.shrink(mesh, in_mesh, axis=mesh.axis_names[0])
        log["mesh"] = mesh.to_json()
        if fmesh.coordinate(mesh, rank) is not None:
            step = _agreed_step(realized, step)


def _agreed_step(realized: fmesh.RealizedMesh, step: int) -> int:
    """The step to go on from, as every rank of the mesh sees it (a spare that just
    joined learns it here, as it would learn the model state)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([step])
    for axis in realized.mesh.axis_names:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=realized.group(axis))
    return int(t.item())


def _wait_event(store: Any, recoveries: int) -> str:
    """Poll the launcher's store: the job is done, or survivors are recovering."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline:
        if store.check(["test/done"]):
            return "done"
        if store.check([f"test/recovering/{recoveries}"]):
            return "recover"
        time.sleep(0.02)
    raise TimeoutError("no event")


def _check_in_then_die() -> None:
    """Make this rank's next recover() check in and then die (a fault inside it)."""
    from fmesh._runtime.recover import after_check_in

    after_check_in(_die)


# -- jobs -----------------------------------------------------------------------------------


def four_job(rank: int, world: int) -> dict[str, Any]:
    return trainer(rank, world, fmesh.make_mesh({"dp": 2, "tp": 2}), {3: 2})


def eight_job(rank: int, world: int) -> dict[str, Any]:
    return trainer(rank, world, fmesh.make_mesh({"dp": 2, "fsdp": 2, "tp": 2}), {5: 3})


def two_lost_job(rank: int, world: int) -> dict[str, Any]:
    return trainer(rank, world, fmesh.make_mesh({"dp": 4, "tp": 2}), {3: 2, 6: 2})


def dies_in_recover_job(rank: int, world: int) -> dict[str, Any]:
    return trainer(rank, world, fmesh.make_mesh({"dp": 4, "tp": 2}), {7: 2}, die_in_recover=2)


def spare_job(rank: int, world: int) -> dict[str, Any]:
    mesh = fmesh.make_mesh({"dp": 2, "tp": 2})  # ranks 0-3; rank 4 is a spare
    return trainer(rank, world, mesh, {1: 2}, spares=(4,))


# -- parent side ----------------------------------------------------------------------------


def _logs(job: Job, dead: set[int]) -> dict[int, dict[str, Any]]:
    for r in dead:
        assert job.outcomes[r].exitcode == -signal.SIGKILL, job.describe()
    alive = [o for o in job.outcomes if o.rank not in dead]
    assert all(o.ok for o in alive), job.describe()
    return {o.rank: cast("dict[str, Any]", o.value) for o in alive}


def _check(
    logs: dict[int, dict[str, Any]],
    final: fmesh.Mesh,
    lost: list[list[int]],
    cost: bool = True,
) -> None:
    for rank, log in logs.items():
        assert [got == want for _, got, want in log["steps"]] == [True] * len(log["steps"]), (
            rank,
            log["steps"],
        )
        assert [r for r, _ in log["recoveries"]] == lost, (rank, log)
        assert fmesh.Mesh.from_json(log["mesh"]) == final, (rank, log["mesh"])
        in_final = fmesh.coordinate(final, rank) is not None
        if in_final and log["steps"][0][0] == 0:  # trained from the start
            assert [s for s, *_ in log["steps"]] == list(range(STEPS)), (rank, log)
        first_ok = [e[1] for e in log["events"] if e[0] == "first_ok"]
        if cost and in_final and first_ok:
            # Recovery cost: from the failed collective to the first good one, less
            # the time spent in recover (its wait for the dead rank): the shrink, the
            # realize among survivors and the step's own collectives.
            spent = sum(seconds for _, seconds in log["recoveries"])
            assert first_ok[0] - spent < 2.0, (rank, first_ok, spent, log["events"])


def test_four_ranks_dp_tp_survive_a_killed_rank(tmp_path: Path) -> None:
    logs = _logs(
        run_spawn(four_job, 4, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT), {3}
    )
    _check(logs, fmesh.make_mesh({"dp": 1, "tp": 2}), [[3]])
    assert len(logs[0]["steps"]) == STEPS and len(logs[2]["steps"]) == 2  # 2 left


def test_eight_ranks_dp_fsdp_tp_survive_a_killed_rank(tmp_path: Path) -> None:
    logs = _logs(
        run_spawn(eight_job, 8, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT), {5}
    )
    _check(logs, fmesh.make_mesh({"dp": 1, "fsdp": 2, "tp": 2}), [[5]])


def test_two_ranks_lost_at_once(tmp_path: Path) -> None:
    logs = _logs(
        run_spawn(two_lost_job, 8, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT),
        {3, 6},
    )
    final = fmesh.make_mesh({"dp": 2, "tp": 2}, ranks=[0, 1, 4, 5])
    _check(logs, final, [[3, 6]])


def test_a_rank_dying_inside_recover_is_found_at_the_next_realize(tmp_path: Path) -> None:
    job = run_spawn(
        dies_in_recover_job, 8, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT
    )
    logs = _logs(job, {2, 7})
    final = fmesh.make_mesh({"dp": 2, "tp": 2}, ranks=[0, 1, 4, 5])
    # Rank 2 checked in, so the first recovery declares only rank 7 lost; the realize
    # of the shrunk mesh then misses rank 2, and a second recovery declares it lost.
    _check(logs, final, [[7], [2]], cost=False)  # it waited in a realize, too
    failed = [e for e in logs[0]["events"] if e[0] == "realize failed"]
    assert failed and "ranks [2] never reached" in failed[0][1], logs[0]["events"]


def test_a_spare_kept_outside_the_mesh_replaces_the_lost_rank(tmp_path: Path) -> None:
    logs = _logs(
        run_spawn(spare_job, 5, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT), {1}
    )
    final = fmesh.make_mesh({"dp": 2, "tp": 2}, ranks=[0, 4, 2, 3])
    _check(logs, final, [[1]])
    assert [s for s, *_ in logs[4]["steps"]] == [2, 3, 4, 5], logs[4]  # joined at 2


def test_realizing_a_mesh_that_holds_a_lost_rank_is_refused(tmp_path: Path) -> None:
    job = run_spawn(refused_job, 4, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT)
    logs = _logs(job, {3})
    for log in logs.values():
        assert log["lost"] == [3]
        assert "holds rank(s) [3], which fmesh.recover() declared lost" in log["error"]


def refused_job(rank: int, world: int) -> dict[str, Any]:
    mesh = fmesh.make_mesh({"dp": 2, "tp": 2})
    fmesh.realize(mesh, backend="gloo", timeout=COLLECTIVE)
    if rank == 3:
        _die()
    lost = fmesh.recover(timeout=datetime.timedelta(seconds=2))
    try:
        fmesh.realize(mesh["tp"])
    except fmesh.MeshError as err:
        return {"lost": sorted(lost), "error": str(err)}
    return {"lost": sorted(lost), "error": ""}
