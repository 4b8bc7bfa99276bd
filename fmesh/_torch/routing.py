"""The rank spaces fmesh's DeviceMeshes live in, and fmesh's answers to torch.

One ``TorchSpace`` per rank space (size and rank map) and timeout in this process
holds the rank-map tensor and tuple that every DeviceMesh over it shares, roots from
every ``init_device_mesh`` call included (roots made with ``timeout=`` share one of
their own, so every group torch's methods make under them gets that timeout).
Registered with the compat hook, it answers torch's own ``__getitem__``, ``_flatten``,
``_unflatten`` and ``_concatenate`` on those meshes: coordinates from fmesh's queries
(O(number of axes)), groups through ``fmesh.realize`` (this rank's groups only,
memoized, agreed first).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import datetime
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, final

from .._compat.hook import SharedRanks, install, register_space, unregister_space
from .._compat.mesh import GroupSpec, Modes
from .._core.errors import MeshError
from .._core.layout import Layout
from .._core.mesh import Mesh
from .._core.queries import coordinate as coordinate_of
from .._core.queries import index_of
from .._runtime.bounded import bound
from .._runtime.groups import describing_groups
from .._runtime.hooks import on_loss, on_reset
from .._runtime.memo import WorldKey, world_key

if TYPE_CHECKING:
    import torch

__all__ = [
    "TorchSpace",
    "axis_names",
    "group_descs",
    "realizing_torch_roots",
    "space_for",
    "torch_roots",
]

_lock = threading.Lock()
_spaces: dict[tuple[WorldKey, datetime.timedelta | None], TorchSpace] = {}

_torch_roots: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "fmesh_torch_roots", default=False
)


def torch_roots() -> bool:
    """Whether realize runs on torch's behalf here: its axes are dims of torch's
    DeviceMeshes, not axes of fmesh's own API, so they are not offered as flattens."""
    return _torch_roots.get()


@contextlib.contextmanager
def realizing_torch_roots() -> Iterator[None]:
    """realize calls inside are for the dims of torch's DeviceMeshes."""
    token = _torch_roots.set(True)
    try:
        yield
    finally:
        _torch_roots.reset(token)


@final
class TorchSpace:
    """One rank space: torch's rank map (tensor and shared tuple) and the fmesh
    meshes of the layouts torch asked about."""

    def __init__(
        self,
        index_size: int,
        rank_map: tuple[int, ...] | None,
        timeout: datetime.timedelta | None = None,
    ) -> None:
        import numpy as np
        import torch

        self.index_size = index_size
        self.rank_map = rank_map
        self.timeout = timeout
        """Given to every realize call for the meshes over this space."""
        # From numpy: torch's own arange spreads 2^17 ints over its thread pool, which
        # costs milliseconds on a loaded machine.
        ranks = (
            np.arange(index_size, dtype=np.int32)
            if rank_map is None
            else np.fromiter(rank_map, dtype=np.int32, count=index_size)
        )
        self.tensor: torch.Tensor = torch.from_numpy(ranks)
        self._flat = SharedRanks(index_size, rank_map)
        # A cache of values, least recently used dropped first: bounded however many
        # roots with other names come and go (dropping one only costs a rebuild).
        self._meshes: collections.OrderedDict[
            tuple[tuple[Modes, ...], tuple[str, ...]], Mesh | None
        ] = collections.OrderedDict()

    @property
    def flat(self) -> SharedRanks:
        return self._flat

    def mesh(self, axes: Sequence[Modes], names: Sequence[Any] | None = None) -> Mesh | None:
        """The fmesh mesh of ``axes`` over this space, its dims named as torch names
        them (``dim_0``, ... without names, or where torch's names are no fmesh axis
        names: empty, not str, repeated); ``None`` where it is not a valid mesh."""
        named = axis_names(names, len(axes))
        key = (tuple(axes), named)
        with _lock:
            if key in self._meshes:
                self._meshes.move_to_end(key)
                return self._meshes[key]
        made: Mesh | None
        try:
            layouts = tuple(Layout._from_modes(m) for m in axes)
            made = Mesh(named, layouts, self.index_size, self.rank_map)
        except MeshError:
            made = None
        with _lock:
            self._meshes[key] = made
            bound(self._meshes)
        return made

    def coordinate(
        self, axes: Sequence[Modes], rank: int | None = None
    ) -> tuple[bool, tuple[int, ...] | None]:
        import torch.distributed as dist

        mesh = self.mesh(axes)
        if mesh is None:
            return False, None
        me = dist.get_rank()
        if rank is not None and rank != me and mesh.num_instances != 1:
            # torch looks ``rank`` up in the instance that holds this process's rank:
            # leave that (rare, private ``_rank=``) case to torch's own search.
            return False, None
        where = coordinate_of(mesh, me if rank is None else rank)
        # Off a mesh with several instances torch raises in __init__: keep its error.
        return (where is not None or mesh.num_instances == 1), where

    def in_view(self, axes: Sequence[Modes], offset: int) -> bool | None:
        import torch.distributed as dist

        mesh = self.mesh(axes)
        if mesh is None or not 0 <= offset < self.index_size:
            return None

        def origin(index: int) -> int:
            """The first index of the instance that holds ``index``."""
            spans = zip(mesh.axes, axes)
            return index - sum(a.coordinate_of(index) * m[0][1] for a, m in spans if m)

        if origin(offset) != offset:
            return None
        me = index_of(mesh, dist.get_rank())
        return me is not None and origin(me) == offset

    def groups(
        self,
        axes: Sequence[Modes],
        names: Sequence[str] | None,
        configs: Sequence[tuple[Any, Any]],
    ) -> list[GroupSpec] | None:
        from .._runtime.realize import realize_for_torch

        mesh = self.mesh(axes, names)
        if mesh is None or len(configs) != mesh.ndim or (names and len(names) != mesh.ndim):
            return None  # torch raises its own error
        named = mesh.axis_names
        backend = {n: b for n, (b, _) in zip(named, configs) if b is not None}
        options = {n: o for n, (_, o) in zip(named, configs) if o is not None}
        descs = dict(zip(named, group_descs(names, len(named))))
        with realizing_torch_roots(), describing_groups(descs.__getitem__):
            realized = realize_for_torch(
                mesh, backend=backend or None, options=options or None, timeout=self.timeout
            )
        if realized.coordinate is None:
            return []
        return [(pg.group_name, pg) for pg in (realized.groups[n] for n in named)]


def axis_names(names: Sequence[Any] | None, ndim: int) -> tuple[str, ...]:
    """fmesh axis names for torch's dim names: torch's own where every one is a
    non-empty, unique str, else ``dim_0``, ``dim_1``, ... (torch accepts any names)."""
    if names and len(names) == ndim:
        given = tuple(names)
        if all(isinstance(n, str) and n for n in given) and len(set(given)) == ndim:
            return given
    return tuple(f"dim_{i}" for i in range(ndim))


def group_descs(names: Sequence[Any] | None, ndim: int) -> list[str]:
    """The ``group_desc`` torch's ``DeviceMesh._init_process_groups`` gives each dim's
    groups: ``mesh_<name>``, or ``mesh_dim_<i>`` for a mesh without names."""
    return [f"mesh_{names[i] if names else f'dim_{i}'}" for i in range(ndim)]


def space_for(mesh: Mesh, timeout: datetime.timedelta | None = None) -> TorchSpace:
    """The shared space of ``mesh``'s rank space and ``timeout``, registered with the
    hook (which is installed here, the first time fmesh makes a DeviceMesh)."""
    key = (world_key(mesh), timeout)
    with _lock:
        space = _spaces.get(key)
    if space is None:
        made = TorchSpace(mesh.index_size, mesh.rank_map, timeout)
        with _lock:
            space = _spaces.setdefault(key, made)
        if space is made:
            register_space(space.tensor, space)
    install()
    return space


def _reset() -> None:
    with _lock:
        gone = list(_spaces.values())
        _spaces.clear()
    for space in gone:
        unregister_space(space.tensor)


on_reset(_reset)
on_loss(_reset)
