"""fmesh's transformations and queries against an independent brute-force model.

Every test draws a root mesh (identity or custom rank order, possibly a subset of a
larger world) and compares fmesh's answers with explicit numpy arrays of ranks
(``tests/bruteforce.py``): coordinates, groups, instances, for every rank.
"""

from __future__ import annotations

import ast
import itertools
import math
import re

import numpy as np
import pytest
from bruteforce import Model, check_mesh, layout_values, model_of
from hypothesis import event, given, settings
from hypothesis import strategies as st
from strategies import (
    MeshSpec,
    Op,
    Unflatten,
    apply_op,
    build_chain,
    derived_specs,
    factorizations,
    mesh_specs,
    ops,
    tiling_layouts,
)

import fmesh
from fmesh import UnrepresentableSplitError


def _root(spec: MeshSpec) -> tuple[fmesh.Mesh, Model]:
    return spec.build(), Model.root(spec.sizes, spec.names, spec.rank_list())


def _split_is_layout(model: Model, op: Unflatten) -> bool:
    """The brute-force oracle for unflatten: is every new axis a strided layout?"""
    split = model.unflatten(op.axis, op.sizes)
    return all(split.axis_is_layout(name) for name, _ in op.sizes)


@settings(max_examples=60, deadline=None)
@given(spec=mesh_specs())
def test_root_meshes_match_brute_force(spec: MeshSpec) -> None:
    mesh, model = _root(spec)
    check_mesh(mesh, model)


@settings(max_examples=150, deadline=None)
@given(spec=st.one_of(mesh_specs(), mesh_specs(composite=True)), data=st.data())
def test_operation_chains_match_brute_force(spec: MeshSpec, data: st.DataObject) -> None:
    """Random chains of slice / flatten / unflatten / rename, checked after each step.

    An unflatten is refused exactly when the brute-force oracle says the split is not
    a strided layout; every accepted result matches the model rank for rank.
    """
    mesh, model = _root(spec)
    for _ in range(data.draw(st.integers(1, 4), label="chain length")):
        op = data.draw(ops(model.names, model.sizes), label="op")
        event(type(op).__name__)
        if isinstance(op, Unflatten) and not _split_is_layout(model, op):
            event("unflatten refused")
            with pytest.raises(UnrepresentableSplitError, match="cannot split axis"):
                apply_op(mesh, op)
            continue
        mesh = apply_op(mesh, op)
        model = model.apply(op)
        check_mesh(mesh, model)


def _listed_splits(message: str) -> list[tuple[int, ...]]:
    """The splits an UnrepresentableSplitError message says would work."""
    _, _, tail = message.partition("that work: ")
    return [ast.literal_eval(t) for t in re.findall(r"\(\d+(?:, \d+)*,?\)", tail)]


@settings(max_examples=150, deadline=None)
@given(spec=mesh_specs(kinds=("default", "permutation"), composite=True), data=st.data())
def test_unflatten_of_flattened_axes(spec: MeshSpec, data: st.DataObject) -> None:
    """Unflatten after flattening axes in a random order: the usual source of layouts
    that cannot be split. Refusals agree with the oracle and list splits that work."""
    mesh, model = _root(spec)
    chosen = data.draw(st.permutations(spec.names), label="order")
    count = data.draw(st.integers(min(2, len(chosen)), len(chosen)), label="count")
    chosen = chosen[:count]
    mesh = fmesh.flatten(mesh, chosen, "merged")
    model = model.flatten(chosen, "merged")
    split = data.draw(factorizations(model.sizes[model.axis("merged")]), label="split")
    op = Unflatten("merged", tuple((f"s{i}", s) for i, s in enumerate(split)))
    if _split_is_layout(model, op):
        event("split accepted")
        check_mesh(apply_op(mesh, op), model.apply(op))
        return
    event("split refused")
    with pytest.raises(UnrepresentableSplitError) as info:
        apply_op(mesh, op)
    message = str(info.value)
    assert "'merged'" in message and str(dict(op.sizes)) in message
    listed = _listed_splits(message)
    for good in listed:
        assert len(good) == len(split) and math.prod(good) == math.prod(split)
        names = tuple((f"s{i}", s) for i, s in enumerate(good))
        assert _split_is_layout(model, Unflatten("merged", names))
        check_mesh(
            apply_op(mesh, Unflatten("merged", names)), model.unflatten("merged", names)
        )
    if not listed:  # then the message claims that no split works; check them all
        assert "is a layout" in message
        for other in _ordered_factorizations(math.prod(split), len(split)):
            names = tuple((f"s{i}", s) for i, s in enumerate(other))
            if min(other) > 1:
                assert not _split_is_layout(model, Unflatten("merged", names))


def _ordered_factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    if parts == 1:
        return [(n,)]
    return [
        (d, *rest)
        for d in range(1, n + 1)
        if n % d == 0
        for rest in _ordered_factorizations(n // d, parts - 1)
    ]


def test_unflatten_refuses_exactly_the_splits_that_are_not_layouts() -> None:
    """Exhaustive over small cases: every mesh with 3 axes of sizes 2..4, every ordered
    choice of 2 or 3 of its axes to flatten, every split into 2 or 3 sizes."""
    refused = accepted = 0
    for sizes in itertools.product((2, 3, 4), repeat=3):
        root = fmesh.make_mesh(sizes, ("a", "b", "c"))
        root_model = Model.root(sizes, ("a", "b", "c"), range(math.prod(sizes)))
        for count in (2, 3):
            for chosen in itertools.permutations(("a", "b", "c"), count):
                mesh = fmesh.flatten(root, chosen, "m")
                model = root_model.flatten(chosen, "m")
                size = mesh.shape["m"]
                for parts in (2, 3):
                    for split in _ordered_factorizations(size, parts):
                        op = Unflatten("m", tuple((f"s{i}", s) for i, s in enumerate(split)))
                        if _split_is_layout(model, op):
                            accepted += 1
                            got = fmesh.instances(apply_op(mesh, op))
                            assert np.array_equal(got, model.apply(op).ranks), op
                        else:
                            refused += 1
                            with pytest.raises(UnrepresentableSplitError):
                                apply_op(mesh, op)
    assert refused > 100 and accepted > 100  # both sides of the rule are exercised


def test_design_example_split_is_refused_and_message_lists_the_working_split() -> None:
    # DESIGN.md: a flattened (2,3):(6,1) axis cannot be split into (3, 2).
    mesh = fmesh.flatten(fmesh.make_mesh({"a": 2, "b": 2, "c": 3}), ("a", "c"), "ac")
    assert mesh.axes[0] == fmesh.Layout.of((2, 3), (6, 1))
    with pytest.raises(UnrepresentableSplitError, match=r"works?: .*\(2, 3\)") as info:
        fmesh.unflatten(mesh, "ac", {"x": 3, "y": 2})
    assert "(3, 2)" not in str(info.value).partition("work: ")[2]
    # ...and the split it suggests really works and matches brute force.
    model = Model.root((2, 2, 3), ("a", "b", "c"), range(12)).flatten(("a", "c"), "ac")
    check_mesh(
        fmesh.unflatten(mesh, "ac", {"x": 2, "y": 3}),
        model.unflatten("ac", (("x", 2), ("y", 3))),
    )


# -- round trips ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(spec=mesh_specs(), data=st.data())
def test_unflatten_undoes_flatten_of_adjacent_axes(
    spec: MeshSpec, data: st.DataObject
) -> None:
    mesh = spec.build()
    start = data.draw(st.integers(0, mesh.ndim - 1), label="start")
    stop = data.draw(st.integers(start + 1, mesh.ndim), label="stop")
    names = mesh.axis_names[start:stop]
    sizes = {n: mesh.shape[n] for n in names}
    name = data.draw(st.sampled_from([None, "merged", names[0]]), label="name")
    flat = fmesh.flatten(mesh, names, name)
    merged = "_".join(names) if name is None else name
    assert flat.axis_names == (*mesh.axis_names[:start], merged, *mesh.axis_names[stop:])
    back = fmesh.unflatten(flat, merged, sizes)
    assert back == mesh
    assert hash(back) == hash(mesh)


@settings(max_examples=60, deadline=None)
@given(spec=mesh_specs(), data=st.data())
def test_unflatten_undoes_flatten_in_any_order(spec: MeshSpec, data: st.DataObject) -> None:
    """Non-adjacent or reversed axes: the flattened mesh has correct groups, and
    unflattening into the same sizes, then moving axes back, restores the mesh."""
    mesh, model = _root(spec)
    names = data.draw(st.permutations(spec.names), label="order")
    names = names[: data.draw(st.integers(1, len(names)), label="count")]
    flat = fmesh.flatten(mesh, names, "merged")
    check_mesh(flat, model.flatten(names, "merged"))
    back = fmesh.unflatten(flat, "merged", {n: mesh.shape[n] for n in names})
    assert fmesh.slice(back, *mesh.axis_names) == mesh


@settings(max_examples=40, deadline=None)
@given(spec=mesh_specs(), data=st.data())
def test_slice_in_any_order_then_rename(spec: MeshSpec, data: st.DataObject) -> None:
    mesh, model = _root(spec)
    names = data.draw(st.permutations(spec.names), label="order")
    names = names[: data.draw(st.integers(1, len(names)), label="count")]
    sliced = fmesh.slice(mesh, *names)
    check_mesh(sliced, model.slice(names))
    renamed = fmesh.rename(sliced, {n: n.upper() for n in names})
    assert renamed.axes == sliced.axes and renamed.rank_map == sliced.rank_map
    assert fmesh.rename(renamed, {n.upper(): n for n in names}) == sliced
    # Slicing every axis in mesh order is the identity.
    assert fmesh.slice(mesh, *mesh.axis_names) == mesh


# -- properties of the queries (fmesh alone) -----------------------------------------------


@settings(max_examples=60, deadline=None)
@given(spec=mesh_specs(), data=st.data())
def test_query_properties(spec: MeshSpec, data: st.DataObject) -> None:
    """Group order rule, instance/coordinate consistency, and exact tiling."""
    mesh = spec.build()
    model = Model.root(spec.sizes, spec.names, spec.rank_list())
    for _ in range(data.draw(st.integers(0, 3), label="chain length")):
        op = data.draw(ops(model.names, model.sizes), label="op")
        if isinstance(op, Unflatten) and not _split_is_layout(model, op):
            continue
        mesh, model = apply_op(mesh, op), model.apply(op)
    every = fmesh.instances(mesh)
    world = sorted(spec.rank_list())
    assert sorted(int(r) for r in every.reshape(-1)) == world  # each rank exactly once
    for rank in world:
        coord = fmesh.coordinate(mesh, rank)
        assert coord is not None
        assert int(fmesh.instance(mesh, rank)[coord]) == rank
        for axis, name in enumerate(mesh.axis_names):
            group = fmesh.group(mesh, name, rank)
            assert group.index(rank) == coord[axis]
            assert len(group) == mesh.axis_sizes[axis]
            # Every member of the group agrees on the group.
            other = group[(coord[axis] + 1) % len(group)]
            assert fmesh.group(mesh, name, other) == group
    inst = fmesh.instance(mesh, world[0])
    assert inst.shape == mesh.axis_sizes
    assert any(np.array_equal(inst, every[k]) for k in range(every.shape[0]))


# -- rank_at and Layout.group_base -----------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(drawn=derived_specs())
def test_rank_at_matches_brute_force(drawn: tuple[MeshSpec, tuple[Op, ...]]) -> None:
    spec, chain = drawn
    mesh, model = build_chain(spec, chain), model_of(spec, chain)
    ranks = model.ranks
    for pos in np.ndindex(ranks.shape):
        k, *coord = (int(p) for p in pos)
        assert fmesh.rank_at(mesh, tuple(coord), k) == int(ranks[pos])
        assert fmesh.rank_at(mesh, np.asarray(coord, dtype=np.int64).tolist(), instance=k) == (
            int(ranks[pos])
        )


def test_rank_at_of_a_huge_mesh() -> None:
    mesh = fmesh.slice(fmesh.make_mesh({"pp": 2**20, "dp": 2**20, "tp": 8}), "tp", "pp")
    # Instances are numbered by base index: the dp coordinate, here 2**20 - 1.
    assert (
        fmesh.rank_at(mesh, (5, 3), instance=2**20 - 1) == 5 + 8 * (2**20 - 1) + 3 * 8 * 2**20
    )


@settings(max_examples=200, deadline=None)
@given(tiling_layouts())
def test_group_base_matches_brute_force(drawn: tuple[fmesh.Layout, int]) -> None:
    layout, size = drawn
    offsets = layout_values(layout.shape, layout.stride)
    # Partition [0, size) greedily: the smallest index not yet in a group is a base
    # (offsets are >= 0 and the offset of coordinate 0 is 0).
    base_of: dict[int, int] = {}
    for index in range(size):
        if index not in base_of:
            for v in offsets:
                assert index + v not in base_of
                base_of[index + v] = index
    for index in range(size):
        assert layout.group_base(index) == base_of[index]
