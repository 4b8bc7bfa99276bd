"""Store load: what one creating call's agreement costs the store server, at many ranks.

One real ``TCPStore`` server, hosted alone in its own process, which reports its CPU
time (``time.process_time()``: every thread of the process, the store's event loop
included) when asked between phases. N simulated ranks are real client connections:
a few client processes, each with one thread and one ``TCPStore`` client per simulated
rank. Every connection is opened before anything is measured, one after another in
each process (see :func:`_prepare_process` for why connecting can stall), and kept.

A phase is ``calls`` creating calls in a row on every simulated rank (fresh keys per
call, the same mesh code everywhere):

* fmesh: ``fmesh._runtime.agreement.agree(store, rank=r, ranks=range(N), ...)``, the
  agreement a realize call that creates groups makes first;
* torch: ``_store_based_barrier(r, store, name, N, timeout)``, torch's own store
  barrier (what ``init_process_group`` and ``new_group`` run when
  ``TORCH_DIST_INIT_BARRIER=1``; off by default, so torch's recipes in the other
  sections make no such check).

Each client counts its requests on the wire (:class:`bench.counting.CountingStore`);
the server's CPU per phase is the difference of two readings. A warm-up phase of each
goes first; then the phases alternate. Total server CPU per call is extrapolated to
2^17 and 2^20 ranks along a straight line through the measured sizes (both protocols
cost the server O(1) per rank: each request touches one key, and one wake-up reaches
every waiter once).
"""

from __future__ import annotations

import datetime
import os
import re
import resource
import statistics
import threading
import time
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection

from . import torch_ref
from .counting import CountingStore, delta, per_call
from .launch import Service, reply, serve
from .shared import Bench, Json, Row, world_str

IMPLS = ("fmesh", "torch")
CLIENT_PROCESSES = 4
TIMEOUT = datetime.timedelta(seconds=120)
CODE = 0x5EED
"""The call code every simulated rank agrees on."""
EXTRAPOLATE = (2**17, 2**20)
_CALL = re.compile(r"bench/[^/:]+/(\d+)")


class OwnClient(CountingStore):
    """One simulated rank's client: never cloned (a clone would connect anew)."""

    def clone(self) -> CountingStore:
        return self


def _call_of(key: str) -> str | None:
    match = _CALL.search(key)
    return None if match is None else match.group(1)


def _prepare_process() -> None:
    """A server or client process holds one socket per simulated rank: raise its limit.

    Also cap glibc's resolver at one 1-second try: torch looks up the host name of
    every new client socket (for its logs), and where the DNS server drops some of
    those reverse lookups each connection that meets one stalls for 5 s (10 s with
    two tries). Only connecting is affected, which is not measured.
    """
    os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- the processes ----------------------------------------------------------------------


def serve_store(spec: Json, conn: Connection) -> None:
    """The server: its port, then its CPU time or the keys left, until stopped."""
    _prepare_process()
    store = torch_ref.host_store(spec["world"], TIMEOUT)
    reply(conn, store.port)
    while (request := conn.recv()) is not None:
        if request[0] == "cpu":
            reply(conn, time.process_time())
        else:  # ("keys", tag): the keys a phase left
            reply(conn, sum(f"bench/{request[1]}/" in k for k in store.list_keys()))


def _one_call(
    impl: str, store: CountingStore, rank: int, world: int, tag: str, call: int
) -> None:
    from fmesh._runtime import (
        agreement as _agree,  # the agreement a creating realize call makes
    )

    if impl == "fmesh":
        _agree.agree(
            store,
            rank=rank,
            ranks=range(world),
            code=CODE,
            record=lambda: _agree.Record(rank, CODE, "the store-load benchmark", ""),
            timeout=TIMEOUT,
            prefix=f"{_agree.KEY_ROOT}bench/{tag}/{call}/",
            where=f"store-load call {call}",
        )
    else:
        torch_ref.store_based_barrier(rank, store, f"bench/{tag}/{call}", world, TIMEOUT)


def serve_clients(spec: Json, conn: Connection) -> None:
    """Simulated ranks ``spec["ranks"]``: one connection and one thread each. Each
    request ``(impl, tag, calls)`` runs a phase on every thread; the answer is each
    rank's requests and the most any rank sent in one call."""
    _prepare_process()
    threading.stack_size(512 * 1024)
    ranks: list[int] = spec["ranks"]
    world: int = spec["world"]
    clients = [OwnClient(torch_ref.plain_client(spec["port"], TIMEOUT)) for _ in ranks]
    job: list[tuple[str, str, int] | None] = [None]
    errors: list[str] = []
    go = threading.Barrier(len(ranks) + 1)
    done = threading.Barrier(len(ranks) + 1)

    def simulated(i: int) -> None:
        while True:
            go.wait()
            current = job[0]
            if current is None:
                return
            impl, tag, calls = current
            try:
                for call in range(calls):
                    _one_call(impl, clients[i], ranks[i], world, tag, call)
            except BaseException:
                errors.append(traceback.format_exc())
            done.wait()

    threads = [
        threading.Thread(target=simulated, args=(i,), daemon=True) for i in range(len(ranks))
    ]
    for t in threads:
        t.start()
    reply(conn, len(clients))
    while (request := conn.recv()) is not None:
        before = [c.key_snapshot() for c in clients]
        job[0] = request
        start = time.perf_counter()
        go.wait()
        done.wait()
        seconds = time.perf_counter() - start
        if errors:
            raise RuntimeError(
                f"{len(errors)} simulated ranks failed; the first:\n{errors[0]}"
            )
        calls = [
            per_call(delta(c.key_snapshot(), b), _call_of) for c, b in zip(clients, before)
        ]
        reply(
            conn,
            {
                "requests": [sum(c.values()) for c in calls],
                "max_per_call": max(max(c.values(), default=0) for c in calls),
                "seconds": seconds,
            },
        )
    job[0] = None
    go.wait()


# -- one size ---------------------------------------------------------------------------


def _phase(
    server: Service, clients: Sequence[Service], impl: str, tag: str, calls: int
) -> Json:
    cpu0 = server.ask(("cpu",), 60)
    for c in clients:
        c.send((impl, tag, calls))
    answers = [c.receive(600) for c in clients]
    cpu1 = server.ask(("cpu",), 60)
    requests = [n for a in answers for n in a["requests"]]
    return {
        "server_cpu_s": cpu1 - cpu0,
        "calls": calls,
        "requests": sum(requests),
        "max_per_call": max(a["max_per_call"] for a in answers),
        "keys_left": server.ask(("keys", tag), 60),
        "seconds": max(a["seconds"] for a in answers),
    }


def measure(world: int, calls: int, repeats: int) -> Json:
    """Both protocols at ``world`` simulated ranks: warm-up, then alternating phases."""
    services: list[Service] = []
    try:
        server = serve(serve_store, {"world": world})
        services.append(server)
        port = server.receive(60)
        n = min(CLIENT_PROCESSES, world)
        blocks = [list(range(world))[i * world // n : (i + 1) * world // n] for i in range(n)]
        clients = [
            serve(serve_clients, {"port": port, "world": world, "ranks": block})
            for block in blocks
        ]
        services += clients
        start = time.perf_counter()
        for c in clients:
            c.receive(600)
        connect_s = time.perf_counter() - start
        for impl in IMPLS:
            _phase(server, clients, impl, f"warm-{impl}", 1)
        runs: Json = {impl: [] for impl in IMPLS}
        for repeat in range(repeats):
            for impl in IMPLS:
                runs[impl].append(_phase(server, clients, impl, f"{impl}-{repeat}", calls))
        return {"connect_s": connect_s, **runs}
    finally:
        for s in services:
            s.close()


# -- rows -------------------------------------------------------------------------------


def fit(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through ``points`` (through the
    origin when there is one point)."""
    if len(points) == 1:
        (x, y) = points[0]
        return 0.0, y / x
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


def _per(runs: list[Json], world: int, what: str) -> float:
    """Median over phases of ``what`` per call (per rank too for requests and CPU)."""
    field, per_rank = {
        "requests": ("requests", True),
        "cpu_rank": ("server_cpu_s", True),
        "cpu_call": ("server_cpu_s", False),
        "keys": ("keys_left", False),
    }[what]
    return float(
        statistics.median(
            float(r[field]) / (r["calls"] * (world if per_rank else 1)) for r in runs
        )
    )


SIMULATED = (
    "N simulated ranks, each its own TCPStore client connection to one server process; "
    "fmesh: _agree.agree(ranks=range(N)); torch: _store_based_barrier"
)
ROWS = (
    (
        "store.requests",
        "requests",
        "one creating call's agreement: store requests per rank",
        "count",
        f"{SIMULATED}; counted on the wire, mean over ranks and calls",
        False,
    ),
    (
        "store.cpu_per_rank",
        "cpu_rank",
        "one creating call's agreement: server CPU per rank",
        "s",
        f"{SIMULATED}; CPU time of the server process (all its threads) per call and rank",
        True,
    ),
    (
        "store.cpu_per_call",
        "cpu_call",
        "one creating call's agreement: server CPU per call (all ranks)",
        "s",
        f"{SIMULATED}; CPU time of the server process per call",
        False,
    ),
    (
        "store.keys_left",
        "keys",
        "keys one call leaves in the store",
        "count",
        "fmesh: the last reader removes the call's keys; torch's barrier keeps its 2",
        False,
    ),
)


def section(b: Bench) -> None:
    raw: Json = {}
    rows: list[Row] = []
    sizes = b.mode.store_ranks
    for world in sizes:
        b.log(f"store load, {world} simulated ranks ...")
        runs = measure(world, b.mode.store_calls, b.mode.store_repeats)
        raw[str(world)] = runs
        for key, what, label, unit, note, every in ROWS:
            rows.append(
                Row(
                    key,
                    "store load",
                    label,
                    world_str(world),
                    world,
                    unit,
                    _per(runs["fmesh"], world, what),
                    _per(runs["torch"], world, what),
                    note=note,
                    every_size=every,
                )
            )
    order = [r[0] for r in ROWS]
    rows.sort(key=lambda r: order.index(r.key))
    lines = {
        impl: fit([(w, _per(raw[str(w)][impl], w, "cpu_call")) for w in sizes])
        for impl in IMPLS
    }
    raw["fit"] = lines
    source = ", ".join(map(str, sizes))
    for world in EXTRAPOLATE:
        fm, th = (a + s * world for a, s in (lines["fmesh"], lines["torch"]))
        rows.append(
            Row(
                "store.cpu_per_call_extrapolated",
                "store load",
                "one creating call's agreement: server CPU per call (all ranks)",
                world_str(world),
                world,
                "s",
                fm,
                th,
                note=f"extrapolated (straight line from N={source}), not measured",
                every_size=True,
            )
        )
    b.raw["store_load"] = raw
    b.rows.extend(rows)
