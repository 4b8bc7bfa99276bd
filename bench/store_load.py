"""Store load: what creating calls cost one TCPStore server, at thousands of ranks.

One real ``TCPStore`` server, alone in its process, reports its CPU time
(``time.process_time()``: every thread, the store's event loop included) when asked.
N simulated ranks are real client connections: a few *crowd* processes, each with one
thread and one ``TCPStore`` client per simulated rank, and one more crowd that holds a
single rank, the *victim*, whose process is SIGKILLed in the last phase. Every client
counts its requests as they go on the wire (:class:`bench.counting.CountingStore`).

Each rank is in one group of ``group`` ranks; :mod:`bench.store_ranks` makes its
calls. A phase is ``calls`` creating calls on every rank:

* ``fmesh``: fmesh's real agreement and peer watch (``store_ranks.fmesh_call``, the
  adapter), with the group's creation replaced by the store requests its backend's
  rendezvous sends, then a wait of ``hold_s`` in the store fmesh gives the creation;
* ``torch``: the same rendezvous requests on a connection of its own, then a sleep (torch's
  creation waits in one blocked request). gloo: every member sets its address, then
  waits for and reads every member's, itself included (what ``ProcessGroupGloo``'s
  ``connectFullMesh`` sends, counted at a real group); NCCL (eager): group rank 0 sets
  the unique id, the others read it (``broadcastUniqueNCCLID``);
* ``barrier``: torch's own ``_store_based_barrier`` over the whole world, what each
  ``new_group`` call runs with ``TORCH_DIST_INIT_BARRIER=1`` (off by default);
* ``find`` (fmesh, once, last): every rank waits in its creation; once all are in, the
  requests and the server's CPU are read over ``steady_s``, then the victim's process
  is SIGKILLed, and the time until every survivor raised ``PeerLostError`` is taken.
"""

from __future__ import annotations

import collections
import contextlib
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from . import torch_ref
from .counting import delta
from .launch import Service, reply, serve
from .shared import Json, Row, median, world_str
from .store_ranks import TIMEOUT, OwnClient, run_rank, setup_process

PER_CROWD = 64
"""Simulated ranks per crowd process: more threads per process contend for its GIL."""
EXTRAPOLATE = (2**17, 2**20)
IMPLS = ("fmesh", "torch")
CPU_CALL = "a creating call (gloo): server CPU per call (all ranks)"


def _prepare_process() -> None:
    """A server or crowd holds a socket per simulated rank: raise its limit. Also cap
    glibc's resolver at one 1-second try: torch looks up the host name of every new
    client socket (for its logs), and a dropped lookup stalls a connection 5 s."""
    os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve_store(spec: Json, conn: Connection) -> None:
    """The server: its port, then answers (CPU time, keys under a tag, a counter)."""
    _prepare_process()
    store = torch_ref.host_store(spec["world"], TIMEOUT)
    reply(conn, store.port)
    while (request := conn.recv()) is not None:
        if request[0] == "cpu":
            reply(conn, time.process_time())
        elif request[0] == "keys":
            reply(conn, sum(f"bench/{request[1]}/" in k for k in store.list_keys()))
        else:  # ("count", key)
            reply(conn, store.add(request[1], 0))


def _counts(pair: tuple[OwnClient, ...]) -> dict[str, int]:
    """Requests by kind of a rank's connections."""
    return dict(sum((collections.Counter(c.snapshot()) for c in pair), collections.Counter()))


def serve_crowd(spec: Json, conn: Connection) -> None:
    """Simulated ranks ``spec["ranks"]``, one client each; a request ``(phase, tag)``
    runs the phase on one thread per rank and answers each rank's requests by kind,
    its errors and when they came; ``("snapshot",)`` meanwhile: the requests so far."""
    _prepare_process()
    threading.stack_size(512 * 1024)
    ranks = spec["ranks"]
    # Two connections per rank, fmesh's and torch's: a client whose wait timed out (the
    # watch's sliced waits) can return early from a later one (see wait_get in
    # fmesh/_protocol/records.py); torch's side must not inherit that.
    clients = {
        r: tuple(OwnClient(torch_ref.tcp_store(spec["port"], None, TIMEOUT)) for _ in "ft")
        for r in ranks
    }
    setup_process(ranks)
    reply(conn, len(clients))
    while (request := conn.recv()) is not None:
        if request == ("snapshot",):  # the phase ended already (every rank raised)
            reply(conn, sum(sum(_counts(pair).values()) for pair in clients.values()))
            continue
        before = {r: _counts(pair) for r, pair in clients.items()}
        out: dict[int, Json] = {}

        threads = [
            threading.Thread(
                target=run_rank, args=(out, r, clients[r], request, spec), daemon=True
            )
            for r in ranks
        ]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            if conn.poll(0.05):
                try:
                    conn.recv()  # ("snapshot",)
                except EOFError:  # the bench is gone: so is this crowd
                    os._exit(1)
                reply(conn, sum(sum(_counts(pair).values()) for pair in clients.values()))
        for r, pair in clients.items():
            out[r]["kinds"] = delta(_counts(pair), before[r])
        reply(conn, out)


# -- one size ---------------------------------------------------------------------------

PHASES = ("fmesh-gloo", "torch-gloo", "fmesh-nccl", "torch-nccl", "barrier")


@contextlib.contextmanager
def crowds(world: int, spec: Json) -> Iterator[tuple[Service, list[Service], Service]]:
    """The server, the crowds, the victim's crowd (the middle rank), all connected."""
    services: list[Service] = []
    try:
        server = serve(serve_store, {"world": world})
        services.append(server)
        port = server.receive(60)
        victim = world // 2 + 1
        rest = [r for r in range(world) if r != victim]
        n = -(-len(rest) // PER_CROWD)
        blocks = [rest[i * len(rest) // n : (i + 1) * len(rest) // n] for i in range(n)]
        for block in [*blocks, [victim]]:
            services.append(
                serve(serve_crowd, {**spec, "port": port, "world": world, "ranks": block})
            )
        for s in services[1:]:
            s.receive(600)
        yield server, services[1:-1], services[-1]
    finally:
        for s in services:
            s.close()


def _phase(server: Service, crowd: list[Service], phase: str, tag: str, calls: int) -> Json:
    """Run one phase on every crowd: each rank's answer, the server's CPU, the time."""
    cpu0, start = server.ask(("cpu",), 60), time.monotonic()
    for c in crowd:
        c.conn.send((phase, tag, calls))
    ranks = {r: v for c in crowd for r, v in c.receive(900).items()}
    seconds = time.monotonic() - start
    failed = [v["trace"] for v in ranks.values() if "trace" in v]
    if failed:
        raise RuntimeError(
            f"{len(failed)} simulated ranks failed in {phase}; the first:\n{failed[0]}"
        )
    return {
        "ranks": ranks,
        "cpu": server.ask(("cpu",), 60) - cpu0,
        "seconds": seconds,
        "keys": server.ask(("keys", tag), 60),
    }


def _find(
    server: Service, crowd: list[Service], victim: Service, world: int, steady_s: float
) -> Json:
    """Every rank waits in its creation; the load over ``steady_s``; then the victim's
    process is killed, and each survivor's error and when it came."""
    tag = "find"
    for c in [*crowd, victim]:
        c.conn.send(("find", tag, 1))
    deadline = time.monotonic() + 600
    while server.ask(("count", f"bench/{tag}/0/in"), 60) < world:
        if time.monotonic() > deadline:
            raise RuntimeError("the ranks never all entered their creation")
        time.sleep(0.05)

    def load() -> tuple[float, float, int]:
        counts = sum(c.ask(("snapshot",), 60) for c in [*crowd, victim])
        return time.monotonic(), server.ask(("cpu",), 60), counts

    t0, cpu0, n0 = load()
    time.sleep(steady_s)
    t1, cpu1, n1 = load()
    killed = time.monotonic()
    victim.proc.kill()  # a process this bench started
    ranks = {r: v for c in crowd for r, v in c.receive(900).items()}
    return {
        "ranks": ranks,
        "steady_rate": (n1 - n0) / (t1 - t0),
        "steady_cpu": (cpu1 - cpu0) / (t1 - t0),
        "killed": killed,
    }


OPTIONS = {"group": 8, "hold_s": 0.5, "barriers": 2, "steady_s": 3.0, "timeout_s": None}
"""Ranks per group, the wait that stands for a creation, barriers measured per phase,
seconds the waiting load is read over, and the watch's timeout (``None``: defaults)."""


def measure(
    world: int, repeats: int, calls: int, **options: Any
) -> dict[str, list[list[Json]]]:
    """Every phase at ``world`` simulated ranks, ``repeats`` times (after a warm-up of
    each), then ``find``: per library, one result per repeat, the figures of
    :data:`METRICS` (:data:`OPTIONS` as given)."""
    spec = {**OPTIONS, **options, "calls": calls}
    out: dict[str, list[list[Json]]] = {"fmesh": [], "torch": []}
    with crowds(world, spec) as (server, crowd, victim):
        every = [*crowd, victim]
        for phase in PHASES:  # first calls import and connect what later ones reuse
            _phase(server, every, phase, f"warm-{phase}", 1)
        for repeat in range(repeats):
            got = {p: _phase(server, every, p, f"{p}-{repeat}", calls) for p in PHASES}
            out["fmesh"].append([_figures(got, "fmesh", world, spec)])
            out["torch"].append([_figures(got, "torch", world, spec)])
        found = _find(server, crowd, victim, world, spec["steady_s"])
    out["fmesh"][0][0].update(_found(found, world))
    return out


def _per_rank(phase: Json, which: Callable[[str], bool] = lambda k: True) -> float:
    ranks = phase["ranks"].values()
    return float(sum(n for v in ranks for k, n in v["kinds"].items() if which(k)) / len(ranks))


def _figures(got: dict[str, Json], impl: str, world: int, spec: Json) -> Json:
    calls = spec["calls"]
    gloo, nccl = got[f"{impl}-gloo"], got[f"{impl}-nccl"]
    figures = {
        "requests": _per_rank(gloo) / calls,
        "nccl": _per_rank(nccl) / calls,
        "cpu_rank": gloo["cpu"] / calls / world,
        "cpu_call": gloo["cpu"] / calls,
        "seconds": gloo["seconds"] / calls,
        "rate": _per_rank(gloo) * world / gloo["seconds"],
        "keys_left": gloo["keys"] / calls,
        "group": str(spec["group"]),
        "barriers": str(spec["barriers"]),
        "hold": f"{spec['hold_s']:g} s",
        "per_crowd": str(PER_CROWD),
    }
    if impl == "fmesh":
        figures["own"] = _per_rank(gloo, lambda k: k in ("agree", "watch")) / calls
    else:  # one barrier per new_group call: world / group calls for these groups
        per_barrier = _per_rank(got["barrier"]) / (calls * spec["barriers"])
        figures["barrier"] = per_barrier * world / spec["group"]
        figures["per_barrier"] = per_barrier
    return figures


def _found(found: Json, world: int) -> Json:
    errors = [v for v in found["ranks"].values() if "error" in v]
    victim = [world // 2 + 1]  # see crowds()
    lost_named = [v for v in errors if v["error"] == "PeerLostError" and v["lost"] == victim]
    after = [v["at"] - found["killed"] for v in errors if v["at"] >= found["killed"]]
    return {
        "find_s": max(after) if after else None,  # None: every error came before the kill
        "find_median_s": median(after) if after else None,
        "early": len(errors) - len(after),
        "survivors": len(found["ranks"]),
        "peer_lost": len(lost_named),
        "watch_rank": found["steady_rate"] / world,
        "watch_rate": found["steady_rate"],
        "watch_cpu": found["steady_cpu"],
    }


# -- rows -------------------------------------------------------------------------------


def extrapolate(rows: list[Row]) -> list[Row]:
    """The server's load at 2^17 and 2^20 ranks (same group size), not measured: the
    waiting ranks' rate as N times the highest rate per rank measured (where the crowds
    kept up best), scaled by the watch's interval there over its interval at N (the
    interval grows with the world: ``watch.settings``); a call's CPU (all ranks) along
    the least-squares line through the measured sizes."""
    from fmesh._protocol.watch import settings

    rate = [r for r in rows if r.key == "store.watch.per_rank" and r.fmesh is not None]
    cpu = [r for r in rows if r.key == "store.call.cpu_per_rank" and r.fmesh is not None]
    if not (rate and cpu):
        return []
    last = max(rate, key=lambda r: r.fmesh or 0.0)
    label = last.bench.replace("per rank per second", "per second")
    sizes = ", ".join(str(r.ranks) for r in cpu)

    def interval(n: int) -> float:
        return settings(n, None)[0]

    out = []
    for n in EXTRAPOLATE:
        fm, th = (
            _fit([(r.ranks, (getattr(r, s) or 0.0) * r.ranks) for r in cpu], n) for s in IMPLS
        )
        w = world_str(n)
        # fmt: off
        out += [
            Row("store.watch.server_extrapolated", last.section, label, w, n, "/s",
                (last.fmesh or 0.0) * n * interval(last.ranks) / interval(n), None,
                skipped=last.skipped, every_size=True,
                note=f"extrapolated (N x the rate per rank at {last.world} x I({last.world})"
                " / I(N), the watch's interval I), not measured"),
            Row("store.call.cpu_per_call_extrapolated", last.section, CPU_CALL, w, n, "s", fm,
                th, note=f"extrapolated (straight line from N={sizes}), not measured",
                every_size=True),
        ]
        # fmt: on
    return sorted(out, key=lambda r: r.key, reverse=True)


def _fit(points: list[tuple[int, float]], x: int) -> float:
    """The least-squares line through ``points`` at ``x`` (through the origin for one)."""
    if len(points) == 1:
        return points[0][1] * x / points[0][0]
    mx = sum(p for p, _ in points) / len(points)
    my = sum(q for _, q in points) / len(points)
    slope = sum((p - mx) * (q - my) for p, q in points) / sum((p - mx) ** 2 for p, _ in points)
    return my + slope * (x - mx)
