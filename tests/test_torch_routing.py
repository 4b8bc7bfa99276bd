"""torch's own DeviceMesh methods on fmesh's meshes go through fmesh (real processes).

A trainer that changes one import (``fmesh.device_mesh.init_device_mesh``) and then
calls torch's ``_unflatten``, ``_flatten`` and ``__getitem__`` as torchtitan's
``ParallelDims.build_mesh`` does gets fmesh's groups: each rank creates only its own,
once per process, agreed first. Checked here on 4 gloo ranks, counted on the store,
against fmesh's own API; and what must stay torch's stays torch's.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from _dist import run_spawn
from titan_recipe import (
    CONFIG,
    OTHER,
    WORLD,
    build,
    count_new_group,
    fmesh_views,
    register_fake,
)

import fmesh
from bench.counting import CountingStore, by_call, delta


def _left(raw: Any) -> list[str]:
    """fmesh's agreement keys in the store, each without its generation and stream."""
    return sorted(
        k.split("fmesh/a/", 1)[1].split("/", 2)[2] for k in raw.list_keys() if "fmesh/a/" in k
    )


def _facts(meshes: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    return {
        name: (
            dm.mesh.tolist(),
            dm.get_coordinate(),
            [tuple(dist.get_process_group_ranks(g)) for g in dm.get_all_groups()],
            [dm.get_local_rank(i) for i in range(dm.ndim)],
            # backend_override is honoured: the "fake" dims get fake groups.
            [str(dist.get_backend(g)) for g in dm.get_all_groups()],
        )
        for name, dm in meshes.items()
    }


def _counted_world(rank: int, world: int) -> tuple[Any, CountingStore]:
    import torch.distributed as dist

    raw: Any = dist.TCPStore(  # type: ignore[attr-defined]  # implicit re-export
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False
    )
    store = CountingStore(raw)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    return raw, store


def titan_job(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh as torch_init

    from fmesh.device_mesh import init_device_mesh

    raw, store = _counted_world(rank, world)
    new_groups = count_new_group()
    out: dict[str, Any] = {"torch": _facts(build(torch_init, CONFIG))}
    torch_new_groups = new_groups[0]
    new_groups[0] = 0
    created = fmesh.cache_stats().created
    before, keys = store.snapshot(), store.key_snapshot()
    ours = build(init_device_mesh, CONFIG)
    out["fmesh"] = _facts(ours)
    out["first"] = {
        "created": fmesh.cache_stats().created - created,
        "new_group": new_groups[0],
        "agree_per_call": by_call(delta(store.key_snapshot(), keys))[0],
    }
    before = store.snapshot()
    again = build(init_device_mesh, CONFIG)
    out["repeat"] = {
        "requests": sum(delta(store.snapshot(), before).values()),
        "new_root": again["world"] is not ours["world"],
        "same_groups": _facts(again) == out["fmesh"],
    }
    out["torch_new_group"] = torch_new_groups
    # The groups fmesh's own API makes for the same views: all memo hits now.
    before = store.snapshot()
    hits = [fmesh.realize(m, backend=b or None).created for m, b in fmesh_views(CONFIG)]
    out["api_after"] = {
        "created": sum(hits),
        "requests": sum(delta(store.snapshot(), before).values()),
    }
    ours["world"].get_group().barrier()
    out["left"] = _left(raw) if rank == 0 else []
    return out


def api_job(rank: int, world: int) -> dict[str, Any]:
    """fmesh's own API on the same views, in fresh processes: the groups it creates."""
    register_fake()
    store = _counted_world(rank, world)  # held: torch keeps no Python reference to it
    created = sum(fmesh.realize(m, backend=b or None).created for m, b in fmesh_views(CONFIG))
    del store
    return {"created": created}


def test_a_titan_build_creates_fmesh_groups_once_and_answers_as_torch(tmp_path: Path) -> None:
    outs = run_spawn(titan_job, WORLD, tmp_path=tmp_path / "titan", timeout=120).values()
    api = run_spawn(api_job, WORLD, tmp_path=tmp_path / "api", timeout=90).values()
    for rank, (out, own) in enumerate(zip(outs, api)):
        # Every mesh, coordinate, group and local rank is torch's own answer.
        assert out["fmesh"] == out["torch"], rank
        first = out["first"]
        # Exactly the groups fmesh's own API creates for these views, and no torch
        # new_group call (torch made some for the same build).
        assert first["created"] == own["created"] > 0, (rank, first, own)
        assert first["new_group"] == 0 and out["torch_new_group"] > 0, out
        # Each creating call agreed, at most 4 store requests per rank but on the last
        # rank out of a call (it also removes the previous call's two keys).
        assert 1 <= len(first["agree_per_call"]) <= 5, first
        assert max(first["agree_per_call"].values()) <= 6, first
        # The same build again (a new root, as torch's): no store request at all.
        assert out["repeat"] == {"requests": 0, "new_root": True, "same_groups": True}, out
        assert out["api_after"] == {"created": 0, "requests": 0}, out
    # The stream's record and the last creating call's count and "ok" (test_hot_path).
    last = max(int(k.split("/")[0]) for k in outs[0]["left"] if k != "c")
    assert outs[0]["left"] == sorted(["c", f"{last}/n", f"{last}/ok"]), outs[0]["left"]


def mismatch_job(rank: int, world: int) -> dict[str, Any]:
    from fmesh.device_mesh import init_device_mesh

    start = time.monotonic()
    try:
        build(init_device_mesh, OTHER if rank == 3 else CONFIG)
    except fmesh.MeshMismatchError as err:
        return {
            "error": "MeshMismatchError",
            "message": str(err),
            "after": time.monotonic() - start,
        }
    return {"error": None, "after": time.monotonic() - start}


def test_a_config_that_differs_on_one_rank_raises_on_every_rank(tmp_path: Path) -> None:
    # Default timeouts: torch would hang here until its own timeout (30 minutes).
    job = run_spawn(mismatch_job, WORLD, tmp_path=tmp_path, timeout=90)
    for outcome in job.values():
        assert outcome["error"] == "MeshMismatchError", outcome
        assert outcome["after"] < 60, outcome
        # Names both ranks and both meshes (the first view built: the data-loading
        # unflatten, batch = dp_replicate x dp_shard).
        message = outcome["message"]
        assert re.search(r"ranks ([0-2] and 3|3 and [0-2]) disagree", message), message
        assert "Mesh(pp=1, batch=2, cp=1, tp=2)" in message, message
        assert "Mesh(pp=1, batch=4, cp=1, tp=1)" in message, message


def two_roots_job(rank: int, world: int) -> dict[str, Any]:
    from fmesh.device_mesh import init_device_mesh

    first = build(init_device_mesh, CONFIG)
    created = fmesh.cache_stats().created
    second = build(init_device_mesh, OTHER)  # torchtitan: the same loss_mesh name
    return {
        "distinct_roots": first["world"] is not second["world"],
        "loss": (first["loss"].mesh.tolist(), second["loss"].mesh.tolist()),
        "more_groups": fmesh.cache_stats().created - created,
        "first_still": first["loss"].get_group() is not None,
    }


def test_two_roots_of_different_shapes_in_one_process(tmp_path: Path) -> None:
    outs = run_spawn(two_roots_job, WORLD, tmp_path=tmp_path, timeout=90).values()
    for rank, out in enumerate(outs):
        assert out["distinct_roots"] and out["first_still"], out
        # loss = batch x cp: (dp_shard=2) on the first, (dp_replicate=2 x dp_shard=2).
        first, second = out["loss"]
        assert second == list(range(WORLD)), out
        assert rank in first and len(first) == 2, out
        # Every group of the second build exists already: its batch and loss dims span
        # the world (the default group), dp_replicate is the first's dp_shard (stride
        # 2), dp_shard the first's tp (stride 1), and its size-1 dims are memoized too.
        assert out["more_groups"] == 0, out


def torch_untouched_job(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh as torch_init

    from fmesh._compat.hook import installed, space_of
    from fmesh.device_mesh import init_device_mesh

    init_device_mesh("cpu", (WORLD,), mesh_dim_names=("world",))  # installs the hook
    new_groups = count_new_group()
    created = fmesh.cache_stats().created
    theirs = torch_init("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    flat = theirs._flatten("dp_tp_flat")
    split = flat._unflatten(0, (2, 2), ("a", "b"))
    return {
        "installed": installed(),
        "routed": space_of(theirs._rank_map) is not None,
        "fmesh_created": fmesh.cache_stats().created - created,
        "torch_new_group": new_groups[0],
        "groups": [tuple(dist.get_process_group_ranks(g)) for g in split.get_all_groups()],
    }


def test_torch_own_init_device_mesh_in_the_same_process_is_torchs(tmp_path: Path) -> None:
    outs = run_spawn(torch_untouched_job, WORLD, tmp_path=tmp_path, timeout=90).values()
    for out in outs:
        assert out["installed"] is True and out["routed"] is False, out
        # torch's own meshes create their groups with torch's new_group, none by fmesh.
        assert out["fmesh_created"] == 0 and out["torch_new_group"] > 0, out
        assert len(out["groups"]) == 2, out


def prior_hook_job(rank: int, world: int) -> dict[str, Any]:
    """Another library wrapped DeviceMesh before fmesh; its wrapper still runs for
    torch's meshes, and fmesh's meshes do not reach it for group creation."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.device_mesh import init_device_mesh as torch_init

    seen = {"init": 0, "groups": 0}
    cls: Any = DeviceMesh
    init, groups = cls.__init__, cls.__dict__["_init_process_groups"].__func__

    def their_init(self: Any, *args: Any, **kwargs: Any) -> None:
        seen["init"] += 1
        init(self, *args, **kwargs)

    def their_groups(*args: Any, **kwargs: Any) -> Any:
        seen["groups"] += 1
        return groups(*args, **kwargs)

    cls.__init__ = their_init
    cls._init_process_groups = staticmethod(their_groups)
    from fmesh.device_mesh import init_device_mesh

    ours = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("world",))
    ours._unflatten(0, (2, 2), ("dp", "tp"))["tp"]
    after_ours = dict(seen)
    torch_init("cpu", (2, 2), mesh_dim_names=("dp", "tp"))._flatten()
    return {"after_ours": after_ours, "after_torch": seen}


def test_a_hook_installed_before_fmesh_is_kept(tmp_path: Path) -> None:
    outs = run_spawn(prior_hook_job, WORLD, tmp_path=tmp_path, timeout=90).values()
    for out in outs:
        # fmesh's meshes: built by fmesh (the __init__ probe of the compat package
        # is one call of theirs), groups by fmesh.
        assert out["after_ours"]["groups"] == 0, out
        assert out["after_ours"]["init"] <= 1, out
        # torch's: their wrappers ran (root + flatten: 2 inits, 2 group creations).
        assert out["after_torch"]["init"] - out["after_ours"]["init"] >= 2, out
        assert out["after_torch"]["groups"] - out["after_ours"]["groups"] >= 2, out
