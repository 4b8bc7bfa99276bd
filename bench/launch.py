"""Fresh processes for measurements, and the bench's own gloo launcher.

Every measurement runs in a fresh process forked from a server that has imported
torch once: process groups are process-global, so each measurement starts with none,
and none pays (or times) a torch import. A gloo job is one such process per rank on a
store this process hosts (as torchrun's agent does), with no cap on the number of
ranks. A *service* is a fresh process that answers requests until closed (a store
server, a crowd of simulated ranks).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable, Collection
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from typing import Any

from . import torch_ref
from .shared import Json

Worker = Callable[[Json], Json]
Server = Callable[[Json, Connection], None]
"""Runs a service: reads requests from the connection, answers each with :func:`reply`."""


class WorkerError(RuntimeError):
    """A measurement process failed, died or ran past its time."""


@functools.cache
def context() -> ForkServerContext:
    # torch's C++ warnings (a store wait that timed out, a host name not found) are
    # expected by the thousand in the store-load rows: errors only.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([*torch_ref.PRELOAD, "numpy", "fmesh", "bench.shared"])
    return ctx


def _child(fn: Any, spec: Json, env: dict[str, str], conn: Connection, serve: bool) -> None:
    os.environ.update(env)
    try:
        if serve:
            fn(spec, conn)
        else:
            conn.send(("ok", fn(spec)))
    except BaseException:  # report everything; the parent decides
        conn.send(("error", traceback.format_exc()))
    conn.close()
    # Skip interpreter teardown: it is not measured, and process-group destructors
    # may wait on peers that have already gone.
    os._exit(0)


@dataclass
class Started:
    """A process this bench started, and the end of its pipe."""

    what: str
    proc: BaseProcess
    conn: Connection

    def receive(self, timeout_s: float) -> Any:
        """The next answer; WorkerError if it failed, died or gave none in time."""
        if not self.conn.poll(max(0.0, timeout_s)):
            raise WorkerError(f"{self.what} gave no answer within {timeout_s:.0f} s")
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
        """A service's answer to ``request``."""
        self.conn.send(request)
        return self.receive(timeout_s)

    def stop(self, grace_s: float = 5.0) -> None:
        """Ask a service to stop (``None``), wait up to ``grace_s``, then kill."""
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.conn.close()
        self.proc.join(grace_s)
        if self.proc.is_alive():
            self.proc.kill()  # only a process this benchmark started
            self.proc.join(10)


def start(
    fn: Worker | Server, spec: Json, env: dict[str, str] | None = None, serve: bool = False
) -> Started:
    """A fresh process running a worker (one answer) or a server (``serve``)."""
    mine, theirs = context().Pipe()
    args = (fn, spec, env or {}, theirs, serve)
    proc = context().Process(target=_child, args=args, daemon=True)
    proc.start()
    theirs.close()
    return Started(f"{fn.__module__}.{fn.__name__}{'' if serve else f' {spec}'}", proc, mine)


def run_worker(worker: Worker, spec: Json, timeout_s: float) -> Json:
    """Run one measurement in a fresh process (killed past ``timeout_s``)."""
    started = start(worker, spec)
    try:
        return dict(started.receive(timeout_s))
    finally:
        started.stop()


def start_job(
    worker: Worker, world: int, spec: Json, timeout_s: float, env: dict[str, str] | None = None
) -> tuple[object, list[Started]]:
    """One fresh process per rank on a store this process hosts, as torchrun's agent
    does: each rank gets the torchrun environment (and ``env``), and ``spec`` plus
    ``port`` and ``timeout_s``. Returns the store (keep it while the ranks run) and
    the ranks."""
    store = torch_ref.tcp_store(0, world, datetime.timedelta(seconds=timeout_s), master=True)
    spec = {**spec, "port": store.port, "timeout_s": timeout_s}
    common = {"WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)}
    common |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port)}
    common["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
    envs = [
        {**common, **(env or {}), "RANK": str(r), "LOCAL_RANK": str(r)} for r in range(world)
    ]
    return store, [start(worker, spec, e) for e in envs]


def run_gloo_job(
    worker: Worker,
    world: int,
    spec: Json,
    timeout_s: float,
    may_die: Collection[int] = (),
    crashes: list[str] | None = None,
) -> list[Json]:
    """A job of :func:`start_job`: the ranks' results. A rank of ``may_die`` may die by
    SIGKILL (its result is left out); any other failure raises, or with ``crashes``
    is noted there (the other ranks' results are still collected)."""
    store, ranks = start_job(worker, world, spec, timeout_s)
    deadline = time.monotonic() + timeout_s
    results: list[Json] = []
    try:
        for r, started in enumerate(ranks):
            try:
                results.append(started.receive(deadline - time.monotonic()))
                started.stop()
            except WorkerError as err:
                if r in may_die and started.proc.exitcode == -9:  # SIGKILL
                    continue
                if crashes is None:
                    raise
                crashes.append(f"rank {r} (exit code {started.proc.exitcode}): {err}"[:2000])
    finally:
        for started in ranks:  # after a failure: stop the rest of this job's processes
            started.stop(0)
    del store
    return results


def reply(conn: Connection, payload: object) -> None:
    """Answer the request a service is serving."""
    conn.send(("ok", payload))
