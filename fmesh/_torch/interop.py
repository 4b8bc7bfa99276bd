"""fmesh meshes as torch ``DeviceMesh`` objects, and back.

A DeviceMesh fmesh hands over hangs off a root spanning the whole world, as torch's
own do, with fmesh's memoized groups; how roots, slices and flattens are built:
``docs/design/device-mesh-internals.md``.
"""

from __future__ import annotations

import datetime
import itertools
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, final

import attrs

from .._compat.mesh import (
    add_flatten,
    make_device_mesh,
)
from .._core.errors import MeshError
from .._core.layout import Layout, complement_modes, row_major
from .._core.mesh import Mesh
from .._core.queries import coordinate as coordinate_of
from .._core.queries import instances
from .._runtime.bounded import bound
from .._runtime.checks import check_device_type
from .._runtime.hooks import on_dead, on_loss, on_realized, on_reset, provide_device_mesh
from .._runtime.memo import WorldKey, world_key
from .routing import TorchSpace, space_for, torch_roots

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "adopt_root",
    "build_root",
    "is_flatten_of",
    "note_realized",
    "to_device_mesh",
]


@attrs.define
class _State:
    """What the interop keeps per process (reset with the memo)."""

    lock: threading.Lock = attrs.field(factory=threading.Lock)
    named_axes: dict[WorldKey, dict[str, tuple[Layout, ProcessGroup] | None]] = attrs.field(
        factory=dict
    )
    """Per rank space: axis name -> (layout, group) this rank realized, or ``None``
    when the name was realized with two different layouts (ambiguous)."""
    device_meshes: dict[tuple[Mesh, str, bool], DeviceMesh] = attrs.field(factory=dict)
    """to_device_mesh memo: (mesh, device type, unnamed) -> DeviceMesh (``bounded``)."""
    roots: dict[tuple[WorldKey, str, bool], list[Any]] = attrs.field(factory=dict)
    """Live root DeviceMeshes (``Root``) per (rank space, device type, unnamed)."""

    def reset(self) -> None:
        with self.lock:
            self.named_axes.clear()
            self.device_meshes.clear()
            self.roots.clear()

    def forget_dead(self, ids: frozenset[int]) -> None:
        """Groups with these ``id()`` died: hand out no DeviceMesh made before."""
        with self.lock:
            self.device_meshes.clear()
            for names in self.named_axes.values():
                for name in [n for n, e in names.items() if e and id(e[1]) in ids]:
                    del names[name]


state = _State()
on_reset(state.reset)
on_dead(state.forget_dead)
on_loss(state.reset)  # DeviceMeshes over the old world hold lost ranks


def note_realized(mesh: Mesh, groups: Mapping[str, ProcessGroup]) -> None:
    """Record name -> (layout, group) per rank space after a realize call, and
    register new flattens in the DeviceMeshes already handed out."""
    if torch_roots():
        return
    wk = world_key(mesh)
    with state.lock:
        names = state.named_axes.setdefault(wk, {})
        for name, layout in zip(mesh.axis_names, mesh.axes):
            pg = groups.get(name)
            if pg is None:
                continue
            if name not in names:
                names[name] = (layout, pg)
                bound(names)
            elif names[name] is not None and names[name] != (layout, pg):
                names[name] = None  # realized with two layouts: ambiguous
        converted = any(w == wk for w, _, _ in state.roots)
    if converted:
        # DeviceMeshes already handed out: torch's _flatten on them finds this axis.
        _sync_flattens(wk)


def _default_device_type() -> str:
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available() and "nccl" in str(dist.get_backend()):
        return "cuda"
    return "cpu"


def _sliceable(mesh: Mesh) -> bool:
    """Whether torch can slice ``mesh``'s dims out of a root in this order: its modes,
    axis after axis, have decreasing strides (and, before torch 2.13, every axis is
    one mode)."""
    from .._compat import torch_version

    strides = [d for _, d in Layout.concat(mesh.axes).modes]
    if any(a <= b for a, b in itertools.pairwise(strides)):
        return False
    return torch_version() >= (2, 13) or all(len(a.modes) <= 1 for a in mesh.axes)


def torch_view(mesh: Mesh) -> Mesh:
    """The same mesh (same instances, groups, coordinates) as torch should index it.

    A mesh torch could slice out of a root is kept as it is, so the DeviceMesh has the
    layout and rank map torch itself computes. Any other (a reordered slice, a
    reversed flatten) is relabeled: the rank map lists the instances one after the
    other, each in row-major order, so every axis is a plain row-major dimension and
    torch's own slicing (which DTensor uses inside) accepts it in the mesh's order.
    """
    if _sliceable(mesh):
        return mesh
    ranks = tuple(int(r) for r in instances(mesh).reshape(-1))
    return Mesh(mesh.axis_names, row_major(mesh.axis_sizes), mesh.index_size, ranks)


def _root_axes(mesh: Mesh) -> Mesh:
    """A made-up root: the mesh's axes plus one dim per remaining mode, by stride."""
    modes = [m for layout in mesh.axes for m in layout.modes]
    dims: list[tuple[int, str, Layout]] = [
        (max((d for _, d in layout.modes), default=0), name, layout)
        for name, layout in zip(mesh.axis_names, mesh.axes)
    ]
    rest = complement_modes(modes, mesh.index_size)
    dims += [(d, f"_rest{i}", Layout.of((s,), (d,))) for i, (s, d) in enumerate(rest)]
    dims.sort(key=lambda dim: -dim[0])
    return Mesh(
        tuple(name for _, name, _ in dims),
        tuple(layout for _, _, layout in dims),
        mesh.index_size,
        mesh.rank_map,
    )


def _groups(
    mesh: Mesh, coordinate: tuple[int, ...] | None, groups: Mapping[str, ProcessGroup]
) -> list[tuple[str, Any]] | None:
    if coordinate is None:
        return None
    return [(pg.group_name, pg) for pg in (groups[n] for n in mesh.axis_names)]


@final
@attrs.frozen(slots=True, eq=False)
class Root:
    """A root DeviceMesh fmesh made (held weakly: a root nobody uses goes away), with
    the mesh of its dims and the rank space it shares with other roots."""

    mesh: Mesh
    ref: weakref.ref[DeviceMesh]
    space: TorchSpace
    unnamed: bool
    """Handed out without dim names (``init_device_mesh`` without names)."""
    decided: set[str] = attrs.field(factory=set)
    """Realized axis names already registered as flattens here, or found not to be."""

    def has_axes(self, mesh: Mesh) -> bool:
        mine = set(zip(self.mesh.axis_names, self.mesh.axes))
        return all(pair in mine for pair in zip(mesh.axis_names, mesh.axes))


def _dims(mesh: Mesh) -> list[tuple[tuple[int, int], ...]]:
    return [a.modes for a in mesh.axes]


def _live(roots: list[Root]) -> list[Root]:
    """Drop the roots that went away (under the state lock)."""
    roots[:] = [r for r in roots if r.ref() is not None]
    return roots


def to_device_mesh(
    mesh: Mesh,
    coordinate: tuple[int, ...] | None,
    groups: Mapping[str, ProcessGroup],
    device_type: str | None,
    *,
    unnamed: bool = False,
) -> DeviceMesh:
    """See ``RealizedMesh.to_device_mesh``: ``mesh`` realized on this rank, at
    ``coordinate``, with ``groups``. ``unnamed`` hands out a DeviceMesh without dim
    names (a mesh with one instance only), as torch's ``init_device_mesh`` makes."""
    found: DeviceMesh | None = None
    if device_type is not None:  # only checked device types are keys: no check for a hit
        with state.lock:
            found = state.device_meshes.get((mesh, device_type, unnamed))
    if found is not None:
        return found  # axes realized since are registered by realize itself
    device_type = check_device_type(
        device_type if device_type is not None else _default_device_type(),
        "RealizedMesh.to_device_mesh",
    )
    key = (mesh, device_type, unnamed)
    with state.lock:
        found = state.device_meshes.get(key)
    if found is not None:
        return found
    if unnamed and mesh.num_instances != 1:
        raise MeshError(f"an unnamed DeviceMesh needs a mesh with one instance, got {mesh!r}")
    import torch.distributed as dist

    view = torch_view(mesh)
    wk = world_key(view)
    rank = dist.get_rank()
    dim_groups = _groups(mesh, coordinate, groups)
    with state.lock:
        roots = _live(state.roots.setdefault((wk, device_type, unnamed), []))
        root = next((r for r in roots if r.space.timeout is None and r.has_axes(view)), None)
        root_dm = None if root is None else root.ref()
    dm: DeviceMesh | None = None
    if root is None or root_dm is None:
        # A mesh with one instance is a root itself, as init_device_mesh's is.
        top = view if view.num_instances == 1 else _root_axes(view)
        root, root_dm = _make(
            top, device_type, rank, None, unnamed, dim_groups if top is view else None
        )
        if top is view:
            dm = root_dm
    if dm is None:
        dm = _make(view, device_type, rank, (root, root_dm), unnamed, dim_groups)[1]
    with state.lock:
        if root not in roots:
            roots.append(root)
        # The memo holds the DeviceMesh, and through it its root.
        state.device_meshes[key] = dm
        bound(state.device_meshes)
    _sync_flattens(wk)
    return dm


def build_root(
    mesh: Mesh,
    groups: Mapping[str, ProcessGroup],
    device_type: str,
    *,
    unnamed: bool,
    timeout: datetime.timedelta | None = None,
    names: tuple[Any, ...] | None = None,
) -> tuple[Root, DeviceMesh]:
    """A new root DeviceMesh of ``mesh`` (one instance, realized on this rank with
    ``groups``), as every call of torch's ``init_device_mesh`` makes one, made but not
    yet known to the memo (the drop-in makes it while its call's slowest rank
    finishes; ``adopt_root`` once the call ended well): the roots of one rank space
    share its rank map and fmesh's groups, not their flattens. Roots with a
    ``timeout`` share a rank map of their own: the groups torch's methods make under
    them get it. ``names``: the DeviceMesh's dim names where they are not ``mesh``'s
    axis names (torch accepts any names, ``""`` and non-str included)."""
    import torch.distributed as dist

    rank = dist.get_rank()
    coordinate = coordinate_of(mesh, rank)
    dim_groups = _groups(mesh, coordinate, groups)
    return _make(mesh, device_type, rank, None, unnamed, dim_groups, timeout, names)


def adopt_root(built: tuple[Root, DeviceMesh], device_type: str) -> DeviceMesh:
    """A root made by ``build_root`` joins its rank space's roots: its DeviceMesh."""
    root, dm = built
    wk = world_key(root.mesh)
    with state.lock:
        _live(state.roots.setdefault((wk, device_type, root.unnamed), [])).append(root)
    _sync_flattens(wk)
    return dm


def _make(
    mesh: Mesh,
    device_type: str,
    rank: int,
    root: tuple[Root, DeviceMesh] | None,
    unnamed: bool,
    dim_groups: Sequence[tuple[str, Any]] | None,
    timeout: datetime.timedelta | None = None,
    names: tuple[Any, ...] | None = None,
) -> tuple[Root, DeviceMesh]:
    """The DeviceMesh of ``mesh`` (a root when ``root`` is None), with its facts;
    its dim names are ``names`` if given, else ``mesh``'s axis names."""
    space = space_for(mesh, timeout) if root is None else root[0].space
    coord = coordinate_of(mesh, rank)
    # torch's own search fails off a mesh with several instances: keep its answer.
    known = (coord, space.flat) if coord is not None or mesh.num_instances == 1 else None
    dm = make_device_mesh(
        device_type,
        _dims(mesh),
        space.tensor,
        None if unnamed else (mesh.axis_names if names is None else names),
        dim_groups,
        None if root is None else root[1],
        known,
    )
    return Root(mesh, weakref.ref(dm), space, unnamed), dm


def is_flatten_of(layout: Layout, dims: Sequence[Layout]) -> bool:
    """Whether ``layout`` is what flattening two or more of ``dims`` (in some order)
    gives; ``dims`` are non-overlapping, so the dim to take next is the one whose
    innermost stride is the innermost stride left. O(number of modes)."""
    by_stride = {d.modes[-1][1]: d for d in dims if d.modes}
    rest = list(layout.modes)
    used = 0
    while rest:
        dim = by_stride.pop(rest[-1][1], None)
        if dim is None:
            return False
        for size, stride in reversed(dim.modes):
            if not rest or rest[-1][1] != stride or rest[-1][0] % size:
                return False
            whole, _ = rest[-1]
            if whole == size:
                rest.pop()
            else:  # a mode coalesced with the next dim's: keep its upper part
                rest[-1] = (whole // size, stride * size)
        used += 1
    return used >= 2


def _sync_flattens(wk: WorldKey) -> None:
    """Register every axis realized over rank space ``wk`` that is a flatten of a named
    root's dims in that root's flatten mapping, so torch's ``_flatten`` of the same
    layout reuses fmesh's group (and ``root[name]`` finds it, as after torch's)."""
    import torch.distributed as dist

    if wk[0] != dist.get_world_size():
        # Over part of the world, ranks outside a mesh hold no entry for its axes, so
        # they would create groups that members skip: torch's group count, hence the
        # names of every later group, would diverge. Let torch create them.
        return
    with state.lock:
        names = dict(state.named_axes.get(wk, {}))
        roots = [
            r
            for (w, _, unnamed), rs in state.roots.items()
            if w == wk and not unnamed
            for r in _live(rs)
            if r.space.timeout is None  # fmesh's own axes carry no timeout
        ]
    if not names or not roots:
        return
    rank = dist.get_rank()
    for root in roots:
        dm = root.ref()
        if dm is None:
            continue
        with state.lock:
            todo = [
                (n, e) for n, e in names.items() if e is not None and n not in root.decided
            ]
            root.decided.update(n for n, _ in todo)
        for name, (layout, pg) in todo:
            if name in root.mesh.axis_names or not is_flatten_of(layout, root.mesh.axes):
                continue
            flat = Mesh((name,), (layout,), root.mesh.index_size, root.mesh.rank_map)
            where = coordinate_of(flat, rank)
            add_flatten(
                dm,
                name,
                layout.modes,
                (pg.group_name, pg),
                None if where is None else where[0],
            )


# The runtime calls these through its hooks; it never imports this module.
on_realized(note_realized)
provide_device_mesh(to_device_mesh)
