"""A late rank is waited for as long as torch would, with a warning each interval.

* Thread-played ranks on one TCPStore (each its own client) run the protocol of
  ``fmesh/_protocol/`` (``_protocol.call``) with a short ``arrivals.WARN_INTERVAL``: a
  late rank within the timeout, the warnings that name it, the list of ranks present
  read by one rank, a constant number of requests per waiting rank and interval, no
  key left but what the stream's next call removes.
* Real gloo processes run the drop-in and torch's own ``_flatten`` on its mesh with a
  late rank: every rank finishes, the warnings name the late rank and the call; past a
  short ``timeout=`` every rank gets the documented error; without one the agreement
  waits torch's own default for the backend (read at call time: patched short in one
  job, so the default path is run to its end in seconds).
"""

from __future__ import annotations

import datetime
import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _dist import run_spawn
from _protocol import call as play_call
from _protocol import keys, protocol_only

import fmesh
from bench.counting import CountingStore
from fmesh._protocol import arrivals, watch

LONG = datetime.timedelta(seconds=60)


def _tcp(port: int = 0, *, master: bool = False) -> Any:
    import torch.distributed as dist

    tcp: Any = dist.TCPStore  # type: ignore[attr-defined]  # implicit re-export
    return tcp("127.0.0.1", port, 1, is_master=master, wait_for_workers=False)


class Client(CountingStore):
    """One thread-played rank's own client (never cloned); logs (op, key) pairs."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.ops: list[tuple[str, str]] = []

    def clone(self) -> CountingStore:
        return self

    def _n(self, keys: str | list[str], n: int = 1) -> None:
        super()._n(keys, n)
        self.ops.append(("?", keys if isinstance(keys, str) else keys[0]))

    def append(self, key: str, value: Any) -> None:
        super().append(key, value)
        self.ops[-1] = ("append", key)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        out = super().compare_set(key, expected, desired)
        self.ops[-1] = ("peek" if expected == "\x00" else "compare_set", key)
        return out

    def count(self, op: str, suffix: str) -> int:
        return sum(1 for o, k in self.ops if (op in ("*", o)) and k.endswith(suffix))


def _call(store: Any, rank: int, world: int, timeout: datetime.timedelta = LONG) -> None:
    play_call(store, rank, world, 5, summary="Mesh(a=4)", timeout=timeout)


def _play(
    world: int, delays: dict[int, float], timeout: datetime.timedelta = LONG
) -> tuple[dict[int, BaseException | None], dict[int, Client], Any]:
    """Every rank of ``world`` agrees, rank r after ``delays.get(r, 0)`` seconds."""
    master = _tcp(master=True)
    clients = {r: Client(_tcp(int(master.port))) for r in range(world)}
    results: dict[int, BaseException | None] = {}

    def run(r: int) -> None:
        time.sleep(delays.get(r, 0.0))
        try:
            _call(clients[r], r, world, timeout)
            results[r] = None
        except BaseException as err:  # reported to the test
            results[r] = err

    threads = [threading.Thread(target=run, args=(r,), name=f"rank{r}") for r in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results, clients, master


@pytest.fixture
def interval(monkeypatch: pytest.MonkeyPatch) -> Iterator[float]:
    monkeypatch.setattr(arrivals, "WARN_INTERVAL", 2.0)
    yield 2.0


@pytest.fixture
def slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """The verdict read every 0.25 s (a wait's slices), so the slow path's steps at a
    2 s warning interval (list at 0.5 s, report at 1.33 s, warn at 2 s) keep their
    order, as they do at the default minute and second."""
    monkeypatch.setattr(watch, "INTERVAL", 0.25)


@pytest.fixture(autouse=True)
def _protocol_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Thread-played ranks: the protocol alone, no liveness port (one per process)."""
    with protocol_only(monkeypatch):
        yield


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fmesh" and r.levelno == 30]


def _named(text: str) -> set[int]:
    """The ranks a waiting rank's warning names (it names them, or says "ranks not
    known yet": its warning came before the first report of the ranks present)."""
    found = re.search(r"for ranks \[([\d, ]+)\]", text)
    assert found, text
    return {int(r) for r in found.group(1).split(",")}


@pytest.mark.usefixtures("slices")
def test_a_late_rank_is_waited_for_and_named_each_interval(
    interval: float, caplog: pytest.LogCaptureFixture
) -> None:
    """5 ranks; rank 3 comes after about 1.5 intervals (it lists itself once it has
    waited a quarter of one), rank 4 after about 4.5. Every rank finishes; the warnings
    name the ranks not there, rank 4 to the end; one rank reads the list and removes
    it once the call ends well."""
    caplog.set_level(logging.WARNING, logger="fmesh")
    world, delays = 5, {3: 1.5 * interval, 4: 4.5 * interval}
    results, clients, master = _play(world, delays)
    assert results == dict.fromkeys(range(world)), results
    said = _warnings(caplog)
    assert said, "no warning"
    named = []
    for text in said:
        assert "call #1 of 's' (Mesh(a=4))" in text, text
        if "ranks not known yet" in text:
            continue  # a rank that warned before the first report of the list
        named.append(_named(text))
        assert 4 in named[-1], text
    # Once rank 3 is there, the warnings name rank 4 alone.
    assert sum(n == {4} for n in named) >= 3, said
    # Rank 3 came after the list was opened: it listed itself with one append (after
    # the compare_set that found the list open).
    assert clients[3].count("append", "/arr") == 1, clients[3].ops
    assert clients[3].count("compare_set", "/arr") == 1
    # Rank 4 came last: it completed the call and listed nothing.
    assert clients[4].count("*", "/arr") == 0
    # The list of arrivals is read by one rank alone (the one that opened it).
    readers = [r for r, c in clients.items() if c.count("peek", "/arr")]
    assert len(readers) == 1, {r: c.ops for r, c in clients.items()}
    assert clients[readers[0]].count("compare_set", "/arr") == 1
    assert keys(master) == ["1/n", "1/ok", "c"], master.list_keys()


@pytest.mark.parametrize("world", [4, 16])
def test_a_waiting_rank_costs_a_constant_per_interval(interval: float, world: int) -> None:
    """Rank 1 comes after 4 intervals: every other rank's requests stay under a bound
    that does not depend on the world (4 or 16 ranks)."""
    results, clients, _master = _play(world, {1: 4 * interval})
    assert all(v is None for v in results.values()), results
    per_rank = [len(c.ops) for r, c in clients.items() if r != 1]
    # The call (record, count, wait), the listing (1, the opener 1), then per interval
    # a slice of the wait and a read of the verdict, and a warning's read per warning
    # interval; the opener also reads the list and publishes it once an interval:
    # about 20 requests, the opener 30.
    assert max(per_rank) <= 40, per_rank
    assert sorted(per_rank)[len(per_rank) // 2] <= 26, per_rank


def test_a_late_rank_past_the_timeout_is_named_and_keys_are_removed(interval: float) -> None:
    """Every waiting rank raises at the timeout naming the rank that never came; it
    raises too when it comes, and, every rank being out, the call's keys are gone."""
    timeout = datetime.timedelta(seconds=2 * interval)
    # Past the census: its grace (2 intervals of reads and 2 s) after the timeout.
    results, _clients, master = _play(4, {2: 6 * interval}, timeout)
    for r, err in results.items():
        assert isinstance(err, fmesh.MeshMismatchError), (r, err)
        if r == 2:
            assert "rank 2 arrived after the other ranks gave up on call #1" in str(err)
        assert "ranks [2] never reached call #1 of 's' within 4s" in str(err), (r, err)
    assert keys(master) == ["c"], master.list_keys()


def test_a_short_wait_costs_what_it_did() -> None:
    """At the default interval, a call whose ranks come within seconds makes no
    request of the list of ranks present: 3 requests a rank (the record, the count, the
    wait), and a read of the verdict and another slice of the wait for each slice (1 s)
    that ends before the last rank comes: none here on an idle machine."""
    results, clients, _master = _play(4, {2: 0.3})
    assert all(v is None for v in results.values()), results
    assert all(c.count("*", "/arr") == c.count("*", "/late") == 0 for c in clients.values())
    assert max(len(c.ops) for c in clients.values()) <= 5, {
        r: c.ops for r, c in clients.items()
    }
    assert min(len(c.ops) for c in clients.values()) == 3, {
        r: c.ops for r, c in clients.items()
    }


# -- real processes -------------------------------------------------------------------------

WORLD = 4
LATE = 3
WARN = 2.0
"""Seconds between two warnings of a waiting rank in the process jobs."""


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _spy_timeouts() -> list[float]:
    """The patience of every creating call this process makes, in seconds."""
    seen: list[float] = []
    from fmesh._protocol import liveness

    real = liveness.watching

    def spy(ticket: Any, patience: datetime.timedelta, timeout: Any) -> Any:
        seen.append(patience.total_seconds())
        return real(ticket, patience, timeout)

    liveness.watching = spy  # this worker process only
    return seen


def late_job(rank: int, world: int, late_s: float) -> dict[str, Any]:
    """The drop-in without a timeout; then with one, and torch's own ``_flatten`` on
    its mesh, rank LATE coming ``late_s`` late to both."""
    import torch
    import torch.distributed as dist
    from torch.distributed import Backend
    from torch.distributed import distributed_c10d as c10d

    from fmesh.device_mesh import init_device_mesh

    arrivals.WARN_INTERVAL = WARN
    watch.INTERVAL = 0.25  # the verdict read (and the slow path's steps) every 0.25 s
    records = _Records()
    logging.getLogger("fmesh").addHandler(records)
    timeouts = _spy_timeouts()
    dist.init_process_group("gloo")
    init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))  # torch's default
    before = len(records.messages)  # call #1's, if a loaded machine made one wait
    if rank == LATE:
        time.sleep(late_s)
    start = time.monotonic()
    dm = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"), timeout=LONG)
    seconds = {"init": time.monotonic() - start}
    first = records.messages[before:]
    if rank == LATE:
        time.sleep(late_s)
    start = time.monotonic()
    flat = dm._flatten("dp_tp")
    seconds["flatten"] = time.monotonic() - start
    x = torch.ones(1)
    dist.all_reduce(x, group=flat.get_group())
    return {
        "init": first,
        "flatten": records.messages[before + len(first) :],
        "seconds": seconds,
        "sum": x.item(),
        "timeouts": timeouts,
        "torch_default": c10d._get_default_timeout(Backend("gloo")).total_seconds(),
    }


def test_a_late_rank_within_the_timeout_and_the_warnings(tmp_path: Path) -> None:
    outs = run_spawn(
        late_job, WORLD, 5.0, tmp_path=tmp_path, linger=False, timeout=120
    ).values()
    alone = {"init": 0, "flatten": 0}
    for rank, out in enumerate(outs):
        assert out["sum"] == WORLD
        # The agreement's default is torch's own for the backend (30 minutes on gloo);
        # a timeout= given reaches it for torch's own methods too.
        assert out["torch_default"] == 1800.0
        assert out["timeouts"] == [1800.0, 60.0, 60.0], out["timeouts"]
        for phase, call in (("init", "realize call #2"), ("flatten", "realize call #3")):
            said = out[phase]
            for text in said:
                assert f"rank {rank} has waited" in text and f"at {call} (" in text, text
            # Left out: "ranks not known yet", a warning before the list's first report.
            named = [_named(text) for text in said if "ranks not known yet" not in text]
            if rank == LATE:
                # It came last: it waits for nobody. Only a call of it that lasted a
                # warning interval (a loaded machine) warns, naming at most itself (the
                # report of the list before it listed itself).
                if out["seconds"][phase] < WARN:
                    assert said == [], (rank, phase, out)
                assert all(n == {LATE} for n in named), (rank, phase, said)
                continue
            assert said, (rank, phase)
            # Every report names the late rank (another one too, only if that one was
            # listed after the report: a rank that started its call a second late).
            assert named and all(LATE in n for n in named), (rank, phase, said)
            alone[phase] += sum(n == {LATE} for n in named)
        if rank != LATE:
            assert "dp=2, tp=2" in out["init"][0], out["init"][0]
            assert "dp_tp=4" in out["flatten"][0], out["flatten"][0]
    assert alone["init"] and alone["flatten"], (alone, outs)


def past_job(rank: int, world: int, patch_default: bool) -> dict[str, Any]:
    """Rank LATE comes 12 s late; the others wait 3 s: ``timeout=`` given, or torch's
    default for gloo patched to 3 s (torch reads it at each call, so does fmesh)."""
    from torch.distributed import distributed_c10d as c10d

    from fmesh.device_mesh import init_device_mesh

    arrivals.WARN_INTERVAL = 2.0
    short = datetime.timedelta(seconds=3)
    if patch_default:
        c10d.default_pg_timeout = short
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=LONG)
    if rank == LATE:
        time.sleep(12.0)
    start = time.monotonic()
    try:
        init_device_mesh("cpu", (2, 2), timeout=None if patch_default else short)
    except fmesh.MeshMismatchError as err:
        return {"message": str(err), "seconds": time.monotonic() - start}
    return {"message": "", "seconds": time.monotonic() - start}


@pytest.mark.parametrize(
    "patch_default", [False, True], ids=["timeout=3s", "torch-default=3s"]
)
def test_a_late_rank_past_the_timeout_gets_the_documented_error(
    tmp_path: Path, patch_default: bool
) -> None:
    outs = run_spawn(
        past_job, WORLD, patch_default, tmp_path=tmp_path, linger=False, timeout=120
    ).values()
    for rank, out in enumerate(outs):
        assert f"ranks [{LATE}] never reached realize call #1 within 3s" in out["message"], (
            rank,
            out,
        )
        if rank == LATE:
            assert "arrived after the other ranks gave up" in out["message"], out
            assert out["seconds"] < 15, out
        else:
            assert 2.5 < out["seconds"] < 30, out
