"""``realize`` on torch's ``fake`` backend: one process plays one rank of a big world.

The default process group is process-global, so every test runs in a fresh process
and, inside it, destroys fmesh's groups and the world before playing the next rank.
Expected groups come from a brute-force model (a numpy array of all ranks, indexed
and transposed), not from fmesh, and are compared with torch's own DeviceMesh on a
smaller world.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from _dist import run_spawn

import fmesh
from fmesh import Mesh

TRAINER_SHAPE = {"pp": 8, "dp_replicate": 16, "dp_shard": 64, "cp": 16, "tp": 8}
"""pp x dp_replicate x dp_shard x cp x tp: 2**20 ranks."""
SMALL_SHAPE = {"pp": 2, "dp_replicate": 2, "dp_shard": 4, "cp": 2, "tp": 2}
"""The same axes on 64 ranks, small enough for torch's init_device_mesh."""
FLATTENS = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}
"""The flattened axes trainers use (torchtitan's names)."""


def trainer_meshes(shape: dict[str, int]) -> dict[str, Mesh]:
    """The root mesh and, as trainers build them, a 1-d mesh per flattened axis."""
    root = fmesh.make_mesh(shape)
    out = {"root": root}
    for name, axes in FLATTENS.items():
        out[name] = fmesh.flatten(fmesh.slice(root, *axes), axes, name)
    return out


def brute_force_group(
    shape: dict[str, int], axes: tuple[str, ...], rank: int
) -> tuple[int, ...]:
    """The ranks of ``rank``'s group along ``axes`` (row-major over ``axes`` in the
    given order), by indexing the array of all ranks."""
    names = list(shape)
    grid = np.arange(math.prod(shape.values()), dtype=np.int64).reshape(tuple(shape.values()))
    coord = np.unravel_index(rank, grid.shape)
    index = tuple(slice(None) if n in axes else int(c) for n, c in zip(names, coord))
    sub: npt.NDArray[np.int64] = grid[index]
    kept = [n for n in names if n in axes]  # sub's dimensions, in mesh order
    return tuple(int(r) for r in sub.transpose([kept.index(a) for a in axes]).ravel())


# -- worker side --------------------------------------------------------------------------


def _init_fake(rank: int, world: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)


def _teardown() -> None:
    import torch.distributed as dist

    fmesh.destroy()
    dist.destroy_process_group()


def _group_facts(realized: fmesh.RealizedMesh) -> dict[str, tuple[tuple[int, ...], int, int]]:
    import torch.distributed as dist

    return {
        axis: (tuple(dist.get_process_group_ranks(pg)), pg.rank(), pg.size())
        for axis, pg in realized.groups.items()
    }


def trainer_job(_: int, __: int, shape: dict[str, int], ranks: list[int]) -> list[Any]:
    """Play each of ``ranks`` in a fake world of ``prod(shape)`` ranks."""
    world = math.prod(shape.values())
    reports = []
    for rank in ranks:
        _init_fake(rank, world)
        meshes = trainer_meshes(shape)
        realized = {name: fmesh.realize(m) for name, m in meshes.items()}
        created = fmesh.cache_stats().created
        # Again, plus the same groups reached through other meshes.
        root = meshes["root"]
        again = [fmesh.realize(m).created for m in meshes.values()]
        others = [
            fmesh.realize(fmesh.flatten(root, axes, name)).created
            for name, axes in FLATTENS.items()
        ] + [fmesh.realize(fmesh.slice(root, "tp", "dp_shard", "pp")).created]
        reports.append(
            {
                "rank": rank,
                "created": created,
                "live": fmesh.cache_stats().live,
                "created_after": fmesh.cache_stats().created,
                "again": again,
                "others": others,
                "coordinates": {n: r.coordinate for n, r in realized.items()},
                "local_ranks": {
                    n: {a: r.local_rank(a) for a in r.mesh.axis_names}
                    for n, r in realized.items()
                },
                "groups": {n: _group_facts(r) for n, r in realized.items()},
            }
        )
        _teardown()
    return reports


def _check_trainer_report(report: dict[str, Any], shape: dict[str, int]) -> None:
    rank = report["rank"]
    meshes = trainer_meshes(shape)
    distinct = {layout for m in meshes.values() for layout in m.axes}
    # One group per distinct layout: 5 axes + 3 flattens.
    assert len(distinct) == 8
    assert report["created"] == report["live"] == len(distinct)
    assert report["created_after"] == report["created"]
    assert report["again"] == [0] * len(meshes)
    assert report["others"] == [0] * (len(FLATTENS) + 1)
    coord = np.unravel_index(rank, tuple(shape.values()))
    for name, mesh in meshes.items():
        axes_of = {a: (a,) for a in shape} | FLATTENS
        groups = report["groups"][name]
        assert tuple(groups) == mesh.axis_names
        assert report["coordinates"][name] == fmesh.coordinate(mesh, rank)
        for axis, (ranks, group_rank, size) in groups.items():
            expected = brute_force_group(shape, axes_of[axis], rank)
            assert ranks == expected, (name, axis)
            assert size == len(expected)
            assert group_rank == expected.index(rank)
            assert group_rank == report["local_ranks"][name][axis]
            if axis in shape:
                assert group_rank == coord[list(shape).index(axis)]


def test_trainer_mesh_at_a_million_ranks(tmp_path: Path) -> None:
    world = math.prod(TRAINER_SHAPE.values())
    assert world == 2**20
    ranks = [0, world - 1, *random.Random(20).sample(range(1, world - 1), 2)]
    (reports,) = run_spawn(
        trainer_job,
        1,
        TRAINER_SHAPE,
        ranks,
        tmp_path=tmp_path,
        launch_env=False,
        timeout=120,
    ).values()
    assert [r["rank"] for r in reports] == ranks
    for report in reports:
        _check_trainer_report(report, TRAINER_SHAPE)


def subworld_job(
    _: int, __: int, world: int, members: list[int], probes: list[int]
) -> list[Any]:
    out = []
    mesh = fmesh.make_mesh({"a": 4, "b": len(members) // 4}, ranks=members)
    for rank in probes:
        _init_fake(rank, world)
        realized = fmesh.realize(mesh)
        out.append(
            {
                "rank": rank,
                "coordinate": realized.coordinate,
                "groups": _group_facts(realized),
                "created": fmesh.cache_stats().created,
            }
        )
        _teardown()
    return out


def test_sub_world_mesh_in_a_big_world(tmp_path: Path) -> None:
    world = 2**16
    rng = random.Random(7)
    members = rng.sample(range(world), 32)
    outsiders = rng.sample(sorted(set(range(world)) - set(members)), 2)
    probes = [members[0], members[-1], *outsiders]
    (reports,) = run_spawn(
        subworld_job,
        1,
        world,
        members,
        probes,
        tmp_path=tmp_path,
        launch_env=False,
        timeout=120,
    ).values()
    grid = np.asarray(members).reshape(4, len(members) // 4)
    for report in reports:
        rank = report["rank"]
        if rank in outsiders:
            assert report == {"rank": rank, "coordinate": None, "groups": {}, "created": 0}
            continue
        i, j = (int(x) for x in np.argwhere(grid == rank)[0])
        assert report["coordinate"] == (i, j)
        assert report["groups"] == {
            "a": (tuple(int(r) for r in grid[:, j]), i, grid.shape[0]),
            "b": (tuple(int(r) for r in grid[i, :]), j, grid.shape[1]),
        }
        assert report["created"] == 2


# -- against torch's init_device_mesh ---------------------------------------------------------


def torch_job(_: int, __: int, shape: dict[str, int], ranks: list[int]) -> list[Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    world = math.prod(shape.values())
    names = tuple(shape)
    reports = []
    for rank in ranks:
        _init_fake(rank, world)
        meshes = trainer_meshes(shape)
        realized = {name: fmesh.realize(m) for name, m in meshes.items()}
        root = init_device_mesh("cpu", tuple(shape.values()), mesh_dim_names=names)
        torch_meshes: dict[str, DeviceMesh] = {"root": root}
        for name, axes in FLATTENS.items():
            torch_meshes[name] = root[axes]._flatten(name)
        torch_meshes["slice"] = root["dp_shard", "tp"]
        report: dict[str, Any] = {"rank": rank, "cases": {}}
        for name, dm in torch_meshes.items():
            dim_names = dm.mesh_dim_names
            assert dim_names is not None
            back = fmesh.from_device_mesh(dm)
            report["cases"][name] = {
                "torch": {
                    a: tuple(dist.get_process_group_ranks(dm.get_group(a))) for a in dim_names
                },
                "torch_coordinate": dm.get_coordinate(),
                "fmesh": (_group_facts(realized[name]) if name in realized else None),
                "from_device_mesh": back,
                "from_device_mesh_groups": {
                    a: fmesh.group(back, a, rank) for a in back.axis_names
                },
            }
        reports.append(report)
        _teardown()
    return reports


def test_same_groups_as_torch_init_device_mesh(tmp_path: Path) -> None:
    world = math.prod(SMALL_SHAPE.values())
    ranks = [0, world - 1, *random.Random(3).sample(range(1, world - 1), 3)]
    (reports,) = run_spawn(
        torch_job,
        1,
        SMALL_SHAPE,
        ranks,
        tmp_path=tmp_path,
        launch_env=False,
        timeout=120,
    ).values()
    meshes = trainer_meshes(SMALL_SHAPE)
    root = meshes["root"]
    expected_values = {**meshes, "slice": fmesh.slice(root, "dp_shard", "tp")}
    assert [r["rank"] for r in reports] == ranks
    for report in reports:
        rank = report["rank"]
        for name, case in report["cases"].items():
            mesh = expected_values[name]
            # from_device_mesh gives back the very mesh value fmesh builds.
            assert case["from_device_mesh"] == mesh, name
            assert case["torch_coordinate"] == fmesh.coordinate(mesh, rank)
            for axis, torch_ranks in case["torch"].items():
                mine = case["from_device_mesh_groups"][axis]
                assert set(mine) == set(torch_ranks), (name, axis)
                if case["fmesh"] is not None:
                    ranks_, group_rank, _ = case["fmesh"][axis]
                    assert set(ranks_) == set(torch_ranks), (name, axis)
                    assert ranks_ == mine
                    coord = fmesh.coordinate(mesh, rank)
                    assert coord is not None
                    assert group_rank == coord[mesh.axis_index(axis)]
