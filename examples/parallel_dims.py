"""torchtitan's ParallelDims meshes, dense and expert, as compositions of one fmesh value.

torchtitan (``torchtitan/distributed/parallel_dims.py``, ``ParallelDims.build_mesh``)
builds every mesh a trainer needs by calling ``DeviceMesh._unflatten`` on a 1-d world
mesh once per view (and ``_flatten`` for the loss mesh), noting that "DeviceMesh
currently recreates the process group for each dimension". Here every view is a value
derived from one mesh with ``fmesh.unflatten``/``flatten``/``slice``/``rename``, and
``fmesh.realize`` creates each distinct group once, whichever view asks for it.

  view         axes                                derived as
  world        world                               make_mesh
  dense        pp, dp_replicate, dp_shard, cp, tp  unflatten(world)
  dataloading  pp, batch, cp, tp                   flatten(dense: dp_replicate, dp_shard)
  loss         loss                                flatten(slice(dataloading: batch, cp))
  dense_fsdp   pp, dp_replicate, fsdp, tp          flatten(dense: dp_shard, cp)
  fwdbwd       pp, dp, cp, tp                      rename(dataloading: batch -> dp)
  sparse       pp, dp_replicate, efsdp, ep, etp    unflatten(flatten(dense: dp_shard, cp, tp))

``efsdp = dp_shard * cp * tp / (ep * etp)``: the expert region reuses the
``dp_shard x cp x tp`` ranks, split into expert-FSDP, expert-parallel and expert-TP.

These views are fmesh's rendering, not torchtitan's code; against its ``build_mesh``
at commit ``b5bcd76c6`` they differ exactly so: ``sparse`` has an ``etp`` axis
(torchtitan deprecated expert TP in c4b409af2; at ``--etp 1``, the default, it is
torchtitan's ``(pp, dp_replicate, efsdp, ep)`` with a size-1 ``etp``); the loss axis
is ``loss`` (torchtitan names the flattened dim ``loss_mesh``, kept as ``"loss"``);
``dense`` (``spmd_types``' storage mesh) and ``dense_fsdp`` (``partial_dtensor``'s)
are both built, where torchtitan builds the one its ``spmd_backend`` picks; size-1
axes get no ``"fake"`` backend (fmesh makes no communicator for them anyway); and the
1-d meshes torchtitan hands out are not listed (each is a ``slice`` of a view). The
exact recipe is :func:`torchtitan_build_mesh`.

Dry run for one rank of a big world, on torch's fake backend (no torchrun, no GPUs):

    python examples/parallel_dims.py --plan --world 2**17 --pp 8 --dp-replicate 4 \\
        --cp 2 --tp 8 --ep 16 --rank 77777

Check torchtitan's own recipe before launch: :func:`torchtitan_build_mesh` is its
``build_mesh`` at commit ``b5bcd76c6``, call for call on torch's ``init_device_mesh``
and ``DeviceMesh._unflatten``; ``fmesh plan`` runs :func:`torchtitan` as 16 ranks of a
2**17-rank fake world, each with torch routed through fmesh, and compares the ranks'
calls; :func:`torchtitan_buggy` plants a rank-dependent config that it finds:

    fmesh plan --world 2**17 --rank sample:16 examples/parallel_dims.py:torchtitan
    fmesh plan --world 2**17 --rank sample:16 examples/parallel_dims.py:torchtitan_buggy

Real run: realize every view and check every group with a collective:

    torchrun --standalone --nproc-per-node 8 examples/parallel_dims.py \\
        --pp 2 --tp 2 --ep 2 --etp 2
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, final

import attrs

import fmesh

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "DERIVATIONS",
    "TITAN_DEGREES",
    "DimsError",
    "ParallelDims",
    "build_meshes",
    "main",
    "plan",
    "run",
    "torchtitan",
    "torchtitan_buggy",
    "torchtitan_build_mesh",
    "torchtitan_groups_per_rank",
]

DERIVATIONS: Mapping[str, str] = {
    "world": "make_mesh({'world': N})",
    "dense": "unflatten(world, 'world', pp, dp_replicate, dp_shard, cp, tp)",
    "dataloading": "flatten(dense, (dp_replicate, dp_shard), 'batch')",
    "loss": "flatten(slice(dataloading, batch, cp), (batch, cp), 'loss')",
    "dense_fsdp": "flatten(dense, (dp_shard, cp), 'fsdp')",
    "fwdbwd": "rename(dataloading, {batch: dp})",
    "sparse": "unflatten(flatten(dense, (dp_shard, cp, tp)), efsdp, ep, etp)",
}
"""How :func:`build_meshes` derives each view, in realize order."""

# A group longer than this prints as its first _HEAD ranks, "...", and its last.
_FULL, _HEAD = 8, 4


class DimsError(fmesh.MeshError):
    """Parallelism degrees that do not fit the world (or a bad flag)."""


@final
@attrs.frozen
class ParallelDims:
    """Validated parallelism degrees; build with :meth:`resolve`."""

    world: int
    pp: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    ep: int
    etp: int

    @classmethod
    def resolve(
        cls,
        world: int,
        *,
        pp: int = 1,
        dp_replicate: int = 1,
        dp_shard: int = -1,
        cp: int = 1,
        tp: int = 1,
        ep: int = 1,
        etp: int = 1,
    ) -> ParallelDims:
        """Check the degrees as torchtitan does; ``dp_shard=-1`` takes the rest.

        Raises:
            DimsError: a degree below 1, a product that is not the world size, or an
                expert split that does not fit (the message says how to fix it).

        >>> ParallelDims.resolve(64, pp=2, tp=4, ep=8)
        ParallelDims(world=64, pp=2, dp_replicate=1, dp_shard=8, cp=1, tp=4, ep=8, etp=1)
        """
        degrees = {"pp": pp, "dp_replicate": dp_replicate, "cp": cp, "tp": tp}
        degrees |= {"ep": ep, "etp": etp}
        for name, value in {"world": world, **degrees, "dp_shard": dp_shard}.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if world < 1:
            raise DimsError(f"the world size is {world}; expected at least 1 rank")
        for name, value in degrees.items():
            if value < 1:
                raise DimsError(
                    f"--{name.replace('_', '-')} is {value}; expected a degree >= 1 "
                    "(1 turns that parallelism off)"
                )
        others = pp * dp_replicate * cp * tp
        if dp_shard == -1:
            if world % others:
                raise DimsError(
                    f"--dp-shard -1 takes the rest of the world, but pp*dp_replicate*cp*tp "
                    f"= {pp}*{dp_replicate}*{cp}*{tp} = {others} does not divide the world "
                    f"size {world}; choose degrees whose product divides {world}"
                )
            dp_shard = world // others
        elif dp_shard < 1:
            raise DimsError(
                f"--dp-shard is {dp_shard}; expected -1 (the rest of the world) or a "
                "degree >= 1"
            )
        if others * dp_shard != world:
            raise DimsError(
                f"pp*dp_replicate*dp_shard*cp*tp = {pp}*{dp_replicate}*{dp_shard}*{cp}*{tp} "
                f"= {others * dp_shard}, but the world has {world} ranks; the degrees must "
                f"multiply to {world} (pass --dp-shard -1 to take the rest)"
            )
        if ep > 1 and etp not in (1, tp):
            raise DimsError(
                f"--etp is {etp} with --ep {ep}; torchtitan supports expert tensor "
                f"parallelism equal to --tp ({tp}) or 1"
            )
        region = dp_shard * cp * tp
        if region % (ep * etp):
            raise DimsError(
                f"the expert region has dp_shard*cp*tp = {dp_shard}*{cp}*{tp} = {region} "
                f"ranks, which ep*etp = {ep}*{etp} = {ep * etp} does not divide; choose "
                f"--ep and --etp whose product divides {region}"
            )
        return cls(world, pp, dp_replicate, dp_shard, cp, tp, ep, etp)

    @property
    def batch(self) -> int:
        """Data-loading degree: ``dp_replicate * dp_shard``."""
        return self.dp_replicate * self.dp_shard

    @property
    def loss(self) -> int:
        """Loss all-reduce degree: ``batch * cp``."""
        return self.batch * self.cp

    @property
    def fsdp(self) -> int:
        """Dense FSDP degree: ``dp_shard * cp``."""
        return self.dp_shard * self.cp

    @property
    def efsdp(self) -> int:
        """Expert FSDP degree: ``dp_shard * cp * tp / (ep * etp)``."""
        return self.dp_shard * self.cp * self.tp // (self.ep * self.etp)

    def views(self) -> dict[str, dict[str, int]]:
        """Each view's axes and sizes, as torchtitan unflattens the world into them."""
        return {
            "world": {"world": self.world},
            "dense": {
                "pp": self.pp,
                "dp_replicate": self.dp_replicate,
                "dp_shard": self.dp_shard,
                "cp": self.cp,
                "tp": self.tp,
            },
            "dataloading": {"pp": self.pp, "batch": self.batch, "cp": self.cp, "tp": self.tp},
            "loss": {"loss": self.loss},
            "dense_fsdp": {
                "pp": self.pp,
                "dp_replicate": self.dp_replicate,
                "fsdp": self.fsdp,
                "tp": self.tp,
            },
            "fwdbwd": {"pp": self.pp, "dp": self.batch, "cp": self.cp, "tp": self.tp},
            "sparse": {
                "pp": self.pp,
                "dp_replicate": self.dp_replicate,
                "efsdp": self.efsdp,
                "ep": self.ep,
                "etp": self.etp,
            },
        }


def build_meshes(dims: ParallelDims) -> dict[str, fmesh.Mesh]:
    """Every view torchtitan builds, derived from one ``dense`` mesh (pure).

    >>> m = build_meshes(ParallelDims.resolve(8, tp=2, ep=2, etp=2))
    >>> m["sparse"]
    Mesh(pp=1, dp_replicate=1, efsdp=2, ep=2, etp=2)
    >>> fmesh.group(m["sparse"], "etp", 5) == fmesh.group(m["dense"], "tp", 5)
    True
    """
    world = fmesh.make_mesh({"world": dims.world})
    dense = fmesh.unflatten(world, "world", dims.views()["dense"])
    dataloading = fmesh.flatten(dense, ("dp_replicate", "dp_shard"), "batch")
    loss = fmesh.flatten(fmesh.slice(dataloading, "batch", "cp"), ("batch", "cp"), "loss")
    dense_fsdp = fmesh.flatten(dense, ("dp_shard", "cp"), "fsdp")
    fwdbwd = fmesh.rename(dataloading, {"batch": "dp"})
    region = fmesh.flatten(dense, ("dp_shard", "cp", "tp"), "expert_region")
    sparse = fmesh.unflatten(
        region, "expert_region", {"efsdp": dims.efsdp, "ep": dims.ep, "etp": dims.etp}
    )
    return {
        "world": world,
        "dense": dense,
        "dataloading": dataloading,
        "loss": loss,
        "dense_fsdp": dense_fsdp,
        "fwdbwd": fwdbwd,
        "sparse": sparse,
    }


def torchtitan_groups_per_rank(dims: ParallelDims) -> int:
    """Process groups torch's DeviceMesh creates on each rank (CPU, gloo/fake) for
    these views, made as torchtitan makes its own (one ``_unflatten`` of the world per
    view, ``_flatten`` for the loss mesh; the views differ from torchtitan's as the
    module's docstring says).

    One per dimension of every ``_unflatten`` of the world and of the ``_flatten``,
    even where two dimensions have the same ranks; a dimension spanning the whole
    world reuses the default group.
    """
    recipe = [sizes for name, sizes in dims.views().items() if name != "world"]
    return sum(1 for sizes in recipe for s in sizes.values() if s != dims.world)


# -- torchtitan's own calls (for fmesh plan) ----------------------------------------------

TITAN_COMMIT = "b5bcd76c6"
"""The torchtitan commit :func:`torchtitan_build_mesh` follows (the one the suite in
``tests/run_torchtitan_suite.py`` runs)."""

TITAN_DEGREES: Mapping[str, int] = {"pp": 8, "dp_replicate": 4, "cp": 2, "tp": 8, "ep": 16}
"""The degrees :func:`torchtitan` plans; ``dp_shard`` takes the rest of the world
(256 at 2**17 ranks, 2048 at 2**20; the world must be a multiple of 512)."""


def torchtitan_build_mesh(
    dims: ParallelDims, device_type: str = "cuda", spmd_backend: str = "spmd_types"
) -> dict[str, DeviceMesh]:
    """torchtitan's ``ParallelDims.build_mesh`` at commit ``b5bcd76c6``
    (``torchtitan/distributed/parallel_dims.py``), call for call, on torch's own API.

    The same calls in the same order with the same arguments: a 1-d world mesh from
    torch's ``init_device_mesh``; ``_unflatten`` into the data-loading mesh; its
    ``batch`` and ``cp`` flattened into ``loss_mesh``; with ``spmd_backend``
    ``"spmd_types"`` (torchtitan's default) the dense storage mesh (``dp_shard``) and
    the forward/backward mesh (``dp``), else ``"partial_dtensor"``'s dense mesh
    (``fsdp``); the sparse mesh (``efsdp``, ``ep``); ``"fake"`` for the dims
    torchtitan's ``_mesh_exist`` turns off. Returns every mesh torchtitan keeps, by
    the name it keeps it under: the world mesh, its ``_global_meshes`` and its
    ``_single_axis_meshes`` (``loss`` is in both, one mesh): 17 entries, 16 names,
    with ``ep > 1`` and ``spmd_types``. Nothing here knows of fmesh: under torchrun it
    runs on torch; under ``fmesh plan`` torch is routed through fmesh.

    Where this is not torchtitan: the degrees come from :class:`ParallelDims`, which
    validates them as torchtitan does but also has ``etp`` (an expert tensor-parallel
    degree torchtitan dropped in c4b409af2): it must be 1 here; and ``device_type`` is
    an argument (torchtitan reads it from ``torchtitan.tools.utils``).
    """
    from torch.distributed.device_mesh import init_device_mesh

    if dims.etp != 1:
        raise DimsError(
            f"etp is {dims.etp}; torchtitan's build_mesh (at {TITAN_COMMIT}) has no "
            "expert tensor parallelism: use etp=1"
        )
    if spmd_backend not in ("spmd_types", "partial_dtensor"):
        raise DimsError(
            f"spmd_backend is {spmd_backend!r}; expected 'spmd_types' or 'partial_dtensor'"
        )
    spmd = spmd_backend == "spmd_types"
    d = dims

    def exists(name: str, degree: int) -> bool:  # torchtitan's _mesh_exist
        if name == "fsdp" or (name == "dp_shard" and spmd):
            return True
        if name == "efsdp":
            return d.ep > 1
        return degree > 1

    def unflatten(
        world: DeviceMesh, names: tuple[str, ...], degrees: tuple[int, ...]
    ) -> DeviceMesh:
        # torch types the values with its options class; names are all this passes.
        override: dict[str, Any] = {
            n: "fake" for n, s in zip(names, degrees, strict=True) if not exists(n, s)
        }
        return world._unflatten(0, degrees, names, backend_override=override)

    batch = d.dp_replicate * d.dp_shard
    fsdp = d.dp_shard * d.cp
    efsdp = fsdp * d.tp // d.ep
    world = init_device_mesh(device_type, (d.world,), mesh_dim_names=("world",))
    loading = unflatten(world, ("pp", "batch", "cp", "tp"), (d.pp, batch, d.cp, d.tp))
    loss = loading["batch", "cp"]._flatten("loss_mesh")
    spmd_dense = None
    if spmd:
        dense = unflatten(
            world,
            ("pp", "dp_replicate", "dp_shard", "cp", "tp"),
            (d.pp, d.dp_replicate, d.dp_shard, d.cp, d.tp),
        )
        fwdbwd = unflatten(world, ("pp", "dp", "cp", "tp"), (d.pp, batch, d.cp, d.tp))
        spmd_dense = fwdbwd["dp", "cp", "tp"]
    else:
        dense = unflatten(
            world, ("pp", "dp_replicate", "fsdp", "tp"), (d.pp, d.dp_replicate, fsdp, d.tp)
        )
    sparse = unflatten(
        world, ("pp", "dp_replicate", "efsdp", "ep"), (d.pp, d.dp_replicate, efsdp, d.ep)
    )
    meshes: dict[str, DeviceMesh] = {
        "world": world,
        "dataloading": loading,
        "loss": loss,
        "dense": dense,
        "sparse": sparse,
    }
    if spmd_dense is not None:
        meshes["spmd_dense_for_fwdbwd"] = spmd_dense
    if spmd and d.ep > 1:
        meshes["spmd_sparse_for_fwdbwd"] = sparse["dp_replicate", "efsdp", "ep"]
    meshes |= {
        "pp": loading["pp"],
        "batch": loading["batch"],
        "dp_replicate": dense["dp_replicate"],
        "cp": loading["cp"],
        "tp": loading["tp"],
        "ep": sparse["ep"],
        "efsdp": sparse["efsdp"],
    }
    if spmd_dense is not None:
        meshes["dp"] = spmd_dense["dp"]
        meshes["dp_shard"] = dense["dp_shard"]
    else:
        meshes["fsdp"] = dense["fsdp"]
    return meshes


def torchtitan() -> dict[str, DeviceMesh]:
    """What ``fmesh plan examples/parallel_dims.py:torchtitan`` runs on every rank:
    the degrees of :data:`TITAN_DEGREES` over the world torchrun (or the plan) sets."""
    world = int(os.environ["WORLD_SIZE"])
    return torchtitan_build_mesh(ParallelDims.resolve(world, **TITAN_DEGREES))


def torchtitan_buggy() -> dict[str, DeviceMesh]:
    """:func:`torchtitan` with a planted rank-dependent bug: the ranks of the last host
    read a stale config with ``tp=4``. Their meshes differ from everyone else's, so a
    launch hangs in torch's group creation (fmesh: ``MeshMismatchError``); ``fmesh
    plan --rank sample:K`` plans the last rank and names the divergence."""
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    degrees = dict(TITAN_DEGREES)
    if rank >= world - int(os.environ.get("LOCAL_WORLD_SIZE", "8")):
        degrees["tp"] = 4  # the stale config on the last host
    return torchtitan_build_mesh(ParallelDims.resolve(world, **degrees))


# -- formatting --------------------------------------------------------------------------


def format_ranks(ranks: Sequence[int]) -> str:
    """``[0, 1, 2]``, or ``[0, 8, 16, 24, ..., 120]`` for a group over 8 ranks."""
    if len(ranks) <= _FULL:
        return "[" + ", ".join(map(str, ranks)) + "]"
    return "[" + ", ".join(map(str, ranks[:_HEAD])) + f", ..., {ranks[-1]}]"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    ]


def _sizes(mesh: fmesh.Mesh) -> str:
    return " ".join(f"{n}={s}" for n, s in mesh.shape.items())


def _dims_line(dims: ParallelDims) -> str:
    fields = ", ".join(f"{a.name}={getattr(dims, a.name)}" for a in attrs.fields(ParallelDims))
    return (
        f"ParallelDims({fields}): batch={dims.batch} loss={dims.loss} "
        f"fsdp={dims.fsdp} efsdp={dims.efsdp}"
    )


# -- realize -----------------------------------------------------------------------------


def _realize_all(meshes: Mapping[str, fmesh.Mesh]) -> dict[str, fmesh.RealizedMesh]:
    return {name: fmesh.realize(mesh) for name, mesh in meshes.items()}


def _origins(
    realized: Mapping[str, fmesh.RealizedMesh],
) -> dict[tuple[str, str], str]:
    """For each (view, axis): "created", "size 1", "default group", or the first
    view.axis that got the same process group object (fmesh's memo hands it back)."""
    import torch.distributed as dist

    default = dist.group.WORLD
    first: dict[int, str] = {}
    out: dict[tuple[str, str], str] = {}
    for view, r in realized.items():
        for axis, pg in r.groups.items():
            if pg is default:
                out[view, axis] = "default group (whole world)"
            elif id(pg) in first:
                out[view, axis] = f"reused: same as {first[id(pg)]}"
            else:
                first[id(pg)] = f"{view}.{axis}"
                size1 = " (size 1: no communicator)" if pg.size() == 1 else ""
                out[view, axis] = f"created{size1}"
    return out


def plan(dims: ParallelDims, rank: int) -> str:
    """The ``--plan`` report: realize every view for ``rank`` on the fake backend.

    Initializes a fake world of ``dims.world`` ranks in this process and tears it
    (and fmesh's groups) down before returning.
    """
    import torch.distributed as dist

    if not 0 <= rank < dims.world:
        raise DimsError(
            f"--rank {rank} is not in the world of {dims.world} ranks; expected "
            f"0..{dims.world - 1}"
        )
    if dist.is_initialized():
        raise DimsError("--plan needs a process with no default process group yet")
    meshes = build_meshes(dims)
    fmesh.init_fake_world(dims.world, rank)
    try:
        before = fmesh.cache_stats()
        realized = _realize_all(meshes)
        after = fmesh.cache_stats()
        origins = _origins(realized)
        out = [
            _dims_line(dims),
            f"dry run of fmesh.realize for rank {rank} of {dims.world} on torch's fake "
            "backend",
            "",
        ]
        out += _table(
            ["view", "axes", "derived as", "created"],
            [
                [name, _sizes(m), DERIVATIONS[name], str(realized[name].created)]
                for name, m in meshes.items()
            ],
            right={3},
        )
        out.append("")
        rows = []
        for name, r in realized.items():
            for axis in r.mesh.axis_names:
                pg = r.group(axis)
                rows.append(
                    [
                        name,
                        axis,
                        str(pg.size()),
                        str(pg.rank()),
                        origins[name, axis],
                        format_ranks(dist.get_process_group_ranks(pg)),
                    ]
                )
        out += _table(
            ["view", "axis", "size", "group rank", "process group", f"group of rank {rank}"],
            rows,
            right={2, 3},
        )
        created = after.created - before.created
        reused = after.reused - before.reused
        summed = sum(r.created for r in realized.values())
        torch_count = torchtitan_groups_per_rank(dims)
        out += [
            "",
            f"fmesh: {created} process groups created, {reused} reused "
            f"(fmesh.cache_stats(); sum of RealizedMesh.created: {summed})",
            f"torch's DeviceMesh recipe (torchtitan): {torch_count} process groups on "
            "this rank, one per dimension of each _unflatten/_flatten",
        ]
        return "\n".join(out) + "\n"
    finally:
        fmesh.destroy()
        dist.destroy_process_group()


def _members(pg: ProcessGroup, rank: int, world: int) -> tuple[int, ...]:
    """Who is in ``pg``, by all-reducing ``2**rank`` (a one-hot vector past 62 ranks)."""
    import torch
    import torch.distributed as dist

    on_cuda = "nccl" in str(dist.get_backend(pg)) and torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if on_cuda else None
    if world <= 62:
        t = torch.tensor([1 << rank], dtype=torch.int64, device=device)
        dist.all_reduce(t, group=pg)
        mask = int(t.item())
        return tuple(r for r in range(world) if mask >> r & 1)
    onehot = torch.zeros(world, dtype=torch.int32, device=device)
    onehot[rank] = 1
    dist.all_reduce(onehot, group=pg)
    return tuple(int(r) for r in onehot.nonzero().flatten().tolist())


def run(dims: ParallelDims) -> tuple[str, list[str]]:
    """Realize every view for real (under torchrun) and check each group.

    Each group is checked with an all-reduce (who really is in it) against
    ``fmesh.group``, and its group rank against the rank's coordinate.

    Returns:
        This rank's one-line summary and the list of mismatches (empty when all agree).
    """
    import torch.distributed as dist

    meshes = build_meshes(dims)
    before = fmesh.cache_stats()
    realized = _realize_all(meshes)
    after = fmesh.cache_stats()
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != dims.world:
        raise DimsError(f"the world has {world} ranks but the degrees are for {dims.world}")
    problems: list[str] = []
    checked = 0
    for name, r in realized.items():
        assert r.coordinate is not None  # every view covers the whole world
        for axis in r.mesh.axis_names:
            pg = r.group(axis)
            expected = fmesh.group(r.mesh, axis, rank)
            got = _members(pg, rank, world)
            ranks = tuple(dist.get_process_group_ranks(pg))
            coord = r.local_rank(axis)
            checked += 1
            if got != tuple(sorted(expected)) or ranks != expected or pg.rank() != coord:
                problems.append(
                    f"rank {rank} {name}.{axis}: all_reduce saw {list(got)}, group ranks "
                    f"{list(ranks)}, group rank {pg.rank()}; fmesh.group says "
                    f"{list(expected)} and the coordinate is {coord}"
                )
    verdict = "all match fmesh.group" if not problems else f"{len(problems)} MISMATCHED"
    summary = (
        f"rank {rank}: {len(realized)} views, {checked} axis groups checked by all_reduce: "
        f"{verdict}; fmesh created {after.created - before.created} groups and reused "
        f"{after.reused - before.reused}, where torch's DeviceMesh recipe creates "
        f"{torchtitan_groups_per_rank(dims)}"
    )
    return summary, problems


# -- command line ------------------------------------------------------------------------


def _count(text: str) -> int:
    """An int written as ``8``, ``-1`` or ``2**17``."""
    m = re.fullmatch(r"\s*(-?\d+)\s*(?:\*\*\s*(\d+)\s*)?", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (e.g. 8 or 2**17)")
    return int(m.group(1)) ** int(m.group(2)) if m.group(2) else int(m.group(1))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="parallel_dims.py",
        description="torchtitan's ParallelDims meshes as compositions of one fmesh value.",
    )
    p.add_argument("--world", type=_count, help="world size (default: $WORLD_SIZE)")
    for name, default in [
        ("pp", 1),
        ("dp-replicate", 1),
        ("dp-shard", -1),
        ("cp", 1),
        ("tp", 1),
        ("ep", 1),
        ("etp", 1),
    ]:
        p.add_argument(f"--{name}", type=_count, default=default, metavar="N")
    p.add_argument(
        "--plan", action="store_true", help="dry run for --rank on the fake backend"
    )
    p.add_argument("--rank", type=_count, default=None, help="the rank --plan plays")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the example; returns the exit status (2 for bad degrees or flags)."""
    args = _parser().parse_args(argv)
    try:
        world = args.world
        if world is None:
            if "WORLD_SIZE" not in os.environ:
                raise DimsError(
                    "no --world and no $WORLD_SIZE: pass --plan --world N for a dry run, "
                    f"or launch with torchrun --nproc-per-node N {sys.argv[0]}"
                )
            world = int(os.environ["WORLD_SIZE"])
        dims = ParallelDims.resolve(
            world,
            pp=args.pp,
            dp_replicate=args.dp_replicate,
            dp_shard=args.dp_shard,
            cp=args.cp,
            tp=args.tp,
            ep=args.ep,
            etp=args.etp,
        )
        if args.plan:
            sys.stdout.write(plan(dims, 0 if args.rank is None else args.rank))
            return 0
        if args.rank is not None:
            raise DimsError("--rank is for --plan; under torchrun each process is its rank")
        launched = os.environ.get("WORLD_SIZE")
        if launched is not None and int(launched) != world:
            raise DimsError(
                f"--world {world} but torchrun started {launched} processes; drop --world "
                f"or launch --nproc-per-node {world}"
            )
    except DimsError as err:
        print(f"parallel_dims.py: error: {err}", file=sys.stderr)
        return 2
    import torch.distributed as dist

    summary, problems = run(dims)
    if dist.get_rank() == 0:
        print(_dims_line(dims))
        rows = [[n, _sizes(m), DERIVATIONS[n]] for n, m in build_meshes(dims).items()]
        print(
            "\n".join(
                "  " + line for line in _table(["view", "axes", "derived as"], rows, set())
            )
        )
    dist.barrier()
    print(summary, flush=True)
    for line in problems:
        print(line, file=sys.stderr, flush=True)
    fmesh.destroy()
    dist.destroy_process_group()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
