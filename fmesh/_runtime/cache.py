"""The public face of the group memo: ``cache_stats`` and ``destroy``."""

from __future__ import annotations

import logging
from typing import final

import attrs

from .memo import state

__all__ = ["CacheStats", "cache_stats", "destroy"]

logger = logging.getLogger("fmesh")


@final
@attrs.frozen(slots=True)
class CacheStats:
    """Counters of the process-wide group memo."""

    created: int
    """Process groups fmesh created in this process (since the last destroy)."""
    reused: int
    """Group requests answered from the memo instead of creating a group."""
    live: int
    """Groups fmesh holds now."""


def cache_stats() -> CacheStats:
    """Counters of groups created and reused by [`realize`][fmesh.realize] in this process.

    >>> from fmesh import cache_stats
    >>> cache_stats().created >= 0
    True
    """
    with state.lock:
        return CacheStats(
            created=state.created, reused=state.reused, live=len(state.created_pgs)
        )


def destroy() -> None:
    """Destroy every process group fmesh created; [`realize`][fmesh.realize] works again after.

    The default (world) group is left alone, even when fmesh initialized it; tear it
    down with ``torch.distributed.destroy_process_group()``.
    """
    import torch.distributed as dist

    from .._compat import is_live

    with state.lock:
        pgs = list(state.created_pgs)
        state.reset()
        state.created = 0
        state.reused = 0
    for pg in pgs:
        if is_live(pg):
            dist.destroy_process_group(pg)
    logger.info("fmesh.destroy: destroyed %d groups", len(pgs))
