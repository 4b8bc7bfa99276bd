"""Liveness the kernel keeps (``fmesh/_protocol/port.py``, ``links.py``, ``watch.py``).

* A process holding a port (a child of this test): a link to it stays quiet while the
  process is stopped (its kernel answers keepalive), closes at once when it dies, and
  the port then refuses; a fork of it does not keep the port.
* Floods against a port (2,000 connections held open, garbage, clients that never
  read, connect-and-close loops), in a process that holds 2,000 open files, and one
  with no descriptor to spare: the port holds a bounded number of descriptors, its
  thread does not spin, and a watcher still gets in.
* Simulated ranks' watches on one store (threads of this process, this process's own
  port for live ranks, a port no process holds for a dead one): a dead successor is
  declared and named by every watch; the verdict stays until the rank it names reads
  it; a rank the verdict names learns it was given up on; a waiting rank's requests per
  interval do not grow with the group.

Real gloo ranks: ``tests/test_peerloss.py`` (deaths), ``tests/test_slow_peers.py``
(ranks stopped with what they started, or holding the GIL), ``tests/test_hosts_netns.py``
(hosts cut off).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch.distributed as dist
from _protocol import dead_address, serving

from bench.counting import CountingStore
from fmesh import PeerLostError
from fmesh._compat import memory_store
from fmesh._compat.interruptible import peek
from fmesh._protocol import links, liveness, port, watch
from fmesh._protocol.records import Entry, Record, Ticket

if TYPE_CHECKING:
    from fmesh._compat import Store

ROOT = Path(__file__).resolve().parents[1]

HOLDER = """\
import json, os, resource, sys, time
sys.path.insert(0, {root!r})
mode, files = sys.argv[1], int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if mode == "scarce":  # no descriptor to spare: the port's accept meets EMFILE
    resource.setrlimit(resource.RLIMIT_NOFILE, (files + 40, hard))
elif files + 512 > soft:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, files + 4096), hard))
held = [open(os.devnull) for _ in range(files)]  # a trainer's shards and sockets
from fmesh._protocol import port
p = port.mine("127.0.0.1")
p.serve()
child = 0
if mode == "fork":  # a data loader's worker: a fork that outlives the rank
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # the at-fork hooks have run when fork returns here
        os.write(w, b"1")
        time.sleep(120)
        os._exit(0)
    os.read(r, 1)  # the fork is past its hooks before the test goes on
a = p.address
print(json.dumps([a.host, a.port, a.token, child]), flush=True)
for line in sys.stdin:  # "held": what the port holds and this process's descriptors
    pending, watchers = p.held()
    try:
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:  # none to spare for the listing
        fds = -1
    print(json.dumps([pending, watchers, fds]), flush=True)
"""


class Holder:
    """A process holding a liveness port (``mode``: plain, fork, scarce)."""

    def __init__(self, mode: str = "plain", files: int = 0) -> None:
        code = HOLDER.format(root=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, mode, str(files)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        host, number, token, self.child = json.loads(self.proc.stdout.readline())
        self.address = port.Address(host, number, token)

    def held(self) -> tuple[int, int, int]:
        """(strangers, watchers) the port holds, and the process's descriptors."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("held\n")
        self.proc.stdin.flush()
        pending, watchers, fds = json.loads(self.proc.stdout.readline())
        return pending, watchers, fds

    def cpu(self) -> float:
        """Seconds of CPU the process used (user and system)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        if self.child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, signal.SIGKILL)


@pytest.fixture
def holder() -> Iterator[Holder]:
    h = Holder()
    yield h
    h.kill()


def _link(address: port.Address, silence: float = 4.0) -> links.Link:
    got = links.connect_all([(0, address)], silence)[0]
    assert isinstance(got, links.Link), got
    got.watching(silence)
    return got


def _checked(link: links.Link, seconds: float) -> tuple[str, str]:
    """What the link says after ``seconds`` of asking (its first answer that is not
    quiet, or quiet)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        kind, why = link.check()
        if kind:
            return kind, why
        time.sleep(0.05)
    return "", ""


# -- a process and its port -------------------------------------------------------------


def test_a_stopped_process_keeps_its_port_and_a_dead_one_closes_and_refuses(
    holder: Holder,
) -> None:
    link = _link(holder.address, silence=2.0)  # keepalive: a probe a second, 3 missed
    assert _checked(link, 0.5) == ("", "")  # greeted, quiet
    os.kill(holder.proc.pid, signal.SIGSTOP)
    # Stopped for three times the silence: its kernel answers the probes.
    assert _checked(link, 6.0) == ("", ""), "a stopped process was taken for dead"
    os.kill(holder.proc.pid, signal.SIGKILL)
    holder.proc.wait()
    start = time.monotonic()
    kind, why = _checked(link, 5.0)
    assert kind == "closed" and time.monotonic() - start < 1.0, (kind, why)
    again = links.connect_all([(0, holder.address)], 2.0)[0]
    assert again == ("dead", "its port refused the connection (its process ended)"), again


def test_a_fork_of_the_rank_does_not_keep_its_port_open() -> None:
    h = Holder("fork")
    try:
        link = _link(h.address)
        os.kill(h.proc.pid, signal.SIGKILL)
        h.proc.wait()
        os.kill(h.child, 0)  # the fork lives on
        kind, _ = _checked(link, 5.0)
        assert kind == "closed", kind
        got = links.connect_all([(0, h.address)], 2.0)[0]
        assert isinstance(got, tuple) and got[0] == "dead", got
    finally:
        h.kill()


def test_another_process_at_the_address_is_a_stranger() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        address = port.Address("127.0.0.1", int(srv.getsockname()[1]), "expected")
        link = links.connect_all([(0, address)], 2.0)[0]
        assert isinstance(link, links.Link)
        conn, _ = srv.accept()
        with conn:
            conn.sendall(b"fmesh-rank someone-else\n")
            kind, why = _checked(link, 2.0)
    assert kind == "stranger" and "fmesh-rank someone-else" in why, (kind, why)


# -- floods -------------------------------------------------------------------------------

FLOOD = 2000


def _raise_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, need), hard))


def _flood(address: port.Address) -> dict[str, int]:
    """2,000 connections held open (some sending garbage, some a long line, none
    reading), then 2,000 connected and closed at once; what the port held meanwhile."""
    _raise_limit(FLOOD + 1024)
    held: list[socket.socket] = []
    try:
        for i in range(FLOOD):
            sock = socket.create_connection((address.host, address.port), 10)
            if i % 3 == 1:
                sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
            elif i % 3 == 2:
                sock.sendall(b"x" * 4096)
            held.append(sock)
        for _ in range(FLOOD):
            socket.create_connection((address.host, address.port), 10).close()
        return {"opened": len(held)}
    finally:
        for sock in held:
            sock.close()


@pytest.mark.parametrize("mode, files", [("plain", 2000), ("scarce", 2000)])
def test_a_flood_is_bounded_and_a_watcher_still_gets_in(mode: str, files: int) -> None:
    """A port in a process holding 2,000 open files (``scarce``: and no descriptor to
    spare): floods leave its descriptors bounded, its thread idle, and watchers in."""
    h = Holder(mode, files)
    try:
        _, _, fds0 = h.held()
        assert fds0 > files  # the files are open, the port's descriptors above them
        cpu0 = h.cpu()
        start = time.monotonic()
        out: dict[str, int] = {}
        flood = threading.Thread(target=lambda: out.update(_flood(h.address)))
        flood.start()
        worst = 0
        quiet = 0
        while flood.is_alive():
            _, _, fds = h.held()
            worst = max(worst, fds - fds0)
            got = links.connect_all([(0, h.address)], 10.0)[0]  # a watcher meanwhile
            if isinstance(got, links.Link):
                quiet += _checked(got, 0.2)[0] in ("", "closed")
                got.close()
            time.sleep(0.2)
        flood.join()
        seconds = time.monotonic() - start
        time.sleep(port.HELLO_S + 1.0)  # strangers that never said hello are closed
        pending, _watchers, fds = h.held()
        cpu = h.cpu() - cpu0
    finally:
        h.kill()
    assert out["opened"] == FLOOD
    assert quiet > 0  # watchers connected during the flood
    # Held at most: the strangers and watchers it keeps, its reserve and selector (with
    # no descriptor to spare, the limit bounds it, and the port sheds what it cannot).
    bound = port.MAX_PENDING + port.MAX_WATCHERS + 4
    assert worst <= bound, (worst, bound)
    assert pending == 0, pending
    if mode == "plain":
        assert fds - fds0 <= 1, (fds, fds0)
    # No busy loop: the port's thread used a small part of the flood's wall time.
    assert cpu < 0.5 * seconds + 1.0, (cpu, seconds)


def test_a_watcher_holding_many_files_watches_with_any_descriptor(holder: Holder) -> None:
    _raise_limit(FLOOD + 1024)
    held = [open(os.devnull) for _ in range(FLOOD)]  # noqa: SIM115  # closed below
    try:
        link = _link(holder.address, silence=2.0)
        assert link.sock is not None and link.sock.fileno() >= 1024
        assert _checked(link, 0.5) == ("", "")
        holder.proc.kill()
        holder.proc.wait()
        assert _checked(link, 5.0)[0] == "closed"
    finally:
        for f in held:
            f.close()


# -- simulated ranks on one store ------------------------------------------------------------


@pytest.fixture
def live() -> Iterator[port.Port]:
    """This process's port: every live simulated rank's."""
    with serving("127.0.0.1") as p:
        yield p


def _ticket(store: Store, rank: int, n: int, prefix: str = "fmesh/a/1/p/1/") -> Ticket:
    entry = Entry(1, 0, rank)
    record = lambda: Record(rank, 0, "mesh {'a': 3}", "")  # noqa: E731
    return Ticket(
        store, store, rank, range(n), prefix, "realize call #1", entry, record, entry
    )


def _publish(store: Store, ranks: range, address: port.Address) -> None:
    for r in ranks:
        store.set(port.KEY + str(r), address.text())


LONG = datetime.timedelta(seconds=60)
Outcomes = dict[int, tuple[object, float]]


def _finish(w: watch.Watch, out: Outcomes) -> None:
    start = time.monotonic()
    try:
        w.finish(LONG)
        out[w.ticket.rank] = ("ok", time.monotonic() - start)
    except Exception as err:
        out[w.ticket.rank] = (err, time.monotonic() - start)
    finally:
        w.close()


def test_a_dead_successor_is_declared_and_every_watch_raises_naming_it(
    live: port.Port,
) -> None:
    store = memory_store()
    store.set_timeout(datetime.timedelta(seconds=10))
    _publish(store, range(2), live.address)
    _publish(store, range(2, 3), dead_address())
    tickets = [_ticket(store, r, 3) for r in (0, 1)]
    watches = [watch.Watch(t, LONG, None, liveness=True) for t in tickets]
    out: Outcomes = {}
    threads = [threading.Thread(target=_finish, args=(w, out)) for w in watches]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for rank in (0, 1):
        err, elapsed = out[rank]
        assert isinstance(err, PeerLostError), out
        assert err.lost == (2,), err
        assert "rank(s) [2] died during realize call #1" in str(err), err
        assert "(found by rank 1: its port refused the connection" in str(err), err
        assert elapsed < 15.0, out
    # The call's keys are gone but its verdict, until the rank it names reads it.
    p = tickets[0].prefix
    gone = ("n", "ok", "arr", "late", "to", "mm", "full")
    assert [peek(store, p + k) for k in gone] == [None] * len(gone)
    assert peek(store, p + "end") == b"lost" and peek(store, p + "lost") == b"2,"


def test_the_last_rank_out_wakes_the_others_and_the_next_call_cleans_up(
    live: port.Port,
) -> None:
    store = memory_store()
    _publish(store, range(3), live.address)
    out: Outcomes = {}
    for number in (1, 2):
        prefix = f"fmesh/a/1/p/{number}/"
        watches = [
            watch.Watch(_ticket(store, r, 3, prefix), LONG, None, liveness=True)
            for r in range(3)
        ]
        threads = [threading.Thread(target=_finish, args=(w, out)) for w in watches]
        for t in threads:
            t.start()
            time.sleep(0.2)
        for t in threads:
            t.join(30)
        assert [out[r][0] for r in range(3)] == ["ok"] * 3, out
        assert peek(store, prefix + "n") == b"3" and peek(store, prefix + "ok") == b"1"
    # The second call's last rank out removed the first's count and "ok".
    assert peek(store, "fmesh/a/1/p/1/n") is None and peek(store, "fmesh/a/1/p/1/ok") is None


@pytest.mark.parametrize("n", [4, 16])
def test_a_waiting_ranks_requests_per_interval_do_not_grow_with_the_group(
    live: port.Port, n: int
) -> None:
    # Rank 0 waits for a key that never comes, in the call's sliced store: per
    # interval one slice and one read of the verdict, whatever the group's size.
    inner = memory_store()
    _publish(inner, range(n), live.address)
    counting = CountingStore(inner)
    t = _ticket(counting, 0, n)
    began = time.monotonic()
    w = watch.Watch(t, LONG, datetime.timedelta(seconds=2), liveness=True)
    assert w.interval == 0.5
    # About 2.9 s: slices start at 0, 0.5, ..., 2.5, each may read the verdict (the
    # bounds count the intervals the wait really lasted: a timer may fire late).
    gate = threading.Timer(2.9, inner.set, ("fmesh/a/1/p/1/never", "1"))
    gate.start()
    try:
        w.store_for(counting).wait(["fmesh/a/1/p/1/never"], datetime.timedelta(seconds=1))
        intervals = (time.monotonic() - began) / w.interval
        requests = sum(counting.snapshot().values())
        keys = counting.key_snapshot()
    finally:
        w.close()
    # The successor's address, read once per process, is one of those reads: it takes
    # the place of a read of the verdict (at most one read per interval).
    assert keys.get(port.KEY + "1") == 1, keys
    assert keys[port.KEY + "1"] + keys.get(w.p + "end", 0) <= intervals + 1, keys
    assert requests <= 2 * intervals + 2, keys  # and a last, shorter slice


def test_a_rank_the_verdict_names_learns_it_was_given_up_on(live: port.Port) -> None:
    # Alive (its link was cut, say): the verdict names it.
    store = memory_store()
    _publish(store, range(2), live.address)
    ticket = _ticket(store, 0, 2)
    store.set(ticket.prefix + "lost", "0,")
    store.set(ticket.prefix + "by", "1\x1fno answer from its host (Connection timed out)")
    store.set(ticket.prefix + "end", "lost")
    w = watch.Watch(ticket, LONG, datetime.timedelta(seconds=2), liveness=True)
    try:
        with pytest.raises(dist.DistNetworkError):
            w.store_for(store).wait(["never"], datetime.timedelta(seconds=5))
        err = w.error("creating a group", "")
    finally:
        w.close()
    assert isinstance(err, PeerLostError) and err.lost == (0,), err
    assert "rank 0 was given up on during realize call #1" in str(err), err
    assert "found by rank 1: no answer from its host" in str(err), err
    # It read the verdict, the one rank it names; the verdict stays until every other
    # rank is out of the call too.
    assert peek(store, ticket.prefix + "read") == b"1"
    assert peek(store, ticket.prefix + "end") == b"lost"


def test_the_watch_off_opens_no_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FMESH_PEER_WATCH", "0")
    assert not liveness.enabled()
    store = memory_store()
    w = watch.Watch(_ticket(store, 0, 2), LONG, None, liveness=liveness.enabled())
    time.sleep(1.1)
    assert not w.cancelled(store)
    w.close()
    assert [k for k in store.list_keys() if port.KEY in k] == []


# -- the store ------------------------------------------------------------------------------


def _store(kind: str, tmp: Path) -> Any:
    d: Any = dist  # TCPStore, FileStore, PrefixStore: implicit re-exports
    if kind == "hash":
        return memory_store()
    if kind == "file":
        return d.FileStore(str(tmp / "store"), 1)
    tcp = d.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    return tcp if kind == "tcp" else d.PrefixStore("default_pg", tcp)


@pytest.mark.parametrize("kind", ["hash", "tcp", "file", "prefix"])
def test_peek_reads_a_key_without_waiting_and_never_creates_one(
    kind: str, tmp_path: Path
) -> None:
    # The watch reads a call's verdict with one request (a get would wait first).
    store = _store(kind, tmp_path)
    assert peek(store, "missing") is None
    assert not store.check(["missing"])
    store.set("end", "ok")
    assert peek(store, "end") == b"ok"
    assert store.get("end") == b"ok"
    assert store.add("n", 3) == 3
    assert peek(store, "n") == b"3"
    assert store.add("n", 0) == 3


def test_torchs_store_wakes_a_keys_waiters_on_a_compare_set_of_it() -> None:
    # Why nobody reads "ok" without waiting: on torch's TCPStore, a compare_set of a
    # missing key (what peek sends) wakes the clients waiting for that key, which then
    # return from their wait as if it existed.
    d: Any = dist
    server = d.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    waiter = d.TCPStore("127.0.0.1", server.port, 1, is_master=False)
    threading.Timer(0.3, peek, (server, "missing")).start()
    start = time.monotonic()
    waiter.wait(["missing"], datetime.timedelta(seconds=10))
    assert time.monotonic() - start < 5.0
    assert not waiter.check(["missing"])


# -- what liveness costs a process ------------------------------------------------------------

PER_PROCESS_FDS = 6
"""A rank's descriptors for liveness, at most: its port, the port's selector and
reserve, the link to its successor, and its predecessor's link (held by the port),
plus one for a second watcher (a ring that walked past a dead rank)."""


def cost_job(rank: int, world: int) -> dict[str, Any]:
    """Several creating calls (their waits made long enough to watch: rank 0 is 1.5 s
    late to each): what this process holds for liveness after them."""
    import resource

    import torch.distributed as dist

    import fmesh

    dist.init_process_group("gloo")
    dist.barrier()
    fds0 = set(os.listdir("/proc/self/fd"))
    threads0 = {t.ident for t in threading.enumerate()}
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    meshes = [
        fmesh.make_mesh({"dp": 2, "tp": world // 2}),
        fmesh.make_mesh({"x": 2, "y": world // 2}, ranks=list(range(world))[::-1]),
        fmesh.make_mesh({"a": world // 2, "b": 2}),
    ]
    for mesh in meshes:
        if rank == 0:
            time.sleep(1.5)
        fmesh.realize(mesh)
    dist.barrier()
    time.sleep(0.5)
    new = [t for t in threading.enumerate() if t.ident not in threads0]
    children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
    sockets = [
        os.readlink(f"/proc/self/fd/{fd}")
        for fd in set(os.listdir("/proc/self/fd")) - fds0
        if os.path.exists(f"/proc/self/fd/{fd}")
    ]
    return {
        "threads": sorted(t.name for t in new),
        "children": children,
        "fds": len(sockets),
        "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0,
    }


def test_a_process_pays_one_thread_and_a_handful_of_descriptors(tmp_path: Path) -> None:
    from _dist import run_spawn

    outs = run_spawn(cost_job, 4, tmp_path=tmp_path, timeout=120).values()
    for rank, out in enumerate(outs):
        # No process per rank, one thread (the port's), whatever the calls made.
        assert out["children"] == [], (rank, out)
        assert out["threads"] == ["fmesh-liveness"], (rank, out)
        # The groups' own descriptors (gloo's pairs and loops) come on top: compare
        # with a run without the watch (test below).
        assert out["fds"] >= 1, (rank, out)
    off = run_spawn(cost_off_job, 4, tmp_path=tmp_path / "off", timeout=120).values()
    for rank, (out, base) in enumerate(zip(outs, off, strict=True)):
        assert out["fds"] - base["fds"] <= PER_PROCESS_FDS, (rank, out, base)
        assert base["threads"] == [], (rank, base)


def cost_off_job(rank: int, world: int) -> dict[str, Any]:
    """The same calls with the watch off: the groups' own descriptors alone."""
    os.environ["FMESH_PEER_WATCH"] = "0"
    return cost_job(rank, world)


def _user_timeouts_to(port_number: int) -> list[int]:
    """TCP_USER_TIMEOUT (ms) of each of this process's TCP connections to the port."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
            with sock:
                if (
                    sock.family in (socket.AF_INET, socket.AF_INET6)
                    and sock.type == socket.SOCK_STREAM
                ):
                    with contextlib.suppress(OSError):
                        if sock.getpeername()[1] == port_number:
                            out.append(
                                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
                            )
    return out


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="no TCP_USER_TIMEOUT")
def test_a_call_hardens_the_store_connections_among_unix_and_listening_sockets() -> None:
    # A process holds Unix sockets (a data loader's pipes), listening and UDP sockets
    # beside its store client: the call's hardening finds the client's connections and
    # nothing else, gives them back the kernel's default after, and keeps no descriptor.
    from fmesh._protocol import connections

    tcp: Any = dist.TCPStore  # type: ignore[attr-defined]  # implicit re-export
    server = tcp(
        "127.0.0.1", 0, 1, True, datetime.timedelta(seconds=10), wait_for_workers=False
    )
    client = tcp("127.0.0.1", server.port, 1, False, datetime.timedelta(seconds=10))
    pair = socket.socketpair(socket.AF_UNIX)
    listening = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        assert _user_timeouts_to(server.port) and set(_user_timeouts_to(server.port)) == {0}
        fds = len(os.listdir("/proc/self/fd"))
        with connections.hardened(client):
            during = _user_timeouts_to(server.port)
            with connections.hardened(client):  # another call of the process meanwhile
                pass
            still = _user_timeouts_to(server.port)
        after = _user_timeouts_to(server.port)
        # It works on duplicates of the connections, closed after: none is left.
        assert len(os.listdir("/proc/self/fd")) == fds
    finally:
        for sock in (*pair, listening, udp):
            sock.close()
    expected = int(connections.USER_TIMEOUT * 1000)
    # The server's side of each connection is the other end (its peer port differs);
    # this process's clients are the ones whose peer is the server's port.
    assert expected in during, during
    assert still == during, (still, during)  # the first call's hold outlasts the other's
    assert set(after) == {0}, after
