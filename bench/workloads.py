"""What the fake-backend rows measure, one worker per kind of row.

Every worker runs in a fresh process (:mod:`bench.launch`; process groups are
process-global) and returns ``{impl: {metric: value}}`` for the library it was given
(``spec["impl"]``) or for both, when the two must share a process (pure ops and memo
hits interleave their batches; a value's size is measured side by side). fmesh's side
uses only the public API, so the rows measure whatever the implementation becomes;
torch's side is :mod:`bench.torch_ref`. A worker that builds a large world first builds
a small one and tears it down (:func:`fresh_world`), so that neither library's one-time
costs (first-use imports, code run for the first time) are timed.
"""

from __future__ import annotations

import functools
import gc
import itertools
import math
import pickle
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import fmesh

from . import torch_ref
from .shared import (
    EXPERT_NAMES,
    FLATTENS,
    NAMES,
    SHAPES,
    TRAINER_FLATTENS,
    Json,
    calibrate,
    deep_size,
    expert_shape,
    fmt_value,
    median,
    reset_peak_rss,
    rss_kib,
    shape_str,
    time_batch,
    timed,
)

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

WARM_UP = 64
"""The world a worker warms up on before building its measured one."""
Recipe = Callable[[Sequence[int]], object]


def fresh_world(world: int, warm_up: Callable[[int], object], freeze: bool = False) -> None:
    """Run ``warm_up(WARM_UP)`` on a small fake world, tear it down, then start the
    fake world of ``world`` ranks (``freeze``: move what exists out of the collector's
    reach: a full collection would otherwise copy the fork server's heap)."""
    torch_ref.init_fake(WARM_UP)
    warm_up(WARM_UP)
    torch_ref.teardown()
    torch_ref.init_fake(world)
    if freeze:
        gc.collect()
        gc.freeze()


# -- recipes: the meshes a trainer builds -------------------------------------------------


def _sizes(names: Sequence[str], shape: Sequence[int]) -> dict[str, int]:
    return dict(zip(names, shape, strict=True))


def fmesh_trainer5(shape: Sequence[int]) -> object:
    """realize the 5-d mesh and the 1-d mesh of each of its three flattens."""
    mesh = fmesh.make_mesh(_sizes(NAMES, shape))
    flats = [fmesh.slice(fmesh.flatten(mesh, axes, name), name) for axes, name in FLATTENS]
    return [fmesh.realize(m) for m in (mesh, *flats)]


def fmesh_titan(shape: Sequence[int]) -> object:
    """torchtitan's meshes as one value: the world, unflattened twice, flattened."""
    root = fmesh.make_mesh({"world": math.prod(shape)})
    dense = fmesh.unflatten(root, "world", _sizes(NAMES, shape))
    expert = fmesh.unflatten(root, "world", _sizes(EXPERT_NAMES, expert_shape(shape)))
    flats = [
        fmesh.slice(fmesh.flatten(dense, axes, name), name) for axes, name in TRAINER_FLATTENS
    ]
    return [fmesh.realize(m) for m in (root, dense, expert, *flats)]


def fmesh_world_1d(shape: Sequence[int]) -> object:
    return fmesh.realize(fmesh.make_mesh({"world": math.prod(shape)}))


RECIPES: dict[str, dict[str, Recipe]] = {
    "trainer5": {"fmesh": fmesh_trainer5, "torch": torch_ref.trainer5},
    "titan": {"fmesh": fmesh_titan, "torch": torch_ref.titan},
    "world_1d": {"fmesh": fmesh_world_1d, "torch": torch_ref.world_1d},
}


def realize(spec: Json) -> Json:
    """One recipe of one library on a fake world: wall time, groups the rank holds,
    group-creation calls (torch: ``new_group`` calls; fmesh: groups it created), peak
    RSS growth, and with ``trace`` tracemalloc's retained and peak bytes."""
    impl, world, trace = spec["impl"], spec["world"], spec.get("trace", False)
    fn = RECIPES[spec["recipe"]][impl]
    fresh_world(world, lambda w: fn(SHAPES[w]))

    def counters() -> tuple[int, int]:
        groups, calls = torch_ref.group_counters()
        return groups, fmesh.cache_stats().created if impl == "fmesh" else calls

    groups0, calls0 = counters()
    if trace:
        tracemalloc.start()
    reset_peak_rss()
    rss0, _ = rss_kib()
    seconds, keep = timed(lambda: fn(SHAPES[world]))
    _, peak = rss_kib()
    groups1, calls1 = counters()
    out: Json = {
        "seconds": seconds,
        "groups": groups1 - groups0,
        "calls": calls1 - calls0,
        "rss_peak_delta": (peak - rss0) * 1024,
    }
    if trace:
        out["traced_retained"], out["traced_peak"] = tracemalloc.get_traced_memory()
    del keep
    return {impl: out}


# -- pure operations ----------------------------------------------------------------------


def pure(spec: Json) -> Json:
    """Median seconds of each op at one world size: batches of fmesh and torch
    interleaved round robin over the ops (a burst of load from elsewhere spoils one
    batch of every op, not every batch of one). torch's flatten creates groups under a
    fresh name each call, so its batches are short, and its root's flatten mapping,
    which torch's slicing scans, is cleared after each batch."""
    world, repeats, target = spec["world"], spec["repeats"], spec["target_s"]
    shape = SHAPES[world]
    sizes = _sizes(NAMES, shape)
    torch_ref.init_fake(world)
    torch_ref.preload_lazy_imports()
    dm = torch_ref.init_mesh(shape, NAMES)
    fm, fworld, fresh = (
        fmesh.make_mesh(sizes),
        fmesh.make_mesh({"world": world}),
        itertools.count(),
    )
    dm_dp = dm["dp_replicate", "dp_shard"]
    dm_world = torch_ref.mesh_without_groups(world, (world,), ("world",))
    # fmt: off
    ops: dict[str, tuple[Callable[[], object], Callable[[], object], int]] = {
        "construct": (lambda: fmesh.make_mesh(sizes),
                      lambda: torch_ref.mesh_without_groups(world, shape, NAMES), 10_000),
        "slice1": (lambda: fmesh.slice(fm, "tp"), lambda: dm["tp"], 10_000),
        "slice2": (lambda: fmesh.slice(fm, "dp_shard", "tp"), lambda: dm["dp_shard", "tp"],
                   10_000),
        "flatten": (lambda: fmesh.flatten(fm, ("dp_replicate", "dp_shard"), "dp"),
                    lambda: dm_dp._flatten(f"dp_b{next(fresh)}"), 50),
        "unflatten": (lambda: fmesh.unflatten(fworld, "world", sizes),
                      lambda: torch_ref.unflatten(dm_world, shape, NAMES), 10_000),
        "coordinate": (lambda: fmesh.coordinate(fm, 0),
                       lambda: torch_ref.coordinate_uncached(dm), 10_000),
        "coordinate_cached": (lambda: fmesh.coordinate(fm, 0), dm.get_coordinate, 10_000),
    }
    # fmt: on
    gc.collect()
    gc.freeze()  # what exists now lives to the end: out of the per-batch collections
    counts = {
        k: (calibrate(f, target, 100_000), calibrate(t, target, most))
        for k, (f, t, most) in ops.items()
    }
    times: Json = {"fmesh": {}, "torch": {}}
    for _ in range(repeats):
        for key, (f, t, _) in ops.items():
            torch_ref.clear_flattens(dm)
            times["fmesh"].setdefault(key, []).append(time_batch(f, counts[key][0]))
            times["torch"].setdefault(key, []).append(time_batch(t, counts[key][1]))
    return {impl: {k: median(v) for k, v in each.items()} for impl, each in times.items()}


# -- memo hits ----------------------------------------------------------------------------

NAMES3 = ("dp", "fsdp", "tp")


def three_axes(shape: Sequence[int]) -> tuple[int, int, int]:
    """The 3-axis shape of a dense 5-d shape: (pp * dp_replicate, dp_shard * cp, tp)."""
    pp, dp_replicate, dp_shard, cp, tp = shape
    return (pp * dp_replicate, dp_shard * cp, tp)


def hit_values(shape3: Sequence[int]) -> list[fmesh.Mesh]:
    """The 3-axis mesh, its 5 slices of one or two adjacent axes and the 1-d flattens
    of both pairs and of all three: 9 values, built anew each call."""
    a, b, c = NAMES3
    m = fmesh.make_mesh(_sizes(NAMES3, shape3))
    flats = [fmesh.flatten(m, (a, b))[f"{a}_{b}"], fmesh.flatten(m, (b, c))[f"{b}_{c}"]]
    return [m, m[a], m[b], m[c], m[a, b], m[b, c], *flats, fmesh.flatten(m, (a, b, c))]


def call_times(
    fns: Sequence[Callable[[], object]], rounds: int, budget_s: float
) -> list[float]:
    """Seconds of every call: each of ``fns`` once per round, at least 3 rounds (or
    ``rounds``), then more until ``budget_s`` passed or ``rounds`` rounds ran."""
    clock, times, done = time.perf_counter, [], 0
    gc.collect()
    gc.disable()
    try:
        start = clock()
        while done < rounds and (done < min(3, rounds) or clock() - start < budget_s):
            for fn in fns:
                t0 = clock()
                fn()
                times.append(clock() - t0)
            done += 1
    finally:
        gc.enable()
    return times


def hit_work(impl: str, shape3: Sequence[int], rounds: int) -> Json:
    """Realize (fmesh) or build (torch) the hit workload once: what :func:`hit_times`
    calls. fmesh: realize of the 9 values realized before, and of freshly built equal
    values; torch: the 8 slicing/_flatten expressions for the same sub-meshes of its
    own mesh, each called before."""
    if impl == "fmesh":
        values = hit_values(shape3)
        for v in values:
            fmesh.realize(v)
        fresh = [v for _ in range(rounds) for v in hit_values(shape3)]
        return {
            "same": [functools.partial(fmesh.realize, v) for v in values],
            "fresh": [functools.partial(fmesh.realize, v) for v in fresh],
        }
    dm = torch_ref.init_mesh(shape3, NAMES3)
    exprs = torch_ref.sub_mesh_exprs(dm, NAMES3)
    for e in exprs:
        e()
    return {"same": exprs, "fresh": [], "keep": dm}


def hit_times(work: Json, rounds: int, budget_s: float) -> Json:
    """Median seconds of a hit, with the same values and with fresh ones (fmesh)."""
    same = call_times(work["same"], rounds, budget_s)
    fresh = call_times(work["fresh"], 1, 0.0)
    out: Json = {"same": median(same), "calls": len(same) + len(fresh)}
    if fresh:
        out["fresh"] = median(fresh)
    return out


def hits_fake(spec: Json) -> Json:
    shape3 = three_axes(SHAPES[spec["world"]])
    torch_ref.init_fake(spec["world"])
    out: Json = {}
    for impl in ("fmesh", "torch"):
        work = hit_work(impl, shape3, spec["rounds"])
        out[impl] = hit_times(work, spec["rounds"], spec["budget_s"])
        del work
    out["fmesh"]["shape"] = shape_str(shape3)
    return out


# -- DeviceMesh hand-off and drop-in ------------------------------------------------------

SUB = ("dp_shard", "tp")


def interop(spec: Json) -> Json:
    """A DeviceMesh of the (dp_shard, tp) sub-mesh: fmesh's ``to_device_mesh('cpu')`` of
    the realized slice (its realize, a memo hit, timed apart) against torch's
    ``dm['dp_shard', 'tp']``; the first call, then batches interleaved."""

    def build(w: int) -> tuple[fmesh.Mesh, DeviceMesh]:
        mesh = fmesh.make_mesh(_sizes(NAMES, SHAPES[w]))
        fmesh.realize(mesh)
        return mesh, torch_ref.init_mesh(SHAPES[w], NAMES)

    def use(w: int) -> None:
        mesh, dm = build(w)
        fmesh.realize(fmesh.slice(mesh, *SUB)).to_device_mesh("cpu")
        dm[SUB]

    fresh_world(spec["world"], use)
    mesh, dm = build(spec["world"])
    realize_s, sub = timed(lambda: fmesh.realize(fmesh.slice(mesh, *SUB)))
    assert isinstance(sub, fmesh.RealizedMesh)
    fns = {"fmesh": lambda: sub.to_device_mesh("cpu"), "torch": lambda: dm[SUB]}
    out: Json = {impl: {"first": timed(fn)[0]} for impl, fn in fns.items()}
    gc.collect()
    gc.freeze()
    n = {impl: calibrate(fn, spec["target_s"], 10_000) for impl, fn in fns.items()}
    times: dict[str, list[float]] = {"fmesh": [], "torch": []}
    for _ in range(spec["repeats"]):
        for impl, fn in fns.items():
            times[impl].append(time_batch(fn, n[impl]))
    for impl in fns:
        out[impl]["repeat"] = median(times[impl])
    out["fmesh"]["realize_s"] = fmt_value(realize_s, "s")
    return out


def init_device_mesh_of(impl: str) -> Callable[..., DeviceMesh]:
    """``fmesh.device_mesh.init_device_mesh`` or torch's, by name."""
    if impl == "fmesh":
        from fmesh.device_mesh import init_device_mesh

        return init_device_mesh
    from torch.distributed.device_mesh import init_device_mesh as torch_init

    return torch_init


def dropin(spec: Json) -> Json:
    """``init_device_mesh('cpu', <5-d shape>, mesh_dim_names=<5 names>)`` of one library:
    the first call, then the same call again (fmesh: a memo hit) per call."""
    impl, world, init = spec["impl"], spec["world"], init_device_mesh_of(spec["impl"])
    fresh_world(world, lambda w: init("cpu", SHAPES[w], mesh_dim_names=NAMES))

    def call() -> object:
        return init("cpu", SHAPES[world], mesh_dim_names=NAMES)

    first, keep = timed(call)
    if first > 0.05:  # seconds a call: one more, timed alone
        repeat, _ = timed(call)
    else:
        n = calibrate(call, spec["target_s"], 10_000)
        repeat = median([time_batch(call, n) for _ in range(spec["repeats"])])
    del keep
    return {impl: {"first": first, "repeat": repeat}}


# -- memory -------------------------------------------------------------------------------


def value_size(spec: Json) -> Json:
    """One mesh value (no groups) of each library: its pickle, its deep size and
    tracemalloc's peak while constructing it (after a warm-up construction)."""
    world = spec["world"]
    shape = SHAPES[world]
    torch_ref.init_fake(world)
    makers: dict[str, Callable[[], object]] = {
        "fmesh": lambda: fmesh.make_mesh(_sizes(NAMES, shape)),
        "torch": lambda: torch_ref.mesh_without_groups(world, shape, NAMES),
    }
    out: Json = {}
    for impl, make in makers.items():
        make()
        tracemalloc.start()
        value = make()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        out[impl] = {
            "pickle": len(pickle.dumps(value)),
            "deep": deep_size(value),
            "construct_peak": peak,
        }
    return out


def roots(spec: Json) -> Json:
    """Python memory retained by roots with distinct dim names, built and dropped one
    after another (a 2x4 root, a _flatten, an _unflatten each): tracemalloc's current
    size after ``2 * roots`` less after ``roots``."""
    torch_ref.init_fake(8)
    init, n = init_device_mesh_of(spec["impl"]), spec["roots"]
    sizes = []
    tracemalloc.start()
    for i in range(2 * n + 1):
        dm = init("cpu", (2, 4), mesh_dim_names=(f"a{i}", f"b{i}"))
        dm._flatten(f"f{i}")
        dm._unflatten(1, (2, 2), (f"x{i}", f"y{i}"))
        del dm
        if i % n == 0 and i:
            gc.collect()
            sizes.append(tracemalloc.get_traced_memory()[0])
    return {
        spec["impl"]: {
            "growth": max(0, sizes[1] - sizes[0]),
            "roots": str(n),
            "roots2": str(2 * n),
        }
    }
