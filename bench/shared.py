"""What every benchmark module shares: mesh shapes, rows, timing, formatting.

Nothing here imports torch at module level: the orchestrating process stays light and
each measurement imports what it needs in its own fresh process.
"""

from __future__ import annotations

import contextlib
import gc
import math
import sys
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Json = dict[str, Any]
TIMES = "\N{MULTIPLICATION SIGN}"

NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""The dense 5-d trainer mesh every benchmark uses."""

FLATTENS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("dp_replicate", "dp_shard"), "dp"),
    (("dp_shard", "cp"), "dp_shard_cp"),
    (("dp_replicate", "dp_shard", "cp"), "dp_cp"),
)
"""The three flattens a trainer makes of the dense mesh (data, FSDP, loss)."""

SHAPES: dict[int, tuple[int, int, int, int, int]] = {
    2**6: (2, 2, 2, 2, 4),
    2**8: (2, 2, 4, 2, 8),
    2**10: (2, 2, 8, 4, 8),
    2**14: (4, 4, 16, 4, 16),
    2**17: (4, 8, 32, 4, 32),
    2**20: (8, 8, 64, 8, 32),
}
"""pp x dp_replicate x dp_shard x cp x tp for every world size the modes use."""
if any(math.prod(shape) != world for world, shape in SHAPES.items()):
    raise AssertionError("every SHAPES entry must multiply to its world size")

EXPERT_NAMES = ("pp", "dp_replicate", "efsdp", "ep", "etp")
"""torchtitan's expert (MoE) view of the same world."""


def expert_shape(shape: Sequence[int]) -> tuple[int, int, int, int, int]:
    """The expert view of a dense 5-d ``shape``: etp = tp, ep = 2 cp, efsdp the rest.

    torchtitan's rule with etp == tp: ep borrows all of cp and part of dp_shard,
    efsdp = dp_shard * cp / ep (ep = cp when dp_shard is 1).
    """
    pp, dp_replicate, dp_shard, cp, tp = shape
    ep = 2 * cp if dp_shard % 2 == 0 else cp
    return (pp, dp_replicate, dp_shard * cp // ep, ep, tp)


TRAINER_FLATTENS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("dp_replicate", "dp_shard"), "batch"),
    (("dp_replicate", "dp_shard", "cp"), "loss"),
    (("dp_shard", "cp"), "fsdp"),
)
"""torchtitan's flattens of the dense view (its ``dp``, ``dp_cp``, ``dp_shard_cp``)."""


# -- rows ---------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the table: both figures, their ratio, and a note."""

    key: str
    """Stable id of the benchmark, the same at every size (e.g. ``pure.slice2``)."""
    section: str
    bench: str
    world: str
    """Size label shown in the table (``2^17``, ``8 (1x2x2x1x2)``)."""
    ranks: int
    unit: str  # "s", "B" or "count"
    fmesh: float | None
    torch: float | None
    note: str = ""
    skipped: str | None = None
    """Why the torch figure is missing, when it was skipped."""
    resolution: float = 0.0
    """Differences below this are noise (e.g. RSS pages)."""
    every_size: bool = False
    """Show this benchmark at every size in the README (not only the largest)."""
    ratio: float | None = None

    def __post_init__(self) -> None:
        if self.fmesh is not None and self.torch is not None and self.fmesh > 0:
            self.ratio = self.torch / self.fmesh


def world_str(world: int) -> str:
    exp = world.bit_length() - 1
    return f"2^{exp}" if world == 1 << exp and world >= 64 else str(world)


def shape_str(shape: Sequence[object]) -> str:
    return TIMES.join(map(str, shape))


# -- formatting -----------------------------------------------------------------------------


def fmt_seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.3g} µs"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s"


def fmt_bytes(b: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def fmt_count(n: float) -> str:
    return f"{n:,.0f}" if n == int(n) else f"{n:,.3g}"


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "s":
        return fmt_seconds(value)
    if unit == "B":
        return fmt_bytes(value)
    return fmt_count(value)


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "—"
    if ratio >= 100:
        return f"{ratio:,.0f}{TIMES}"
    return f"{ratio:.3g}{TIMES}"


# -- timing ---------------------------------------------------------------------------------


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


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    """(seconds, result) of one call."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


# -- memory ---------------------------------------------------------------------------------


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


# -- what a run does --------------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    """How much to run: sizes, repeats and time limits."""

    name: str
    worlds: tuple[int, ...]
    """World sizes of the pure ops and of the fake-backend realize rows."""
    pure_repeats: int
    pure_target_s: float
    """Length of one timed batch of a pure op."""
    realize_repeats: int
    """Fresh processes per fake-backend realize measurement (median taken)."""
    titan_world: int
    """World size of torchtitan's trainer meshes and of the to_device_mesh rows."""
    titan_repeats: int
    """Fresh processes per measurement at ``titan_world`` (torch's take seconds)."""
    gloo: tuple[tuple[tuple[int, int, int, int, int], int], ...]
    """(5-d shape, repeats) of each real-gloo job."""
    memory_world: int
    hit_rounds: int
    """Rounds of the memo-hit workload (each of its calls once per round)."""
    hit_budget_s: float
    """Time after which torch's side of the hit workload stops adding rounds."""
    store_ranks: tuple[int, ...]
    """Simulated ranks of each store-load measurement."""
    store_calls: int
    """Creating calls per store-load phase (each rank makes them back to back)."""
    store_repeats: int
    torch_limit_s: float = 60.0
    """Skip a torch measurement estimated to take longer than this."""


@dataclass
class Bench:
    """The rows a run has produced so far, and the raw measurements behind them."""

    mode: Mode
    log: Callable[[str], None]
    rows: list[Row] = field(default_factory=list)
    raw: Json = field(default_factory=dict)

    def add(self, row: Row) -> None:
        self.rows.append(row)
