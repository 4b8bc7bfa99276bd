"""``shrink`` and ``replace`` (elastic recovery, the pure part) against brute force.

The brute-force answer is an explicit numpy array of every instance's ranks: shrinking
deletes the dropped coordinates along the axis (``np.delete``), replacing substitutes
ranks in it. fmesh's results are checked rank for rank with ``tests/bruteforce.py``,
then transformed further (slice, flatten, unflatten, shrink again, JSON) and checked
again. No process group is involved.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable

import numpy as np
import numpy.typing as npt
import pytest
from bruteforce import Model, check_mesh, model_of
from cases import bad, case
from hypothesis import given, reject, settings
from hypothesis import strategies as st
from strategies import (
    Flatten,
    MeshSpec,
    Op,
    Rename,
    Slice,
    Unflatten,
    apply_op,
    build_chain,
    derived_specs,
    factorizations,
    lost_sets,
    ops,
    spare_maps,
)

import fmesh
from fmesh import AxisNotFoundError, Mesh, MeshError, make_mesh, replace, shrink

Array = npt.NDArray[np.int64]


def _derived(spec: MeshSpec, chain: tuple[Op, ...]) -> tuple[Mesh, Model]:
    return build_chain(spec, chain), model_of(spec, chain)


def _ranks(model: Model) -> tuple[int, ...]:
    """Every rank of every instance."""
    return tuple(int(r) for r in model.ranks.reshape(-1))


def _explicit(names: tuple[str, ...], ranks: Array) -> Model:
    """A model that is nothing but the ranks of every instance, in order."""
    index = np.arange(ranks.size, dtype=np.int64).reshape(ranks.shape)
    return Model(names, index, ranks.reshape(-1).astype(np.int64))


def _shrunk(model: Model, lost: Iterable[int], axis: str) -> Array | None:
    """Brute force: every instance without the coordinates along ``axis`` that hold a
    lost rank (``None`` when none would remain)."""
    pos = 1 + model.axis(axis)
    where = model.locations()
    dropped = sorted({where[r][pos] for r in lost})
    if len(dropped) == model.ranks.shape[pos]:
        return None
    return np.delete(model.ranks, dropped, axis=pos)


def _check_family(mesh: Mesh, names: tuple[str, ...], ranks: Array) -> None:
    """``check_mesh`` against explicit instances given in any order.

    Slicing an explicit model numbers its new instances by its own index space, not
    fmesh's; match instances by their first rank (unique) before comparing.
    """
    got = fmesh.instances(mesh)
    assert got.shape == ranks.shape
    position = {int(r): k for k, r in enumerate(ranks.reshape(ranks.shape[0], -1)[:, 0])}
    order = [position[int(r)] for r in got.reshape(got.shape[0], -1)[:, 0]]
    check_mesh(mesh, _explicit(names, ranks[order]))


def _container(lost: frozenset[int], kind: str) -> Iterable[int]:
    """The same lost ranks in each shape a caller may hand them over."""
    if kind == "list":
        return sorted(lost, reverse=True)
    if kind == "tuple":
        return tuple(lost)
    if kind == "set":
        return set(lost)
    if kind == "generator":
        return (r for r in sorted(lost))
    if kind == "array":
        return list(np.asarray(sorted(lost), dtype=np.int64))
    return lost


# -- shrink ------------------------------------------------------------------------------


@settings(max_examples=120, deadline=None)
@given(drawn=derived_specs(), data=st.data())
def test_shrink_matches_brute_force(
    drawn: tuple[MeshSpec, tuple[Op, ...]], data: st.DataObject
) -> None:
    """Random meshes (custom rank orders, subsets of a world, sliced, flattened,
    unflattened), random axes and lost sets: every rank's coordinate, groups and
    instance, and the instances in order."""
    mesh, model = _derived(*drawn)
    axis = data.draw(st.sampled_from(mesh.axis_names), label="axis")
    lost = data.draw(lost_sets(_ranks(model)), label="lost")
    kind = data.draw(
        st.sampled_from(["frozenset", "set", "list", "tuple", "generator", "array"])
    )
    expected = _shrunk(model, lost, axis)
    if not lost:
        assert shrink(mesh, _container(lost, kind), axis=axis) is mesh
        return
    if expected is None:
        with pytest.raises(MeshError, match="so nothing would remain"):
            shrink(mesh, _container(lost, kind), axis=axis)
        return
    shrunk = shrink(mesh, _container(lost, kind), axis=axis)
    assert shrunk.axis_names == mesh.axis_names
    assert shrunk.num_instances == mesh.num_instances
    assert np.array_equal(fmesh.instances(shrunk), expected)  # order kept, too
    check_mesh(shrunk, _explicit(mesh.axis_names, expected))
    for r in lost:
        assert fmesh.coordinate(shrunk, r) is None


@st.composite
def _survivable(
    draw: st.DrawFn, mesh: Mesh, model: Model
) -> tuple[str, frozenset[int], Array]:
    """An axis and a non-empty lost set that leave something, with the brute force."""
    axis = draw(st.sampled_from([n for n, s in mesh.shape.items() if s > 1] or [""]))
    if not axis:
        reject()
    lost = draw(lost_sets(_ranks(model), min_lost=1))
    expected = _shrunk(model, lost, axis)
    if expected is None:
        reject()
    assert expected is not None
    return axis, lost, expected


@settings(max_examples=80, deadline=None)
@given(drawn=derived_specs(), data=st.data())
def test_shrink_commutes_with_operations_on_other_axes(
    drawn: tuple[MeshSpec, tuple[Op, ...]], data: st.DataObject
) -> None:
    """op(shrink(m)) == shrink(op(m)) as values, for a slice that keeps the axis, a
    flatten or unflatten of other axes, and any rename."""
    mesh, model = _derived(*drawn)
    axis, lost, _ = data.draw(_survivable(mesh, model))
    op = data.draw(ops(mesh.axis_names, mesh.axis_sizes), label="op")
    if isinstance(op, Slice):
        op = Slice(op.names if axis in op.names else (*op.names, axis))
    if isinstance(op, Flatten | Unflatten):
        touched = op.names if isinstance(op, Flatten) else (op.axis,)
        if axis in touched:
            op = Slice(mesh.axis_names)
    renamed = dict(op.mapping).get(axis, axis) if isinstance(op, Rename) else axis
    try:
        after = apply_op(mesh, op)
    except fmesh.UnrepresentableSplitError:
        with pytest.raises(fmesh.UnrepresentableSplitError):
            apply_op(shrink(mesh, lost, axis=axis), op)
        return
    assert apply_op(shrink(mesh, lost, axis=axis), op) == shrink(after, lost, axis=renamed)


@settings(max_examples=60, deadline=None)
@given(drawn=derived_specs(), data=st.data())
def test_shrinking_twice_drops_the_union(
    drawn: tuple[MeshSpec, tuple[Op, ...]], data: st.DataObject
) -> None:
    mesh, model = _derived(*drawn)
    axis, first, expected = data.draw(_survivable(mesh, model))
    once = shrink(mesh, first, axis=axis)
    more = data.draw(lost_sets(tuple(int(r) for r in expected.reshape(-1))), label="more")
    if _shrunk(_explicit(mesh.axis_names, expected), more, axis) is None:
        with pytest.raises(MeshError, match="nothing would remain"):
            shrink(once, more, axis=axis)
        return
    assert shrink(once, more, axis=axis) == shrink(mesh, first | more, axis=axis)
    if more:
        with pytest.raises(MeshError, match="not in"):
            shrink(once, first | more, axis=axis)  # the first lost ranks are gone


@settings(max_examples=80, deadline=None)
@given(drawn=derived_specs(max_ops=2), data=st.data())
def test_shrunk_meshes_compose(
    drawn: tuple[MeshSpec, tuple[Op, ...]], data: st.DataObject
) -> None:
    """A shrunk mesh can be sliced, flattened, unflattened, renamed, shrunk again and
    round-tripped through JSON; each step matches the brute force."""
    mesh, model = _derived(*drawn)
    axis, lost, expected = data.draw(_survivable(mesh, model))
    current = shrink(mesh, lost, axis=axis)
    explicit = _explicit(mesh.axis_names, expected)
    for _ in range(data.draw(st.integers(1, 3), label="steps")):
        assert Mesh.from_json(current.to_json()) == current
        if data.draw(st.booleans(), label="shrink again"):
            again = data.draw(st.sampled_from(current.axis_names), label="axis")
            more = data.draw(lost_sets(_ranks(explicit), min_lost=1), label="lost")
            left = _shrunk(explicit, more, again)
            if left is None:
                with pytest.raises(MeshError, match="nothing would remain"):
                    shrink(current, more, axis=again)
                continue
            current = shrink(current, more, axis=again)
            explicit = _explicit(current.axis_names, left)
        else:
            op = data.draw(ops(current.axis_names, current.axis_sizes), label="op")
            try:
                current = apply_op(current, op)
            except fmesh.UnrepresentableSplitError:
                continue
            explicit = explicit.apply(op)
        _check_family(current, explicit.names, explicit.ranks)
    assert Mesh.from_json(current.to_json()) == current


@settings(max_examples=60, deadline=None)
@given(drawn=derived_specs(), data=st.data())
def test_the_shrunk_axis_unflattens_any_way(
    drawn: tuple[MeshSpec, tuple[Op, ...]], data: st.DataObject
) -> None:
    """The shrunk axis is one mode, so every split of it is a layout."""
    mesh, model = _derived(*drawn)
    axis, lost, expected = data.draw(_survivable(mesh, model))
    shrunk = shrink(mesh, lost, axis=axis)
    sizes = data.draw(factorizations(shrunk.shape[axis]))
    new = tuple(f"{axis}{k}" for k in range(len(sizes)))
    split = fmesh.unflatten(shrunk, axis, dict(zip(new, sizes, strict=True)))
    pos = mesh.axis_names.index(axis)
    check_mesh(
        split,
        _explicit(
            split.axis_names,
            expected.reshape((*expected.shape[: pos + 1], *sizes, *expected.shape[pos + 2 :])),
        ),
    )


def test_shrink_examples() -> None:
    m = make_mesh({"dp": 4, "tp": 2})
    assert shrink(m, [3, 5], axis="dp") == make_mesh({"dp": 2, "tp": 2}, ranks=[0, 1, 6, 7])
    # Dropping the last slice leaves the identity: no rank map.
    assert shrink(m, {7}, axis="dp") == make_mesh({"dp": 3, "tp": 2})
    assert shrink(m, {1}, axis="tp") == make_mesh({"dp": 4, "tp": 1}, ranks=[0, 2, 4, 6])
    assert shrink(m, frozenset(), axis="tp") is m
    # Several instances lose the same slice: rank 1 goes with lost rank 5.
    tp = fmesh.slice(make_mesh({"dp": 2, "tp": 4}), "tp")
    assert fmesh.instances(shrink(tp, {5}, axis="tp")).tolist() == [[0, 2, 3], [4, 6, 7]]
    # A flattened axis of two modes around another axis: (2,3):(6,1) with b=(2):(3).
    ac = fmesh.flatten(make_mesh({"a": 2, "b": 2, "c": 3}), ("a", "c"), "ac")
    out = shrink(ac, {7}, axis="ac")
    assert fmesh.group(out, "ac", 0) == (0, 1, 2, 6, 8)
    assert fmesh.group(out, "b", 0) == (0, 3)
    assert out.axes[0] == fmesh.Layout.of((5,), (2,))


def test_shrink_at_scale_is_fast() -> None:
    mesh = make_mesh({"pp": 16, "dp": 256, "cp": 4, "tp": 8})  # 2**17 ranks
    start = time.perf_counter()
    out = shrink(mesh, {70001, 5, 131071}, axis="dp")
    elapsed = time.perf_counter() - start
    assert out.shape == {"pp": 16, "dp": 253, "cp": 4, "tp": 8}
    assert fmesh.coordinate(out, 70002) is None and fmesh.coordinate(out, 6) is None
    assert fmesh.group(out, "dp", 32)[:2] == (32, 64)
    assert elapsed < 5, elapsed


# -- replace -----------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(drawn=derived_specs(), data=st.data())
def test_replace_matches_brute_force(
    drawn: tuple[MeshSpec, tuple[Op, ...]], data: st.DataObject
) -> None:
    mesh, model = _derived(*drawn)
    spares = data.draw(spare_maps(_ranks(model)), label="spares")
    out = replace(mesh, spares)
    if not spares:
        assert out is mesh
        return
    assert (out.axis_names, out.axes, out.index_size) == (
        mesh.axis_names,
        mesh.axes,
        mesh.index_size,
    )
    rank_map = np.asarray([spares.get(int(r), int(r)) for r in model.rank_map])
    check_mesh(out, Model(model.names, model.index, rank_map))
    back = replace(out, {new: old for old, new in spares.items()})
    assert back == mesh
    assert Mesh.from_json(out.to_json()) == out


@settings(max_examples=60, deadline=None)
@given(drawn=derived_specs(), data=st.data())
def test_replace_and_shrink_commute(
    drawn: tuple[MeshSpec, tuple[Op, ...]], data: st.DataObject
) -> None:
    mesh, model = _derived(*drawn)
    axis, lost, _ = data.draw(_survivable(mesh, model))
    spares = data.draw(spare_maps(_ranks(model)), label="spares")
    shrunk = shrink(mesh, lost, axis=axis)
    kept = {o: n for o, n in spares.items() if fmesh.coordinate(shrunk, o) is not None}
    left = replace(shrunk, kept)
    right = shrink(replace(mesh, spares), {spares.get(r, r) for r in lost}, axis=axis)
    assert left == right


def test_replace_examples() -> None:
    m = make_mesh({"dp": 2, "tp": 2})
    assert replace(m, {1: 8, 2: 9}) == make_mesh({"dp": 2, "tp": 2}, ranks=[0, 8, 9, 3])
    assert replace(m, {1: 2, 2: 1}) == make_mesh({"dp": 2, "tp": 2}, ranks=[0, 2, 1, 3])
    assert replace(m, {1: 2, 2: 3, 3: 1}).rank_map == (0, 2, 3, 1)
    assert replace(m, {1: 1}) == m
    assert replace(m, {}) is m
    # A rank of another instance is in the mesh too.
    dp = fmesh.slice(make_mesh({"dp": 2, "tp": 2}), "dp")
    assert fmesh.instances(replace(dp, {3: 4})).tolist() == [[0, 2], [1, 4]]
    # Hot spares after a loss: the lost rank's place goes to a spare.
    big = make_mesh({"dp": 2, "tp": 4}, ranks=range(8))
    out = replace(big, {5: 8})
    assert fmesh.group(out, "tp", 8) == (4, 8, 6, 7)
    assert fmesh.group(out, "dp", 8) == (1, 8)


# -- errors ------------------------------------------------------------------------------

M = make_mesh({"dp": 2, "tp": 4})
R = make_mesh({"dp": 2, "tp": 2}, ranks=[10, 11, 12, 13])


ERRORS = [
    case(
        lambda: shrink(bad("mesh"), {1}, axis="dp"),
        TypeError,
        r"^shrink\(\) needs an fmesh.Mesh, got str$",
        "shrink not a mesh",
    ),
    case(
        lambda: shrink(M, bad(3), axis="dp"),
        TypeError,
        r"collection of int, got 3; write e\.g\. shrink\(mesh, \{3, 5\}, axis='dp'\)",
        "shrink one int",
    ),
    case(
        lambda: shrink(M, bad("3"), axis="dp"),
        TypeError,
        r"collection of int, got '3'",
        "shrink string",
    ),
    case(
        lambda: shrink(M, bad({3: 4}), axis="dp"),
        TypeError,
        r"collection of int, got \{3: 4\}",
        "shrink mapping",
    ),
    case(
        lambda: shrink(M, bad([1.0]), axis="dp"),
        TypeError,
        r"lost rank must be int, got 1\.0 of type float",
        "shrink float rank",
    ),
    case(
        lambda: shrink(M, bad([True]), axis="dp"),
        TypeError,
        r"lost rank must be int, got True of type bool",
        "shrink bool rank",
    ),
    case(
        lambda: shrink(M, [-1], axis="dp"),
        MeshError,
        r"shrink\(\) got lost rank -1; global ranks are >= 0",
        "shrink negative",
    ),
    case(
        lambda: shrink(M, [9, 3, 8], axis="dp"),
        MeshError,
        re.escape(
            "shrink(): lost ranks [8, 9] are not in Mesh(dp=2, tp=4), which covers "
            "ranks 0..7; pass only the lost ranks this mesh holds, e.g. "
            "{r for r in lost if fmesh.coordinate(mesh, r) is not None}"
        ),
        "shrink ranks not in mesh",
    ),
    case(
        lambda: shrink(R, [0], axis="dp"),
        MeshError,
        r"lost rank 0 is not in .* which covers the 4 ranks in its rank_map",
        "shrink rank not in rank map",
    ),
    case(
        lambda: shrink(M, range(100, 120), axis="dp"),
        MeshError,
        re.escape("[100, 101, 102, 103, 104, 105, 106, ..., 119] (20 in all)"),
        "shrink long list elided",
    ),
    case(
        lambda: shrink(M, {1, 6}, axis="dp"),
        MeshError,
        re.escape(
            "shrink(): every slice along axis 'dp' of Mesh(dp=2, tp=4) holds a lost rank "
            "(lost ranks [1, 6] sit at dp coordinates [0, 1] of 2), so nothing would "
            "remain; shrink along another axis, or give the lost ranks hot spares with "
            "fmesh.replace"
        ),
        "shrink nothing remains",
    ),
    case(
        lambda: shrink(make_mesh({"dp": 1, "tp": 2}), {1}, axis="dp"),
        MeshError,
        r"every slice along axis 'dp' .* coordinates \[0\] of 1\)",
        "shrink size-1 axis",
    ),
    case(
        lambda: shrink(M, {1}, axis="pp"),
        AxisNotFoundError,
        re.escape(
            "shrink(): Mesh(dp=2, tp=4) has no axis 'pp'; valid axis names are ['dp', 'tp']"
        ),
        "shrink unknown axis",
    ),
    case(
        lambda: shrink(M, {1}, axis=bad(0)),
        TypeError,
        r"shrink\(\) axis names must be str, got 0 of type int",
        "shrink axis not str",
    ),
    case(
        lambda: bad(shrink)(M, {1}, "dp"),
        TypeError,
        r"positional argument",
        "shrink axis positional",
    ),
    case(
        lambda: replace(bad(None), {1: 9}),
        TypeError,
        r"^replace\(\) needs an fmesh.Mesh, got NoneType$",
        "replace not a mesh",
    ),
    case(
        lambda: replace(M, bad([(1, 9)])),
        TypeError,
        re.escape(
            "replace() takes a mapping old rank -> spare rank, got [(1, 9)]; write "
            "e.g. replace(mesh, {3: 8, 5: 9})"
        ),
        "replace pairs",
    ),
    case(
        lambda: replace(M, bad({"1": 9})),
        TypeError,
        r"replace\(\) old rank must be int, got '1' of type str",
        "replace str old",
    ),
    case(
        lambda: replace(M, bad({1: 9.0})),
        TypeError,
        r"replace\(\) spare rank must be int, got 9\.0 of type float",
        "replace float spare",
    ),
    case(
        lambda: replace(M, bad({1: False})),
        TypeError,
        r"spare rank must be int, got False of type bool",
        "replace bool spare",
    ),
    case(
        lambda: replace(M, {-2: 9}),
        MeshError,
        r"replace\(\) got old rank -2; global ranks are >= 0",
        "replace negative old",
    ),
    case(
        lambda: replace(M, {1: -9}),
        MeshError,
        r"replace\(\) got spare rank -9; global ranks are >= 0",
        "replace negative spare",
    ),
    case(
        lambda: replace(M, {1: 9, 12: 10, 11: 13}),
        MeshError,
        re.escape(
            "replace(): ranks [11, 12] are not in Mesh(dp=2, tp=4), which covers "
            "ranks 0..7; only ranks of the mesh can be replaced"
        ),
        "replace old not in mesh",
    ),
    case(
        lambda: replace(M, {1: 9, 5: 9}),
        MeshError,
        re.escape(
            "replace(): spare rank 9 is given to ranks 1 and 5; give each replaced "
            "rank its own spare"
        ),
        "replace duplicate spare",
    ),
    case(
        lambda: replace(M, {1: 6}),
        MeshError,
        re.escape(
            "replace(): spare rank 6 (for rank 1) is already in Mesh(dp=2, tp=4) at "
            "(dp=1, tp=2) and is not replaced itself, so the mesh would hold it twice; a "
            "spare must be a rank outside the mesh, or be replaced in the same call "
            "(e.g. {3: 5, 5: 3} swaps two ranks)"
        ),
        "replace spare in mesh",
    ),
    case(
        lambda: replace(fmesh.slice(M, "dp"), {1: 2}),
        MeshError,
        r"spare rank 2 \(for rank 1\) is already in .* at \(dp=0\)",
        "replace spare in another instance",
    ),
]


@pytest.mark.parametrize(("call", "error", "match"), ERRORS)
def test_bad_input_raises(
    call: Callable[[], object], error: type[BaseException], match: str
) -> None:
    with pytest.raises(error, match=match):
        call()


def test_errors_are_mesh_errors_and_axis_errors_key_errors() -> None:
    with pytest.raises(KeyError):
        shrink(M, {1}, axis="pp")
    with pytest.raises(ValueError):
        replace(M, {1: 6})
