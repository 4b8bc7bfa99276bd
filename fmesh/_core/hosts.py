"""Hosts: which axes of a mesh cross host boundaries, and meshes built host by host.

A *host* holds ``ranks_per_host`` consecutive global ranks, as torchrun assigns them
(host ``h`` holds ranks ``h*ranks_per_host`` to ``(h+1)*ranks_per_host - 1``). An axis
is intra-host when each of its groups lies on one host. Bandwidth-heavy axes (tensor,
context and expert parallelism) belong inside a host; ``make_hybrid_mesh`` builds a
mesh from an intra-host and an inter-host size per axis, as JAX's
``mesh_utils.create_hybrid_device_mesh`` does, so that they stay there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal, final, overload

import attrs
import numpy as np
import numpy.typing as npt

from .axes import check_size, names_tuple
from .errors import AxisNotFoundError, MeshError
from .layout import Layout
from .mesh import Mesh, require_mesh
from .rank_map import rank_map_info

__all__ = [
    "BANDWIDTH_HEAVY_AXES",
    "AxisHosts",
    "HostReport",
    "crossing_groups",
    "host_report",
    "make_hybrid_mesh",
]

BANDWIDTH_HEAVY_AXES = ("tp", "cp", "ep")
"""Axis names whose collectives move the most data: keep them inside a host."""

MAX_RANKS_PER_HOST = 1 << 24
"""The analysis keeps one counter per rank of a host."""


# -- analysis ---------------------------------------------------------------------------


def _add_progression(
    counts: npt.NDArray[np.int64], size: int, step: int
) -> npt.NDArray[np.int64]:
    """Counts of ``r + k*step (mod len)`` over ``r`` and ``k < size``, by doubling."""
    if step == 0:
        return counts * size
    host = len(counts)
    result = counts.copy()
    done = 1
    for bit in bin(size)[3:]:
        result = result + np.roll(result, done * step % host)
        done *= 2
        if bit == "1":
            result = result + np.roll(counts, done * step % host)
            done += 1
    return result


def crossing_groups(layout: Layout, index_size: int, host: int) -> int:
    """How many groups of an axis straddle a host boundary, when rank == index.

    A group's smallest index is its base ``b`` and its largest ``b + cosize - 1``,
    so it straddles iff ``b % host + cosize > host``; the bases are the values of the
    complement, whose residues are counted mode by mode in O(host * modes * bits).

    Raises:
        MeshError: when ``host`` exceeds 2**24 ranks (too large to count).
    """
    groups = index_size // layout.size
    if layout.cosize > host:
        return groups
    if index_size <= host:
        return 0
    if host > MAX_RANKS_PER_HOST:
        raise MeshError(
            f"{host} ranks per host is too many to analyse; expected at most "
            f"{MAX_RANKS_PER_HOST} (the ranks on one machine, e.g. 8)"
        )
    dtype = np.int64 if index_size < 1 << 62 else np.object_
    counts: npt.NDArray[np.int64] = np.zeros(host, dtype=dtype)
    counts[0] = 1
    for size, stride in layout.complement(index_size).modes:
        counts = _add_progression(counts, size, stride % host)
    return int(counts[host - layout.cosize + 1 :].sum())


def _crossing_listed(mesh: Mesh, pos: int, host: int) -> int:
    """``crossing_groups`` for a mesh with a rank map, by listing the groups."""
    assert mesh.rank_map is not None
    layout = mesh.axes[pos]
    bases = np.asarray(layout.complement(mesh.index_size).values(), dtype=np.int64)
    offsets = np.asarray(layout.values(), dtype=np.int64)
    hosts = rank_map_info(mesh.rank_map).array[bases[:, None] + offsets[None, :]] // host
    return int(np.count_nonzero(hosts.min(axis=1) != hosts.max(axis=1)))


Placement = Literal["intra-host", "cross-host", "mixed"]


@final
@attrs.frozen
class AxisHosts:
    """How the groups of one axis sit on hosts."""

    name: str
    """The axis."""
    size: int
    """Ranks per group (the axis size)."""
    groups: int
    """How many groups the axis has over the whole index space (all instances)."""
    crossing: int
    """How many of those groups hold ranks of more than one host."""

    @property
    def crosses_hosts(self) -> bool:
        """Whether any group of the axis spans hosts."""
        return self.crossing > 0

    @property
    def placement(self) -> Placement:
        """``"intra-host"`` (no group crosses), ``"cross-host"`` (all) or ``"mixed"``."""
        if self.crossing == 0:
            return "intra-host"
        return "cross-host" if self.crossing == self.groups else "mixed"


@final
@attrs.frozen
class HostReport:
    """Which axes of a mesh cross hosts; see [`host_report`][fmesh.host_report]."""

    ranks_per_host: int
    """Consecutive global ranks per host."""
    hosts: int
    """How many hosts hold at least one rank of the mesh."""
    partly_filled: int
    """How many of those hosts hold fewer than ``ranks_per_host`` of its ranks."""
    axes: tuple[AxisHosts, ...]
    """One entry per axis, in axis order."""

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The axes reported, in order."""
        return tuple(a.name for a in self.axes)

    @property
    def cross_host_axes(self) -> tuple[str, ...]:
        """Names of the axes with at least one group that spans hosts."""
        return tuple(a.name for a in self.axes if a.crosses_hosts)

    def __getitem__(self, name: str) -> AxisHosts:
        """The entry of axis ``name``; raises ``AxisNotFoundError`` if absent."""
        for entry in self.axes:
            if entry.name == name:
                return entry
        if not isinstance(name, str):
            raise TypeError(f"HostReport[...] takes an axis name, got {name!r}")
        raise AxisNotFoundError(
            f"HostReport has no axis {name!r}; valid axis names are {list(self.axis_names)}"
        )


def _check_ranks_per_host(value: object, fn: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{fn}() ranks_per_host must be int, got {value!r}")
    if value < 1:
        raise MeshError(
            f"{fn}(): ranks_per_host is {value}; expected the number of ranks on one "
            "host, >= 1 (e.g. 8)"
        )
    return int(value)


def host_report(mesh: Mesh, ranks_per_host: int) -> HostReport:
    """Which axes of ``mesh`` cross hosts of ``ranks_per_host`` consecutive ranks.

    Host ``h`` holds global ranks ``h*ranks_per_host .. (h+1)*ranks_per_host - 1``.
    For a mesh over ranks ``0..N-1`` this costs O(ranks_per_host * modes * log N) per
    axis, whatever N; with a custom rank map it lists the groups (O(N)).

    Args:
        mesh: the mesh; every group of every axis (all instances) is counted.
        ranks_per_host: ranks per host, e.g. torchrun's ``--nproc-per-node``.

    Returns:
        A frozen [`HostReport`][fmesh.HostReport], one [`AxisHosts`][fmesh.AxisHosts] per axis.

    Raises:
        TypeError: when ``mesh`` is not a mesh or ``ranks_per_host`` not an int.
        MeshError: when ``ranks_per_host`` is below 1 (or above 2**24).

    >>> from fmesh import host_report, make_mesh
    >>> report = host_report(make_mesh({"dp": 4, "tp": 8}), ranks_per_host=8)
    >>> report.cross_host_axes, report["tp"].placement, report.hosts
    (('dp',), 'intra-host', 4)
    """
    require_mesh(mesh, "host_report")
    host = _check_ranks_per_host(ranks_per_host, "host_report")
    axes = []
    for pos, (name, layout) in enumerate(zip(mesh.axis_names, mesh.axes, strict=True)):
        crossing = (
            crossing_groups(layout, mesh.index_size, host)
            if mesh.rank_map is None
            else _crossing_listed(mesh, pos, host)
        )
        axes.append(AxisHosts(name, layout.size, mesh.index_size // layout.size, crossing))
    if mesh.rank_map is None:
        hosts = -(-mesh.index_size // host)
        partly = 1 if mesh.index_size % host else 0
    else:
        per_host = np.unique(rank_map_info(mesh.rank_map).array // host, return_counts=True)[1]
        hosts = len(per_host)
        partly = int(np.count_nonzero(per_host < host))
    return HostReport(host, hosts, partly, tuple(axes))


# -- construction -----------------------------------------------------------------------


def _sizes(
    value: Mapping[str, int] | Sequence[int], what: str
) -> tuple[tuple[str, ...] | None, tuple[object, ...]]:
    if isinstance(value, Mapping):
        return names_tuple(tuple(value.keys())), tuple(value.values())
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(
            f"make_hybrid_mesh() {what} must be a mapping name -> size or a sequence of "
            f"int, got {value!r}"
        )
    return None, tuple(value)


@overload
def make_hybrid_mesh(
    intra_host: Mapping[str, int],
    inter_host: Mapping[str, int],
    axis_names: None = None,
) -> Mesh: ...


@overload
def make_hybrid_mesh(
    intra_host: Sequence[int],
    inter_host: Sequence[int],
    axis_names: Sequence[str],
) -> Mesh: ...


def make_hybrid_mesh(
    intra_host: Mapping[str, int] | Sequence[int],
    inter_host: Mapping[str, int] | Sequence[int],
    axis_names: Sequence[str] | None = None,
) -> Mesh:
    """A root mesh whose every axis has an intra-host part and an inter-host part.

    Like JAX's ``mesh_utils.create_hybrid_device_mesh(mesh_shape, dcn_mesh_shape)``:
    axis ``i`` has size ``inter_host[i] * intra_host[i]``, and its coordinate is
    ``host_part * intra_host[i] + local_part`` (the inter-host part is major). The
    intra-host sizes multiply to the ranks per host and the inter-host sizes to the
    number of hosts; host ``h`` holds ranks ``h*ranks_per_host ..`` as torchrun
    assigns them. An axis with inter-host size 1 stays inside a host.

    Args:
        intra_host: size of each axis's part inside a host, as a mapping name -> size
            (which fixes the axis order) or a sequence with ``axis_names``.
        inter_host: size of each axis's part across hosts: a mapping (axes left out
            have size 1 there) or a sequence of the same length as ``intra_host``.
        axis_names: one name per axis, only with sequences.

    Returns:
        A [`Mesh`][fmesh.Mesh] over ranks ``0..ranks_per_host*hosts-1`` (one layout of up
        to two modes per axis, so slice, flatten and unflatten work as usual).

    Raises:
        TypeError: for sizes that are not int, names that are not str, or mixing a
            mapping with ``axis_names``.
        MeshError: for sizes below 1, lengths that differ, or an inter-host axis
            that ``intra_host`` does not name.

    >>> from fmesh import group, host_report, make_hybrid_mesh
    >>> m = make_hybrid_mesh({"dp": 2, "tp": 4}, {"dp": 1, "tp": 2})
    >>> m.shape["dp"], m.shape["tp"], group(m, "tp", 0)
    (2, 8, (0, 1, 2, 3, 8, 9, 10, 11))
    >>> host_report(m, 8).cross_host_axes
    ('tp',)
    """
    intra_names, intra_in = _sizes(intra_host, "intra_host")
    inter_names, inter_in = _sizes(inter_host, "inter_host")
    if intra_names is not None:
        if axis_names is not None:
            raise TypeError(
                "make_hybrid_mesh got a mapping of sizes and axis_names; the mapping "
                "already names the axes, so drop axis_names"
            )
        names = intra_names
        if inter_names is None:
            raise TypeError(
                "make_hybrid_mesh() got intra_host as a mapping but inter_host as a "
                "sequence; give both as mappings name -> size"
            )
        unknown = [n for n in inter_names if n not in names]
        if unknown:
            raise MeshError(
                f"make_hybrid_mesh(): inter_host names axes {unknown} that intra_host "
                f"{dict(zip(names, intra_in, strict=True))} lacks; list every axis in "
                f"intra_host, with size 1 for an axis that only spans hosts, e.g. "
                f"{{{unknown[0]!r}: 1, ...}}"
            )
        inter_map = dict(zip(inter_names, inter_in, strict=True))
        inter_in = tuple(inter_map.get(n, 1) for n in names)
    else:
        if inter_names is not None:
            raise TypeError(
                "make_hybrid_mesh() got intra_host as a sequence but inter_host as a "
                "mapping; give both as sequences (with axis_names) or both as mappings"
            )
        if axis_names is None:
            raise TypeError(
                "make_hybrid_mesh() needs axis_names when the sizes are sequences; e.g. "
                "make_hybrid_mesh((1, 8), (4, 1), ('dp', 'tp'))"
            )
        names = names_tuple(axis_names)
        if not len(intra_in) == len(inter_in) == len(names):
            raise MeshError(
                f"make_hybrid_mesh() got {len(intra_in)} intra-host sizes {intra_in}, "
                f"{len(inter_in)} inter-host sizes {inter_in} and {len(names)} names "
                f"{names}; give one of each per axis"
            )
    intra = tuple(check_size(n, s) for n, s in zip(names, intra_in, strict=True))
    inter = tuple(check_size(n, s) for n, s in zip(names, inter_in, strict=True))
    per_host = math.prod(intra)
    axes = tuple(
        Layout.of(
            (inter[i], intra[i]),
            (per_host * math.prod(inter[i + 1 :]), math.prod(intra[i + 1 :])),
        )
        for i in range(len(names))
    )
    return Mesh(names, axes, per_host * math.prod(inter))
