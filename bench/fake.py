"""realize on torch's ``fake`` backend: large worlds in one process.

One fresh process per measurement (process groups are process-global). A warm-up on
a small fake world first pays the one-time costs (first-use imports and allocations,
page faults of code run for the first time) for both libraries; it is torn down, so
neither keeps a mesh or group cache. Then the world is initialized at full size and
one call is measured: wall time, groups the rank holds, group-creation calls, peak
RSS growth (and with ``trace``, tracemalloc's retained and peak bytes).

Also here: ``RealizedMesh.to_device_mesh`` of a sub-mesh against torch's slicing.
"""

from __future__ import annotations

import gc
import math
import statistics
import tracemalloc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import fmesh

from . import torch_ref
from .launch import WorkerTimeout, run_worker
from .recipes import RECIPES, TITAN, TRAINER5, Recipe
from .shared import (
    NAMES,
    SHAPES,
    Bench,
    Json,
    Row,
    calibrate,
    fmt_seconds,
    reset_peak_rss,
    rss_kib,
    time_batch,
    timed,
    world_str,
)

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

WARM_UP_WORLD = 64


def _teardown() -> None:
    import torch.distributed as dist

    fmesh.destroy()
    dist.destroy_process_group()


def _counters(impl: str) -> tuple[int, int]:
    """(groups registered in this process, group-creation calls so far).

    torch: its ``new_group`` calls (members or not); fmesh creates groups through
    c10d's constructor, not ``new_group``, and counts them itself.
    """
    groups, new_group_calls = torch_ref.group_counters()
    return groups, fmesh.cache_stats().created if impl == "fmesh" else new_group_calls


def worker_realize(spec: Json) -> Json:
    """One recipe (fmesh's or torch's) on the fake backend, in this process."""
    impl: str = spec["impl"]
    world: int = spec["world"]
    recipe = RECIPES[spec["recipe"]]
    fn: Callable[[Sequence[int]], object] = recipe.fmesh if impl == "fmesh" else recipe.torch
    torch_ref.init_fake(WARM_UP_WORLD)
    keep = fn(SHAPES[WARM_UP_WORLD])
    del keep
    _teardown()
    torch_ref.init_fake(world)
    groups0, calls0 = _counters(impl)
    trace: bool = spec["trace"]
    if trace:
        tracemalloc.start()
    reset_peak_rss()
    rss0, _ = rss_kib()
    traced0 = tracemalloc.get_traced_memory()[0] if trace else 0
    seconds, keep = timed(lambda: fn(SHAPES[world]))
    rss1, peak = rss_kib()
    groups1, calls1 = _counters(impl)
    out: Json = {
        "seconds": seconds,
        "groups": groups1 - groups0,
        "calls": calls1 - calls0,
        "rss_peak_delta": (peak - rss0) * 1024,
        "rss_delta": (rss1 - rss0) * 1024,
    }
    if trace:
        current, traced_peak = tracemalloc.get_traced_memory()
        out["traced_retained"] = current - traced0
        out["traced_peak"] = traced_peak - traced0
    del keep
    return out


def realize_runs(
    recipe: Recipe, impl: str, world: int, repeats: int, trace: bool, timeout_s: float
) -> list[Json]:
    spec = {"impl": impl, "world": world, "recipe": recipe.key, "trace": trace}
    return [run_worker(worker_realize, spec, timeout_s) for _ in range(repeats)]


def estimate(points: list[tuple[int, float]], world: int) -> float:
    """Extrapolate a torch time to ``world`` from smaller sizes (at least linear)."""
    (w1, t1) = points[-1]
    exponent = 1.0
    if len(points) >= 2:
        (w0, t0) = points[-2]
        if t0 > 0 and t1 > 0 and w1 > w0:
            exponent = max(1.0, math.log(t1 / t0) / math.log(w1 / w0))
    return float(t1 * (world / w1) ** exponent)


# (metric key, label, unit, note, resolution) of each realize row.
METRICS: tuple[tuple[str, str, str, str, float], ...] = (
    ("seconds", "wall time", "s", "", 0.0),
    (
        "groups",
        "groups the rank holds",
        "count",
        "torch registers only the groups the rank is in",
        0.0,
    ),
    (
        "calls",
        "group-creation calls by the rank",
        "count",
        "torch: new_group calls (every subgroup of the world); fmesh: groups it created",
        0.0,
    ),
    (
        "rss_peak_delta",
        "peak RSS growth",
        "B",
        "fresh process, kernel peak-RSS mark reset before; counts C++ allocations too",
        float(2**20),
    ),
)


def _median(runs: list[Json], key: str) -> float | None:
    return statistics.median(r[key] for r in runs) if runs else None


def realize_rows(b: Bench, recipe: Recipe, worlds: tuple[int, ...], repeats: int) -> None:
    """Every metric of ``recipe`` at every size, torch skipped past its time limit."""
    limit = b.mode.torch_limit_s
    torch_points: list[tuple[int, float]] = []
    raw: Json = {}
    rows: list[Row] = []
    for world in worlds:
        b.log(f"realize on fake: {recipe.key} at {world_str(world)} ranks ...")
        f_runs = realize_runs(recipe, "fmesh", world, repeats, False, 300)
        t_runs: list[Json] = []
        skipped: str | None = None
        if torch_points and (est := estimate(torch_points, world)) > limit:
            skipped = f"skipped (>{limit:.0f} s est.: {est:.0f} s)"
        else:
            try:
                t_runs = realize_runs(recipe, "torch", world, repeats, False, limit + 30)
            except WorkerTimeout:
                skipped = f"skipped (ran past {limit + 30:.0f} s)"
        raw[str(world)] = {"fmesh": f_runs, "torch": t_runs, "skipped": skipped}
        if t_runs:
            torch_points.append((world, statistics.median(r["seconds"] for r in t_runs)))
        for metric, label, unit, note, resolution in METRICS:
            rows.append(
                Row(
                    f"fake.{recipe.key}.{metric}",
                    "realize (fake)",
                    f"{recipe.label}: {label}",
                    world_str(world),
                    world,
                    unit,
                    _median(f_runs, metric),
                    _median(t_runs, metric),
                    note=skipped or f"torch: {recipe.torch_note}{note and '; ' + note}",
                    skipped=skipped,
                    resolution=resolution,
                )
            )
    b.raw[f"realize_{recipe.key}"] = raw
    # Each metric across world sizes, like the pure ops.
    order = [f"fake.{recipe.key}.{m[0]}" for m in METRICS]
    b.rows.extend(sorted(rows, key=lambda r: order.index(r.key)))


def section_realize(b: Bench) -> None:
    realize_rows(b, TRAINER5, b.mode.worlds, b.mode.realize_repeats)
    realize_rows(b, TITAN, (b.mode.titan_world,), b.mode.titan_repeats)


# -- to_device_mesh of a sub-mesh ------------------------------------------------------------

SUB = ("dp_shard", "tp")


def worker_interop(spec: Json) -> Json:
    """A torch DeviceMesh of the (dp_shard, tp) sub-mesh of a realized 5-d mesh.

    fmesh: ``realize(slice(mesh, ...)).to_device_mesh("cpu")`` (the realize is a
    memo hit, timed apart); torch: ``dm["dp_shard", "tp"]`` of the ``init_device_mesh``
    mesh. First call (after a warm-up on a small world), then batches interleaved.
    """
    world: int = spec["world"]

    def build(w: int) -> tuple[fmesh.Mesh, DeviceMesh]:
        mesh = fmesh.make_mesh(dict(zip(NAMES, SHAPES[w], strict=True)))
        fmesh.realize(mesh)
        return mesh, torch_ref.init_mesh(SHAPES[w], NAMES)

    torch_ref.init_fake(WARM_UP_WORLD)
    mesh, dm = build(WARM_UP_WORLD)
    fmesh.realize(fmesh.slice(mesh, *SUB)).to_device_mesh("cpu")
    dm[SUB]
    del mesh, dm
    _teardown()

    torch_ref.init_fake(world)
    mesh, dm = build(world)
    realize_s, sub = timed(lambda: fmesh.realize(fmesh.slice(mesh, *SUB)))
    assert isinstance(sub, fmesh.RealizedMesh)
    first_f, _ = timed(lambda: sub.to_device_mesh("cpu"))
    first_t, _ = timed(lambda: dm[SUB])
    gc.collect()
    gc.freeze()

    def f_fn() -> object:
        return sub.to_device_mesh("cpu")

    def t_fn() -> object:
        return dm[SUB]

    target: float = spec["target_s"]
    n_f, n_t = calibrate(f_fn, target, 10_000), calibrate(t_fn, target, 10_000)
    f_times: list[float] = []
    t_times: list[float] = []
    for _ in range(spec["repeats"]):
        f_times.append(time_batch(f_fn, n_f))
        t_times.append(time_batch(t_fn, n_t))
    return {
        "realize_slice_s": realize_s,
        "first": {"fmesh": first_f, "torch": first_t},
        "repeat": {
            "fmesh": statistics.median(f_times),
            "torch": statistics.median(t_times),
            "fmesh_batches": f_times,
            "torch_batches": t_times,
            "fmesh_n": n_f,
            "torch_n": n_t,
        },
    }


def section_interop(b: Bench) -> None:
    world = b.mode.titan_world
    b.log(f"to_device_mesh of a sub-mesh at {world_str(world)} ranks ...")
    runs = [
        run_worker(
            worker_interop,
            {"world": world, "repeats": b.mode.pure_repeats, "target_s": b.mode.pure_target_s},
            300,
        )
        for _ in range(b.mode.titan_repeats)
    ]
    b.raw["interop"] = runs
    realize_s = statistics.median(r["realize_slice_s"] for r in runs)
    for which, label, how in (
        ("first", "first call", "fresh process, one call each (median over processes)"),
        ("repeat", "repeated calls", "median of batches"),
    ):
        b.add(
            Row(
                f"interop.sub_device_mesh.{which}",
                "interop (fake)",
                f"DeviceMesh of the `dp_shard`, `tp` sub-mesh: {label}",
                world_str(world),
                world,
                "s",
                statistics.median(r[which]["fmesh"] for r in runs),
                statistics.median(r[which]["torch"] for r in runs),
                note=f"fmesh: to_device_mesh('cpu') of the realized slice (its realize, a "
                f"memo hit, took {fmt_seconds(realize_s)} more); torch: dm['dp_shard', 'tp'] "
                f"of init_device_mesh's mesh; {how}",
            )
        )
