"""The sentinel: a small process per rank that says, over TCP, that its rank's process
exists, whatever that process is doing.

A rank's liveness must not depend on its Python threads being scheduled: a process
that is stopped (SIGSTOP, a debugger, a throttled container), swapping, or whose
thread holds the GIL for a long C call is slow, not dead. So each rank process starts
one *sentinel* (lazily, at its first realize call that creates groups): a child
process running the stdlib-only program ``CODE`` (no torch, no fmesh: it starts in a
few tens of milliseconds), in a session of its own (a terminal's Ctrl-C or Ctrl-Z for
the job does not reach it). The rank itself binds an ephemeral TCP port of the address
that reaches the store's host and hands the listening socket to the child, so its
address is known at once and nothing waits for the child to start (a watcher that
connects earlier waits in the socket's backlog). The child sends every connection a
greeting (the token the rank published with its address) and then one byte every
``beat`` seconds.
It exits when its parent does: its stdin (a pipe only the parent holds) reaches end
of file, ``PR_SET_PDEATHSIG`` signals it, or its parent process id changes. So a
watcher connected to it (``liveness.py``) sees end of file within milliseconds of the
rank's death, and silence only when the host or the network is gone.

The rank learns in turn that its own sentinel died (killed, OOM) from its stdout
pipe's end of file: its watchers will declare it lost, so its call gives up too.
Design and measurements: ``docs/design/liveness.md``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Any, final

import attrs

__all__ = ["BEAT", "CODE", "KEY", "Address", "Link", "Sentinel", "local_host", "mine"]

logger = logging.getLogger("fmesh")

BEAT = 1.0
"""Seconds between two bytes a sentinel sends each connection."""
KEY = "fmesh/s/"
"""Where each rank publishes its sentinel's address: one key per rank for the life of
the store (written once per sentinel, read once per watcher and cached)."""

CODE = r"""
import os, select, signal, socket, sys, time
token, fd, beat, parent = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
def gone(*_):
    if os.getppid() != parent:
        os._exit(0)
signal.signal(signal.SIGTERM, gone)
signal.signal(signal.SIGINT, signal.SIG_IGN)
try:
    import ctypes
    ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
except Exception:
    pass
gone()
srv = socket.socket(fileno=fd)
hello = ("fmesh-sentinel " + token + "\n").encode()
peers = []
due = time.monotonic() + beat
while True:
    wait = max(0.0, due - time.monotonic())
    ready = select.select([0, srv] + peers, [], [], wait)[0]
    for r in ready:
        if r == 0:
            if not os.read(0, 4096):
                os._exit(0)
        elif r is srv:
            try:
                c = srv.accept()[0]
                c.setblocking(False)
                c.send(hello)
                peers.append(c)
            except OSError:
                pass
        else:
            try:
                data = r.recv(4096)
            except OSError:
                data = b""
            if not data:
                r.close()
                peers.remove(r)
    if time.monotonic() >= due:
        due = time.monotonic() + beat
        gone()
        for c in list(peers):
            try:
                c.send(b".")
            except BlockingIOError:
                pass
            except OSError:
                c.close()
                peers.remove(c)
"""
"""The sentinel's program (``python -I -S -c CODE token fd beat parent``: ``fd`` is
the listening socket the rank bound and passed). It writes nothing to its stdout: the
rank reads that pipe's end of file as its death."""


@final
@attrs.frozen(slots=True)
class Address:
    """Where a rank's sentinel listens, and the token it greets with."""

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
class Sentinel:
    """This process's sentinel (see the module docstring)."""

    def __init__(self, host: str, beat: float = BEAT) -> None:
        token = secrets.token_hex(8)
        started = time.perf_counter()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # The child alone holds the listening socket once it runs: this process closes
        # its copy, so a dead sentinel's port refuses connections at once.
        with socket.socket(family, socket.SOCK_STREAM) as srv:
            srv.bind((host, 0))
            srv.listen(128)
            port = int(srv.getsockname()[1])
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    CODE,
                    token,
                    str(srv.fileno()),
                    repr(beat),
                    str(os.getpid()),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(srv.fileno(),),
            )
        self.owner = os.getpid()
        out: IO[bytes] | None = self.proc.stdout
        assert out is not None
        self.stdout: IO[bytes] = out
        self.address = Address(host, port, token)
        """Where it listens (bound before it started: known at once)."""
        self.startup_s = time.perf_counter() - started
        """Seconds this process spent starting it (binding and spawning)."""
        self.published: object | None = None
        """The store this sentinel's address was published in (once per store)."""
        logger.debug(
            "fmesh: sentinel pid %d listens on %s:%d (spawned in %.1f ms)",
            self.proc.pid,
            host,
            port,
            self.startup_s * 1e3,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ended(self) -> bool:
        """Whether it ended, read from its stdout pipe (end of file) without waiting
        (call when the pipe is readable)."""
        fd = self.stdout.fileno()
        os.set_blocking(fd, False)
        try:
            ended = not os.read(fd, 1)
        except BlockingIOError:
            return False
        if ended:
            self.proc.poll()
        return ended

    def why(self) -> str:
        """How the sentinel ended, in words."""
        code = self.proc.poll()
        if code is None:
            return f"its liveness sentinel (pid {self.proc.pid}) is running"
        if code < 0:
            with contextlib.suppress(ValueError):
                return (
                    f"its liveness sentinel (pid {self.proc.pid}) was killed by "
                    f"{signal.Signals(-code).name}"
                )
        return f"its liveness sentinel (pid {self.proc.pid}) exited with code {code}"


_lock = threading.Lock()
_current: list[Sentinel] = []


def mine(target: str | None = None) -> Sentinel:
    """This process's sentinel: started on first use (listening on the address that
    reaches ``target``, the store's host), and again if it died (or if this process
    is a fork of the one that started it). Does not wait for it to listen."""
    with _lock:
        s = _current[0] if _current else None
        if s is not None and s.owner == os.getpid() and s.alive():
            return s
        s = Sentinel(local_host(target))
        _current[:] = [s]
        return s


def started() -> Sentinel | None:
    """This process's sentinel if it started one (no start)."""
    with _lock:
        s = _current[0] if _current else None
        return s if s is not None and s.owner == os.getpid() else None


@final
class Link:
    """A watcher's connection to a peer's sentinel: ``closed`` once the peer is gone
    (end of file, reset, refused, another token), ``silent`` after ``silence`` seconds
    without a byte while this process was awake to read them."""

    def __init__(self, address: Address, silence: float) -> None:
        self.address = address
        self.silence = silence
        self.sock: socket.socket | None = None
        self.closed = ""
        """Why the peer is gone ("" while it is not)."""
        self._buf = b""
        self._greeted = False
        self._last = time.monotonic()
        self._awake = self._last
        try:
            self.sock = socket.create_connection((address.host, address.port), silence)
            self.sock.setblocking(False)
        except OSError as err:
            self.closed = f"its sentinel's port refused the connection ({err.strerror or err})"

    def fileno(self) -> int:
        return -1 if self.sock is None else self.sock.fileno()

    def wait(self, others: list[IO[bytes]], seconds: float) -> list[IO[bytes]]:
        """Wait up to ``seconds`` for the peer's bytes or one of ``others`` (returned
        if ready). Silence counts only while this process is awake: a wait that
        lasted far longer than asked means it was stalled (stopped, or its thread
        kept from the GIL), and the bytes it could not read do not count against
        the peer."""
        if self.sock is None:
            time.sleep(seconds)
            return []
        before = time.monotonic()
        fds: list[Any] = [self.sock, *others]
        ready = select.select(fds, [], [], seconds)[0]
        now = time.monotonic()
        if now - before > seconds + 1.0:
            self._awake = now
        if self.sock in ready:
            self.read()
        if not self.closed and now - max(self._last, self._awake) >= self.silence:
            self._close(f"its sentinel sent nothing for {self.silence:g}s")
        return [r for r in others if r in ready]

    def read(self) -> None:
        """Take what the sentinel sent (call when the socket is readable)."""
        if self.sock is None or self.closed:
            return
        try:
            data = self.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError as err:
            self._close(f"its sentinel's connection broke ({err.strerror or err})")
            return
        if not data:
            self._close("its sentinel's connection closed (its process ended)")
            return
        self._last = time.monotonic()
        if not self._greeted:
            self._buf += data
            if b"\n" in self._buf:
                line = self._buf.split(b"\n", 1)[0].decode(errors="replace")
                if line != f"fmesh-sentinel {self.address.token}":
                    self._close(f"another process answers at its sentinel's address: {line!r}")
                self._greeted = True

    def _close(self, why: str) -> None:
        self.closed = why
        self.close()

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None
