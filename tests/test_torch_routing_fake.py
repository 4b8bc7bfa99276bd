"""torch's own DeviceMesh methods on fmesh's meshes, on big fake worlds, and where the
routing steps aside (torchcomms, ``FMESH_TORCH_HOOK=0``, torch versions it does not
know). Each job runs in a fresh process: the routing is installed once per process."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _dist import run_spawn
from titan_recipe import count_new_group

import fmesh
from fmesh._compat.hook import supported

BIG = 2**14
RANK = 9001


def titan_views(init: Any, world: int) -> dict[str, Any]:
    """torchtitan's build_mesh calls on a world of ``world`` ranks: pp=4, cp=2, tp=8,
    ep=4 and the rest data-parallel (half replicate, half shard)."""
    pp, cp, tp = 4, 2, 8
    batch = world // (pp * cp * tp)
    dp_replicate, dp_shard = 2, batch // 2
    root = init("cpu", (world,), mesh_dim_names=("world",))
    loading = root._unflatten(0, (pp, batch, cp, tp), ("pp", "batch", "cp", "tp"))
    loss = loading["batch", "cp"]._flatten("loss_mesh")
    dense = root._unflatten(
        0, (pp, dp_replicate, dp_shard, cp, tp), ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    )
    sparse = root._unflatten(
        0,
        (pp, dp_replicate, dp_shard * cp * tp // 4, 4),
        ("pp", "dp_replicate", "efsdp", "ep"),
    )
    fwdbwd = root._unflatten(0, (pp, batch, cp, tp), ("pp", "dp", "cp", "tp"))[
        "dp", "cp", "tp"
    ]
    singles = {n: loading[n] for n in ("pp", "batch", "cp", "tp")}
    singles |= {n: dense[n] for n in ("dp_replicate", "dp_shard")}
    singles |= {"loss": loss, "ep": sparse["ep"], "efsdp": sparse["efsdp"], "dp": fwdbwd["dp"]}
    return {
        "root": root,
        "singles": singles,
        "all": [loading, dense, sparse, fwdbwd, *singles.values()],
    }


def _answers(views: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    return {
        name: (
            dm.mesh.tolist(),
            dm.get_coordinate(),
            dm.get_local_rank(),
            dist.get_process_group_ranks(dm.get_group()),
        )
        for name, dm in views["singles"].items()
    }


@contextlib.contextmanager
def counting_world_work(world: int) -> Iterator[list[int]]:
    """Counts, in ``[0]``, the O(world) steps of building a DeviceMesh: torch's search
    of a mesh tensor for this rank's coordinate (getting a slice's tensor searches the
    world's; a one-rank mesh, as fmesh's probe of torch's fields, is not counted), and
    a world-sized tensor made a list."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    seen = [0]
    cls: Any = DeviceMesh
    tensor: Any = torch.Tensor
    search = cls.__dict__["_compute_coordinates_from_mesh"]
    tolist = tensor.tolist

    def counted_search(mesh: torch.Tensor, *args: Any) -> Any:
        seen[0] += mesh.numel() > 1
        return search.__func__(mesh, *args)

    def counted_tolist(self: torch.Tensor) -> Any:
        seen[0] += self.numel() >= world
        return tolist(self)

    cls._compute_coordinates_from_mesh = staticmethod(counted_search)
    tensor.tolist = counted_tolist
    try:
        yield seen
    finally:
        cls._compute_coordinates_from_mesh = search
        tensor.tolist = tolist


def big_world_job(_: int, __: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh as torch_init

    from fmesh.device_mesh import init_device_mesh

    fmesh.init_fake_world(BIG, RANK)
    with counting_world_work(BIG) as torch_work:
        torch_views = titan_views(torch_init, BIG)
    theirs = _answers(torch_views)
    new_groups = count_new_group()
    created = fmesh.cache_stats().created
    with counting_world_work(BIG) as work:
        views = titan_views(init_device_mesh, BIG)
    flat = views["root"]._flatten_rank_map
    # Read before anything hashes or compares a mesh (the answers below do).
    flat_in_n = {
        "searches": (work[0], torch_work[0]),
        "rank_tuple_built": flat.built,
        "one_rank_map": all(dm._rank_map is views["root"]._rank_map for dm in views["all"]),
    }
    groups = {id(dm.get_group()): dm.get_group() for dm in views["singles"].values()}
    default = dist.group.WORLD
    return {
        "equal": _answers(views) == theirs,
        "new_group": new_groups[0],
        "created": fmesh.cache_stats().created - created,
        "distinct": len([g for g in groups.values() if g is not default]),
        # One rank-map tuple for every mesh under the root: nothing copied per slice.
        "shared": all(dm._flatten_rank_map is flat for dm in views["all"]),
        **flat_in_n,
    }


def test_a_big_fake_world_answers_as_torch_with_only_this_ranks_groups(tmp_path: Path) -> None:
    out = run_spawn(
        big_world_job, 1, tmp_path=tmp_path, launch_env=False, timeout=240
    ).values()[0]
    assert out["equal"] is True
    assert out["new_group"] == 0
    # Groups constructed == the distinct groups this rank holds (every single-axis
    # mesh's group, less the default group); the multi-axis views add none.
    assert out["created"] == out["distinct"] > 0, out
    assert out["shared"] is True
    # Flat in N: no mesh searched or listed the world (torch's own build does, so the
    # counter counts), the tuple of the world's ranks was not built, one rank map.
    ours, torch_searches = out["searches"]
    assert ours == 0 and torch_searches > 0, out["searches"]
    assert out["rank_tuple_built"] is False
    assert out["one_rank_map"] is True


def stepping_aside_job(_: int, __: int, how: str) -> dict[str, Any]:

    from fmesh._compat.hook import installed
    from fmesh.device_mesh import init_device_mesh

    if how == "env":
        os.environ["FMESH_TORCH_HOOK"] = "0"
    fmesh.init_fake_world(64, 5)
    if how == "torchcomms":
        config: Any = importlib.import_module("torch.distributed.config")
        config.use_torchcomms = True
    root = init_device_mesh("cpu", (64,), mesh_dim_names=("world",))
    new_groups = count_new_group()
    created = fmesh.cache_stats().created
    mesh = root._unflatten(0, (4, 16), ("dp", "tp"))
    tp = mesh["tp"]
    return {
        "installed": installed(),
        "fmesh_created": fmesh.cache_stats().created - created,
        "torch_new_group": new_groups[0],
        "tp": tp.mesh.tolist(),
    }


@pytest.mark.parametrize("how", ["env", "torchcomms"])
def test_the_routing_steps_aside(tmp_path: Path, how: str) -> None:
    out = run_spawn(stepping_aside_job, 1, how, tmp_path=tmp_path, launch_env=False).values()[
        0
    ]
    # torch creates the groups of torch's methods itself, as without fmesh.
    assert out["fmesh_created"] == 0 and out["torch_new_group"] > 0, out
    assert out["tp"] == list(range(0, 16)), out
    assert out["installed"] is (how != "env"), out


def test_only_known_torch_versions_are_routed() -> None:
    for minor in range(11, 16):
        assert supported((2, minor))
    for version in [(2, 10), (2, 16), (3, 0), (1, 13)]:
        assert not supported(version), version
