"""What a realize call asks of the store, request by request, on 4 real gloo ranks.

Each rank starts its default group on a counting wrapper around the launcher's store
(``bench.counting.CountingStore``: a ``get`` counts two, as on the wire), so every
request of fmesh's agreement is seen. Checked: a hit (a mesh, its slices and flattens,
realized before; also equal values built anew) sends nothing; a 1-d mesh over the whole
world in rank order is served by the default group (no group, no request, the first
time too); a call that creates groups costs each rank at most 4 requests of fmesh's own
(the record, the count, the wait or the wake, and the last rank's removal of the
previous call's two keys), the first one of a process at most 4 in all (its port's
address instead of the removal), plus one read and one slice per interval it waits;
the store keeps the stream's record and the last call's two keys, no more.
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
    """fmesh's agreement keys in the store, each without its generation and stream."""
    return sorted(
        k.split("fmesh/a/", 1)[1].split("/", 2)[2] for k in raw.list_keys() if "fmesh/a/" in k
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
        before, keys, began = store.snapshot(), store.key_snapshot(), time.monotonic()
        created = 0
        for mesh in meshes:
            counts, start = store.snapshot(), time.monotonic()
            made = fmesh.realize(mesh).created
            mine = delta(store.snapshot(), counts)
            if made and "first" not in out:  # fmesh's own: record, count, wait, address
                fmesh_own = mine.get("agree", 0) + mine.get("watch", 0)
                out["first"] = {"fmesh": fmesh_own, "seconds": time.monotonic() - start}
            created += made
        mine = delta(store.snapshot(), before)
        out[name] = {
            "requests": sum(mine.values()),
            "agree_per_call": by_call(delta(store.key_snapshot(), keys))[0],
            "own": mine.get("agree", 0) + mine.get("watch", 0),
            "created": created,
            "seconds": time.monotonic() - began,
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
    nothing = {"requests": 0, "agree_per_call": {}, "own": 0, "created": 0}

    def waited(phase: dict[str, Any]) -> int:
        """The reads a phase's waits may add: 2 per interval (a loaded machine)."""
        return 2 * int(phase["seconds"] / watch.INTERVAL)

    for out in outs:
        assert {k: v for k, v in out["world"].items() if k != "seconds"} == nothing, out
        create = out["create"]
        assert create["created"] > 0, out
        # One agreement per call that created groups (the stream's record shared among
        # them); a rank's own requests per call, the first call's address included, at
        # most 4 but on the last rank out of a call, which also removes the previous
        # call's two keys; and the reads of waits past an interval.
        calls = create["agree_per_call"]
        assert 1 <= len(calls) <= len(_meshes()), out
        assert create["own"] <= 4 * len(calls) + 2 + waited(create), out
        for name in ("hit_same", "hit_fresh"):
            assert {k: v for k, v in out[name].items() if k != "seconds"} == nothing, out
        # The process's first creating call, everything of fmesh's counted: the port's
        # address, the record, the count, the wait (no removal: nothing of its stream
        # came before). A call that waits past an interval (1 s here; a loaded machine)
        # reads once an interval and slices its wait: the successor's address is one
        # of those reads.
        first = out["first"]
        assert first["fmesh"] <= 4 + 2 * int(first["seconds"] / watch.INTERVAL), first
    # A call that ended well leaves its count and "ok" to its stream's next creating
    # call, whose last rank out deletes them; the stream's record stays (it is swapped,
    # never deleted).
    # Per call and rank, over the ranks: at most 4 (3 + 2 / ranks, plus the address
    # once per process), besides the reads of waits past an interval.
    calls = len(outs[0]["create"]["agree_per_call"])
    own = sum(out["create"]["own"] - waited(out["create"]) for out in outs)
    assert own / (len(outs) * calls) <= 4, [out["create"] for out in outs]
    last = max(int(k.split("/")[0]) for k in outs[0]["left"] if k != "c")
    assert outs[0]["left"] == sorted(["c", f"{last}/n", f"{last}/ok"]), outs[0]
