"""Validation and inverse lookup of custom rank maps, done once per rank-map object.

A mesh's ``rank_map`` is a plain tuple shared (by identity) by every mesh derived from
it: slice, flatten, unflatten and rename pass the same tuple along. The O(N) work —
checking that ranks are distinct, building the inverse — is therefore cached by the
identity of the tuple, so derived meshes pay O(1).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Protocol, final

import attrs
import numpy as np
import numpy.typing as npt

from .errors import MeshError

__all__ = [
    "RankMapInfo",
    "RankSpace",
    "WorldKey",
    "rank_map_info",
    "rank_map_key",
    "world_key",
]

_CACHE_ENTRIES = 32
_lock = threading.Lock()
_cache: OrderedDict[int, RankMapInfo] = OrderedDict()


@final
@attrs.frozen(slots=True, eq=False)
class RankMapInfo:
    """Facts about one rank-map tuple, computed once."""

    ranks: tuple[int, ...]
    """The rank map itself (kept alive so the identity key stays valid)."""
    array: npt.NDArray[np.int64]
    """The rank map as a read-only int64 array."""
    sorted_ranks: npt.NDArray[np.int64]
    """Ranks in ascending order, for binary search."""
    sorted_index: npt.NDArray[np.int64]
    """``sorted_index[k]`` is the index holding ``sorted_ranks[k]``."""
    is_identity: bool
    is_increasing: bool
    max_rank: int
    digest: str
    """A content hash, so keys built from the rank map stay small."""

    def index_of(self, rank: int) -> int | None:
        """The index holding ``rank``, or ``None`` (O(log N))."""
        pos = int(np.searchsorted(self.sorted_ranks, rank))
        if pos < len(self.sorted_ranks) and int(self.sorted_ranks[pos]) == rank:
            return int(self.sorted_index[pos])
        return None


def _build(ranks: tuple[int, ...]) -> RankMapInfo:
    for r in ranks:
        if not isinstance(r, int) or isinstance(r, bool):
            raise TypeError(
                f"rank_map entries must be int, got {r!r} of type {type(r).__name__}"
            )
    array = np.asarray(ranks, dtype=np.int64).reshape(-1)
    if array.size and bool((array < 0).any()):
        bad = int(array[array < 0][0])
        raise MeshError(f"rank_map contains the negative rank {bad}; global ranks are >= 0")
    order = np.argsort(array, kind="stable")
    sorted_ranks = array[order]
    if sorted_ranks.size > 1:
        dup = np.nonzero(sorted_ranks[1:] == sorted_ranks[:-1])[0]
        if dup.size:
            rank = int(sorted_ranks[dup[0]])
            where = [int(i) for i in np.nonzero(array == rank)[0][:4]]
            raise MeshError(
                f"rank_map lists rank {rank} more than once (at indices {where}); "
                "each global rank may appear at most once in a mesh"
            )
    array.setflags(write=False)
    sorted_ranks.setflags(write=False)
    order = order.astype(np.int64)
    order.setflags(write=False)
    increasing = bool(np.all(array[1:] > array[:-1])) if array.size > 1 else True
    identity = bool(np.array_equal(array, np.arange(array.size, dtype=np.int64)))
    return RankMapInfo(
        ranks=ranks,
        array=array,
        sorted_ranks=sorted_ranks,
        sorted_index=order,
        is_identity=identity,
        is_increasing=increasing,
        max_rank=int(sorted_ranks[-1]) if sorted_ranks.size else -1,
        digest=hashlib.sha1(array.tobytes(), usedforsecurity=False).hexdigest(),
    )


def rank_map_info(ranks: tuple[int, ...]) -> RankMapInfo:
    """Validated facts about ``ranks``; O(N) the first time, O(1) after."""
    key = id(ranks)
    with _lock:
        info = _cache.get(key)
        if info is not None and info.ranks is ranks:
            _cache.move_to_end(key)
            return info
    info = _build(ranks)
    with _lock:
        _cache[key] = info
        _cache.move_to_end(key)
        while len(_cache) > _CACHE_ENTRIES:
            _cache.popitem(last=False)
    return info


class RankSpace(Protocol):
    """What names a rank space: a ``Mesh`` (its index space and rank map)."""

    @property
    def index_size(self) -> int: ...
    @property
    def rank_map(self) -> tuple[int, ...] | None: ...


WorldKey = tuple[int, str]
"""(index space size, rank-map digest): the rank space a mesh lives in."""


def rank_map_key(mesh: RankSpace) -> str:
    """The rank map's part of memo keys: its digest ("" without a rank map)."""
    return "" if mesh.rank_map is None else rank_map_info(mesh.rank_map).digest


def world_key(mesh: RankSpace) -> WorldKey:
    """The rank space ``mesh`` lives in, as a memo key."""
    return (mesh.index_size, rank_map_key(mesh))
