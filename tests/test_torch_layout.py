"""fmesh's layouts against torch 2.13's layout algebra, ``torch.distributed._mesh_layout``.

DeviceMesh keeps one ``_FlatLayout`` per dimension: slicing picks layouts, flattening
collapses them, ``_unflatten`` composes with ``_MeshLayout.from_sizes_strides(sizes)``,
and ``remap_to_tensor`` lists every instance. Wherever torch accepts an operation,
fmesh must give the same canonical layouts, groups (in the same order) and coordinates.

Known differences, checked rather than skipped:

- DeviceMesh refuses slices whose layouts are not in ascending order. The layout
  algebra under it does not care, so chains here compare it for every order; fmesh's
  any-order slices are also checked against brute force in ``test_ops.py``.
- torch's composition checks that strides divide but not that shapes do, so a single
  composition can return a smaller layout where fmesh refuses. In the compositions
  ``_unflatten`` makes (sizes multiplying to the axis size), another axis of the split
  trips torch's stride check in every case tried, so both refuse the same splits.
"""

from __future__ import annotations

import importlib
import itertools
import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from bruteforce import Model
from hypothesis import event, given, settings
from hypothesis import strategies as st
from strategies import (
    Flatten,
    MeshSpec,
    Rename,
    Slice,
    apply_op,
    divisors,
    mesh_specs,
    ops,
    tiling_layouts,
)

import fmesh
from fmesh import UnrepresentableSplitError

# Typed loosely: torch 2.11's stubs have another _MeshLayout and no _FlatLayout.
torch_mesh_layout: Any = importlib.import_module("torch.distributed._mesh_layout")
if not hasattr(torch_mesh_layout, "_FlatLayout"):
    pytest.skip(
        "compares with torch's per-axis layout algebra (_FlatLayout), new in torch 2.13; "
        "fmesh's own algebra is checked by test_layout.py on every torch",
        allow_module_level=True,
    )
_FlatLayout = torch_mesh_layout._FlatLayout
_MeshLayout = torch_mesh_layout._MeshLayout


def _torch_axes(sizes: tuple[int, ...]) -> list[Any]:
    return list(_MeshLayout.from_sizes_strides(sizes))


def _same_layout(ours: fmesh.Layout, theirs: Any) -> bool:
    return (ours.shape, ours.stride) == (tuple(theirs.shape), tuple(theirs.stride))


def _rank_tensor(mesh: fmesh.Mesh) -> torch.Tensor:
    ranks = range(mesh.index_size) if mesh.rank_map is None else mesh.rank_map
    return torch.tensor(list(ranks), dtype=torch.int64)


def _check_against_torch(mesh: fmesh.Mesh, axes: list[Any]) -> None:
    """Same layouts, same instances, same groups in the same order, same coordinates."""
    assert len(axes) == mesh.ndim
    for ours, theirs in zip(mesh.axes, axes, strict=True):
        assert _same_layout(ours, theirs), (ours, theirs)
    rank_map = _rank_tensor(mesh)
    full = _MeshLayout(axes).remap_to_tensor(rank_map)
    assert np.array_equal(fmesh.instances(mesh), full.numpy())
    for k in range(full.shape[0]):
        for pos in np.ndindex(*full.shape[1:]):
            assert fmesh.coordinate(mesh, int(full[(k, *pos)])) == pos
    for name, layout in zip(mesh.axis_names, axes, strict=True):
        for group in layout.global_ranks(mesh.index_size):
            ranks = tuple(int(rank_map[i]) for i in group)
            for rank in ranks:
                assert fmesh.group(mesh, name, rank) == ranks


def _torch_unflatten(layout: Any, sizes: tuple[int, ...]) -> list[Any]:
    # What DeviceMesh._unflatten does for one dimension.
    return list(layout.composition(_MeshLayout.from_sizes_strides(sizes)))


def _torch_split_is_wrong(
    parts: list[Any],
    split: tuple[tuple[str, int], ...],
    mesh: fmesh.Mesh,
    model: Model,
) -> bool:
    """Whether torch's unflatten result disagrees with the request or brute force.

    ``model`` is the brute-force mesh after the split; ``mesh`` the one before.
    """
    if tuple(p.numel() for p in parts) != tuple(s for _, s in split):
        return True
    rank_map = _rank_tensor(mesh)
    for (name, _), part in zip(split, parts, strict=True):
        try:
            groups = part.global_ranks(mesh.index_size)
            theirs = sorted(tuple(int(rank_map[i]) for i in g) for g in groups)
        except (IndexError, AssertionError, RuntimeError):
            return True
        if theirs != sorted(model.groups(name)):
            return True
    return False


@settings(max_examples=80, deadline=None)
@given(spec=st.one_of(mesh_specs(), mesh_specs(composite=True)), data=st.data())
def test_operation_chains_match_torch_layouts(spec: MeshSpec, data: st.DataObject) -> None:
    mesh = spec.build()
    model = Model.root(spec.sizes, spec.names, spec.rank_list())
    axes = _torch_axes(spec.sizes)
    _check_against_torch(mesh, axes)
    for _ in range(data.draw(st.integers(1, 4), label="chain length")):
        op = data.draw(ops(model.names, model.sizes), label="op")
        positions = {n: i for i, n in enumerate(model.names)}
        if isinstance(op, Slice):
            picked = _MeshLayout([axes[positions[n]] for n in op.names])
            # DeviceMesh's own rule: slices must keep ascending order.
            event(
                "slice torch accepts"
                if picked.collapse().check_sorted()
                else "slice torch refuses"
            )
            new_axes = list(picked)
        elif isinstance(op, Flatten):
            # DeviceMesh flattens a slice: collapse the listed layouts, in order.
            merged = _MeshLayout([axes[positions[n]] for n in op.names]).collapse()
            first = min(positions[n] for n in op.names)
            new_axes = [
                merged if i == first else layout
                for i, layout in enumerate(axes)
                if i == first or model.names[i] not in op.names
            ]
        elif isinstance(op, Rename):
            new_axes = axes
        else:
            pos = positions[op.axis]
            sizes = tuple(s for _, s in op.sizes)
            split_model = model.unflatten(op.axis, op.sizes)
            try:
                parts = _torch_unflatten(axes[pos], sizes)
            except Exception:  # torch raises AssertionError (or worse) when it refuses
                event("unflatten torch refuses")
                with pytest.raises(UnrepresentableSplitError):
                    apply_op(mesh, op)
                continue
            try:
                mesh_after = apply_op(mesh, op)
            except UnrepresentableSplitError:
                event("unflatten torch wrong")
                assert _torch_split_is_wrong(parts, op.sizes, mesh, split_model)
                continue
            event("unflatten both accept")
            new_axes = [*axes[:pos], *parts, *axes[pos + 1 :]]
            mesh, model, axes = mesh_after, split_model, new_axes
            _check_against_torch(mesh, axes)
            continue
        mesh, model, axes = apply_op(mesh, op), model.apply(op), new_axes
        _check_against_torch(mesh, axes)


def test_unflatten_agrees_with_torch_on_small_cases() -> None:
    """Exhaustive: meshes with 3 axes of sizes 2..4, every ordered choice of 2 or 3
    axes to flatten, every split of the result into 2 or 3 sizes."""
    outcomes: Counter[str] = Counter()
    for sizes in itertools.product((2, 3, 4), repeat=3):
        root = fmesh.make_mesh(sizes, ("a", "b", "c"))
        root_model = Model.root(sizes, ("a", "b", "c"), range(math.prod(sizes)))
        root_axes = _torch_axes(sizes)
        for count in (2, 3):
            for chosen in itertools.permutations(range(3), count):
                names = tuple(root.axis_names[i] for i in chosen)
                mesh = fmesh.flatten(root, names, "m")
                theirs = _MeshLayout([root_axes[i] for i in chosen]).collapse()
                pos = mesh.axis_index("m")
                assert _same_layout(mesh.axes[pos], theirs)
                for split in _factorizations(mesh.shape["m"]):
                    sizes_map = tuple((f"s{i}", s) for i, s in enumerate(split))
                    try:
                        parts = _torch_unflatten(theirs, split)
                    except AssertionError:
                        outcomes["torch refuses"] += 1
                        with pytest.raises(UnrepresentableSplitError):
                            fmesh.unflatten(mesh, "m", dict(sizes_map))
                        continue
                    try:
                        ours = fmesh.unflatten(mesh, "m", dict(sizes_map))
                    except UnrepresentableSplitError:
                        outcomes["torch wrong"] += 1
                        model = root_model.flatten(names, "m").unflatten("m", sizes_map)
                        assert _torch_split_is_wrong(parts, sizes_map, mesh, model)
                        continue
                    outcomes["both accept"] += 1
                    new_axes = ours.axes[pos : pos + len(split)]
                    for layout, part in zip(new_axes, parts, strict=True):
                        assert _same_layout(layout, part)
    assert outcomes["torch refuses"] > 100 and outcomes["both accept"] > 100


def _factorizations(n: int) -> list[tuple[int, ...]]:
    pairs = [(d, n // d) for d in divisors(n)]
    return [*pairs, *((a, b, c // b) for a, c in pairs for b in divisors(c))]


def test_design_example_torch_refuses_or_is_wrong() -> None:
    mesh = fmesh.flatten(fmesh.make_mesh({"a": 2, "b": 2, "c": 3}), ("a", "c"), "ac")
    root = _torch_axes((2, 2, 3))
    theirs = _MeshLayout([root[0], root[2]]).collapse()
    assert _same_layout(mesh.axes[0], theirs)
    with pytest.raises(UnrepresentableSplitError):
        fmesh.unflatten(mesh, "ac", {"x": 3, "y": 2})
    model = Model.root((2, 2, 3), ("a", "b", "c"), range(12)).flatten(("a", "c"), "ac")
    split = (("x", 3), ("y", 2))
    try:
        parts = _torch_unflatten(theirs, (3, 2))
    except AssertionError:
        return  # torch 2.13 refuses too
    assert _torch_split_is_wrong(parts, split, mesh, model.unflatten("ac", split))


@settings(max_examples=200, deadline=None)
@given(case=tiling_layouts(), data=st.data())
def test_compose_matches_torch_or_torch_is_wrong(
    case: tuple[fmesh.Layout, int], data: st.DataObject
) -> None:
    """One (size:step) composition. torch's pycute port checks that strides divide but
    not that shapes do, so it can silently return a smaller layout; fmesh refuses."""
    layout, _ = case
    size = data.draw(st.sampled_from(divisors(layout.size)), label="size")
    step = data.draw(st.sampled_from(divisors(layout.size // size)), label="step")
    theirs = _FlatLayout(layout.shape, layout.stride)
    try:
        (got,) = theirs.composition(_MeshLayout.from_sizes_strides((size,), (step,)))
    except AssertionError:
        event("torch refuses")
        with pytest.raises(UnrepresentableSplitError):
            layout.compose(size, step)
        return
    try:
        ours = layout.compose(size, step)
    except UnrepresentableSplitError:
        event("torch returns a wrong layout")
        expected = [layout(k * step) for k in range(size)]
        assert got.numel() != size or got.all_ranks_from_zero() != expected
        return
    event("both accept")
    assert _same_layout(ours, got)


def test_torch_composition_can_return_a_smaller_layout() -> None:
    # The known pycute defect, pinned on one case: (4,3):(6,1) o (4:1) lists indices
    # 0, 1, 2, 6, which no layout computes; torch answers (3):(1), of size 3.
    layout = fmesh.Layout.of((4, 3), (6, 1))
    theirs = _FlatLayout((4, 3), (6, 1))
    (got,) = theirs.composition(_MeshLayout.from_sizes_strides((4,), (1,)))
    assert got.numel() == 3
    with pytest.raises(UnrepresentableSplitError, match="more than mode size 3 but not"):
        layout.compose(4, 1)


@settings(max_examples=150, deadline=None)
@given(spec=mesh_specs(kinds=("default",), composite=True), data=st.data())
def test_complement_matches_torch(spec: MeshSpec, data: st.DataObject) -> None:
    names = data.draw(st.permutations(spec.names), label="order")
    names = names[: data.draw(st.integers(1, len(names)), label="count")]
    mesh = fmesh.flatten(fmesh.make_mesh(spec.sizes, spec.names), names, "m")
    torch_axes = _torch_axes(spec.sizes)
    theirs = _MeshLayout([torch_axes[spec.names.index(n)] for n in names]).collapse()
    layout = mesh.axes[mesh.axis_index("m")]
    assert _same_layout(layout, theirs)
    assert _same_layout(layout.complement(mesh.index_size), theirs.complement(mesh.index_size))
    assert layout.cosize == _MeshLayout([theirs]).cosize()


def test_the_fields_device_mesh_init_sets_are_those_fmesh_knows_for_this_torch() -> None:
    # fmesh's DeviceMesh without torch's O(world) searches sets these fields itself:
    # the table read off earlier must be what this torch's __init__ sets.
    from fmesh._compat import mesh as compat_mesh
    from fmesh._compat.c10d import torch_version

    known = compat_mesh.KNOWN_FIELDS.get(torch_version())
    assert known is None or known == compat_mesh.probe_fields()
    assert compat_mesh.init_fields() == compat_mesh.probe_fields()
