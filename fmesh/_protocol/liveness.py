"""No rank waits for a dead peer while a realize call creates groups, and no live rank
is taken for dead: the entry points ``creation.py`` and ``groups.py`` use.

A rank is alive for its peers until its process has exited: its kernel keeps its
liveness port (``port.py``) for it, whatever the process is doing. Before a creating
call's record, each rank opens its port and publishes its address (``prepare``: one
request, once per process). During the call, its ``Watch`` (``watch.py``), run by the
thread that waits, asks its kernel about the link to its successor on the ring of the
call's ranks and reads the call's verdict once per interval; every wait of the call is
cut into such slices, a group's rendezvous included (``creating``). No thread is
started per call; a process's port has one, started as its first watched call ends.
Memo hits run no watch; ``FMESH_PEER_WATCH=0`` turns the port and the links off (the
call's verdict, timeout and mismatch handling stay). Design, costs and bounds:
``docs/design/liveness.md``.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import logging
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from .._compat.nccl import creation_waits_in_given_store
from . import port
from .connections import store_address, thread_store
from .records import Ticket
from .watch import Watch

if TYPE_CHECKING:
    from .._compat import Store

__all__ = ["Watch", "creating", "current", "enabled", "prepare", "warm", "watching"]

logger = logging.getLogger("fmesh")
T = TypeVar("T")

started = 0
"""Watches started in this process (tests: a memo hit starts none)."""

_current: contextvars.ContextVar[Watch | None] = contextvars.ContextVar(
    "fmesh_watch", default=None
)
"""The watch of the call in progress in this thread."""


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
    """Open this process's port as a creating call is laid out, if it may have peers
    (a bind, once per process: its thread starts as the call ends)."""
    import torch.distributed as dist

    if not enabled():
        return
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            port.mine(os.environ.get("MASTER_ADDR"))
        return
    if dist.get_world_size() > 1 and dist.get_backend() != "fake":
        from .._compat import default_store

        port.mine(_host(default_store()))


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
    token = _current.set(watch)
    try:
        yield watch
    finally:
        _current.reset(token)
        if watch is not None:
            watch.close()


def current() -> Watch | None:
    return _current.get()


def creating(backend: str, store: Store, make: Callable[[Store], T]) -> T:
    """``make(s)`` with ``s`` the store a creation of ``backend`` should wait in: under
    a watch, this thread's connection with its waits cut into the watch's slices (a
    gloo group's rendezvous ends there when the call is given up); NCCL's in the
    watch's store only where its creation reads the store while it is made (torch
    2.15's nccl2: ``docs/design/nccl.md``), else on the plain connection (legacy NCCL
    keeps its store for native threads of its own, which must not call into Python).
    Without a watch, on this thread's connection.

    A construction that has passed its rendezvous connects its pairs in native code
    that nothing cancels (gloo's ``connectFullMesh``): to a peer whose process ended
    it fails within seconds (the port refuses; gloo gives up after its retries), to a
    host that went away in the milliseconds between the rendezvous and the connect,
    or to a peer that gave up on the call and lives on (gloo keeps its listener), it
    waits for the group's timeout: a rank that was stopped reads the verdict at its
    first check before it goes on (``Watch.cancelled``; ``docs/design/liveness.md``)."""
    watch = current()
    conn = thread_store(store)
    if watch is None:
        return make(conn)
    if "nccl" in backend.lower() and not creation_waits_in_given_store(backend):
        return make(conn)
    return make(watch.store_for(conn))
