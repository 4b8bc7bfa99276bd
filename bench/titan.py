"""torchtitan's ``ParallelDims.build_mesh`` through the one-import change, against torch.

The recipe is ``torchtitan_build_mesh`` of ``examples/parallel_dims.py``: torchtitan's
(commit b5bcd76c6) call for call, with either ``spmd_backend`` (``spmd_types``, its
default, or ``partial_dtensor``: a dense mesh with ``fsdp``, no forward/backward mesh):
a 1-d world mesh from ``init_device_mesh``, ``_unflatten`` calls of it with
``backend_override={dim: "fake"}`` for the dims torchtitan keeps without a real group,
one ``_flatten`` of a slice, and the slices it keeps. The two sides differ only in which
``init_device_mesh`` makes the world mesh: torch's, or
``fmesh.device_mesh.init_device_mesh`` (the change a trainer makes by one import).
Every call after it is torch's own ``DeviceMesh`` method, so these rows measure
whatever fmesh does, or does not do, for meshes it made. Each worker also describes
every mesh built (ranks, local rank, group ranks), so the runner checks that both
libraries built the same ones.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import resource
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import torch_ref
from .shared import NAMES, TIMES, Json, Row
from .workloads import fresh_world, init_device_mesh_of

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

CONFIGS: dict[int, dict[str, int]] = {
    4: dict(pp=1, dp_replicate=1, cp=1, tp=2, ep=2),
    8: dict(pp=1, dp_replicate=2, cp=1, tp=2, ep=2),
    16: dict(pp=1, dp_replicate=2, cp=2, tp=2, ep=4),
    2**6: dict(pp=2, dp_replicate=2, cp=2, tp=2, ep=4),
    2**10: dict(pp=2, dp_replicate=2, cp=2, tp=4, ep=8),
    2**14: dict(pp=4, dp_replicate=4, cp=2, tp=8, ep=16),
    2**17: dict(pp=8, dp_replicate=4, cp=2, tp=8, ep=16),
}
"""torchtitan's degrees at each world size (``dp_shard``: the rest of the world)."""
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "parallel_dims.py"


def example() -> Any:
    """``examples/parallel_dims.py``, loaded once."""
    if "parallel_dims" not in sys.modules:
        spec = importlib.util.spec_from_file_location("parallel_dims", EXAMPLE)
        assert spec is not None and spec.loader is not None
        sys.modules["parallel_dims"] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["parallel_dims"]


def dims(world: int) -> Any:
    """The degrees at ``world``, resolved and checked as ``ParallelDims`` does."""
    return example().ParallelDims.resolve(world, **CONFIGS[world])


def label(world: int) -> str:
    d = dims(world)
    return " ".join(f"{n}={getattr(d, n)}" for n in (*NAMES, "ep"))


def build_mesh(
    init: Callable[..., DeviceMesh], world: int, spmd: str = "spmd_types"
) -> dict[str, DeviceMesh]:
    """Every mesh torchtitan's ``build_mesh`` keeps, by name, with ``init`` as
    ``torch.distributed.device_mesh.init_device_mesh`` (the one-import change)."""
    from torch.distributed import device_mesh

    saved, device_mesh.init_device_mesh = device_mesh.init_device_mesh, init
    try:
        meshes: dict[str, DeviceMesh] = example().torchtitan_build_mesh(
            dims(world), "cpu", spmd
        )
    finally:
        device_mesh.init_device_mesh = saved
    return meshes


def describe(meshes: Mapping[str, DeviceMesh]) -> Json:
    """What this rank sees of every mesh: names, ranks, coordinate; for 1-d meshes
    also the local rank and the group's ranks in group order."""
    import torch.distributed as dist

    out: Json = {}
    for name, dm in sorted(meshes.items()):
        entry: Json = {
            "names": list(dm.mesh_dim_names or ()),
            "mesh": dm.mesh.tolist(),
            "coordinate": dm.get_coordinate(),
        }
        if dm.ndim == 1:
            entry["local_rank"] = dm.get_local_rank()
            entry["group"] = dist.get_process_group_ranks(dm.get_group())
        out[name] = entry
    return out


def measured(impl: str, world: int, spmd: str) -> Json:
    """The recipe once, counted and timed: seconds, torch ``new_group`` calls, process
    groups constructed, the process's peak RSS, and a digest of the meshes built."""
    init, _ = init_device_mesh_of(impl), example()  # the example loaded before timing
    with torch_ref.counting_group_creation() as counts:
        start = time.perf_counter()
        meshes = build_mesh(init, world, spmd)
        seconds = time.perf_counter() - start
    text = json.dumps(describe(meshes), sort_keys=True)
    return {
        "seconds": seconds,
        **counts,
        "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "digest": hashlib.sha256(text.encode()).hexdigest(),
        "config": label(world),
    }


def spec_of(spmd: str) -> Callable[[str, object], Json]:
    """A case's spec: the backend, at every mode and size."""
    return lambda mode, size: {"spmd": spmd}


def fake(spec: Json) -> Json:
    """One library's ``build_mesh`` as rank 0 of a fake world."""
    impl, spmd = spec["impl"], spec.get("spmd", "spmd_types")
    fresh_world(
        spec["world"],
        lambda w: build_mesh(init_device_mesh_of(impl), w, spmd),
        freeze=True,
    )
    return {impl: measured(impl, spec["world"], spmd)}


def gloo(spec: Json) -> Json:
    """One rank of a real gloo job: ``build_mesh`` once, counted and timed."""
    import torch.distributed as dist

    import fmesh.device_mesh  # noqa: F401 - imported before timing, as torch's module

    torch_ref.init_gloo_worker(spec)
    dist.barrier()
    out = measured(spec["impl"], dist.get_world_size(), spec.get("spmd", "spmd_types"))
    dist.barrier()
    return {"rank": dist.get_rank(), **out}


def growth(rows: list[Row]) -> list[Row]:
    """Per library, the wall time at the largest world over that at the smallest (the
    medians of the rows): 1x is flat in the world size."""
    seconds = sorted((r for r in rows if r.key.endswith(".seconds")), key=lambda r: r.ranks)
    if len(seconds) < 2:
        return []
    lo, hi = seconds[0], seconds[-1]

    def over(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    what = f"wall time at {hi.world} over at {lo.world}"
    return [
        Row(
            lo.key.replace(".seconds", ".growth"),
            lo.section,
            lo.bench.replace("wall time", what),
            f"{hi.world} / {lo.world}",
            hi.ranks,
            "x",
            over(hi.fmesh, lo.fmesh),
            over(hi.torch, lo.torch),
            note="the two wall-time rows above, each a median of fresh processes; flat "
            f"in the world size is 1{TIMES}; target for fmesh: at most 1.25{TIMES}",
            every_size=True,
        )
    ]
