"""A trainer that runs targets of ``tests/plan_targets.py`` one after the other, as
torchrun runs it, plain or under ``-m fmesh.route``::

    torchrun --standalone --nproc-per-node 4 [-m fmesh.route] tests/plan_launch.py OUT A,B

Per rank it appends to ``OUT/rank<r>.jsonl`` a line when a target starts, one when it
returns, and one with its outcome: ``finished`` with the meshes it returned (every
dim's ranks, coordinate and group members, each group checked by an ``all_reduce`` of
the ranks), or ``raised`` with the error. Between targets every rank waits for the
others and destroys the groups the target's meshes hold (torch's own call, whichever
made them), so each target starts with no group but the default one, routed or not.
A target that hangs on some rank must come last. ``tests/test_plan_launch.py``
compares ``fmesh plan``'s verdicts with these outcomes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import plan_targets  # the script's folder is first on the path, as Python puts it
import torch
import torch.distributed as dist


def _groups(meshes: dict[str, Any]) -> list[Any]:
    """The groups of every dim of ``meshes``, each once, the default group left out."""
    seen: dict[int, Any] = {}
    for mesh in meshes.values():
        for group in mesh.get_all_groups():
            if group is not dist.group.WORLD:
                seen.setdefault(id(group), group)
    return list(seen.values())


def _describe(meshes: dict[str, Any]) -> dict[str, Any]:
    """Each mesh as a trainer sees it, and the sum of the ranks of every group it
    holds, by an ``all_reduce`` over the group: each group once, in the order of its
    members (the same order on every rank, so no two ranks wait on each other)."""
    sums: dict[tuple[int, ...], int] = {}
    for group in sorted(_groups(meshes), key=dist.get_process_group_ranks):
        members = tuple(dist.get_process_group_ranks(group))
        if members not in sums:
            total = torch.tensor([dist.get_rank()])
            dist.all_reduce(total, group=group)
            sums[members] = int(total.item())
    out: dict[str, Any] = {}
    for name, mesh in meshes.items():
        groups = [tuple(dist.get_process_group_ranks(g)) for g in mesh.get_all_groups()]
        out[name] = {
            "mesh": mesh.mesh.tolist(),
            "names": None if mesh.mesh_dim_names is None else list(mesh.mesh_dim_names),
            "coordinate": mesh.get_coordinate(),
            "local_ranks": [mesh.get_local_rank(i) for i in range(mesh.ndim)],
            "groups": [list(g) for g in groups],
            "sums": [sums.get(g, sum(g)) for g in groups],  # the default group: not run
        }
    return out


def main(out: Path, targets: list[str]) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(out / f"rank{rank}.jsonl", "a") as log:

        def note(**fields: Any) -> None:
            log.write(json.dumps(fields) + "\n")
            log.flush()

        for target in targets:
            note(target=target, event="start")
            meshes: dict[str, Any] = {}
            try:
                returned = getattr(plan_targets, target)()
                note(target=target, event="returned")
                meshes = returned if isinstance(returned, dict) else {}
                note(target=target, event="finished", meshes=_describe(meshes))
            except Exception as err:  # the outcome, as the test reads it
                note(target=target, event="raised", error=type(err).__name__, message=str(err))
            dist.barrier()
            for group in _groups(meshes):
                dist.destroy_process_group(group)
        note(event="done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2].split(","))
