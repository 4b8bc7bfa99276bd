"""The text of ``fmesh describe`` (pure): a rank grid and one table row per axis.

Everything here turns meshes into strings; it parses nothing and imports no torch.
The helpers shared with ``fmesh plan`` (rank lists, aligned tables, host placement)
live here too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import final

import attrs
import numpy as np

from .._core.errors import MeshError
from .._core.hosts import BANDWIDTH_HEAVY_AXES, AxisHosts, host_report
from .._core.layout import Layout
from .._core.mesh import Mesh
from .._core.queries import coordinate, group, index_of, rank_at, rank_of

__all__ = [
    "ShownAxis",
    "a_or_an",
    "coord_str",
    "describe_text",
    "flattened_notes",
    "format_ranks",
    "host_line",
    "hosts_of",
    "placement",
    "table",
]

# Grid display: an axis longer than *_FULL shows its first and last *_EDGE entries.
_COLS_FULL, _COLS_EDGE = 16, 6
_ROWS_FULL, _ROWS_EDGE = 16, 4
_BLOCKS_FULL, _BLOCKS_EDGE = 8, 2
# Groups longer than this show their first _GROUP_HEAD ranks, "...", and the last.
_GROUP_FULL, _GROUP_HEAD = 8, 4


@final
@attrs.frozen
class ShownAxis:
    """One axis to report, with the mesh that has it (the root or a flattening)."""

    name: str
    mesh: Mesh
    parts: tuple[str, ...] = ()
    """Root axes this axis flattens; empty for a root axis."""

    @property
    def layout(self) -> Layout:
        return self.mesh.axes[self.mesh.axis_names.index(self.name)]

    @property
    def num_groups(self) -> int:
        return self.mesh.index_size // self.layout.size

    def coordinate(self, rank: int) -> int | None:
        coord = coordinate(self.mesh, rank)
        return None if coord is None else coord[self.mesh.axis_names.index(self.name)]

    def group(self, rank: int) -> tuple[int, ...]:
        return group(self.mesh, self.name, rank)

    def group_text(self, rank: int, full: int = _GROUP_FULL, head: int = _GROUP_HEAD) -> str:
        """``format_ranks`` of ``group``, listing only the ranks it shows."""
        size = self.layout.size
        if size <= full:
            return format_ranks(self.group(rank), full, head)
        index = index_of(self.mesh, rank)
        assert index is not None, f"rank {rank} is not in {self.mesh!r}"
        base = self.layout.group_base(index)
        shown = [rank_of(self.mesh, base + self.layout(k)) for k in (*range(head), size - 1)]
        return f"[{', '.join(map(str, shown[:-1]))}, ..., {shown[-1]}]"

    def hosts(self, ranks_per_host: int) -> AxisHosts:
        return host_report(self.mesh, ranks_per_host)[self.name]


# -- words --------------------------------------------------------------------------------


def a_or_an(number: int) -> str:
    """The article before a number said aloud: "an 8-rank world", "a 16-rank world".

    >>> [a_or_an(n) for n in (8, 11, 18, 80, 800, 8192, 1, 16, 131072, 11000)]
    ['an', 'an', 'an', 'an', 'an', 'an', 'a', 'a', 'a', 'an']
    """
    lead = abs(number)
    while lead >= 1000:
        lead //= 1000
    spoken_vowel = lead in (8, 11, 18) or 80 <= lead <= 89 or 800 <= lead <= 899
    return "an" if spoken_vowel else "a"


def host_line(mesh: Mesh, ranks_per_host: int) -> str:
    """``"4 hosts of 8 ranks"``, noting a partly filled last host when there are several."""
    report = host_report(mesh, ranks_per_host)
    hosts = report.hosts
    partial = " (the last one partly filled)" if report.partly_filled and hosts > 1 else ""
    if mesh.rank_map is not None and report.partly_filled:
        # Any host may hold only some of its ranks (e.g. after fmesh.shrink).
        partial = f" ({report.partly_filled} partly filled)"
    return f"{hosts} host{'s' if hosts != 1 else ''} of {ranks_per_host} ranks{partial}"


def placement(axis: ShownAxis, ranks_per_host: int) -> str:
    """``intra-host``, ``cross-host``, or ``mixed: k of n groups cross hosts``."""
    hosts = axis.hosts(ranks_per_host)
    if hosts.placement == "mixed":
        return f"mixed: {hosts.crossing} of {hosts.groups} groups cross hosts"
    return hosts.placement


def hosts_of(ranks: Sequence[int], ranks_per_host: int) -> str:
    """``host 3`` or ``2 hosts``: where one group's ranks live."""
    first, last = min(ranks) // ranks_per_host, max(ranks) // ranks_per_host
    if first == last:
        return f"host {first}"
    count = len(np.unique(np.asarray(ranks, dtype=np.int64) // ranks_per_host))
    return f"{count} hosts"


# -- tables -------------------------------------------------------------------------------


def format_ranks(
    ranks: Sequence[int], full: int = _GROUP_FULL, head: int = _GROUP_HEAD
) -> str:
    """``[0, 1, 2]``, or ``[0, 8, 16, 24, ..., 120]`` for a long group."""
    if len(ranks) <= full:
        return "[" + ", ".join(map(str, ranks)) + "]"
    return f"[{', '.join(map(str, ranks[:head]))}, ..., {ranks[-1]}]"


def coord_str(names: Sequence[str], coord: Sequence[int]) -> str:
    """``(pp=0, dp=1, tp=1)``."""
    return "(" + ", ".join(f"{n}={c}" for n, c in zip(names, coord, strict=True)) + ")"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    """Aligned columns; columns in ``right`` are right-aligned; no trailing spaces."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = []
    for row in [header, *rows]:
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return out


def flattened_notes(axes: Sequence[ShownAxis]) -> list[str]:
    """``flattened: dp_tp = (dp, tp)`` for each flattened axis."""
    return [f"flattened: {a.name} = ({', '.join(a.parts)})" for a in axes if a.parts]


# -- the grid -----------------------------------------------------------------------------


def _shown(size: int, full: int, edge: int, keep: int | None) -> list[int | None]:
    """Indices to display (``None`` marks elided ones), always including ``keep``."""
    if size <= full:
        return list(range(size))
    extra = [] if keep is None else [keep]
    wanted = sorted({*range(edge), *range(size - edge, size), *extra})
    out: list[int | None] = []
    for i in wanted:
        if out and out[-1] is not None and out[-1] != i - 1:
            out.append(None)
        out.append(i)
    return out


def _grid(mesh: Mesh, mark: int | None) -> list[str]:
    """The rank grid: one 2-d block per index of the leading axes, like numpy."""
    names, sizes = mesh.axis_names, mesh.axis_sizes
    mark_coord = coordinate(mesh, mark) if mark is not None else None
    lead_n, lead_s = names[:-2], sizes[:-2]
    row_n, row_s = (names[-2], sizes[-2]) if mesh.ndim >= 2 else ("", 1)
    col_n, col_s = names[-1], sizes[-1]

    def keep(axis: int) -> int | None:
        return None if mark_coord is None else mark_coord[axis]

    lead_keep = (
        None
        if mark_coord is None
        else int(np.ravel_multi_index(mark_coord[:-2], lead_s))
        if lead_s
        else 0
    )
    blocks = _shown(math.prod(lead_s), _BLOCKS_FULL, _BLOCKS_EDGE, lead_keep)
    rows = _shown(row_s, _ROWS_FULL, _ROWS_EDGE, keep(mesh.ndim - 2) if row_n else None)
    cols = _shown(col_s, _COLS_FULL, _COLS_EDGE, keep(mesh.ndim - 1))

    def lead_coord(block: int) -> tuple[int, ...]:
        return tuple(int(i) for i in np.unravel_index(block, lead_s)) if lead_s else ()

    def cell_rank(block: int, row: int, col: int) -> int:
        return rank_at(mesh, (*lead_coord(block), *((row,) if row_n else ()), col))

    shown_blocks = [b for b in blocks if b is not None]
    shown_rows = [r for r in rows if r is not None]
    shown_cols = [c for c in cols if c is not None]
    # Width from the extreme ranks shown (ranks grow with no coordinate in general).
    biggest = max(
        cell_rank(b, r, c) for b in shown_blocks for r in shown_rows for c in shown_cols
    )
    width = max(len(str(biggest)), len(str(col_s - 1)), 3 if None in cols else 1)
    corner = f"{row_n}\\{col_n}" if row_n else col_n
    label_w = max(len(corner), len(str(row_s - 1)), 3)

    def cell(text: str, marked: bool = False) -> str:
        return f"[{text}]".rjust(width + 2) if marked else text.rjust(width + 1) + " "

    head = (
        corner.ljust(label_w)
        + " "
        + "".join(cell("..." if c is None else str(c)) for c in cols)
    )
    indent = "  " if lead_s else ""
    out: list[str] = []
    for block in blocks:
        if block is None:
            out.append("...")
            continue
        if lead_s:
            out.append(coord_str(lead_n, lead_coord(block))[1:-1])
        out.append(indent + head.rstrip())
        for row in rows:
            if row is None:
                out.append(indent + "...".rjust(label_w))
                continue
            label = str(row) if row_n else ""
            line = label.rjust(label_w) + " "
            for col in cols:
                if col is None:
                    line += cell("...")
                    continue
                rank = cell_rank(block, row, col)
                line += cell(str(rank), rank == mark)
            out.append(indent + line.rstrip())
    return out


def _grid_title(mesh: Mesh, mark: int | None) -> str:
    names = mesh.axis_names
    if mesh.ndim == 1:
        where = f"along {names[0]}"
    else:
        where = f"rows {names[-2]}, columns {names[-1]}"
        if mesh.ndim > 2:
            where = f"one block per {', '.join(names[:-2])}; {where}"
        where = f"({where})"
    marked = f"; rank {mark} in [brackets]" if mark is not None else ""
    return f"ranks by coordinate {where}{marked}:"


# -- describe -----------------------------------------------------------------------------


def _example_groups(axis: ShownAxis) -> str:
    """The first two groups and the last, by their base (smallest) index."""
    comp = axis.layout.complement(axis.mesh.index_size)
    bases = [0, min(comp.stride, default=0), comp.cosize - 1][: axis.num_groups]
    shown = [axis.group_text(rank_of(axis.mesh, b), full=4, head=3) for b in bases]
    if axis.num_groups > 3:
        shown.insert(2, "...")
    return ", ".join(shown)


def _axis_cells(axis: ShownAxis, ranks_per_host: int) -> list[str]:
    """The columns every describe table starts with: axis, size, groups, layout, hosts."""
    return [
        axis.name,
        str(axis.layout.size),
        str(axis.num_groups),
        str(axis.layout),
        placement(axis, ranks_per_host),
    ]


def _warnings(
    axes: Sequence[ShownAxis], ranks_per_host: int, keep_in_host: Sequence[str]
) -> list[str]:
    """One line per bandwidth-heavy axis that crosses hosts, then how to avoid it."""
    out = [
        f"warning: axis {axis.name} crosses hosts of {ranks_per_host} ranks "
        f"({placement(axis, ranks_per_host)})"
        for axis in axes
        if axis.name in keep_in_host and axis.hosts(ranks_per_host).crosses_hosts
    ]
    if out:
        out.append(
            f"  bandwidth-heavy axes ({', '.join(keep_in_host)}) belong inside a host: "
            "make them the last axes,"
        )
        out.append(
            f"  with sizes multiplying to a divisor of {ranks_per_host}, or build the "
            "mesh with fmesh.make_hybrid_mesh"
        )
    return out


def describe_text(
    mesh: Mesh,
    axes: Sequence[ShownAxis],
    *,
    rank: int | None = None,
    ranks_per_host: int = 8,
    keep_in_host: Sequence[str] = BANDWIDTH_HEAVY_AXES,
    notes: Sequence[str] = (),
) -> str:
    """What ``fmesh describe`` prints for a mesh with one instance.

    Args:
        mesh: the mesh to draw, with one instance (ranks ``0..size-1``, or any ranks
            through a rank map, e.g. after ``shrink`` or ``replace``).
        axes: the axes to tabulate: the mesh's own and any flattenings of it.
        rank: a rank to mark in the grid and whose groups to list, or ``None``.
        ranks_per_host: consecutive ranks per host, for the ``hosts`` column.
        keep_in_host: axis names to warn about when they cross hosts.
        notes: lines to print under the first (how the mesh was edited).

    Raises:
        MeshError: when ``rank`` is not in the mesh.
    """
    host = ranks_per_host
    coord = None if rank is None else coordinate(mesh, rank)
    if rank is not None and coord is None:
        raise MeshError(f"describe: rank {rank} is not in {mesh!r}")
    out = [f"{mesh!r}: {mesh.size} ranks on {host_line(mesh, host)}", *notes, ""]
    out.append(_grid_title(mesh, rank))
    out.extend(_grid(mesh, rank))
    out.append("")
    if rank is None or coord is None:
        header = ["axis", "size", "groups", "layout", "hosts", "example groups"]
        rows = [[*_axis_cells(a, host), _example_groups(a)] for a in axes]
        right = {1, 2}
    else:
        first = rank - rank % host
        # A root mesh is the world, whose last host may be partly filled; a rank map
        # says nothing of the world, so show the whole host.
        last = first + host if mesh.rank_map is not None else min(first + host, mesh.size)
        out.append(
            f"rank {rank}: coordinate {coord_str(mesh.axis_names, coord)} on host "
            f"{rank // host} (ranks {first}..{last - 1})"
        )
        header = ["axis", "size", "groups", "layout", "hosts", "coord"]
        header.append(f"group of rank {rank}")
        rows = [
            [*_axis_cells(a, host), str(a.coordinate(rank)), a.group_text(rank)] for a in axes
        ]
        right = {1, 2, 5}
    out.extend(table(header, rows, right=right))
    out.extend(flattened_notes(axes))
    warnings = _warnings(axes, host, keep_in_host)
    if warnings:
        out.append("")
        out.extend(warnings)
    return "\n".join(out) + "\n"
