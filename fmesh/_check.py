"""The cross-rank mesh check: ranks that disagree get an error, not a hang.

Before ``realize`` creates groups, each rank publishes a digest of what it realizes
under its realize-call number in the default store and compares it with its
predecessor and successor along every axis (O(ndim) store reads). When a group
creation still fails (a rank further away disagreed, or never came), the failing rank
reads the members' records and explains the failure; ranks that gave up leave a
record saying why, so a chain of waiting ranks all learn the cause.
"""

from __future__ import annotations

import datetime
import time
from typing import TYPE_CHECKING, final

import attrs

from ._errors import MeshMismatchError
from ._mesh import Mesh
from ._ops import index_of, rank_of

if TYPE_CHECKING:
    from ._c10d import Store

__all__ = ["CallRecord", "compare_with_neighbours", "diagnose", "record_failure"]

_MISMATCH_HELP = (
    "Every rank must call fmesh.realize() with the same mesh, backend and options, "
    "in the same order (SPMD). Check for rank-dependent mesh construction (e.g. sizes "
    "computed from the local device count) and for realize() calls made on some "
    "ranks only."
)


@final
@attrs.frozen(slots=True)
class CallRecord:
    """What this rank published for one realize call."""

    prefix: str
    """Store key prefix of the call: ``fmesh/<generation>/realize/<call>/``."""
    call: int
    digest: str
    """Digest of (mesh, backends, options)."""
    summary: str
    """Human-readable description of what the rank realizes."""


def neighbours(mesh: Mesh, rank: int) -> list[int]:
    """This rank's predecessor and successor along every axis (O(ndim))."""
    index = index_of(mesh, rank)
    if index is None:
        return []
    out: set[int] = set()
    for layout in mesh.axes:
        if layout.size == 1:
            continue
        c = layout.coordinate_of(index)
        base = layout.group_base(index)
        for step in (1, -1):
            out.add(rank_of(mesh, base + layout((c + step) % layout.size)))
    out.discard(rank)
    return sorted(out)


def compare_with_neighbours(
    store: Store, record: CallRecord, mesh: Mesh, rank: int, timeout: datetime.timedelta
) -> None:
    """Publish ``record`` and compare it with the neighbours' ones; raise on mismatch."""
    prefix, call, digest, summary = record.prefix, record.call, record.digest, record.summary
    store.set(prefix + str(rank), f"{digest}\n{summary}")
    peers = neighbours(mesh, rank)
    if not peers:
        return
    keys = [prefix + str(p) for p in peers]
    try:
        store.wait(keys, timeout)
    except Exception:  # DistStoreError: some neighbour never reached this call
        late = [p for p, k in zip(peers, keys, strict=True) if not store.check([k])]
        if late:
            message = (
                f"rank {rank} waited {timeout.total_seconds():g}s at realize call "
                f"#{call} ({summary}) but ranks {late} in its groups never called "
                f"realize that many times. {_MISMATCH_HELP}"
            )
            record_failure(store, prefix, rank, message)
            raise MeshMismatchError(message) from None
    for peer, raw in zip(peers, store.multi_get(keys), strict=True):
        their_digest, _, their_summary = raw.decode().partition("\n")
        if their_digest != digest:
            message = (
                f"rank {rank} and rank {peer} disagree at realize call "
                f"#{call}: rank {rank} realizes {summary}, rank {peer} "
                f"realizes {their_summary}. {_MISMATCH_HELP}"
            )
            record_failure(store, prefix, rank, message)
            raise MeshMismatchError(message)


def record_failure(store: Store, prefix: str, rank: int, message: str) -> None:
    """Tell the other ranks why this rank will not join their groups.

    Two records: one under this rank (for its group peers) and one for the whole
    call, so a rank stuck behind a peer that is itself stuck behind the failed rank
    (a chain of group creations) still learns the cause in O(1).
    """
    store.set(f"{prefix}failed/{rank}", message)
    store.set(f"{prefix}failed", f"rank {rank}: {message}")


def diagnose(
    store: Store,
    record: CallRecord,
    members: tuple[int, ...],
    me: int,
    err: Exception,
    grace: float,
) -> Exception:
    """Explain a failed group creation by the records of this call.

    A peer that failed the mesh check records why within the check timeout, which can
    end a moment after this rank's creation timeout; so wait up to ``grace`` seconds
    for a record before giving up and returning torch's own error.
    """
    deadline = time.monotonic() + grace
    while True:
        found = _diagnose_once(store, record, members, me, err)
        if found is not None or time.monotonic() >= deadline:
            return err if found is None else found
        time.sleep(0.05)


def _diagnose_once(
    store: Store,
    record: CallRecord,
    members: tuple[int, ...],
    me: int,
    err: Exception,
) -> MeshMismatchError | None:
    prefix, digest, summary = record.prefix, record.digest, record.summary
    absent: list[int] = []
    for peer in members:
        if peer == me:
            continue
        key = prefix + str(peer)
        failed = f"{prefix}failed/{peer}"
        if store.check([failed]):
            return MeshMismatchError(
                f"creating the group {list(members)} failed on rank {me} because "
                f"rank {peer} gave up on this realize call: "
                f"{store.get(failed).decode()} (torch said: {err})"
            )
        if not store.check([key]):
            absent.append(peer)
            continue
        their_digest, _, their_summary = store.get(key).decode().partition("\n")
        if their_digest != digest:
            return MeshMismatchError(
                f"creating the group {list(members)} failed on rank {me} because "
                f"rank {peer} realizes a different mesh at the same call: rank {me} "
                f"realizes {summary}, rank {peer} realizes {their_summary}. "
                f"{_MISMATCH_HELP} (torch said: {err})"
            )
    if absent:
        return MeshMismatchError(
            f"creating the group {list(members)} failed on rank {me}: ranks {absent} "
            f"never reached this realize call ({summary}). {_MISMATCH_HELP} "
            f"(torch said: {err})"
        )
    if store.check([f"{prefix}failed"]):
        # The members are stuck behind another rank that failed the check.
        return MeshMismatchError(
            f"creating the group {list(members)} failed on rank {me} while realizing "
            f"{summary}, because another rank stopped at the mesh check: "
            f"{store.get(f'{prefix}failed').decode()} (torch said: {err})"
        )
    return None
