"""``PartitionSpec`` and the shard plan, with no process group (pure).

The plan is checked against two independent numpy models written here: JAX's
NamedSharding rule (blocks at the row-major index of the named coordinates) and
DTensor's documented left-to-right placement semantics (``Shard`` chunks the local
tensor; ``_StridedShard(sf)`` chunks it into ``sf * n`` pieces and keeps every
``n``-th, starting at the coordinate). A plan is right when both agree on every
coordinate.
"""

from __future__ import annotations

import itertools
import math
import pickle
import subprocess
import sys

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import axis_names, axis_sizes, partition_specs

import fmesh
from fmesh import AxisNotFoundError, MeshError, P, PartitionSpec
from fmesh._core.partition_spec import plan_from_spec, spec_from_plan
from fmesh._torch.distribute import _spec_from_order

# -- the value ----------------------------------------------------------------------------


def test_p_is_partition_spec() -> None:
    assert P is PartitionSpec
    assert isinstance(P("dp"), tuple)


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        (P(), "PartitionSpec()"),
        (P("dp"), "PartitionSpec('dp')"),
        (P(None, "tp"), "PartitionSpec(None, 'tp')"),
        (P("dp", ("tp", "cp")), "PartitionSpec('dp', ('tp', 'cp'))"),
        (P(("tp", "cp"), None), "PartitionSpec(('tp', 'cp'), None)"),
    ],
)
def test_repr(spec: PartitionSpec, text: str) -> None:
    assert repr(spec) == text
    assert str(spec) == text


def test_canonical_entries_like_jax() -> None:
    assert P(("tp",)) == P("tp")
    assert P(()) == P(None)
    assert P(["tp", "cp"]) == P(("tp", "cp"))
    assert tuple(P("dp", ["tp", "cp"], (), ("x",))) == ("dp", ("tp", "cp"), None, "x")


def test_equality_and_hashing_by_value() -> None:
    a = P("dp", ("tp", "cp"))
    b = P("dp", ["tp", "cp"])
    assert a == b and hash(a) == hash(b)
    assert len({a, b, P("dp", ("cp", "tp")), P("dp", ("tp", "cp"), None)}) == 3
    assert P("dp", ("tp", "cp")) != P("dp", ("cp", "tp"))  # order is major to minor
    assert P("dp") != P("dp", None)  # as in JAX: trailing None is kept
    assert {P("dp"): 1}[P(("dp",))] == 1


def test_immutable_and_picklable() -> None:
    spec = P("dp", ("tp", "cp"), None)
    back = pickle.loads(pickle.dumps(spec))
    assert back == spec and type(back) is PartitionSpec
    with pytest.raises(TypeError):
        spec[0] = "x"  # type: ignore[index]  # the error under test
    with pytest.raises(AttributeError):
        spec.extra = 1  # type: ignore[attr-defined]  # the error under test


def test_axis_names() -> None:
    assert P(None, "dp", ("tp", "cp")).axis_names == ("dp", "tp", "cp")
    assert P().axis_names == ()


def test_axis_named_twice_is_an_error() -> None:
    with pytest.raises(
        MeshError,
        match=r"axis 'tp' is named twice in PartitionSpec"
        r"\('tp', \('dp', 'tp'\)\) \(entries 0 and 1\)",
    ):
        P("tp", ("dp", "tp"))
    with pytest.raises(MeshError, match=r"axis 'tp' is named twice .* \(entry 0\)"):
        P(("tp", "tp"))


@pytest.mark.parametrize(
    ("entry", "pattern"),
    [
        (3, r"entry 0 is 3 of type int; each entry must be None, an axis name"),
        (("dp", 3), r"entry 0 is \('dp', 3\): axis names must be str, got 3 of type int"),
        ((("dp",),), r"axis names must be str, got \('dp',\) of type tuple"),
        ({"dp"}, r"entry 0 is \{'dp'\} of type set"),
    ],
)
def test_wrong_entry_types(entry: object, pattern: str) -> None:
    with pytest.raises(TypeError, match=pattern):
        P(entry)  # type: ignore[arg-type]  # the error under test


def test_empty_axis_name() -> None:
    with pytest.raises(MeshError, match=r"entry 1 is '': axis names must be non-empty"):
        P("dp", "")


def test_importing_and_planning_do_not_import_torch() -> None:
    code = (
        "import sys, fmesh\n"
        "from fmesh._core.partition_spec import plan_from_spec, spec_from_plan\n"
        "m = fmesh.make_mesh({'dp': 2, 'tp': 4})\n"
        "s = fmesh.P(('tp', 'dp'))\n"
        "assert spec_from_plan(m, plan_from_spec(m, s, 2)) == s\n"
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


# -- validation against a mesh ------------------------------------------------------------

MESH = fmesh.make_mesh({"dp": 2, "tp": 4})


def test_unknown_axis() -> None:
    with pytest.raises(
        AxisNotFoundError,
        match=r"PartitionSpec\('dp', 'cp'\) names axis 'cp', which Mesh\(dp=2, tp=4\) "
        r"does not have; valid axis names are \['dp', 'tp'\]",
    ):
        plan_from_spec(MESH, P("dp", "cp"), 2)
    with pytest.raises(KeyError):
        plan_from_spec(MESH, P("cp"), 2)


def test_more_entries_than_dims() -> None:
    with pytest.raises(
        MeshError,
        match=r"PartitionSpec\('dp', None, 'tp'\) has 3 entries but the tensor "
        r"has 2 dimension\(s\)",
    ):
        plan_from_spec(MESH, P("dp", None, "tp"), 2)


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        ((MESH, ("dp",), 1), r"expected an fmesh.PartitionSpec, got \('dp',\) of type tuple"),
        ((MESH, P("dp"), True), r"ndim must be a non-negative int, got True"),
        ((MESH, P("dp"), -1), r"ndim must be a non-negative int, got -1"),
        (("mesh", P("dp"), 1), r"expected an fmesh.Mesh, got str"),
    ],
)
def test_wrong_argument_types(args: tuple[object, object, object], pattern: str) -> None:
    with pytest.raises(TypeError, match=pattern):
        plan_from_spec(*args)  # type: ignore[arg-type]  # the error under test


def test_undecodable_plan() -> None:
    # tp with split factor 2: no axis after it could make 2 shards first.
    with pytest.raises(
        MeshError,
        match=r"mesh axis 'tp' splits tensor dim 0 with split factor 2, which "
        r"no order .* PartitionSpec cannot express this sharding",
    ):
        spec_from_plan(MESH, (None, (0, 2)))
    with pytest.raises(MeshError, match=r"one entry per mesh axis: 2"):
        spec_from_plan(MESH, ((0, 1),))


def test_spec_from_an_explicit_shard_order() -> None:
    """A DTensor whose spec carries a shard order its plain Shards do not show."""
    cube = fmesh.make_mesh({"a": 2, "b": 3, "c": 4})
    plan = [(0, 1), None, (0, 1)]
    assert _spec_from_order(cube, plan, ((0, (2, 0)),)) == P(("c", "a"))
    with pytest.raises(MeshError, match=r"mixes strided shards with an explicit shard order"):
        _spec_from_order(cube, [(0, 4), None, (0, 1)], ((0, (2, 0)),))
    with pytest.raises(MeshError, match=r"shard order .* does not match its placements"):
        _spec_from_order(cube, plan, ((0, (2, 1)),))


# -- the plan against two independent models -----------------------------------------------


def jax_block(
    full: npt.NDArray[np.int64],
    sizes: dict[str, int],
    coord: dict[str, int],
    spec: tuple[tuple[str, ...], ...],
) -> npt.NDArray[np.int64]:
    """JAX: dim ``d`` named ``(a1..ak)`` -> block at the row-major index of the coords."""
    block = full
    for dim, names in enumerate(spec):
        index = 0
        for name in names:
            index = index * sizes[name] + coord[name]
        block = np.split(block, math.prod(sizes[n] for n in names), axis=dim)[index]
    return block


def dtensor_block(
    full: npt.NDArray[np.int64],
    sizes: tuple[int, ...],
    coord: tuple[int, ...],
    plan: tuple[tuple[int, int] | None, ...],
) -> npt.NDArray[np.int64]:
    """DTensor: placements applied left to right; a strided shard with factor ``sf``
    over ``n`` ranks keeps pieces ``j*n + c`` of ``sf*n`` (torch's ``_split_tensor``)."""
    block = full
    for axis, step in enumerate(plan):
        if step is None:
            continue
        dim, sf = step
        n = sizes[axis]
        pieces = np.split(block, sf * n, axis=dim)
        block = np.concatenate([pieces[j * n + coord[axis]] for j in range(sf)], axis=dim)
    return block


def _check_plan(
    sizes: tuple[int, ...], names: tuple[str, ...], dims: tuple[tuple[str, ...], ...]
) -> None:
    mesh = fmesh.make_mesh(sizes, names)
    spec = P(*dims)
    plan = plan_from_spec(mesh, spec, len(dims))
    shape = tuple(2 * math.prod(mesh.shape[n] for n in d) for d in dims)
    full = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    by_name = dict(zip(names, sizes))
    for coord in itertools.product(*(range(s) for s in sizes)):
        want = jax_block(full, by_name, dict(zip(names, coord)), dims)
        got = dtensor_block(full, sizes, coord, plan)
        np.testing.assert_array_equal(got, want, err_msg=f"{spec} {plan} at {coord}")


def test_plan_examples() -> None:
    cube = fmesh.make_mesh({"a": 2, "b": 3, "c": 4})
    assert plan_from_spec(cube, P("a", "c"), 2) == ((0, 1), None, (1, 1))
    assert plan_from_spec(cube, P(("a", "b", "c")), 1) == ((0, 1), (0, 1), (0, 1))
    # c first: a and b each see c's 4 shards before them.
    assert plan_from_spec(cube, P(("c", "a", "b")), 1) == ((0, 4), (0, 4), (0, 1))
    assert plan_from_spec(cube, P(("b", "c", "a")), 1) == ((0, 12), (0, 1), (0, 1))
    assert plan_from_spec(cube, P(None, ("c", "b")), 3) == (None, (1, 4), (1, 1))


def test_every_order_on_distinct_sizes() -> None:
    """All specs of 3 axes of sizes 2, 3, 4 over a 2-d tensor, exhaustively."""
    names = ("a", "b", "c")
    count = 0
    for assignment in itertools.product([None, 0, 1], repeat=3):
        groups = [[n for n, d in zip(names, assignment) if d == dim] for dim in (0, 1)]
        for orders in itertools.product(*(itertools.permutations(g) for g in groups)):
            _check_plan((2, 3, 4), names, tuple(tuple(o) for o in orders))
            count += 1
    assert count == 49


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_plan_matches_jax_rule(data: st.DataObject) -> None:
    sizes = data.draw(axis_sizes(max_axes=4, max_world=48))
    names = data.draw(axis_names(len(sizes)))
    ndim = data.draw(st.integers(1, 3))
    dims = data.draw(partition_specs(names, ndim))
    _check_plan(sizes, names, dims)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_spec_from_plan_inverts_the_plan(data: st.DataObject) -> None:
    sizes = data.draw(axis_sizes(max_axes=5, max_world=256))
    names = data.draw(axis_names(len(sizes)))
    ndim = data.draw(st.integers(1, 3))
    dims = data.draw(partition_specs(names, ndim))
    mesh = fmesh.make_mesh(sizes, names)
    spec = P(*dims)
    plan = plan_from_spec(mesh, spec, ndim)
    back = spec_from_plan(mesh, plan)
    # Same plan always (so the same sharding); the same spec when no axis has size 1
    # (a size-1 axis splits nothing, so its place in an entry is not recorded).
    assert plan_from_spec(mesh, back, ndim) == plan
    if 1 not in sizes:
        entries = list(spec)
        while entries and entries[-1] is None:
            entries.pop()
        assert back == P(*entries)
