"""Groups destroyed or aborted by anyone are forgotten by the memo, on 4 real gloo ranks.

``dist.destroy_process_group`` on a group of a drop-in mesh, then the same mesh again
(``init_device_mesh`` of the same shape, or ``_unflatten`` again): fresh groups that
all-reduce, as on torch, where fmesh used to hand back the destroyed one. On torch
2.15, ``root.abort()`` (torch's way for survivors to abort a mesh's groups) then a
rebuild: every rank all-reduces on new groups. The groups nobody destroyed stay
memoized (the very same objects).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _dist import run_spawn

WORLD = 4
JOB_TIMEOUT = 120.0


def _sum(pg: Any) -> tuple[int, int]:
    """(all_reduce of 2**rank over ``pg``, the sum its ranks predict)."""
    import torch
    import torch.distributed as dist

    bits = torch.tensor([1 << dist.get_rank()], dtype=torch.int64)
    dist.all_reduce(bits, group=pg)
    return int(bits.item()), sum(1 << r for r in dist.get_process_group_ranks(pg))


def destroy_job(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    import fmesh
    from fmesh.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    out: dict[str, Any] = {}
    root = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp, dp = root.get_group("tp"), root.get_group("dp")
    _sum(tp)
    dist.destroy_process_group(tp)
    created = fmesh.cache_stats().created
    again = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    out["init"] = {
        "tp_fresh": again.get_group("tp") is not tp,
        "dp_kept": again.get_group("dp") is dp,
        "created": fmesh.cache_stats().created - created,
        "tp": _sum(again.get_group("tp")),
        "dp": _sum(again.get_group("dp")),
    }

    whole = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("w",))
    first = whole._unflatten(0, (2, 2), ("a", "b"))
    b = first.get_group("b")
    _sum(b)
    dist.destroy_process_group(b)
    created = fmesh.cache_stats().created
    second = whole._unflatten(0, (2, 2), ("a", "b"))
    out["unflatten"] = {
        "b_fresh": second.get_group("b") is not b,
        "created": fmesh.cache_stats().created - created,
        "a": _sum(second.get_group("a")),
        "b": _sum(second.get_group("b")),
    }
    # The same group, destroyed again: made once more, under a name of its own.
    names = {second.get_group("b").group_name}
    dist.destroy_process_group(second.get_group("b"))
    third = init_device_mesh("cpu", (2, 2), mesh_dim_names=("x", "y"))
    names.add(third.get_group("y").group_name)
    out["third"] = {"names": len(names), "y": _sum(third.get_group("y"))}
    dist.barrier()
    return out


def test_destroyed_groups_are_made_afresh(tmp_path: Path) -> None:
    job = run_spawn(destroy_job, WORLD, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT)
    for rank, out in enumerate(job.values()):
        init = out["init"]
        assert init["tp_fresh"] is True and init["dp_kept"] is True, (rank, out)
        assert init["created"] == 1, (rank, out)  # only the tp group, made again
        assert init["tp"][0] == init["tp"][1], (rank, out)
        assert init["dp"][0] == init["dp"][1], (rank, out)
        unflatten = out["unflatten"]
        assert unflatten["b_fresh"] is True and unflatten["created"] == 1, (rank, out)
        assert unflatten["a"][0] == unflatten["a"][1], (rank, out)
        assert unflatten["b"][0] == unflatten["b"][1], (rank, out)
        assert out["third"]["names"] == 2, (rank, out)
        assert out["third"]["y"][0] == out["third"]["y"][1], (rank, out)


def abort_job(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    from fmesh._compat import live_groups
    from fmesh.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    root = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    # (No flatten of both dims: a world-wide one is the default group, on torch too,
    # and abort() would abort it.)
    old = {n: root.get_group(n) for n in ("dp", "tp")}
    _sum(old["tp"])
    out: dict[str, Any] = {}
    sub: Any = root["tp"]  # abort(): torch 2.15 (not in every torch's stubs)
    try:
        sub.abort()
    except RuntimeError as err:
        out["submesh"] = str(err)
    whole: Any = root
    whole.abort()
    live = live_groups()
    out["aborted"] = [n for n, pg in old.items() if pg not in live]
    again = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    out["fresh"] = [n for n in ("dp", "tp") if again.get_group(n) is not old[n]]
    out["sums"] = {n: _sum(again.get_group(n)) for n in ("dp", "tp")}
    out["unflatten"] = _sum(again._unflatten(1, (2, 1), ("t2", "one")).get_group("t2"))
    return out


def test_abort_then_rebuild_all_reduces_on_new_groups(tmp_path: Path) -> None:
    from fmesh._compat import torch_version

    if torch_version() < (2, 15):
        pytest.skip("DeviceMesh.abort() is new in torch 2.15: run this test under torch 2.15")
    job = run_spawn(abort_job, WORLD, tmp_path=tmp_path, linger=False, timeout=JOB_TIMEOUT)
    for rank, out in enumerate(job.values()):
        assert "not supported on a submesh" in out["submesh"], (rank, out)
        assert out["aborted"] == ["dp", "tp"], (rank, out)
        assert out["fresh"] == ["dp", "tp"], (rank, out)
        for name, (got, expected) in out["sums"].items():
            assert got == expected, (rank, name, out)
        assert out["unflatten"][0] == out["unflatten"][1], (rank, out)
