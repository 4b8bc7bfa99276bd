"""Memo hits: realizing again what was realized before, against torch slicing its own
``DeviceMesh``.

The workload is a 3-axis mesh ``dp`` x ``fsdp`` x ``tp`` (``dp`` = pp * dp_replicate,
``fsdp`` = dp_shard * cp of the dense 5-d shape) and the sub-meshes a trainer asks for
again and again. fmesh: ``realize`` of 9 values (the mesh, its 5 slices of one or two
adjacent axes, the 1-d flattens of both pairs and of all three axes), each realized once
first; timed again with the same values, and with freshly constructed equal values
(what a functional trainer passes: equal, not identical). torch: the 8 expressions that
give the same sub-meshes of its ``init_device_mesh`` mesh (``dm["dp"]``,
``dm["dp", "fsdp"]``, ``dm["dp", "fsdp"]._flatten("dp_fsdp")``, ...), each called once
first. Every call is timed on its own (collector off); the figure is the median call.

On real gloo (a phase of :mod:`bench.gloo`) every rank also counts the store requests
its calls send (:class:`bench.counting.CountingStore` under the default group); on the
fake backend (:func:`section`) the same workload runs at large world sizes.
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
from collections.abc import Callable, Sequence

import fmesh

from . import torch_ref
from .launch import run_worker
from .shared import SHAPES, TIMES, Bench, Json, Row, world_str

NAMES3 = ("dp", "fsdp", "tp")


def three_axes(shape: Sequence[int]) -> tuple[int, int, int]:
    """The 3-axis shape of a dense 5-d shape: (pp * dp_replicate, dp_shard * cp, tp)."""
    pp, dp_replicate, dp_shard, cp, tp = shape
    return (pp * dp_replicate, dp_shard * cp, tp)


def fmesh_values(shape3: Sequence[int]) -> list[fmesh.Mesh]:
    """The 3-axis mesh, its slices and its flattens: 9 values, built anew each call."""
    a, b, c = NAMES3
    mesh = fmesh.make_mesh(dict(zip(NAMES3, shape3, strict=True)))
    return [
        mesh,
        mesh[a],
        mesh[b],
        mesh[c],
        mesh[a, b],
        mesh[b, c],
        fmesh.flatten(mesh, (a, b))[f"{a}_{b}"],
        fmesh.flatten(mesh, (b, c))[f"{b}_{c}"],
        fmesh.flatten(mesh, (a, b, c)),
    ]


def call_times(
    fns: Sequence[Callable[[], object]], rounds: tuple[int, int], budget_s: float
) -> list[float]:
    """Seconds of every call: each of ``fns`` once per round, at least ``rounds[0]``
    rounds, then more until ``budget_s`` has passed or ``rounds[1]`` rounds ran."""
    clock = time.perf_counter
    times: list[float] = []
    gc.collect()
    gc.disable()
    try:
        start = clock()
        done = 0
        while done < rounds[1] and (done < rounds[0] or clock() - start < budget_s):
            for fn in fns:
                t0 = clock()
                fn()
                times.append(clock() - t0)
            done += 1
    finally:
        gc.enable()
    return times


def _realize_each(values: Sequence[fmesh.Mesh]) -> list[Callable[[], object]]:
    return [functools.partial(fmesh.realize, v) for v in values]


def prepare(impl: str, shape3: Sequence[int], fresh_rounds: int) -> Json:
    """Realize (fmesh) or build (torch) the workload once; what :func:`measure` times."""
    if impl == "fmesh":
        values = fmesh_values(shape3)
        for v in values:
            fmesh.realize(v)
        fresh = [v for _ in range(fresh_rounds) for v in fmesh_values(shape3)]
        return {"same": _realize_each(values), "fresh": _realize_each(fresh)}
    dm = torch_ref.init_mesh(shape3, NAMES3)
    exprs = torch_ref.sub_mesh_exprs(dm, NAMES3)
    for e in exprs:
        e()
    return {"same": exprs, "fresh": [], "keep": dm}


def measure(work: Json, rounds: int, budget_s: float) -> Json:
    """Median seconds per call, with the same and with fresh values (fmesh)."""
    same = call_times(work["same"], (min(3, rounds), rounds), budget_s)
    fresh = call_times(work["fresh"], (1, 1), 0.0) if work["fresh"] else []
    return {
        "same": statistics.median(same),
        "fresh": statistics.median(fresh) if fresh else None,
        "calls": len(same) + len(fresh),
    }


# -- fake backend -------------------------------------------------------------------------


def worker_fake(spec: Json) -> Json:
    """Both libraries' hits in one fresh process, on a fake world of ``spec["world"]``."""
    world: int = spec["world"]
    shape3 = three_axes(SHAPES[world])
    torch_ref.init_fake(world)
    out: Json = {"shape": list(shape3)}
    for impl in ("fmesh", "torch"):
        work = prepare(impl, shape3, spec["rounds"])
        out[impl] = measure(work, spec["rounds"], spec["budget_s"])
        del work
    return out


def section(b: Bench) -> None:
    raw: Json = {}
    rows: list[Row] = []
    for world in b.mode.worlds:
        b.log(f"memo hits on fake at {world_str(world)} ranks ...")
        spec = {"world": world, "rounds": b.mode.hit_rounds, "budget_s": b.mode.hit_budget_s}
        run = run_worker(worker_fake, spec, 600)  # each figure: the median of many calls
        raw[str(world)] = run
        shape = TIMES.join(map(str, run["shape"]))
        for key, which, label in ROWS:
            rows.append(
                Row(
                    f"fake.{key}",
                    "memo hit (fake)",
                    label,
                    world_str(world),
                    world,
                    "s",
                    run["fmesh"][which],
                    run["torch"]["same"],
                    note=f"{shape} mesh; {NOTES[which]}",
                    every_size=key == "hit.seconds",
                )
            )
    b.raw["hits_fake"] = raw
    order = [f"fake.{r[0]}" for r in ROWS]
    b.rows.extend(sorted(rows, key=lambda r: order.index(r.key)))


# (key, figure, label) of the hit rows; the gloo rows use the same keys under "gloo.".
ROWS = (
    (
        "hit.seconds",
        "same",
        "memo hit: a 3-axis mesh, its slices and flattens again, per call",
    ),
    (
        "hit_fresh.seconds",
        "fresh",
        "memo hit with freshly constructed equal mesh values, per call",
    ),
)
NOTES = {
    "same": "median call; fmesh: realize of the 9 values it realized before (mesh, 5 "
    "slices, 3 flattens); torch: the 8 slicing/_flatten expressions for the same "
    "sub-meshes of its init_device_mesh mesh, each called before",
    "fresh": "median call; fmesh: realize of newly built values equal to those it "
    "realized before (construction not timed); torch: the same 8 expressions as above",
}
