"""A planned rank's meshes as the report shows them: each mesh it realized once, in
order, named by what the planned function returned, with the rank's groups along each
axis (members computed on demand from the mesh values).

A returned torch DeviceMesh whose groups fmesh did not make (torch built it itself)
is listed with its shape and coordinate only; its groups are among the rank's calls.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._core.mesh import Mesh
from .._core.queries import coordinate
from .._runtime.realized_mesh import RealizedMesh
from .events import Recorder
from .report import GroupPlan, MeshPlan

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["meshes"]

Where = Mapping[int, tuple[Mesh, str]]
"""id(group) -> the first (mesh, axis) realized with it."""


def meshes(recorder: Recorder, result: object) -> tuple[list[MeshPlan], int, int]:
    """The rank's meshes (each realized mesh once, in order, named by what the function
    returned), and how many distinct groups they hold, communicators among them."""
    rank = recorder.rank
    where: dict[int, tuple[Mesh, str]] = {}
    sizes: dict[int, int] = {}
    plans: list[MeshPlan] = []
    seen: set[Mesh] = set()
    for mesh, groups in recorder.realized:
        if mesh in seen:
            continue
        seen.add(mesh)
        fresh = 0
        for axis, pg in groups.items():
            if id(pg) not in where:
                where[id(pg)] = (mesh, axis)
                sizes[id(pg)] = mesh.shape[axis]
                fresh += 1
        coord = coordinate(mesh, rank)
        plans.append(
            MeshPlan(
                name=",".join(mesh.axis_names),
                axis_names=mesh.axis_names,
                sizes=mesh.axis_sizes,
                coordinate=coord,
                groups=_groups(mesh.axis_names, coord, groups, where, rank),
                new_groups=fresh,
            )
        )
    held = len(where)
    comms = sum(1 for s in sizes.values() if s > 1)
    if isinstance(result, Mapping):
        for name, value in result.items():
            _name(plans, str(name), _returned(value, recorder, where))
    return plans, held, comms


def _groups(
    names: Sequence[str],
    coord: tuple[int, ...] | None,
    groups: Mapping[str, ProcessGroup],
    where: Where,
    rank: int,
) -> tuple[GroupPlan, ...]:
    if coord is None:
        return ()
    out = []
    for name, c in zip(names, coord, strict=True):
        source, axis = where[id(groups[name])]
        out.append(GroupPlan(name, source.shape[axis], c, source, axis, rank))
    return tuple(out)


Returned = tuple[
    tuple[str, ...], tuple[int, ...], "tuple[int, ...] | None", tuple[GroupPlan, ...], bool
]
"""A returned mesh's names, sizes, coordinate, groups and whether fmesh did not make
its groups."""


def _name(plans: list[MeshPlan], name: str, entry: Returned | None) -> None:
    """Name the plan of a returned mesh (or add one, for a slice nobody realized)."""
    if entry is None:
        return
    names, sizes, coord, groups, outside = entry
    for i, p in enumerate(plans):
        same = p.axis_names == names and p.sizes == sizes and p.groups == groups
        if same and p.coordinate == coord and not outside:
            label = name if p.name == ",".join(p.axis_names) else f"{p.name}, {name}"
            plans[i] = MeshPlan(
                label, names, sizes, coord, groups, p.new_groups, returned=True
            )
            return
    plans.append(MeshPlan(name, names, sizes, coord, groups, 0, True, outside))


def _returned(value: object, recorder: Recorder, where: Where) -> Returned | None:
    """A returned mesh's names, sizes, coordinate and groups (``None``: not a mesh, or
    one whose groups the plan did not see being realized)."""
    rank = recorder.rank
    if isinstance(value, RealizedMesh):
        mesh, groups = value.mesh, dict(value.groups)
    elif isinstance(value, Mesh):
        mesh = value
        found = [g for m, g in recorder.realized if m == mesh]
        if not found:
            return None
        groups = found[0]
    else:
        return _device_mesh(value, where, rank)
    coord = coordinate(mesh, rank)
    if coord is not None and any(id(groups.get(n)) not in where for n in mesh.axis_names):
        return None
    return (
        mesh.axis_names,
        mesh.axis_sizes,
        coord,
        _groups(mesh.axis_names, coord, groups, where, rank),
        False,
    )


def _device_mesh(value: object, where: Where, rank: int) -> Returned | None:
    module = sys.modules.get("torch.distributed.device_mesh")
    if module is None or not isinstance(value, module.DeviceMesh):
        return None
    dm: Any = value
    ndim = int(dm.ndim)
    names = tuple(dm.mesh_dim_names or (f"dim{i}" for i in range(ndim)))
    sizes = tuple(int(dm.size(i)) for i in range(ndim))
    coord = dm.get_coordinate()
    if coord is None:
        return names, sizes, None, (), False
    coord = tuple(int(c) for c in coord)
    out = []
    for i, (name, c) in enumerate(zip(names, coord, strict=True)):
        pg = dm.get_group(i)
        if id(pg) not in where:
            return names, sizes, coord, (), True  # torch made its groups itself
        source, axis = where[id(pg)]
        out.append(GroupPlan(name, sizes[i], c, source, axis, rank))
    return names, sizes, coord, tuple(out), False
