"""``fmesh.device_mesh.route()`` and ``python -m fmesh.route``: torch's own
``init_device_mesh`` behaves as the drop-in for the whole process, with no line of the
caller changed.

Every case runs in fresh processes (routing changes torch for the process): one rank
of a fake world for what routing reaches and what ``unroute`` restores, torch's
threaded world, real gloo ranks for agreement and the memo (the fault bounds are in
test_peerloss.py, which routes too). ``python -m fmesh.route`` against ``python``
itself is in test_route_python.py, the processes a routed job starts in
test_route_children.py, and real clients (torchtitan's training loop under torchrun,
accelerate, Lightning) in test_route_clients.py.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from _dist import run_spawn, threaded_world
from titan_recipe import count_new_group

import fmesh

EARLY = """\
import functools
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed import init_device_mesh as from_distributed

REGISTRY = {"mesh": init_device_mesh}
ON_CPU = functools.partial(init_device_mesh, "cpu")


def default(shape, names, build=init_device_mesh):
    return build("cpu", shape, mesh_dim_names=names)


class Builder:
    build = staticmethod(init_device_mesh)
"""
"""A module imported before ``route()``: it holds torch's function in every way
code holds a function."""

LATE = """\
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import init_device_mesh as from_tensor
"""


def _fmesh_made(dm: Any) -> bool:
    """Whether fmesh made ``dm`` (its rank map is one of fmesh's spaces)."""
    from fmesh._compat.hook import space_of

    return space_of(dm._rank_map) is not None


def routing_job(_: int, __: int, folder: str) -> dict[str, Any]:
    """One rank of an 8-rank fake world: torch's function held every way, before and
    after route(); what unroute() gives back."""
    import inspect

    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh

    from fmesh._compat import swap
    from fmesh.device_mesh import route, unroute

    sys.path.insert(0, folder)
    early: Any = importlib.import_module("early_holder")
    fn = device_mesh.init_device_mesh
    before = (fn.__code__, fn.__defaults__, fn.__kwdefaults__, dict(vars(fn)))
    signature = str(inspect.signature(fn))
    out: dict[str, Any] = {}
    route()
    route()  # idempotent: still one routing, undone by one unroute
    env = [os.environ.get("FMESH_ROUTE")]  # what the processes started now inherit
    late: Any = importlib.import_module("late_holder")
    out["signature_kept"] = str(inspect.signature(fn)) == signature
    out["same_object"] = all(
        f is fn for f in (early.init_device_mesh, early.from_distributed, late.from_tensor)
    )
    fmesh.init_fake_world(8, 5)
    new_groups = count_new_group()
    calls: dict[str, Callable[[], Any]] = {
        "early import": lambda: early.init_device_mesh(
            "cpu", (2, 4), mesh_dim_names=("a", "b")
        ),
        "torch.distributed": lambda: cast(Any, dist).init_device_mesh("cpu", (4, 2)),
        "registry": lambda: early.REGISTRY["mesh"]("cpu", (2, 2, 2)),
        "partial": lambda: early.ON_CPU((2, 4), mesh_dim_names=("c", "d")),
        "default argument": lambda: early.default((8,), ("w",)),
        "class attribute": lambda: early.Builder.build(
            "cpu", (4, 2), mesh_dim_names=("e", "f")
        ),
        "late import": lambda: late.init_device_mesh("cpu", (2, 4), mesh_dim_names=("g", "h")),
    }
    out["fmesh_made"] = {name: _fmesh_made(call()) for name, call in calls.items()}
    # The memo: the same call again creates nothing.
    stats = fmesh.cache_stats()
    again = early.init_device_mesh("cpu", (2, 4), mesh_dim_names=("a", "b"))
    after = fmesh.cache_stats()
    out["repeat"] = (after.created - stats.created, after.reused > stats.reused)
    # torch's own methods on the routed mesh go through fmesh (the drop-in's hook).
    world = early.init_device_mesh("cpu", (8,), mesh_dim_names=("world",))
    views = world._unflatten(0, (2, 2, 2), ("x", "y", "z"))
    flat = views["x", "z"]._flatten("xz")
    out["methods"] = (_fmesh_made(views), _fmesh_made(flat), flat.mesh.tolist())
    out["torch_new_group"] = new_groups[0]
    # The drop-in's errors, with torch's classes.
    try:
        fn("cpu", (2, 4), mesh_dim_names=("a", "a"))
    except RuntimeError as err:
        out["error"] = (type(err).__name__, str(err).splitlines()[0])
    unroute()
    unroute()  # nothing left to undo
    env.append(os.environ.get("FMESH_ROUTE"))
    out["env"] = env
    restored = (fn.__code__, fn.__defaults__, fn.__kwdefaults__, dict(vars(fn)))
    out["restored"] = (
        all(a is b for a, b in zip(restored[:3], before[:3])) and restored[3] == before[3]
    )
    out["routed_after"] = swap.routed()
    out["torch_after"] = not _fmesh_made(early.REGISTRY["mesh"]("cpu", (2, 4)))
    out["torch_groups_after"] = new_groups[0] > out["torch_new_group"]
    # Meshes made while routed keep fmesh's groups and methods.
    out["kept"] = _fmesh_made(again["b"]) and _fmesh_made(
        world._unflatten(0, (4, 2), ("p", "q"))
    )
    fmesh.destroy()
    dist.destroy_process_group()
    return out


def test_route_reaches_every_holder_and_unroute_restores_torch(tmp_path: Path) -> None:
    (tmp_path / "early_holder.py").write_text(EARLY)
    (tmp_path / "late_holder.py").write_text(LATE)
    job = run_spawn(routing_job, 1, str(tmp_path), tmp_path=tmp_path / "job", launch_env=False)
    out = job.values()[0]
    assert out["same_object"] and out["signature_kept"]
    # Imported before route() or after, held by a dict, a partial, a default argument
    # or a class: every call builds fmesh's mesh.
    assert out["fmesh_made"] == dict.fromkeys(out["fmesh_made"], True)
    assert len(out["fmesh_made"]) == 7
    assert out["repeat"] == (0, True)
    assert out["methods"] == (True, True, [0, 1, 4, 5])  # rank 5: y = 0
    assert out["torch_new_group"] == 0
    assert out["error"][0] == "DeviceMeshError"
    assert out["error"][1].startswith("Each mesh_dim_name must be unique")
    # unroute(): torch's code, defaults and attributes, the same function object.
    assert out["restored"] and not out["routed_after"]
    # Processes started while routed are routed too; after unroute(), not.
    assert out["env"] == ["1", None]
    assert out["torch_after"] and out["torch_groups_after"]
    assert out["kept"]


def threaded_job(_: int, __: int) -> dict[int, Any]:
    """Four ranks as threads on torch's threaded world, routed: the drop-in hands the
    call to torch's own function, which must not come back to it."""
    from torch.distributed.device_mesh import init_device_mesh

    from fmesh.device_mesh import route

    route()

    def rank_main(rank: int) -> object:
        dm = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        return (dm.get_coordinate(), fmesh.cache_stats().created)

    return threaded_world(rank_main)


def test_routed_threaded_worlds_get_torchs_own_mesh(tmp_path: Path) -> None:
    results = run_spawn(threaded_job, 1, tmp_path=tmp_path, launch_env=False).values()[0]
    assert results == {r: ((r // 2, r % 2), 0) for r in range(4)}


def test_a_torch_whose_function_is_not_plain_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.distributed.device_mesh as device_mesh

    from fmesh.device_mesh import route

    wrapped = functools.partial(device_mesh.init_device_mesh)
    monkeypatch.setattr(device_mesh, "init_device_mesh", wrapped)
    with pytest.raises(RuntimeError, match="not torch's plain Python function: fmesh cannot"):
        route()


def _routing_trainer() -> None:
    """Trainer code that routes itself, then builds a mesh with torch's function."""
    from torch.distributed.device_mesh import init_device_mesh

    from fmesh.device_mesh import route

    route()
    init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))


def plan_job(_: int, __: int) -> tuple[list[int], bool, bool]:
    """``fmesh plan`` of code that calls route(): plan points torch's module attribute
    at the drop-in for its run, and route() there must not route the drop-in itself."""
    import torch.distributed.device_mesh as device_mesh

    from fmesh._compat import swap

    torch_fn = device_mesh.init_device_mesh
    report = fmesh.plan(_routing_trainer, world=8, ranks=[0, 5])
    return (
        [r.created for r in report.ranks],
        device_mesh.init_device_mesh is torch_fn,
        swap.routed(),
    )


def test_route_inside_fmesh_plan_leaves_plans_routing_alone(tmp_path: Path) -> None:
    created, restored, routed = run_spawn(
        plan_job, 1, tmp_path=tmp_path, launch_env=False
    ).values()[0]
    assert created == [2, 2]  # each rank's dp and tp groups, made by fmesh
    assert restored and not routed


def foreign_job(_: int, __: int) -> str:
    """Another library replaced the code after route(): unroute() leaves it."""
    import torch.distributed.device_mesh as device_mesh

    from fmesh.device_mesh import route, unroute

    route()
    fn: Any = device_mesh.init_device_mesh
    fn.__code__ = (lambda *a, **k: None).__code__
    try:
        unroute()
    except RuntimeError as err:
        return str(err)
    return "no error"


def test_unroute_leaves_code_another_library_put_there(tmp_path: Path) -> None:
    message = run_spawn(foreign_job, 1, tmp_path=tmp_path, launch_env=False).values()[0]
    assert "another library replaced it after fmesh.device_mesh.route()" in message


# -- real ranks: agreement and the memo ------------------------------------------------------


def gloo_job(rank: int, world: int, late: bool) -> dict[str, Any]:
    """torch's function, routed: the memo, no torch new_group, and ranks that disagree
    get fmesh's error instead of a hang. ``late``: rank 2 makes its first call only
    once the others have ended it and are at their second."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from fmesh._compat import default_store
    from fmesh.device_mesh import route

    route()
    dist.init_process_group("gloo")
    new_groups = count_new_group()
    out: dict[str, Any] = {}
    if late and rank == 2:
        _wait_for_record(default_store(), "/p/c", b"2|")
    # Both calls create groups, so every rank agrees first (as test_dropin.py's).
    shape = (1, world) if rank == 0 else (2, world // 2)
    try:
        init_device_mesh("cpu", shape, mesh_dim_names=("a", "b"))
        out["error"] = None
    except fmesh.MeshMismatchError as err:
        out["error"] = str(err)
    dm = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    created = fmesh.cache_stats().created
    init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    out.update(
        tp=dist.get_process_group_ranks(dm.get_group("tp")),
        created=created,
        repeat_created=fmesh.cache_stats().created - created,
        new_group=new_groups[0],
    )
    return out


def _wait_for_record(store: Any, suffix: str, prefix: bytes) -> None:
    """Until the stream's record (the key ending with ``suffix``) holds a call's
    record starting with ``prefix``."""
    deadline = time.monotonic() + 60
    while True:
        found = [k for k in store.list_keys() if k.endswith(suffix)]
        if found and bytes(store.get(found[0])).startswith(prefix):
            return
        assert time.monotonic() < deadline, f"no record {prefix!r} at {found} in 60 s"
        time.sleep(0.05)


@pytest.mark.parametrize("late", [False, True], ids=["together", "late"])
def test_routed_calls_agree_and_hit_the_memo_on_gloo(tmp_path: Path, late: bool) -> None:
    """Late: rank 2 comes to the first call after the others ended it (CI saw this on
    a loaded machine, and then every rank's second call failed)."""
    outs = run_spawn(gloo_job, 4, late, tmp_path=tmp_path, timeout=90).values()
    for rank, out in enumerate(outs):
        assert out["tp"] == [rank // 2 * 2, rank // 2 * 2 + 1]
        assert out["created"] == 2 and out["repeat_created"] == 0, out
        assert out["new_group"] == 0
        assert out["error"] is not None, rank
        assert "Mesh(a=2, b=2)" in out["error"] and "Mesh(a=1, b=4)" in out["error"]
