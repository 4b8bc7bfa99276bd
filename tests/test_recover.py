"""The recovery protocol of ``fmesh/_runtime/recover.py`` on a real TCPStore, and its errors.

Survivors are played by threads of this process with a store client each (the
protocol needs no process group), except where a process must die: the store's own
host, in a job whose store lives in rank 0 rather than in the launcher.
"""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _dist import run_spawn

import fmesh
from fmesh._protocol import records as _records
from fmesh._protocol import stream as _stream
from fmesh._runtime import recover as _recover

SHORT = datetime.timedelta(seconds=1)


def _tcp(port: int = 0, *, master: bool = False) -> Any:
    import torch.distributed as dist

    tcp: Any = dist.TCPStore  # type: ignore[attr-defined]  # implicit re-export
    return tcp("127.0.0.1", port, 1, is_master=master, wait_for_workers=False)


def _weight(view: list[int], epoch: int = 1, world: int = 4) -> int:
    return _records.weight(_stream.call_code("fmesh.recover", epoch, view), world)


def _survivors(
    port: int,
    plays: dict[int, tuple[list[int], list[int], float]],
    wait: datetime.timedelta = SHORT,
) -> dict[int, Any]:
    """Run ``_verdict`` for each rank: (expected, view, delay before checking in), each
    waiting ``wait`` for the others to check in."""
    out: dict[int, Any] = {}
    clients = {r: _tcp(port) for r in plays}

    def play(rank: int) -> None:
        expected, view, delay = plays[rank]
        time.sleep(delay)
        try:
            out[rank] = _recover._verdict(
                clients[rank], 1, rank, expected, view, _weight(view), wait
            )
        except fmesh.MeshMismatchError as err:
            out[rank] = err

    threads = [threading.Thread(target=play, args=(r,)) for r in plays]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a survivor hung"
    return out


def test_every_survivor_gets_the_ranks_that_did_not_check_in() -> None:
    master = _tcp(master=True)
    # Rank 2 never checks in, so the survivors wait it out: long enough that none of
    # the three threads is late to it on a loaded machine.
    wait = datetime.timedelta(seconds=3)
    out = _survivors(master.port, {r: ([0, 1, 2, 3], [], 0.0) for r in (0, 1, 3)}, wait)
    assert out == {0: [2], 1: [2], 3: [2]}
    # Only the verdict and its wake-up key stay (until the next recovery).
    kept = sorted(k for k in master.list_keys() if _recover.KEY_ROOT in k)
    assert kept == ["fmesh/r/1/all", "fmesh/r/1/verdict"], kept


def test_everyone_in_means_nobody_lost_at_once() -> None:
    master = _tcp(master=True)
    wait = datetime.timedelta(seconds=10)
    start = time.monotonic()
    out = _survivors(master.port, {r: ([0, 1, 2], [], 0.0) for r in (0, 1, 2)}, wait)
    assert out == {0: [], 1: [], 2: []}
    # No rank waited it out (half of it: the clients' start and a loaded machine).
    assert time.monotonic() - start < wait.total_seconds() / 2


def test_a_survivor_later_than_the_timeout_is_declared_lost() -> None:
    master = _tcp(master=True)
    late = 2.5 * SHORT.total_seconds()
    out = _survivors(
        master.port,
        {0: ([0, 1, 2], [], 0.0), 1: ([0, 1, 2], [], 0.0), 2: ([0, 1, 2], [], late)},
    )
    assert out[0] == out[1] == [2]
    assert isinstance(out[2], fmesh.MeshMismatchError)
    assert "rank 2 checked in to fmesh.recover() after the other survivors' timeout" in str(
        out[2]
    )


def test_survivors_that_disagree_about_earlier_losses_raise() -> None:
    master = _tcp(master=True)
    # Rank 2 believes rank 3 was lost before; ranks 0 and 1 do not. Its weight makes
    # the sum no multiple of one weight: "all" is set as the views meet, so the long
    # wait (rank 2 must not be late to it) costs nothing.
    out = _survivors(
        master.port,
        {0: ([0, 1, 2, 3], [], 0.0), 1: ([0, 1, 2, 3], [], 0.0), 2: ([0, 1, 2], [3], 0.2)},
        datetime.timedelta(seconds=10),
    )
    for rank in (0, 1, 2):
        assert isinstance(out[rank], fmesh.MeshMismatchError), out
        assert "survivors disagree about the ranks lost before" in str(out[rank])


def test_a_coordinator_that_dies_before_its_verdict_is_replaced() -> None:
    master = _tcp(master=True)
    master.set("fmesh/r/1/coord", "7")  # claimed by a rank that then died
    start = time.monotonic()
    out = _survivors(master.port, {r: ([0, 1, 2, 7], [], 0.0) for r in (0, 1, 2)})
    assert out == {0: [7], 1: [7], 2: [7]}
    assert time.monotonic() - start < SHORT.total_seconds() + _recover._GRACE + 5.0


def test_recover_needs_a_timeout() -> None:
    with pytest.raises(TypeError, match=r"recover\(\) needs a timeout"):
        fmesh.recover(timeout=None)  # type: ignore[arg-type]  # the error under test
    with pytest.raises(fmesh.MeshError, match=r"recover\(\) timeout must be positive"):
        fmesh.recover(timeout=datetime.timedelta(0))


# -- a store that dies with its host ---------------------------------------------------------


def store_in_rank0_job(rank: int, world: int) -> dict[str, Any]:
    """The job's store lives in rank 0 (not in the launcher); rank 0 then dies."""
    import torch.distributed as dist

    launcher = _tcp(int(os.environ["MASTER_PORT"]))
    if rank == 0:
        own = _tcp(master=True)
        launcher.set("test/port", str(own.port))
    port = int(launcher.get("test/port"))
    store = own if rank == 0 else _tcp(port)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    fmesh.realize(fmesh.make_mesh({"dp": world}))
    launcher.set(f"test/ready/{rank}", "1")
    launcher.wait([f"test/ready/{r}" for r in range(world)])
    if rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    start = time.monotonic()
    try:
        fmesh.recover(timeout=datetime.timedelta(seconds=3))
    except fmesh.MeshMismatchError as err:
        return {"message": str(err), "elapsed": time.monotonic() - start}
    return {"message": "", "elapsed": time.monotonic() - start}


def test_recovery_without_a_store_that_outlives_ranks_says_so(tmp_path: Path) -> None:
    job = run_spawn(store_in_rank0_job, 3, tmp_path=tmp_path, linger=False, timeout=90)
    assert job.outcomes[0].exitcode == -signal.SIGKILL, job.describe()
    for rank in (1, 2):
        out = job.outcomes[rank]
        assert out.ok, job.describe()
        message = out.value["message"]
        assert f"rank {rank} lost the store during fmesh.recover()" in message, message
        assert "Recovery needs a store that outlives any rank" in message, message
        assert "torchrun" in message, message
