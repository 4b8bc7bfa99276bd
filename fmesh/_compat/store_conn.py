"""A store connection that another thread can break, waking a wait blocked in it.

torch's store waits (and the gloo rendezvous, which waits in the store) block in C++
until the key appears or the timeout passes; nothing in torch's API cancels them. A
TCPStore client is one socket: shutting that socket down from another thread makes the
blocked receive return at once, and the wait raises ``DistNetworkError``. This module
opens a fresh client (``clone``) and finds its socket among the process's file
descriptors: the one new socket whose peer is the store's port.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

__all__ = ["breakable_connection", "store_port"]

_lock = threading.Lock()
"""fmesh's own clones are opened one at a time, so two never hide each other's socket."""


def store_port(store: Store) -> int | None:
    """The TCP port of the TCPStore under ``store`` (through PrefixStores), if any."""
    from torch._C._distributed_c10d import PrefixStore, TCPStore

    inner: object = store
    while isinstance(inner, PrefixStore):
        inner = inner.underlying_store
    return inner.port if isinstance(inner, TCPStore) else None


def _sockets() -> set[int]:
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                found.add(int(name))
        except OSError:  # closed meanwhile
            pass
    return found


def _peer_port(fd: int) -> int | None:
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        peer = sock.getpeername()
        return int(peer[1]) if isinstance(peer, tuple) else None
    except OSError:
        return None
    finally:
        sock.close()  # closes the duplicate only


def breakable_connection(store: Store) -> tuple[Store, Callable[[], None]] | None:
    """A new client of ``store`` and a function that breaks it (from any thread), or
    ``None`` where that cannot be done (not a TCPStore, no ``/proc``, or the socket is
    ambiguous). After the break every operation on the client fails; drop it."""
    port = store_port(store)
    if port is None or not os.path.isdir("/proc/self/fd"):
        return None
    with _lock:
        before = _sockets()
        try:
            conn = cast("Any", store).clone()
        except (RuntimeError, NotImplementedError):
            return None
        fresh = [fd for fd in _sockets() - before if _peer_port(fd) == port]
    if len(fresh) != 1:
        return None  # the clone is dropped (its socket closed)
    fd = fresh[0]
    ino = os.stat(fd).st_ino

    def interrupt() -> None:
        # The descriptor number may have been reused once the client is gone: only a
        # socket with the same inode is ours.
        try:
            if os.stat(fd).st_ino != ino:
                return
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.close()

    return cast("Store", conn), interrupt
