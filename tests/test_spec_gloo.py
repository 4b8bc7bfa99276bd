"""``fmesh.distribute`` / ``spec_of`` / ``placements`` on 8 real gloo ranks.

One job computes every case; each test checks one facet of its reports. The expected
local shard comes from a brute-force numpy model of JAX's NamedSharding rule written
here from fmesh coordinates (``fmesh.coordinate``): a dim named with axes
``(a1, ..., ak)`` is cut into ``prod(size)`` equal blocks and a rank holds the block at
the row-major index of its coordinates along those axes. The model never looks at
placements.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pytest
from _dist import run_spawn

import fmesh
from fmesh import Mesh, P, PartitionSpec

WORLD = 8
PERM = (5, 2, 7, 0, 3, 6, 1, 4)
SHAPE = (8, 16)
SUBWORLD = (6, 1, 3, 4)


def spec_meshes() -> dict[str, Mesh]:
    """Meshes over the 8 ranks (the same value on every rank)."""
    cube = fmesh.make_mesh({"a": 2, "b": 2, "c": 2})
    return {
        "2d": fmesh.make_mesh({"dp": 2, "tp": 4}),
        "3d": cube,
        "3d_custom_order": fmesh.make_mesh({"x": 2, "y": 2, "z": 2}, ranks=PERM),
        "size_one": fmesh.make_mesh({"dp": 2, "one": 1, "tp": 4}),
        # Sub-meshes: two instances of 4 ranks, axes reordered.
        "slice_reordered": fmesh.slice(cube, "c", "a"),
        "slice_one_axis": fmesh.slice(fmesh.make_mesh({"dp": 2, "tp": 4}), "tp"),
        # Flattened in reverse, non-adjacent, then next to a plain axis.
        "flat_reversed": fmesh.flatten(cube, ("c", "a"), "ca"),
        "flat_reversed_reordered": fmesh.slice(
            fmesh.flatten(cube, ("c", "a"), "ca"), "b", "ca"
        ),
        "flat_custom": fmesh.flatten(
            fmesh.make_mesh({"x": 2, "y": 4}, ranks=PERM), ("y", "x"), "yx"
        ),
    }


def specs_for(mesh: Mesh, ndim: int = 2) -> list[PartitionSpec]:
    """Every spec for an ``ndim`` tensor: each axis splits one dim or none, in every
    major-to-minor order."""
    found: dict[PartitionSpec, None] = {}
    names = mesh.axis_names
    for assignment in itertools.product([None, *range(ndim)], repeat=len(names)):
        per_dim = [[n for n, d in zip(names, assignment) if d == dim] for dim in range(ndim)]
        for orders in itertools.product(*(itertools.permutations(g) for g in per_dim)):
            entries = [None if not o else o[0] if len(o) == 1 else tuple(o) for o in orders]
            found[P(*entries)] = None
    return list(found)


def global_tensor(shape: tuple[int, ...] = SHAPE) -> npt.NDArray[np.float32]:
    return np.arange(math.prod(shape), dtype=np.float32).reshape(shape)


def _entry_names(entry: object) -> tuple[str, ...]:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    assert isinstance(entry, tuple)
    return tuple(str(n) for n in entry)


def model_block(
    mesh: Mesh, rank: int, spec: PartitionSpec, full: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """JAX's rule, brute force: the block ``rank`` holds, from its fmesh coordinate."""
    coord = fmesh.coordinate(mesh, rank)
    assert coord is not None
    block = full
    for dim, entry in enumerate(spec):
        index, count = 0, 1
        for name in _entry_names(entry):
            size = mesh.shape[name]
            index = index * size + coord[mesh.axis_names.index(name)]
            count *= size
        block = np.split(block, count, axis=dim)[index]
    return block


def strip(spec: PartitionSpec) -> PartitionSpec:
    entries = list(spec)
    while entries and entries[-1] is None:
        entries.pop()
    return P(*entries)


def redistribute_target(specs: list[PartitionSpec], i: int) -> PartitionSpec:
    """Another spec of the same list (a fixed stride apart) to redistribute into."""
    return specs[(i * 7 + 3) % len(specs)]


# 3-d tensors on the cube: a few specs over all three dims.
CUBE_3D = (8, 4, 12)
CUBE_3D_SPECS = (
    P("a", "b", "c"),
    P(None, ("c", "a"), "b"),
    P(("c", "b", "a")),
    P("c", None, ("b", "a")),
    P(None, None, ("a", "c")),
)


# -- worker side --------------------------------------------------------------------------


def _shapes(dt: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(dt.shape), tuple(dt.to_local().shape)


def _capture(fn: Any) -> Any:
    try:
        return ("ok", fn())
    except Exception as err:
        return ("error", type(err).__name__, str(err))


def spec_job(rank: int, world: int, ckpt: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    out: dict[str, Any] = {"cases": {}, "coords": {}}
    full = torch.from_numpy(global_tensor())
    for name, mesh in spec_meshes().items():
        realized = fmesh.realize(mesh)
        out["coords"][name] = realized.to_device_mesh().get_coordinate()
        specs = specs_for(mesh)
        for i, spec in enumerate(specs):
            case: dict[str, Any] = {}
            made = _capture(lambda s=spec, r=realized: fmesh.distribute(full, r, s))
            if made[0] != "ok":
                case["distribute"] = made
                out["cases"][name, spec] = case
                continue
            dt = made[1]
            case["distribute"] = ("ok", dt.to_local().numpy().copy())
            case["placements"] = str(dt.placements)
            case["spec_of"] = _capture(lambda d=dt, m=mesh: fmesh.spec_of(d, m))
            case["full_tensor"] = _capture(lambda d=dt: d.full_tensor().numpy().copy())
            target = redistribute_target(specs, i)
            case["target"] = target
            case["redistribute"] = _capture(
                lambda d=dt, t=target, m=mesh: (
                    d.redistribute(placements=fmesh.placements(m, t, 2))
                    .to_local()
                    .numpy()
                    .copy()
                )
            )
            out["cases"][name, spec] = case
    cube = spec_meshes()["3d"]
    realized = fmesh.realize(cube)
    full3 = torch.from_numpy(global_tensor(CUBE_3D))
    for spec in CUBE_3D_SPECS:
        dt = fmesh.distribute(full3, realized, spec)
        out["cases"]["3d_tensor", spec] = {
            "distribute": ("ok", dt.to_local().numpy().copy()),
            "spec_of": _capture(lambda d=dt: fmesh.spec_of(d, cube)),
            "full_tensor": _capture(lambda d=dt: d.full_tensor().numpy().copy()),
        }
    # Each rank slices its own copy (no scatter): the same blocks.
    out["no_scatter"] = {
        spec: fmesh.distribute(full, realized, spec, src_data_rank=None).to_local().numpy()
        for spec in specs_for(cube)
    }
    out["ops"] = _op_cases(realized)
    out["dcp"] = _dcp_cases(realized, ckpt)
    out["errors"] = _error_cases(fmesh.realize(spec_meshes()["2d"]), full)
    sub = fmesh.realize(fmesh.make_mesh({"dp": 2, "tp": 2}, ranks=SUBWORLD))
    out["non_member"] = _capture(lambda: _shapes(fmesh.distribute(full, sub, P("dp"))))
    dist.barrier()
    return out


MATMUL_CASES = {
    "contraction_reversed": (P(None, ("c", "a")), P(("c", "a"), None)),
    "rows_and_cols": (P(("b", "a")), P(None, "c")),
    "all_three": (P(None, ("c", "b", "a")), P(("c", "b", "a"))),
}
"""x (8x16) and w (16x4) specs on the cube, for ``x @ w``."""


def _op_cases(realized: fmesh.RealizedMesh) -> dict[tuple[str, str], Any]:
    """DTensor's own ops on strided specs, gathered: ``x @ w``, ``x + x``, ``x.sum(0)``."""
    import torch
    from torch.distributed.tensor import DTensor

    x = torch.from_numpy(global_tensor((8, 16)))
    w = torch.from_numpy(global_tensor((16, 4)) / 100)
    out: dict[tuple[str, str], Any] = {}
    for name, (xs, ws) in MATMUL_CASES.items():
        dx = fmesh.distribute(x, realized, xs)
        dw = fmesh.distribute(w, realized, ws)
        out["matmul", name] = _capture(
            lambda a=dx, b=dw: cast(DTensor, torch.matmul(a, b)).full_tensor().numpy().copy()
        )
        out["add", name] = _capture(
            lambda a=dx: cast(DTensor, a + a).full_tensor().numpy().copy()
        )
        out["sum", name] = _capture(
            lambda a=dx: cast(DTensor, a.sum(dim=0)).full_tensor().numpy().copy()
        )
    return out


DCP_CASES = {
    "strided_to_plain": (P(("c", "a"), "b"), P("a", ("b", "c"))),
    "plain_to_strided": (P(None, ("a", "b", "c")), P(("c", "b"), "a")),
    "strided_to_strided": (P(("b", "a")), P(None, ("c", "b", "a"))),
}
"""(saved spec, loaded spec) on the cube."""


def _dcp_cases(realized: fmesh.RealizedMesh, ckpt: str) -> dict[str, Any]:
    """Save under one spec, load into a DTensor under another; return the local shard."""
    import torch
    from torch.distributed.checkpoint.state_dict_loader import load
    from torch.distributed.checkpoint.state_dict_saver import save

    full = torch.from_numpy(global_tensor())
    out: dict[str, Any] = {}
    for name, (saved, loaded) in DCP_CASES.items():
        path = f"{ckpt}/{name}"

        def run(s: PartitionSpec = saved, ld: PartitionSpec = loaded, p: str = path) -> Any:
            save({"w": fmesh.distribute(full, realized, s)}, checkpoint_id=p)
            target = {"w": fmesh.distribute(torch.zeros_like(full), realized, ld)}
            load(target, checkpoint_id=p)
            return target["w"].to_local().numpy().copy()

        out[name] = _capture(run)
    return out


def _error_cases(realized: fmesh.RealizedMesh, full: Any) -> dict[str, Any]:
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate

    from fmesh._compat import strided_shard

    cases = {
        "unknown_axis": lambda: fmesh.distribute(full, realized, P("nope")),
        "too_many_entries": lambda: fmesh.distribute(full, realized, P("dp", None, None)),
        "not_divisible": lambda: fmesh.distribute(
            torch.zeros(6, 16), realized, P(("tp", "dp"))
        ),
        "not_a_spec": lambda: fmesh.distribute(full, realized, ("dp",)),  # type: ignore[arg-type]  # the error under test
        "not_realized": lambda: fmesh.distribute(full, realized.mesh, P("dp")),  # type: ignore[arg-type]  # the error under test
        "dtensor_given": lambda: fmesh.distribute(
            fmesh.distribute(full, realized, P("dp")), realized, P("dp")
        ),
        "spec_of_partial": lambda: fmesh.spec_of(
            DTensor.from_local(full, realized.to_device_mesh(), [Partial(), Replicate()]),
            realized.mesh,
        ),
        "spec_of_other_mesh": lambda: fmesh.spec_of(
            fmesh.distribute(full, realized, P("dp")), fmesh.make_mesh({"dp": 2, "sp": 4})
        ),
        "spec_of_not_dtensor": lambda: fmesh.spec_of(full, realized.mesh),
        # What a view can leave: tp keeps every 4th of 8 row pieces (interleaved rows).
        "spec_of_interleaved": lambda: fmesh.spec_of(
            DTensor.from_local(
                full[:2], realized.to_device_mesh(), [Replicate(), strided_shard(0, 2)]
            ),
            realized.mesh,
        ),
    }
    return {name: _capture(fn) for name, fn in cases.items()}


# -- parent side ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("spec")
    job = run_spawn(spec_job, WORLD, str(tmp / "ckpt"), tmp_path=tmp / "job", timeout=240)
    return job.values()


def _cases(reports: list[dict[str, Any]]) -> list[tuple[str, Mesh, PartitionSpec]]:
    meshes = spec_meshes()
    return [(name, meshes[name], spec) for name, spec in reports[0]["cases"] if name in meshes]


def _ok(result: Any, what: str) -> Any:
    assert result[0] == "ok", f"{what}: {result}"
    return result[1]


def test_device_mesh_reports_fmesh_coordinates(reports: list[dict[str, Any]]) -> None:
    for name, mesh in spec_meshes().items():
        for rank, out in enumerate(reports):
            assert out["coords"][name] == fmesh.coordinate(mesh, rank), name


def test_every_spec_was_tried(reports: list[dict[str, Any]]) -> None:
    tried = {(name, spec) for name, spec in reports[0]["cases"]}
    for name, mesh in spec_meshes().items():
        assert {(name, s) for s in specs_for(mesh)} <= tried
    # 3 axes, j of them used, arranged into 2 ordered lists: sum C(3, j) * (j + 1)!.
    assert len(specs_for(spec_meshes()["3d"])) == 1 + 3 * 2 + 3 * 6 + 24
    assert len(tried) >= 200


def test_strided_placements_are_exercised(reports: list[dict[str, Any]]) -> None:
    """Not vacuous: many specs need torch's strided shards, some with split factor > 2."""
    placements = [c["placements"] for c in reports[0]["cases"].values() if "placements" in c]
    strided = [p for p in placements if "_StridedShard" in p]
    assert len(strided) >= 40
    assert any("sf=4" in p for p in strided)


def test_local_shard_follows_jax_rule(reports: list[dict[str, Any]]) -> None:
    for name, mesh, spec in _cases(reports):
        for rank, out in enumerate(reports):
            local = _ok(out["cases"][name, spec]["distribute"], f"{name} {spec}")
            want = model_block(mesh, rank, spec, global_tensor())
            np.testing.assert_array_equal(local, want, err_msg=f"{name} {spec} rank {rank}")


def test_full_tensor_round_trips(reports: list[dict[str, Any]]) -> None:
    for name, _, spec in _cases(reports):
        for out in reports:
            got = _ok(out["cases"][name, spec]["full_tensor"], f"{name} {spec}")
            np.testing.assert_array_equal(got, global_tensor(), err_msg=f"{name} {spec}")


def test_spec_of_round_trips(reports: list[dict[str, Any]]) -> None:
    for name, mesh, spec in _cases(reports):
        for rank, out in enumerate(reports):
            got = _ok(out["cases"][name, spec]["spec_of"], f"{name} {spec}")
            assert isinstance(got, PartitionSpec)
            if 1 not in mesh.axis_sizes:
                assert got == strip(spec), (name, spec)
            else:
                # A size-1 axis splits nothing, so its place in an entry is not
                # recorded; the spec returned must still shard the same way.
                full = global_tensor()
                np.testing.assert_array_equal(
                    model_block(mesh, rank, got, full), model_block(mesh, rank, spec, full)
                )
                assert set(got.axis_names) == set(spec.axis_names)


def test_redistribute_between_specs(reports: list[dict[str, Any]]) -> None:
    for name, mesh, spec in _cases(reports):
        for rank, out in enumerate(reports):
            case = out["cases"][name, spec]
            got = _ok(case["redistribute"], f"{name} {spec} -> {case['target']}")
            want = model_block(mesh, rank, case["target"], global_tensor())
            np.testing.assert_array_equal(
                got, want, err_msg=f"{name} {spec}->{case['target']}"
            )


def test_distribute_without_scatter(reports: list[dict[str, Any]]) -> None:
    cube = spec_meshes()["3d"]
    for rank, out in enumerate(reports):
        assert set(out["no_scatter"]) == set(specs_for(cube))
        for spec, local in out["no_scatter"].items():
            want = model_block(cube, rank, spec, global_tensor())
            np.testing.assert_array_equal(local, want, err_msg=f"{spec} rank {rank}")


@pytest.mark.parametrize("spec", CUBE_3D_SPECS, ids=str)
def test_three_dim_tensors(reports: list[dict[str, Any]], spec: PartitionSpec) -> None:
    cube = spec_meshes()["3d"]
    full = global_tensor(CUBE_3D)
    for rank, out in enumerate(reports):
        case = out["cases"]["3d_tensor", spec]
        local = _ok(case["distribute"], str(spec))
        np.testing.assert_array_equal(local, model_block(cube, rank, spec, full))
        np.testing.assert_array_equal(_ok(case["full_tensor"], str(spec)), full)
        assert _ok(case["spec_of"], str(spec)) == strip(spec)


@pytest.mark.parametrize("name", list(MATMUL_CASES))
def test_dtensor_ops_on_specs(reports: list[dict[str, Any]], name: str) -> None:
    x = global_tensor((8, 16)).astype(np.float64)
    w = global_tensor((16, 4)).astype(np.float64) / 100
    for out in reports:
        ops = out["ops"]
        np.testing.assert_allclose(_ok(ops["matmul", name], name), x @ w, rtol=1e-5)
        np.testing.assert_array_equal(_ok(ops["add", name], name), 2 * x)
        np.testing.assert_allclose(_ok(ops["sum", name], name), x.sum(axis=0), rtol=1e-6)


@pytest.mark.parametrize("name", list(DCP_CASES))
def test_checkpoint_saved_under_one_spec_loads_under_another(
    reports: list[dict[str, Any]], name: str
) -> None:
    cube = spec_meshes()["3d"]
    saved, loaded = DCP_CASES[name]
    assert saved != loaded
    for rank, out in enumerate(reports):
        got = _ok(out["dcp"][name], name)
        np.testing.assert_array_equal(got, model_block(cube, rank, loaded, global_tensor()))
        # Not vacuous: the loaded block differs from the saved one on some rank.
    assert any(
        not np.array_equal(
            model_block(cube, r, saved, global_tensor()),
            model_block(cube, r, loaded, global_tensor()),
        )
        for r in range(WORLD)
    )


ERRORS = {
    "unknown_axis": (
        "AxisNotFoundError",
        r"PartitionSpec\('nope'\) names axis 'nope', which Mesh\(dp=2, tp=4\) does not "
        r"have; valid axis names are \['dp', 'tp'\]",
    ),
    "too_many_entries": (
        "MeshError",
        r"PartitionSpec\('dp', None, None\) has 3 entries but the tensor has 2 dimension",
    ),
    "not_divisible": (
        "MeshError",
        r"tensor dim 0 has size 6, which PartitionSpec\(\('tp', 'dp'\)\) splits over axes "
        r"\('tp', 'dp'\) into 8 blocks; it is not divisible by 8",
    ),
    "not_a_spec": (
        "TypeError",
        r"expected an fmesh.PartitionSpec, got \('dp',\) of type tuple",
    ),
    "not_realized": ("TypeError", r"distribute\(\) needs an fmesh.RealizedMesh .* got Mesh"),
    "dtensor_given": ("TypeError", r"takes the full tensor, got a DTensor; .*redistribute"),
    "spec_of_partial": ("MeshError", r"along axis 'dp'; a PartitionSpec only expresses Shard"),
    "spec_of_other_mesh": (
        "MeshError",
        r"DeviceMesh with shape \(2, 4\) and dim names \('dp', 'tp'\), which does not match "
        r"Mesh\(dp=2, sp=4\)",
    ),
    "spec_of_not_dtensor": ("TypeError", r"spec_of\(\) needs a DTensor, got Tensor"),
    "spec_of_interleaved": (
        "MeshError",
        r"mesh axis 'tp' splits tensor dim 0 with split factor 2, which no order .* "
        r"PartitionSpec cannot express this sharding",
    ),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_input_raises_clear_errors(reports: list[dict[str, Any]], case: str) -> None:
    error, pattern = ERRORS[case]
    for out in reports:
        result = out["errors"][case]
        assert result[:2] == ("error", error), result
        assert re.search(pattern, result[2]), result[2]


def test_non_member_ranks_hold_nothing(reports: list[dict[str, Any]]) -> None:
    # As with torch's own DeviceMesh over part of the world: ranks outside it are
    # non-participating, with the global shape and an empty local tensor.
    for rank, out in enumerate(reports):
        result = out["non_member"]
        local = (4, 16) if rank in SUBWORLD else (0,)
        assert result == ("ok", ((8, 16), local)), (rank, result)


# -- placements, in the parent (torch, no process group) ------------------------------------


def test_placements_per_mesh_axis() -> None:
    from torch.distributed.tensor import Replicate, Shard

    from fmesh._compat import strided_shard, strided_shard_parts

    mesh = fmesh.make_mesh({"dp": 2, "cp": 3, "tp": 4})
    assert fmesh.placements(mesh, P(None, "tp"), 2) == (Replicate(), Replicate(), Shard(1))
    assert fmesh.placements(mesh, P(("dp", "tp"), "cp"), 2) == (Shard(0), Shard(1), Shard(0))
    got = fmesh.placements(mesh, P(("tp", "cp", "dp")), 1)
    assert got == (strided_shard(0, 12), strided_shard(0, 4), Shard(0))
    assert [strided_shard_parts(p) for p in got] == [(0, 12), (0, 4), None]
    realized_free = fmesh.placements(mesh, P(), 0)
    assert realized_free == (Replicate(),) * 3
    with pytest.raises(TypeError, match=r"placements\(\) needs an fmesh.Mesh or"):
        fmesh.placements("mesh", P(), 0)  # type: ignore[arg-type]  # the error under test
