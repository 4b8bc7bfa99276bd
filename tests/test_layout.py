"""The Layout algebra against brute-force enumeration of indices."""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter

import numpy as np
import pytest
from bruteforce import Model, is_layout_function, layout_values
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import divisors, factorizations, raw_modes, tiling_layouts

from fmesh import Layout, MeshError, UnrepresentableSplitError

Modes = tuple[tuple[int, ...], tuple[int, ...]]


def _is_canonical(layout: Layout) -> bool:
    modes = list(zip(layout.shape, layout.stride, strict=True))
    no_unit = all(s > 1 for s, _ in modes)
    no_merge = all(d0 != s1 * d1 for (_, d0), (s1, d1) in itertools.pairwise(modes))
    return no_unit and no_merge


@st.composite
def equivalent_modes(draw: st.DrawFn) -> tuple[Modes, Modes]:
    """Raw modes, and another spelling of the same function.

    The second splits modes ``(a*b):d`` into ``(a, b):(b*d, d)`` and inserts size-1
    modes with arbitrary strides -- the two rewrites canonical form must undo.
    """
    shape, stride = draw(raw_modes())
    out_shape: list[int] = []
    out_stride: list[int] = []
    for s, d in zip(shape, stride, strict=True):
        if draw(st.booleans()):
            out_shape.append(1)
            out_stride.append(draw(st.integers(0, 50)))
        a = draw(st.sampled_from(divisors(s)))
        out_shape += [a, s // a]
        out_stride += [(s // a) * d, d]
    if draw(st.booleans()):
        out_shape.append(1)
        out_stride.append(draw(st.integers(0, 50)))
    return (shape, stride), (tuple(out_shape), tuple(out_stride))


# -- canonical form -------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(raw_modes())
def test_of_computes_the_function_of_its_modes_in_canonical_form(modes: Modes) -> None:
    layout = Layout.of(*modes)
    values = layout_values(*modes)
    assert layout.values() == values
    assert [layout(c) for c in range(layout.size)] == values
    assert layout.size == len(values) == math.prod(modes[0])
    assert layout.cosize == max(values) + 1
    assert _is_canonical(layout)
    assert Layout(layout.shape, layout.stride) == layout  # canonical input is accepted


@settings(max_examples=200, deadline=None)
@given(equivalent_modes())
def test_equal_functions_compare_equal(pair: tuple[Modes, Modes]) -> None:
    (a, b) = pair
    assert layout_values(*a) == layout_values(*b)
    assert Layout.of(*a) == Layout.of(*b)
    assert hash(Layout.of(*a)) == hash(Layout.of(*b))


@settings(max_examples=200, deadline=None)
@given(raw_modes(), raw_modes())
def test_layouts_are_equal_exactly_when_their_values_are(a: Modes, b: Modes) -> None:
    same = layout_values(*a) == layout_values(*b)
    assert (Layout.of(*a) == Layout.of(*b)) == same


def test_of_merges_contiguous_modes_and_drops_size_one_modes() -> None:
    assert Layout.of((2, 4), (4, 1)) == Layout.of((8,))
    assert Layout.of((2, 1, 4), (4, 7, 1)).modes == ((8, 1),)
    assert Layout.of((2, 3), (6, 1)).modes == ((2, 6), (3, 1))  # a gap: not merged
    assert Layout.of((3, 2), (1, 3)).modes == ((3, 1), (2, 3))  # never sorted
    assert Layout.of(()) == Layout.of((1, 1), (5, 0)) == Layout((), ())
    assert Layout.of((2, 3)) == Layout.of((6,), (1,))  # row-major by default


def test_empty_layout() -> None:
    empty = Layout.of(())
    assert (empty.size, empty.cosize, empty.values(), empty(0)) == (1, 1, [0], 0)
    assert str(empty) == "():()" and repr(empty) == "Layout(():())"


def test_call_outside_the_layout_raises() -> None:
    layout = Layout.of((2, 3))
    with pytest.raises(MeshError, match=r"coordinate 6 is outside .* 0\.\.5"):
        layout(6)
    with pytest.raises(MeshError, match="coordinate -1 is outside"):
        layout(-1)


# -- complement and inverse digit rule --------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(tiling_layouts())
def test_complement_tiles_the_index_space(case: tuple[Layout, int]) -> None:
    layout, n = case
    bases = layout.complement(n).values()
    values = layout_values(layout.shape, layout.stride)
    assert bases == sorted(bases) and bases[0] == 0
    assert Counter(b + v for b in bases for v in values) == Counter(range(n))
    assert layout.size * layout.complement(n).size == n
    # The inverse digit rule: every index splits into (base, coordinate).
    for b in bases:
        for c, v in enumerate(values):
            assert layout.coordinate_of(b + v) == c
    assert layout.is_ascending == (values == sorted(values))


def test_complement_rejects_modes_that_overlap_or_do_not_tile() -> None:
    with pytest.raises(MeshError, match="overlap: stride 2 is not a multiple of 3"):
        Layout.of((2, 3), (2, 1)).complement(12)
    with pytest.raises(MeshError, match=r"span 4 indices.*index space of size 6"):
        Layout.of((4,)).complement(6)


# -- composition and split --------------------------------------------------------------


def _middle_axis_is_layout(values: list[int], size: int, step: int) -> bool:
    """Brute force: in the row-major split (rest, size, step) of ``values``, is the
    middle axis one strided layout?"""
    index = np.asarray(values, dtype=np.int64).reshape(1, -1, size, step)
    model = Model(("outer", "mid", "inner"), index, np.arange(max(values) + 1, dtype=np.int64))
    return model.axis_is_layout("mid")


@settings(max_examples=300, deadline=None)
@given(tiling_layouts(), st.data())
def test_compose_against_brute_force(case: tuple[Layout, int], data: st.DataObject) -> None:
    """compose(size, step) lists layout(k * step) for k < size, or refuses: because the
    step does not divide through the modes (the CuTe rule torch shares, checked in
    test_torch_layout.py), or because those values are no layout (brute force)."""
    layout, _ = case
    size = data.draw(st.integers(1, layout.size), label="size")
    most = (layout.size - 1) // (size - 1) if size > 1 else layout.size
    step = data.draw(st.integers(1, max(1, most)), label="step")
    values = layout_values(layout.shape, layout.stride)
    expected = [values[k * step] for k in range(size)]
    try:
        got = layout.compose(size, step)
    except UnrepresentableSplitError as err:
        assert size > 1  # size 1 is the empty layout
        if "coordinates are needed" in str(err):
            assert not is_layout_function(tuple(expected))
        else:
            assert re.search(r"step \d+ and mode size \d+ do not divide", str(err))
        return
    assert got.values() == expected


@settings(max_examples=300, deadline=None)
@given(tiling_layouts(), st.data())
def test_compose_accepts_every_axis_of_a_strided_split(
    case: tuple[Layout, int], data: st.DataObject
) -> None:
    """Where size*step divides the layout and the middle axis of the row-major split
    (rest, size, step) is one strided layout (brute force), compose returns it."""
    layout, _ = case
    size = data.draw(st.sampled_from(divisors(layout.size)), label="size")
    step = data.draw(st.sampled_from(divisors(layout.size // size)), label="step")
    values = layout_values(layout.shape, layout.stride)
    if _middle_axis_is_layout(values, size, step):
        got = layout.compose(size, step)
        assert got.values() == [values[k * step] for k in range(size)]


@settings(max_examples=300, deadline=None)
@given(tiling_layouts(), st.data())
def test_split_against_brute_force(case: tuple[Layout, int], data: st.DataObject) -> None:
    layout, n = case
    sizes = data.draw(factorizations(layout.size, max_parts=4), label="sizes")
    values = layout_values(layout.shape, layout.stride)
    index = np.asarray(values, dtype=np.int64).reshape((1, *sizes))
    names = tuple(f"s{i}" for i in range(len(sizes)))
    model = Model(names, index, np.arange(n, dtype=np.int64))
    if all(model.axis_is_layout(name) for name in names):
        parts = layout.split(sizes)
        assert tuple(p.size for p in parts) == sizes
        for axis, part in enumerate(parts):
            offsets = np.moveaxis(index, axis + 1, -1).reshape(-1, sizes[axis])[0]
            assert part.values() == [int(v) for v in offsets - offsets[0]]
        assert Layout.concat(parts) == layout
    else:
        with pytest.raises(UnrepresentableSplitError):
            layout.split(sizes)


@settings(max_examples=200, deadline=None)
@given(raw_modes(), raw_modes())
def test_concat_is_row_major_over_its_parts(a: Modes, b: Modes) -> None:
    got = Layout.concat([Layout.of(*a), Layout.of(*b)])
    assert got.values() == [x + y for x in layout_values(*a) for y in layout_values(*b)]
    assert got == Layout.of(a[0] + b[0], a[1] + b[1])


def test_design_example_cannot_split_into_three_two() -> None:
    # DESIGN.md: a flattened (2,3):(6,1) axis cannot be split into (3, 2)...
    layout = Layout.of((2, 3), (6, 1))
    message = r"\(2,3\):\(6,1\)\) o \(3:2\) is not a layout"
    with pytest.raises(UnrepresentableSplitError, match=message):
        layout.split((3, 2))
    # ...but (2, 3) gives back the two modes.
    assert layout.split((2, 3)) == (Layout.of((2,), (6,)), Layout.of((3,), (1,)))


def test_split_and_compose_check_their_arguments() -> None:
    layout = Layout.of((6,))
    with pytest.raises(MeshError, match=r"into \(2, 2\): their product is 4"):
        layout.split((2, 2))
    with pytest.raises(MeshError, match=r"sizes and steps >= 1, got \(-2, -3\)"):
        layout.split((-2, -3))
    with pytest.raises(TypeError, match=r"takes ints, got 2\.0 of type float"):
        layout.split((2.0, 3))  # type: ignore[arg-type]
    with pytest.raises(MeshError, match=r"Layout.compose\(\) takes sizes and steps >= 1"):
        layout.compose(0, 1)
    with pytest.raises(UnrepresentableSplitError, match="out of range"):
        layout.compose(2, 6)
    assert layout.compose(1, 6) == Layout.of(())
