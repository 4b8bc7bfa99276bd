"""``realize`` on real gloo process groups: 8 local ranks launched torchrun-style.

Each job runs once per module (a fixture) and every test asserts one facet of its
reports. Expected values come from fmesh's pure queries (``fmesh.group``,
``fmesh.coordinate``) or from torch's own ``DeviceMesh``, never from the code under
test: what the groups *do* is checked by collectives (an all_gather shows the order
of a group, an all_reduce of ``2**rank`` shows exactly who is in it).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _dist import run_spawn

import fmesh
from fmesh import Mesh

WORLD = 8
PERM = (5, 2, 7, 0, 3, 6, 1, 4)
"""A custom device order for ``make_mesh(..., ranks=...)``."""
SUBWORLD = (6, 1, 3, 4)
"""Ranks of a mesh over part of the world; the others are non-members."""


def gloo_meshes() -> dict[str, Mesh]:
    """The meshes every rank realizes, in this order (same value on every rank)."""
    identity = fmesh.make_mesh({"pp": 2, "dp": 2, "tp": 2})
    custom = fmesh.make_mesh({"dp": 2, "tp": 4}, ranks=PERM)
    flat_rev = fmesh.flatten(identity, ("tp", "pp"))
    return {
        "identity": identity,
        "custom_order": custom,
        "slice_reordered": fmesh.slice(identity, "tp", "pp"),
        "slice_one": fmesh.slice(identity, "dp"),
        "flatten_reversed_nonadjacent": flat_rev,
        "flatten_custom_reversed": fmesh.flatten(custom, ("tp", "dp")),
        "unflatten": fmesh.unflatten(fmesh.make_mesh({"w": 8}), "w", {"a": 2, "b": 4}),
        "unflatten_of_flatten": fmesh.unflatten(flat_rev, "tp_pp", {"x": 2, "y": 2}),
        "size_one_axis": fmesh.make_mesh({"dp": 2, "one": 1, "tp": 4}),
        "subworld": fmesh.make_mesh({"dp": 2, "tp": 2}, ranks=SUBWORLD),
        "renamed": fmesh.rename(identity, {"dp": "data"}),
    }


def thread_mesh() -> Mesh:
    """A mesh no other part of the job realizes (reversed device order)."""
    return fmesh.make_mesh({"x": 2, "y": 4}, ranks=tuple(reversed(range(WORLD))))


THREADS = 4


# -- worker side --------------------------------------------------------------------------


def _axis_facts(realized: fmesh.RealizedMesh, axis: str) -> dict[str, Any]:
    """What this rank's group along ``axis`` is, and what it does in collectives."""
    import torch
    import torch.distributed as dist

    pg = realized.group(axis)
    mine = torch.tensor([realized.rank], dtype=torch.int64)
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(pg.size())]
    dist.all_gather(gathered, mine, group=pg)
    bits = torch.tensor([1 << realized.rank], dtype=torch.int64)
    dist.all_reduce(bits, group=pg)
    return {
        "ranks": tuple(dist.get_process_group_ranks(pg)),
        "pg_rank": pg.rank(),
        "pg_size": pg.size(),
        "local_rank": realized.local_rank(axis),
        "gathered": tuple(int(t.item()) for t in gathered),
        "bits": int(bits.item()),
        "backend": str(dist.get_backend(pg)),
    }


def _realized_facts(realized: fmesh.RealizedMesh) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "coordinate": realized.coordinate,
        "created": realized.created,
        "n_groups": len(realized.groups),
    }
    if realized.coordinate is None:
        for what, call in (
            ("group", lambda: realized.group(realized.mesh.axis_names[0])),
            ("local_rank", lambda: realized.local_rank(realized.mesh.axis_names[0])),
        ):
            try:
                call()
            except Exception as err:
                facts[f"{what}_error"] = (type(err).__name__, str(err))
            else:
                facts[f"{what}_error"] = None
        # As on torch's own mesh over part of the world: a non-participating rank.
        dm = realized.to_device_mesh("cpu")
        facts["device_mesh_outside"] = (dm.get_coordinate(), dm.size(), dm.mesh.tolist())
    else:
        facts["axes"] = {a: _axis_facts(realized, a) for a in realized.mesh.axis_names}
    return facts


def _stats() -> tuple[int, int, int]:
    s = fmesh.cache_stats()
    return (s.created, s.reused, s.live)


def axes_job(rank: int, world: int) -> dict[str, Any]:
    """Realize every mesh of :func:`gloo_meshes`, then probe memo, backends, threads,
    destroy; report facts for the parent to check."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import Backend as C10dBackend

    out: dict[str, Any] = {}

    # A mesh bigger than the world fails on every rank before any collective.
    try:
        fmesh.realize(fmesh.make_mesh({"a": 2 * world}))
    except fmesh.MeshError as err:
        out["too_big"] = (type(err).__name__, str(err))

    meshes = gloo_meshes()
    first = {name: fmesh.realize(m) for name, m in meshes.items()}
    out["first"] = {name: _realized_facts(r) for name, r in first.items()}
    out["stats_first"] = _stats()

    # Same meshes again: nothing new, the very same group objects.
    again = {name: fmesh.realize(m) for name, m in meshes.items()}
    out["again_created"] = {name: r.created for name, r in again.items()}
    out["again_same_objects"] = all(
        again[n].groups[a] is first[n].groups[a] for n in first for a in first[n].groups
    )
    out["stats_again"] = _stats()

    # Per-axis backends and options.
    identity = meshes["identity"]
    same = fmesh.realize(identity, backend={"tp": "gloo"})
    out["backend_same"] = {
        "created": same.created,
        "same_objects": all(
            same.groups[a] is first["identity"].groups[a] for a in same.groups
        ),
    }
    other = fmesh.realize(identity, backend={"tp": "cpu:gloo"})
    out["backend_other"] = {
        "created": other.created,
        "tp_new": other.group("tp") is not first["identity"].group("tp"),
        "others_same": all(other.group(a) is first["identity"].group(a) for a in ("pp", "dp")),
        "tp": _axis_facts(other, "tp"),
    }
    try:
        fmesh.realize(identity, backend={"nope": "gloo"})
    except fmesh.MeshError as err:
        out["backend_bad_axis"] = (type(err).__name__, isinstance(err, KeyError), str(err))
    opts = C10dBackend.Options("gloo")
    with_opts = fmesh.realize(identity, options={"dp": opts})
    with_opts_again = fmesh.realize(identity, options={"dp": opts})
    out["options"] = {
        "created": with_opts.created,
        "again_created": with_opts_again.created,
        "dp": _axis_facts(with_opts, "dp"),
    }
    out["stats_before_threads"] = _stats()

    # Several threads realize the same new mesh at once.
    tm = thread_mesh()
    results = _realize_from_threads(tm, datetime.timedelta(seconds=30))
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    out["threads_errors"] = errors
    if not errors:
        realized = [r for r in results if isinstance(r, fmesh.RealizedMesh)]
        out["threads_created"] = sorted(r.created for r in realized)
        out["threads_same_objects"] = all(
            r.groups[a] is realized[0].groups[a] for r in realized for a in tm.axis_names
        )
        out["threads_facts"] = _realized_facts(realized[0])
    out["stats_after_threads"] = _stats()

    # destroy() tears everything down; realize works again afterwards.
    old = first["identity"].group("dp")
    fmesh.destroy()
    out["stats_destroyed"] = _stats()
    try:
        dist.get_process_group_ranks(old)
        out["old_group_alive"] = True
    except (KeyError, ValueError, RuntimeError):
        out["old_group_alive"] = False
    fresh = fmesh.realize(identity)
    out["fresh"] = _realized_facts(fresh)
    out["fresh_is_new"] = fresh.group("dp") is not old
    out["stats_fresh"] = _stats()
    dist.barrier()
    return out


# -- parent side ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def axes(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    job = run_spawn(axes_job, WORLD, tmp_path=tmp_path_factory.mktemp("axes"), timeout=150)
    return job.values()


def _members(mesh: Mesh, rank: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(axis, group) for every axis of ``mesh`` whose group contains ``rank``."""
    if fmesh.coordinate(mesh, rank) is None:
        return
    for axis in mesh.axis_names:
        yield axis, fmesh.group(mesh, axis, rank)


def _check_axis(facts: dict[str, Any], mesh: Mesh, axis: str, rank: int) -> None:
    expected = fmesh.group(mesh, axis, rank)
    coord = fmesh.coordinate(mesh, rank)
    assert coord is not None
    position = coord[mesh.axis_index(axis)]
    assert facts["ranks"] == expected
    assert facts["pg_size"] == len(expected) == mesh.shape[axis]
    # Group rank == coordinate == RealizedMesh.local_rank, for every axis.
    assert facts["pg_rank"] == position == facts["local_rank"]
    assert expected[position] == rank
    # all_gather orders by group rank: the group really is in coordinate order.
    assert facts["gathered"] == expected
    # all_reduce of 2**rank: exactly the expected members took part.
    assert facts["bits"] == sum(1 << g for g in expected)


def test_too_big_mesh_fails_before_any_collective(axes: list[dict[str, Any]]) -> None:
    for out in axes:
        name, message = out["too_big"]
        assert name == "MeshError"
        assert f"world has only {WORLD} ranks" in message


@pytest.mark.parametrize("name", list(gloo_meshes()))
def test_groups_match_pure_queries(axes: list[dict[str, Any]], name: str) -> None:
    mesh = gloo_meshes()[name]
    for rank, out in enumerate(axes):
        facts = out["first"][name]
        assert facts["coordinate"] == fmesh.coordinate(mesh, rank)
        if facts["coordinate"] is None:
            continue
        assert set(facts["axes"]) == set(mesh.axis_names)
        for axis in mesh.axis_names:
            _check_axis(facts["axes"][axis], mesh, axis, rank)


def test_each_distinct_group_is_created_once(axes: list[dict[str, Any]]) -> None:
    """Each realize creates exactly the groups no earlier mesh asked for."""
    for rank, out in enumerate(axes):
        seen: set[tuple[int, ...]] = set()
        for name, mesh in gloo_meshes().items():
            new = {g for _, g in _members(mesh, rank)} - seen
            assert out["first"][name]["created"] == len(new), (rank, name)
            seen |= new
        created, _, live = out["stats_first"]
        assert created == live == len(seen)


def test_realizing_again_creates_nothing(axes: list[dict[str, Any]]) -> None:
    requests = sum(m.ndim for m in gloo_meshes().values())
    for out in axes:
        assert set(out["again_created"].values()) == {0}
        assert out["again_same_objects"] is True
        assert out["stats_again"][0] == out["stats_first"][0]
        # Every axis request of the second pass was answered by the memo.
        assert out["stats_again"][1] - out["stats_first"][1] == requests


def test_non_members_get_no_coordinate_and_no_groups(axes: list[dict[str, Any]]) -> None:
    mesh = gloo_meshes()["subworld"]
    outsiders = [r for r in range(WORLD) if r not in SUBWORLD]
    assert outsiders
    for rank in outsiders:
        facts = axes[rank]["first"]["subworld"]
        assert fmesh.coordinate(mesh, rank) is None
        assert facts["coordinate"] is None
        assert facts["n_groups"] == 0
        assert facts["created"] == 0
        instance = fmesh.instance(mesh, SUBWORLD[0]).tolist()
        assert facts["device_mesh_outside"] == (None, mesh.size, instance)
        for what in ("group", "local_rank"):
            error = facts[f"{what}_error"]
            assert error is not None, what
            assert error[0] == "MeshError"
            assert f"rank {rank} is not in" in error[1]
    for rank in SUBWORLD:
        assert axes[rank]["first"]["subworld"]["n_groups"] == mesh.ndim


def test_size_one_axis_gets_a_working_one_member_group(axes: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(axes):
        facts = out["first"]["size_one_axis"]["axes"]["one"]
        assert facts["ranks"] == (rank,)
        assert facts["pg_rank"] == 0
        assert facts["bits"] == 1 << rank


def test_per_axis_backend(axes: list[dict[str, Any]]) -> None:
    mesh = gloo_meshes()["identity"]
    for rank, out in enumerate(axes):
        # {"tp": "gloo"} names the world's own backend: the same groups as no override.
        assert out["backend_same"] == {"created": 0, "same_objects": True}
        other = out["backend_other"]
        assert other["created"] == 1
        assert other["tp_new"] is True
        assert other["others_same"] is True
        _check_axis(other["tp"], mesh, "tp", rank)
        assert other["tp"]["backend"] == "cpu:gloo"
        name, is_key_error, message = out["backend_bad_axis"]
        assert name == "AxisNotFoundError" and is_key_error
        assert "'nope'" in message and "['pp', 'dp', 'tp']" in message


def test_per_axis_options_key_the_memo(axes: list[dict[str, Any]]) -> None:
    mesh = gloo_meshes()["identity"]
    for rank, out in enumerate(axes):
        assert out["options"]["created"] == 1
        assert out["options"]["again_created"] == 0
        _check_axis(out["options"]["dp"], mesh, "dp", rank)


def test_threads_create_each_group_once(axes: list[dict[str, Any]]) -> None:
    mesh = thread_mesh()
    for rank, out in enumerate(axes):
        earlier = {g for m in gloo_meshes().values() for _, g in _members(m, rank)}
        new = {g for _, g in _members(mesh, rank)} - earlier
        assert len(new) == mesh.ndim  # the mesh really needs new groups
        assert out["threads_errors"] == []
        # One thread created the mesh's groups; the others got them from the memo.
        assert out["threads_created"] == [0] * (THREADS - 1) + [len(new)]
        assert out["threads_same_objects"] is True
        before, after = out["stats_before_threads"], out["stats_after_threads"]
        assert after[0] - before[0] == len(new)
        assert after[1] - before[1] == (THREADS - 1) * mesh.ndim
        for axis in mesh.axis_names:
            _check_axis(out["threads_facts"]["axes"][axis], mesh, axis, rank)


def first_realize_threads_job(rank: int, world: int) -> dict[str, Any]:
    """The very first realize, from several threads: one of them sets up the world."""
    mesh = fmesh.make_mesh({"dp": 2, "tp": world // 2})
    results = _realize_from_threads(mesh, datetime.timedelta(seconds=20))
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    if errors:
        return {"errors": errors}
    realized = [r for r in results if isinstance(r, fmesh.RealizedMesh)]
    return {
        "errors": [],
        "created": sorted(r.created for r in realized),
        "same_objects": all(
            r.groups[a] is realized[0].groups[a] for r in realized for a in mesh.axis_names
        ),
        "facts": _realized_facts(realized[0]),
        "stats": _stats(),
    }


def test_threads_racing_to_the_first_realize(tmp_path: Path) -> None:
    world = 4
    job = run_spawn(first_realize_threads_job, world, tmp_path=tmp_path, timeout=60)
    mesh = fmesh.make_mesh({"dp": 2, "tp": world // 2})
    for rank, out in enumerate(job.values()):
        assert out["errors"] == []
        assert out["created"] == [0] * (THREADS - 1) + [mesh.ndim]
        assert out["same_objects"] is True
        assert out["stats"] == (mesh.ndim, (THREADS - 1) * mesh.ndim, mesh.ndim)
        for axis in mesh.axis_names:
            _check_axis(out["facts"]["axes"][axis], mesh, axis, rank)


def world_group_job(rank: int, world: int) -> dict[str, Any]:
    """Axes that are the whole world in rank order use the default group itself."""
    import torch
    import torch.distributed as dist

    square = fmesh.make_mesh({"dp": 2, "tp": world // 2})
    in_order = fmesh.realize(fmesh.flatten(square, ("dp", "tp"), "all"))
    one_d = fmesh.realize(fmesh.make_mesh({"world": world}))
    reversed_ = fmesh.realize(fmesh.flatten(square, ("tp", "dp"), "all"))
    default = dist.distributed_c10d._get_default_group()
    t = torch.tensor([2.0**rank])
    dist.all_reduce(t, group=reversed_.group("all"))
    out = {
        "in_order_is_default": in_order.group("all") is default,
        "one_d_is_default": one_d.group("world") is default,
        "created": [in_order.created, one_d.created, reversed_.created],
        "reversed_ranks": dist.get_process_group_ranks(reversed_.group("all")),
        "reversed_group_rank": reversed_.group("all").rank(),
        "reversed_coordinate": reversed_.local_rank("all"),
        "sum": t.item(),
    }
    fmesh.destroy()
    after = torch.tensor([1.0])
    dist.all_reduce(after)  # the default group survives destroy()
    out["after_destroy"] = after.item()
    return out


def test_whole_world_axes_use_the_default_group(tmp_path: Path) -> None:
    world = 4
    job = run_spawn(world_group_job, world, tmp_path=tmp_path, timeout=60)
    square = fmesh.make_mesh({"dp": 2, "tp": world // 2})
    rev = fmesh.flatten(square, ("tp", "dp"), "all")
    for rank, out in enumerate(job.values()):
        assert out["in_order_is_default"] is True
        assert out["one_d_is_default"] is True
        assert out["created"] == [0, 0, 1]
        assert tuple(out["reversed_ranks"]) == fmesh.group(rev, "all", rank)
        assert out["reversed_group_rank"] == out["reversed_coordinate"]
        assert (fmesh.coordinate(rev, rank) or (None,))[0] == out["reversed_coordinate"]
        assert out["sum"] == sum(2.0**r for r in range(world))
        assert out["after_destroy"] == world


def test_destroy_then_realize_again(axes: list[dict[str, Any]]) -> None:
    mesh = gloo_meshes()["identity"]
    for rank, out in enumerate(axes):
        assert out["stats_destroyed"] == (0, 0, 0)
        assert out["old_group_alive"] is False
        assert out["fresh_is_new"] is True
        assert out["fresh"]["created"] == mesh.ndim
        assert out["stats_fresh"] == (mesh.ndim, 0, mesh.ndim)
        for axis in mesh.axis_names:
            _check_axis(out["fresh"]["axes"][axis], mesh, axis, rank)


# -- against torch's DeviceMesh -------------------------------------------------------------

TORCH_SHAPE = {"pp": 2, "dp": 2, "tp": 2}
TRANSPOSED = ("flatten_tp_pp", "flatten_all_reversed")
"""Cases built in torch on a transposed rank array (torch only slices ascending)."""


def _torch_case_meshes() -> dict[str, Mesh]:
    root = fmesh.make_mesh(TORCH_SHAPE)
    flat = fmesh.flatten(root, ("pp", "tp"))
    return {
        "root": root,
        "slice_pp_tp": fmesh.slice(root, "pp", "tp"),
        "slice_tp": fmesh.slice(root, "tp"),
        "flatten_dp_tp": fmesh.flatten(fmesh.slice(root, "dp", "tp"), ("dp", "tp")),
        "flatten_pp_tp": fmesh.flatten(fmesh.slice(root, "pp", "tp"), ("pp", "tp")),
        "unflatten_world": fmesh.unflatten(
            fmesh.make_mesh({"world": WORLD}), "world", {"a": 2, "b": 4}
        ),
        "unflatten_flat": fmesh.unflatten(
            fmesh.slice(flat, "pp_tp"), "pp_tp", {"x": 2, "y": 2}
        ),
        # Not ascending: torch cannot slice in this order, but a DeviceMesh built on the
        # transposed rank array flattens to the same groups.
        "flatten_tp_pp": fmesh.flatten(fmesh.slice(root, "tp", "pp"), ("tp", "pp")),
        "flatten_all_reversed": fmesh.flatten(root, ("tp", "dp", "pp")),
    }


def torch_job(rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    fm = _torch_case_meshes()
    # realize() sets up the world from the torchrun environment.
    realized = {name: fmesh.realize(m) for name, m in fm.items()}

    names = tuple(TORCH_SHAPE)
    root = init_device_mesh("cpu", tuple(TORCH_SHAPE.values()), mesh_dim_names=names)
    world_1d = init_device_mesh("cpu", (world,), mesh_dim_names=("world",))
    flat_pp_tp = root["pp", "tp"]._flatten("pp_tp")
    transposed = DeviceMesh(
        "cpu",
        torch.arange(world).reshape(tuple(TORCH_SHAPE.values())).permute(2, 1, 0),
        mesh_dim_names=("tp", "dp", "pp"),
    )
    tm: dict[str, DeviceMesh] = {
        "root": root,
        "slice_pp_tp": root["pp", "tp"],
        "slice_tp": root["tp"],
        "flatten_dp_tp": root["dp", "tp"]._flatten("dp_tp"),
        "flatten_pp_tp": flat_pp_tp,
        "unflatten_world": world_1d._unflatten(0, (2, 4), ("a", "b")),
        "unflatten_flat": flat_pp_tp._unflatten(0, (2, 2), ("x", "y")),
        "flatten_tp_pp": transposed["tp", "pp"]._flatten("tp_pp"),
        "flatten_all_reversed": transposed._flatten("tp_dp_pp"),
    }
    out: dict[str, Any] = {}
    for name, dm in tm.items():
        r = realized[name]
        dim_names = dm.mesh_dim_names
        assert dim_names is not None
        axes = {}
        for i, axis in enumerate(dim_names):
            pg = r.group(axis)
            axes[axis] = {
                "torch_ranks": tuple(dist.get_process_group_ranks(dm.get_group(axis))),
                "torch_local_rank": dm.get_local_rank(axis),
                "torch_coordinate": (dm.get_coordinate() or ())[i],
                "fmesh_ranks": tuple(dist.get_process_group_ranks(pg)),
                "fmesh_pg_rank": pg.rank(),
                "fmesh_local_rank": r.local_rank(axis),
            }
        back = fmesh.from_device_mesh(dm)
        out[name] = {
            "dim_names": tuple(dim_names),
            "axes": axes,
            "from_device_mesh": back,
            "from_device_mesh_groups": {
                a: fmesh.group(back, a, rank) for a in back.axis_names
            },
            "from_device_mesh_coordinate": fmesh.coordinate(back, rank),
        }
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def vs_torch(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    job = run_spawn(torch_job, WORLD, tmp_path=tmp_path_factory.mktemp("torch"), timeout=150)
    return job.values()


@pytest.mark.parametrize("name", list(_torch_case_meshes()))
def test_same_groups_as_torch(vs_torch: list[dict[str, Any]], name: str) -> None:
    mesh = _torch_case_meshes()[name]
    for rank, out in enumerate(vs_torch):
        case = out[name]
        assert case["dim_names"] == mesh.axis_names
        for axis, facts in case["axes"].items():
            expected = fmesh.group(mesh, axis, rank)
            assert set(facts["torch_ranks"]) == set(expected), (rank, axis)
            assert facts["fmesh_ranks"] == expected
            coord = fmesh.coordinate(mesh, rank)
            assert coord is not None
            position = coord[mesh.axis_index(axis)]
            # torch's coordinate is in coordinate order, like fmesh's ...
            assert facts["torch_coordinate"] == position
            # ... and fmesh's group rank always agrees with it.
            assert facts["fmesh_pg_rank"] == facts["fmesh_local_rank"] == position


@pytest.mark.parametrize("name", list(_torch_case_meshes()))
def test_torch_local_rank_is_the_sorted_position(
    vs_torch: list[dict[str, Any]], name: str
) -> None:
    """torch sorts group ranks, so its local rank is the position in sorted order."""
    for rank, out in enumerate(vs_torch):
        for facts in out[name]["axes"].values():
            assert facts["torch_local_rank"] == sorted(facts["torch_ranks"]).index(rank)


def test_torch_disagrees_with_its_coordinate_on_reversed_flattens(
    vs_torch: list[dict[str, Any]],
) -> None:
    """The known torch behaviour fmesh fixes: on a non-ascending flatten,
    ``get_local_rank`` (the position in the sorted group) is not ``get_coordinate``.
    Where torch's sorted position differs from the coordinate, torch disagrees and
    fmesh does not; on ascending groups both agree."""
    disagreements: dict[str, int] = {}
    for name, mesh in _torch_case_meshes().items():
        for rank, out in enumerate(vs_torch):
            for axis, facts in out[name]["axes"].items():
                group = fmesh.group(mesh, axis, rank)
                sorted_position = sorted(group).index(rank)
                torch_disagrees = facts["torch_local_rank"] != facts["torch_coordinate"]
                assert torch_disagrees == (sorted_position != group.index(rank))
                assert facts["fmesh_pg_rank"] == facts["torch_coordinate"]
                disagreements[name] = disagreements.get(name, 0) + torch_disagrees
    # The reversed flattens really show the disagreement on this torch version;
    # the ascending cases never do.
    assert disagreements["flatten_tp_pp"] > 0
    assert disagreements["flatten_all_reversed"] > 0
    for name in ("root", "slice_pp_tp", "flatten_dp_tp", "unflatten_world"):
        assert disagreements[name] == 0


@pytest.mark.parametrize("name", list(_torch_case_meshes()))
def test_from_device_mesh_of_torch_meshes(vs_torch: list[dict[str, Any]], name: str) -> None:
    mesh = _torch_case_meshes()[name]
    for rank, out in enumerate(vs_torch):
        case = out[name]
        back: Mesh = case["from_device_mesh"]
        assert back.axis_names == mesh.axis_names
        if name not in TRANSPOSED:
            # Same rank map (torch's arange), so the very same mesh value.
            assert back == mesh
        assert case["from_device_mesh_coordinate"] == fmesh.coordinate(mesh, rank)
        for axis, facts in case["axes"].items():
            got = case["from_device_mesh_groups"][axis]
            assert got == fmesh.group(mesh, axis, rank)
            assert set(got) == set(facts["torch_ranks"])


# -- ranks that disagree, ranks that never come ---------------------------------------------

MISMATCH_TIMEOUT = datetime.timedelta(seconds=10)
MISMATCH_ODD_RANK = 3


def mismatch_meshes() -> tuple[Mesh, Mesh]:
    """(what most ranks realize, what the odd rank realizes)."""
    return fmesh.make_mesh({"dp": 2, "tp": 4}), fmesh.make_mesh({"dp": 4, "tp": 2})


def mismatch_job(rank: int, world: int) -> str:
    common, odd = mismatch_meshes()
    fmesh.realize(odd if rank == MISMATCH_ODD_RANK else common, timeout=MISMATCH_TIMEOUT)
    return "realize returned"


def test_mismatched_meshes_fail_on_every_rank(tmp_path: Path) -> None:
    job = run_spawn(mismatch_job, WORLD, tmp_path=tmp_path, timeout=90)
    common, odd = mismatch_meshes()
    # Both timeouts (mesh check and group creation) plus start-up, not a hang.
    assert job.elapsed < 60, job.describe()
    for o in job.outcomes:
        assert not o.hung, job.describe()
        assert o.error == "MeshMismatchError", job.describe()
        assert "MeshError" in o.error_mro and "ValueError" in o.error_mro
        # Every message names both meshes and says how to fix it.
        assert repr(common) in o.message and repr(odd) in o.message, o.message
        assert "same mesh" in o.message


ABSENT_RANK = WORLD - 1
ABSENT_TIMEOUT = datetime.timedelta(seconds=5)


def absent_mesh() -> Mesh:
    # 3 axes: some ranks wait on peers that are themselves stuck behind a rank next
    # to the absent one, so the cause has to travel more than one hop.
    return fmesh.make_mesh({"a": 2, "b": 2, "c": 2})


def absent_job(rank: int, world: int, outdir: str) -> str:
    import torch.distributed as dist

    if rank != ABSENT_RANK:
        fmesh.realize(absent_mesh(), timeout=ABSENT_TIMEOUT)
        return "realize returned"
    # Joins the world but never calls realize; leaves once the others reported.
    dist.init_process_group("gloo")
    deadline = time.monotonic() + 80
    others = [Path(outdir) / f"rank{r}.pkl" for r in range(world) if r != rank]
    while time.monotonic() < deadline and not all(p.exists() for p in others):
        time.sleep(0.1)
    return "never called realize"


def test_rank_that_never_realizes(tmp_path: Path) -> None:
    job = run_spawn(absent_job, WORLD, str(tmp_path), tmp_path=tmp_path, timeout=90)
    assert job.elapsed < 60, job.describe()
    for o in job.outcomes:
        if o.rank == ABSENT_RANK:
            assert o.ok and o.value == "never called realize", job.describe()
            continue
        assert o.error == "MeshMismatchError", job.describe()
        assert repr(absent_mesh()) in o.message
        assert f"[{ABSENT_RANK}]" in o.message, o.message
        # Every rank learns it at the world-wide agreement, before any group creation.
        assert "never reached realize call #1 within 5s" in o.message


# -- launching ------------------------------------------------------------------------------


def launch_job(rank: int, world: int) -> dict[str, Any]:
    import os

    import torch.distributed as dist

    out: dict[str, Any] = {"initialized": dist.is_initialized()}
    try:
        fmesh.realize(fmesh.make_mesh({"dp": 2}))
    except fmesh.MeshError as err:
        out["bare"] = (type(err).__name__, str(err))
    os.environ["RANK"] = "0"
    os.environ["WORLD_SIZE"] = "2"
    try:
        fmesh.realize(fmesh.make_mesh({"dp": 2}))
    except fmesh.MeshError as err:
        out["partial"] = (type(err).__name__, str(err))
    out["initialized_after"] = dist.is_initialized()
    return out


def test_launch_error_without_torchrun(tmp_path: Path) -> None:
    # A fresh process with every launcher variable removed.
    (out,) = run_spawn(launch_job, 1, tmp_path=tmp_path, launch_env=False, timeout=60).values()
    assert out["initialized"] is False
    name, message = out["bare"]
    assert name == "LaunchError"
    assert "torchrun" in message
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        assert var in message
    # Only the missing variables are named when some are set.
    name, message = out["partial"]
    assert name == "LaunchError"
    missing = message.split("variables ", 1)[1].split(" are not set", 1)[0]
    assert missing == "MASTER_ADDR, MASTER_PORT"
    assert out["initialized_after"] is False


def _realize_from_threads(
    mesh: fmesh.Mesh, timeout: datetime.timedelta
) -> list[fmesh.RealizedMesh | BaseException]:
    """Realize ``mesh`` from THREADS threads released at once; each one's outcome."""
    barrier = threading.Barrier(THREADS)
    results: list[fmesh.RealizedMesh | BaseException] = [RuntimeError("not run")] * THREADS

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fmesh.realize(mesh, timeout=timeout)
        except BaseException as err:
            results[i] = err

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results
