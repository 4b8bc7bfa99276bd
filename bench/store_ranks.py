"""One simulated rank of the store-load rows (:mod:`bench.store_load`): its creating
call, fmesh's (the adapter below) or torch's (its rendezvous requests, its barrier).

Each rank is in one group of ``group`` ranks (the ``tp`` groups of an ``N/group x
group`` mesh). fmesh's call runs fmesh's real agreement and peer watch, with the
group's creation replaced by the store requests its backend's rendezvous sends and then
a wait of ``hold_s`` in the store fmesh gives the creation; torch's sends the same
rendezvous requests on the rank's own client, then sleeps (its creation waits in one
blocked request).
"""

from __future__ import annotations

import contextlib
import datetime
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import torch_ref
from .counting import CountingStore
from .shared import Json

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

TIMEOUT = datetime.timedelta(seconds=300)
CODE = 0x5EED
"""The call code every simulated rank agrees on."""


# == The adapter: fmesh's side of a creating call ==========================================
# The only code here that knows how fmesh agrees and watches peers during a creating
# call: it runs the steps of ``creation.create_groups`` (fmesh/_runtime/creation.py) and
# of ``groups.create``'s error path, with ``create`` in place of the group's creation.
# When the watch changes (fmesh/_protocol/liveness.py), re-point these two functions at
# it and widen SIZES; processes, counting, the server's CPU, torch's side and the rows
# (bench/store_load.py, bench/cases.py) stay as they are.


def setup_process(ranks: list[int]) -> None:
    """Once per crowd process, before any call: what its simulated ranks need to be
    watched. A real rank process runs one sentinel (``fmesh/_protocol/sentinel.py``);
    the simulated ranks of one crowd share this process's, as threads of one process
    would: a sentinel per simulated rank (4,096 processes on the bench's CPUs) would
    measure process scheduling, not the store, and the watch's store requests are the
    same either way. The victim is alone in its crowd, so killing its process kills
    the one thing that makes it dead: its sentinel exits with it (its stdin's end of
    file, ``PR_SET_PDEATHSIG``), and its watcher sees end of file. Started here, as
    ``liveness.warm`` does, so that it listens by the first call."""
    from fmesh._protocol import sentinel

    if ranks:
        _ = sentinel.mine().address  # waits for its port


_prepared: set[int] = set()
"""Simulated ranks of this process whose sentinel address is published: once per
rank, as a real rank publishes once per process (``liveness.prepare`` remembers one
store per sentinel, and each simulated rank has its own client)."""


def fmesh_call(
    store: Store,
    rank: int,
    world: int,
    members: list[int],
    prefix: str,
    backend: str,
    create: Callable[[Store], None],
    timeout: datetime.timedelta | None,
) -> None:
    """One creating call of ``rank`` as realize makes it (``create_groups`` and
    ``_agree`` in fmesh/_runtime/creation.py): publish the sentinel's address, agree
    with a closing barrier, clean up the stream's previous call, start the watch,
    create (waiting for ``members``) in the store fmesh gives a creation on
    ``backend``, the closing barrier, and close. Raises the call's error
    (``PeerLostError`` when a member died)."""
    from fmesh._core.errors import PeerLostError
    from fmesh._protocol import agreement, liveness

    if rank not in _prepared:
        liveness.prepare(store, rank)
        _prepared.add(rank)
    ticket = agreement.agree(
        store,
        rank=rank,
        ranks=range(world),
        code=CODE,
        record=lambda: agreement.Record(rank, CODE, "the store-load benchmark", ""),
        timeout=TIMEOUT,
        prefix=f"{agreement.KEY_ROOT}{prefix}",
        where="a store-load call",
        closing=True,
    )
    liveness.after_agreement(ticket)
    watch = liveness.start(ticket, timeout)
    try:
        with liveness.active(watch):
            try:
                create(liveness.store_for_creation(store, backend))
            except Exception as err:
                found = None if watch is None else watch.error("creating a group", err)
                if found is None:
                    raise
                raise found from err
            if watch is not None:
                watch.finish(2 * TIMEOUT)
    except BaseException as err:
        if watch is not None:
            if not isinstance(err, PeerLostError):
                watch.fail(err)
            watch.close()
        raise
    if watch is not None:
        watch.close()


SIZES = {"full": (1024, 2048), "quick": (256, 1024), "smoke": (16,)}
"""Simulated ranks per mode. A waiting rank reads its call's outcome once per
interval (2 requests), whatever its group's size; but at 4,096 ranks the crowds'
threads on 2 shared CPUs (load average over 1,000) leave sentinels' beats unread for
10 s, and live ranks are declared lost (silence): ``(1024, 2048, 4096)`` needs more
cores."""

# == end of the adapter ====================================================================


def rendezvous(store: Any, backend: str, prefix: str, members: list[int], rank: int) -> None:
    """The store requests a group's creation sends on ``rank`` (see the module doc)."""
    me = members.index(rank)
    if backend == "nccl":
        if me == 0:
            store.set(prefix + "0", b"u" * 128)
        else:
            store.get(prefix + "0")
        return
    store.set(prefix + str(me), b"a" * 64)
    for i in range(len(members)):
        store.wait([prefix + str(i)])
        store.get(prefix + str(i))


class OwnClient(CountingStore):
    """One simulated rank's client: never cloned (a clone would connect anew)."""

    def clone(self) -> CountingStore:
        return self


def run_rank(
    out: dict[int, Json],
    r: int,
    clients: tuple[OwnClient, ...],
    request: tuple[str, str, int],
    spec: Json,
) -> None:
    """Simulated rank ``r``'s part of a phase (on its fmesh or its torch connection):
    its calls, or the error that ended them."""
    phase, tag, calls = request
    client = clients[phase.startswith(("torch", "barrier"))]
    start = time.monotonic()
    try:
        for call in range(calls):
            one_call(phase, client, r, f"{tag}/{call}", spec)
        out[r] = {"seconds": time.monotonic() - start}
    except Exception as err:
        out[r] = {"error": type(err).__name__, "at": time.monotonic()}
        out[r]["lost"] = list(getattr(err, "lost", ()))
        if phase != "find":
            out[r]["trace"] = traceback.format_exc()


def one_call(phase: str, client: OwnClient, r: int, tag: str, spec: Json) -> None:
    """One creating call of simulated rank ``r`` in ``phase`` (see the module doc)."""
    world, group = spec["world"], spec["group"]
    first = r - r % group
    members = list(range(first, min(first + group, world)))
    prefix = f"bench/{tag}/g{first}/cpu/0/"
    if phase == "barrier":
        for b in range(spec["barriers"]):
            torch_ref.store_based_barrier(r, client, f"bench/{tag}/{b}", world, TIMEOUT)
        return
    impl, _, backend = phase.partition("-")
    hold = spec["hold_s"] if impl != "find" else TIMEOUT.total_seconds() / 2
    if impl == "torch":
        rendezvous(client, backend, prefix, members, r)
        time.sleep(hold)
        return

    def create(store: Store) -> None:
        import torch.distributed as dist

        rendezvous(store, backend, prefix, members, r)
        if impl == "find":
            client.inner.add(f"bench/{tag}/in", 1)  # uncounted: the bench's own
        with contextlib.suppress(dist.DistStoreError):  # the end of the hold
            store.wait([prefix + "never"], datetime.timedelta(seconds=hold))

    timeout = (
        None if spec["timeout_s"] is None else datetime.timedelta(seconds=spec["timeout_s"])
    )
    fmesh_call(client, r, world, members, tag + "/", backend or "gloo", create, timeout)
