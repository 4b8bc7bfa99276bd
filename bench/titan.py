"""torchtitan's ``ParallelDims.build_mesh`` through the one-import change, against torch.

The recipe is ``torchtitan_build_mesh`` of ``examples/parallel_dims.py``, torchtitan's
call for call. The two sides differ only in which ``init_device_mesh`` makes the world
mesh: torch's, or ``fmesh.device_mesh.init_device_mesh`` (the change a trainer makes by
one import). Every call after it is torch's own ``DeviceMesh`` method, so these rows
measure whatever fmesh does, or does not do, for meshes it made. Each run also
describes every mesh it built, so the runner checks that both libraries built the same.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .shared import NAMES, TIMES, Json, Row

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

# fmt: off
CONFIGS: dict[int, dict[str, int]] = {
    4: dict(pp=1, dp_replicate=1, cp=1, tp=2, ep=2),
    8: dict(pp=1, dp_replicate=2, cp=1, tp=2, ep=2),
    16: dict(pp=1, dp_replicate=2, cp=2, tp=2, ep=4),
    2**6: dict(pp=2, dp_replicate=2, cp=2, tp=2, ep=4),
    2**10: dict(pp=2, dp_replicate=2, cp=2, tp=4, ep=8),
    2**14: dict(pp=4, dp_replicate=4, cp=2, tp=8, ep=16),
    2**17: dict(pp=8, dp_replicate=4, cp=2, tp=8, ep=16),
}
# fmt: on
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


def summary(meshes: Any, world: int) -> Json:
    """A digest of the meshes built (compared across libraries), and the degrees."""
    text = json.dumps(describe(meshes), sort_keys=True)
    d = dims(world)
    config = " ".join(f"{n}={getattr(d, n)}" for n in (*NAMES, "ep"))
    return {"digest": hashlib.sha256(text.encode()).hexdigest(), "config": config}


def growth(rows: list[Row]) -> list[Row]:
    """Per library, the median wall time (``growth``) and the least process CPU time
    (``cpu_growth``) at the largest world over that at the smallest (the notes say
    why the least)."""

    def over(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    out = []
    for read, key, what, above in (
        ("seconds", "growth", "wall time", "wall-time rows above, each a median of fresh "
         "processes"),
        ("cpu", "cpu_growth", "process CPU time", "process CPU time rows above, each the "
         "least of fresh processes: a process's time for the same work varies up to 2x "
         "with the shared machine's other tenants, at any size, and that noise only adds"),
    ):  # fmt: skip
        lo, *_, hi = sorted(
            (r for r in rows if r.key.endswith("." + read)), key=lambda r: r.ranks
        )
        # fmt: off
        out.append(Row(
            lo.key.replace(f".{read}", f".{key}"), lo.section,
            f"{lo.bench.rpartition(': ')[0]}: {what} at {hi.world} over at {lo.world}",
            f"{hi.world} / {lo.world}", hi.ranks, "x", over(hi.fmesh, lo.fmesh),
            over(hi.torch, lo.torch), every_size=True,
            note=f"the two {above}; flat in the world size is 1{TIMES}; target for fmesh: at "
            f"most 1.25{TIMES}",
        ))
        # fmt: on
    return out
