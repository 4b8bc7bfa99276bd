"""View checks: do two meshes over the same world cover the same ranks, or have an axis
with the same groups?

Trainers build several views of one world (a dense view ``dp x cp x tp`` and an expert
view ``dp x ep x etp``, say) and need to know which axes coincide. When the two meshes
share an index space and a rank map, the answer comes from the layouts alone, in
O(number of modes); only meshes with different rank maps are compared group by group
(O(world log world)).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .axes import axis_position
from .layout import Layout
from .mesh import Mesh, require_mesh
from .rank_map import rank_map_info

__all__ = ["same_groups", "same_ranks"]


def _same_rank_map(a: Mesh, b: Mesh) -> bool:
    return a.index_size == b.index_size and (
        a.rank_map is b.rank_map or a.rank_map == b.rank_map
    )


def _covers_same(a: Mesh, b: Mesh) -> bool:
    if a.index_size != b.index_size:
        return False
    if _same_rank_map(a, b):
        return True
    if a.rank_map is None or b.rank_map is None:
        # N distinct ranks >= 0 are 0..N-1 exactly when the largest is N-1.
        other = a.rank_map if a.rank_map is not None else b.rank_map
        assert other is not None  # not both None: _same_rank_map would have said so
        return rank_map_info(other).max_rank == a.index_size - 1
    return bool(
        np.array_equal(
            rank_map_info(a.rank_map).sorted_ranks, rank_map_info(b.rank_map).sorted_ranks
        )
    )


def same_ranks(a: Mesh, b: Mesh) -> bool:
    """Whether two meshes cover the same set of global ranks (all their instances).

    O(1) when both use ranks ``0..N-1`` or share their rank map, O(N) once per rank
    map otherwise. Slices, flattens and unflattens of a mesh cover the ranks it covers.

    Raises:
        TypeError: when ``a`` or ``b`` is not a [`Mesh`][fmesh.Mesh].

    >>> from fmesh import make_mesh, same_ranks
    >>> dense = make_mesh({"dp": 2, "tp": 4})
    >>> same_ranks(dense, make_mesh({"ep": 4, "etp": 2}, ranks=range(7, -1, -1)))
    True
    >>> same_ranks(dense, make_mesh({"dp": 2, "tp": 2}))
    False
    """
    require_mesh(a, "same_ranks", "a")
    require_mesh(b, "same_ranks", "b")
    return _covers_same(a, b)


def _image_key(layout: Layout) -> Layout:
    """The set of indices a layout covers, as the layout of its modes sorted by stride.

    For the non-overlapping layouts of a mesh this canonical form determines the image
    and the image determines it: sorted slowest first, contiguous modes merged.
    """
    modes = sorted(layout.modes, key=lambda mode: -mode[1])
    return Layout.of([s for s, _ in modes], [d for _, d in modes])


def _groups(mesh: Mesh, pos: int, ordered: bool) -> npt.NDArray[np.int64]:
    """Every group of axis ``pos`` as a row of global ranks, in a canonical row order."""
    layout = mesh.axes[pos]
    bases = np.asarray(layout.complement(mesh.index_size).values(), dtype=np.int64)
    offsets = np.asarray(layout.values(), dtype=np.int64)
    ranks = bases[:, None] + offsets[None, :]
    if mesh.rank_map is not None:
        ranks = rank_map_info(mesh.rank_map).array[ranks]
    if not ordered:
        ranks = np.sort(ranks, axis=1)
    # Ranks are distinct across the mesh, so rows differ in their first entry.
    return ranks[np.argsort(ranks[:, 0], kind="stable")]


def same_groups(a: Mesh, axis_a: str, b: Mesh, axis_b: str, *, ordered: bool = True) -> bool:
    """Whether axis ``axis_a`` of ``a`` has exactly the groups of axis ``axis_b`` of ``b``.

    With ``ordered=True`` (the default) each group must list the same ranks in the
    same coordinate order, which is what makes two axes share one process group and
    agree on group ranks ([`fmesh.realize`][fmesh.realize] memoizes them as one); with
    ``ordered=False`` only the members of each group must match.

    Cost: O(number of modes) when the meshes share their index space and rank map
    (views derived from one mesh, or built over ranks ``0..N-1``); otherwise the
    groups are listed and compared, O(N log N).

    Args:
        a: the first mesh.
        axis_a: an axis of ``a``.
        b: the second mesh.
        axis_b: an axis of ``b``.
        ordered: compare groups as sequences (default) or as sets.

    Returns:
        ``True`` when both axes partition the same ranks into the same groups.

    Raises:
        TypeError: when ``a`` or ``b`` is not a mesh or an axis name not a str.
        AxisNotFoundError: when a mesh has no axis of that name.

    >>> from fmesh import make_mesh, same_groups, unflatten
    >>> dense = make_mesh({"dp": 4, "tp": 2})
    >>> expert = unflatten(make_mesh({"world": 8}), "world", {"ep": 4, "etp": 2})
    >>> same_groups(dense, "tp", expert, "etp"), same_groups(dense, "dp", expert, "etp")
    (True, False)
    """
    require_mesh(a, "same_groups", "a")
    require_mesh(b, "same_groups", "b")
    pa = axis_position(a, axis_a, "same_groups")
    pb = axis_position(b, axis_b, "same_groups")
    la, lb = a.axes[pa], b.axes[pb]
    if la.size != lb.size or not _covers_same(a, b):
        return False
    if _same_rank_map(a, b):
        # Same index -> rank map: the groups holding index 0 (base 0) must agree,
        # and they are the layouts' own values; every other group is a translate.
        return la == lb if ordered else _image_key(la) == _image_key(lb)
    return bool(np.array_equal(_groups(a, pa, ordered), _groups(b, pb, ordered)))
