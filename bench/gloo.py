"""realize on real gloo processes: wall time, groups, store keys and requests, memo hits.

One job per library per repeat (interleaved: the machine's load drifts), one fresh
process per rank, plus one *counting* job per library first: there every rank's store
client is wrapped in :class:`bench.counting.CountingStore`, so each rank counts the
requests it sends (gloo's rendezvous, and fmesh's agreement: keys under ``fmesh/a/``).
The wrapper is Python on every request, so times come from the other jobs only.
Each rank runs the phases below, each between barriers (gloo collectives, no store
traffic), and times its own call; a phase's time is the slowest rank's. Rank 0 counts
the keys in the rendezvous store (``store.num_keys()``, every rank's keys) before and
after a phase, and fmesh's agreement keys left after it.

* ``world_1d``: a 1-d mesh over the whole world, whose group is the default group:
  a memo hit for fmesh (nothing to create, no agreement); torch's
  ``init_device_mesh`` of it.
* ``new``: the 5-d mesh and its three flattens (torch: ``init_device_mesh`` + 3
  ``_flatten`` calls), creating every group; fmesh agrees before each call that
  creates groups.
* ``memo`` (fmesh only): the same realize calls again, every one a memo hit.
* ``hit``: :mod:`bench.hits` on a 3-axis mesh, against torch slicing its own mesh.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import statistics
import time

from . import hits, torch_ref
from .counting import CountingStore, agree_call, delta, per_call, sentinels, watch_call
from .launch import run_gloo_job
from .recipes import TRAINER5, WORLD_1D
from .shared import Bench, Json, Row, shape_str

# world_1d first: later, a flatten of the 5-d mesh may cover the world in rank order
# (then fmesh's memo already holds that axis).
PHASES = {
    "fmesh": (("world_1d", WORLD_1D.fmesh), ("new", TRAINER5.fmesh), ("memo", TRAINER5.fmesh)),
    "torch": (("world_1d", WORLD_1D.torch), ("new", TRAINER5.torch)),
}


def _counts(store: CountingStore) -> tuple[dict[str, int], dict[str, int]]:
    return store.snapshot(), store.key_snapshot()


def _requests(store: CountingStore, before: tuple[dict[str, int], dict[str, int]]) -> Json:
    """This rank's requests since ``before``: in all, and its agreement's per call."""
    counts, keys = _counts(store)
    added = delta(keys, before[1])
    calls = per_call(added, agree_call)
    watched = per_call(added, watch_call)
    return {
        "requests": sum(delta(counts, before[0]).values()),
        "agree": sum(calls.values()),
        "agreements": len(calls),
        "agree_max": max(calls.values(), default=0),
        "watch": sum(watched.values()) + sentinels(added),
        "watches": len(watched),
    }


def worker_rank(spec: Json) -> Json:
    """One rank of a real gloo job: every phase of ``spec["impl"]``."""
    import torch.distributed as dist

    import fmesh
    from fmesh._runtime.agreement import count_keys  # fmesh's agreement keys in a store

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=spec["timeout_s"])
    raw = torch_ref.connect_store(spec["port"], world, timeout)
    counting: bool = spec["count"]
    store = CountingStore(raw)
    dist.init_process_group(
        "gloo", store=store if counting else raw, rank=rank, world_size=world, timeout=timeout
    )
    torch_ref.preload_lazy_imports()
    impl: str = spec["impl"]
    shape: list[int] = spec["shape"]
    out: Json = {"rank": rank, "counted": counting}
    keep: list[object] = []

    def after(phase: Json, keys0: int, before: tuple[dict[str, int], dict[str, int]]) -> Json:
        if counting:
            phase.update(_requests(store, before))
        dist.barrier()
        phase["keys"] = raw.num_keys() - keys0 if rank == 0 else 0
        # fmesh's agreement keys still in the store (every rank's), read by rank 0.
        phase["agree_left"] = count_keys(raw) if rank == 0 else 0
        return phase

    for phase, fn in PHASES[impl]:
        dist.barrier()
        keys0 = raw.num_keys() if rank == 0 else 0
        groups0, _ = torch_ref.group_counters()
        created0 = fmesh.cache_stats().created
        dist.barrier()
        before = _counts(store)
        start = time.perf_counter()
        result = fn(shape)
        seconds = time.perf_counter() - start
        keep.append(result)
        groups1, _ = torch_ref.group_counters()
        out[phase] = after(
            {
                "seconds": seconds,
                "groups": groups1 - groups0,
                "created": fmesh.cache_stats().created - created0,
                "calls": len(result) if isinstance(result, list) else 1,
            },
            keys0,
            before,
        )
    dist.barrier()
    work = hits.prepare(impl, hits.three_axes(shape), spec["hit_rounds"])
    dist.barrier()
    keys0 = raw.num_keys() if rank == 0 else 0
    before = _counts(store)
    out["hit"] = after(
        hits.measure(work, spec["hit_rounds"], spec["hit_budget_s"]), keys0, before
    )
    dist.barrier()
    del keep, work
    return out


@dataclasses.dataclass(frozen=True)
class Spec:
    """One row of the gloo table, and how it is read from the ranks' results."""

    key: str
    phase: str
    """The phase measured; ``"*"``: every phase (the most of any)."""
    metric: str
    label: str
    note: str
    how: str = "max"
    """Over the ranks of a job: ``max``, ``rank0``, ``sum``, ``mean``, or
    ``per:<metric>`` (the sum of ``metric`` over the sum of the other)."""
    unit: str = "s"
    torch_metric: str | None = None
    """torch's figure (``None``: same metric; ``""``: fmesh only)."""
    skipped: str = ""
    """What the torch column says for an fmesh-only row."""
    every_size: bool = False
    counted: bool = False
    """From the counting job (store requests); else from the timed jobs."""


TORCH_RECIPE = "torch: init_device_mesh('cpu') + 3 _flatten calls"
ROWS = (
    Spec(
        "gloo.trainer5.seconds",
        "new",
        "seconds",
        "realize + 3 flattens: wall time, max over ranks",
        f"real gloo processes; {TORCH_RECIPE}",
        every_size=True,
    ),
    Spec(
        "gloo.trainer5.groups",
        "new",
        "groups",
        "realize + 3 flattens: groups per rank",
        "fmesh reuses one group for axes with the same members",
        unit="count",
        every_size=True,
    ),
    Spec(
        "gloo.trainer5.keys",
        "new",
        "keys",
        "realize + 3 flattens: rendezvous-store keys added (all ranks)",
        "store.num_keys() before and after, read by rank 0",
        how="rank0",
        unit="count",
    ),
    Spec(
        "gloo.trainer5.requests",
        "new",
        "requests",
        "realize + 3 flattens: store requests per rank",
        "every request of the rank's store client, counted on the wire (a get is 2), "
        f"mean over ranks: gloo's rendezvous, and fmesh's agreement; {TORCH_RECIPE}",
        how="mean",
        unit="count",
        counted=True,
    ),
    Spec(
        "gloo.trainer5.agree",
        "new",
        "agree",
        "realize + 3 flattens: agreement store requests per rank per creating call",
        "fmesh's cross-rank check before creating groups (keys under fmesh/a/ but "
        "the watch's: the agreement, and the closing barrier's count on its counter), "
        "mean over ranks and creating calls; torch's recipe checks nothing",
        how="per:agreements",
        unit="count",
        torch_metric="",
        skipped="no check",
        counted=True,
    ),
    Spec(
        "gloo.trainer5.watch",
        "new",
        "watch",
        "realize + 3 flattens: peer-watch store requests per rank per creating call",
        "fmesh's liveness watch while a call creates groups (fmesh/a/.../w/, and each "
        "rank's sentinel address fmesh/s/<rank>, written before its first agreement, "
        "read by its watcher after 1 s, once per process): the closing barrier's wait "
        "and wake, reads of the outcome once a wait passes 1 s, the cleanup; mean over "
        "ranks and watched calls (the closing barrier's count is on the agreement's "
        "counter, in the agreement row); torch watches nothing",
        how="per:watches",
        unit="count",
        torch_metric="",
        skipped="no watch",
        counted=True,
    ),
    Spec(
        "gloo.memo.seconds",
        "memo",
        "seconds",
        "the same realize calls again (memo hits): wall time, max over ranks",
        "the recipe again: its mesh values built anew (make_mesh, flatten, slice) and 4 "
        "realize calls, each a lookup in the process's memo (no store request, no "
        "peer); ranks share the CPUs, so the slowest rank's wall time includes waiting "
        "for one",
        torch_metric="",
        skipped="no memo",
    ),
    Spec(
        "gloo.memo.requests",
        "memo",
        "requests",
        "the same realize calls again: store requests (all ranks)",
        "counted on the wire by every rank's store client",
        how="sum",
        unit="count",
        torch_metric="",
        skipped="no memo",
        counted=True,
    ),
    Spec(
        "gloo.agree.keys_left",
        "*",
        "agree_left",
        "agreement keys left in the store after a phase, most of any phase",
        "read by rank 0 after each phase (every rank's keys): a call that ended well "
        "leaves its counter and its closing barrier's key, which its stream's next "
        "creating call deletes",
        how="rank0",
        unit="count",
        torch_metric="",
        skipped="no agreement",
    ),
    Spec(
        "gloo.world_1d.seconds",
        "world_1d",
        "seconds",
        "a new 1-d world mesh (no group created): wall time, max over ranks",
        "fmesh: a memo hit (the default group serves it), the first realize call in the "
        "process; torch: init_device_mesh of the 1-d world",
    ),
    Spec(
        "gloo.world_1d.requests",
        "world_1d",
        "requests",
        "a new 1-d world mesh: store requests (all ranks)",
        "counted on the wire by every rank's store client",
        how="sum",
        unit="count",
        counted=True,
    ),
    Spec(
        "gloo.world_1d.keys",
        "world_1d",
        "keys",
        "a new 1-d world mesh: rendezvous-store keys added",
        "store.num_keys() before and after",
        how="rank0",
        unit="count",
    ),
    Spec(
        "gloo.hit.seconds",
        "hit",
        "same",
        "memo hit: a 3-axis mesh, its slices and flattens again, per call",
        f"{hits.NOTES['same']}; max over ranks of each rank's median",
        every_size=True,
    ),
    Spec(
        "gloo.hit_fresh.seconds",
        "hit",
        "fresh",
        "memo hit with freshly constructed equal mesh values, per call",
        f"{hits.NOTES['fresh']}; max over ranks of each rank's median",
        torch_metric="same",
    ),
    Spec(
        "gloo.hit.requests",
        "hit",
        "requests",
        "memo hit: store requests per call",
        "every call of both hit rows on every rank, counted on the wire",
        how="per:calls",
        unit="count",
        counted=True,
    ),
)


def _job(job: list[Json], spec: Spec, metric: str) -> float:
    """One job's figure (all its ranks)."""
    if spec.phase == "*":
        phases = [p for p, v in job[0].items() if isinstance(v, dict)]
        return max(_job(job, dataclasses.replace(spec, phase=p), metric) for p in phases)
    values = [float(r[spec.phase][metric]) for r in job]
    if spec.how == "rank0":
        return float(next(r for r in job if r["rank"] == 0)[spec.phase][metric])
    if spec.how == "sum":
        return sum(values)
    if spec.how == "mean":
        return sum(values) / len(values)
    if spec.how.startswith("per:"):
        total = sum(float(r[spec.phase][spec.how[4:]]) for r in job)
        return sum(values) / total if total else 0.0
    return max(values)


def _figure(jobs: list[list[Json]], spec: Spec, metric: str) -> float:
    """The median over the counting job or the timed jobs."""
    chosen = [job for job in jobs if job[0]["counted"] == spec.counted]
    return float(statistics.median(_job(job, spec, metric) for job in chosen))


def section(b: Bench) -> None:
    raw: Json = {}
    rows: list[Row] = []
    for shape, repeats in b.mode.gloo:
        world = math.prod(shape)
        runs: dict[str, list[list[Json]]] = {"fmesh": [], "torch": []}
        b.log(f"gloo, {world} ranks, {shape_str(shape)} ...")
        for count in (True, *[False] * repeats):
            for impl in ("fmesh", "torch"):  # interleaved: the machine's load drifts
                spec = {
                    "impl": impl,
                    "count": count,
                    "shape": list(shape),
                    "hit_rounds": b.mode.hit_rounds,
                    "hit_budget_s": b.mode.hit_budget_s,
                }
                runs[impl].append(run_gloo_job(worker_rank, world, spec, 300))
        raw[shape_str(shape)] = runs
        for s in ROWS:
            torch_metric = s.metric if s.torch_metric is None else s.torch_metric
            rows.append(
                Row(
                    s.key,
                    "realize (gloo)",
                    s.label,
                    f"{world} ({shape_str(shape)})",
                    world,
                    s.unit,
                    _figure(runs["fmesh"], s, s.metric),
                    _figure(runs["torch"], s, torch_metric) if torch_metric else None,
                    note=s.note,
                    skipped=s.skipped or None,
                    every_size=s.every_size,
                )
            )
    b.raw["gloo"] = raw
    order = [s.key for s in ROWS]
    b.rows.extend(sorted(rows, key=lambda r: order.index(r.key)))
