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
    b.raw["memory"] = {"value": res, "realized_fmesh": f_tr, "realized_torch": t_tr}
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
