"""Pure operations on the 5-d mesh: fmesh needs no process group, torch a built mesh.

torch's mesh is built once per world size on the ``fake`` backend and only the op is
timed: median of several batches, fmesh's and torch's interleaved round robin, the
collector off in a batch (as timeit does). torch's ``_flatten`` caches by name and
creates process groups, so every call gets a fresh name and the figure includes its
group creation.
"""

from __future__ import annotations

import gc
import itertools
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import fmesh

from . import torch_ref
from .launch import run_worker
from .shared import NAMES, SHAPES, Bench, Json, Row, calibrate, time_batch, world_str

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

Op = Callable[[], object]


@dataclass
class Ctx:
    """What the ops of one world size work on (built once, untimed)."""

    world: int
    shape: tuple[int, ...]
    sizes: dict[str, int]
    fm: fmesh.Mesh
    fworld: fmesh.Mesh
    dm: DeviceMesh
    dm_dp: DeviceMesh
    dm_world: DeviceMesh
    fresh: itertools.count[int]


@dataclass(frozen=True)
class PureOp:
    key: str
    label: str
    note: str
    fmesh: Callable[[Ctx], Op]
    torch: Callable[[Ctx], Op]
    torch_max_n: int = 10_000
    """Most calls in one torch batch (a torch flatten creates groups: keep it low)."""
    cleanup: Callable[[Ctx], None] | None = None
    """Untimed, after each torch batch."""


OPS: tuple[PureOp, ...] = (
    PureOp(
        "construct",
        "construct the 5-d mesh (no groups)",
        "torch: DeviceMesh(_init_backend=False), what init_device_mesh does before "
        "creating groups",
        lambda c: lambda: fmesh.make_mesh(c.sizes),
        lambda c: lambda: torch_ref.mesh_without_groups(c.world, c.shape, NAMES),
    ),
    PureOp(
        "slice1",
        "slice `tp`",
        "torch: dm['tp']",
        lambda c: lambda: fmesh.slice(c.fm, "tp"),
        lambda c: lambda: c.dm["tp"],
    ),
    PureOp(
        "slice2",
        "slice `dp_shard`, `tp`",
        "torch: dm['dp_shard', 'tp']",
        lambda c: lambda: fmesh.slice(c.fm, "dp_shard", "tp"),
        lambda c: lambda: c.dm["dp_shard", "tp"],
    ),
    PureOp(
        "flatten",
        "flatten `dp_replicate`, `dp_shard`",
        "torch: first _flatten under a fresh name, which creates its groups (fake "
        "backend); fmesh is pure",
        lambda c: lambda: fmesh.flatten(c.fm, ("dp_replicate", "dp_shard"), "dp"),
        lambda c: lambda: c.dm_dp._flatten(f"dp_b{next(c.fresh)}"),
        torch_max_n=50,
        # Every torch flatten adds an entry to the root mesh's flatten mapping, which
        # torch's slicing then scans: drop them after each batch.
        cleanup=lambda c: torch_ref.clear_flattens(c.dm),
    ),
    PureOp(
        "unflatten",
        "unflatten `world` into the 5 axes",
        "torch: _unflatten of a 1-d mesh without groups (its best case; with groups it "
        "also creates them)",
        lambda c: lambda: fmesh.unflatten(c.fworld, "world", c.sizes),
        lambda c: lambda: torch_ref.unflatten(c.dm_world, c.shape, NAMES),
    ),
    PureOp(
        "coordinate",
        "coordinate of a rank",
        "torch: _compute_coordinate_on_dim, the O(world) search every DeviceMesh "
        "construction and slice runs",
        lambda c: lambda: fmesh.coordinate(c.fm, 0),
        lambda c: lambda: torch_ref.coordinate_uncached(c.dm),
    ),
    PureOp(
        "coordinate_cached",
        "coordinate of a rank, torch cached",
        "torch: get_coordinate() returns the tuple cached at construction",
        lambda c: lambda: fmesh.coordinate(c.fm, 0),
        lambda c: c.dm.get_coordinate,
    ),
)


def worker(spec: Json) -> Json:
    """Median time of each op at one world size, fmesh's and torch's batches interleaved."""
    world: int = spec["world"]
    shape = SHAPES[world]
    repeats: int = spec["repeats"]
    target: float = spec["target_s"]
    sizes = dict(zip(NAMES, shape, strict=True))

    torch_ref.init_fake(world)
    torch_ref.preload_lazy_imports()
    dm = torch_ref.init_mesh(shape, NAMES)
    ctx = Ctx(
        world=world,
        shape=shape,
        sizes=sizes,
        fm=fmesh.make_mesh(sizes),
        fworld=fmesh.make_mesh({"world": world}),
        dm=dm,
        dm_dp=dm["dp_replicate", "dp_shard"],
        dm_world=torch_ref.mesh_without_groups(world, (world,), ("world",)),
        fresh=itertools.count(),
    )
    ops = [(op, op.fmesh(ctx), op.torch(ctx)) for op in OPS]
    # What exists now lives to the end: keep it out of the per-batch collections.
    gc.collect()
    gc.freeze()
    counts = {
        op.key: (calibrate(f_fn, target, 100_000), calibrate(t_fn, target, op.torch_max_n))
        for op, f_fn, t_fn in ops
    }
    for op, _, _ in ops:
        if op.cleanup is not None:
            op.cleanup(ctx)
    batches: dict[str, tuple[list[float], list[float]]] = {op.key: ([], []) for op in OPS}
    # Round robin over the ops, so a burst of load from elsewhere on the machine
    # spoils one batch of every op rather than every batch of one op.
    for _ in range(repeats):
        for op, f_fn, t_fn in ops:
            n_f, n_t = counts[op.key]
            batches[op.key][0].append(time_batch(f_fn, n_f))
            batches[op.key][1].append(time_batch(t_fn, n_t))
            if op.cleanup is not None:
                op.cleanup(ctx)
    return {
        key: {
            "fmesh": statistics.median(f_times),
            "torch": statistics.median(t_times),
            "fmesh_n": counts[key][0],
            "torch_n": counts[key][1],
            "fmesh_batches": f_times,
            "torch_batches": t_times,
        }
        for key, (f_times, t_times) in batches.items()
    }


def section(b: Bench) -> None:
    results: dict[int, Json] = {}
    for world in b.mode.worlds:
        b.log(f"pure ops at {world_str(world)} ranks ...")
        spec = {
            "world": world,
            "repeats": b.mode.pure_repeats,
            "target_s": b.mode.pure_target_s,
        }
        results[world] = run_worker(worker, spec, timeout_s=600)
    b.raw["pure"] = {str(w): r for w, r in results.items()}
    for op in OPS:
        for world, res in results.items():
            t = res[op.key]
            b.add(
                Row(
                    f"pure.{op.key}",
                    "pure ops",
                    op.label,
                    world_str(world),
                    world,
                    "s",
                    t["fmesh"],
                    t["torch"],
                    note=op.note,
                )
            )
