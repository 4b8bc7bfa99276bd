"""This process's liveness port: its peers know it is alive for as long as its kernel
keeps a TCP port of its open, whatever the process itself is doing.

A rank's process listens on one TCP port (bound at its first creating call, on the
address that reaches the store's host). Its kernel completes a watcher's connection
into the port's backlog and answers TCP keepalive probes on it while the process is
stopped, frozen with everything it started (a cgroup freeze, a suspended job step),
swapping, or held up by a thread holding the GIL; the moment the process exits, the
kernel closes the port, resets every connection to it, and the port refuses new ones.
So a watcher (``links.py``) learns of a death within milliseconds and of a host or a
network that is gone from its own kernel's keepalive, with no process or beat of the
rank's own.

One daemon thread per process (started as the process's first watched call ends, or
once a call has lasted a second: until then the backlog holds what connects) keeps the
port usable against whatever reaches it: it accepts (epoll,
any descriptor number), reads each connection's hello with a deadline, keeps the
connections that present this port's token (the watchers, told apart from strangers)
and closes the rest; it holds at most ``MAX_PENDING`` strangers
and ``MAX_WATCHERS`` watchers (the oldest goes first: a watcher whose connection
closes connects again), so no flood grows its descriptors. An ``accept`` that fails
for want of descriptors (``EMFILE``) frees a reserved one to take the connection off
the queue and close it, so it never spins. Nothing is logged per connection.

A forked child of the rank (a data loader, ``multiprocessing``) closes its copies of
the port and its connections at once (``os.register_at_fork``), so it never keeps a
dead rank alive; a child that ``exec``s has none (Python's sockets are not inherited).
The design and its measurements: ``docs/design/liveness.md``.
"""

from __future__ import annotations

import _thread
import collections
import contextlib
import errno
import logging
import os
import secrets
import selectors
import socket
import threading
import time
from typing import final

import attrs

__all__ = [
    "GREETING",
    "HELLO",
    "KEY",
    "MAX_PENDING",
    "MAX_WATCHERS",
    "Address",
    "Port",
    "local_host",
    "mine",
    "started",
]

logger = logging.getLogger("fmesh")

KEY = "fmesh/l/"
"""Where each rank publishes its port's address (``host|port|token``): one key per rank
for the life of the store, written once per process, read once per watcher."""
HELLO = b"fmesh-watch "
"""What a watcher sends first: ``HELLO + token + b"\\n"``."""
GREETING = b"fmesh-rank "
"""What the port answers a watcher with the right token: ``GREETING + token + b"\\n"``
(when its thread runs: the kernel's answers are what count)."""
MAX_PENDING = 64
"""Connections without a valid hello held at once (the oldest is closed first)."""
MAX_WATCHERS = 64
"""Watchers' connections held at once (the oldest is closed first: it connects again)."""
HELLO_S = 5.0
"""Seconds a connection has to send its hello."""
_LINE = 256
"""The longest hello read."""


@final
@attrs.frozen(slots=True)
class Address:
    """Where a rank's port listens, and the token its watchers present."""

    host: str
    port: int
    token: str

    def text(self) -> str:
        return f"{self.host}|{self.port}|{self.token}"

    @classmethod
    def parse(cls, raw: bytes) -> Address:
        host, port, token = raw.decode().split("|")
        return cls(host, int(port), token)


def local_host(target: str | None) -> str:
    """The address of this host that peers can reach: the local end of the route to
    ``target`` (the store's host; a UDP socket's connect sends nothing), 127.0.0.1
    without one."""
    if not target:
        return "127.0.0.1"
    try:
        # An ASCII name as bytes: a str would import the idna codec (~10 ms) first.
        name = target.encode() if target.isascii() else target
        info = socket.getaddrinfo(name, 1, type=socket.SOCK_DGRAM)[0]
        with socket.socket(info[0], socket.SOCK_DGRAM) as probe:
            probe.connect(info[4])
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"


@final
class Port:
    """This process's liveness port and the thread that keeps it (module docstring)."""

    def __init__(self, host: str) -> None:
        started = time.perf_counter()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._srv = socket.socket(family, socket.SOCK_STREAM)
        self._srv.bind((host, 0))
        # The backlog holds watchers' connections while the process cannot accept.
        self._srv.listen(socket.SOMAXCONN)
        self._srv.setblocking(False)
        self.owner = os.getpid()
        self.address = Address(host, int(self._srv.getsockname()[1]), secrets.token_hex(8))
        self._hello = HELLO + self.address.token.encode() + b"\n"
        self._greeting = GREETING + self.address.token.encode() + b"\n"
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._srv, selectors.EVENT_READ)
        self._pending: collections.OrderedDict[socket.socket, tuple[float, bytes]] = (
            collections.OrderedDict()
        )
        self._watchers: collections.OrderedDict[socket.socket, None] = (
            collections.OrderedDict()
        )
        self._reserve: int | None = _reserve()
        self._closed = False
        self.published: object | None = None
        """The store this port's address was published in (once per store)."""
        self._starting = threading.Lock()
        self._serving = False
        self._ended = False
        self.startup_s = time.perf_counter() - started
        """Seconds this process spent opening the port."""

    # -- what callers ask -------------------------------------------------------------

    def serve(self) -> None:
        """Start the port's thread if it has not started (until then the kernel keeps
        what connects in the backlog, and answers it). The caller does not wait for
        it to run (``_thread``: ``threading`` would)."""
        with self._starting:
            if self._serving or self._closed:
                return
            self._serving = True
        _thread.start_new_thread(self._serve, ())

    def alive(self) -> bool:
        """Whether the port is open, its thread running or yet to start (this
        process's own port)."""
        return not self._closed and not self._ended and self.owner == os.getpid()

    def held(self) -> tuple[int, int]:
        """(strangers, watchers) whose connections the port holds now."""
        return len(self._pending), len(self._watchers)

    # -- the thread ---------------------------------------------------------------------

    def _serve(self) -> None:
        threading.current_thread().name = "fmesh-liveness"
        try:
            while not self._closed:
                try:
                    self._step()
                except Exception as err:  # never let the port's thread end on a surprise
                    logger.debug("fmesh: liveness port: %s", err)
                    time.sleep(0.05)
        finally:
            self._ended = True

    def _step(self) -> None:
        now = time.monotonic()
        deadline = next(iter(self._pending.values()), (None, b""))[0]
        # At least every few seconds: a closed port's thread ends.
        wait = 5.0 if deadline is None else min(5.0, max(0.0, deadline - now))
        for key, _ in self._sel.select(wait):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock is self._srv:
                self._accept()
            elif sock in self._watchers:
                self._from_watcher(sock)
            elif sock in self._pending:
                self._from_stranger(sock)
        now = time.monotonic()
        while self._pending:
            first, (deadline, _) = next(iter(self._pending.items()))
            if deadline > now:
                break
            self._drop(first)

    def _accept(self) -> None:
        """Take every connection off the backlog (a bounded number per step)."""
        for _ in range(256):
            try:
                conn, _ = self._srv.accept()
            except BlockingIOError:
                return
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE):
                    self._shed()
                    return
                if err.errno in (errno.ECONNABORTED, errno.EINTR):
                    continue
                raise
            conn.setblocking(False)
            self._pending[conn] = (time.monotonic() + HELLO_S, b"")
            self._sel.register(conn, selectors.EVENT_READ)
            if len(self._pending) > MAX_PENDING:
                self._drop(next(iter(self._pending)))

    def _shed(self) -> None:
        """No descriptor left: free the reserved one, take one connection off the
        queue and close it, and reserve again; without a reserve, wait a little (the
        queue keeps its connections, the kernel keeps answering them)."""
        if self._reserve is None:
            self._reserve = _reserve()
            if self._reserve is None:
                time.sleep(0.05)
                return
        os.close(self._reserve)
        self._reserve = None
        with contextlib.suppress(OSError):
            self._srv.accept()[0].close()
        self._reserve = _reserve()

    def _from_stranger(self, sock: socket.socket) -> None:
        deadline, got = self._pending[sock]
        data = _read(sock)
        if data is None:
            return
        got += data
        if not data or len(got) > _LINE or (b"\n" in got and got != self._hello):
            self._drop(sock)
            return
        if got != self._hello:
            self._pending[sock] = (deadline, got)
            return
        del self._pending[sock]
        with contextlib.suppress(OSError):
            sock.send(self._greeting)
        self._watchers[sock] = None
        if len(self._watchers) > MAX_WATCHERS:
            self._drop(next(iter(self._watchers)))

    def _from_watcher(self, sock: socket.socket) -> None:
        if _read(sock) == b"":  # the watcher closed: its process ended, or it connected again
            self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        self._pending.pop(sock, None)
        self._watchers.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(sock)
        with contextlib.suppress(OSError):
            sock.close()

    def close(self) -> None:
        """Close the port and every connection it holds: to its peers this process is
        gone from then on (its watchers find the port refusing). The next creating
        call opens a new port (``mine``)."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._srv.close()
        for sock in [*self._pending, *self._watchers]:
            with contextlib.suppress(OSError):
                sock.close()

    # -- fork ---------------------------------------------------------------------------

    def forget_in_child(self) -> None:
        """In a forked child: close this process's copies of the port, its connections
        and its selector (the thread does not exist here), without taking any lock;
        the socket objects forget their descriptors, so none is closed twice."""
        self._closed = True
        for sock in [self._srv, *self._pending, *self._watchers]:
            with contextlib.suppress(OSError):
                os.close(sock.detach())
        with contextlib.suppress(OSError):
            self._sel.close()
        if self._reserve is not None:
            with contextlib.suppress(OSError):
                os.close(self._reserve)
            self._reserve = None


def _read(sock: socket.socket) -> bytes | None:
    """What a connection sent (``b""``: it closed or broke), or ``None`` for nothing yet."""
    try:
        return sock.recv(_LINE)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _reserve() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


_lock = threading.Lock()
_current: list[Port] = []


def mine(target: str | None = None) -> Port:
    """This process's port, opened on first use on the address that reaches ``target``
    (the store's host), and again if its thread ended or this process is a fork of
    the one that opened it."""
    with _lock:
        p = _current[0] if _current else None
        if p is not None and p.alive():
            return p
        p = Port(local_host(target))
        _current[:] = [p]
        return p


def started() -> Port | None:
    """This process's port if it opened one (none is opened)."""
    with _lock:
        p = _current[0] if _current else None
        return p if p is not None and p.owner == os.getpid() else None


def _after_fork_in_child() -> None:
    # No lock: the child has one thread, and the parent's lock may be held by a thread
    # that does not exist here.
    global _lock
    _lock = threading.Lock()
    p = _current[0] if _current else None
    if p is not None:
        p.forget_in_child()
    _current.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
