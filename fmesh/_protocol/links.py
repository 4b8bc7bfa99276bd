"""A watcher's connections to its peers' liveness ports (``port.py``).

A link is one TCP connection to a peer's port, made once per process and peer and kept
across calls. It tells, without waiting, what the watcher's kernel knows of the peer:

* nothing to read: alive, whatever the peer's process is doing (its kernel keeps the
  connection, and answers keepalive probes, while it is stopped or frozen);
* end of file or a reset: the connection closed. The peer's process ended, or its
  port closed this connection to make room (it holds a bounded number): connecting
  again tells them apart (a port that refuses belongs to no process any more);
* a keepalive timeout: no answer from the peer's host for ``silence`` seconds while a
  call is watched (keepalive probes every ``silence / 4`` seconds after as long an
  idle time, three unanswered probes end it). Between calls keepalive is off: no
  traffic on an idle link;
* a greeting with another token: another process answers at the peer's address.

``connect_all`` connects to several peers at once, so a walk along the ring past
ranks that died together (a host that went away with its ranks) costs one connect
timeout, not one per rank.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import selectors
import socket
import time
from collections.abc import Sequence
from typing import final

from .port import GREETING, HELLO, Address

__all__ = ["Link", "connect_all"]

_TIMEOUTS = (errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN)


@final
class Link:
    """A watcher's connection to one peer's port (module docstring)."""

    def __init__(self, peer: int, address: Address, sock: socket.socket) -> None:
        self.peer = peer
        self.address = address
        self.sock: socket.socket | None = sock
        self._buf = b""
        self._greeted = False

    def watching(self, silence: float | None) -> None:
        """Keepalive on for a watched call (``silence`` seconds without an answer from
        the peer's host end the link), or off between calls (``None``)."""
        if self.sock is None:
            return
        with contextlib.suppress(OSError):
            if silence is None:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 0)
                return
            step = max(1, math.ceil(silence / 4))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for name, value in (
                ("TCP_KEEPIDLE", step),
                ("TCP_KEEPINTVL", step),
                ("TCP_KEEPCNT", 3),
                ("TCP_USER_TIMEOUT", int(4 * step * 1000)),
            ):
                option = getattr(socket, name, None)
                if option is not None:
                    self.sock.setsockopt(socket.IPPROTO_TCP, option, value)

    def check(self) -> tuple[str, str]:
        """(kind, why) of what the kernel knows: ``("", "")`` while the peer is alive;
        kind ``"closed"`` (connect again to tell), ``"silent"`` (its host or network is
        gone) or ``"stranger"`` (another process answers), with why in words."""
        if self.sock is None:
            return "closed", "its connection was closed"
        while True:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                return "", ""
            except InterruptedError:
                continue
            except OSError as err:
                self.close()
                if err.errno in _TIMEOUTS:
                    return "silent", f"no answer from its host ({err.strerror or err})"
                return "closed", f"its connection broke ({err.strerror or err})"
            if not data:
                self.close()
                return "closed", "its connection closed"
            if not self._greeted:
                self._buf += data
                if b"\n" in self._buf or len(self._buf) > 256:
                    line = self._buf.split(b"\n", 1)[0]
                    self._greeted = True
                    if line != GREETING + self.address.token.encode():
                        self.close()
                        shown = line.decode(errors="replace")[:80]
                        return "stranger", f"another process answers at its address: {shown!r}"

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None


def connect_all(
    peers: Sequence[tuple[int, Address]], timeout: float
) -> dict[int, Link | tuple[str, str]]:
    """Connect to every peer's port at once, waiting at most ``timeout`` seconds in
    all: per peer, a ``Link`` (it sent its hello), or (kind, why) of the failure:
    ``"dead"`` (the port refused: no process holds it) or ``"silent"`` (no answer in
    time: its host or network is gone)."""
    out: dict[int, Link | tuple[str, str]] = {}
    waiting: dict[socket.socket, tuple[int, Address]] = {}
    sel = selectors.DefaultSelector()
    try:
        for peer, address in peers:
            family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            code = sock.connect_ex((address.host, address.port))
            if code not in (0, errno.EINPROGRESS, errno.EAGAIN):
                sock.close()
                out[peer] = _failed(code)
                continue
            waiting[sock] = (peer, address)
            sel.register(sock, selectors.EVENT_WRITE)
        deadline = time.monotonic() + timeout
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(left):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                sock = ready
                peer, address = waiting.pop(sock)
                sel.unregister(sock)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    sock.close()
                    out[peer] = _failed(code)
                    continue
                try:
                    sock.send(HELLO + address.token.encode() + b"\n")
                except OSError as err:
                    sock.close()
                    out[peer] = _failed(err.errno or errno.ECONNRESET)
                    continue
                out[peer] = Link(peer, address, sock)
        for sock, (peer, _) in waiting.items():
            sock.close()
            out[peer] = ("silent", f"its host did not answer within {timeout:g}s")
    finally:
        sel.close()
    return out


def _failed(code: int) -> tuple[str, str]:
    why = os.strerror(code)
    if code == errno.ECONNREFUSED:
        return "dead", "its port refused the connection (its process ended)"
    if code in _TIMEOUTS:
        return "silent", f"its host is unreachable ({why})"
    return "dead", f"connecting to its port failed ({why})"
