"""The store connections a creating call uses, and how a rank cut off from the store
learns it in seconds.

A TCPStore client serializes its requests, and a wait holds it. The main thread uses
the default store's own connection, as torch does (a new connection costs a round
trip, and torch looks up the name of every new client socket's address while holding
the GIL: a resolver that does not answer stalls the whole process for seconds). Any
other thread that realizes meshes (a stream of its own) clones the store once and
keeps the clone: threads sharing one connection would stall each other's waits.

While a watched call is in progress (``hardened``), every connection of this process
to the store's address gets ``TCP_USER_TIMEOUT`` (Linux): a request whose bytes the
store's host has not acknowledged within ``USER_TIMEOUT`` seconds ends the connection,
so a rank whose host or network is cut off from the store raises (a documented error,
``watch.py``) instead of waiting in the store client for the kernel's retransmissions
(about 15 minutes). The host's kernel acknowledges even while the store's process is
busy or stopped, so a slow store is never taken for a lost one. Between calls the
connections have the kernel's defaults again: torch's own use of its connection is
untouched. A clone keeps the timeout for good (fmesh alone uses it).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
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
_found: dict[tuple[str, int], list[tuple[int, str]]] = {}
"""Per store address: this process's connections to it (descriptor, socket identity),
found once; each call works on duplicates of them, closed when it ends, so a process
holds no descriptor more between calls."""
_held: dict[tuple[str, int], tuple[int, list[socket.socket]]] = {}
"""Per store address, while hardened: how many blocks hold it, and the duplicates."""


def forget_connections() -> None:
    """Make every thread clone its store connection anew, and find the connections to
    the store again: the runtime calls this when its memo is reset (``destroy``, a new
    default process group), whose store may be another one at the same address."""
    _generation[0] += 1
    with _lock:
        _found.clear()


def thread_store(store: Store) -> Store:
    """This thread's connection to ``store``: ``store`` itself on the main thread; a
    clone, made once per thread and kept, on any other thread (``store`` itself if it
    cannot be cloned)."""
    if threading.current_thread() is threading.main_thread():
        return store
    entry: tuple[Store, Store, int] | None = getattr(_local, "conn", None)
    if entry is not None and entry[0] is store and entry[2] == _generation[0]:
        return entry[1]
    clone = new_connection(store)
    _local.conn = (store, clone, _generation[0])
    return clone


def new_connection(store: Store) -> Store:
    """A new client of the same store, its socket given ``TCP_USER_TIMEOUT`` for good
    (the store itself if it cannot clone: torch cannot clone a prefix store over a
    store written in Python, such as a test's counting wrapper)."""
    if not _cloneable(store):
        return store
    address = store_address(store)
    with _lock:  # a clone's socket is found as the one socket it opened
        before = set(_sockets().values())
        try:
            clone = cast("Store", cast("_Cloneable", store).clone())
        except (RuntimeError, NotImplementedError, AttributeError):
            return store
        if address is not None:
            for fd, name in _connections_to(address):
                if name in before:
                    continue
                with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
                    _set_timeout(sock, USER_TIMEOUT)
    return clone


@contextlib.contextmanager
def hardened(store: Store) -> Iterator[None]:
    """For the block: every connection of this process to ``store``'s address gets
    ``TCP_USER_TIMEOUT`` (found once per process and store; each checked to be the
    same socket when a first block begins), and the kernel's default again once the
    last of the process's overlapping blocks ends (calls of several streams, or
    simulated ranks, in one process share one hardening)."""
    address = store_address(store)
    if address is None or getattr(socket, "TCP_USER_TIMEOUT", None) is None:
        yield
        return
    with _lock:
        holders, socks = _held.get(address, (0, []))
        if not holders:
            found = _found.get(address)
            if found is None or not all(_same(fd, name) for fd, name in found):
                found = _found[address] = _connections_to(address)
            for fd, _ in found:
                with contextlib.suppress(OSError):
                    socks.append(socket.socket(fileno=os.dup(fd)))
            for sock in socks:
                _set_timeout(sock, USER_TIMEOUT)
        _held[address] = (holders + 1, socks)
    try:
        yield
    finally:
        with _lock:
            holders, socks = _held.pop(address, (1, []))
            if holders > 1:
                _held[address] = (holders - 1, socks)
            else:
                for sock in socks:
                    _set_timeout(sock, 0.0)
                    sock.close()


hardened_count = [0]
"""Connections given the timeout so far (tests read it)."""


def _set_timeout(sock: socket.socket, seconds: float) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(seconds * 1000))
        if seconds:
            hardened_count[0] += 1


def _connections_to(address: tuple[str, int]) -> list[tuple[int, str]]:
    """This process's TCP connections to ``address``'s port (the store's clients)."""
    out = []
    for fd, name in _sockets().items():
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with sock:
            if _peer_port(sock) == address[1]:
                out.append((fd, name))
    return out


def _peer_port(sock: socket.socket) -> int | None:
    """The remote port of a connected TCP socket; ``None`` for anything else (a Unix
    socket, say a data loader's pipe, whose peer name is a path; a listening socket)."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        return None
    try:
        return int(sock.getpeername()[1])
    except OSError:  # not connected
        return None


def _same(fd: int, name: str) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == name
    except OSError:
        return False


def _sockets() -> dict[int, str]:
    """This process's descriptors that are sockets, by number, with the socket each
    names (a number can be closed and reused, a socket cannot)."""
    out: dict[int, str] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:  # not Linux: the kernel's defaults stay
        return out
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile (the listing's own)
            continue
        if target.startswith("socket:"):
            out[int(name)] = target
    return out


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


def _after_fork_in_child() -> None:
    # The parent's connections must not be used by a forked child: its threads clone
    # their own, and the connections to the store are found again.
    global _lock
    _lock = threading.Lock()
    _found.clear()
    for _, socks in _held.values():  # the child's copies of the call's duplicates
        for sock in socks:
            sock.close()
    _held.clear()
    _generation[0] += 1


os.register_at_fork(after_in_child=_after_fork_in_child)
