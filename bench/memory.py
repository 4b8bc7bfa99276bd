"""Memory of one mesh value (no groups) and of a realized trainer mesh.

A value: its pickle, its deep size (``sys.getsizeof`` over everything reachable, plus
tensor storage) and tracemalloc's peak while constructing it. A realized mesh: the
fake-backend realize of :mod:`bench.fake` under tracemalloc (Python allocations only).
"""

from __future__ import annotations

import pickle
import tracemalloc
from collections.abc import Callable

import fmesh

from . import torch_ref
from .fake import realize_runs
from .launch import WorkerTimeout, run_worker
from .recipes import TRAINER5
from .shared import NAMES, SHAPES, Bench, Json, Row, deep_size, world_str

VALUE_ROWS = (
    ("pickle", "pickle size", "torch: DeviceMesh without groups"),
    ("deep", "deep size", "sys.getsizeof over reachable objects (+ tensor storage)"),
    (
        "construct_peak",
        "tracemalloc peak while constructing",
        "Python allocations only (torch's tensor storage not seen)",
    ),
)
REALIZED_ROWS = (("traced_retained", "retained"), ("traced_peak", "peak"))
ROOTS = {"full": 1000, "quick": 1000, "smoke": 600}
"""Roots per half of the distinct-names workload, per mode: more than fill fmesh's
bounded tables (3 calls and 2 meshes per root, 1024 of each kept), so the second
half shows what stays."""
ROOTS_WORLD = 8


def worker_roots(spec: Json) -> Json:
    """Python memory retained by roots with distinct dim names, built and dropped one
    after the other (a 2x4 root, a _flatten, an _unflatten each): tracemalloc's
    current size after the first ``roots`` and after ``2 * roots``."""
    import gc

    from torch.distributed.device_mesh import init_device_mesh as torch_init

    from fmesh.device_mesh import init_device_mesh as fmesh_init

    torch_ref.init_fake(ROOTS_WORLD)
    init = fmesh_init if spec["impl"] == "fmesh" else torch_init
    roots: int = spec["roots"]
    sizes = []
    tracemalloc.start()
    for i in range(2 * roots + 1):
        dm = init("cpu", (2, 4), mesh_dim_names=(f"a{i}", f"b{i}"))
        dm._flatten(f"f{i}")
        dm._unflatten(1, (2, 2), (f"x{i}", f"y{i}"))
        del dm
        if i % roots == 0 and i:
            gc.collect()
            sizes.append(tracemalloc.get_traced_memory()[0])
    tracemalloc.stop()
    return {"growth": max(0, sizes[1] - sizes[0])}


def worker_value(spec: Json) -> Json:
    """Size of one mesh value (no groups), fmesh and torch, at one world size."""
    world: int = spec["world"]
    shape = SHAPES[world]
    torch_ref.init_fake(world)
    makers: dict[str, Callable[[], object]] = {
        "fmesh": lambda: fmesh.make_mesh(dict(zip(NAMES, shape, strict=True))),
        "torch": lambda: torch_ref.mesh_without_groups(world, shape, NAMES),
    }
    out: Json = {}
    for impl, make in makers.items():
        make()  # warm-up: first-use imports and caches
        tracemalloc.start()
        value = make()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out[impl] = {
            "pickle": len(pickle.dumps(value)),
            "deep": deep_size(value),
            "construct_peak": peak,
        }
    return out


def section(b: Bench) -> None:
    world = b.mode.memory_world
    w = world_str(world)
    b.log(f"memory at {w} ranks ...")
    res = run_worker(worker_value, {"world": world}, 300)
    f_tr = realize_runs(TRAINER5, "fmesh", world, 1, True, 300)[0]
    t_tr: Json | None = None
    skipped: str | None = None
    limit = b.mode.torch_limit_s * 3  # tracemalloc slows Python code down
    try:
        t_tr = realize_runs(TRAINER5, "torch", world, 1, True, limit + 30)[0]
    except WorkerTimeout:
        skipped = f"skipped (ran past {limit + 30:.0f} s)"
    n = ROOTS.get(b.mode.name, ROOTS["full"])
    smoke = b.mode.name == "smoke"
    roots = {
        impl: run_worker(worker_roots, {"impl": impl, "roots": n}, 300)
        for impl in (("fmesh",) if smoke else ("fmesh", "torch"))
    }
    roots_skipped = (
        "skipped in smoke mode (a minute of torch new_group calls)" if smoke else None
    )
    b.raw["memory"] = {
        "value": res,
        "realized_fmesh": f_tr,
        "realized_torch": t_tr,
        "roots": roots,
    }
    b.add(
        Row(
            "memory.roots.growth",
            "memory",
            "roots with distinct dim names, built and dropped: memory growth",
            str(ROOTS_WORLD),
            ROOTS_WORLD,
            "B",
            roots["fmesh"]["growth"],
            None if smoke else roots["torch"]["growth"],
            note=f"fake backend; each root (2x4) built, _flatten-ed and _unflatten-ed "
            f"under new names, then dropped; tracemalloc's current size after {2 * n} "
            f"roots less after {n}; torch's groups of every root stay registered",
            skipped=roots_skipped,
        )
    )
    for key, label, note in VALUE_ROWS:
        b.add(
            Row(
                f"memory.value.{key}",
                "memory",
                f"one mesh value: {label}",
                w,
                world,
                "B",
                res["fmesh"][key],
                res["torch"][key],
                note=note,
            )
        )
    for key, label in REALIZED_ROWS:
        b.add(
            Row(
                f"memory.realized.{key}",
                "memory",
                f"realized mesh + 3 flattens: tracemalloc {label}",
                w,
                world,
                "B",
                f_tr[key],
                None if t_tr is None else t_tr[key],
                note=skipped
                or "fake backend; torch: init_device_mesh + 3 _flatten calls; Python "
                "allocations only",
                skipped=skipped,
            )
        )
