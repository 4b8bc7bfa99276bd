"""``DeviceMesh(device_type, tensor)`` over a view of a drop-in mesh's rank map.

FSDP2 with an int ``reshard_after_forward`` builds its post-forward mesh as
``DeviceMesh(device_type, mesh.mesh.view(-1, r))``. A tensor that is a view of the
whole of a registered rank map is a layout of that rank space: fmesh makes its groups
(memoized, agreed), and torch's fields stay torch's. Anything else is torch's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _dist import run_spawn
from titan_recipe import count_new_group, sgd_losses

import fmesh

WORLD = 4


def _answers(dm: Any) -> tuple[Any, ...]:
    import torch.distributed as dist

    member = dm.get_coordinate() is not None
    return (
        dm.mesh.tolist(),
        dm.get_coordinate(),
        dm.mesh_dim_names,
        [dist.get_process_group_ranks(g) for g in dm.get_all_groups()] if member else None,
        dm._flatten_rank_map,
        hash(dm),
    )


def _views(init: Any, new_groups: list[int]) -> dict[str, tuple[Any, int]]:
    """(the DeviceMesh built over a tensor, torch ``new_group`` calls it made) for
    views of two roots."""
    from torch.distributed.device_mesh import DeviceMesh

    root = init("cpu", (2, 4), mesh_dim_names=("a", "b"))
    flat = init("cpu", (8,), mesh_dim_names=("w",))
    tensors = {
        "fsdp": flat.mesh.view(-1, 2),  # FSDP2's post-forward mesh
        "same": root.mesh,
        "transposed": root.mesh.t(),  # every rank once, another order
        "renamed": root.mesh.view(4, 2),
        "part": root.mesh[0],  # one instance, the same on every rank
        "column": root.mesh[:, 1],  # another, strided
        "copy": root.mesh.clone(),  # not a view: torch's
        "long": root.mesh.long(),  # another dtype: torch's
        "bad_start": flat.mesh[1:5],  # starts in the middle of an instance: torch's
    }
    if root.get_coordinate() is not None:  # torch slices only where the rank is
        tensors["slice"] = root["b"].mesh  # this rank's row (FSDP2 on a slice)
        tensors["slice_view"] = root["a"].mesh.view(-1, 1)
    out = {}
    for name, t in tensors.items():
        names = ("x", "y") if name == "renamed" else None
        new_groups[0] = 0
        out[name] = (DeviceMesh("cpu", t, mesh_dim_names=names), new_groups[0])
    new_groups[0] = 0
    # By index: torch 2.11's _unflatten refuses every str dim that it has.
    derived = out["renamed"][0]._unflatten(0, (2, 2), ("x0", "x1"))
    out["derived"] = (derived, new_groups[0])
    return out


def fake_views_job(_: int, __: int, rank: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh as torch_init

    from fmesh.device_mesh import init_device_mesh

    fmesh.init_fake_world(12, rank)
    new_groups = count_new_group()
    out: dict[str, Any] = {}
    for kind, init in (("torch", torch_init), ("fmesh", init_device_mesh)):
        views = _views(init, new_groups)
        out[kind] = {k: _answers(dm) for k, (dm, _) in views.items()}
        out[kind + "_new_group"] = {k: n for k, (_, n) in views.items()}
    fmesh.destroy()
    dist.destroy_process_group()
    return out


def test_views_of_a_rank_map_answer_as_torch(tmp_path: Path) -> None:
    for rank in (0, 6, 9):  # 9: outside the 8-rank meshes of a 12-rank world
        (out,) = run_spawn(fake_views_job, 1, rank, tmp_path=tmp_path / str(rank)).values()
        assert out["fmesh"] == out["torch"], rank
        theirs = out["torch_new_group"]
        assert all(theirs.values()), theirs  # torch makes one per group of every mesh
        # Views of the drop-in's rank maps (and what torch derives from a whole one
        # in order) are fmesh's; the rest stays torch's, with torch's calls.
        torchs = {"copy", "long", "bad_start"}
        want = {k: theirs[k] if k in torchs else 0 for k in theirs}
        assert out["fmesh_new_group"] == want, rank


def fsdp_on_a_slice_job(_: int, __: int, rank: int) -> dict[str, Any]:
    """FSDP2 on the dp_shard slice of a (4, 2) mesh with ``reshard_after_forward=2``
    (each rank's post-forward mesh is a view of its own row), on a fake world."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh as torch_init
    from torch.distributed.fsdp import fully_shard

    from fmesh.device_mesh import init_device_mesh

    fmesh.init_fake_world(8, rank)
    new_groups = count_new_group()
    out: dict[str, Any] = {}
    for kind, init in (("torch", torch_init), ("fmesh", init_device_mesh)):
        dm = init("cpu", (4, 2), mesh_dim_names=("dp_shard", "tp"))
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        new_groups[0] = 0
        fully_shard(model[0], mesh=dm["dp_shard"], reshard_after_forward=2)
        fully_shard(model, mesh=dm["dp_shard"], reshard_after_forward=2)
        state: Any = fully_shard.state(model[0])  # type: ignore[attr-defined]  # torch's stub lacks it
        post = state._fsdp_param_group.post_forward_mesh_info.mesh
        out[kind] = (_answers(post), new_groups[0])
    fmesh.destroy()
    dist.destroy_process_group()
    return out


def test_fsdp2_on_a_slice_int_reshard_makes_no_torch_group(tmp_path: Path) -> None:
    for rank in (0, 5):
        (out,) = run_spawn(
            fsdp_on_a_slice_job, 1, rank, tmp_path=tmp_path / str(rank)
        ).values()
        (theirs, their_calls), (ours, our_calls) = out["torch"], out["fmesh"]
        assert ours == theirs
        assert their_calls == 8 and our_calls == 0, (their_calls, our_calls)


def _mlp() -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))


def _fsdp_steps(init: Any, new_groups: list[int]) -> dict[str, Any]:
    """FSDP2 with ``reshard_after_forward=2`` on a 4-rank mesh and on an HSDP mesh
    made by ``_unflatten``: losses, and torch ``new_group`` calls from sharding on."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    fsdp_mesh = init("cpu", (WORLD,), mesh_dim_names=("dp",))
    root = init("cpu", (WORLD,), mesh_dim_names=("world",))
    hsdp_mesh = root._unflatten(0, (1, WORLD), ("dp_replicate", "dp_shard"))
    out: dict[str, Any] = {}
    for name, mesh in (("fsdp", fsdp_mesh), ("hsdp", hsdp_mesh)):
        new_groups[0] = 0
        model = _mlp()
        fully_shard(model[0], mesh=mesh, reshard_after_forward=2)
        fully_shard(model, mesh=mesh, reshard_after_forward=2)
        losses = sgd_losses(model, seed=dist.get_rank(), steps=3)
        out[name] = {"losses": losses, "new_group": new_groups[0]}
    return out


def fsdp_job(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh as torch_init

    from fmesh.device_mesh import init_device_mesh

    dist.init_process_group("gloo", rank=rank, world_size=world)
    new_groups = count_new_group()
    theirs = _fsdp_steps(torch_init, new_groups)
    created = fmesh.cache_stats().created
    ours = _fsdp_steps(init_device_mesh, new_groups)
    return {"torch": theirs, "fmesh": ours, "created": fmesh.cache_stats().created - created}


def test_fsdp2_int_reshard_makes_no_torch_group(tmp_path: Path) -> None:
    outs = run_spawn(fsdp_job, WORLD, tmp_path=tmp_path, timeout=240).values()
    for rank, out in enumerate(outs):
        for name in ("fsdp", "hsdp"):
            theirs, ours = out["torch"][name], out["fmesh"][name]
            # Each fully_shard call builds its post-forward (2, 2) mesh: torch makes
            # its 2 + 2 groups by new_group on every rank, twice.
            assert theirs["new_group"] == 8, (rank, name, theirs)
            assert ours["new_group"] == 0, (rank, name, ours)
            assert ours["losses"] == theirs["losses"], (rank, name)
        assert out["created"] > 0  # fmesh made the post-forward groups instead


def instance_views_job(rank: int, world: int) -> dict[str, Any]:
    """Views of one instance on 4 gloo ranks: each rank its own row (as FSDP2 on a
    slice), and one row on every rank (ranks outside it hold no group)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from fmesh.device_mesh import init_device_mesh

    dist.init_process_group("gloo", rank=rank, world_size=world)
    new_groups = count_new_group()
    root = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    out: dict[str, Any] = {}
    for name, tensor in (("own_row", root["tp"].mesh), ("row_0", root.mesh[0])):
        dm = DeviceMesh("cpu", tensor.view(1, -1))
        x = torch.tensor([float(rank)])
        if dm.get_coordinate() is not None:
            dist.all_reduce(x, group=dm.get_group(1))
        out[name] = (_answers(dm)[:4], x.item())
    out["new_group"] = new_groups[0]
    return out


def test_views_of_one_instance_on_gloo(tmp_path: Path) -> None:
    outs = run_spawn(instance_views_job, WORLD, tmp_path=tmp_path, timeout=120).values()
    for rank, out in enumerate(outs):
        row = [0, 1] if rank < 2 else [2, 3]
        # Each rank its own row: a (1, 2) mesh with its groups, all-reduced within.
        assert out["own_row"] == (([row], (0, rank % 2), None, [[rank], row]), sum(row))
        # Row 0 on every rank: ranks 2 and 3 are outside it, as on torch.
        if rank < 2:
            assert out["row_0"] == (([[0, 1]], (0, rank), None, [[rank], [0, 1]]), 1.0)
        else:
            assert out["row_0"] == (([[0, 1]], None, None, None), rank)
        assert out["new_group"] == 0, rank
