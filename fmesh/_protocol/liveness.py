"""No rank waits for a dead peer while a realize call creates groups, and no live rank
is taken for dead: the entry points ``realize`` and ``groups`` use.

Liveness comes from each rank's *sentinel* (``sentinel.py``), a child process that
beats over TCP while its rank's process exists, whatever that process is doing (stopped,
swapping, a thread holding the GIL). Before the agreement of a creating call, each
rank makes sure its sentinel runs and its address is in the store (``prepare``: one
request, once per process). From the agreement to the end of the call, a *watch*
(``watch.py``) on every rank holds one connection to the sentinel of its successor on
the ring of the call's ranks: end of file (the process died) or ``silence`` seconds
without a byte (its host or network died) make the peer lost; the watcher publishes
the verdict under the call's keys, and every waiting rank reads it once per interval
(in the slices of its waits, ``_compat/interruptible.py``) and raises
``PeerLostError``. A rank whose own sentinel died, or whom the verdict names, learns
it was given up on at its next slice; a gloo construction runs in a worker thread, so
it never keeps its rank in gloo's connect (``creating``). Memo hits run no watch;
``FMESH_PEER_WATCH=0`` turns it off. Design, costs and bounds:
``docs/design/liveness.md``.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar, cast

from . import agreement as _agree
from . import sentinel as _sentinel
from .records import Ticket
from .watch import Watch, pending, stream_of

if TYPE_CHECKING:
    from .._compat import Store

__all__ = [
    "Watch",
    "active",
    "after_agreement",
    "creating",
    "current",
    "enabled",
    "prepare",
    "start",
    "store_for_creation",
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
    """Whether creating calls run a watch: on unless ``FMESH_PEER_WATCH`` is off (``0``,
    ``false``, ``off``, ``no``; read at each call)."""
    from .._compat.hook import switch

    return switch(
        "FMESH_PEER_WATCH",
        os.environ.get("FMESH_PEER_WATCH"),
        "keep it on",
        "turn the watch for peers lost while groups are created off",
    )


def warm() -> None:
    """Start this process's sentinel while a creating call is laid out (it listens
    by the time ``prepare`` needs its port), if the call may have peers."""
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() <= 1 or dist.get_backend() == "fake" or not enabled():
            return
        from .._compat import default_store

        _sentinel.mine(_store_host(default_store()))
    elif int(os.environ.get("WORLD_SIZE", "1")) > 1 and enabled():
        _sentinel.mine(os.environ.get("MASTER_ADDR"))


def prepare(store: Store, rank: int) -> None:
    """Before the agreement of a call that will be watched: this process's sentinel
    runs, and its address is in ``store`` (one request, the first time per sentinel),
    so every watcher finds it once the agreement ends."""
    s = _sentinel.mine(_store_host(store))
    if s.published is not store:
        _agree.thread_store(store).set(_sentinel.KEY + str(rank), s.address.text())
        s.published = store


def _store_host(store: object) -> str | None:
    """The host of the TCPStore under ``store`` (through its prefix stores), else
    ``MASTER_ADDR``."""
    for _ in range(8):
        host = getattr(store, "host", None)
        if isinstance(host, str) and host:
            return host
        store = getattr(store, "underlying_store", None)
        if store is None:
            break
    return os.environ.get("MASTER_ADDR")


def after_agreement(ticket: Ticket) -> None:
    """Every rank of ``ticket`` left its stream's previous call: the call's first rank
    deletes what that call left (two keys, if it ended well)."""
    store, keys = pending.pop(stream_of(ticket.prefix), (None, ()))
    if keys and store is ticket.store and ticket.rank == ticket.ranks[0]:
        for key in keys:
            ticket.conn.delete_key(key)


def start(ticket: Ticket | None, timeout: datetime.timedelta | None) -> Watch | None:
    """A watch for a creating call whose agreement counts a closing barrier."""
    global started
    if ticket is None or not ticket.closing or len(ticket.ranks) <= 1:
        return None
    started += 1
    return Watch(ticket, timeout)


@contextlib.contextmanager
def watching(
    ticket: Ticket | None, timeout: datetime.timedelta | None
) -> Iterator[Watch | None]:
    """``start``, the watch this thread's current one (``current()``) for the block."""
    with active(start(ticket, timeout)) as watch:
        yield watch


@contextlib.contextmanager
def active(watch: Watch | None) -> Iterator[Watch | None]:
    """Make ``watch`` this thread's current one (``current()``) for the block."""
    previous = getattr(_local, "watch", None)
    _local.watch = watch
    try:
        yield watch
    finally:
        _local.watch = previous


def current() -> Watch | None:
    return cast("Watch | None", getattr(_local, "watch", None))


def store_for_creation(store: Store, backend: str) -> Store:
    """The store a group creation should wait in: the current watch's interruptible
    one (gloo's rendezvous ends with its constructor), else this thread's own
    connection. torch's legacy NCCL backend keeps its store for threads of its own (its
    watchdog and monitor read it while the group lives), which must not call into
    Python: its unique-id exchange is not cut short, and raises ``PeerLostError`` at
    its timeout. torch 2.15's nccl2 reads its store only while it is created: it waits
    in the watch's store (``docs/design/nccl.md``)."""
    from .._compat.nccl import creation_waits_in_given_store

    watch = current()
    # NCCL (issue 33, item 6): the one point where a NCCL creation meets the watch.
    nccl = "nccl" in backend.lower()
    if watch is not None and (not nccl or creation_waits_in_given_store(backend)):
        return watch.store
    return _agree.thread_store(store)


def creating(backend: str, make: Callable[[], T]) -> T:
    """``make()``; for gloo under a watch, in a worker thread while this thread
    watches: gloo connects its pairs in native code that nothing cancels, so a
    given-up call raises here at once (``DistNetworkError``, which the caller turns
    into the verdict's error) and leaves the worker to end at the group's timeout; a
    group it makes after that is destroyed, never handed out."""
    import torch.distributed as dist

    watch = current()
    if watch is None or "nccl" in backend.lower():
        return make()
    box: list[tuple[bool, object]] = []
    lock, done, late = threading.Lock(), threading.Event(), [False]
    context = contextvars.copy_context()  # the caller's (group descriptions, stream)

    def work() -> None:
        try:
            box.append((True, context.run(make)))
        except BaseException as err:  # handed to the caller, or dropped if late
            box.append((False, err))
        with lock:
            done.set()
            left = late[0]
        if left and box[0][0] and box[0][1] is not None:
            _destroy_late(box[0][1])

    rank = watch.ticket.rank
    threading.Thread(target=work, name=f"fmesh-create-{rank}", daemon=True).start()
    while not done.wait(min(0.1, watch.interval)):
        if watch.cancelled():
            with lock:
                if not done.is_set():
                    global abandoned
                    abandoned += 1
                    late[0] = True
                    logger.warning(
                        "fmesh: rank %d leaves a group creation blocked in torch (its "
                        "thread ends at the group's timeout)",
                        rank,
                    )
                    raise dist.DistNetworkError("fmesh: this call was given up")
            break
    ok, value = box[0]
    if not ok:
        raise cast("BaseException", value)
    return cast("T", value)


def _destroy_late(pg: object) -> None:
    import torch.distributed as dist

    try:
        dist.destroy_process_group(cast("dist.ProcessGroup", pg))
    except Exception as err:  # already gone
        logger.debug("fmesh: destroying a group made after its call was given up: %s", err)
