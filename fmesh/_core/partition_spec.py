"""``PartitionSpec``: JAX-style sharding of a tensor over named mesh axes (pure).

A spec has one entry per tensor dimension: ``None`` (not split), an axis name, or a
tuple of axis names ordered major to minor. The semantics are JAX's ``NamedSharding``:
a dim named with axes ``(a1, ..., ak)`` is cut into ``size(a1)*...*size(ak)`` equal
blocks, and a rank holds the block at the row-major index of its coordinates along
``(a1, ..., ak)``; axes the spec does not name replicate.

This module also computes the *shard plan* DTensor needs (per mesh axis: which tensor
dim it splits and with which split factor) and its inverse. It never imports torch;
``fmesh._torch.distribute`` turns plans into torch placements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final, TypeAlias, final

from .axes import check_axis_name
from .errors import AxisNotFoundError, MeshError
from .mesh import Mesh, require_mesh

__all__ = [
    "P",
    "PartitionEntry",
    "PartitionSpec",
    "ShardPlan",
    "plan_from_spec",
    "spec_from_plan",
]

PartitionEntry: TypeAlias = str | tuple[str, ...] | None
"""One entry of a ``PartitionSpec``: ``None``, an axis name, or several names."""


def _canonical_entry(entry: object, position: int) -> PartitionEntry:
    """JAX's canonical form: ``()`` is ``None`` and ``('x',)`` is ``'x'``."""
    if entry is None:
        return None
    if isinstance(entry, str):
        names: tuple[object, ...] = (entry,)
    elif isinstance(entry, tuple | list):
        names = tuple(entry)
    else:
        raise TypeError(
            f"PartitionSpec entry {position} is {entry!r} of type {type(entry).__name__}; "
            "each entry must be None, an axis name (str) or a tuple of axis names"
        )
    checked = [
        check_axis_name(
            name,
            where=f"PartitionSpec entry {position} is {entry!r}: ",
            if_empty="; use None for a dimension that is not split",
        )
        for name in names
    ]
    if not checked:
        return None
    if len(checked) == 1:
        return checked[0]
    return tuple(checked)


@final
class PartitionSpec(tuple[PartitionEntry, ...]):
    """How a tensor is sharded over named mesh axes, one entry per tensor dimension.

    Each entry is ``None`` (the dimension is not split), an axis name, or a tuple of
    axis names ordered major to minor. Trailing dimensions the spec does not cover are
    not split. A tuple subclass, like JAX's: hashable, compared by value, and
    ``P(('tp',))`` equals ``P('tp')`` (JAX's canonical form). Importing it does not
    import torch.

    Args:
        *partitions: one entry per tensor dimension.

    Raises:
        TypeError: an entry is not ``None``, a str, or a tuple of str.
        MeshError: an axis is named twice, or a name is empty.

    >>> from fmesh import P
    >>> spec = P("dp", ("tp", "cp"), None)
    >>> spec
    PartitionSpec('dp', ('tp', 'cp'), None)
    >>> spec[1], spec.axis_names
    (('tp', 'cp'), ('dp', 'tp', 'cp'))
    >>> P(("tp",)) == P("tp")
    True
    """

    __slots__ = ()

    def __new__(cls, *partitions: str | Sequence[str] | None) -> PartitionSpec:
        entries = tuple(_canonical_entry(p, i) for i, p in enumerate(partitions))
        seen: dict[str, int] = {}
        for position, entry in enumerate(entries):
            for name in _names(entry):
                if name in seen:
                    where = (
                        f"entries {seen[name]} and {position}"
                        if seen[name] != position
                        else f"entry {position}"
                    )
                    raise MeshError(
                        f"axis {name!r} is named twice in PartitionSpec"
                        f"{_entries_str(entries)} ({where}); a mesh axis can split at "
                        "most one tensor dimension, once"
                    )
                seen[name] = position
        return super().__new__(cls, entries)

    def __reduce__(self) -> tuple[type[PartitionSpec], tuple[PartitionEntry, ...]]:
        # tuple's default would pass the entries as one argument.
        return (PartitionSpec, tuple(self))

    def __repr__(self) -> str:
        return f"PartitionSpec{_entries_str(tuple(self))}"

    @property
    def axis_names(self) -> tuple[str, ...]:
        """Every axis name the spec uses, in entry order (major to minor within one)."""
        return tuple(name for entry in self for name in _names(entry))


P: Final = PartitionSpec
"""Alias of [`PartitionSpec`][fmesh.PartitionSpec] (``from fmesh import P``), as in JAX."""


def _names(entry: PartitionEntry) -> tuple[str, ...]:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return entry


def _entries_str(entries: tuple[PartitionEntry, ...]) -> str:
    return "(" + ", ".join(repr(e) for e in entries) + ")"


ShardPlan: TypeAlias = tuple[tuple[int, int] | None, ...]
"""Per mesh axis: ``(tensor_dim, split_factor)`` when the axis splits that dim, else
``None`` (replicated). ``split_factor`` is DTensor's ``_StridedShard`` factor (1 for a
plain ``Shard``)."""


def spec_dims(mesh: Mesh, spec: PartitionSpec, ndim: int) -> tuple[tuple[int, ...], ...]:
    """Per tensor dim, the mesh axis indices that split it, major to minor.

    Raises:
        TypeError: ``spec`` is not a PartitionSpec or ``ndim`` not an int.
        MeshError: more entries than tensor dimensions.
        AxisNotFoundError: the spec names an axis the mesh lacks.
    """
    require_mesh(mesh, "spec_dims", needs="expected an fmesh.Mesh")
    if not isinstance(spec, PartitionSpec):
        raise TypeError(
            f"expected an fmesh.PartitionSpec, got {spec!r} of type {type(spec).__name__}; "
            "wrap the entries: P('dp', None)"
        )
    if isinstance(ndim, bool) or not isinstance(ndim, int) or ndim < 0:
        raise TypeError(f"ndim must be a non-negative int, got {ndim!r}")
    if len(spec) > ndim:
        raise MeshError(
            f"{spec!r} has {len(spec)} entries but the tensor has {ndim} dimension(s); "
            "give at most one entry per tensor dimension"
        )
    dims: list[tuple[int, ...]] = []
    for entry in tuple(spec) + (None,) * (ndim - len(spec)):
        axes: list[int] = []
        for name in _names(entry):
            if name not in mesh.axis_names:
                raise AxisNotFoundError(
                    f"{spec!r} names axis {name!r}, which {mesh!r} does not have; valid "
                    f"axis names are {list(mesh.axis_names)}"
                )
            axes.append(mesh.axis_names.index(name))
        dims.append(tuple(axes))
    return tuple(dims)


def plan_from_spec(mesh: Mesh, spec: PartitionSpec, ndim: int) -> ShardPlan:
    """The DTensor shard plan that realizes ``spec`` on ``mesh`` for an ``ndim`` tensor.

    DTensor applies placements left to right in mesh-axis order; a dim split over axes
    in another order needs a split factor on each axis that comes *later* in the mesh
    but is more major in the spec: the product of their sizes (torch's shard-order
    encoding, ``DTensorSpec._convert_shard_order_to_StridedShard``).

    >>> from fmesh import P, make_mesh
    >>> plan_from_spec(make_mesh({"dp": 2, "tp": 4}), P(("tp", "dp")), 1)
    ((0, 4), (0, 1))
    """
    dims = spec_dims(mesh, spec, ndim)
    sizes = mesh.axis_sizes
    plan: list[tuple[int, int] | None] = [None] * mesh.ndim
    for tensor_dim, axes in enumerate(dims):
        for position, axis in enumerate(axes):
            factor = math.prod(sizes[a] for a in axes[:position] if a > axis)
            plan[axis] = (tensor_dim, factor)
    return tuple(plan)


def spec_from_plan(mesh: Mesh, plan: ShardPlan) -> PartitionSpec:
    """The spec whose plan is ``plan`` (inverse of ``plan_from_spec``).

    Trailing unsplit dimensions are dropped, so the result is the shortest spec.

    Raises:
        MeshError: no order of the axes gives these split factors.

    >>> from fmesh import make_mesh
    >>> spec_from_plan(make_mesh({"dp": 2, "tp": 4}), ((0, 4), (0, 1)))
    PartitionSpec(('tp', 'dp'))
    """
    if len(plan) != mesh.ndim:
        raise MeshError(f"a shard plan has one entry per mesh axis: {mesh.ndim}, got {plan}")
    sizes = mesh.axis_sizes
    orders: dict[int, list[int]] = {}
    # Right to left: an axis's split factor is the product of the sizes of the later
    # axes placed before it in the order, all of which are already placed.
    for axis in reversed(range(mesh.ndim)):
        step = plan[axis]
        if step is None:
            continue
        tensor_dim, factor = step
        order = orders.setdefault(tensor_dim, [])
        product = 1
        for position in range(len(order) + 1):
            if product == factor:
                order.insert(position, axis)
                break
            if position < len(order):
                product *= sizes[order[position]]
        else:
            raise MeshError(
                f"mesh axis {mesh.axis_names[axis]!r} splits tensor dim {tensor_dim} with "
                f"split factor {factor}, which no order of the axes splitting that dim "
                f"gives on {mesh!r}; PartitionSpec cannot express this sharding"
            )
    ndim = max(orders, default=-1) + 1
    entries: list[PartitionEntry] = []
    for tensor_dim in range(ndim):
        names = tuple(mesh.axis_names[a] for a in orders.get(tensor_dim, ()))
        entries.append(None if not names else names[0] if len(names) == 1 else names)
    return PartitionSpec(*entries)
