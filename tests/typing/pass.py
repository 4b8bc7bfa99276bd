# mypy: disallow-any-expr
"""Uses of fmesh's public API that must type-check under ``mypy --strict``.

``assert_type`` pins each public result's exact type, and ``disallow-any-expr`` makes
any ``Any`` flowing out of the public API an error here. Checked by
tests/test_typing.py; the functions are never called.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import assert_type

import numpy as np
import numpy.typing as npt

import fmesh


def meshes() -> list[fmesh.Mesh]:
    a = fmesh.make_mesh({"dp": 2, "tp": 4})
    b = fmesh.make_mesh((2, 4), ("dp", "tp"), ranks=[7, 6, 5, 4, 3, 2, 1, 0])
    c = fmesh.make_mesh([2], ["x"], ranks=np.arange(2, 4))
    d = fmesh.Mesh.from_ranks(np.arange(8).reshape(2, 4), ("dp", "tp"))
    for mesh in (a, b, c, d):
        assert_type(mesh, fmesh.Mesh)
    return [a, b, c, d]


def queries(m: fmesh.Mesh) -> int:
    coord = fmesh.coordinate(m, 0)
    assert_type(coord, tuple[int, ...] | None)
    x: tuple[int, ...] | None = fmesh.coordinate(m, 0)
    members = fmesh.group(m, "dp", 0)
    assert_type(members, tuple[int, ...])
    assert_type(fmesh.instance(m, 0), npt.NDArray[np.int64])
    assert_type(fmesh.instances(m), npt.NDArray[np.int64])
    s: int = m.size
    assert_type(m.size, int)
    assert_type(m.ndim, int)
    assert_type(m.axis_names, tuple[str, ...])
    assert_type(m.axis_sizes, tuple[int, ...])
    assert_type(m.shape, Mapping[str, int])
    assert_type(m.index_size, int)
    assert_type(m.num_instances, int)
    assert_type(m.rank_map, tuple[int, ...] | None)
    assert_type(m.axes, tuple[fmesh.Layout, ...])
    assert_type(m.axis_index("dp"), int)
    first = coord[0] if coord is not None else 0
    return first + s + len(members) + (0 if x is None else 1)


def transformations(m: fmesh.Mesh) -> fmesh.Mesh:
    sliced = fmesh.slice(m, "tp", "dp")
    flat = fmesh.flatten(sliced, ("tp", "dp"))
    named = fmesh.flatten(m, ["dp", "tp"], name="world")
    split = fmesh.unflatten(named, "world", {"a": 2, "b": 4})
    renamed = fmesh.rename(split, {"a": "data"})
    for mesh in (sliced, flat, named, split, renamed):
        assert_type(mesh, fmesh.Mesh)
    return renamed


def elastic(m: fmesh.Mesh) -> fmesh.Mesh:
    lost: frozenset[int] = frozenset({3})
    shrunk = fmesh.shrink(m, lost, axis="dp")
    assert_type(shrunk, fmesh.Mesh)
    assert_type(fmesh.shrink(m, [3, 5], axis="dp"), fmesh.Mesh)
    replaced = fmesh.replace(shrunk, {5: 9})
    assert_type(replaced, fmesh.Mesh)
    return replaced


def layouts() -> int:
    layout = fmesh.Layout.of((2, 3), (6, 1))
    assert_type(layout, fmesh.Layout)
    assert_type(layout.values(), list[int])
    parts = layout.split((2, 3))
    assert_type(parts, tuple[fmesh.Layout, ...])
    assert_type(layout.compose(2, 3), fmesh.Layout)
    assert_type(layout.complement(24), fmesh.Layout)
    assert_type(fmesh.Layout.concat(parts), fmesh.Layout)
    assert_type(layout.modes, tuple[tuple[int, int], ...])
    assert_type(layout.shape, tuple[int, ...])
    assert_type(layout(3), int)
    return layout.size + layout.cosize


def errors(m: fmesh.Mesh) -> str:
    try:
        fmesh.group(m, "pp", 0)
    except fmesh.AxisNotFoundError as err:
        assert_type(err, fmesh.AxisNotFoundError)
        return str(err)
    except fmesh.MeshError as err:
        return str(err)
    return ""


def realized(m: fmesh.Mesh) -> int:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

    r = fmesh.realize(m, backend={"tp": "gloo"}, timeout=None)
    assert_type(r, fmesh.RealizedMesh)
    assert_type(r.mesh, fmesh.Mesh)
    assert_type(r.rank, int)
    assert_type(r.coordinate, tuple[int, ...] | None)
    assert_type(r.group("dp"), ProcessGroup)
    assert_type(r.groups, Mapping[str, ProcessGroup])
    assert_type(r.local_rank("dp"), int)
    assert_type(r.to_device_mesh("cpu"), DeviceMesh)
    assert_type(fmesh.from_device_mesh(r.to_device_mesh()), fmesh.Mesh)
    stats = fmesh.cache_stats()
    assert_type(stats, fmesh.CacheStats)
    assert_type(stats.created, int)
    fmesh.destroy()
    return stats.reused + r.rank


def partition_specs(r: fmesh.RealizedMesh) -> fmesh.PartitionSpec:
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Placement

    spec = fmesh.P("dp", ("tp", "cp"), None)
    assert_type(spec, fmesh.PartitionSpec)
    assert_type(fmesh.PartitionSpec(["dp"]), fmesh.PartitionSpec)
    assert_type(spec.axis_names, tuple[str, ...])
    entry: str | tuple[str, ...] | None = spec[1]
    assert_type(fmesh.placements(r.mesh, spec, 3), tuple[Placement, ...])
    assert_type(fmesh.placements(r, spec, 3), tuple[Placement, ...])
    dt = fmesh.distribute(torch.zeros(4, 8, 2), r, spec, src_data_rank=None)
    assert_type(dt, DTensor)
    back = fmesh.spec_of(dt, r.mesh)
    assert_type(back, fmesh.PartitionSpec)
    return back if entry is not None else spec


def realize_with_options(mesh: fmesh.Mesh, options: fmesh.BackendOptions) -> int:
    realized = fmesh.realize(mesh, backend={"tp": "gloo"}, options={"dp": options})
    return realized.created


def dry_run(world_size: int, rank: int) -> None:
    assert_type(fmesh.init_fake_world(world_size, rank), None)


def drop_in(options: fmesh.BackendOptions) -> int:
    from torch.distributed.device_mesh import DeviceMesh

    from fmesh.device_mesh import DeviceMeshError, init_device_mesh

    dm = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    assert_type(dm, DeviceMesh)
    unnamed = init_device_mesh("cuda", (8,))
    overrides = init_device_mesh(
        "cpu", [2, 2], mesh_dim_names=["dp", "tp"], backend_override={0: "gloo", "tp": options}
    )
    pair = init_device_mesh("cpu", (2, 2), backend_override={1: ("gloo", options)})
    error: RuntimeError = DeviceMeshError("x")
    mesh_error: fmesh.MeshError = DeviceMeshError("x")
    return len([dm, unnamed, overrides, pair, error, mesh_error])
