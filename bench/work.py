"""What the rows measure: one worker per kind of row, on a fake world or a gloo rank.

Every worker runs in a fresh process (:mod:`bench.launch`; process groups are
process-global) and returns ``{impl: {figure: value}}`` for the library it was given
(``spec["impl"]``), or for both where the two share a process (pure ops and memo hits
interleave their batches; a value's size is measured side by side). A gloo worker runs
on every rank of a job. A recipe is written once over its steps (``mesh``,
``flatten``, ``unflatten``, ``done``): fmesh's steps use only its public API (so the rows
measure whatever the implementation becomes), torch's are :data:`bench.torch_ref.OPS`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import itertools
import math
import pickle
import resource
import statistics
import time
import tracemalloc
import types
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import fmesh

from . import shared as sh
from . import titan, torch_ref
from .shared import NAMES, SHAPES, Json, median, timed

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def _sizes(names: Sequence[str], shape: Sequence[int]) -> dict[str, int]:
    return dict(zip(names, shape, strict=True))


FMESH = types.SimpleNamespace(
    mesh=lambda shape, names: fmesh.make_mesh(_sizes(names, shape)),
    flatten=lambda m, axes, name: fmesh.slice(fmesh.flatten(m, axes, name), name),
    unflatten=lambda m, shape, names: fmesh.unflatten(
        m, m.axis_names[0], _sizes(names, shape)
    ),
    done=lambda meshes: [fmesh.realize(m) for m in meshes],
)
"""The steps of a recipe with fmesh: pure values, then one realize each."""
OPS = {"fmesh": FMESH, "torch": torch_ref.OPS}
Pair = tuple[Callable[[], object], Callable[[], object], int]


def trainer5(ops: Any, shape: Sequence[int]) -> list[object]:
    """The 5-d mesh and the 1-d mesh of each of its three flattens."""
    mesh = ops.mesh(shape, NAMES)
    return list(ops.done([mesh, *(ops.flatten(mesh, a, name) for a, name in sh.FLATTENS)]))


def titan_meshes(ops: Any, shape: Sequence[int]) -> list[object]:
    """torchtitan's meshes: a 1-d world unflattened into the dense and expert views, and
    the three flattens of the dense one."""
    world = ops.mesh((math.prod(shape),), ("world",))
    dense = ops.unflatten(world, shape, NAMES)
    expert = ops.unflatten(world, sh.expert_shape(shape), sh.EXPERT_NAMES)
    flats = [ops.flatten(dense, axes, name) for axes, name in sh.TRAINER_FLATTENS]
    return list(ops.done([world, dense, expert, *flats]))


def world_1d(ops: Any, shape: Sequence[int]) -> list[object]:
    """A 1-d mesh over the whole world (torch reuses the default group for it)."""
    return list(ops.done([ops.mesh((math.prod(shape),), ("world",))]))


RECIPES = {"trainer5": trainer5, "titan": titan_meshes, "world_1d": world_1d}


def init_device_mesh_of(impl: str) -> Callable[..., DeviceMesh]:
    """``fmesh.device_mesh.init_device_mesh`` or torch's, by name."""
    module = "fmesh" if impl == "fmesh" else "torch.distributed"
    init: Callable[..., DeviceMesh] = importlib.import_module(
        f"{module}.device_mesh"
    ).init_device_mesh
    return init


def _builder(spec: Json) -> Callable[[int], Callable[[], object]]:
    """The call :func:`build` times at a world size (a gloo job: its shape)."""
    impl, what, gloo = spec["impl"], spec["what"], "port" in spec

    def shape(world: int) -> tuple[int, ...]:
        return tuple(spec["shape"]) if gloo else SHAPES[world]

    if what == "torchtitan":
        init, _ = init_device_mesh_of(impl), titan.example()  # loaded before timing
        return lambda w: lambda: titan.build_mesh(init, w, spec["spmd"])
    if what == "dropin":
        init = init_device_mesh_of(impl)
        return lambda w: lambda: init("cpu", shape(w), mesh_dim_names=NAMES)
    return lambda w: functools.partial(RECIPES[what], OPS[impl], shape(w))


def build(spec: Json) -> Json:
    """One library's build (``spec["what"]``): as rank 0 of a fake world, after a
    warm-up on a small one, or on one rank of a gloo job, between barriers. Its times,
    groups, group-creation calls (torch: ``new_group`` calls; fmesh: groups it created)
    and RSS; with ``creation``, torch's calls counted as they are made; with ``trace``,
    tracemalloc's bytes; with ``again``, the same call again."""
    import torch.distributed as dist

    impl, world, gloo = spec["impl"], spec["world"], "port" in spec
    make = _builder(spec)
    if gloo:
        importlib.import_module("fmesh.device_mesh")  # before timing, as torch's module
        torch_ref.init_gloo(spec)
    else:
        torch_ref.fake_world(world, lambda w: make(w)(), spec.get("freeze", False))
    sync = dist.barrier if gloo else lambda: None
    call = make(world)

    def counters() -> tuple[int, int]:
        groups, calls = torch_ref.group_counters()
        return groups, fmesh.cache_stats().created if impl == "fmesh" else calls

    counting = torch_ref.counting_group_creation() if spec.get("creation") else None
    sync()
    groups0, calls0 = counters()
    if spec.get("trace"):
        tracemalloc.start()
    sh.reset_peak_rss()
    rss0 = sh.rss_kib()[0]
    with counting or contextlib.nullcontext({}) as made:
        cpu0, start = time.process_time(), time.perf_counter()
        keep = call()
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu0
    traced = tracemalloc.get_traced_memory() if spec.get("trace") else None
    peak = sh.rss_kib()[1]
    groups1, calls1 = counters()
    out: Json = {"rank": dist.get_rank(), "seconds": seconds, "cpu": cpu}
    out |= {"groups": groups1 - groups0, "calls": calls1 - calls0}
    out |= {"new_group": made.get("new_group"), "constructed": made.get("groups")}
    out["rss_peak_delta"] = (peak - rss0) * 1024
    out["rss_peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if traced is not None:
        out["traced_retained"], out["traced_peak"] = traced
    sync()
    if gloo and spec.get("again"):  # a fixed count: torch's calls are collectives
        n = spec["again"] // (1 if impl == "fmesh" else 10)
        out["repeat"] = statistics.median(timed(call)[0] for _ in range(n))
    elif spec.get("again") and seconds < 0.05:
        out["repeat"] = sh.batches(call, spec["repeats"], spec["target_s"], 10_000)
    elif spec.get("again"):  # seconds a call: one more, timed alone
        out["repeat"] = timed(call)[0]
    sync()
    if spec["what"] == "torchtitan":
        out |= titan.summary(keep, world)
    return {impl: out}


# -- side by side in one process ------------------------------------------------------------


def pure(spec: Json) -> Json:
    """Median seconds of each op at one world size (:func:`interleaved`). torch's
    flatten creates groups under a fresh name each call, so its batches are short, and
    its root's flatten mapping, which torch's slicing scans, is cleared after each."""
    world, repeats, target = spec["world"], spec["repeats"], spec["target_s"]
    shape = SHAPES[world]
    sizes = _sizes(NAMES, shape)
    torch_ref.fake_world(world)
    dm = torch_ref.init_mesh(shape, NAMES)
    fm, fworld = fmesh.make_mesh(sizes), fmesh.make_mesh({"world": world})
    fresh = itertools.count()
    dm_dp = dm["dp_replicate", "dp_shard"]
    dm_world = torch_ref.mesh_without_groups(world, (world,), ("world",))
    realized = fmesh.realize(fm)  # this rank's groups only, on the fake backend
    # fmt: off
    ops: dict[str, Pair] = {
        "construct": (lambda: fmesh.make_mesh(sizes),
                      lambda: torch_ref.mesh_without_groups(world, shape, NAMES), 10_000),
        "slice1": (lambda: fmesh.slice(fm, "tp"), lambda: dm["tp"], 10_000),
        "slice2": (lambda: fmesh.slice(fm, "dp_shard", "tp"), lambda: dm["dp_shard", "tp"],
                   10_000),
        "flatten": (lambda: fmesh.flatten(fm, ("dp_replicate", "dp_shard"), "dp"),
                    lambda: dm_dp._flatten(f"dp_b{next(fresh)}"), 50),
        "unflatten": (lambda: fmesh.unflatten(fworld, "world", sizes),
                      lambda: torch_ref.OPS.unflatten(dm_world, shape, NAMES), 10_000),
        "coordinate": (lambda: fmesh.coordinate(fm, 0),
                       lambda: torch_ref.coordinate_uncached(dm), 10_000),
        "coordinate_cached": (lambda: realized.coordinate, dm.get_coordinate, 10_000),
    }
    # fmt: on
    return interleaved(ops, repeats, target, lambda: torch_ref.clear_flattens(dm))


def interleaved(
    pairs: Mapping[str, Pair], repeats: int, target_s: float, between: Callable[[], object]
) -> Json:
    """Median seconds per call of each pair of calls (fmesh's, torch's, and the most
    calls a batch of torch's may make): batches of both interleaved round robin over
    the pairs (a burst of load from elsewhere spoils one batch of every pair, not every
    batch of one), ``between`` run before each pair's batches."""
    gc.collect()
    gc.freeze()  # what exists now lives to the end: out of the per-batch collections
    n = {k: (sh.calibrate(f, target_s, 100_000), sh.calibrate(t, target_s, most))
         for k, (f, t, most) in pairs.items()}  # fmt: skip
    times: dict[str, dict[str, list[float]]] = {"fmesh": {}, "torch": {}}
    for _ in range(repeats):
        for key, (f, t, _) in pairs.items():
            between()
            times["fmesh"].setdefault(key, []).append(sh.time_batch(f, n[key][0]))
            times["torch"].setdefault(key, []).append(sh.time_batch(t, n[key][1]))
    return {impl: {k: median(v) for k, v in each.items()} for impl, each in times.items()}


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


def hit_timer(
    impl: str, shape3: Sequence[int], rounds: int, budget_s: float
) -> Callable[[], Json]:
    """Memo hits, each call made once before; the returned function times them: the
    median seconds of a call, and the calls made. fmesh: realize of the 9 values
    realized before (``same``), and of freshly built equal values (``fresh``); torch:
    the 8 slicing/_flatten expressions for the same sub-meshes of its own mesh."""
    same: list[Callable[[], object]]
    fresh: list[Callable[[], object]] = []
    if impl == "fmesh":
        same = [functools.partial(fmesh.realize, v) for v in hit_values(shape3)]
        built = [v for _ in range(rounds) for v in hit_values(shape3)]
        fresh = [functools.partial(fmesh.realize, v) for v in built]
    else:
        same = torch_ref.sub_mesh_exprs(torch_ref.init_mesh(shape3, NAMES3), NAMES3)
    for call in same:
        call()

    def timer() -> Json:
        same_s, fresh_s = call_times(same, rounds, budget_s), call_times(fresh, 1, 0)
        out: Json = {"same": median(same_s), "calls": len(same_s) + len(fresh_s)}
        return out | ({"fresh": median(fresh_s)} if fresh_s else {})

    return timer


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


def hits(spec: Json) -> Json:
    shape3 = three_axes(SHAPES[spec["world"]])
    torch_ref.fake_world(spec["world"])
    rounds, budget_s = spec["rounds"], spec["budget_s"]
    out = {impl: hit_timer(impl, shape3, rounds, budget_s)() for impl in ("fmesh", "torch")}
    out["fmesh"]["shape"] = sh.shape_str(shape3)
    return out


SUB = ("dp_shard", "tp")


def interop(spec: Json) -> Json:
    """A DeviceMesh of the (dp_shard, tp) sub-mesh: fmesh's ``to_device_mesh('cpu')`` of
    the realized slice (its realize, a memo hit, timed apart) against torch's
    ``dm['dp_shard', 'tp']``; the first call, then batches interleaved."""

    def calls(world: int) -> tuple[float, dict[str, Callable[[], DeviceMesh]]]:
        mesh = fmesh.make_mesh(_sizes(NAMES, SHAPES[world]))
        fmesh.realize(mesh)
        dm = torch_ref.init_mesh(SHAPES[world], NAMES)
        realize_s, sub = timed(lambda: fmesh.realize(fmesh.slice(mesh, *SUB)))
        assert isinstance(sub, fmesh.RealizedMesh)
        fns = {"fmesh": lambda: sub.to_device_mesh("cpu"), "torch": lambda: dm[SUB]}
        return realize_s, fns

    torch_ref.fake_world(spec["world"], lambda w: [call() for call in calls(w)[1].values()])
    realize_s, fns = calls(spec["world"])
    first = {impl: timed(fn)[0] for impl, fn in fns.items()}
    pair = {"repeat": (fns["fmesh"], fns["torch"], 10_000)}
    out = interleaved(pair, spec["repeats"], spec["target_s"], lambda: None)
    out["fmesh"]["realize_s"] = sh.fmt_value(realize_s, "s")
    return {impl: {**out[impl], "first": first[impl]} for impl in out}


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
        out[impl] = {"pickle": len(pickle.dumps(value)), "deep": sh.deep_size(value)}
        out[impl]["construct_peak"] = peak
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
    growth = max(0, sizes[1] - sizes[0])
    return {spec["impl"]: {"growth": growth, "roots": str(n), "roots2": str(2 * n)}}
