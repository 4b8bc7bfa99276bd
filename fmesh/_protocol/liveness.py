"""No rank waits for a dead peer while a realize call creates groups, and no live rank
is taken for dead: the entry points ``creation.py`` and ``groups.py`` use.

A rank is alive for its peers until its process has exited: its kernel keeps its
liveness port (``port.py``) for it, whatever the process is doing. Before a creating
call's record, each rank opens its port and publishes its address (``prepare``: one
request, once per process). During the call, its ``Watch`` (``watch.py``), run by the
threads that wait, asks its kernel about the link to its successor on the ring of the
call's ranks and reads the call's verdict once per interval; a gloo construction runs
on a kept worker thread (``workers.py``), so a given-up call never keeps its rank in
gloo's connect (``creating``). Memo hits run no watch; ``FMESH_PEER_WATCH=0`` turns
the port and the links off (the call's verdict, timeout and mismatch handling stay).
Design, costs and bounds: ``docs/design/liveness.md``.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar, cast

from . import port, workers
from .connections import store_address, thread_store
from .records import Ticket
from .watch import Watch

if TYPE_CHECKING:
    from .._compat import Store

__all__ = [
    "Watch",
    "abandoned",
    "creating",
    "current",
    "enabled",
    "prepare",
    "warm",
    "watching",
]

logger = logging.getLogger("fmesh")
T = TypeVar("T")

started = 0
"""Watches started in this process (tests: a memo hit starts none)."""
abandoned = 0
"""Group creations this process left blocked in torch (``creating``)."""

_local = threading.local()


def enabled() -> bool:
    """Whether creating calls watch their peers' liveness: on unless
    ``FMESH_PEER_WATCH`` is off (``0``, ``false``, ``off``, ``no``; read at each call)."""
    from .._compat.hook import switch

    return switch(
        "FMESH_PEER_WATCH",
        os.environ.get("FMESH_PEER_WATCH"),
        "keep it on",
        "turn the watch for peers lost while groups are created off",
    )


def _host(store: object) -> str | None:
    address = store_address(store)
    return address[0] if address is not None else os.environ.get("MASTER_ADDR")


def warm() -> None:
    """Open this process's port while a creating call is laid out, if it may have
    peers (it costs a bind and a thread start, once per process)."""
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() <= 1 or dist.get_backend() == "fake" or not enabled():
            return
        from .._compat import default_store

        port.mine(_host(default_store()))
    elif int(os.environ.get("WORLD_SIZE", "1")) > 1 and enabled():
        port.mine(os.environ.get("MASTER_ADDR"))


def prepare(store: Store, rank: int) -> None:
    """Before a watched call's record: this process's port is open, and its address is
    in ``store`` (one request, the first time per port and store)."""
    p = port.mine(_host(store))
    if p.published is not store:
        thread_store(store).set(port.KEY + str(rank), p.address.text())
        p.published = store


@contextlib.contextmanager
def watching(
    ticket: Ticket, patience: datetime.timedelta, timeout: datetime.timedelta | None
) -> Iterator[Watch | None]:
    """The call's watch (none for a call of one rank), this thread's current one for
    the block; closed when the block ends."""
    global started
    watch = None
    if ticket.n > 1:
        started += 1
        watch = Watch(ticket, patience, timeout, liveness=enabled())
    previous = getattr(_local, "watch", None)
    _local.watch = watch
    try:
        yield watch
    finally:
        _local.watch = previous
        if watch is not None:
            watch.close()


def current() -> Watch | None:
    return cast("Watch | None", getattr(_local, "watch", None))


def creating(backend: str, store: Store, make: Callable[[Store], T]) -> T:
    """``make(s)`` with ``s`` the store a creation of ``backend`` should wait in. Under
    a watch: gloo's on a worker thread (its own connection, waits sliced) while this
    thread watches, so a given-up call raises here at once (``DistNetworkError``, which
    the caller turns into the verdict's error) and leaves the worker to end at the
    group's timeout; NCCL's in this thread, in the watch's store where its creation
    reads the store only while it is made (torch 2.15's nccl2: ``docs/design/nccl.md``),
    else on this thread's plain connection (legacy NCCL keeps its store for native
    threads of its own, which must not call into Python). Without a watch, on this
    thread's connection."""
    import torch.distributed as dist

    from .._compat.nccl import creation_waits_in_given_store

    watch = current()
    if watch is None:
        return make(thread_store(store))
    if "nccl" in backend.lower():
        conn = thread_store(store)
        return make(watch.store_for(conn) if creation_waits_in_given_store(backend) else conn)
    handle = workers.submit(lambda: make(watch.store_for(thread_store(store))))
    conn = watch.ticket.conn
    while not handle.wait(watch.interval):
        # Given up: the worker's own waits end at their next slice; only a construction
        # stuck in native code is left behind.
        if (
            watch.cancelled(conn)
            and not handle.wait(watch.interval + 0.5)
            and handle.abandon(_destroy_late)
        ):
            global abandoned
            abandoned += 1
            logger.warning(
                "fmesh: rank %d leaves a group creation blocked in torch (its thread ends "
                "at the group's timeout)",
                watch.ticket.rank,
            )
            raise dist.DistNetworkError("fmesh: this call was given up")
    return handle.result()


def _destroy_late(pg: object) -> None:
    import torch.distributed as dist

    try:
        dist.destroy_process_group(cast("dist.ProcessGroup", pg))
    except Exception as err:  # already gone
        logger.debug("fmesh: destroying a group made after its call was given up: %s", err)
