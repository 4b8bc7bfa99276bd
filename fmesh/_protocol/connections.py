"""The store connection each thread of a creating call uses, one of its own per thread.

A TCPStore client serializes its requests, and a wait holds it: threads sharing one
would stall each other, and torch's own use of the default store must not wait behind
fmesh's. So each thread that takes part in a creating call (the caller, a worker that
constructs a gloo group) talks to the store through a clone of the default store of
its own, made once per thread and kept.

Each clone's socket gets ``TCP_USER_TIMEOUT`` (Linux): a request whose bytes the
store's host has not acknowledged within ``USER_TIMEOUT`` seconds ends the connection,
so a rank whose host or network is cut off from the store raises (a documented error,
``watch.py``) instead of waiting in the store client for the kernel's retransmissions
(about 15 minutes). The host's kernel acknowledges even while the store's process is
busy or stopped, so a slow store is never taken for a lost one. torch's own connection
is left as it is.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from .._compat import Store

__all__ = [
    "USER_TIMEOUT",
    "forget_connections",
    "hardened",
    "new_connection",
    "store_address",
    "thread_store",
]

USER_TIMEOUT = 20.0
"""Seconds a request's bytes may go unacknowledged by the store's host."""

_local = threading.local()
_generation = [0]
_lock = threading.Lock()
hardened = [0]
"""Store sockets given ``TCP_USER_TIMEOUT`` in this process (tests read it)."""


def forget_connections() -> None:
    """Make every thread clone its store connection anew: the runtime calls this when
    its memo is reset (``destroy``, a new default process group), whose store may be
    another one at the same address."""
    _generation[0] += 1


def thread_store(store: Store) -> Store:
    """This thread's own connection to ``store`` (a clone made once per thread and
    store, its socket hardened), or ``store`` itself if it cannot be cloned."""
    entry: tuple[Store, Store, int] | None = getattr(_local, "conn", None)
    if entry is not None and entry[0] is store and entry[2] == _generation[0]:
        return entry[1]
    clone = new_connection(store)
    _local.conn = (store, clone, _generation[0])
    return clone


def drop_thread_store() -> None:
    """Forget this thread's connection (it failed): the next call clones anew."""
    _local.conn = None


def new_connection(store: Store) -> Store:
    """A new client of the same store with its socket hardened (the store itself if
    it cannot clone: torch cannot clone a prefix store over a store written in Python,
    such as a test's counting wrapper)."""
    if not _cloneable(store):
        return store
    address = store_address(store)
    with _lock:  # a clone's socket is found as the one descriptor it opened
        before = _descriptors() if address is not None else None
        try:
            clone = cast("Store", cast("_Cloneable", store).clone())
        except (RuntimeError, NotImplementedError, AttributeError):
            return store
        if before is not None and address is not None:
            seen = set(before.values())
            _harden({fd for fd, sock in _descriptors().items() if sock not in seen}, address[1])
    return clone


def _cloneable(store: object) -> bool:
    import torch.distributed as dist

    prefix_store = dist.PrefixStore  # type: ignore[attr-defined]  # implicit re-export
    while isinstance(store, prefix_store):
        store = store.underlying_store
    return type(store).__module__.startswith("torch")


class _Cloneable:
    def clone(self) -> object: ...


def store_address(store: object) -> tuple[str, int] | None:
    """The (host, port) of the TCPStore under ``store`` (through its prefix stores and
    wrappers), if there is one."""
    for _ in range(8):
        host, port = getattr(store, "host", None), getattr(store, "port", None)
        if isinstance(host, str) and host and isinstance(port, int) and port > 0:
            return host, port
        store = getattr(store, "underlying_store", None) or getattr(store, "inner", None)
        if store is None:
            break
    return None


def _descriptors() -> dict[int, str]:
    """This process's descriptors that are sockets, by number, with the socket each
    names (a number can be closed and reused, a socket cannot)."""
    out: dict[int, str] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:  # not Linux: clones keep the kernel's defaults
        return out
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile (the listing's own)
            continue
        if target.startswith("socket:"):
            out[int(name)] = target
    return out


def _harden(fds: set[int], port: int) -> None:
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is None:
        return
    for fd in fds:
        try:
            dup = os.dup(fd)
        except OSError:  # gone (the listing's own descriptor)
            continue
        try:
            sock = socket.socket(fileno=dup)
        except OSError:  # not a socket
            os.close(dup)
            continue
        with sock, contextlib.suppress(OSError):
            if sock.type == socket.SOCK_STREAM and sock.getpeername()[1] == port:
                sock.setsockopt(socket.IPPROTO_TCP, option, int(USER_TIMEOUT * 1000))
                hardened[0] += 1
