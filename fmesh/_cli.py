"""The ``fmesh`` command line: draw a mesh, or dry-run :func:`fmesh.realize` for one rank.

    python -m fmesh describe "pp=2,dp=4,tp=8" --rank 5 --flatten dp,tp
    python -m fmesh plan --world 131072 "pp=16,dp=256,cp=4,tp=8" --rank 5

``describe`` is pure; ``plan`` realizes the mesh on torch's ``fake`` backend, which
creates process groups without any communication. torch is imported by ``plan`` only.

A *host* is a block of ``--local-world-size`` consecutive global ranks (default 8); an
axis is intra-host when every one of its groups lies inside one host.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn, final

import attrs
import numpy as np
import numpy.typing as npt

from ._errors import MeshError
from ._layout import Layout
from ._memo import cache_stats, destroy
from ._mesh import Mesh, make_mesh
from ._ops import coordinate, flatten, group, rank_of, unflatten
from ._realize import realize

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["main"]

logger = logging.getLogger("fmesh")

SPEC_HELP = 'comma-separated name=size pairs in axis order, e.g. "pp=2,dp=4,tp=8"'

# Grid display: an axis longer than *_FULL shows its first and last *_EDGE entries.
_COLS_FULL, _COLS_EDGE = 16, 6
_ROWS_FULL, _ROWS_EDGE = 16, 4
_BLOCKS_FULL, _BLOCKS_EDGE = 8, 2
# Groups longer than this show their first _GROUP_HEAD ranks, "...", and the last.
_GROUP_FULL, _GROUP_HEAD = 8, 4
# Host analysis keeps one counter per rank of a host.
_MAX_HOST = 1 << 24


class _CliError(MeshError):
    """A bad command-line argument (reported as one line, exit status 2)."""


# -- parsing ---------------------------------------------------------------------------


def _parse_count(text: str, what: str) -> int:
    """An int written as ``1024``, ``1_024`` or ``2**10``."""
    m = re.fullmatch(r"\s*(-?\d[\d_]*)\s*(?:\*\*\s*(\d+)\s*)?", text)
    if m is None:
        raise _CliError(
            f"{what} is {text!r}, which is not a whole number; write e.g. 8, 1024 or 2**10"
        )
    base = int(m.group(1))
    return base ** int(m.group(2)) if m.group(2) is not None else base


def parse_spec(text: str) -> Mesh:
    """The root mesh of a spec such as ``"pp=2,dp=4,tp=8"``.

    >>> parse_spec("dp=2, tp=4")
    Mesh(dp=2, tp=4)
    """
    names: list[str] = []
    sizes: list[int] = []
    try:
        items = [item.strip() for item in text.split(",")]
        if not text.strip() or any(not item for item in items):
            raise _CliError("it has an empty entry")
        for item in items:
            name, eq, size = (part.strip() for part in item.partition("="))
            if not eq:
                raise _CliError(f"entry {item!r} is not name=size")
            names.append(name)
            sizes.append(_parse_count(size, f"the size of axis {name!r}"))
        return make_mesh(sizes, names)
    except MeshError as err:
        raise _CliError(f'mesh spec "{text}": {err}; expected {SPEC_HELP}') from None


def _parse_flatten(text: str) -> tuple[str | None, tuple[str, ...]]:
    """``"dp,tp"`` or ``"name=dp,tp"``: the new axis name (or None) and its axes."""
    name, eq, axes = text.rpartition("=") if "=" in text else ("", "", text)
    parts = tuple(a.strip() for a in axes.split(","))
    if not all(parts) or (eq and not name.strip()):
        raise _CliError(
            f'--flatten "{text}" is not a list of axis names; write --flatten dp,tp '
            "or --flatten dp_tp=dp,tp"
        )
    return (name.strip() if eq else None), parts


def _parse_unflatten(text: str) -> tuple[str, dict[str, int]]:
    """``"world=dp:2,tp:4"``: the axis to split and the new axes' sizes, in order."""
    axis, eq, rest = text.partition("=")
    sizes: dict[str, int] = {}
    for item in rest.split(","):
        name, colon, size = (p.strip() for p in item.partition(":"))
        if not colon or not name or name in sizes:
            sizes = {}
            break
        sizes[name] = _parse_count(size, f"the size of {name!r} in --unflatten {text!r}")
    if not eq or not axis.strip() or not sizes:
        raise _CliError(
            f'--unflatten "{text}" is not axis=name:size,...; write e.g. '
            '--unflatten "world=dp:2,tp:4" (distinct new names)'
        )
    return axis.strip(), sizes


@final
@attrs.frozen
class _Axis:
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


def _build(
    spec: str, unflattens: Sequence[str], flattens: Sequence[str]
) -> tuple[Mesh, list[_Axis]]:
    """The root mesh (after the unflattens) and every axis to report."""
    mesh = parse_spec(spec)
    for text in unflattens:
        axis, sizes = _parse_unflatten(text)
        try:
            mesh = unflatten(mesh, axis, sizes)
        except MeshError as err:
            raise _CliError(f'--unflatten "{text}": {err}') from None
    axes = [_Axis(name, mesh) for name in mesh.axis_names]
    for text in flattens:
        name, parts = _parse_flatten(text)
        try:
            flat = flatten(mesh, parts, name)
        except MeshError as err:
            raise _CliError(f'--flatten "{text}": {err}') from None
        new = name if name is not None else "_".join(parts)
        if new in {a.name for a in axes}:
            raise _CliError(
                f'--flatten "{text}" names its axis {new!r}, which is taken; name it '
                f"with --flatten NAME={','.join(parts)}"
            )
        axes.append(_Axis(new, flat, parts))
    return mesh, axes


# -- host analysis ---------------------------------------------------------------------


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
    """How many groups of an axis straddle a host boundary (rank == index).

    A group's smallest index is its base ``b`` and its largest ``b + cosize - 1``,
    so it straddles iff ``b % host + cosize > host``; the bases are the values of the
    complement, whose residues are counted mode by mode in O(host * modes * bits).
    """
    groups = index_size // layout.size
    if layout.cosize > host:
        return groups
    if index_size <= host:
        return 0
    if host > _MAX_HOST:
        raise _CliError(
            f"--local-world-size {host} is too large to analyse; expected at most "
            f"{_MAX_HOST} (ranks per host, e.g. 8)"
        )
    dtype = np.int64 if index_size < 1 << 62 else np.object_
    counts: npt.NDArray[np.int64] = np.zeros(host, dtype=dtype)
    counts[0] = 1
    for size, stride in layout.complement(index_size).modes:
        counts = _add_progression(counts, size, stride % host)
    return int(counts[host - layout.cosize + 1 :].sum())


def _placement(axis: _Axis, host: int) -> str:
    crossing = crossing_groups(axis.layout, axis.mesh.index_size, host)
    if crossing == 0:
        return "intra-host"
    if crossing == axis.num_groups:
        return "cross-host"
    return f"mixed: {crossing} of {axis.num_groups} groups cross hosts"


def _hosts_of(ranks: Sequence[int], host: int) -> str:
    first, last = min(ranks) // host, max(ranks) // host
    if first == last:
        return f"host {first}"
    count = len(np.unique(np.asarray(ranks, dtype=np.int64) // host))
    return f"{count} hosts"


def _host_line(size: int, host: int) -> str:
    hosts = -(-size // host)
    partial = " (the last one partly filled)" if size % host else ""
    return f"{hosts} host{'s' if hosts != 1 else ''} of {host} ranks{partial}"


# -- formatting ------------------------------------------------------------------------


def format_ranks(
    ranks: Sequence[int], full: int = _GROUP_FULL, head: int = _GROUP_HEAD
) -> str:
    """``[0, 1, 2]``, or ``[0, 8, 16, 24, ..., 120]`` for a long group."""
    if len(ranks) <= full:
        return "[" + ", ".join(map(str, ranks)) + "]"
    return f"[{', '.join(map(str, ranks[:head]))}, ..., {ranks[-1]}]"


def _coord_str(names: Sequence[str], coord: Sequence[int]) -> str:
    return "(" + ", ".join(f"{n}={c}" for n, c in zip(names, coord, strict=True)) + ")"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
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


def _rank_at(mesh: Mesh, coord: Sequence[int]) -> int:
    """The rank at ``coord`` of a mesh with one instance."""
    return rank_of(mesh, sum(ax(c) for ax, c in zip(mesh.axes, coord, strict=True)))


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
        coord = (*lead_coord(block), *((row,) if row_n else ()), col)
        return _rank_at(mesh, coord)

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
            out.append(_coord_str(lead_n, lead_coord(block))[1:-1])
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


def _flattened_notes(axes: Sequence[_Axis]) -> list[str]:
    flat = [a for a in axes if a.parts]
    return [f"flattened: {a.name} = ({', '.join(a.parts)})" for a in flat]


def _example_groups(axis: _Axis) -> str:
    """The first two groups and the last, by their base (smallest) rank."""
    comp = axis.layout.complement(axis.mesh.index_size)
    bases = [0, min(comp.stride, default=0), comp.cosize - 1][: axis.num_groups]
    shown = [format_ranks(axis.group(b), full=4, head=3) for b in bases]
    if axis.num_groups > 3:
        shown.insert(2, "...")
    return ", ".join(shown)


def _axis_cells(axis: _Axis, host: int) -> list[str]:
    """The columns every describe table starts with: axis, size, groups, layout, hosts."""
    return [
        axis.name,
        str(axis.layout.size),
        str(axis.num_groups),
        str(axis.layout),
        _placement(axis, host),
    ]


def describe(
    spec: str,
    *,
    flattens: Sequence[str] = (),
    unflattens: Sequence[str] = (),
    rank: int | None = None,
    local_world_size: int = 8,
) -> str:
    """The text ``fmesh describe`` prints."""
    _check_host(local_world_size)
    mesh, axes = _build(spec, unflattens, flattens)
    if rank is not None and not 0 <= rank < mesh.size:
        raise _CliError(
            f'--rank {rank} is not in the mesh "{spec}" of {mesh.size} ranks; '
            f"expected a rank in 0..{mesh.size - 1}"
        )
    host = local_world_size
    out = [f"{mesh!r}: {mesh.size} ranks on {_host_line(mesh.size, host)}", ""]
    out.append(_grid_title(mesh, rank))
    out.extend(_grid(mesh, rank))
    out.append("")
    if rank is None:
        header = ["axis", "size", "groups", "layout", "hosts", "example groups"]
        rows = [[*_axis_cells(a, host), _example_groups(a)] for a in axes]
    else:
        coord = coordinate(mesh, rank)
        assert coord is not None  # checked above
        first = rank - rank % host
        out.append(
            f"rank {rank}: coordinate {_coord_str(mesh.axis_names, coord)} on host "
            f"{rank // host} (ranks {first}..{min(first + host, mesh.size) - 1})"
        )
        header = [
            "axis",
            "size",
            "groups",
            "layout",
            "hosts",
            "coord",
            f"group of rank {rank}",
        ]
        rows = [
            [*_axis_cells(a, host), str(a.coordinate(rank)), format_ranks(a.group(rank))]
            for a in axes
        ]
    out.extend(_table(header, rows, right={1, 2, 5} if rank is not None else {1, 2}))
    out.extend(_flattened_notes(axes))
    return "\n".join(out) + "\n"


def _check_host(local_world_size: int) -> None:
    if local_world_size < 1:
        raise _CliError(
            f"--local-world-size is {local_world_size}; expected the number of ranks "
            "per host, >= 1 (e.g. 8)"
        )


# -- plan ------------------------------------------------------------------------------


def _check_backend(backend: str) -> None:
    from torch.distributed import Backend

    known = [b for b in Backend.backend_list if b not in ("undefined", "fake")]
    for part in backend.split(","):
        name = part.rpartition(":")[2].strip().lower()
        if name not in known:
            raise _CliError(
                f"--backend {backend!r} names backend {name!r}; expected one of "
                f"{known}, or a device map such as 'cpu:gloo,cuda:nccl'"
            )


def plan(
    spec: str,
    *,
    world: int,
    rank: int = 0,
    flattens: Sequence[str] = (),
    unflattens: Sequence[str] = (),
    backend: str = "nccl",
    local_world_size: int = 8,
) -> str:
    """The text ``fmesh plan`` prints: a dry run of realize on the fake backend."""
    _check_host(local_world_size)
    mesh, axes = _build(spec, unflattens, flattens)
    if world < mesh.size:
        raise _CliError(
            f'--world {world} is smaller than the mesh "{spec}" of {mesh.size} ranks; '
            f"give --world {mesh.size} or more, or shrink the mesh"
        )
    if not 0 <= rank < world:
        raise _CliError(
            f"--rank {rank} is not in the world of {world} ranks; expected 0..{world - 1}"
        )
    t0 = time.perf_counter()
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    _check_backend(backend)
    t1 = time.perf_counter()
    logger.info("fmesh plan: torch imported in %.0f ms", (t1 - t0) * 1e3)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        t2 = time.perf_counter()
        logger.info("fmesh plan: fake world of %d initialized as rank %d", world, rank)
        before = cache_stats()
        timings: list[float] = []
        groups: dict[str, ProcessGroup] = {}
        meshes = [mesh, *(a.mesh for a in axes if a.parts)]
        realized = []
        for m in meshes:
            start = time.perf_counter()
            realized.append(realize(m))
            timings.append(time.perf_counter() - start)
        for a in axes:
            r = realized[0] if not a.parts else realized[meshes.index(a.mesh)]
            if r.coordinate is not None:
                groups[a.name] = r.group(a.name)
        after = cache_stats()
        return _plan_report(
            mesh,
            axes,
            world,
            rank,
            backend,
            local_world_size,
            groups,
            (after.created - before.created, after.reused - before.reused, after.live),
            timings,
            t2 - t1,
        )
    finally:
        destroy()
        dist.destroy_process_group()


def _plan_report(
    mesh: Mesh,
    axes: Sequence[_Axis],
    world: int,
    rank: int,
    backend: str,
    host: int,
    groups: dict[str, ProcessGroup],
    stats: tuple[int, int, int],
    timings: Sequence[float],
    init_s: float,
) -> str:
    import torch.distributed as dist

    out = [
        f"dry run of fmesh.realize on rank {rank} of a {world}-rank world "
        f"(fake backend; a real run would use {backend})",
        f"mesh {mesh!r}: {mesh.size} ranks on {_host_line(mesh.size, host)}",
    ]
    if mesh.size < world:
        out.append(
            f"the mesh covers ranks 0..{mesh.size - 1}; ranks {mesh.size}..{world - 1} "
            "of the world are not members"
        )
    coord = coordinate(mesh, rank)
    if coord is None:
        out.append(
            f"rank {rank} is not in the mesh: it gets coordinate None and creates no "
            "process groups"
        )
    else:
        out.append(
            f"rank {rank}: coordinate {_coord_str(mesh.axis_names, coord)} on host "
            f"{rank // host}"
        )
        out.append("")
        header = [
            "axis",
            "size",
            "group rank",
            "hosts",
            "process group",
            f"group of rank {rank}",
        ]
        rows = []
        seen: dict[int, str] = {}
        for a in axes:
            pg = groups[a.name]
            ranks = dist.get_process_group_ranks(pg)
            if id(pg) in seen:
                comm = f"the same group as {seen[id(pg)]}"
            elif pg.size() == 1:
                comm = "no communicator (size 1)"
            else:
                comm = f"{backend} communicator"
            seen.setdefault(id(pg), a.name)
            where = _placement(a, host)
            if where.startswith("mixed"):
                where += f" (this one: {_hosts_of(ranks, host)})"
            rows.append(
                [a.name, str(pg.size()), str(pg.rank()), where, comm, format_ranks(ranks)]
            )
        out.extend(_table(header, rows, right={1, 2}))
        out.extend(_flattened_notes(axes))
    created, reused, live = stats
    comms = sum(1 for pg in {id(g): g for g in groups.values()}.values() if pg.size() > 1)
    out.append("")
    out.append(
        f"process groups: {created} created, {reused} reused from fmesh's memo, "
        f"{live} live (fmesh.cache_stats()); {comms} would hold a {backend} communicator"
    )
    parts = ", ".join(f"{t * 1e3:.1f} ms" for t in timings)
    total = sum(timings) * 1e3
    out.append(
        f"realize: {total:.1f} ms for {len(timings)} mesh{'es' if len(timings) > 1 else ''}"
        + (f" ({parts})" if len(timings) > 1 else "")
        + f"; fake init_process_group: {init_s * 1e3:.0f} ms"
    )
    return "\n".join(out) + "\n"


# -- entry point -----------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line too."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"fmesh: error: {message} (see '{self.prog} --help')\n")
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fmesh",
        description="Draw an fmesh mesh, or dry-run realize for one rank on the fake backend.",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log progress to stderr (-vv: debug)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("spec", help=f"the mesh: {SPEC_HELP}")
        p.add_argument(
            "--flatten",
            action="append",
            default=[],
            metavar="[NAME=]A,B",
            help="add an axis flattening these axes (repeatable)",
        )
        p.add_argument(
            "--unflatten",
            action="append",
            default=[],
            metavar="AXIS=NAME:SIZE,...",
            help="split an axis of the spec, before any --flatten, e.g. "
            "world=dp:2,tp:4 (repeatable)",
        )
        p.add_argument(
            "--local-world-size", default="8", metavar="N", help="ranks per host (default 8)"
        )
        p.add_argument(
            "-v",
            "--verbose",
            action="count",
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )

    d = sub.add_parser("describe", help="draw the rank grid and each axis's groups")
    common(d)
    d.add_argument("--rank", default=None, metavar="R", help="show this rank's groups")
    p = sub.add_parser("plan", help="dry-run fmesh.realize for one rank (fake backend)")
    common(p)
    p.add_argument("--world", required=True, metavar="N", help="world size, e.g. 2**17")
    p.add_argument("--rank", default="0", metavar="R", help="the rank (default 0)")
    p.add_argument(
        "--backend",
        default="nccl",
        help="backend of the real run, for the report (default nccl)",
    )
    return parser


def _run(args: argparse.Namespace) -> str:
    host = _parse_count(args.local_world_size, "--local-world-size")
    rank = None if args.rank is None else _parse_count(args.rank, "--rank")
    if args.command == "describe":
        return describe(
            args.spec,
            flattens=args.flatten,
            unflattens=args.unflatten,
            rank=rank,
            local_world_size=host,
        )
    return plan(
        args.spec,
        world=_parse_count(args.world, "--world"),
        rank=0 if rank is None else rank,
        flattens=args.flatten,
        unflattens=args.unflatten,
        backend=args.backend,
        local_world_size=host,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for bad arguments)."""
    args = _parser().parse_args(argv)
    if args.verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG if args.verbose > 1 else logging.INFO)
    try:
        text = _run(args)
    except (MeshError, TypeError, ValueError) as err:
        message = " ".join(str(err).split())
        print(f"fmesh: error: {message}", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away; silence the flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0
