"""``fmesh.device_mesh.init_device_mesh`` against torch's ``init_device_mesh``.

The same call, ``init_device_mesh("cpu", shape, mesh_dim_names=<the 5 names>)`` of the
dense 5-d mesh, from each library:

* **first call**: what a trainer pays at start-up. On the fake backend at the
  to_device_mesh world size, one fresh process per library and repeat (after a warm-up
  on a small world that is torn down, as the realize rows do); on real gloo, one job
  per library per repeat, the slowest rank's time.
* **the same call again**: fmesh's is a memo hit (``make_mesh`` + a realize that
  creates nothing + the DeviceMesh memo); torch builds the mesh and its groups again.
  Per call, median of a batch (the slowest rank's, on gloo).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import torch_ref
from .launch import run_gloo_job, run_worker
from .shared import (
    NAMES,
    SHAPES,
    Bench,
    Json,
    Row,
    calibrate,
    shape_str,
    time_batch,
    world_str,
)
from .shared import timed as timed_call

WARM_UP_WORLD = 64
TORCH_NOTE = "torch: torch.distributed.device_mesh.init_device_mesh, same arguments"


def _init(impl: str) -> Callable[..., Any]:
    if impl == "fmesh":
        from fmesh.device_mesh import init_device_mesh

        return init_device_mesh
    from torch.distributed.device_mesh import init_device_mesh as torch_init

    return torch_init


def _call(impl: str, shape: Sequence[int]) -> Callable[[], object]:
    init = _init(impl)
    return lambda: init("cpu", tuple(shape), mesh_dim_names=NAMES)


def worker_fake(spec: Json) -> Json:
    """One library's first call and repeated calls on a fake world, in this process."""
    impl: str = spec["impl"]
    world: int = spec["world"]
    torch_ref.init_fake(WARM_UP_WORLD)
    _call(impl, SHAPES[WARM_UP_WORLD])()
    torch_ref.teardown()
    torch_ref.init_fake(world)
    call = _call(impl, SHAPES[world])
    first, keep = timed_call(call)
    if first > spec["slow_s"]:  # seconds a call: one more, timed alone
        repeat, _ = timed_call(call)
    else:
        n = calibrate(call, spec["target_s"], 10_000)
        repeat = statistics.median(time_batch(call, n) for _ in range(spec["repeats"]))
    del keep
    return {"first": first, "repeat": repeat}


def worker_gloo(spec: Json) -> Json:
    """One rank of a real gloo job: the first call, then ``repeats`` more."""
    import torch.distributed as dist

    import fmesh.device_mesh  # noqa: F401 - imported before timing, as torch's module

    torch_ref.init_gloo_worker(spec)
    rank = dist.get_rank()
    call = _call(spec["impl"], spec["shape"])
    dist.barrier()
    first, keep = timed_call(call)
    dist.barrier()
    times = []
    for _ in range(spec["repeats"]):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    dist.barrier()
    del keep
    return {"rank": rank, "first": first, "repeat": statistics.median(times)}


def section(b: Bench) -> None:
    _fake(b)
    _gloo(b)


def _fake(b: Bench) -> None:
    world = b.mode.titan_world
    b.log(f"drop-in init_device_mesh on fake at {world_str(world)} ranks ...")
    spec = {
        "world": world,
        "repeats": b.mode.pure_repeats,
        "target_s": b.mode.pure_target_s,
        "slow_s": 0.05,
    }
    runs: dict[str, list[Json]] = {"fmesh": [], "torch": []}
    for _ in range(b.mode.titan_repeats):
        for impl in runs:  # interleaved: the machine's load drifts
            runs[impl].append(run_worker(worker_fake, {**spec, "impl": impl}, 300))
    b.raw["dropin_fake"] = runs
    for which, label, how in (
        ("first", "first call", "fresh process (median over processes)"),
        ("repeat", "the same call again", "per call; fmesh: a memo hit"),
    ):
        b.add(
            Row(
                f"dropin.fake.{which}",
                "drop-in (fake)",
                f"init_device_mesh of the 5-d mesh: {label}",
                world_str(world),
                world,
                "s",
                statistics.median(r[which] for r in runs["fmesh"]),
                statistics.median(r[which] for r in runs["torch"]),
                note=f"fmesh: fmesh.device_mesh.init_device_mesh; {TORCH_NOTE}; {how}",
            )
        )


def _gloo(b: Bench) -> None:
    rows: list[Row] = []
    raw: Json = {}
    for shape, repeats in b.mode.gloo:
        world = math.prod(shape)
        b.log(f"drop-in init_device_mesh on gloo, {world} ranks ...")
        runs: dict[str, list[list[Json]]] = {"fmesh": [], "torch": []}
        for _ in range(repeats):
            for impl in runs:
                calls = 50 if impl == "fmesh" else 5
                spec = {"impl": impl, "shape": list(shape), "repeats": calls}
                runs[impl].append(run_gloo_job(worker_gloo, world, spec, 300))
        raw[shape_str(shape)] = runs

        for which, label in (
            ("first", "first call: wall time, max over ranks"),
            ("repeat", "the same call again: per call, max over ranks"),
        ):
            rows.append(
                Row(
                    f"dropin.gloo.{which}",
                    "drop-in (gloo)",
                    f"init_device_mesh of the 5-d mesh: {label}",
                    f"{world} ({shape_str(shape)})",
                    world,
                    "s",
                    _slowest(runs["fmesh"], which),
                    _slowest(runs["torch"], which),
                    note=f"real gloo processes; {TORCH_NOTE}"
                    + ("; fmesh: a memo hit" if which == "repeat" else ""),
                    every_size=True,
                )
            )
    b.raw["dropin_gloo"] = raw
    order = ["dropin.gloo.first", "dropin.gloo.repeat"]
    b.rows.extend(sorted(rows, key=lambda r: order.index(r.key)))


def _slowest(jobs: list[list[Json]], which: str) -> float:
    """Median over jobs of the slowest rank's figure."""
    return float(statistics.median(max(r[which] for r in job) for job in jobs))
