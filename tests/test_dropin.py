"""``fmesh.device_mesh.init_device_mesh`` next to torch's own, on 4 and 8 gloo ranks.

Each job builds every mesh twice on the same ranks -- with torch's ``init_device_mesh``
and with fmesh's -- and records every public answer of both and of torch's own
operations on both (``dropin_facts.py``): slicing in every order, ``_flatten``,
``_unflatten``, ``_concatenate``, ``from_group``, pickling, errors. The expected
values are torch's mesh's answers. A second pair of jobs trains with FSDP2 and tensor
parallel, and saves and loads a DCP checkpoint, on each library's mesh.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _compare import diff, no_more_groups, results
from _dist import run_spawn
from dropin_facts import Facts, answers, init_errors, num_groups, operations, outcome

import fmesh


def _cases(world: int) -> dict[str, tuple[tuple[int, ...], tuple[str, ...] | None]]:
    """(mesh_shape, mesh_dim_names) of each mesh built both ways."""
    half = world // 2
    cases: dict[str, tuple[tuple[int, ...], tuple[str, ...] | None]] = {
        "named": ((2, half), ("dp", "tp")),
        "unnamed": ((2, half), None),
        "world": ((world,), None),
        "world_named": ((world,), ("world",)),
        "part": ((half,), ("dp",)),
    }
    if world == 8:
        cases["3d"] = ((2, 2, 2), ("pp", "dp", "tp"))
        cases["part_unnamed"] = ((2, 2), None)
    return cases


def side_by_side_job(rank: int, world: int) -> Facts:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.device_mesh import init_device_mesh as torch_init

    from fmesh.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    out: Facts = {"cases": {}}
    for tag, (shape, names) in _cases(world).items():
        theirs = torch_init("cpu", shape, mesh_dim_names=names)
        before = num_groups()
        ours = init_device_mesh("cpu", shape, mesh_dim_names=names)
        created = num_groups() - before
        again = init_device_mesh("cpu", shape, mesh_dim_names=names)
        out["cases"][tag] = {
            "torch": answers(theirs),
            "fmesh": answers(ours),
            "equal": ours == theirs,
            "hash_equal": hash(ours) == hash(theirs),
            "created": created,
            "repeat_is_new_and_equal": again is not ours and again == ours,
            "repeat_created": num_groups() - before - created,
            "torch_ops": operations(theirs, tag),
            "fmesh_ops": operations(ours, tag),
        }
    world_group = dist.group.WORLD
    assert world_group is not None
    unnamed = init_device_mesh("cpu", (world,))
    out["from_group_world"] = DeviceMesh.from_group(world_group, "cpu") == unnamed
    out["world_is_default_group"] = unnamed.get_group() is world_group
    out["leak"] = _leak(world)
    out["errors"] = {
        "torch": init_errors(torch_init, world),
        "fmesh": init_errors(init_device_mesh, world),
    }
    dist.barrier()
    return out


def _leak(world: int) -> Facts:
    """Two roots of one shape with different names (the reported name leak), and a
    flatten fmesh itself realized, which torch's ``_flatten`` reuses."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from fmesh.device_mesh import init_device_mesh

    half = world // 2
    a = init_device_mesh("cpu", (2, half), mesh_dim_names=("dp", "tp"))
    b = init_device_mesh("cpu", (2, half), mesh_dim_names=("x", "y"))
    out: Facts = {
        "a[x]": outcome(lambda: a["x"]),
        "b[dp]": outcome(lambda: b["dp"]),
        "a flatten x": outcome(lambda: a["dp", "tp"]._flatten("x").mesh_dim_names),
    }
    # Reversed: torch would create groups of its own (sorted ranks).
    flat = fmesh.realize(fmesh.flatten(fmesh.make_mesh({"dp": 2, "tp": half}), ("tp", "dp")))
    before = num_groups()
    got = DeviceMesh._concatenate([a["tp"], a["dp"]])._flatten("tp_dp")
    out["reuse_new_groups"] = num_groups() - before
    out["reuse_is_fmesh_group"] = got.get_group() is flat.group("tp_dp")
    out["tp_dp ranks"] = dist.get_process_group_ranks(got.get_group())
    out["a group tp_dp"] = a.get_group("tp_dp") is got.get_group()
    out["b group tp_dp"] = outcome(lambda: b.get_group("tp_dp") is got.get_group())
    return out


@pytest.fixture(scope="module", params=[4, 8])
def side_by_side(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, list[Facts]]:
    world: int = request.param
    job = run_spawn(
        side_by_side_job,
        world,
        tmp_path=tmp_path_factory.mktemp(f"dropin{world}"),
        timeout=150,
    )
    return world, job.values()


def test_every_answer_and_operation_matches_torch(
    side_by_side: tuple[int, list[Facts]],
) -> None:
    world, outs = side_by_side
    for rank, out in enumerate(outs):
        for tag, case in out["cases"].items():
            assert diff(case["torch"], case["fmesh"]) == [], (rank, tag)
            torch_ops, fmesh_ops = case["torch_ops"], case["fmesh_ops"]
            assert diff(results(torch_ops), results(fmesh_ops)) == [], (rank, tag)
            # torch's methods on fmesh's roots create groups through fmesh's memo.
            assert no_more_groups(torch_ops, fmesh_ops) == [], (rank, tag)
            assert case["equal"] is True and case["hash_equal"] is True, (rank, tag)
            # Not vacuous: slicing, flattening and errors were all exercised.
            ops = case["fmesh_ops"]
            assert len(ops) >= 5, tag
            if case["fmesh"]["names"] is None:
                assert ops["getitem unknown"]["result"] == ("raises", "RuntimeError")
                assert ops["flatten default"]["result"] == ("raises", "RuntimeError")
                assert case["fmesh"]["root_dim"] is None
    named = outs[0]["cases"]["named"]["fmesh_ops"]
    assert named["getitem ('tp', 'dp')"]["result"] == ("raises", "KeyError")  # as torch
    assert named["getitem ('tp',)"]["result"]["mesh"] == list(range(world // 2))


def test_unnamed_meshes_are_torchs_unnamed_meshes(
    side_by_side: tuple[int, list[Facts]],
) -> None:
    _, outs = side_by_side
    for out in outs:
        for tag in ("unnamed", "world"):
            facts = out["cases"][tag]["fmesh"]
            assert facts["names"] is None
            assert facts["by_name"] == ("raises", "TypeError")  # iterating None, as torch
            assert facts["group_unknown"] == ("raises", "KeyError")
        assert out["from_group_world"] is True
        assert out["world_is_default_group"] is True  # the 1-d world mesh reuses it


def test_ranks_beyond_the_mesh_get_torchs_non_participating_mesh(
    side_by_side: tuple[int, list[Facts]],
) -> None:
    world, outs = side_by_side
    for rank, out in enumerate(outs):
        part = out["cases"]["part"]["fmesh"]
        member = rank < world // 2
        assert (part["coordinate"] is None) is not member
        assert (
            part["groups"][0] == "raises"
            if not member
            else part["groups"] == (tuple(range(world // 2)),)
        )


def test_fewer_groups_and_a_repeated_call_reuses_the_groups(
    side_by_side: tuple[int, list[Facts]],
) -> None:
    _, outs = side_by_side
    for out in outs:
        for tag, case in out["cases"].items():
            # A new root per call, as torch's; its groups come from the memo.
            assert case["repeat_is_new_and_equal"] is True, tag
            assert case["repeat_created"] == 0, tag
        # torch created these very groups just before: fmesh creates its own, for
        # this rank only, and none for the world dim.
        assert out["cases"]["world"]["created"] == 0
        assert out["cases"]["named"]["created"] <= 2


def test_names_of_one_root_do_not_leak_into_another(
    side_by_side: tuple[int, list[Facts]],
) -> None:
    world, outs = side_by_side
    for out in outs:
        leak = out["leak"]
        assert leak["a[x]"] == ("raises", "KeyError")
        assert leak["b[dp]"] == ("raises", "KeyError")
        assert leak["a flatten x"] == ("x",)
        # A flatten fmesh realized is the very group torch's _flatten hands back, its
        # ranks in coordinate order (tp major, dp minor).
        assert leak["reuse_new_groups"] == 0
        assert leak["reuse_is_fmesh_group"] is True
        half = world // 2
        assert leak["tp_dp ranks"] == [t + half * d for t in range(half) for d in range(2)]
        assert leak["a group tp_dp"] is True
        # By design, a flatten fmesh realized is offered to every named root whose dims
        # it flattens (by layout): B's dims flatten to the same layout.
        assert leak["b group tp_dp"] is True


ERROR_MESSAGES = {
    "duplicate names": r"Each mesh_dim_name must be unique",
    "names length": r"mesh_shape and mesh_dim_names should have same length",
    "device index": r"Device type with index is not supported but got '?cpu:0",
    "redundant override": r"Found redundant dim index 0 and name dp in backend_override",
    "unknown override name": r"Found invalid keys in backend_override: got \['cp'\]",
    "unknown override index": r"Found invalid keys in backend_override: got \[42\]",
    "too large": r"Mesh should not be bigger than default world size",
}


def test_errors_have_torchs_types_and_meaning(side_by_side: tuple[int, list[Facts]]) -> None:
    import re

    _, outs = side_by_side
    for out in outs:
        theirs, ours = out["errors"]["torch"], out["errors"]["fmesh"]
        assert set(theirs) == set(ours) == set(ERROR_MESSAGES)
        for case, pattern in ERROR_MESSAGES.items():
            assert theirs[case] is not None and ours[case] is not None, case
            assert theirs[case][0][0] in ours[case][0], (case, theirs[case], ours[case])
            assert "DeviceMeshError" in ours[case][0] and "MeshError" in ours[case][0]
            assert re.search(pattern, ours[case][1]), (case, ours[case][1])
            assert re.search(pattern, theirs[case][1]), (case, theirs[case][1])


# -- DTensor, FSDP2, tensor parallel, DCP ----------------------------------------------------

STEPS = 3


def training_job(rank: int, world: int, flavor: str, ckpt: str) -> Facts:
    """FSDP2 over dp and tensor parallel over tp, DTensor round trips and a DCP
    checkpoint, on ``flavor``'s mesh (separate jobs: the two meshes are equal, and
    DTensor's caches would hand one's object to the other)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.checkpoint.state_dict_loader import load
    from torch.distributed.checkpoint.state_dict_saver import save
    from torch.distributed.device_mesh import init_device_mesh as torch_init
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from fmesh.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    init = init_device_mesh if flavor == "fmesh" else torch_init
    dm = init("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    parallelize_module(model, dm["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=dm["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(100 * dm.get_local_rank("dp") + step)
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)
        loss = nn.functional.mse_loss(model(x), y)
        torch.autograd.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.item()))
    full = torch.arange(8.0 * 12).reshape(8, 12)
    sharded = distribute_tensor(full, dm, [Shard(0), Shard(1)])
    save({"w": sharded}, checkpoint_id=f"{ckpt}/{flavor}")
    flat = dm["dp", "tp"]._flatten()
    target = {"w": distribute_tensor(torch.zeros(8, 12), flat, [Shard(0)])}
    load(target, checkpoint_id=f"{ckpt}/{flavor}")
    out = {
        "losses": losses,
        "local": sharded.to_local().tolist(),
        "roundtrip": bool(torch.equal(sharded.full_tensor(), full)),
        "loaded_local": target["w"].to_local().tolist(),
        "loaded_full": bool(torch.equal(target["w"].full_tensor(), full)),
    }
    dist.barrier()
    return out


def test_dtensor_fsdp2_tp_and_dcp_match_torch(tmp_path: Path) -> None:
    runs = {
        flavor: run_spawn(
            training_job, 4, flavor, str(tmp_path), tmp_path=tmp_path / flavor, timeout=150
        ).values()
        for flavor in ("torch", "fmesh")
    }
    for rank in range(4):
        theirs, ours = runs["torch"][rank], runs["fmesh"][rank]
        assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-6, abs=1e-6)
        assert ours["local"] == theirs["local"]
        assert ours["loaded_local"] == theirs["loaded_local"]
        assert ours["roundtrip"] is ours["loaded_full"] is True
    # Not vacuous: the two dp replicas saw different batches.
    assert runs["fmesh"][0]["losses"] != runs["fmesh"][2]["losses"]


def mismatch_job(rank: int, world: int) -> Facts:
    """Rank 0 asks for another mesh than the others: an error on every rank, no hang."""
    import torch.distributed as dist

    from fmesh.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    # Every rank through gloo's connectFullMesh before any can raise and exit: a rank
    # still connecting to one that left fails inside init_process_group instead.
    dist.barrier()
    # Both shapes create groups (a size-1 dim gets a group of its own), so every rank
    # agrees first. Names alone that differ over the same groups are no mismatch for
    # torch's API (tests/test_plan_launch.py).
    shape = (1, world) if rank == 0 else (2, world // 2)
    try:
        init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    except fmesh.MeshMismatchError as err:
        return {"error": "MeshMismatchError", "message": str(err)}
    return {"error": None}


def test_ranks_that_disagree_get_an_error_instead_of_a_hang(tmp_path: Path) -> None:
    outs = run_spawn(mismatch_job, 4, tmp_path=tmp_path, timeout=60).values()
    for out in outs:
        assert out["error"] == "MeshMismatchError"
        assert "Mesh(dp=2, tp=2)" in out["message"], out["message"]
        assert "Mesh(dp=1, tp=4)" in out["message"], out["message"]
