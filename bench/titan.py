"""torchtitan's ``ParallelDims.build_mesh`` through the one-import change, against torch.

The recipe is torchtitan's (commit b5bcd76c6), rewritten here call for call for both
of its ``spmd_backend`` settings: a 1-d world mesh from ``init_device_mesh``,
``_unflatten`` calls of it with ``backend_override={dim: "fake"}`` for the dims
torchtitan keeps without a real group (four with ``spmd_types``, its default; three
with ``partial_dtensor``, whose dense mesh folds dp_shard and cp into ``fsdp``), one
``_flatten`` of a slice, and the slices it keeps (the gloo rows run ``spmd_types``).
The only thing that differs between the two sides is which ``init_device_mesh`` makes
the world mesh: torch's, or ``fmesh.device_mesh.init_device_mesh`` (the change a
trainer makes by one import). Every call after it is torch's own ``DeviceMesh`` method,
so these rows measure whatever fmesh does, or does not do, for meshes it made.

Per row: the time of ``build_mesh`` (fake backend: one rank, one fresh process per
library and repeat, after a warm-up on a small world that is torn down and
``gc.freeze()``; real gloo:
the slowest rank's), torch ``new_group`` calls and process groups constructed while it
runs (:func:`bench.torch_ref.counting_group_creation`), and the process's peak RSS.
Each worker also describes every mesh the recipe built (ranks, local rank, group
ranks) and the section checks that both libraries built the same ones.
"""

from __future__ import annotations

import gc
import hashlib
import json
import resource
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import torch_ref
from .launch import run_gloo_job, run_worker
from .shared import Bench, Json, Row, world_str

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

InitDeviceMesh = Callable[..., "DeviceMesh"]

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


@dataclass(frozen=True)
class Plan:
    """What a mode runs: fake worlds (one process per library and repeat) and gloo jobs."""

    fake: tuple[int, ...]
    fake_repeats: int
    gloo: tuple[int, ...]
    gloo_repeats: int


PLANS = {
    "full": Plan(fake=(2**10, 2**14, 2**17), fake_repeats=3, gloo=(4, 8, 16), gloo_repeats=2),
    "quick": Plan(fake=(2**10, 2**14), fake_repeats=1, gloo=(4,), gloo_repeats=1),
    "smoke": Plan(fake=(2**6,), fake_repeats=1, gloo=(4,), gloo_repeats=1),
}
WARM_UP_WORLD = 2**6
LIBRARIES = ("fmesh", "torch")
SPMD = ("spmd_types", "partial_dtensor")
"""torchtitan's ``ParallelismConfig.spmd_backend`` values; the first is its default."""


def init_device_mesh_of(impl: str) -> InitDeviceMesh:
    """``fmesh.device_mesh.init_device_mesh`` or torch's, by name."""
    if impl == "fmesh":
        from fmesh.device_mesh import init_device_mesh

        return init_device_mesh
    if impl == "torch":
        from torch.distributed.device_mesh import init_device_mesh as torch_init

        return torch_init
    raise ValueError(f"impl must be one of {LIBRARIES}, got {impl!r}")


# -- the recipe ---------------------------------------------------------------------------


def build_mesh(
    init: InitDeviceMesh,
    world: int,
    config: Config,
    device_type: str = "cpu",
    spmd: str = SPMD[0],
) -> dict[str, DeviceMesh]:
    """torchtitan's ``ParallelDims.build_mesh`` with ``spmd_backend=spmd``, call for call.

    Returns every mesh it keeps: the world, its global meshes and its 1-d meshes
    (``"1d/<name>"``).
    """
    if spmd not in SPMD:
        raise ValueError(f"spmd must be one of {SPMD}, got {spmd!r}")
    c = config.resolved(world)

    def mesh_exist(name: str, degree: int) -> bool:  # ParallelDims._mesh_exist
        if name in ("fsdp", "dp_shard"):
            return True
        if name == "efsdp":
            return c.ep > 1
        return degree > 1

    def unflatten_mesh(
        world_mesh: DeviceMesh, names: tuple[str, ...], degrees: tuple[int, ...]
    ) -> DeviceMesh:
        override = {n: "fake" for n, d in zip(names, degrees) if not mesh_exist(n, d)}
        return torch_ref.unflatten(world_mesh, degrees, names, backend_override=override)

    batch = c.dp_replicate * c.dp_shard
    efsdp = c.dp_shard * c.cp * c.tp // c.ep
    world_mesh = init(device_type, (world,), mesh_dim_names=("world",))
    dataloading = unflatten_mesh(
        world_mesh, ("pp", "batch", "cp", "tp"), (c.pp, batch, c.cp, c.tp)
    )
    loss = torch_ref.flatten(dataloading, ("batch", "cp"), "loss_mesh")
    spmd_dense: DeviceMesh | None = None
    if spmd == "spmd_types":
        dense = unflatten_mesh(
            world_mesh,
            ("pp", "dp_replicate", "dp_shard", "cp", "tp"),
            (c.pp, c.dp_replicate, c.dp_shard, c.cp, c.tp),
        )
        fwdbwd = unflatten_mesh(
            world_mesh, ("pp", "dp", "cp", "tp"), (c.pp, batch, c.cp, c.tp)
        )
        spmd_dense = fwdbwd["dp", "cp", "tp"]
    else:  # partial_dtensor folds dp_shard and cp into fsdp
        dense = unflatten_mesh(
            world_mesh,
            ("pp", "dp_replicate", "fsdp", "tp"),
            (c.pp, c.dp_replicate, c.dp_shard * c.cp, c.tp),
        )
    sparse = unflatten_mesh(
        world_mesh, ("pp", "dp_replicate", "efsdp", "ep"), (c.pp, c.dp_replicate, efsdp, c.ep)
    )
    meshes = {
        "world": world_mesh,
        "dataloading": dataloading,
        "loss": loss,
        "dense": dense,
        "sparse": sparse,
    }
    if spmd_dense is not None:
        meshes["spmd_dense_for_fwdbwd"] = spmd_dense
        if c.ep > 1:
            meshes["spmd_sparse_for_fwdbwd"] = sparse["dp_replicate", "efsdp", "ep"]
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
    if spmd_dense is not None:
        single.update(dp=spmd_dense["dp"], dp_shard=dense["dp_shard"])
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


def digest(description: Json) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()


def measured_build(
    impl: str, world: int, config: Config, spmd: str = SPMD[0]
) -> tuple[Json, object]:
    """Run the recipe once, counted and timed; (figures, the meshes to keep alive)."""
    init = init_device_mesh_of(impl)
    with torch_ref.counting_group_creation() as counts:
        start = time.perf_counter()
        meshes = build_mesh(init, world, config, spmd=spmd)
        seconds = time.perf_counter() - start
    description = describe(meshes)
    figures: Json = {
        "seconds": seconds,
        "new_group": counts["new_group"],
        "groups": counts["groups"],
        "non_member": counts["non_member"],
        "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "digest": digest(description),
        "meshes": len(meshes),
    }
    return figures, meshes


# -- workers ------------------------------------------------------------------------------


def worker_fake(spec: Json) -> Json:
    """One library's ``build_mesh`` on a fake world, as rank 0, in this process."""
    impl: str = spec["impl"]
    world: int = spec["world"]
    spmd: str = spec.get("spmd", SPMD[0])
    torch_ref.init_fake(WARM_UP_WORLD)
    warm_up = build_mesh(
        init_device_mesh_of(impl), WARM_UP_WORLD, CONFIGS[WARM_UP_WORLD], spmd=spmd
    )
    del warm_up
    torch_ref.teardown()
    torch_ref.init_fake(world)
    # The heap this process inherited from the bench's fork server (torch, numpy) is
    # moved out of the collector's reach, on both sides: a full collection during the
    # build would otherwise copy every page of it (about 90 ms here), a cost of the
    # fork, not of either library.
    gc.collect()
    gc.freeze()
    figures, keep = measured_build(impl, world, CONFIGS[world], spmd)
    del keep
    return figures


def worker_gloo(spec: Json) -> Json:
    """One rank of a real gloo job: ``build_mesh`` once, counted and timed."""
    import torch.distributed as dist

    import fmesh.device_mesh  # noqa: F401 - imported before timing, as torch's module

    torch_ref.init_gloo_worker(spec)
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    figures, keep = measured_build(spec["impl"], world, CONFIGS[world])
    dist.barrier()
    del keep
    return {"rank": rank, **figures}


# -- the section --------------------------------------------------------------------------

TORCH_NOTE = "torch: the same recipe with torch's init_device_mesh"
SAME = "same meshes on both sides (ranks, local ranks, group ranks)"


def section(b: Bench) -> None:
    plan = PLANS[b.mode.name]
    raw: Json = {
        "configs": {str(w): CONFIGS[w].resolved(w).label() for w in (*plan.fake, *plan.gloo)},
        "fake": {},
        **{f"fake/{spmd}": {} for spmd in SPMD[1:]},
        "gloo": {},
    }
    b.raw["titan"] = raw
    for spmd in SPMD:
        for world in plan.fake:
            b.log(f"torchtitan build_mesh ({spmd}) on fake at {world_str(world)} ranks ...")
            runs: dict[str, list[Json]] = {impl: [] for impl in LIBRARIES}
            for _ in range(plan.fake_repeats):
                for impl in LIBRARIES:  # interleaved: the machine's load drifts
                    spec = {"impl": impl, "world": world, "spmd": spmd}
                    runs[impl].append(run_worker(worker_fake, spec, 600))
            raw["fake" if spmd == SPMD[0] else f"fake/{spmd}"][str(world)] = runs
            one_rank = {k: [[r] for r in v] for k, v in runs.items()}
            _rows(b, "fake", world, world_str(world), one_rank, spmd)
    for world in plan.gloo:
        b.log(f"torchtitan build_mesh on gloo, {world} ranks ...")
        jobs: dict[str, list[list[Json]]] = {impl: [] for impl in LIBRARIES}
        for _ in range(plan.gloo_repeats):
            for impl in LIBRARIES:
                jobs[impl].append(run_gloo_job(worker_gloo, world, {"impl": impl}, 600))
        raw["gloo"][str(world)] = jobs
        _rows(b, "gloo", world, str(world), jobs)


def same_meshes(jobs: Mapping[str, list[list[Json]]]) -> bool:
    """Every rank of every run described the same meshes with both libraries."""
    digests = {
        impl: {(r.get("rank", 0), r["digest"]) for job in runs for r in job}
        for impl, runs in jobs.items()
    }
    fm, th = digests["fmesh"], digests["torch"]
    return fm == th and len(fm) == len({rank for rank, _ in fm})


def _slowest(jobs: list[list[Json]], key: str) -> float:
    """Median over runs of the largest figure over a run's ranks."""
    return float(statistics.median(max(r[key] for r in job) for job in jobs))


def _rows(
    b: Bench, backend: str, world: int, label: str, jobs: dict[str, Any], spmd: str = SPMD[0]
) -> None:
    """The rows of one world; ``spmd`` other than torchtitan's default is named in the
    rows' keys (``titan.fake.partial_dtensor.seconds``) and titles."""
    same = same_meshes(jobs)
    tag = backend if spmd == SPMD[0] else f"{backend}.{spmd}"
    flavour = "" if spmd == SPMD[0] else f" (spmd_backend={spmd})"
    b.raw["titan"].setdefault("same_meshes", {})[f"{tag}/{world}"] = same
    if not same:
        b.log(f"torchtitan {tag} {label}: fmesh and torch built DIFFERENT meshes")
    config = CONFIGS[world].resolved(world).label()
    where = "one rank, fresh process" if backend == "fake" else "real gloo, slowest rank"
    check = SAME if same else "**meshes differ from torch's**"
    figures = (
        ("seconds", "s", "wall time", f"{where}; {config}; {check}"),
        ("new_group", "count", "torch new_group calls", "per rank (max over ranks)"),
        (
            "groups",
            "count",
            "process groups constructed",
            "_new_process_group_helper calls that made a group, per rank (max)",
        ),
        ("rss_peak", "B", "peak RSS", "ru_maxrss of the process (max over ranks)"),
    )
    for key, unit, what, note in figures:
        b.add(
            Row(
                f"titan.{tag}.{key}",
                f"torchtitan ({backend})",
                f"ParallelDims.build_mesh{flavour}, one-import change: {what}",
                label,
                world,
                unit,
                _slowest(jobs["fmesh"], key),
                _slowest(jobs["torch"], key),
                note=f"{note}; {TORCH_NOTE}",
                resolution=2**20 if unit == "B" else 0.0,
                every_size=backend == "gloo" and key == "seconds",
            )
        )
