"""Fresh processes for measurements, and the bench's own gloo launcher.

Every measurement runs in a fresh process forked from a server that has imported
torch once: process groups are process-global, so each measurement starts with none,
and none pays (or times) a torch import. A real-gloo job is one such process per rank
on a store this process hosts (as torchrun's agent does), with no cap on the number
of ranks. A :class:`Service` is a fresh process that answers requests until stopped
(a store server, a crowd of store clients).
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import multiprocessing.context
import multiprocessing.process
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from . import torch_ref
from .shared import Json

Worker = Callable[[Json], Json]
Server = Callable[[Json, Connection], None]
"""Runs a service: reads requests from the connection, answers each with :func:`reply`."""


class WorkerError(RuntimeError):
    """A measurement process failed or died."""


class WorkerTimeout(WorkerError):
    """A measurement process ran past its time limit (it was killed)."""


_ctx: multiprocessing.context.ForkServerContext | None = None


def context() -> multiprocessing.context.ForkServerContext:
    global _ctx
    if _ctx is None:
        _ctx = multiprocessing.get_context("forkserver")
        _ctx.set_forkserver_preload([*torch_ref.PRELOAD, "numpy", "fmesh", "bench.shared"])
    return _ctx


def _child(worker: Worker, spec: Json, env: dict[str, str], conn: Connection) -> None:
    os.environ.update(env)
    try:
        conn.send(("ok", worker(spec)))
    except BaseException:  # report everything; the parent decides
        conn.send(("error", traceback.format_exc()))
    conn.close()
    # Skip interpreter teardown: it is not measured, and process-group destructors
    # may wait on peers that have already gone.
    os._exit(0)


@dataclass
class Started:
    what: str
    proc: multiprocessing.process.BaseProcess
    conn: Connection


def start(worker: Worker, spec: Json, env: dict[str, str] | None = None) -> Started:
    ctx = context()
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(worker, spec, env or {}, send), daemon=True)
    proc.start()
    send.close()
    return Started(f"{worker.__module__}.{worker.__name__} {spec}", proc, recv)


def finish(started: Started, deadline: float) -> Json:
    """The worker's result; kill it and raise WorkerTimeout past ``deadline``."""
    conn, proc = started.conn, started.proc
    try:
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            raise WorkerTimeout(f"{started.what} ran past its time limit")
        try:
            status, payload = conn.recv()
        except EOFError:
            proc.join(10)
            raise WorkerError(f"{started.what} died with exit code {proc.exitcode}") from None
        if status != "ok":
            raise WorkerError(f"{started.what} failed:\n{payload}")
        result: Json = payload
        return result
    finally:
        conn.close()
        if proc.is_alive():
            proc.join(5 if proc.exitcode is None else 0)
        if proc.is_alive():
            proc.kill()  # only the process this benchmark started
            proc.join(10)


def run_worker(worker: Worker, spec: Json, timeout_s: float) -> Json:
    """Run one measurement in a fresh process; raise WorkerTimeout past ``timeout_s``."""
    return finish(start(worker, spec), time.monotonic() + timeout_s)


def run_gloo_job(worker: Worker, world: int, spec: Json, timeout_s: float) -> list[Json]:
    """One fresh process per rank, on a store this process hosts; every rank's result.

    Each rank gets the torchrun environment and ``spec`` plus ``port`` and
    ``timeout_s``; it connects to the store itself.
    """
    store = torch_ref.host_store(world, datetime.timedelta(seconds=timeout_s))
    port = store.port
    spec = {**spec, "port": port, "timeout_s": timeout_s}
    env = {
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        env["GLOO_SOCKET_IFNAME"] = "lo"
    ranks = [
        start(worker, spec, {**env, "RANK": str(r), "LOCAL_RANK": str(r)})
        for r in range(world)
    ]
    deadline = time.monotonic() + timeout_s
    results: list[Json] = []
    try:
        for r in ranks:
            results.append(finish(r, deadline))
    finally:
        for r in ranks:  # after a failure: stop the rest of this job's processes
            if r.proc.is_alive():
                r.proc.kill()
                r.proc.join(10)
    del store
    return results


# -- services -----------------------------------------------------------------------------


def reply(conn: Connection, payload: object) -> None:
    """Answer the request a service is serving."""
    conn.send(("ok", payload))


def _serve(server: Server, spec: Json, conn: Connection) -> None:
    try:
        server(spec, conn)
    except BaseException:  # report everything; the parent decides
        conn.send(("error", traceback.format_exc()))
    conn.close()
    os._exit(0)


@dataclass
class Service:
    """A process that answers requests until it is closed."""

    what: str
    proc: multiprocessing.process.BaseProcess
    conn: Connection

    def send(self, request: object) -> None:
        self.conn.send(request)

    def receive(self, timeout_s: float) -> Any:
        """The next answer; raise WorkerError if the service failed or died."""
        if not self.conn.poll(timeout_s):
            raise WorkerTimeout(f"{self.what} gave no answer within {timeout_s:.0f} s")
        try:
            status, payload = self.conn.recv()
        except EOFError:
            self.proc.join(10)
            raise WorkerError(
                f"{self.what} died with exit code {self.proc.exitcode}"
            ) from None
        if status != "ok":
            raise WorkerError(f"{self.what} failed:\n{payload}")
        return payload

    def ask(self, request: object, timeout_s: float) -> Any:
        self.send(request)
        return self.receive(timeout_s)

    def close(self) -> None:
        """Stop the process (it is asked first: ``None`` is every service's stop)."""
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.conn.close()
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()  # only the process this benchmark started
            self.proc.join(10)


def serve(server: Server, spec: Json) -> Service:
    ctx = context()
    mine, theirs = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=_serve, args=(server, spec, theirs), daemon=True)
    proc.start()
    theirs.close()
    return Service(f"{server.__module__}.{server.__name__}", proc, mine)
