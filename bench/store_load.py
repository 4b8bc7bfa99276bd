"""Store load: what creating calls cost one TCPStore server, at thousands of ranks
(``docs/design/store-load.md`` explains the phases and the rows).

One real ``TCPStore`` server, alone in its process, reports its CPU time (every
thread) when asked. N simulated ranks are real client connections counting their
requests: a few *crowd* processes, each with one thread and two clients (fmesh's,
torch's) per simulated rank, and one more crowd holding the *victim*, whose process is
SIGKILLed in the last phase (``find``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import resource
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from . import torch_ref
from .counting import CountingStore, delta
from .launch import Started, reply, start
from .shared import Json, median

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

TIMEOUT = datetime.timedelta(seconds=300)
CODE = 0x5EED
"""The call code every simulated rank agrees on."""
PER_CROWD = 64
"""Simulated ranks per crowd process: more threads per process contend for its GIL."""
SIZES = {"full": (1024, 2048), "quick": (256, 1024), "smoke": (16,)}
"""Simulated ranks per mode (``(1024, 2048, 4096)`` needs more cores: at 4,096 the
crowds' threads on 2 shared CPUs reach a load average over 1,000)."""
OPTIONS = {"group": 8, "hold_s": 0.5, "barriers": 2, "steady_s": 3.0, "timeout_s": None}
"""Ranks per group, the wait that stands for a creation, barriers measured per phase,
seconds the waiting load is read over, and the watch's timeout (``None``: defaults)."""
PHASES = ("fmesh-gloo", "torch-gloo", "fmesh-nccl", "torch-nccl", "barrier")


# == The adapter: the only code here that knows how fmesh agrees and watches peers
# during a creating call (``create_groups`` in fmesh/_runtime/creation.py, and
# ``groups._new_group``'s error path). When the watch changes, re-point these two functions.


def setup_process() -> None:
    """Once per crowd process: its liveness port, shared by its simulated ranks as by
    threads of one process (each publishes its address); the victim is alone in its
    crowd, so killing it closes its port too."""
    from fmesh._protocol import port

    port.mine()


_prepared: set[int] = set()
"""Simulated ranks whose port address is published (once per rank, as a real rank
publishes once per process)."""


def fmesh_call(
    store: Store,
    rank: int,
    world: int,
    prefix: str,
    backend: str,
    create: Callable[[Store], None],
    timeout: datetime.timedelta | None,
) -> None:
    """One creating call of ``rank`` as realize makes it: publish the port's address
    (once), put the record in, ``create`` in the store fmesh gives a creation (its
    waits sliced, in this thread), the closing round; raises the call's error."""
    from fmesh._core.errors import PeerLostError
    from fmesh._protocol import agreement, liveness, port, records

    if rank not in _prepared:
        store.set(port.KEY + str(rank), port.mine().address.text())
        _prepared.add(rank)

    stream = f"{records.KEY_ROOT}{prefix}s/"
    # fmt: off
    ticket = agreement.open_call(
        store, rank=rank, ranks=range(world), entry=records.Entry(1, CODE, rank),
        record=lambda: records.Record(rank, CODE, "the store-load benchmark", ""),
        stream=stream, prefix=stream + "1/", where="a store-load call",
    )
    # fmt: on
    with liveness.watching(ticket, TIMEOUT, timeout) as watch:
        assert watch is not None  # among several ranks
        try:
            try:
                # Not patient: the find phase's hold is a wait that times out.
                create(watch.store_for(ticket.conn, patient=False))
            except Exception as err:
                found = watch.error("creating a group", err)
                if found is None:
                    raise
                raise found from err
            watch.finish(2 * TIMEOUT)
        except BaseException as err:
            if not isinstance(err, PeerLostError):
                watch.fail(err)
            raise


# == end of the adapter ====================================================================


def rendezvous(store: Any, backend: str, prefix: str, members: list[int], rank: int) -> None:
    """The store requests a group's creation sends on ``rank`` (the design page's table)."""
    me = members.index(rank)
    if backend == "nccl":
        if me == 0:
            store.set(prefix + "0", b"u" * 128)
        else:
            store.get(prefix + "0")
        return
    store.set(prefix + str(me), b"a" * 64)
    for i in range(len(members)):
        store.wait([prefix + str(i)])
        store.get(prefix + str(i))


class OwnClient(CountingStore):
    def clone(self) -> CountingStore:  # never cloned: a clone would connect anew
        return self


def one_call(phase: str, client: OwnClient, r: int, tag: str, spec: Json) -> None:
    """One creating call of simulated rank ``r`` in ``phase``."""
    world, group = spec["world"], spec["group"]
    first = r - r % group
    members = list(range(first, min(first + group, world)))
    prefix = f"bench/{tag}/g{first}/cpu/0/"
    if phase == "barrier":
        for b in range(spec["barriers"]):
            torch_ref.store_based_barrier(r, client, f"bench/{tag}/{b}", world, TIMEOUT)
        return
    impl, _, backend = phase.partition("-")
    hold = spec["hold_s"] if impl != "find" else TIMEOUT.total_seconds() / 2
    if impl == "torch":
        rendezvous(client, backend, prefix, members, r)
        time.sleep(hold)
        return

    def create(store: Store) -> None:
        import torch.distributed as dist

        rendezvous(store, backend, prefix, members, r)
        if impl != "find":  # the rest of a creation is native code: no store request
            time.sleep(hold)
            return
        # A rank waiting in its creation for a peer that dies: in the store, where the
        # call's watch ends its wait.
        client.inner.add(f"bench/{tag}/in", 1)  # uncounted: the bench's own
        with contextlib.suppress(dist.DistStoreError):  # the end of the hold
            store.wait([prefix + "never"], datetime.timedelta(seconds=hold))

    timeout = spec["timeout_s"] and datetime.timedelta(seconds=spec["timeout_s"])
    fmesh_call(client, r, world, tag + "/", backend or "gloo", create, timeout)


def run_rank(
    out: dict[int, Json], r: int, pair: tuple[OwnClient, ...], request: Any, spec: Json
) -> None:
    """Simulated rank ``r``'s part of a phase (on its fmesh or its torch connection):
    its calls, or the error that ended them."""
    phase, tag, calls = request
    client = pair[phase.startswith(("torch", "barrier"))]
    start_s = time.monotonic()
    try:
        for call in range(calls):
            one_call(phase, client, r, f"{tag}/{call}", spec)
        out[r] = {"seconds": time.monotonic() - start_s}
    except Exception as err:
        out[r] = {"error": type(err).__name__, "at": time.monotonic()}
        out[r]["lost"] = list(getattr(err, "lost", ()))
        if phase != "find":
            out[r]["trace"] = traceback.format_exc()


# -- processes ------------------------------------------------------------------------------


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
    store = torch_ref.tcp_store(0, spec["world"], TIMEOUT, master=True)
    reply(conn, store.port)
    while (request := conn.recv()) is not None:
        if request[0] == "cpu":
            reply(conn, time.process_time())
        elif request[0] == "keys":
            reply(conn, sum(f"bench/{request[1]}/" in k for k in store.list_keys()))
        else:  # ("count", key)
            reply(conn, store.add(request[1], 0))


def serve_crowd(spec: Json, conn: Connection) -> None:
    """Simulated ranks ``spec["ranks"]``, two clients each (a client whose wait timed
    out, the watch's sliced waits, can return early from a later one: torch's side
    must not inherit that); a request ``(phase, tag, calls)`` runs the phase on one
    thread per rank and answers each rank's requests by kind, its errors and when they
    came; ``("snapshot",)`` meanwhile: the requests so far."""
    _prepare_process()
    threading.stack_size(512 * 1024)
    clients = {}
    for r in spec["ranks"]:  # torch's client shares the fmesh client's counter
        own = OwnClient(torch_ref.tcp_store(spec["port"], None, TIMEOUT))
        clients[r] = (own, OwnClient(torch_ref.tcp_store(spec["port"], None, TIMEOUT), own))
    setup_process()
    reply(conn, len(clients))

    def total() -> int:
        return sum(sum(pair[0].snapshot().values()) for pair in clients.values())

    while (request := conn.recv()) is not None:
        if request == ("snapshot",):  # the phase ended already (every rank raised)
            reply(conn, total())
            continue
        before = {r: pair[0].snapshot() for r, pair in clients.items()}
        cpu0 = time.process_time()
        out: dict[int, Json] = {}
        threads = [
            threading.Thread(target=run_rank, args=(out, r, pair, request, spec), daemon=True)
            for r, pair in clients.items()
        ]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            if conn.poll(0.05):
                try:
                    conn.recv()  # ("snapshot",)
                except EOFError:  # the bench is gone: so is this crowd
                    os._exit(1)
                reply(conn, total())
        cpu = (time.process_time() - cpu0) / len(clients)  # the crowd's, shared evenly
        for r, pair in clients.items():
            out[r]["kinds"] = delta(pair[0].snapshot(), before[r])
            out[r]["cpu"] = cpu
        reply(conn, out)


@contextlib.contextmanager
def crowds(world: int, spec: Json) -> Iterator[tuple[Started, list[Started], Started]]:
    """The server, the crowds, the victim's crowd (the middle rank), all connected."""
    services: list[Started] = []
    try:
        services.append(server := start(serve_store, {"world": world}, serve=True))
        port = server.receive(60)
        victim = world // 2 + 1
        rest = [r for r in range(world) if r != victim]
        n = -(-len(rest) // PER_CROWD)
        blocks = [rest[i * len(rest) // n : (i + 1) * len(rest) // n] for i in range(n)]
        for block in [*blocks, [victim]]:
            crowd = {**spec, "port": port, "world": world, "ranks": block}
            services.append(start(serve_crowd, crowd, serve=True))
        for s in services[1:]:
            s.receive(600)
        yield server, services[1:-1], services[-1]
    finally:
        for s in services:
            s.stop()


def _phase(server: Started, crowd: list[Started], phase: str, tag: str, calls: int) -> Json:
    """Run one phase on every crowd: each rank's answer, the server's CPU, the time."""
    cpu0, start_s = server.ask(("cpu",), 60), time.monotonic()
    for c in crowd:  # every crowd at once
        c.conn.send((phase, tag, calls))
    ranks = {r: v for c in crowd for r, v in c.receive(900).items()}
    seconds = time.monotonic() - start_s
    failed = [v["trace"] for v in ranks.values() if "trace" in v]
    if failed:
        raise RuntimeError(
            f"{len(failed)} simulated ranks failed in {phase}; the first:\n{failed[0]}"
        )
    cpu, keys = server.ask(("cpu",), 60) - cpu0, server.ask(("keys", tag), 60)
    return {"ranks": ranks, "cpu": cpu, "seconds": seconds, "keys": keys}


def _find(
    server: Started, crowd: list[Started], victim: Started, world: int, steady_s: float
) -> Json:
    """Every rank waits in its creation; the load over ``steady_s``; then the victim's
    process is killed, and each survivor's error and when it came."""
    for c in [*crowd, victim]:
        c.conn.send(("find", "find", 1))
    deadline = time.monotonic() + 600
    while server.ask(("count", "bench/find/0/in"), 60) < world:
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
    errors = [v for v in ranks.values() if "error" in v]
    lost_named = [
        v for v in errors if v["error"] == "PeerLostError" and v["lost"] == [world // 2 + 1]
    ]
    after = [v["at"] - killed for v in errors if v["at"] >= killed]
    return {
        "find_s": max(after) if after else None,  # None: every error came before the kill
        "find_median_s": median(after) if after else None,
        "early": len(errors) - len(after),
        "survivors": len(ranks),
        "peer_lost": len(lost_named),
        "watch_rank": (n1 - n0) / (t1 - t0) / world,
        "watch_rate": (n1 - n0) / (t1 - t0),
        "watch_cpu": (cpu1 - cpu0) / (t1 - t0),
    }


def measure(
    world: int, repeats: int, calls: int, **options: Any
) -> dict[str, list[list[Json]]]:
    """Every phase at ``world`` simulated ranks, ``repeats`` times (after a warm-up of
    each), then ``find``: per library, one result per repeat (:data:`OPTIONS` as
    given)."""
    spec = {**OPTIONS, **options, "calls": calls}
    out: dict[str, list[list[Json]]] = {"fmesh": [], "torch": []}
    with crowds(world, spec) as (server, crowd, victim):
        every = [*crowd, victim]
        for phase in PHASES:  # first calls import and connect what later ones reuse
            _phase(server, every, phase, f"warm-{phase}", 1)
        for repeat in range(repeats):
            got = {p: _phase(server, every, p, f"{p}-{repeat}", calls) for p in PHASES}
            figures = {impl: _figures(got, impl, world, spec) for impl in out}
            fm, tc = (figures[impl]["client_cpu"] for impl in ("fmesh", "torch"))
            figures["fmesh"]["crowd_cpu"] = f"{fm * 1e3:.2f} ms, torch's {tc * 1e3:.2f} ms"
            for impl in out:
                out[impl].append([figures[impl]])
        out["fmesh"][0][0].update(_find(server, crowd, victim, world, spec["steady_s"]))
    return out


def _per_rank(phase: Json, which: Callable[[str], bool] = lambda k: True) -> float:
    ranks = phase["ranks"].values()
    return float(sum(n for v in ranks for k, n in v["kinds"].items() if which(k)) / len(ranks))


def _figures(got: dict[str, Json], impl: str, world: int, spec: Json) -> Json:
    calls = spec["calls"]
    gloo, nccl = got[f"{impl}-gloo"], got[f"{impl}-nccl"]
    # fmt: off
    figures = {
        "requests": _per_rank(gloo) / calls, "nccl": _per_rank(nccl) / calls,
        "cpu_rank": gloo["cpu"] / calls / world, "cpu_call": gloo["cpu"] / calls,
        "client_cpu": median([v["cpu"] for v in gloo["ranks"].values()]) / calls,
        "seconds": gloo["seconds"] / calls, "rate": _per_rank(gloo) * world / gloo["seconds"],
        "keys_left": gloo["keys"] / calls, "group": str(spec["group"]),
        "barriers": str(spec["barriers"]), "hold": f"{spec['hold_s']:g} s",
        "per_crowd": str(PER_CROWD),
    }
    # fmt: on
    if impl == "fmesh":
        figures["own"] = _per_rank(gloo, lambda k: k in ("agree", "watch")) / calls
    else:  # one barrier per new_group call: world / group calls for these groups
        per_barrier = _per_rank(got["barrier"]) / (calls * spec["barriers"])
        figures["barrier"] = per_barrier * world / spec["group"]
        figures["per_barrier"] = per_barrier
    return figures
