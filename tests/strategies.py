"""Hypothesis strategies for fmesh's pure core: root meshes, layouts, operation chains.

Strategies produce plain descriptions (:class:`MeshSpec`, the ``Op`` dataclasses)
rather than fmesh objects, so each test can build both the fmesh value and its
independent brute-force model (``tests/bruteforce.py``) from the same draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st

import fmesh

MAX_WORLD = 256
"""Largest number of ranks in a drawn root mesh."""
MAX_AXES = 6
"""Most axes a mesh may reach in an operation chain (unflatten adds axes)."""
NAME_POOL = ("a", "b", "c", "d", "e", "f", "g", "h", "dp", "tp", "cp", "pp", "ep", "x")
RANK_KINDS = (
    "default",  # make_mesh(sizes, names)
    "mapping",  # make_mesh({name: size})
    "identity",  # make_mesh(..., ranks=range(n)) -- must equal the default mesh
    "permutation",  # make_mesh(..., ranks=<permutation of range(n)>)
    "subset",  # make_mesh(..., ranks=<n distinct ranks of a larger world, any order>)
    "from_ranks",  # Mesh.from_ranks(<n-d array of a permutation or subset>)
)


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class MeshSpec:
    """How to build a root mesh: sizes, names and the global rank of each position."""

    sizes: tuple[int, ...]
    names: tuple[str, ...]
    kind: str
    ranks: tuple[int, ...] | None
    """Global ranks in row-major order, ``None`` for ranks ``0..n-1``."""

    @property
    def world(self) -> int:
        return math.prod(self.sizes)

    def rank_list(self) -> list[int]:
        """Global rank of each row-major position (what the brute-force model uses)."""
        return list(range(self.world)) if self.ranks is None else list(self.ranks)

    def build(self) -> fmesh.Mesh:
        """The fmesh mesh, built through the constructor ``kind`` names."""
        if self.kind == "default":
            return fmesh.make_mesh(self.sizes, self.names)
        if self.kind == "mapping":
            return fmesh.make_mesh(dict(zip(self.names, self.sizes, strict=True)))
        assert self.ranks is not None
        if self.kind == "from_ranks":
            array: npt.NDArray[np.int64] = np.asarray(self.ranks, dtype=np.int64)
            return fmesh.Mesh.from_ranks(array.reshape(self.sizes), self.names)
        return fmesh.make_mesh(self.sizes, self.names, ranks=list(self.ranks))


@st.composite
def axis_sizes(
    draw: st.DrawFn,
    min_axes: int = 1,
    max_axes: int = 5,
    max_world: int = MAX_WORLD,
    composite: bool = False,
) -> tuple[int, ...]:
    """1-5 axis sizes in 1..8 (size 1 included) whose product is at most ``max_world``.

    With ``composite``, sizes favour 2, 3, 4, 6, whose mixed factors make splits that
    cross mode boundaries (the interesting unflatten cases).
    """
    count = draw(st.integers(min_axes, max_axes))
    sizes: list[int] = []
    for _ in range(count):
        budget = max_world // math.prod(sizes)
        if composite:
            sizes.append(draw(st.sampled_from([s for s in (2, 3, 4, 6, 1) if s <= budget])))
        else:
            sizes.append(draw(st.integers(1, min(8, budget))))
    return tuple(sizes)


def axis_names(count: int) -> st.SearchStrategy[tuple[str, ...]]:
    """``count`` distinct names from the pool, in random order."""
    return st.permutations(NAME_POOL).map(lambda p: tuple(p[:count]))


@st.composite
def mesh_specs(
    draw: st.DrawFn, kinds: tuple[str, ...] = RANK_KINDS, composite: bool = False
) -> MeshSpec:
    """A root mesh: identity or custom rank order, possibly a subset of a larger world."""
    sizes = draw(axis_sizes(composite=composite))
    names = draw(axis_names(len(sizes)))
    kind = draw(st.sampled_from(kinds))
    n = math.prod(sizes)
    ranks: tuple[int, ...] | None = None
    if kind == "identity":
        ranks = tuple(range(n))
    elif kind != "default" and kind != "mapping":
        # A seeded shuffle: drawing a 256-element permutation choice by choice would
        # overrun Hypothesis's buffer.
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
        extra = 0 if kind == "permutation" else draw(st.integers(0, n + 3), label="extra")
        ranks = tuple(int(r) for r in rng.permutation(n + extra)[:n])
    return MeshSpec(sizes, names, kind, ranks)


# -- operation chains -------------------------------------------------------------------


@dataclass(frozen=True)
class Slice:
    names: tuple[str, ...]


@dataclass(frozen=True)
class Flatten:
    names: tuple[str, ...]
    name: str | None


@dataclass(frozen=True)
class Unflatten:
    axis: str
    sizes: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Rename:
    mapping: tuple[tuple[str, str], ...]


Op = Slice | Flatten | Unflatten | Rename


def apply_op(mesh: fmesh.Mesh, op: Op) -> fmesh.Mesh:
    """Apply ``op`` with fmesh's public functions."""
    if isinstance(op, Slice):
        return fmesh.slice(mesh, *op.names)
    if isinstance(op, Flatten):
        return fmesh.flatten(mesh, op.names, op.name)
    if isinstance(op, Unflatten):
        return fmesh.unflatten(mesh, op.axis, dict(op.sizes))
    return fmesh.rename(mesh, dict(op.mapping))


@st.composite
def factorizations(draw: st.DrawFn, n: int, max_parts: int = 3) -> tuple[int, ...]:
    """An ordered factorization of ``n`` into 1..max_parts factors (1s allowed)."""
    # Two or three parts first: one-part splits are trivial.
    parts = draw(st.sampled_from([p for p in (2, 3, 1) if p <= max(1, max_parts)]))
    out: list[int] = []
    rest = n
    for _ in range(parts - 1):
        # Proper divisors first (Hypothesis favours early choices), then 1 and rest.
        proper = [d for d in divisors(rest) if 1 < d < rest]
        d = draw(st.sampled_from([*proper, 1, rest] if rest > 1 else [1]))
        out.append(d)
        rest //= d
    out.append(rest)
    return tuple(out)


def _fresh_names(taken: set[str], count: int) -> st.SearchStrategy[tuple[str, ...]]:
    """``count`` distinct names not in ``taken`` (extra ``n<i>`` names: never runs dry)."""
    pool = [n for n in (*NAME_POOL, *(f"n{i}" for i in range(count))) if n not in taken]
    return st.permutations(pool).map(lambda p: tuple(p[:count]))


@st.composite
def ops(draw: st.DrawFn, names: tuple[str, ...], sizes: tuple[int, ...]) -> Op:
    """One valid operation on a mesh with these axis names and sizes.

    Valid means fmesh must accept it, except that an unflatten split may be
    unrepresentable (tests check that case against a brute-force oracle).
    """
    ndim = len(names)
    kinds = ["slice", "flatten", "rename"]
    if ndim < MAX_AXES:
        kinds.append("unflatten")
    kind = draw(st.sampled_from(kinds))
    if kind == "slice":
        count = draw(st.integers(1, ndim))
        return Slice(tuple(draw(st.permutations(names))[:count]))
    if kind == "flatten":
        count = draw(st.integers(1, ndim))
        chosen = tuple(draw(st.permutations(names))[:count])
        kept = {n for n in names if n not in chosen}
        if "_".join(chosen) not in kept and len("_".join(chosen)) < 24 and draw(st.booleans()):
            return Flatten(chosen, None)
        return Flatten(chosen, draw(_fresh_names(kept, 1))[0])
    if kind == "unflatten":
        pos = draw(st.integers(0, ndim - 1))
        split = draw(factorizations(sizes[pos], max_parts=min(3, MAX_AXES - ndim + 1)))
        others = {n for n in names if n != names[pos]}
        new = draw(_fresh_names(others, len(split)))
        return Unflatten(names[pos], tuple(zip(new, split, strict=True)))
    count = draw(st.integers(1, ndim))
    chosen = tuple(draw(st.permutations(names))[:count])
    kept = {n for n in names if n not in chosen}
    targets = draw(_fresh_names(kept, count))
    return Rename(tuple(zip(chosen, targets, strict=True)))


# -- layouts ----------------------------------------------------------------------------


@st.composite
def raw_modes(
    draw: st.DrawFn, max_modes: int = 4, max_size: int = 6, max_stride: int = 40
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Arbitrary (not necessarily canonical or injective) modes with positive strides."""
    count = draw(st.integers(0, max_modes))
    shape = tuple(draw(st.integers(1, max_size)) for _ in range(count))
    stride = tuple(draw(st.integers(1, max_stride)) for _ in range(count))
    return shape, stride


@st.composite
def tiling_layouts(draw: st.DrawFn, max_world: int = MAX_WORLD) -> tuple[fmesh.Layout, int]:
    """A layout that tiles an index space, and that space's size.

    Built as a random subset of the modes of a random row-major mode list, kept in
    a random order: the shape of every axis layout a mesh can hold.
    """
    sizes = draw(axis_sizes(min_axes=1, max_axes=5, max_world=max_world))
    strides = [math.prod(sizes[i + 1 :]) for i in range(len(sizes))]
    modes = list(zip(sizes, strides, strict=True))
    chosen = draw(st.permutations(modes))[: draw(st.integers(0, len(modes)))]
    shape = tuple(s for s, _ in chosen)
    stride = tuple(d for _, d in chosen)
    return fmesh.Layout.of(shape, stride), math.prod(sizes)


# -- partition specs ----------------------------------------------------------------------


@st.composite
def partition_specs(
    draw: st.DrawFn, names: tuple[str, ...], ndim: int
) -> tuple[tuple[str, ...], ...]:
    """A spec for an ``ndim`` tensor as plain tuples, one per dim (major to minor):
    each axis of ``names`` splits one dim or none, in a random order."""
    order = draw(st.permutations(names))
    dims: list[list[str]] = [[] for _ in range(ndim)]
    for name in order:
        dim = draw(st.integers(-1, ndim - 1))
        if dim >= 0:
            dims[dim].append(name)
    return tuple(tuple(d) for d in dims)


@st.composite
def op_chains(draw: st.DrawFn, spec: MeshSpec, max_ops: int = 3) -> tuple[Op, ...]:
    """Operations to apply in turn to the root of ``spec`` (refused unflattens dropped)."""
    mesh = spec.build()
    chain: list[Op] = []
    for _ in range(draw(st.integers(0, max_ops), label="chain length")):
        op = draw(ops(mesh.axis_names, mesh.axis_sizes))
        try:
            mesh = apply_op(mesh, op)
        except fmesh.UnrepresentableSplitError:
            continue
        chain.append(op)
    return tuple(chain)


@st.composite
def derived_specs(
    draw: st.DrawFn, kinds: tuple[str, ...] = RANK_KINDS, max_ops: int = 3
) -> tuple[MeshSpec, tuple[Op, ...]]:
    """A root mesh and a chain of operations on it (unflattens fmesh refuses are dropped).

    Tests build both the fmesh mesh (:func:`build_chain`) and the brute-force model
    from the same description.
    """
    spec = draw(mesh_specs(kinds))
    return spec, draw(op_chains(spec, max_ops))


def build_chain(spec: MeshSpec, chain: tuple[Op, ...]) -> fmesh.Mesh:
    """The fmesh mesh of a :func:`derived_specs` draw."""
    mesh = spec.build()
    for op in chain:
        mesh = apply_op(mesh, op)
    return mesh


@st.composite
def hybrid_shapes(
    draw: st.DrawFn, max_axes: int = 4, max_world: int = MAX_WORLD
) -> tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]:
    """Axis names, intra-host sizes and inter-host sizes for ``make_hybrid_mesh``."""
    count = draw(st.integers(1, max_axes))
    names = draw(axis_names(count))
    intra: list[int] = []
    inter: list[int] = []
    for _ in range(count):
        budget = max_world // (math.prod(intra) * math.prod(inter))
        intra.append(draw(st.integers(1, max(1, min(4, budget)))))
        budget = max_world // (math.prod(intra) * math.prod(inter))
        inter.append(draw(st.integers(1, max(1, min(4, budget)))))
    return names, tuple(intra), tuple(inter)


# -- elastic: lost ranks and hot spares ---------------------------------------------------


@st.composite
def lost_sets(
    draw: st.DrawFn, ranks: tuple[int, ...], min_lost: int = 0, max_lost: int = 4
) -> frozenset[int]:
    """A few ranks of a mesh (``ranks``: all of them, every instance); none when
    ``min_lost`` is 0 and Hypothesis says so."""
    drawn = st.lists(st.sampled_from(ranks), min_size=min_lost, max_size=max_lost)
    return frozenset(draw(drawn))


@st.composite
def spare_maps(
    draw: st.DrawFn, ranks: tuple[int, ...], max_replaced: int = 4
) -> dict[int, int]:
    """A valid ``replace`` mapping for a mesh holding ``ranks``: each old rank gets a
    fresh spare (outside the mesh) or another replaced rank (swaps and cycles)."""
    olds = draw(st.lists(st.sampled_from(ranks), max_size=max_replaced, unique=True))
    start = max(ranks) + 1 + draw(st.integers(0, 3), label="gap")
    fresh = [start + k for k in range(len(olds))]
    targets = draw(st.permutations([*olds, *fresh]))[: len(olds)]
    return dict(zip(olds, targets, strict=True))
