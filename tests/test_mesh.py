"""Mesh as a value: equality, hashing, pickling, immutability, constructors, repr."""

from __future__ import annotations

import copy
import math
import pickle
import subprocess
import sys
from typing import Any

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import MeshSpec, Unflatten, apply_op, mesh_specs, ops

import fmesh
from fmesh import Layout, Mesh, UnrepresentableSplitError, make_mesh


@st.composite
def derived_meshes(draw: st.DrawFn) -> fmesh.Mesh:
    """A root mesh after a few random operations."""
    spec = draw(mesh_specs())
    mesh = spec.build()
    for _ in range(draw(st.integers(0, 3))):
        op = draw(ops(mesh.axis_names, mesh.axis_sizes))
        try:
            mesh = apply_op(mesh, op)
        except UnrepresentableSplitError:
            assert isinstance(op, Unflatten)
    return mesh


@settings(max_examples=60, deadline=None)
@given(derived_meshes())
def test_meshes_are_hashable_values_that_pickle(mesh: fmesh.Mesh) -> None:
    for other in (pickle.loads(pickle.dumps(mesh)), copy.deepcopy(mesh), copy.copy(mesh)):
        assert other == mesh and hash(other) == hash(mesh)
        assert np.array_equal(fmesh.instances(other), fmesh.instances(mesh))
    assert {mesh: 1}[attrs.evolve(mesh)] == 1
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        mesh.index_size = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        mesh.shape[mesh.axis_names[0]] = 1  # type: ignore[index]


@settings(max_examples=40, deadline=None)
@given(mesh_specs())
def test_building_twice_gives_equal_meshes(spec: MeshSpec) -> None:
    a, b = spec.build(), spec.build()
    assert a == b and hash(a) == hash(b)
    # Every constructor spelling of the same ranks gives the same value.
    ranks = np.asarray(spec.rank_list(), dtype=np.int64)
    assert make_mesh(spec.sizes, spec.names, ranks=ranks) == a
    assert make_mesh(spec.sizes, spec.names, ranks=ranks.reshape(spec.sizes)) == a
    assert Mesh.from_ranks(ranks.reshape(spec.sizes), spec.names) == a
    assert make_mesh(dict(zip(spec.names, spec.sizes, strict=True)), ranks=list(ranks)) == a


@settings(max_examples=40, deadline=None)
@given(mesh_specs(kinds=("default", "identity", "mapping")))
def test_an_explicit_identity_rank_map_equals_none(spec: MeshSpec) -> None:
    mesh = spec.build()
    assert mesh.rank_map is None
    assert mesh == make_mesh(spec.sizes, spec.names)
    assert hash(mesh) == hash(make_mesh(spec.sizes, spec.names))
    identity = tuple(range(spec.world))
    assert Mesh(mesh.axis_names, mesh.axes, mesh.index_size, identity) == mesh


@settings(max_examples=40, deadline=None)
@given(mesh_specs(kinds=("default", "mapping")))
def test_a_default_mesh_pickles_small(spec: MeshSpec) -> None:
    assert len(pickle.dumps(spec.build())) < 1000


def test_equality_is_by_value() -> None:
    m = make_mesh({"dp": 2, "tp": 4})
    assert fmesh.slice(m, "tp", "dp") != fmesh.slice(m, "dp", "tp")
    assert fmesh.rename(m, {"dp": "data"}) != m
    assert make_mesh({"dp": 2, "tp": 4}, ranks=[1, 0, 2, 3, 4, 5, 6, 7]) != m
    # Different paths to the same value compare (and hash) equal.
    flat = fmesh.flatten(m, ("dp", "tp"), "world")
    assert flat == make_mesh({"world": 8}) == Mesh(("world",), (Layout.of((8,)),), 8)
    assert hash(flat) == hash(make_mesh({"world": 8}))


def test_numpy_integers_count_as_ints() -> None:
    sizes: Any = (np.int64(2), np.int32(3))
    mesh = make_mesh(sizes, ("a", "b"), ranks=list(np.arange(6)[::-1]))
    assert mesh == make_mesh((2, 3), ("a", "b"), ranks=[5, 4, 3, 2, 1, 0])
    assert all(type(s) is int for s in mesh.axis_sizes)
    assert mesh.rank_map is not None and all(type(r) is int for r in mesh.rank_map)


@settings(max_examples=40, deadline=None)
@given(derived_meshes())
def test_derived_fields(mesh: fmesh.Mesh) -> None:
    assert list(mesh.shape) == list(mesh.axis_names)
    assert tuple(mesh.shape.values()) == mesh.axis_sizes
    assert mesh.size == math.prod(mesh.axis_sizes)
    assert mesh.ndim == len(mesh.axis_names) == len(mesh.axes)
    assert mesh.num_instances * mesh.size == mesh.index_size
    for i, name in enumerate(mesh.axis_names):
        assert mesh.axis_index(name) == i
    text = repr(mesh)
    default = ", ".join(f"{n}={s}" for n, s in mesh.shape.items())
    assert text.startswith(f"Mesh({default}")
    assert ("rank_map=[" in text) == (mesh.rank_map is not None)
    root = make_mesh(mesh.axis_sizes, mesh.axis_names)
    plain = mesh.index_size == mesh.size and mesh.axes == root.axes
    assert ("layouts=(" in text) == (not plain)
    if plain and mesh.rank_map is None:
        assert text == f"Mesh({default})"


def test_repr_is_short() -> None:
    assert repr(make_mesh({"dp": 2, "tp": 4})) == "Mesh(dp=2, tp=4)"
    big = make_mesh({"x": 16}, ranks=list(range(16, 0, -1)))
    assert repr(big) == "Mesh(x=16, rank_map=[16, 15, 14, 13, 12, 11, 10, 9, ...])"


def test_query_results_are_fresh_arrays() -> None:
    for ranks in (None, [3, 2, 1, 0]):
        mesh = make_mesh({"dp": 2, "tp": 2}, ranks=ranks)
        every, one = fmesh.instances(mesh).copy(), fmesh.instance(mesh, 1).copy()
        fmesh.instances(mesh)[...] = -1
        fmesh.instance(mesh, 1)[...] = -1
        assert np.array_equal(fmesh.instances(mesh), every)
        assert np.array_equal(fmesh.instance(mesh, 1), one)


def test_import_fmesh_does_not_import_torch() -> None:
    code = "import fmesh, sys; assert 'torch' not in sys.modules, 'torch was imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@settings(max_examples=80, deadline=None)
@given(derived_meshes(), st.data())
def test_getitem_is_slice(mesh: fmesh.Mesh, data: st.DataObject) -> None:
    names = data.draw(st.permutations(mesh.axis_names))
    names = names[: data.draw(st.integers(1, len(names)))]
    assert mesh[tuple(names)] == fmesh.slice(mesh, *names)
    assert mesh[names[0]] == fmesh.slice(mesh, names[0])
    if len(names) == 2:
        assert mesh[names[0], names[1]] == fmesh.slice(mesh, names[0], names[1])
