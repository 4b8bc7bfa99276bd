"""Run a function on several local processes, torchrun-style, and collect results.

The realize tests need real process groups, which are process-global, so every job
runs in fresh processes:

* workers are forked from a ``forkserver`` that has imported torch once, so a job of
  8 ranks does not pay 8 torch imports (the machine may have 2 cores);
* each worker gets this process's environment as it is when the job starts (not the
  server's, which is what it was when the server started: a test that had set
  ``FMESH_PEER_WATCH=0`` then would turn the watch off in every later job of the
  pytest worker), plus the torchrun environment (``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), and lets ``fmesh.realize``
  initialize gloo itself;
* the rendezvous store is hosted here, in the parent, on a port the OS picked (as
  torchrun's agent does, ``TORCHELASTIC_USE_AGENT_STORE``), so there is no port to
  guess and no race for one;
* each worker writes its return value or its exception to a file; the parent waits
  with a deadline, kills whatever is left, and reports every rank.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import pickle
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Job", "Outcome", "kill_tree", "run_command", "run_spawn", "wait_for_peers"]

_PRELOAD = ["torch", "torch.distributed", "torch.distributed.tensor", "numpy", "fmesh"]
_ctx: multiprocessing.context.ForkServerContext | None = None


def _context() -> multiprocessing.context.ForkServerContext:
    global _ctx
    if _ctx is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        # The server imports torch once for every worker: hide GPUs from it, so no CUDA
        # state is inherited and CPU/gloo jobs stay on CPU on a GPU machine.
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            if saved is None:
                del os.environ["CUDA_VISIBLE_DEVICES"]
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved
        _ctx = ctx
    return _ctx


@dataclass(frozen=True)
class Outcome:
    """What one rank reported."""

    rank: int
    value: Any = None
    """The worker function's return value (when it returned)."""
    error: str | None = None
    """Class name of the exception it raised, if it raised."""
    error_mro: tuple[str, ...] = ()
    """Names of the exception's classes, most derived first."""
    message: str = ""
    traceback: str = ""
    hung: bool = False
    """The rank neither returned nor raised before the deadline (it was killed)."""
    exitcode: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.hung


@dataclass(frozen=True)
class Job:
    """The outcome of every rank of one job."""

    outcomes: tuple[Outcome, ...]
    elapsed: float
    """Wall-clock seconds from the first start to the last exit."""
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"job took {self.elapsed:.1f}s"]
        for o in self.outcomes:
            if o.hung:
                lines.append(f"rank {o.rank}: HUNG (killed at the deadline)")
            elif o.error is not None:
                lines.append(f"rank {o.rank}: {o.error}: {o.message}\n{o.traceback}")
            else:
                lines.append(f"rank {o.rank}: ok")
        return "\n".join(lines)

    def values(self) -> list[Any]:
        """Every rank's return value; fails the test with all reports otherwise."""
        if not all(o.ok for o in self.outcomes):
            raise AssertionError("a rank failed:\n" + self.describe())
        return [o.value for o in self.outcomes]


def _worker(
    fn: Callable[..., Any],
    rank: int,
    world: int,
    env: dict[str, str],
    out: str,
    args: tuple[Any, ...],
    linger: bool,
) -> None:
    os.environ.clear()
    os.environ.update(env)
    report: dict[str, Any]
    try:
        value = fn(rank, world, *args)
        report = {"value": value}
    except BaseException as err:  # report everything; the parent decides
        report = {
            "error": type(err).__name__,
            "error_mro": tuple(c.__name__ for c in type(err).__mro__),
            "message": str(err),
            "traceback": traceback.format_exc(),
        }
    tmp = Path(out + ".tmp")
    tmp.write_bytes(pickle.dumps(report))
    tmp.rename(out)
    if linger:  # a rank that raised too: a peer may still be in gloo's handshake
        wait_for_peers()
    # Skip interpreter teardown: process-group destructors may wait on peers that
    # have already gone, and the parent has what it needs.
    os._exit(0)


def wait_for_peers(seconds: float = 10.0) -> None:
    """Stay until every rank of the default group has returned or raised, or
    ``seconds`` pass.

    torch's group creation (gloo) can return on one rank while a peer still reads its
    handshake on their pair: a rank that exits then fails that peer with "Connection
    closed by peer" (seen about once in 15 jobs that end right after torch's
    ``init_device_mesh``). fmesh's creating calls end with a round every rank
    finishes, so only torch's own creation needs this; a job ends as a launched
    program's ranks do when they meet once more before exiting.
    """
    import torch.distributed as dist

    from fmesh._compat import default_store

    if not dist.is_initialized():
        return
    try:
        store, size = default_store(), dist.get_world_size()
        store.add(_DONE, 1)
        deadline = time.monotonic() + seconds
        while store.add(_DONE, 0) < size and time.monotonic() < deadline:
            time.sleep(0.01)
    except Exception:  # a job whose store is gone has nothing to wait for
        return


_DONE = "tests/_dist/returned"

_LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE",
)


def run_spawn(
    fn: Callable[..., Any],
    world: int,
    *args: Any,
    timeout: float = 90.0,
    tmp_path: Path,
    launch_env: bool = True,
    linger: bool = True,
) -> Job:
    """Run ``fn(rank, world, *args)`` on ``world`` fresh processes and collect results.

    ``fn`` must be a module-level function (it is pickled by reference) and return
    something picklable. With ``launch_env`` the workers see the torchrun variables
    for a world of ``world`` ranks; without it those variables are removed, so the
    worker starts with no launcher at all. Ranks still running after ``timeout``
    seconds are killed and reported as hung. Workers see no CUDA device, so they
    run on CPU/gloo on a GPU machine too. With ``linger`` a rank that returned or
    raised waits for the others (10 s at most) before it exits
    (``wait_for_peers``); fault jobs, whose timings are the point (a rank stopped,
    given up on, killed), exit at once.
    """
    from torch._C._distributed_c10d import TCPStore

    if not 1 <= world <= 8:
        raise ValueError(f"run_spawn keeps jobs small: world must be 1..8, got {world}")
    ctx = _context()
    store = None
    # This process's environment now, less any launcher's (the server's is older).
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    if launch_env:
        # The agent's store: every rank connects to it as a client.
        store = TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
        env |= {
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }
        if "GLOO_SOCKET_IFNAME" not in os.environ:
            env["GLOO_SOCKET_IFNAME"] = "lo"
    # CPU/gloo jobs: on a GPU machine, realize() must not pick NCCL for them.
    env["CUDA_VISIBLE_DEVICES"] = ""
    tmp_path.mkdir(parents=True, exist_ok=True)
    outs = [str(tmp_path / f"rank{r}.pkl") for r in range(world)]
    procs = []
    start = time.monotonic()
    for rank in range(world):
        rank_env = dict(env)
        if launch_env:
            rank_env["RANK"] = rank_env["LOCAL_RANK"] = str(rank)
        proc = ctx.Process(
            target=_worker,
            args=(fn, rank, world, rank_env, outs[rank], args, linger),
            daemon=True,
        )
        proc.start()
        procs.append(proc)
    deadline = start + timeout
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    hung = [p.is_alive() for p in procs]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(10)
    elapsed = time.monotonic() - start
    del store
    outcomes = []
    for rank, (proc, path) in enumerate(zip(procs, outs, strict=True)):
        if os.path.exists(path):
            with open(path, "rb") as f:
                report: dict[str, Any] = pickle.load(f)
            outcomes.append(
                Outcome(
                    rank=rank,
                    value=report.get("value"),
                    error=report.get("error"),
                    error_mro=report.get("error_mro", ()),
                    message=report.get("message", ""),
                    traceback=report.get("traceback", ""),
                    exitcode=proc.exitcode,
                )
            )
        else:
            outcomes.append(
                Outcome(
                    rank=rank,
                    error=None if hung[rank] else "NoReport",
                    message="" if hung[rank] else f"exit code {proc.exitcode}",
                    hung=hung[rank],
                    exitcode=proc.exitcode,
                )
            )
    return Job(outcomes=tuple(outcomes), elapsed=elapsed)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first found, then theirs), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        found = children.get(todo.pop(), [])
        out += found
        todo += found
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it, in sessions of their own too
    (torchrun starts its ranks in sessions of their own: killing its process group
    leaves them running)."""
    for p in [pid, *_descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def run_command(
    cmd: Sequence[str], cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run a launcher command (torchrun, an example's own launcher) and its ranks;
    (the completed process, seconds). Past ``timeout`` every process of it is killed
    (its own session) and the test fails with what it printed. ``env``: the whole
    environment (default: this process's)."""
    import pytest

    start = time.monotonic()
    with subprocess.Popen(
        list(cmd),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    ) as child:
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(child.pid)
            out, err = child.communicate()
            pytest.fail(f"{' '.join(cmd)} ran past {timeout}s:\n{out}{err}")
    proc = subprocess.CompletedProcess(list(cmd), child.returncode, out, err)
    return proc, time.monotonic() - start


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m fmesh ARGS`` from the repository root, this checkout's fmesh first
    on the path, no CUDA device; the completed process (never raises on its status)."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [sys.executable, "-m", "fmesh", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def threaded_world(rank_main: Callable[[int], Any], world: int = 4) -> dict[int, Any]:
    """``rank_main(rank)`` on ``world`` threads of this process, each a rank of torch's
    threaded world (what torch's MultiThreadedTestCase sets up; typed loosely: testing
    internals); each rank's result, or its error's repr."""
    import importlib
    import threading

    import torch.distributed as dist

    c10d: Any = importlib.import_module("torch._C._distributed_c10d")
    threaded: Any = importlib.import_module(
        "torch.testing._internal.distributed.multi_threaded_pg"
    )
    c10d._set_thread_isolation_mode(True)
    threaded._install_threaded_pg()
    store = c10d.HashStore()
    results: dict[int, Any] = {}

    def run(rank: int) -> None:
        try:
            dist.init_process_group("threaded", rank=rank, world_size=world, store=store)
            results[rank] = rank_main(rank)
        except BaseException as err:  # reported to the test
            results[rank] = repr(err)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results
