"""Benchmark fmesh against torch's ``DeviceMesh``; print and save one table.

Run from the repository root::

    python bench/run.py            # full: 2**10 .. 2**20 ranks, gloo 4 and 8 ranks
    python bench/run.py --quick    # 2**10 .. 2**17, fewer repeats (well under a minute)
    python bench/run.py --smoke    # tiny sizes, every code path once (seconds)

Results go to ``bench/results.json`` (``--out`` to change) and the Markdown table
beside it (same name, ``.md``). Every figure is fmesh vs torch; ratio = torch / fmesh,
so a ratio above 1 means fmesh is faster or smaller.

* **pure ops** on a 5-d ``pp x dp_replicate x dp_shard x cp x tp`` mesh: construct,
  slice, flatten, unflatten, coordinate. fmesh needs no process group; torch's mesh is
  built once per world size on the ``fake`` backend and only the op is timed: median
  of several batches, fmesh's and torch's interleaved, collector off in a batch (as
  timeit does). torch's ``_flatten`` caches by name and creates process groups, so
  every call gets a fresh name and the figure includes its group creation.
* **realize** of that mesh plus the trainer's three flattens (``dp``,
  ``dp_shard_cp``, ``dp_cp``) on the ``fake`` backend, one fresh process per
  measurement (process groups are process-global): wall time, groups the rank holds,
  group-creation calls, peak RSS growth. Baseline: ``init_device_mesh`` + ``_flatten``.
* **realize on real gloo** processes (4 and 8 ranks): wall time (max over ranks) and
  groups per rank.
* **memory** of one mesh value (pickle, deep size, tracemalloc of constructing it) and
  of a realized mesh (tracemalloc).

Every measurement runs in a fresh process forked from a server that has imported
torch once, so a measurement does not pay (or time) a torch import.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib.metadata
import itertools
import json
import math
import multiprocessing
import multiprocessing.context
import multiprocessing.process
import os
import pickle
import platform
import statistics
import sys
import time
import traceback
import tracemalloc
import types
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

HERE = Path(__file__).resolve().parent
NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
FLATTENS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("dp_replicate", "dp_shard"), "dp"),
    (("dp_shard", "cp"), "dp_shard_cp"),
    (("dp_replicate", "dp_shard", "cp"), "dp_cp"),
)
# pp x dp_replicate x dp_shard x cp x tp for every world size the modes use.
SHAPES: dict[int, tuple[int, int, int, int, int]] = {
    2**6: (2, 2, 2, 2, 4),
    2**8: (2, 2, 4, 2, 8),
    2**10: (2, 2, 8, 4, 8),
    2**14: (4, 4, 16, 4, 16),
    2**17: (4, 8, 32, 4, 32),
    2**20: (8, 8, 64, 8, 32),
}
if any(math.prod(shape) != world for world, shape in SHAPES.items()):
    raise AssertionError("every SHAPES entry must multiply to its world size")
Json = dict[str, Any]


@dataclass(frozen=True)
class Mode:
    """How much to run: sizes, repeats and time limits."""

    name: str
    worlds: tuple[int, ...]
    pure_repeats: int
    pure_target_s: float  # length of one timed batch of a pure op
    realize_repeats: int
    gloo: tuple[tuple[int, int, int, int, int], ...]  # 5-d shapes of real gloo jobs
    gloo_repeats: int
    memory_world: int
    torch_limit_s: float = 60.0  # skip a torch measurement estimated to take longer


MODES = {
    "full": Mode(
        "full",
        (2**10, 2**14, 2**17, 2**20),
        9,
        0.03,
        5,
        ((1, 1, 2, 1, 2), (1, 2, 2, 1, 2), (2, 2, 2, 1, 1)),
        7,
        2**20,
    ),
    "quick": Mode(
        "quick",
        (2**10, 2**14, 2**17),
        3,
        0.02,
        1,
        ((1, 1, 2, 1, 2),),
        1,
        2**14,
    ),
    "smoke": Mode("smoke", (2**6, 2**8), 2, 0.002, 1, ((1, 1, 2, 1, 1),), 1, 2**8),
}


# -- small helpers ---------------------------------------------------------------------


TIMES = "\N{MULTIPLICATION SIGN}"


def shape_str(shape: Sequence[object]) -> str:
    return TIMES.join(map(str, shape))


def world_str(world: int) -> str:
    exp = world.bit_length() - 1
    return f"2^{exp}" if world == 1 << exp and world >= 64 else str(world)


def fmt_seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.3g} µs"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s"


def fmt_bytes(b: float) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "s":
        return fmt_seconds(value)
    if unit == "B":
        return fmt_bytes(value)
    return f"{value:g}"


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "—"
    if ratio >= 100:
        return f"{ratio:,.0f}{TIMES}"
    return f"{ratio:.3g}{TIMES}"


def rss_kib() -> tuple[int, int]:
    """(current RSS, peak RSS since the last reset) of this process, in KiB."""
    rss = hwm = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return rss, hwm


def reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS mark of this process (Linux ``clear_refs``)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def deep_size(root: object) -> int:
    """Bytes reachable from ``root``: ``sys.getsizeof`` of every object, once each.

    Follows containers, ``__dict__`` and ``__slots__``; counts a torch tensor's
    storage once (``getsizeof`` of a tensor does not include it); skips classes,
    modules and functions, which belong to the program rather than to the value.
    """
    torch_mod = sys.modules.get("torch")
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
    seen: set[int] = set()
    storages: set[int] = set()
    total = 0
    stack: list[object] = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if torch_mod is not None and isinstance(obj, torch_mod.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in storages:
                storages.add(storage.data_ptr())
                total += storage.nbytes()
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, tuple | list | set | frozenset):
            stack.extend(obj)
        elif isinstance(obj, str | bytes | int | float | bool):
            continue
        else:
            stack.extend(getattr(obj, "__dict__", {}).values())
            for cls in type(obj).__mro__:
                for slot in getattr(cls, "__slots__", ()):
                    if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                        stack.append(getattr(obj, slot))
    return total


# -- workers (each runs in its own subprocess) --------------------------------------------


def torch_mesh_without_groups(
    world: int, shape: tuple[int, ...], names: tuple[str, ...]
) -> DeviceMesh:
    """torch's DeviceMesh over ranks 0..world-1 with no process groups.

    This is what ``init_device_mesh`` builds before it creates groups (private
    constructor arguments, as ``init_device_mesh`` itself uses them).
    """
    import torch
    from torch.distributed._mesh_layout import _MeshLayout
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh(
        "cpu",
        _layout=_MeshLayout.from_sizes_strides(shape),
        _rank_map=torch.arange(world, dtype=torch.int),
        mesh_dim_names=names,
        _init_backend=False,
    )


def init_fake(world: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


def preload_lazy_imports() -> None:
    """Import what torch's mesh code and fmesh's realize import on first use.

    A worker measures one cold call; these imports are one-time program costs, not
    part of building a mesh.
    """
    import torch.distributed.device_mesh
    import torch.fx.experimental.proxy_tensor  # noqa: F401

    import fmesh._realize  # noqa: F401


def time_batch(fn: Callable[[], object], n: int) -> float:
    """Seconds per call over ``n`` calls, timeit-style: collector off in the batch.

    A full collection first, so neither library pays for the other's garbage (torch's
    meshes at 2**20 ranks leave million-element tuples for the collector to scan).
    """
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n
    finally:
        gc.enable()


def calibrate(fn: Callable[[], object], target_s: float, max_n: int) -> int:
    """Calls per batch so that a batch lasts about ``target_s`` (after a warm-up)."""
    fn()
    n = 1
    while True:
        per_call = time_batch(fn, n)
        if per_call * n >= target_s / 2 or n >= max_n:
            return n
        n = min(max_n, max(2 * n, math.ceil(target_s / max(per_call, 1e-9))))


def worker_pure(spec: Json) -> Json:
    """Median time of each pure op, fmesh and torch batches interleaved."""
    import fmesh

    world: int = spec["world"]
    shape = tuple(spec["shape"])
    repeats: int = spec["repeats"]
    target: float = spec["target_s"]
    sizes = dict(zip(NAMES, shape, strict=True))
    fm = fmesh.make_mesh(sizes)
    fworld = fmesh.make_mesh({"world": world})

    from torch.distributed.device_mesh import init_device_mesh

    init_fake(world)
    preload_lazy_imports()
    start = time.perf_counter()
    dm = init_device_mesh("cpu", shape, mesh_dim_names=NAMES)
    build_s = time.perf_counter() - start
    dm_dp = dm["dp_replicate", "dp_shard"]
    dm_world = torch_mesh_without_groups(world, (world,), ("world",))
    fresh = itertools.count()

    def torch_construct() -> object:
        return torch_mesh_without_groups(world, shape, NAMES)

    ops: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
        ("construct", lambda: fmesh.make_mesh(sizes), torch_construct),
        ("slice1", lambda: fmesh.slice(fm, "tp"), lambda: dm["tp"]),
        (
            "slice2",
            lambda: fmesh.slice(fm, "dp_shard", "tp"),
            lambda: dm["dp_shard", "tp"],
        ),
        (
            "unflatten",
            lambda: fmesh.unflatten(fworld, "world", sizes),
            lambda: dm_world._unflatten(0, shape, NAMES),
        ),
        (
            "coordinate",
            lambda: fmesh.coordinate(fm, 0),
            lambda: dm._compute_coordinate_on_dim(),
        ),
        ("coordinate_cached", lambda: fmesh.coordinate(fm, 0), dm.get_coordinate),
        (
            "flatten",
            lambda: fmesh.flatten(fm, ("dp_replicate", "dp_shard"), "dp"),
            lambda: dm_dp._flatten(f"dp_b{next(fresh)}"),
        ),
    ]
    # Every torch flatten adds an entry to the root mesh's flatten mapping, which
    # torch's slicing then scans: drop them after each batch (untimed).
    cleanup = {"flatten": dm._flatten_mapping.clear}
    out: Json = {"torch_build_s": build_s, "ops": {}}
    # What exists now lives to the end: keep it out of the per-batch collections.
    gc.collect()
    gc.freeze()
    # A torch flatten creates groups: bound its batch so repeats stay few.
    counts = {
        name: (
            calibrate(f_fn, target, 100_000),
            calibrate(t_fn, target, 50 if name == "flatten" else 10_000),
        )
        for name, f_fn, t_fn in ops
    }
    for clear in cleanup.values():
        clear()
    batches: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n, _, _ in ops}
    # Round robin over the ops, so a burst of load from elsewhere on the machine
    # spoils one batch of every op rather than every batch of one op.
    for _ in range(repeats):
        for name, f_fn, t_fn in ops:
            n_f, n_t = counts[name]
            batches[name][0].append(time_batch(f_fn, n_f))
            batches[name][1].append(time_batch(t_fn, n_t))
            if name in cleanup:
                cleanup[name]()
    for name, (f_times, t_times) in batches.items():
        out["ops"][name] = {
            "fmesh": statistics.median(f_times),
            "torch": statistics.median(t_times),
            "fmesh_n": counts[name][0],
            "torch_n": counts[name][1],
            "fmesh_batches": f_times,
            "torch_batches": t_times,
        }
    return out


def realize_fmesh(shape: Sequence[int]) -> object:
    import fmesh

    mesh = fmesh.make_mesh(dict(zip(NAMES, shape, strict=True)))
    realized = [fmesh.realize(mesh)]
    for axes, name in FLATTENS:
        flat = fmesh.slice(fmesh.flatten(mesh, axes, name), name)
        realized.append(fmesh.realize(flat))
    return realized


def realize_torch(shape: Sequence[int]) -> object:
    from torch.distributed.device_mesh import init_device_mesh

    dm = init_device_mesh("cpu", tuple(shape), mesh_dim_names=NAMES)
    flats = [dm[axes]._flatten(name) for axes, name in FLATTENS]
    return dm, flats


def group_counters(impl: str) -> tuple[int, int]:
    """(groups registered in this process, group-creation calls so far).

    torch counts every ``new_group`` call (members or not) in ``group_count``; fmesh
    creates groups with c10d's constructor, not ``new_group``, and counts them.
    """
    from torch.distributed import distributed_c10d as c10d

    import fmesh

    calls = fmesh.cache_stats().created if impl == "fmesh" else c10d._world.group_count
    return len(c10d._world.pg_names), calls


def warm_up(fn: Callable[[Sequence[int]], object]) -> None:
    """Run ``fn`` once on a small fake world, then tear everything down.

    What the measured call then does not pay: first-use imports and allocations, and
    the page faults of library code that runs for the first time. Both libraries get
    the same treatment; neither keeps a mesh or group cache across the teardown.
    """
    import torch.distributed as dist

    import fmesh

    init_fake(64)
    keep = fn(SHAPES[64])
    del keep
    fmesh.destroy()
    dist.destroy_process_group()


def worker_realize(spec: Json) -> Json:
    """One realize (or its torch baseline) on the fake backend, in this process."""
    impl: str = spec["impl"]
    shape: list[int] = spec["shape"]
    fn = realize_fmesh if impl == "fmesh" else realize_torch
    warm_up(fn)
    init_fake(spec["world"])
    groups0, calls0 = group_counters(impl)
    trace: bool = spec["trace"]
    if trace:
        tracemalloc.start()
    reset_peak_rss()
    rss0, _ = rss_kib()
    traced0 = tracemalloc.get_traced_memory()[0] if trace else 0
    start = time.perf_counter()
    keep = fn(shape)
    seconds = time.perf_counter() - start
    rss1, peak = rss_kib()
    groups1, calls1 = group_counters(impl)
    out: Json = {
        "seconds": seconds,
        "groups": groups1 - groups0,
        "calls": calls1 - calls0,
        "rss_peak_delta": (peak - rss0) * 1024,
        "rss_delta": (rss1 - rss0) * 1024,
    }
    if trace:
        current, traced_peak = tracemalloc.get_traced_memory()
        out["traced_retained"] = current - traced0
        out["traced_peak"] = traced_peak - traced0
    del keep
    return out


def time_mesh_check() -> list[float]:
    """Accumulate the time fmesh spends in its cross-rank mesh check (instrumentation).

    Wraps the private ``fmesh._realize._handshake`` when it exists; the returned
    one-element list holds the running total in seconds.
    """
    import fmesh._realize as realize_mod

    total = [0.0]
    inner = getattr(realize_mod, "_handshake", None)
    if inner is None:
        return total

    def timed(*args: object, **kwargs: object) -> object:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - start

    setattr(realize_mod, "_handshake", timed)  # noqa: B010 - a private name, on purpose
    return total


def worker_gloo_rank(spec: Json) -> Json:
    """One rank of a real gloo job: realize the mesh, report time and groups."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import TCPStore

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=spec["timeout_s"])
    store = TCPStore("127.0.0.1", spec["port"], world, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    preload_lazy_imports()
    fn = realize_fmesh if spec["impl"] == "fmesh" else realize_torch
    check_s = time_mesh_check() if spec["impl"] == "fmesh" else [0.0]
    dist.barrier()
    groups0, calls0 = group_counters(spec["impl"])
    start = time.perf_counter()
    keep = fn(spec["shape"])
    seconds = time.perf_counter() - start
    groups1, calls1 = group_counters(spec["impl"])
    out: Json = {
        "rank": rank,
        "seconds": seconds,
        "groups": groups1 - groups0,
        "calls": calls1 - calls0,
        "check_s": check_s[0],
    }
    dist.barrier()
    del keep
    return out


def worker_memory(spec: Json) -> Json:
    """Size of one mesh value (no groups), fmesh and torch, at one world size."""
    import fmesh

    world: int = spec["world"]
    shape = tuple(spec["shape"])
    sizes = dict(zip(NAMES, shape, strict=True))

    init_fake(world)

    def torch_mesh() -> object:
        return torch_mesh_without_groups(world, shape, NAMES)

    def fmesh_mesh() -> object:
        return fmesh.make_mesh(sizes)

    out: Json = {}
    for impl, make in (("fmesh", fmesh_mesh), ("torch", torch_mesh)):
        make()  # warm-up: first-use imports and caches
        tracemalloc.start()
        value = make()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out[impl] = {
            "pickle": len(pickle.dumps(value)),
            "deep": deep_size(value),
            "construct_peak": peak,
        }
    return out


WORKERS: dict[str, Callable[[Json], Json]] = {
    "pure": worker_pure,
    "realize": worker_realize,
    "gloo-rank": worker_gloo_rank,
    "memory": worker_memory,
}


# -- orchestration ----------------------------------------------------------------------


class WorkerError(RuntimeError):
    pass


class WorkerTimeout(WorkerError):
    pass


# Fresh processes are forked from a server that has imported these once, so each
# measurement starts with clean process-global state (no process group) without
# paying a torch import.
PRELOAD = [
    "numpy",
    "torch",
    "torch.distributed",
    "torch.distributed.device_mesh",
    "torch.fx.experimental.proxy_tensor",
    "torch.testing._internal.distributed.fake_pg",
    "fmesh",
    "fmesh._realize",
]
_ctx: multiprocessing.context.ForkServerContext | None = None


def context() -> multiprocessing.context.ForkServerContext:
    global _ctx
    if _ctx is None:
        _ctx = multiprocessing.get_context("forkserver")
        _ctx.set_forkserver_preload(PRELOAD)
    return _ctx


def _child(kind: str, spec: Json, env: dict[str, str], conn: Connection) -> None:
    os.environ.update(env)
    try:
        conn.send(("ok", WORKERS[kind](spec)))
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


def start(kind: str, spec: Json, env: dict[str, str] | None = None) -> Started:
    ctx = context()
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(kind, spec, env or {}, send), daemon=True)
    proc.start()
    send.close()
    return Started(f"worker {kind} {spec}", proc, recv)


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


def run_worker(kind: str, spec: Json, timeout_s: float) -> Json:
    """Run one measurement in a fresh process; raise WorkerTimeout past ``timeout_s``."""
    return finish(start(kind, spec), time.monotonic() + timeout_s)


def run_gloo_job(impl: str, shape: Sequence[int], timeout_s: float) -> list[Json]:
    """One fresh process per rank, on a store this process hosts; every rank's result."""
    from torch._C._distributed_c10d import TCPStore

    world = math.prod(shape)
    # Port 0: the OS picks a free port; the store listens before any rank starts.
    store = TCPStore(
        "127.0.0.1",
        0,
        world,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    spec = {"impl": impl, "shape": list(shape), "port": store.port, "timeout_s": timeout_s}
    env = {
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port),
    }
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        env["GLOO_SOCKET_IFNAME"] = "lo"
    ranks = [
        start("gloo-rank", spec, {**env, "RANK": str(r), "LOCAL_RANK": str(r)})
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


@dataclass
class Row:
    """One line of the table: both figures, their ratio, and a note."""

    section: str
    bench: str
    world: str
    unit: str  # "s", "B" or "count"
    fmesh: float | None
    torch: float | None
    ratio: float | None = None
    note: str = ""
    skipped: str | None = None  # why the torch figure is missing
    resolution: float = 0.0  # differences below this are noise (e.g. RSS pages)

    def __post_init__(self) -> None:
        if self.fmesh is not None and self.torch is not None and self.fmesh > 0:
            self.ratio = self.torch / self.fmesh


@dataclass
class Bench:
    mode: Mode
    log: Callable[[str], None]
    rows: list[Row] = field(default_factory=list)
    raw: Json = field(default_factory=dict)

    def add(self, row: Row) -> None:
        self.rows.append(row)


PURE_LABELS = {
    "construct": (
        "construct the 5-d mesh (no groups)",
        "torch: DeviceMesh(_init_backend=False), what init_device_mesh does "
        "before creating groups",
    ),
    "slice1": ("slice `tp`", "torch: dm['tp']"),
    "slice2": ("slice `dp_shard`, `tp`", "torch: dm['dp_shard', 'tp']"),
    "flatten": (
        "flatten `dp_replicate`, `dp_shard`",
        "torch: first _flatten under a fresh name, which creates its groups "
        "(fake backend); fmesh is pure",
    ),
    "unflatten": (
        "unflatten `world` into the 5 axes",
        "torch: _unflatten of a 1-d mesh without groups (its best case; with "
        "groups it also creates them)",
    ),
    "coordinate": (
        "coordinate of a rank",
        "torch: _compute_coordinate_on_dim, the O(world) search every "
        "DeviceMesh construction and slice runs",
    ),
    "coordinate_cached": (
        "coordinate of a rank, torch cached",
        "torch: get_coordinate() returns the tuple cached at construction",
    ),
}
PURE_ORDER = (
    "construct",
    "slice1",
    "slice2",
    "flatten",
    "unflatten",
    "coordinate",
    "coordinate_cached",
)


def bench_pure(b: Bench) -> None:
    results: dict[int, Json] = {}
    for world in b.mode.worlds:
        b.log(f"pure ops at {world_str(world)} ranks ...")
        results[world] = run_worker(
            "pure",
            {
                "world": world,
                "shape": list(SHAPES[world]),
                "repeats": b.mode.pure_repeats,
                "target_s": b.mode.pure_target_s,
            },
            timeout_s=600,
        )
    b.raw["pure"] = {str(w): r for w, r in results.items()}
    for op in PURE_ORDER:
        label, note = PURE_LABELS[op]
        for world, res in results.items():
            t = res["ops"][op]
            b.add(
                Row(
                    "pure ops", label, world_str(world), "s", t["fmesh"], t["torch"], note=note
                )
            )


def estimate(points: list[tuple[int, float]], world: int) -> float:
    """Extrapolate a torch time to ``world`` from smaller sizes (at least linear)."""
    (w1, t1) = points[-1]
    exponent = 1.0
    if len(points) >= 2:
        (w0, t0) = points[-2]
        if t0 > 0 and t1 > 0 and w1 > w0:
            exponent = max(1.0, math.log(t1 / t0) / math.log(w1 / w0))
    return float(t1 * (world / w1) ** exponent)


def realize_runs(
    b: Bench, impl: str, world: int, repeats: int, trace: bool, timeout_s: float
) -> list[Json]:
    spec = {"impl": impl, "world": world, "shape": list(SHAPES[world]), "trace": trace}
    return [run_worker("realize", spec, timeout_s) for _ in range(repeats)]


def bench_realize(b: Bench) -> None:
    limit = b.mode.torch_limit_s
    torch_points: list[tuple[int, float]] = []
    raw: Json = {}
    for world in b.mode.worlds:
        b.log(f"realize on fake at {world_str(world)} ranks ...")
        f_runs = realize_runs(b, "fmesh", world, b.mode.realize_repeats, False, 300)
        t_runs: list[Json] = []
        skipped: str | None = None
        if torch_points and (est := estimate(torch_points, world)) > limit:
            skipped = f"skipped (>{limit:.0f} s est.: {est:.0f} s)"
        else:
            try:
                t_runs = realize_runs(
                    b, "torch", world, b.mode.realize_repeats, False, limit + 30
                )
            except WorkerTimeout:
                skipped = f"skipped (ran past {limit + 30:.0f} s)"
        raw[str(world)] = {"fmesh": f_runs, "torch": t_runs, "skipped": skipped}
        if t_runs:
            torch_points.append((world, statistics.median(r["seconds"] for r in t_runs)))
        w = world_str(world)

        def med(runs: list[Json], key: str) -> float | None:
            return statistics.median(r[key] for r in runs) if runs else None

        def row(
            bench: str,
            unit: str,
            key: str,
            note: str,
            resolution: float = 0.0,
            w: str = w,
            t_runs: list[Json] = t_runs,
            f_runs: list[Json] = f_runs,
            skipped: str | None = skipped,
        ) -> Row:
            return Row(
                "realize (fake)",
                bench,
                w,
                unit,
                med(f_runs, key),
                med(t_runs, key),
                note=skipped or note,
                skipped=skipped,
                resolution=resolution,
            )

        b.add(
            row(
                "realize + 3 flattens: wall time",
                "s",
                "seconds",
                "torch: init_device_mesh + 3 _flatten calls",
            )
        )
        b.add(
            row(
                "groups the rank holds",
                "count",
                "groups",
                "both: one group per axis and flatten, 8 distinct layouts; torch "
                "only registers the groups it is in",
            )
        )
        b.add(
            row(
                "group-creation calls by the rank",
                "count",
                "calls",
                "torch: new_group calls (every subgroup of the world); fmesh: "
                "groups it created",
            )
        )
        b.add(
            row(
                "peak RSS growth during realize",
                "B",
                "rss_peak_delta",
                "fresh process, kernel peak-RSS mark reset before; counts C++ allocations too",
                resolution=2**20,
            )
        )
    b.raw["realize"] = raw
    # Reorder: each metric across world sizes, like the pure ops.
    realize_rows = [r for r in b.rows if r.section == "realize (fake)"]
    others = [r for r in b.rows if r.section != "realize (fake)"]
    order = list(dict.fromkeys(r.bench for r in realize_rows))
    b.rows = others + sorted(realize_rows, key=lambda r: order.index(r.bench))


def bench_gloo(b: Bench) -> None:
    raw: Json = {}
    for shape in b.mode.gloo:
        world = math.prod(shape)
        runs: dict[str, list[list[Json]]] = {"fmesh": [], "torch": []}
        b.log(f"gloo, {world} ranks, {shape_str(shape)} ...")
        for _ in range(b.mode.gloo_repeats):
            for impl in ("fmesh", "torch"):  # interleaved: the machine's load drifts
                runs[impl].append(run_gloo_job(impl, shape, timeout_s=180))
        raw[shape_str(shape)] = runs
        w = f"{world} ({shape_str(shape)})"
        wall = {
            i: statistics.median(max(r["seconds"] for r in job) for job in jobs)
            for i, jobs in runs.items()
        }
        check = statistics.median(max(r["check_s"] for r in job) for job in runs["fmesh"])
        groups = {i: max(r["groups"] for job in jobs for r in job) for i, jobs in runs.items()}
        b.add(
            Row(
                "realize (gloo)",
                "realize + 3 flattens: wall time, max over ranks",
                w,
                "s",
                wall["fmesh"],
                wall["torch"],
                note="real gloo processes; torch: init_device_mesh('cpu') + 3 "
                f"_flatten calls; fmesh's cross-rank mesh check took {fmt_seconds(check)} "
                "of its time (slowest rank)",
            )
        )
        b.add(
            Row(
                "realize (gloo)",
                "groups per rank",
                w,
                "count",
                groups["fmesh"],
                groups["torch"],
                note="fmesh reuses one group for axes with the same members",
            )
        )
    b.raw["gloo"] = raw


def bench_memory(b: Bench) -> None:
    world = b.mode.memory_world
    w = world_str(world)
    b.log(f"memory at {w} ranks ...")
    res = run_worker("memory", {"world": world, "shape": list(SHAPES[world])}, 300)
    f_tr = realize_runs(b, "fmesh", world, 1, True, 300)[0]
    t_tr: Json | None = None
    skipped: str | None = None
    limit = b.mode.torch_limit_s * 3  # tracemalloc slows Python code down
    try:
        t_tr = realize_runs(b, "torch", world, 1, True, limit + 30)[0]
    except WorkerTimeout:
        skipped = f"skipped (ran past {limit + 30:.0f} s)"
    b.raw["memory"] = {"value": res, "realized_fmesh": f_tr, "realized_torch": t_tr}
    sec = "memory"
    for key, label, note in (
        ("pickle", "pickle size", "torch: DeviceMesh without groups"),
        ("deep", "deep size", "sys.getsizeof over reachable objects (+ tensor storage)"),
        (
            "construct_peak",
            "tracemalloc peak while constructing",
            "Python allocations only (torch's tensor storage not seen)",
        ),
    ):
        b.add(
            Row(
                sec,
                f"one mesh value: {label}",
                w,
                "B",
                res["fmesh"][key],
                res["torch"][key],
                note=note,
            )
        )
    for key, label in (("traced_retained", "retained"), ("traced_peak", "peak")):
        b.add(
            Row(
                sec,
                f"realized mesh + 3 flattens: tracemalloc {label}",
                w,
                "B",
                f_tr[key],
                None if t_tr is None else t_tr[key],
                note=skipped
                or "fake backend; torch: init_device_mesh + 3 "
                "_flatten calls; Python allocations only",
                skipped=skipped,
            )
        )


def ahead_note(row: Row) -> str:
    """The row's note, prefixed with a plain verdict where fmesh is not ahead."""
    both = (row.fmesh, row.torch)
    if None not in both and max(v or 0.0 for v in both) < row.resolution:
        return f"**below resolution** ({fmt_value(row.resolution, row.unit)}): {row.note}"
    if row.ratio is None or row.ratio > 1.05:
        return row.note
    if row.ratio >= 0.95:
        verdict = "**par**" if row.unit != "count" or row.ratio != 1 else "**equal**"
    else:
        verdict = "**torch ahead**"
    return f"{verdict}: {row.note}"


def machine_info(mode: Mode) -> Json:
    import fmesh

    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_gib": round(
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1
        ),
        "python": platform.python_version(),
        "torch": importlib.metadata.version("torch"),
        "fmesh": fmesh.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mode": mode.name,
        "loadavg_start": os.getloadavg(),
    }


def markdown(b: Bench, info: Json) -> str:
    shapes = ", ".join(f"{world_str(w)} = {shape_str(SHAPES[w])}" for w in b.mode.worlds)
    caption = (
        f"fmesh {info['fmesh']} vs torch {info['torch']} `DeviceMesh`, "
        f"`bench/run.py{'' if b.mode.name == 'full' else ' --' + b.mode.name}` on "
        f"{info['platform']}, {info['cpus_usable']} CPUs, {info['memory_gib']} GiB, "
        f"Python {info['python']}, {info['date'][:10]} (shared machine: medians of "
        f"repeats; pure ops: batches interleaved, gc off in a batch). "
        f"Ratio = torch / fmesh: above 1, fmesh is faster or smaller. "
        f"Mesh {shape_str(NAMES)}: {shapes}; flattens dp = "
        f"(dp_replicate, dp_shard), dp_shard_cp = (dp_shard, cp), dp_cp = "
        f"(dp_replicate, dp_shard, cp)."
    )
    lines = [
        f"*{caption}*",
        "",
        "| section | benchmark | ranks | fmesh | torch | torch/fmesh | note |",
        "|---|---|---|--:|--:|--:|---|",
    ]
    for r in b.rows:
        lines.append(
            f"| {r.section} | {r.bench} | {r.world} | {fmt_value(r.fmesh, r.unit)} | "
            f"{fmt_value(r.torch, r.unit) if r.skipped is None else r.skipped} | "
            f"{fmt_ratio(r.ratio)} | {ahead_note(r)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--quick",
        action="store_true",
        help="2**10..2**17, fewer repeats (well under a minute)",
    )
    group.add_argument(
        "--smoke", action="store_true", help="tiny sizes, every code path once (seconds)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=HERE / "results.json",
        help="JSON results (default bench/results.json); the Markdown "
        "table goes beside it with the suffix .md",
    )
    args = parser.parse_args(argv)

    mode = MODES["smoke" if args.smoke else "quick" if args.quick else "full"]
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {msg}", file=sys.stderr, flush=True)

    info = machine_info(mode)
    b = Bench(mode, log)
    errors: list[str] = []
    for section in (bench_pure, bench_realize, bench_gloo, bench_memory):
        try:
            section(b)
        except WorkerError as err:  # keep the other sections' results; exit 1
            log(f"{section.__name__} FAILED: {err}")
            errors.append(f"{section.__name__}: {err}")
    b.raw["errors"] = errors
    info["loadavg_end"] = os.getloadavg()
    info["seconds"] = round(time.perf_counter() - started, 1)
    table = markdown(b, info)
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "machine": info,
        "rows": [asdict(r) for r in b.rows],
        "raw": b.raw,
        "shapes": {str(w): SHAPES[w] for w in mode.worlds},
        "gloo_shapes": [list(s) for s in mode.gloo],
    }
    out.write_text(json.dumps(payload, indent=1) + "\n")
    out.with_suffix(".md").write_text(table)
    print(table)
    log(f"done; wrote {out} and {out.with_suffix('.md')}")
    if errors:
        log(f"{len(errors)} section(s) failed; their rows are missing (see 'errors')")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
