"""fmesh meshes as torch ``DeviceMesh`` objects, and back.

A DeviceMesh torch builds itself is a view over one *root* mesh that spans the whole
world: slices, ``_flatten``, ``_unflatten`` and ``_concatenate`` all index the root's
rank map, and ``_flatten`` stores what it makes on the root. So the DeviceMesh fmesh
hands over has such a root too:

* a mesh with one instance (it covers its whole rank space) is its own root;
* a mesh with several instances (a slice) hangs off a root that has its axes plus the
  rest of the rank space: a DeviceMesh already converted from an fmesh mesh that has
  all of its axes, or else one made up of its axes and one dimension per remaining
  mode (named ``_rest0``, ``_rest1``, ... and ordered by stride, so the root of a slice
  of a row-major mesh has the row-major root's layout).

Every dimension's group is fmesh's memoized group. Axes fmesh realized over the same
rank space (say the flattened ``dp_cp``) are registered in each root's flatten
mapping, where torch's ``_flatten`` looks before it creates groups -- in rank spaces
that cover the whole world (over part of it, the ranks outside a mesh do not know its
axes, so they could not skip the creations members skip). Building a
DeviceMesh costs O(world) once (torch keeps an O(world) rank map); it is memoized per
mesh and device type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._errors import MeshError
from ._launch import check_device_type
from ._layout import Layout, complement_modes
from ._memo import WorldKey, state, world_key
from ._mesh import Mesh

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ._realized import RealizedMesh

__all__ = ["from_device_mesh", "sync_flattens", "to_device_mesh"]


def _default_device_type() -> str:
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available() and "nccl" in str(dist.get_backend()):
        return "cuda"
    return "cpu"


def _rank_map_tensor(mesh: Mesh) -> Any:
    import torch

    if mesh.rank_map is None:
        return torch.arange(mesh.index_size, dtype=torch.int)
    return torch.tensor(mesh.rank_map, dtype=torch.int)


def _root_axes(mesh: Mesh) -> tuple[tuple[str, ...], list[tuple[tuple[int, int], ...]]]:
    """Names and layouts of a made-up root: the mesh's axes plus the rest, by stride."""
    modes = [m for layout in mesh.axes for m in layout.modes]
    dims: list[tuple[int, str, tuple[tuple[int, int], ...]]] = [
        (max((d for _, d in layout.modes), default=0), name, layout.modes)
        for name, layout in zip(mesh.axis_names, mesh.axes)
    ]
    rest = complement_modes(modes, mesh.index_size)
    dims += [(d, f"_rest{i}", ((s, d),)) for i, (s, d) in enumerate(rest)]
    dims.sort(key=lambda dim: -dim[0])
    return tuple(name for _, name, _ in dims), [m for _, _, m in dims]


def _groups(realized: RealizedMesh) -> list[tuple[str, Any]] | None:
    if realized.coordinate is None:
        return None
    return [
        (pg.group_name, pg) for pg in (realized.groups[n] for n in realized.mesh.axis_names)
    ]


def to_device_mesh(realized: RealizedMesh, device_type: str | None) -> DeviceMesh:
    """See :meth:`RealizedMesh.to_device_mesh`."""
    from ._c10d import make_device_mesh

    mesh = realized.mesh
    device_type = check_device_type(
        device_type if device_type is not None else _default_device_type(),
        "RealizedMesh.to_device_mesh",
    )
    key = (mesh, device_type)
    with state.lock:
        found: DeviceMesh | None = state.device_meshes.get(key)
    if found is not None:
        # Axes realized since the last conversion join the flatten mappings.
        sync_flattens(world_key(mesh))
        return found
    wk = world_key(mesh)
    roots_key = (wk, device_type)
    rank_map = _rank_map_tensor(mesh)
    groups = _groups(realized)
    with state.lock:
        roots: list[tuple[Mesh, DeviceMesh]] = state.roots.setdefault(roots_key, [])
        own = {(n, a) for n, a in zip(mesh.axis_names, mesh.axes)}
        root = next((dm for m, dm in roots if own <= set(zip(m.axis_names, m.axes))), None)
        if root is not None:
            rank_map = root._rank_map
    if mesh.num_instances == 1 and root is None:
        dm = make_device_mesh(
            device_type, [a.modes for a in mesh.axes], rank_map, mesh.axis_names, groups, None
        )
        root_mesh, root = mesh, dm
    else:
        if root is None:
            names, axes = _root_axes(mesh)
            root = make_device_mesh(device_type, axes, rank_map, names, None, None)
            root_mesh = Mesh(
                names, tuple(Layout._from_modes(m) for m in axes), mesh.index_size
            )
        else:
            root_mesh = mesh  # only used when the root is new; this one is known
        dm = make_device_mesh(
            device_type, [a.modes for a in mesh.axes], rank_map, mesh.axis_names, groups, root
        )
    with state.lock:
        if all(r is not root for _, r in roots):
            roots.append((root_mesh, root))
        state.device_meshes[key] = dm
    sync_flattens(wk)
    return dm


def sync_flattens(wk: WorldKey) -> None:
    """Register every axis realized over rank space ``wk`` in each root's flatten
    mapping, so torch's ``_flatten`` of the same layout reuses fmesh's group."""
    import torch.distributed as dist

    from ._c10d import add_flatten

    if wk[0] != dist.get_world_size():
        # Over part of the world, ranks outside a mesh hold no entry for its axes, so
        # they would create groups that members skip: torch's group count, hence the
        # names of every later group, would diverge. Let torch create them.
        return
    with state.lock:
        names = dict(state.named_axes.get(wk, {}))
        roots = [dm for (w, _), pairs in state.roots.items() if w == wk for _, dm in pairs]
    for root in roots:
        for name, entry in names.items():
            if entry is not None and entry[0].size > 1:
                layout, pg = entry
                add_flatten(root, name, layout.modes, (pg.group_name, pg))


def from_device_mesh(device_mesh: DeviceMesh) -> Mesh:
    """The fmesh value of a torch ``DeviceMesh`` (its layout, ranks and names).

    Works for every DeviceMesh torch makes: roots, slices, flattens, unflattens and
    meshes built from groups. Unnamed dimensions are called ``dim0``, ``dim1``, ...

    Raises:
        TypeError: for anything but a DeviceMesh.
    """
    from torch.distributed.device_mesh import DeviceMesh

    from ._c10d import device_mesh_axes, device_mesh_rank_map

    if not isinstance(device_mesh, DeviceMesh):
        raise TypeError(
            f"from_device_mesh() needs a torch DeviceMesh, got {type(device_mesh).__name__}"
        )
    names = device_mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(device_mesh.ndim))
    axes = tuple(Layout._from_modes(m) for m in device_mesh_axes(device_mesh))
    flat = device_mesh_rank_map(device_mesh)
    try:
        return Mesh(tuple(names), axes, len(flat), flat)
    except MeshError:
        # A rank map longer than the layout's span (torch allows it): keep what the
        # layout reaches, as its own rank space.
        return Mesh.from_ranks(device_mesh.mesh.cpu().numpy(), tuple(names))
