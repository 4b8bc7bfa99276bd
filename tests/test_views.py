"""View checks (``same_ranks``, ``same_groups``) against groups listed by brute force."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from bruteforce import Model, model_of
from hypothesis import event, given, settings
from hypothesis import strategies as st
from strategies import (
    MeshSpec,
    Op,
    axis_names,
    build_chain,
    derived_specs,
    factorizations,
    op_chains,
)

import fmesh
from fmesh import AxisNotFoundError, make_mesh, same_groups, same_ranks


def expected_same_groups(a: Model, x: str, b: Model, y: str, ordered: bool) -> bool:
    if ordered:
        return set(a.groups(x)) == set(b.groups(y))
    return {frozenset(g) for g in a.groups(x)} == {frozenset(g) for g in b.groups(y)}


def expected_same_ranks(a: Model, b: Model) -> bool:
    return set(a.rank_map.tolist()) == set(b.rank_map.tolist())


def relisted(mesh: fmesh.Mesh, model: Model) -> tuple[fmesh.Mesh, Model]:
    """The same groups over a different index space: one row per instance, listed.

    A root mesh with a leading instance axis whose rank map lists ``instances(mesh)``
    (from the model, not fmesh), sliced down to the original axes.
    """
    ranks = model.ranks
    names = ("inst_", *model.names)
    sizes = tuple(int(s) for s in ranks.shape)
    root = make_mesh(sizes, names, ranks=ranks.reshape(-1).tolist())
    view = fmesh.slice(root, *model.names)
    root_model = Model.root(sizes, names, ranks.reshape(-1).tolist())
    return view, root_model.slice(model.names)


@st.composite
def other_roots(draw: st.DrawFn, spec: MeshSpec) -> MeshSpec:
    """Another root over a world of the same size: default ranks, a permutation of
    them, or the same ranks as ``spec``, with other axes."""
    n = spec.world
    sizes = draw(factorizations(n))
    names = draw(axis_names(len(sizes)))
    choice = draw(st.sampled_from(["default", "same ranks", "permutation"]))
    if choice == "default":
        return MeshSpec(sizes, names, "default", None)
    if choice == "same ranks":
        return MeshSpec(sizes, names, "permutation", tuple(spec.rank_list()))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return MeshSpec(sizes, names, "permutation", tuple(int(r) for r in rng.permutation(n)))


def check_pair(a: fmesh.Mesh, ma: Model, b: fmesh.Mesh, mb: Model) -> None:
    assert same_ranks(a, b) == same_ranks(b, a) == expected_same_ranks(ma, mb)
    for x in ma.names:
        for y in mb.names:
            for ordered in (True, False):
                expected = expected_same_groups(ma, x, mb, y, ordered)
                if expected:
                    event(f"same groups (ordered={ordered})")
                assert same_groups(a, x, b, y, ordered=ordered) == expected, (x, y, ordered)
                assert same_groups(b, y, a, x, ordered=ordered) == expected


@settings(max_examples=150, deadline=None)
@given(drawn=derived_specs(), data=st.data())
def test_views_of_one_root_match_brute_force(
    drawn: tuple[MeshSpec, tuple[Op, ...]], data: st.DataObject
) -> None:
    """Two chains from one root: they share the rank map (the O(modes) path)."""
    spec, chain = drawn
    other = data.draw(op_chains(spec))
    a, b = build_chain(spec, chain), build_chain(spec, other)
    check_pair(a, model_of(spec, chain), b, model_of(spec, other))


@settings(max_examples=150, deadline=None)
@given(drawn=derived_specs(), data=st.data())
def test_views_of_two_roots_match_brute_force(
    drawn: tuple[MeshSpec, tuple[Op, ...]], data: st.DataObject
) -> None:
    """A derived mesh against a root over the same number of ranks (either path)."""
    spec, chain = drawn
    second = data.draw(other_roots(spec))
    a = build_chain(spec, chain)
    check_pair(a, model_of(spec, chain), second.build(), model_of(second))


@settings(max_examples=100, deadline=None)
@given(drawn=derived_specs())
def test_relisted_views_have_the_same_groups(drawn: tuple[MeshSpec, tuple[Op, ...]]) -> None:
    """The same groups over another index space and rank map (the listing path)."""
    spec, chain = drawn
    a, ma = build_chain(spec, chain), model_of(spec, chain)
    b, mb = relisted(a, ma)
    check_pair(a, ma, b, mb)
    assert same_ranks(a, b)
    for name in a.axis_names:
        assert same_groups(a, name, b, name)


def test_dense_and_expert_views() -> None:
    dense = make_mesh({"dp": 2, "cp": 2, "tp": 4})
    expert = fmesh.rename(fmesh.flatten(dense, ("dp", "cp"), "ep"), {"tp": "etp"})
    assert same_ranks(dense, expert)
    assert same_groups(dense, "tp", expert, "etp")
    assert not same_groups(dense, "dp", expert, "ep")
    assert same_groups(fmesh.flatten(dense, ("dp", "cp")), "dp_cp", expert, "ep")
    # An expert view over the same ranks in another order: same members, other order.
    swapped = fmesh.flatten(dense, ("cp", "dp"), "ep")
    assert not same_groups(swapped, "ep", expert, "ep")
    assert same_groups(swapped, "ep", expert, "ep", ordered=False)


def test_different_worlds() -> None:
    assert not same_ranks(make_mesh({"a": 4}), make_mesh({"a": 8}))
    assert not same_ranks(make_mesh({"a": 4}), make_mesh({"a": 4}, ranks=[1, 2, 3, 4]))
    assert same_ranks(make_mesh({"a": 4}), make_mesh({"a": 4}, ranks=[3, 1, 2, 0]))
    assert not same_groups(
        make_mesh({"a": 4}), "a", make_mesh({"a": 4}, ranks=[1, 2, 3, 4]), "a"
    )


def test_huge_worlds_are_answered_from_layouts() -> None:
    """2**60 ranks: listing groups is impossible, so this passes only on the O(modes)
    path (no timing involved)."""
    big = make_mesh({"dp": 2**20, "cp": 2**20, "tp": 2**20})
    view = fmesh.unflatten(fmesh.flatten(big, ("dp", "cp")), "dp_cp", {"x": 2**20, "y": 2**20})
    assert same_ranks(big, view)
    assert same_groups(big, "tp", view, "tp")
    assert same_groups(big, "cp", view, "y")
    assert not same_groups(big, "cp", view, "x")
    assert math.prod(view.axis_sizes) == 2**60


def test_bad_arguments() -> None:
    m = make_mesh({"dp": 2, "tp": 4})
    with pytest.raises(TypeError, match=r"same_ranks\(\) needs an fmesh.Mesh as b, got dict"):
        same_ranks(m, {"dp": 2})  # type: ignore[arg-type]  # the wrong type on purpose
    with pytest.raises(TypeError, match=r"same_groups\(\) needs an fmesh.Mesh as a, got str"):
        same_groups("m", "dp", m, "dp")  # type: ignore[arg-type]  # on purpose
    with pytest.raises(
        AxisNotFoundError,
        match=re.escape("same_groups(): Mesh(dp=2, tp=4) has no axis 'ep'; valid axis names"),
    ):
        same_groups(m, "dp", m, "ep")
    with pytest.raises(TypeError, match=r"same_groups\(\) axis names must be str, got 0"):
        same_groups(m, 0, m, "dp")  # type: ignore[arg-type]  # on purpose
