"""What a realize call asks of the store, request by request, on 4 real gloo ranks.

Each rank starts its default group on a counting wrapper around the launcher's store
(``bench.counting.CountingStore``: a ``get`` counts two, as on the wire), so every
request of fmesh's agreement is seen. Checked: a hit (a mesh, its slices and flattens,
realized before; also equal values built anew) sends nothing; a 1-d mesh over the whole
world in rank order is served by the default group (no group, no request, the first
time too); a call that creates groups costs each rank at most 5 agreement requests and
leaves no agreement key behind; the first one of a process costs at most 6 requests in
all (agreement, watch, closing barrier, the sentinel's address), plus one read and one
slice per interval it waits.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from _dist import run_spawn

import fmesh
from bench.counting import CountingStore, by_call, delta
from fmesh._protocol import watch

WORLD = 4


def _left(raw: Any) -> list[str]:
    """fmesh's agreement keys in the store, each without its call's prefix."""
    return sorted(
        k.split("fmesh/a/", 1)[1].split("/", 3)[3] for k in raw.list_keys() if "fmesh/a/" in k
    )


def _meshes() -> list[fmesh.Mesh]:
    """A 3-axis mesh, its slices and flattens: built anew on every call."""
    mesh = fmesh.make_mesh({"dp": 2, "fsdp": 1, "tp": 2})
    return [
        mesh,
        mesh["dp"],
        mesh["tp", "dp"],
        fmesh.flatten(mesh, ("dp", "tp")),
        fmesh.flatten(mesh, ("tp", "fsdp", "dp")),
    ]


def counted_job(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    raw: Any = dist.TCPStore(  # type: ignore[attr-defined]  # implicit re-export
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False
    )
    store = CountingStore(raw)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    out: dict[str, Any] = {}

    def phase(name: str, meshes: list[fmesh.Mesh]) -> None:
        before, keys = store.snapshot(), store.key_snapshot()
        created = 0
        for mesh in meshes:
            counts, start = store.snapshot(), time.monotonic()
            made = fmesh.realize(mesh).created
            mine = delta(store.snapshot(), counts)
            if made and "first" not in out:  # fmesh's own: agreement, watch, sentinel
                fmesh_own = mine.get("agree", 0) + mine.get("watch", 0)
                out["first"] = {"fmesh": fmesh_own, "seconds": time.monotonic() - start}
            created += made
        out[name] = {
            "requests": sum(delta(store.snapshot(), before).values()),
            "agree_per_call": by_call(delta(store.key_snapshot(), keys))[0],
            "created": created,
        }

    phase("world", [fmesh.make_mesh({"world": world})])
    phase("create", _meshes())
    phase("hit_same", _meshes()[:1] * 3)
    phase("hit_fresh", _meshes())
    dist.barrier(group=fmesh.realize(fmesh.make_mesh({"world": world})).group("world"))
    out["left"] = _left(raw) if rank == 0 else []
    return out


def test_hits_send_nothing_and_creating_calls_send_a_handful(tmp_path: Path) -> None:
    outs = run_spawn(counted_job, WORLD, tmp_path=tmp_path, timeout=90).values()
    for rank, out in enumerate(outs):
        world = out["world"]
        assert world == {"requests": 0, "agree_per_call": {}, "created": 0}, (rank, out)
        create = out["create"]
        assert create["created"] > 0, out
        # One agreement per call that created groups; each at most 5 requests.
        calls = create["agree_per_call"]
        assert 1 <= len(calls) <= len(_meshes()), out
        assert max(calls.values()) <= 5, calls
        for name in ("hit_same", "hit_fresh"):
            assert out[name] == {"requests": 0, "agree_per_call": {}, "created": 0}, out
        # The process's first creating call, everything of fmesh's counted: the
        # sentinel's address, the agreement, the closing barrier (no cleanup: nothing of
        # its stream came before). A call that waits past an interval (1 s here; a
        # loaded machine) reads once an interval and slices its wait: the successor's
        # address is one of those reads.
        first = out["first"]
        assert first["fmesh"] <= 6 + 2 * int(first["seconds"] / watch.INTERVAL), first
    # A call that ended well leaves its counter and its closing barrier's key to its
    # stream's next creating call, which deletes them: the last call's two, no more.
    assert outs[0]["left"] == ["done", "w/ok"], outs[0]
