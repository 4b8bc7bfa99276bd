"""``fmesh plan``: a dry run of ``fmesh.realize`` for one rank on torch's fake backend.

The fake backend creates process groups without any communication, so one process can
play rank 70001 of a 131072-rank world. torch is imported when ``dry_run_text`` runs,
never at import.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._compat import init_fake_world
from .._core.mesh import Mesh
from .._core.queries import coordinate
from .._runtime.cache import cache_stats, destroy
from .._runtime.realize import realize
from .describe import (
    ShownAxis,
    a_or_an,
    coord_str,
    flattened_notes,
    format_ranks,
    host_line,
    hosts_of,
    placement,
    table,
)

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["known_backends", "dry_run_text"]

logger = logging.getLogger("fmesh")


def known_backends() -> list[str]:
    """The c10d backends a real run could use (imports torch)."""
    from torch.distributed import Backend

    return [b for b in Backend.backend_list if b not in ("undefined", "fake")]


def dry_run_text(
    mesh: Mesh,
    axes: Sequence[ShownAxis],
    *,
    world: int,
    rank: int,
    backend: str,
    ranks_per_host: int,
) -> str:
    """Realize ``mesh`` and every flattening in ``axes`` as ``rank`` of a fake world.

    Initializes torch's ``fake`` process group for the call and tears it (and fmesh's
    groups) down before returning the report ``fmesh plan`` prints.
    """
    t0 = time.perf_counter()
    import torch.distributed as dist

    t1 = time.perf_counter()
    logger.info("fmesh plan: torch imported in %.0f ms", (t1 - t0) * 1e3)
    init_fake_world(rank, world)
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
        return _report(
            mesh,
            axes,
            world,
            rank,
            backend,
            ranks_per_host,
            groups,
            (after.created - before.created, after.reused - before.reused, after.live),
            timings,
            t2 - t1,
        )
    finally:
        destroy()
        dist.destroy_process_group()


def _report(
    mesh: Mesh,
    axes: Sequence[ShownAxis],
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
        f"dry run of fmesh.realize on rank {rank} of {a_or_an(world)} {world}-rank world "
        f"(fake backend; a real run would use {backend})",
        f"mesh {mesh!r}: {mesh.size} ranks on {host_line(mesh, host)}",
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
            f"rank {rank}: coordinate {coord_str(mesh.axis_names, coord)} on host "
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
            where = placement(a, host)
            if where.startswith("mixed"):
                where += f" (this one: {hosts_of(ranks, host)})"
            rows.append(
                [a.name, str(pg.size()), str(pg.rank()), where, comm, format_ranks(ranks)]
            )
        out.extend(table(header, rows, right={1, 2}))
        out.extend(flattened_notes(axes))
    created, reused, live = stats
    comms = sum(1 for pg in {id(g): g for g in groups.values()}.values() if pg.size() > 1)
    out.append("")
    out.append(
        f"process groups: {created} created, {reused} reused from fmesh's memo, "
        f"{live} live (fmesh.cache_stats()); {comms} of this rank's groups need a "
        f"communicator ({backend})"
    )
    parts = ", ".join(f"{t * 1e3:.1f} ms" for t in timings)
    total = sum(timings) * 1e3
    out.append(
        f"realize: {total:.1f} ms for {len(timings)} mesh{'es' if len(timings) > 1 else ''}"
        + (f" ({parts})" if len(timings) > 1 else "")
        + f"; fake init_process_group: {init_s * 1e3:.0f} ms"
    )
    return "\n".join(out) + "\n"
