"""Which ranks to plan: ``--rank sample:K`` spreads K ranks over the world. Pure."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from .._core.mesh import Mesh
from .._core.queries import rank_at

__all__ = ["spread"]


def spread(world: int, meshes: Sequence[Mesh], count: int) -> tuple[int, ...]:
    """``count`` ranks spread over a world of ``world`` ranks: the first, the last, then
    along the diagonal of each mesh in turn (a rank at coordinate ``i * size // n`` on
    every axis), so that each axis of each mesh is seen at as many distinct
    coordinates as fit (all of them once ``count`` exceeds the largest axis).

    The meshes are the ones the first rank built (they cover the world alike on every
    rank when the code is SPMD).

    >>> import fmesh
    >>> spread(16, [fmesh.make_mesh({"dp": 4, "tp": 4})], 6)
    (0, 15, 10, 5, 7, 3)
    >>> spread(8, [], 3)
    (0, 7, 3)
    """
    chosen: dict[int, None] = dict.fromkeys([0, world - 1][: max(count, 0)])
    diagonals = [_diagonal(m, count) for m in meshes if m.size > 1]
    # Round-robin over the meshes, each diagonal from its middle outwards.
    step = 0
    while len(chosen) < count and any(step < len(d) for d in diagonals):
        for d in diagonals:
            if step < len(d) and len(chosen) < count:
                chosen.setdefault(d[step])
        step += 1
    # Fill up evenly (a world wider than its meshes, or few distinct diagonal ranks).
    parts = 2
    while len(chosen) < min(count, world):
        for k in range(1, parts, 2):
            if len(chosen) < count:
                chosen.setdefault(k * (world - 1) // parts)
        parts *= 2
    return tuple(chosen)


def _diagonal(mesh: Mesh, limit: int) -> list[int]:
    """Up to ``limit`` ranks at coordinate ``i * size // n`` on every axis, ``n`` the
    largest axis size, in bisection order (middle first) so that a prefix is spread
    out. O(limit · modes), whatever the mesh's size."""
    n = max(mesh.axis_sizes)
    return [
        rank_at(mesh, [i * s // n for s in mesh.axis_sizes])
        for i in itertools.islice(_bisection(n), limit)
    ]


def _bisection(n: int) -> Iterator[int]:
    """``1..n-1`` ordered so that every prefix is spread out: n/2, n/4, 3n/4, ...

    >>> list(_bisection(8))
    [4, 2, 6, 1, 3, 5, 7]
    """
    seen: set[int] = set()
    parts = 2
    while len(seen) < n - 1:
        for k in range(1, parts, 2):
            i = k * n // parts
            if 0 < i < n and i not in seen:
                seen.add(i)
                yield i
        parts *= 2
