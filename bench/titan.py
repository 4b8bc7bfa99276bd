"""torchtitan's ``ParallelDims.build_mesh`` through the one-import change, against torch.

The recipe is torchtitan's (commit b5bcd76c6) with either ``spmd_backend``:
``spmd_types`` (its default) or ``partial_dtensor`` (a dense mesh with ``fsdp``, no
forward/backward mesh), rewritten here call for call: a 1-d world mesh from
``init_device_mesh``, four (three) ``_unflatten`` calls of it with
``backend_override={dim: "fake"}`` for the dims torchtitan keeps without a real group,
one ``_flatten`` of a slice, and the slices it keeps. The two sides differ only in
which ``init_device_mesh`` makes the world mesh: torch's, or
``fmesh.device_mesh.init_device_mesh`` (the change a trainer makes by one import).
Every call after it is torch's own ``DeviceMesh`` method, so these rows measure
whatever fmesh does, or does not do, for meshes it made. Each worker also describes
every mesh built (ranks, local rank, group ranks), so the runner checks that both
libraries built the same ones.
"""

from __future__ import annotations

import hashlib
import json
import resource
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import torch_ref
from .shared import NAMES, TIMES, Json, Row
from .workloads import fresh_world, init_device_mesh_of

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

DEGREES = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep")


@dataclass(frozen=True)
class Config:
    """torchtitan's parallelism degrees (``dp_shard=-1``: the rest of the world)."""

    pp: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    ep: int

    def resolved(self, world: int) -> Config:
        """The degrees with ``dp_shard`` filled in, checked as ``ParallelDims`` does."""
        dense = self.dp_replicate * self.cp * self.tp * self.pp
        dp_shard = world // dense if self.dp_shard < 0 else self.dp_shard
        if dp_shard < 1 or dense * dp_shard != world:
            raise ValueError(f"{self} does not tile a world of {world} ranks")
        if (dp_shard * self.cp * self.tp) % self.ep:
            raise ValueError(f"ep={self.ep} must divide dp_shard * cp * tp in {self}")
        return Config(self.pp, self.dp_replicate, dp_shard, self.cp, self.tp, self.ep)

    def label(self) -> str:
        return " ".join(f"{n}={getattr(self, n)}" for n in DEGREES)


CONFIGS: dict[int, Config] = {
    4: Config(pp=1, dp_replicate=1, dp_shard=-1, cp=1, tp=2, ep=2),
    8: Config(pp=1, dp_replicate=2, dp_shard=-1, cp=1, tp=2, ep=2),
    16: Config(pp=1, dp_replicate=2, dp_shard=-1, cp=2, tp=2, ep=4),
    2**6: Config(pp=2, dp_replicate=2, dp_shard=-1, cp=2, tp=2, ep=4),
    2**10: Config(pp=2, dp_replicate=2, dp_shard=-1, cp=2, tp=4, ep=8),
    2**14: Config(pp=4, dp_replicate=4, dp_shard=-1, cp=2, tp=8, ep=16),
    2**17: Config(pp=8, dp_replicate=4, dp_shard=-1, cp=2, tp=8, ep=16),
}
"""The configuration at each world size (every one valid for ``ParallelDims``)."""


def build_mesh(
    init: Callable[..., DeviceMesh], world: int, config: Config, spmd: str = "spmd_types"
) -> dict[str, DeviceMesh]:
    """torchtitan's ``ParallelDims.build_mesh`` with its ``spmd_backend`` (``spmd_types``
    or ``partial_dtensor``), call for call: every mesh it keeps, the 1-d ones as
    ``"1d/<name>"``."""
    c = config.resolved(world)
    types = spmd == "spmd_types"

    def exists(name: str, degree: int) -> bool:  # ParallelDims._mesh_exist
        if name == "fsdp" or (name == "dp_shard" and types):
            return True
        return c.ep > 1 if name == "efsdp" else degree > 1

    def unflatten(names: tuple[str, ...], degrees: tuple[int, ...]) -> DeviceMesh:
        override = {n: "fake" for n, d in zip(names, degrees) if not exists(n, d)}
        return torch_ref.unflatten(world_mesh, degrees, names, backend_override=override)

    batch, fsdp = c.dp_replicate * c.dp_shard, c.dp_shard * c.cp
    efsdp = fsdp * c.tp // c.ep
    world_mesh = init("cpu", (world,), mesh_dim_names=("world",))
    dataloading = unflatten(("pp", "batch", "cp", "tp"), (c.pp, batch, c.cp, c.tp))
    loss = torch_ref.flatten(dataloading, ("batch", "cp"), "loss_mesh")
    if types:
        dense = unflatten(NAMES, (c.pp, c.dp_replicate, c.dp_shard, c.cp, c.tp))
        fwdbwd = unflatten(("pp", "dp", "cp", "tp"), (c.pp, batch, c.cp, c.tp))
        spmd_dense = fwdbwd["dp", "cp", "tp"]
    else:
        dense = unflatten(
            ("pp", "dp_replicate", "fsdp", "tp"), (c.pp, c.dp_replicate, fsdp, c.tp)
        )
    sparse = unflatten(
        ("pp", "dp_replicate", "efsdp", "ep"), (c.pp, c.dp_replicate, efsdp, c.ep)
    )
    meshes = {
        "world": world_mesh,
        "dataloading": dataloading,
        "loss": loss,
        "dense": dense,
        "sparse": sparse,
    }
    single = {
        "pp": dataloading["pp"],
        "batch": dataloading["batch"],
        "loss": loss,
        "dp_replicate": dense["dp_replicate"],
        "cp": dataloading["cp"],
        "tp": dataloading["tp"],
        "ep": sparse["ep"],
        "efsdp": sparse["efsdp"],
    }
    if types:
        meshes["spmd_dense_for_fwdbwd"] = spmd_dense
        if c.ep > 1:
            meshes["spmd_sparse_for_fwdbwd"] = sparse["dp_replicate", "efsdp", "ep"]
        single |= {"dp": spmd_dense["dp"], "dp_shard": dense["dp_shard"]}
    else:
        single["fsdp"] = dense["fsdp"]
    meshes.update({f"1d/{name}": mesh for name, mesh in single.items()})
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
    init = init_device_mesh_of(impl)
    with torch_ref.counting_group_creation() as counts:
        start = time.perf_counter()
        meshes = build_mesh(init, world, CONFIGS[world], spmd)
        seconds = time.perf_counter() - start
    text = json.dumps(describe(meshes), sort_keys=True)
    return {
        "seconds": seconds,
        **counts,
        "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "digest": hashlib.sha256(text.encode()).hexdigest(),
        "config": CONFIGS[world].resolved(world).label(),
    }


def spec_of(spmd: str) -> Callable[[str, object], Json]:
    """A case's spec: the backend, at every mode and size."""
    return lambda mode, size: {"spmd": spmd}


def fake(spec: Json) -> Json:
    """One library's ``build_mesh`` as rank 0 of a fake world."""
    impl, spmd = spec["impl"], spec.get("spmd", "spmd_types")
    fresh_world(
        spec["world"],
        lambda w: build_mesh(init_device_mesh_of(impl), w, CONFIGS[w], spmd),
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
