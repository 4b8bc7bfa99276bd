"""recover: after a communication failure, the surviving ranks agree on who is lost.

The protocol (keys under ``fmesh/r/<epoch>/``): ``docs/design/agreement-protocol.md``.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._core.errors import LaunchError, MeshMismatchError
from .._protocol.records import append, wait_get, weight
from .._protocol.stream import call_code
from .checks import check_timeout
from .memo import state

if TYPE_CHECKING:
    from .._compat import Store

__all__ = ["KEY_ROOT", "after_check_in", "check_in", "recover"]

logger = logging.getLogger("fmesh")

KEY_ROOT = "fmesh/r/"
"""Every key of the recovery protocol starts with this string."""
_KEYS = ("n", "who", "coord", "read")
_KEPT = ("all", "verdict")
_GRACE = 5.0
"""Seconds a survivor waits for the coordinator's verdict before proposing one."""
_STORE_HELP = (
    "Recovery needs a store that outlives any rank: launch with torchrun, whose agent "
    "hosts the store (TORCHELASTIC_USE_AGENT_STORE), or host a TCPStore in a process "
    "that does not train."
)


def _ranks(text: str) -> list[int]:
    return [int(r) for r in text.split(",") if r]


def recover(*, timeout: datetime.timedelta) -> frozenset[int]:
    """Agree with the other surviving ranks on which ranks are lost; carry on without them.

    Call it on every surviving rank after a collective failed (a peer died or stalled),
    within ``timeout`` of one another. It returns, on every survivor, the same set:
    the ranks that did not check in within ``timeout`` (ranks lost in earlier
    recoveries are not counted again). From then on fmesh agrees among the survivors
    only; realizing a mesh that holds a lost rank is an error; groups among survivors
    stay memoized; the default group (which holds the lost ranks) is not used again.
    Build the next mesh with [`fmesh.shrink`][fmesh.shrink] or
    [`fmesh.replace`][fmesh.replace].

    Args:
        timeout: how long each survivor waits for the others to check in. Make it
            longer than the collective timeout (realize's ``timeout``), so that a
            survivor stuck in a collective with a rank that already moved on can
            still arrive.

    Returns:
        The ranks this recovery declared lost (empty if every rank checked in).

    Raises:
        MeshMismatchError: survivors disagree about the ranks lost before; this rank
            checked in after the others declared it lost; the store is gone.
        LaunchError: no default process group.
    """
    import torch.distributed as dist

    from .._compat import default_store

    wait = check_timeout(timeout, "recover")
    if wait is None:
        raise TypeError(
            "recover() needs a timeout, e.g. timeout=datetime.timedelta(seconds=60)"
        )
    if not dist.is_initialized():
        raise LaunchError(
            "fmesh.recover() needs the default process group of the job it recovers; "
            "call it after realize() (or torch.distributed.init_process_group)"
        )
    rank, world = dist.get_rank(), dist.get_world_size()
    with state.lock:
        before, epoch = state.loss.lost, state.loss.recoveries + 1
    if rank in before:
        raise MeshMismatchError(
            f"rank {rank} was declared lost by an earlier recovery; it cannot rejoin "
            "in-process: exit and come back through a restart"
        )
    expected = [r for r in range(world) if r not in before]
    view = sorted(before)
    w = weight(call_code("fmesh.recover", epoch, view), world)
    # The default store's own connection: a clone would connect anew, and a store that
    # died with its host would keep it trying for the store's whole timeout.
    conn = default_store()
    try:
        lost = _verdict(conn, epoch, rank, expected, view, w, wait)
    except dist.DistError as err:
        raise MeshMismatchError(
            f"rank {rank} lost the store during fmesh.recover() (recovery #{epoch}): "
            f"{err}. The process that hosted it may be the one that died. " + _STORE_HELP
        ) from err
    with state.lock:
        state.forget_lost(frozenset(lost), world)
    broken = _probe()
    logger.warning(
        "fmesh.recover on rank %d: ranks %s lost; groups among survivors that a failed "
        "collective broke, dropped: %d",
        rank,
        lost,
        broken,
    )
    return frozenset(lost)


def _probe() -> int:
    """Keep only the memoized groups that still work; how many were dropped.

    A failed collective can break a group of survivors too (gloo closes a pair when a
    collective times out; NCCL aborts the communicator). Every survivor runs a barrier
    on each group it holds, in one order (by members) on every rank, so the probes of
    different groups cannot wait on each other in a cycle.
    """
    import torch.distributed as dist

    with state.lock:
        held = sorted((key for key in state.group_memo if len(key[0]) > 1), key=lambda k: k[0])
        groups = [(key, state.group_memo[key]) for key in held]
    broken = []
    for key, pg in groups:
        try:
            dist.barrier(group=pg)
        except RuntimeError:  # torch's DistError: the group is gone
            broken.append(key)
    if broken:
        with state.lock:
            state.drop_groups(broken)
    return len(broken)


def check_in(conn: Store, epoch: int, rank: int, w: int) -> int:
    """Step 1: record this rank's arrival and add its weight; the sum so far."""
    p = f"{KEY_ROOT}{epoch}/"
    append(conn, p + "who", f"{rank},")
    return conn.add(p + "n", w)


_checked_in_hooks: list[Callable[[], None]] = []


def after_check_in(hook: Callable[[], None]) -> None:
    """Call ``hook()`` each time this rank has checked in to a recovery, before it
    waits for the verdict: the seam where fault tests make a survivor die mid-recover."""
    _checked_in_hooks.append(hook)


def _verdict(
    conn: Store,
    epoch: int,
    rank: int,
    expected: list[int],
    view: list[int],
    w: int,
    wait: datetime.timedelta,
) -> list[int]:
    import torch.distributed as dist

    p = f"{KEY_ROOT}{epoch}/"
    s = check_in(conn, epoch, rank, w)
    for hook in _checked_in_hooks:
        hook()
    if s % w:
        conn.compare_set(
            p + "verdict",
            "",
            f"x:rank {rank} considered ranks {view} lost before this recovery, another "
            "survivor did not (they made different numbers of recoveries, or one "
            "recovered alone)",
        )
        conn.set(p + "all", "1")
    elif s == len(expected) * w:
        conn.set(p + "all", "1")
    try:
        conn.wait([p + "all"], wait)
        verdict = conn.compare_set(p + "verdict", "", "v:").decode()
    except dist.DistStoreError:
        proposal = _propose(conn, p, rank, expected)
        verdict = conn.compare_set(p + "verdict", "", proposal).decode()
        conn.set(p + "all", "1")  # wake the survivors still waiting: it is decided
    if verdict.startswith("x:"):
        raise MeshMismatchError(
            f"survivors disagree about the ranks lost before: {verdict[2:]}. Every "
            "survivor must call fmesh.recover() after every failure, the same number "
            "of times."
        )
    lost = _ranks(verdict[2:])
    if rank in lost:
        raise MeshMismatchError(
            f"rank {rank} checked in to fmesh.recover() after the other survivors' "
            f"timeout of {wait.total_seconds():g}s, so they declared it lost (with "
            f"ranks {[r for r in lost if r != rank]}); it cannot rejoin in-process: exit "
            "and come back through a restart, or pass a longer recover(timeout=...)"
        )
    if conn.add(p + "read", 1) == len(expected) - len(lost):
        # The verdict and its wake-up key stay until the next recovery, so a survivor
        # that checks in later still learns it was declared lost.
        for key in _KEYS:
            conn.delete_key(p + key)
        previous = f"{KEY_ROOT}{epoch - 1}/"
        for key in _KEPT:
            conn.delete_key(previous + key)
    return lost


def _propose(conn: Store, p: str, rank: int, expected: list[int]) -> str:
    """After waiting in vain: the ranks that never checked in (read once, by the
    coordinator, unless it died before publishing)."""
    mine = str(rank)
    if conn.compare_set(p + "coord", "", mine).decode() != mine:
        raw = wait_get(conn, p + "verdict", _GRACE)
        if raw is not None:
            return raw.decode()
    here = set(_ranks(conn.get(p + "who").decode()))
    return "v:" + ",".join(str(r) for r in expected if r not in here)
