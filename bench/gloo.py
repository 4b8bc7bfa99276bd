"""realize on real gloo processes: wall time, groups, rendezvous-store keys.

One job per library per repeat (interleaved: the machine's load drifts), one fresh
process per rank. Each rank runs the phases below, each between barriers, and times
its own call; a phase's time is the slowest rank's. Rank 0 counts the keys in the
rendezvous store (``store.num_keys()``, every rank's keys) before and after a phase.

* ``world_1d``: a 1-d mesh over the whole world, whose group is the default group:
  fmesh creates nothing, so its time is the cross-rank mesh check (agreement) alone;
  torch's ``init_device_mesh`` of it needs no agreement.
* ``new``: the 5-d mesh and its three flattens (torch: ``init_device_mesh`` + 3
  ``_flatten`` calls), creating every group.
* ``memo`` (fmesh only): the same realize calls again, every group in the memo.
"""

from __future__ import annotations

import datetime
import math
import os
import statistics
import time

from . import torch_ref
from .launch import run_gloo_job
from .recipes import TRAINER5, WORLD_1D
from .shared import Bench, Json, Row, shape_str

# world_1d first: later, a flatten of the 5-d mesh may cover the world in rank order
# (then fmesh's memo already holds that axis).
PHASES = {
    "fmesh": (("world_1d", WORLD_1D.fmesh), ("new", TRAINER5.fmesh), ("memo", TRAINER5.fmesh)),
    "torch": (("world_1d", WORLD_1D.torch), ("new", TRAINER5.torch)),
}


def worker_rank(spec: Json) -> Json:
    """One rank of a real gloo job: every phase of ``spec["impl"]``."""
    import torch.distributed as dist

    import fmesh
    from fmesh._agree import KEY_ROOT  # what every key of fmesh's agreement contains

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=spec["timeout_s"])
    store = torch_ref.connect_store(spec["port"], world, timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    torch_ref.preload_lazy_imports()
    impl: str = spec["impl"]
    shape: list[int] = spec["shape"]
    out: Json = {"rank": rank}
    keep: list[object] = []
    for phase, fn in PHASES[impl]:
        dist.barrier()
        keys0 = store.num_keys() if rank == 0 else 0
        groups0, _ = torch_ref.group_counters()
        created0 = fmesh.cache_stats().created
        dist.barrier()
        start = time.perf_counter()
        result = fn(shape)
        seconds = time.perf_counter() - start
        keep.append(result)
        dist.barrier()
        keys1 = store.num_keys() if rank == 0 else 0
        # fmesh's own agreement keys still in the store (every rank's), read by rank 0.
        agree_left = sum(KEY_ROOT in k for k in store.list_keys()) if rank == 0 else 0
        groups1, _ = torch_ref.group_counters()
        out[phase] = {
            "seconds": seconds,
            "groups": groups1 - groups0,
            "created": fmesh.cache_stats().created - created0,
            "keys": keys1 - keys0,
            "agree_left": agree_left,
            "calls": len(result) if isinstance(result, list) else 1,
        }
    dist.barrier()
    del keep
    return out


# (key, phase, metric, label, impls measured, note) of each row, per gloo shape.
ROWS: tuple[tuple[str, str, str, str, str, str], ...] = (
    (
        "gloo.trainer5.seconds",
        "new",
        "seconds",
        "realize + 3 flattens: wall time, max over ranks",
        "both",
        "real gloo processes; torch: init_device_mesh('cpu') + 3 _flatten calls",
    ),
    (
        "gloo.trainer5.groups",
        "new",
        "groups",
        "realize + 3 flattens: groups per rank",
        "both",
        "fmesh reuses one group for axes with the same members",
    ),
    (
        "gloo.trainer5.keys",
        "new",
        "keys",
        "realize + 3 flattens: rendezvous-store keys added (all ranks)",
        "both",
        "store.num_keys() before and after, read by rank 0",
    ),
    (
        "gloo.memo.seconds",
        "memo",
        "seconds",
        "the same realize calls again (every group memoized): wall time, max over ranks",
        "fmesh",
        "no group is created: each call publishes to the cross-rank agreement (3 store "
        "operations) without waiting for the other ranks",
    ),
    (
        "gloo.memo.keys",
        "memo",
        "agree_left",
        "the same realize calls again: agreement keys left in the store",
        "fmesh",
        "read by rank 0 after the phase; a memoized call's keys (5 per call, 4 calls) "
        "stay until every rank's next realize call, so at least the last call's remain",
    ),
    (
        "gloo.world_1d.seconds",
        "world_1d",
        "seconds",
        "a new 1-d world mesh (no group created): wall time, max over ranks",
        "both",
        "fmesh: the cross-rank mesh check alone (the group is the default group); "
        "torch: init_device_mesh of the 1-d world, no agreement step",
    ),
    (
        "gloo.world_1d.keys",
        "world_1d",
        "keys",
        "a new 1-d world mesh: rendezvous-store keys added",
        "both",
        "store.num_keys() before and after",
    ),
)
RANK0_METRICS = frozenset({"keys", "agree_left"})
"""Store counts, read by rank 0 (every rank's keys); the other metrics are per rank."""
COUNT_METRICS = RANK0_METRICS | {"groups"}
EVERY_SIZE = frozenset({"gloo.trainer5.seconds", "gloo.trainer5.groups"})
"""Rows the README shows at every gloo size; the others at the largest."""


def _aggregate(jobs: list[list[Json]], phase: str, metric: str) -> float:
    """Median over jobs of the slowest rank (time) / the most (groups) / rank 0 (keys)."""
    if metric in RANK0_METRICS:
        per_job = [next(r for r in job if r["rank"] == 0)[phase][metric] for job in jobs]
    else:
        per_job = [max(r[phase][metric] for r in job) for job in jobs]
    return float(statistics.median(per_job))


def section(b: Bench) -> None:
    raw: Json = {}
    rows: list[Row] = []
    for shape, repeats in b.mode.gloo:
        world = math.prod(shape)
        runs: dict[str, list[list[Json]]] = {"fmesh": [], "torch": []}
        b.log(f"gloo, {world} ranks, {shape_str(shape)} ...")
        for _ in range(repeats):
            for impl in ("fmesh", "torch"):  # interleaved: the machine's load drifts
                spec = {"impl": impl, "shape": list(shape)}
                runs[impl].append(run_gloo_job(worker_rank, world, spec, 300))
        raw[shape_str(shape)] = runs
        for key, phase, metric, label, impls, note in ROWS:
            rows.append(
                Row(
                    key,
                    "realize (gloo)",
                    label,
                    f"{world} ({shape_str(shape)})",
                    world,
                    "count" if metric in COUNT_METRICS else "s",
                    _aggregate(runs["fmesh"], phase, metric),
                    _aggregate(runs["torch"], phase, metric) if impls == "both" else None,
                    note=note,
                    skipped=None if impls == "both" else "no memo",
                    every_size=key in EVERY_SIZE,
                )
            )
    b.raw["gloo"] = raw
    order = [r[0] for r in ROWS]
    b.rows.extend(sorted(rows, key=lambda r: order.index(r.key)))
