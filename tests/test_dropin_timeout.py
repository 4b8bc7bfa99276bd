"""``init_device_mesh(..., timeout=)``: fmesh's keyword, on every group of the mesh
and of the meshes torch's methods derive from it (real gloo processes)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
from _dist import run_spawn

import fmesh

WORLD = 4
TIMEOUT = datetime.timedelta(seconds=123)


def _timeouts(dm: Any) -> list[float | None]:
    from fmesh._compat.c10d import group_timeout

    out = []
    for g in dm.get_all_groups():
        t = group_timeout(g)
        out.append(None if t is None else t.total_seconds())
    return out


def timeout_job(rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from fmesh.device_mesh import init_device_mesh

    dist.init_process_group("gloo", rank=rank, world_size=world)
    plain = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    root = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"), timeout=TIMEOUT)
    flat = root._flatten("dp_tp")  # the whole world: a group of its own, not WORLD
    world_root = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("w",), timeout=TIMEOUT)
    meshes = {
        "root": root,
        "slice": root["tp"],
        "flatten": flat,
        "flatten_slice": root["dp_tp"],
        "unflatten": flat._unflatten(0, (2, 2), ("a", "b")),
        "unflatten_other": world_root._unflatten(0, (4, 1), ("x", "y")),
        "post_forward": DeviceMesh("cpu", world_root.mesh.view(-1, 2)),
        "plain": plain,
        "plain_flatten": plain._flatten("dp_tp"),
    }
    out: dict[str, Any] = {name: _timeouts(dm) for name, dm in meshes.items()}
    # The groups work: one all-reduce on the flattened (whole-world) group.
    x = torch.ones(1)
    dist.all_reduce(x, group=flat.get_group())
    out["sum"] = x.item()
    out["world_is_flat"] = flat.get_group() is dist.group.WORLD
    out["default"] = _timeouts(plain)[0]
    out["bad"] = []
    for bad in (5, datetime.timedelta(0)):
        try:
            init_device_mesh("cpu", (WORLD,), timeout=bad)  # type: ignore[arg-type]  # on purpose
        except Exception as err:
            out["bad"].append(type(err).__mro__)
    return out


@pytest.fixture(scope="module")
def outs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    job = run_spawn(timeout_job, WORLD, tmp_path=tmp_path_factory.mktemp("t"), timeout=180)
    return job.values()


def test_the_timeout_reaches_every_derived_group(outs: list[dict[str, Any]]) -> None:
    want = TIMEOUT.total_seconds()
    for rank, out in enumerate(outs):
        for name in ("root", "slice", "flatten", "flatten_slice", "unflatten"):
            assert out[name] == [want] * len(out[name]), (rank, name, out[name])
        assert out["unflatten_other"] == [want, want], rank
        assert out["post_forward"] == [want, want], rank
        assert out["sum"] == WORLD
        assert not out["world_is_flat"]


def test_meshes_without_a_timeout_keep_torchs_default(outs: list[dict[str, Any]]) -> None:
    for out in outs:
        default = out["default"]
        assert default is not None and default != TIMEOUT.total_seconds()
        assert out["plain"] == [default, default]
        assert out["plain_flatten"] == [default]


def test_a_bad_timeout_is_refused_with_torchs_classes(outs: list[dict[str, Any]]) -> None:
    for out in outs:
        not_timedelta, zero = out["bad"]
        assert TypeError in not_timedelta
        assert ValueError in zero and fmesh.MeshError in zero


def disagree_job(rank: int, world: int) -> float:
    import time

    import torch.distributed as dist

    from fmesh.device_mesh import init_device_mesh

    dist.init_process_group("gloo", rank=rank, world_size=world)
    dist.barrier()  # see mismatch_job in tests/test_dropin.py
    start = time.monotonic()
    try:
        init_device_mesh(
            "cpu", (2, 2), mesh_dim_names=("dp", "tp"), timeout=TIMEOUT if rank == 0 else None
        )
    except fmesh.MeshMismatchError:
        return time.monotonic() - start
    raise AssertionError("no MeshMismatchError")


def test_ranks_that_disagree_about_the_timeout_raise(tmp_path: Path) -> None:
    # Groups made with another timeout are other groups: the agreement tells the calls
    # apart, and every rank raises within seconds instead of making mismatched groups.
    waited = run_spawn(disagree_job, WORLD, tmp_path=tmp_path, timeout=120).values()
    assert max(waited) < 60, waited
