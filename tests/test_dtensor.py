"""DTensor on the DeviceMesh of a realized fmesh mesh, with real gloo ranks.

``RealizedMesh.to_device_mesh`` hands DTensor fmesh's groups. DTensor places shard
``i`` on the rank whose mesh coordinate is ``i`` and runs its collectives by group
rank, so a round trip (distribute, redistribute, full_tensor) only comes back intact
when group rank == coordinate -- which is what breaks for torch's own sorted groups
on a reversed flatten. Expected shards are computed here from fmesh's coordinates.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from _dist import run_spawn

import fmesh
from fmesh import Mesh

ROWS, COLS = 8, 12


def dtensor_meshes(world: int) -> dict[str, Mesh]:
    """2-d meshes and meshes with a flattened axis, over ``world`` ranks."""
    if world == 4:
        return {
            "2d": fmesh.make_mesh({"dp": 2, "tp": 2}),
            "2d_custom_order": fmesh.make_mesh({"dp": 2, "tp": 2}, ranks=(3, 1, 0, 2)),
            # Reversed, and not adjacent (a size-1 axis stands between).
            "flat_reversed": fmesh.flatten(
                fmesh.make_mesh({"a": 2, "one": 1, "b": 2}), ("b", "a"), "ba"
            ),
            "flat_reversed_1d": fmesh.flatten(fmesh.make_mesh({"a": 2, "b": 2}), ("b", "a")),
        }
    assert world == 8
    base = fmesh.make_mesh({"p": 2, "q": 2, "r": 2})
    return {
        # A genuinely non-adjacent reversed flatten next to a plain axis.
        "flat_nonadjacent_reversed": fmesh.flatten(base, ("r", "p"), "rp"),
        "flat_adjacent_then_plain": fmesh.flatten(base, ("q", "r"), "qr"),
    }


def global_tensor() -> npt.NDArray[np.float32]:
    return np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)


def block_at(
    mesh: Mesh, coord: tuple[int, ...], shard_dims: tuple[int | None, ...]
) -> npt.NDArray[np.float32]:
    """The block of :func:`global_tensor` at mesh coordinate ``coord`` when mesh axis
    ``i`` shards tensor dim ``shard_dims[i]`` (``None``: replicated along it)."""
    block = global_tensor()
    for axis, dim in enumerate(shard_dims):
        if dim is not None:
            block = np.array_split(block, mesh.axis_sizes[axis], axis=dim)[coord[axis]]
    return block


def expected_shard(
    mesh: Mesh, rank: int, shard_dims: tuple[int | None, ...]
) -> npt.NDArray[np.float32]:
    """The block ``rank`` holds: the one at its fmesh coordinate."""
    coord = fmesh.coordinate(mesh, rank)
    assert coord is not None
    return block_at(mesh, coord, shard_dims)


def _placements_for(mesh: Mesh) -> list[tuple[int | None, ...]]:
    """Sharding patterns to try: each axis shards a different tensor dim."""
    if mesh.ndim == 1:
        return [(0,), (1,)]
    return [(0, 1), (1, 0), (None, 0), (1, None)]


# -- worker side --------------------------------------------------------------------------


def dtensor_job(rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import (
        DTensor,
        Partial,
        Placement,
        Replicate,
        Shard,
        distribute_tensor,
    )

    def placements(dims: tuple[int | None, ...]) -> list[Placement]:
        return [Replicate() if d is None else Shard(d) for d in dims]

    full = torch.from_numpy(global_tensor())
    out: dict[str, Any] = {}
    for name, mesh in dtensor_meshes(world).items():
        realized = fmesh.realize(mesh)
        dm = realized.to_device_mesh("cpu")
        replicated = [Replicate()] * mesh.ndim
        case: dict[str, Any] = {
            "torch_coordinate": dm.get_coordinate(),
            "torch_local_ranks": tuple(dm.get_local_rank(i) for i in range(mesh.ndim)),
            "shards": {},
        }
        for dims in _placements_for(mesh):
            # distribute: each rank keeps the block its coordinate names.
            dt = distribute_tensor(full, dm, placements(dims))
            local = dt.to_local().numpy().copy()
            # Shard -> Replicate, and full_tensor, give the whole tensor back.
            back = dt.redistribute(dm, replicated).to_local().numpy().copy()
            gathered = dt.full_tensor().numpy().copy()
            # Replicate -> Shard cuts the same block out locally.
            resharded = (
                distribute_tensor(full, dm, replicated)
                .redistribute(dm, placements(dims))
                .to_local()
                .numpy()
                .copy()
            )
            case["shards"][dims] = (local, back, gathered, resharded)
        # Partial -> Replicate along the first axis: the sum over its group.
        partial = [Partial(), *[Replicate()] * (mesh.ndim - 1)]
        mine = torch.full((2, 2), float(rank))
        summed = DTensor.from_local(mine, dm, partial).redistribute(dm, replicated)
        case["partial_sum"] = float(summed.to_local()[0, 0].item())
        # from_device_mesh of the DeviceMesh gives this rank the same groups.
        back_mesh = fmesh.from_device_mesh(dm)
        case["from_device_mesh"] = {
            "coordinate": fmesh.coordinate(back_mesh, rank),
            "groups": {a: fmesh.group(back_mesh, a, rank) for a in back_mesh.axis_names},
        }
        again = fmesh.realize(back_mesh)
        case["from_device_mesh_realized"] = {
            "created": again.created,
            "same_groups": all(again.group(a) is realized.group(a) for a in mesh.axis_names),
            "ranks": {
                a: tuple(dist.get_process_group_ranks(again.group(a))) for a in mesh.axis_names
            },
        }
        out[name] = case
    dist.barrier()
    return out


# -- parent side ----------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[4, 8], ids=["4_ranks", "8_ranks"])
def job(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, list[dict[str, Any]]]:
    world: int = request.param
    reports = run_spawn(
        dtensor_job,
        world,
        tmp_path=tmp_path_factory.mktemp(f"dtensor{world}"),
        timeout=150,
    ).values()
    return world, reports


def test_local_shards_follow_fmesh_coordinates(job: tuple[int, list[dict[str, Any]]]) -> None:
    world, reports = job
    full = global_tensor()
    for name, mesh in dtensor_meshes(world).items():
        for rank, out in enumerate(reports):
            case = out[name]
            assert case["torch_coordinate"] == fmesh.coordinate(mesh, rank)
            # The DeviceMesh fmesh builds agrees with itself, unlike torch's own.
            assert case["torch_local_ranks"] == case["torch_coordinate"]
            assert set(case["shards"]) == set(_placements_for(mesh))
            for dims, (local, back, gathered, resharded) in case["shards"].items():
                want = expected_shard(mesh, rank, dims)
                np.testing.assert_array_equal(local, want, err_msg=f"{name} {dims}")
                np.testing.assert_array_equal(resharded, want, err_msg=f"{name} {dims}")
                np.testing.assert_array_equal(back, full, err_msg=f"{name} {dims}")
                np.testing.assert_array_equal(gathered, full, err_msg=f"{name} {dims}")


def test_reversed_flattens_are_not_in_rank_order(
    job: tuple[int, list[dict[str, Any]]],
) -> None:
    """Not vacuous: on the reversed flattens some rank holds a different block than
    its position in the sorted group (torch's group rank there) would give."""
    world, reports = job
    for name, mesh in dtensor_meshes(world).items():
        if "reversed" not in name:
            continue
        axis = mesh.axis_names[0]
        dims = _placements_for(mesh)[0]
        moved = []
        for rank, out in enumerate(reports):
            group = fmesh.group(mesh, axis, rank)
            coord = fmesh.coordinate(mesh, rank)
            assert coord is not None
            sorted_coord = (sorted(group).index(rank), *coord[1:])
            local = out[name]["shards"][dims][0]
            if not np.array_equal(local, block_at(mesh, sorted_coord, dims)):
                moved.append(rank)
        assert moved, name


def test_partial_to_replicate_sums_over_the_group(
    job: tuple[int, list[dict[str, Any]]],
) -> None:
    world, reports = job
    for name, mesh in dtensor_meshes(world).items():
        for rank, out in enumerate(reports):
            group = fmesh.group(mesh, mesh.axis_names[0], rank)
            assert out[name]["partial_sum"] == sum(group), name


def test_from_device_mesh_round_trip(job: tuple[int, list[dict[str, Any]]]) -> None:
    world, reports = job
    for name, mesh in dtensor_meshes(world).items():
        for rank, out in enumerate(reports):
            back = out[name]["from_device_mesh"]
            assert back["coordinate"] == fmesh.coordinate(mesh, rank)
            assert back["groups"] == {a: fmesh.group(mesh, a, rank) for a in mesh.axis_names}
            again = out[name]["from_device_mesh_realized"]
            # Same groups as the original mesh: nothing new is created.
            assert again["created"] == 0
            assert again["same_groups"] is True
            assert again["ranks"] == back["groups"]
