"""The DeviceMesh fmesh hands to torch behaves like one torch built itself.

On 8 gloo ranks, each recipe builds a DeviceMesh twice -- once with torch's own API
from ``init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))`` and
once as ``fmesh.realize(...).to_device_mesh("cpu")`` of the same mesh -- and records
every public answer of both, and of torch's own operations on both (slicing,
``_flatten``, ``_unflatten``, ``_concatenate``, pickling). The expected values are
torch's mesh's answers (and fmesh's pure queries, for group order); a rank that hangs
fails the job. Differences by design are pinned as such (torch sorts the ranks of the
groups it creates; fmesh keeps coordinate order).

A second job trains a tiny MLP with FSDP2 (1-d, HSDP, ``dp_mesh_dims`` where torch has
it) and FSDP2 + tensor parallel on torch's mesh and on fmesh's, and compares losses,
and checks a DCP checkpoint saved on one fmesh mesh loads on another.
"""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _compare import diff
from _dist import run_spawn

import fmesh
from fmesh import Mesh

WORLD = 8
SUBWORLD = (6, 1, 3, 4)
"""Ranks of a 2x2 mesh over part of the world (the rest are non-participating)."""

Facts = dict[str, Any]


def base_mesh() -> Mesh:
    return fmesh.make_mesh({"pp": 2, "dp": 2, "tp": 2})


def _tp_pp() -> Mesh:
    return fmesh.slice(fmesh.flatten(base_mesh(), ("tp", "pp")), "tp_pp")


def fmesh_recipes() -> dict[str, Mesh]:
    """fmesh's side of each recipe, in the order the job converts them.

    The slices come first, so they hang off made-up roots (``_rest0`` ...); the root
    mesh and the slices after it reuse the DeviceMesh of an existing root.
    """
    return {
        "sub_dp_tp": fmesh.slice(base_mesh(), "dp", "tp"),
        "flatten_tp_pp": _tp_pp(),
        "unflatten": fmesh.unflatten(_tp_pp(), "tp_pp", {"x": 2, "y": 2}),
        "root": base_mesh(),
        "reordered": fmesh.slice(base_mesh(), "tp", "dp"),
        "sub_pp": fmesh.slice(base_mesh(), "pp"),
        "subworld": fmesh.make_mesh({"dp": 2, "tp": 2}, ranks=SUBWORLD),
    }


# -- worker side --------------------------------------------------------------------------


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or ("raises", exception class name) -- torch's answer may be an
    error."""
    try:
        return fn(*args)
    except Exception as err:  # compared between torch's mesh and fmesh's
        return ("raises", type(err).__name__)


def _ranks(pg: Any) -> tuple[int, ...]:
    import torch.distributed as dist

    return tuple(dist.get_process_group_ranks(pg))


def _num_groups() -> int:
    from torch.distributed import distributed_c10d as c10d

    return len(c10d._world.pg_map)


def _facts(dm: Any) -> Facts:
    """Every public answer of ``dm`` on this rank."""
    import warnings

    n = dm.ndim
    names = dm.mesh_dim_names
    facts: Facts = {
        "coordinate": dm.get_coordinate(),
        "size": dm.size(),
        "sizes": tuple(dm.size(i) for i in range(n)),
        "ndim": n,
        "shape": tuple(dm.shape),
        "names": names,
        "mesh": _try(lambda: dm.mesh.tolist()),
        "device_type": dm.device_type,
        "root_size": dm._get_root_mesh().size(),
        "hash_eq_self": hash(dm) == hash(dm),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        facts["local_ranks"] = _try(lambda: tuple(dm.get_local_rank(i) for i in range(n)))
        facts["groups"] = _try(lambda: tuple(_ranks(dm.get_group(i)) for i in range(n)))
        facts["all_groups"] = _try(lambda: tuple(_ranks(g) for g in dm.get_all_groups()))
        facts["groups_by_name"] = _try(
            lambda: tuple(_ranks(dm.get_group(name)) for name in names or ())
        )
        if n == 1:
            facts["group_default"] = _try(lambda: _ranks(dm.get_group()))
            facts["local_rank_default"] = _try(lambda: dm.get_local_rank())
    return facts


def _sliced(dm: Any, names: str | tuple[str, ...]) -> Facts:
    return _facts(dm[names])


def _operations(dm: Any, tag: str) -> Facts:
    """torch's operations on ``dm`` (each run on every rank, in the same order)."""
    import warnings

    from torch.distributed.device_mesh import DeviceMesh

    names = tuple(dm.mesh_dim_names)
    out: Facts = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            out[f"getitem {name}"] = _try(_sliced, dm, name)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                out[f"getitem {a},{b}"] = _try(_sliced, dm, (a, b))
                out[f"getitem {b},{a}"] = _try(_sliced, dm, (b, a))
        before = _num_groups()
        flat = _try(lambda: dm._flatten(f"{tag}_flat"))
        out["flatten"] = flat if isinstance(flat, tuple) else _facts(flat)
        out["flatten_new_groups"] = _num_groups() - before
        if not isinstance(flat, tuple) and dm.ndim > 1:
            # getitem by the flattened name: torch allows it on the root only.
            out["getitem flat on root"] = _try(_sliced, dm._get_root_mesh(), f"{tag}_flat")
            out["getitem flat"] = _try(_sliced, dm, f"{tag}_flat")
        size0 = dm.size(0)
        out["unflatten"] = _try(
            lambda: _facts(dm._unflatten(0, (2, size0 // 2), (f"{tag}_u", f"{tag}_v")))
        )
        if dm.ndim > 1:
            out["concatenate reversed"] = _try(
                lambda: _facts(DeviceMesh._concatenate([dm[n] for n in reversed(names)]))
            )
        again = pickle.loads(pickle.dumps(dm))
        out["pickle"] = _facts(again)
        out["pickle_eq"] = again == dm
    return out


def _torch_recipes(root: Any) -> dict[str, Callable[[], Any]]:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    def tp_pp() -> Any:
        return DeviceMesh._concatenate([root["tp"], root["pp"]])._flatten("tp_pp")

    return {
        "sub_dp_tp": lambda: root["dp", "tp"],
        "flatten_tp_pp": tp_pp,
        "unflatten": lambda: tp_pp()._unflatten(0, (2, 2), ("x", "y")),
        "root": lambda: root,
        "reordered": lambda: DeviceMesh._concatenate([root["tp"], root["dp"]]),
        "sub_pp": lambda: root["pp"],
        "subworld": lambda: DeviceMesh(
            "cpu", torch.tensor(SUBWORLD).reshape(2, 2), mesh_dim_names=("dp", "tp")
        ),
    }


def conformance_job(rank: int, world: int) -> Facts:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    fmesh.realize(base_mesh())  # initializes the default group
    torch_root = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    torch_recipes = _torch_recipes(torch_root)
    out: Facts = {"recipes": {}}
    for name, mesh in fmesh_recipes().items():
        tdm = torch_recipes[name]()
        realized = fmesh.realize(mesh)
        before = _num_groups()
        fdm = realized.to_device_mesh("cpu")
        case: Facts = {
            "convert_new_groups": _num_groups() - before,
            "memoized": realized.to_device_mesh("cpu") is fdm,
            "torch": _facts(tdm),
            "fmesh": _facts(fdm),
            "equal": tdm == fdm,
            "torch_ops": _operations(tdm, name),
            "fmesh_ops": _operations(fdm, name),
        }
        out["recipes"][name] = case
        back = fmesh.from_device_mesh(tdm)
        case["from_torch"] = {
            "coordinate": fmesh.coordinate(back, rank),
            "instance": _try(lambda: fmesh.instance(back, rank).tolist()),  # noqa: B023
            "groups": tuple(fmesh.group(back, a, rank) for a in back.axis_names)
            if fmesh.coordinate(back, rank) is not None
            else None,
            "names": back.axis_names,
        }
        back_f = fmesh.from_device_mesh(fdm)
        case["from_fmesh_equal"] = back_f == mesh
        # The same function (ranks, groups in order), whatever the representation.
        case["from_fmesh_same"] = fmesh.same_ranks(back_f, mesh) and all(
            fmesh.same_groups(back_f, a, mesh, a) for a in mesh.axis_names
        )
    out["from_group"] = _from_group_facts(rank)
    out["counting"] = _counting(rank)
    dist.barrier()
    return out


def _member_group(pg: object) -> Any:
    """A group this rank is in (torch 2.14+ types non-members as a sentinel)."""
    from torch.distributed import ProcessGroup

    assert isinstance(pg, ProcessGroup), pg
    return pg


def _from_group_facts(rank: int) -> Facts:
    """``from_device_mesh`` of meshes torch builds from existing groups."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    out: Facts = {}
    rows = [[5, 2, 7, 0], [3, 6, 1, 4]]
    groups = [dist.new_group(row) for row in rows]
    cols = [[rows[0][i], rows[1][i]] for i in range(4)]
    col_groups = [dist.new_group(col) for col in cols]
    mine = _member_group(next(g for g, row in zip(groups, rows) if rank in row))
    mine_col = _member_group(next(g for g, col in zip(col_groups, cols) if rank in col))
    one = DeviceMesh.from_group(mine, "cpu", mesh_dim_names=("w",))
    two = DeviceMesh.from_group(
        [mine_col, mine], "cpu", mesh=torch.tensor(rows), mesh_dim_names=("a", "b")
    )
    for name, dm in (("1d", one), ("2d", two)):
        back = fmesh.from_device_mesh(dm)
        out[name] = {
            "torch_mesh": dm.mesh.tolist(),
            "torch_groups": tuple(_ranks(g) for g in dm.get_all_groups()),
            "instance": fmesh.instance(back, rank).tolist(),
            "groups": tuple(fmesh.group(back, a, rank) for a in back.axis_names),
            "names": back.axis_names,
        }
    return out


def _counting(rank: int) -> Facts:
    """torch's ``_flatten`` of axes fmesh has realized reuses fmesh's groups."""
    import torch.distributed as dist

    out: Facts = {}
    base = base_mesh()
    # The reported bug: flatten dp x tp of a slice converted on its own.
    flat = fmesh.realize(fmesh.flatten(base, ("dp", "tp")))
    dm = fmesh.realize(fmesh.slice(base, "dp", "tp")).to_device_mesh("cpu")
    before = _num_groups()
    got = dm["dp", "tp"]._flatten("dp_tp")
    out["dp_tp"] = {
        "new_groups": _num_groups() - before,
        "is_fmesh_group": got.get_group() is flat.group("dp_tp"),
        "ranks": _ranks(got.get_group()),
    }
    # Non-adjacent and reversed: tp x pp realized by fmesh, flattened by torch.
    rev = fmesh.realize(fmesh.flatten(base, ("tp", "pp")))
    dm = fmesh.realize(base).to_device_mesh("cpu")
    from torch.distributed.device_mesh import DeviceMesh

    before = _num_groups()
    got = DeviceMesh._concatenate([dm["tp"], dm["pp"]])._flatten("tp_pp")
    out["tp_pp"] = {
        "new_groups": _num_groups() - before,
        "is_fmesh_group": got.get_group() is rev.group("tp_pp"),
        "ranks": _ranks(got.get_group()),
        "local_rank": got.get_local_rank(),
        "coordinate": got.get_coordinate(),
    }
    # The same flatten on a sub-world mesh, where some ranks are not members.
    sub = fmesh.make_mesh({"dp": 2, "tp": 2}, ranks=SUBWORLD)
    fmesh.realize(fmesh.flatten(sub, ("dp", "tp")))
    dm = fmesh.realize(sub).to_device_mesh("cpu")
    before = _num_groups()
    got = dm._flatten("dp_tp")
    out["subworld"] = {
        "new_groups": _num_groups() - before,
        "coordinate": got.get_coordinate(),
    }
    # Every rank still agrees on group creation afterwards.
    check = _member_group(dist.new_group(list(range(dist.get_world_size()))))
    total = __import__("torch").ones(1)
    dist.all_reduce(total, group=check)
    out["agree_after"] = float(total.item())
    return out


# -- parent side ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def conformance(tmp_path_factory: pytest.TempPathFactory) -> list[Facts]:
    job = run_spawn(
        conformance_job, WORLD, tmp_path=tmp_path_factory.mktemp("conformance"), timeout=150
    )
    return job.values()


_ORDERED = ("groups", "all_groups", "groups_by_name")


def normalized(facts: Any) -> Any:
    """Facts with group ranks as sets (torch sorts them, fmesh keeps coordinate order)
    and without the local ranks (the position in those groups); recursively."""
    if not isinstance(facts, dict):
        return facts
    out = {}
    for key, value in facts.items():
        if key in ("local_ranks", "local_rank_default"):
            continue
        if key in _ORDERED and not (isinstance(value, tuple) and value[:1] == ("raises",)):
            value = tuple(tuple(sorted(g)) for g in value)
        elif key == "group_default" and value[:1] != ("raises",):
            value = tuple(sorted(value))
        out[key] = normalized(value)
    return out


RECIPES = list(fmesh_recipes())
MADE_UP_ROOT = "sub_dp_tp"
"""The recipe converted before any mesh with all of pp, dp, tp: its root is made up
(``_rest0``, dp, tp) and has no groups of its own."""


RELABELED = ("reordered", "flatten_tp_pp", "unflatten")
"""Meshes torch can only hold with dims out of stride order (it builds them with
``_concatenate``), so it refuses to slice them in their own order -- and DTensor, which
slices meshes internally, fails on them. fmesh's DeviceMesh for these lists the ranks
instance by instance, each in the mesh's row-major order (same groups, coordinates
and ``mesh`` on every rank), so its dims slice in the mesh's order instead."""


@pytest.mark.parametrize("name", RECIPES)
def test_every_answer_and_operation_matches_torch(conformance: list[Facts], name: str) -> None:
    for rank, out in enumerate(conformance):
        case = out["recipes"][name]
        torch_ops = normalized(case["torch_ops"])
        fmesh_ops = normalized(case["fmesh_ops"])
        names = case["fmesh"]["names"]
        if name in RELABELED:
            # Differs by design: the stride order torch slices in is not the mesh's.
            if len(names) == 2:
                key = f"getitem {names[1]},{names[0]}"
                assert fmesh_ops.pop(key) == ("raises", "KeyError")
                assert torch_ops.pop(key)["mesh"] is not None
            # torch refuses (KeyError; NotImplementedError on torch 2.11).
            on_root = torch_ops.pop("getitem flat on root", None)
            assert on_root is None or on_root[0] == "raises", on_root
            fmesh_ops.pop("getitem flat on root", None)
        if name == MADE_UP_ROOT:
            # Differs by design: slicing a flattened name from the made-up root gives a
            # mesh without groups (torch's deprecated root-slicing path).
            assert fmesh_ops.pop("getitem flat on root")["groups"] == ("raises", "IndexError")
            assert torch_ops.pop("getitem flat on root")["groups"] != ("raises", "IndexError")
        assert diff(normalized(case["torch"]), normalized(case["fmesh"])) == [], rank
        # torch's _flatten on fmesh's meshes creates groups through fmesh's memo.
        ours, theirs = fmesh_ops.pop("flatten_new_groups"), torch_ops.pop("flatten_new_groups")
        assert ours <= theirs, (rank, ours, theirs)
        assert diff(torch_ops, fmesh_ops) == [], rank
        # torch's __eq__ / hash: the very same mesh (same rank map, layout, names),
        # except for the relabeled ones.
        assert case["equal"] is (name not in RELABELED)


def _walk(facts: Any) -> list[Facts]:
    """Every facts record (one DeviceMesh's answers) in a nested report."""
    if not isinstance(facts, dict):
        return []
    found = [facts] if "coordinate" in facts and "root_size" in facts else []
    for value in facts.values():
        found += _walk(value)
    return found


def test_roots_span_the_world(conformance: list[Facts]) -> None:
    for out in conformance:
        for name, case in out["recipes"].items():
            records = _walk(case["fmesh"]) + _walk(case["fmesh_ops"])
            assert len(records) >= 5, name
            # A mesh over part of the world is its own root, as torch's is.
            want = len(SUBWORLD) if name == "subworld" else WORLD
            assert {r["root_size"] for r in records} == {want}, name
            assert case["torch"]["root_size"] == want


def test_group_order_is_coordinate_order(conformance: list[Facts]) -> None:
    """fmesh's groups keep coordinate order (== fmesh.group) and its local ranks are
    the coordinate; torch sorts the ranks of the groups it creates, so its local rank is
    the position in the sorted group. Where the two orders differ is by design."""
    differs = set()
    for rank, out in enumerate(conformance):
        for name, mesh in fmesh_recipes().items():
            case = out["recipes"][name]
            coord = fmesh.coordinate(mesh, rank)
            assert case["fmesh"]["coordinate"] == case["torch"]["coordinate"] == coord
            if coord is None:
                assert case["fmesh"]["groups"] == case["torch"]["groups"]
                assert case["fmesh"]["groups"][0] == "raises"
                continue
            want = tuple(fmesh.group(mesh, a, rank) for a in mesh.axis_names)
            assert case["fmesh"]["groups"] == case["fmesh"]["all_groups"] == want
            assert case["fmesh"]["groups_by_name"] == want
            assert case["fmesh"]["local_ranks"] == coord
            torch_groups = case["torch"]["groups"]
            assert torch_groups == tuple(tuple(sorted(g)) for g in want)
            assert case["torch"]["local_ranks"] == tuple(sorted(g).index(rank) for g in want)
            if torch_groups != want:
                differs.add(name)
    assert differs == {"flatten_tp_pp", "subworld"}


def test_conversion_is_memoized_and_creates_no_group(conformance: list[Facts]) -> None:
    for out in conformance:
        for case in out["recipes"].values():
            assert case["memoized"] is True
            assert case["convert_new_groups"] == 0


def test_torch_flatten_of_a_realized_axis_reuses_fmesh_group(
    conformance: list[Facts],
) -> None:
    base = base_mesh()
    for rank, out in enumerate(conformance):
        counting = out["counting"]
        # torch 2.11's flatten layout normalizes differently; fmesh registers it in
        # the form each version computes, so reuse holds on 2.11 through 2.15.
        for key, axes in (("dp_tp", ("dp", "tp")), ("tp_pp", ("tp", "pp"))):
            facts = counting[key]
            assert facts["new_groups"] == 0, (rank, key)
            assert facts["is_fmesh_group"] is True, (rank, key)
            assert facts["ranks"] == fmesh.group(fmesh.flatten(base, axes), key, rank)
        tp_pp = counting["tp_pp"]
        assert tp_pp["local_rank"] == tp_pp["coordinate"][0]
        # Over part of the world too, torch's _flatten goes through fmesh: the group
        # fmesh realized for that flatten is reused, on members and non-members alike,
        # and every rank stays in step for torch's own group creation afterwards.
        sub = counting["subworld"]
        member = rank in SUBWORLD
        assert sub["new_groups"] == 0
        assert (sub["coordinate"] is None) == (not member)
        assert counting["agree_after"] == WORLD


def test_from_device_mesh_of_every_torch_mesh(conformance: list[Facts]) -> None:
    for rank, out in enumerate(conformance):
        for name, case in out["recipes"].items():
            back = case["from_torch"]
            torch_facts = case["torch"]
            assert back["names"] == torch_facts["names"]
            assert back["coordinate"] == torch_facts["coordinate"], (rank, name)
            if back["coordinate"] is None:
                continue
            assert back["instance"] == torch_facts["mesh"], (rank, name)
            assert tuple(tuple(sorted(g)) for g in back["groups"]) == torch_facts["groups"]
            # fmesh's own DeviceMesh comes back as the very mesh it was made from (the
            # same function for the relabeled ones).
            assert case["from_fmesh_equal"] is (name not in RELABELED), (rank, name)
            assert case["from_fmesh_same"] is True, (rank, name)
        for name, facts in out["from_group"].items():
            assert facts["instance"] == facts["torch_mesh"], (rank, name)
            assert tuple(tuple(sorted(g)) for g in facts["groups"]) == facts["torch_groups"]


# -- training on torch's mesh and on fmesh's -------------------------------------------------

STEPS = 3


def _has_dp_mesh_dims() -> bool:
    import torch.distributed.fsdp as fsdp

    return hasattr(fsdp, "DataParallelMeshDims")


def _model() -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))


def _train(
    model: Any, rank: int, wrap_input: Callable[[Any], Any] | None = None
) -> list[float]:
    """A few SGD steps; the data depends on the rank's (pp, dp) position only, so the
    ranks of one tensor-parallel group see the same batch."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(1000 * (rank // 2) + step)
        x = torch.randn(4, 8, generator=gen)
        y = torch.randn(4, 8, generator=gen)
        out = model(wrap_input(x) if wrap_input else x)
        if hasattr(out, "full_tensor"):
            out = out.to_local()
        loss = torch.nn.functional.mse_loss(out, y)
        torch.autograd.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.item()))
    return losses


def _fsdp_runs(dm_1d: Any, dm_2d: Any, rank: int) -> dict[str, list[float]]:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    out: dict[str, list[float]] = {}
    model = _model()
    fully_shard(model, mesh=dm_1d)
    out["fsdp_1d"] = _train(model, rank)
    model = _model()
    fully_shard(model, mesh=dm_2d)  # HSDP: replicate over dp, shard over tp
    out["hsdp"] = _train(model, rank)
    model = _model()
    parallelize_module(model, dm_2d["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=dm_2d["dp"])
    out["fsdp_tp"] = _train(model, rank)
    if _has_dp_mesh_dims():
        # Typed loosely: torch 2.11 has neither the class nor the keyword.
        fsdp: Any = importlib.import_module("torch.distributed.fsdp")
        from torch.distributed.tensor import distribute_module

        model = distribute_module(_model(), dm_2d)  # parameters Replicate on dp x tp
        fsdp.fully_shard(
            model, mesh=dm_2d, dp_mesh_dims=fsdp.DataParallelMeshDims(shard=("dp", "tp"))
        )
        out["dp_mesh_dims"] = _train(
            model, rank, lambda x: DTensor.from_local(x, dm_2d, [Replicate(), Replicate()])
        )
    return out


def training_job(rank: int, world: int, flavor: str, ckpt: str) -> Facts:
    """Train on torch's meshes or on fmesh's (in separate jobs: the two are equal
    DeviceMeshes, and DTensor's sharding cache would hand one's object to the other)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict_loader import load
    from torch.distributed.checkpoint.state_dict_saver import save
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    base = base_mesh()
    fmesh.realize(base)
    out: Facts = {"has_dp_mesh_dims": _has_dp_mesh_dims()}
    if flavor == "torch":
        root = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
        out["losses"] = _fsdp_runs(root["dp", "tp"]._flatten("dp_tp"), root["dp", "tp"], rank)
        dist.barrier()
        return out
    flat = fmesh.slice(fmesh.flatten(base, ("dp", "tp")), "dp_tp")
    dm_2d = fmesh.realize(fmesh.slice(base, "dp", "tp")).to_device_mesh("cpu")
    out["losses"] = _fsdp_runs(fmesh.realize(flat).to_device_mesh("cpu"), dm_2d, rank)
    # DCP: save on dp x tp, load on the reversed flatten tp_dp.
    full = torch.arange(8 * 12, dtype=torch.float32).reshape(8, 12)
    save({"w": distribute_tensor(full, dm_2d, [Shard(0), Shard(1)])}, checkpoint_id=ckpt)
    rev = fmesh.slice(fmesh.flatten(base, ("tp", "dp")), "tp_dp")
    load_dm = fmesh.realize(rev).to_device_mesh("cpu")
    target = {"w": distribute_tensor(torch.zeros(8, 12), load_dm, [Shard(0)])}
    load(target, checkpoint_id=ckpt)
    out["dcp_local"] = target["w"].to_local().numpy().copy()
    out["dcp_full"] = target["w"].full_tensor().numpy().copy()
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def training(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Facts]]:
    ckpt = str(tmp_path_factory.mktemp("ckpt"))
    return {
        flavor: run_spawn(
            training_job,
            WORLD,
            flavor,
            ckpt,
            tmp_path=tmp_path_factory.mktemp(f"training_{flavor}"),
            timeout=150,
        ).values()
        for flavor in ("torch", "fmesh")
    }


def test_training_losses_match_torch(training: dict[str, list[Facts]]) -> None:
    kinds = {"fsdp_1d", "hsdp", "fsdp_tp"}
    if _has_dp_mesh_dims():  # torch 2.13 on; not in 2.11
        kinds.add("dp_mesh_dims")
    for rank in range(WORLD):
        theirs = training["torch"][rank]["losses"]
        ours = training["fmesh"][rank]["losses"]
        assert set(theirs) == set(ours) == kinds
        for kind in kinds:
            assert len(ours[kind]) == STEPS
            assert ours[kind] == pytest.approx(theirs[kind], rel=1e-6, abs=1e-6), (rank, kind)
    # Not vacuous: different batches give different losses.
    assert len({training["torch"][r]["losses"]["hsdp"][0] for r in range(WORLD)}) == 4


def test_dcp_saved_on_one_mesh_loads_on_another(training: dict[str, list[Facts]]) -> None:
    import numpy as np

    full = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)
    rev = fmesh.slice(fmesh.flatten(base_mesh(), ("tp", "dp")), "tp_dp")
    for rank, out in enumerate(training["fmesh"]):
        np.testing.assert_array_equal(out["dcp_full"], full)
        coord = fmesh.coordinate(rev, rank)
        assert coord is not None
        np.testing.assert_array_equal(out["dcp_local"], full[2 * coord[0] : 2 * coord[0] + 2])


# -- size-1 axes ------------------------------------------------------------------------


SIZE_ONE = {"pp": 1, "dp": 2, "one": 1, "tp": 2}
SLICES: tuple[tuple[str, ...], ...] = (
    ("pp",),
    ("dp",),
    ("one",),
    ("tp",),
    ("dp", "tp"),
    ("pp", "one"),
    ("pp", "dp", "one", "tp"),
)


def size_one_job(rank: int, world: int) -> dict[str, Any]:
    """Slices of a mesh with size-1 axes: fmesh's DeviceMesh and torch's own."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = fmesh.make_mesh(SIZE_ONE)
    ours = fmesh.realize(mesh).to_device_mesh("cpu")
    theirs = init_device_mesh("cpu", tuple(SIZE_ONE.values()), mesh_dim_names=tuple(SIZE_ONE))
    out: dict[str, Any] = {}
    for names in SLICES:
        answers = []
        for dm in (ours, theirs):
            sub = dm[names]
            answers.append((sub.mesh.tolist(), sub.get_coordinate(), sub.size()))
        out["/".join(names)] = answers
    return out


def test_size_one_axes_slice_like_torch(tmp_path: Path) -> None:
    # torch 2.11 refused to slice a size-1 dimension that had no stride.
    job = run_spawn(size_one_job, 4, tmp_path=tmp_path, timeout=90)
    for out in job.values():
        for names, (ours, theirs) in out.items():
            assert ours == theirs, names
