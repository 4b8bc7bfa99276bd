"""Training on meshes built the torchtitan way, through fmesh's one-import change.

torchtitan's ``ParallelDims.build_mesh`` calls (``build`` in titan_recipe.py)
with ``fmesh.device_mesh.init_device_mesh`` in place of torch's, then what a
trainer does with the meshes: DTensor, tensor parallel, FSDP2 (``reshard_after_forward``
as a bool and as an int), HSDP, DCP save/load and ``torch.compile(fullgraph=True)``
of a function that slices the mesh and redistributes. In the same processes the same
steps run on meshes from torch's own ``init_device_mesh``, with the same seeds, and
every number is compared side by side. 4 gloo ranks, one job.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from _dist import run_spawn
from titan_recipe import (
    CONFIG,
    OTHER,
    build,
    count_new_group,
    full_params,
    mlp,
    sgd_losses,
    tp_plan,
)

import fmesh

WORLD = 4
# (pp, dp_replicate, dp_shard, cp, tp): pure FSDP over all 4 ranks, so that an int
# reshard_after_forward (2) is a proper divisor of the shard group size (4).
FSDP4 = (1, 1, 4, 1, 1)


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any, str]:
    """What ``fn`` did: ("ok", its value, "") or ("error", the class it raised, the
    first line of its message)."""
    try:
        return "ok", fn(), ""
    except Exception as err:
        return "error", type(err).__name__, (str(err).strip().splitlines() or [""])[0]


def _slice_and_redistribute(d: Any, mesh: Any) -> Any:
    """Compiled with fullgraph=True: slices the 2-d mesh by name and redistributes."""
    from torch.distributed.tensor import Replicate, Shard

    tp = mesh["tp"]
    row = d.redistribute(mesh, [Shard(0), Replicate()])
    return row.to_local() * tp.size() + mesh.get_local_rank("tp")


def _redistribute(d: Any, mesh: Any) -> Any:
    """Compiled with fullgraph=True: redistributes on a mesh sliced outside."""
    from torch.distributed.tensor import Replicate

    return d.redistribute(mesh, [Replicate()]).to_local() + 1


def _steps(kind: str, init: Any, tmp: Path, new_groups: list[int]) -> dict[str, Any]:
    """Every step on the meshes ``init`` builds (torchtitan's calls); what it saw, and
    torch's ``new_group`` calls (counted in ``new_groups``) before and in the last."""
    import torch
    from torch.distributed.checkpoint.state_dict_loader import load
    from torch.distributed.checkpoint.state_dict_saver import save
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import parallelize_module

    out: dict[str, Any] = {}
    start, created = new_groups[0], fmesh.cache_stats().created
    meshes = build(init, CONFIG)  # dp_shard=2 x tp=2
    dense = meshes["dense"]
    mesh2 = dense["dp_shard", "tp"]
    tp, dp_shard = meshes["tp"], meshes["dp_shard"]
    out["meshes"] = {
        "2d": (mesh2.mesh.tolist(), mesh2.mesh_dim_names, mesh2.get_coordinate()),
        "tp": tp.mesh.tolist(),
        "dp_shard": dp_shard.mesh.tolist(),
    }

    # DTensor: shard both dims over the 2-d mesh, redistribute, gather.
    x = torch.arange(8 * 12, dtype=torch.float32).reshape(8, 12)
    d = distribute_tensor(x, mesh2, [Shard(0), Shard(1)])
    rep = d.redistribute(mesh2, [Replicate(), Replicate()])
    half = d.redistribute(mesh2, [Shard(0), Replicate()])
    out["dtensor"] = {
        "local": d.to_local().tolist(),
        "half": half.to_local().tolist(),
        "replicated": torch.equal(rep.to_local(), x),
        "full": torch.equal(d.full_tensor(), x),
    }

    # Tensor parallel on the tp slice; the same model unsharded as reference.
    model, ref = mlp(), mlp()
    parallelize_module(model, tp, tp_plan())
    torch.manual_seed(7)
    inp = torch.randn(4, 8)
    y, y_ref = model(inp), ref(inp)
    y.sum().backward()
    y_ref.sum().backward()
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    out["tp"] = {
        "out": y.tolist(),
        "grads": {n: g.tolist() for n, g in grads.items()},
        "close_to_unsharded": torch.allclose(y, y_ref, atol=1e-6)
        and all(
            torch.allclose(grads[n], p.grad, atol=1e-6) for n, p in ref.named_parameters()
        ),
    }

    # FSDP2 on dp_shard over TP (torchtitan's 2-d), reshard_after_forward=True.
    fsdp_tp = mlp()
    parallelize_module(fsdp_tp, tp, tp_plan())
    fully_shard(fsdp_tp, mesh=dp_shard, reshard_after_forward=True)
    out["fsdp_tp"] = {
        "losses": sgd_losses(fsdp_tp, seed=dp_shard.get_local_rank()),
        "params": full_params(fsdp_tp),
        "local": {n: p.to_local().tolist() for n, p in fsdp_tp.named_parameters()},
    }

    # DCP: save the FSDP+TP state, load it into a fresh model sharded the same way.
    ckpt = tmp / kind
    state = {k: v.full_tensor() for k, v in fsdp_tp.state_dict().items()}
    save(fsdp_tp.state_dict(), checkpoint_id=str(ckpt))
    fresh = mlp()
    parallelize_module(fresh, tp, tp_plan())
    fully_shard(fresh, mesh=dp_shard)
    for p in fresh.parameters():
        p.data.zero_()
    target = fresh.state_dict()
    load(target, checkpoint_id=str(ckpt))
    out["dcp"] = {
        "restored": all(torch.equal(target[k].full_tensor(), v) for k, v in state.items()),
        "placements": {k: str(v.placements) for k, v in target.items()},
    }
    if kind == "fmesh":
        # torch's checkpoint, loaded onto fmesh's meshes.
        theirs = mlp()
        parallelize_module(theirs, tp, tp_plan())
        fully_shard(theirs, mesh=dp_shard)
        target = theirs.state_dict()
        load(target, checkpoint_id=str(tmp / "torch"))
        out["dcp"]["from_torch"] = {k: v.full_tensor().tolist() for k, v in target.items()}

    # torch.compile(fullgraph=True): slice the mesh inside, redistribute.
    torch._dynamo.reset()
    eager = _slice_and_redistribute(d, mesh2)
    compiled = torch.compile(_slice_and_redistribute, fullgraph=True, backend="aot_eager")
    out["compile_slice"] = _outcome(lambda: torch.equal(compiled(d, mesh2), eager))
    out["eager_slice"] = eager.tolist()
    torch._dynamo.reset()
    on_tp = distribute_tensor(x, tp, [Shard(1)])
    eager = _redistribute(on_tp, tp)
    compiled = torch.compile(_redistribute, fullgraph=True, backend="aot_eager")
    out["compile_redistribute"] = _outcome(lambda: torch.equal(compiled(on_tp, tp), eager))
    torch._dynamo.reset()

    # HSDP on (dp_replicate=2, dp_shard=2), a second root of another shape.
    hsdp_mesh = build(init, OTHER)["dense"]["dp_replicate", "dp_shard"]
    hsdp = mlp()
    fully_shard(hsdp, mesh=hsdp_mesh)
    out["hsdp"] = {
        "mesh": hsdp_mesh.mesh.tolist(),
        "losses": sgd_losses(hsdp, seed=int(torch.distributed.get_rank())),
        "params": full_params(hsdp),
    }

    # FSDP2 over 4 ranks, reshard_after_forward=2: FSDP builds its own post-forward
    # mesh (DeviceMesh(device_type, tensor), a new root) for groups of 2.
    fsdp4_mesh = build(init, FSDP4)["dp_shard"]
    out["new_group"] = new_groups[0] - start
    out["created"] = fmesh.cache_stats().created - created
    start = new_groups[0]
    fsdp4 = mlp()
    for layer in (fsdp4.w1, fsdp4.w2):
        fully_shard(layer, mesh=fsdp4_mesh, reshard_after_forward=2)
    fully_shard(fsdp4, mesh=fsdp4_mesh, reshard_after_forward=True)
    out["fsdp_int"] = {
        "mesh": fsdp4_mesh.mesh.tolist(),
        "losses": sgd_losses(fsdp4, seed=int(torch.distributed.get_rank())),
        "params": full_params(fsdp4),
        "local": {n: p.to_local().tolist() for n, p in fsdp4.named_parameters()},
    }
    out["new_group_int"] = new_groups[0] - start
    return out


def training_job(rank: int, world: int, tmp: Path) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh as torch_init

    from fmesh.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    new_groups = count_new_group()
    out = {"torch": _steps("torch", torch_init, tmp, new_groups)}
    dist.barrier()  # torch's checkpoint is complete on every rank
    out["fmesh"] = _steps("fmesh", init_device_mesh, tmp, new_groups)
    dist.barrier()
    return out


def test_training_on_titan_meshes_matches_torch(tmp_path: Path) -> None:
    job = run_spawn(
        training_job, WORLD, tmp_path / "ckpt", tmp_path=tmp_path / "job", timeout=150
    )
    for rank, out in enumerate(job.values()):
        ours, theirs = out["fmesh"], out["torch"]
        # The same meshes, shards, outputs, gradients, losses and parameters, bit for
        # bit: the same collectives over the same groups in the same order.
        for step in ("meshes", "dtensor", "tp", "fsdp_tp", "hsdp", "fsdp_int"):
            assert ours[step] == theirs[step], (rank, step)
        assert ours["dtensor"]["replicated"] and ours["dtensor"]["full"], rank
        assert ours["tp"]["close_to_unsharded"], rank
        # DCP: each run restores its own checkpoint; fmesh's meshes load torch's.
        assert ours["dcp"]["restored"] and theirs["dcp"]["restored"], rank
        assert ours["dcp"]["placements"] == theirs["dcp"]["placements"], rank
        assert ours["dcp"]["from_torch"] == theirs["fsdp_tp"]["params"], rank
        # torch.compile(fullgraph=True): the same outcome on both meshes, and it is
        # the eager result.
        assert ours["eager_slice"] == theirs["eager_slice"], rank
        for key in ("compile_slice", "compile_redistribute"):
            assert ours[key][:2] == theirs[key][:2], (rank, key, ours[key], theirs[key])
            assert ours[key][:2] == ("ok", True), (rank, key, ours[key])
        # fmesh's meshes: every group made by fmesh, none by torch's new_group (which
        # made torch's meshes' groups).
        assert ours["created"] > 0 and ours["new_group"] == 0, (rank, ours["new_group"])
        assert theirs["created"] == 0 and theirs["new_group"] > 0, rank
        # FSDP's post-forward mesh for an int reshard_after_forward too: a new root
        # over a view of the mesh's rank map (DeviceMesh(device_type, tensor)).
        assert ours["new_group_int"] == 0 < theirs["new_group_int"], rank
