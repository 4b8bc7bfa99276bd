"""What every part of the bench shares: mesh shapes, rows, formatting, timing, memory.

Nothing here imports torch: the orchestrating process stays light, and each
measurement imports what it needs in its own fresh process.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import sys
import time
import timeit
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Json = dict[str, Any]
TIMES = "\N{MULTIPLICATION SIGN}"
Flattens = tuple[tuple[tuple[str, ...], str], ...]
NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""The dense 5-d trainer mesh every benchmark uses."""
# fmt: off
FLATTENS: Flattens = ((("dp_replicate", "dp_shard"), "dp"), (("dp_shard", "cp"),
                      "dp_shard_cp"), (("dp_replicate", "dp_shard", "cp"), "dp_cp"))
"""The three flattens a trainer makes of the dense mesh (data, FSDP, loss)."""
TRAINER_FLATTENS: Flattens = ((("dp_replicate", "dp_shard"), "batch"),
                              (("dp_replicate", "dp_shard", "cp"), "loss"),
                              (("dp_shard", "cp"), "fsdp"))
"""torchtitan's flattens of the dense view (its ``dp``, ``dp_cp``, ``dp_shard_cp``)."""
EXPERT_NAMES = ("pp", "dp_replicate", "efsdp", "ep", "etp")
"""torchtitan's expert (MoE) view of the same world."""
SHAPES: dict[int, tuple[int, int, int, int, int]] = {
    2**6: (2, 2, 2, 2, 4), 2**8: (2, 2, 4, 2, 8), 2**10: (2, 2, 8, 4, 8),
    2**14: (4, 4, 16, 4, 16), 2**17: (4, 8, 32, 4, 32), 2**20: (8, 8, 64, 8, 32),
}
# fmt: on
"""pp x dp_replicate x dp_shard x cp x tp for every world size the modes use."""
if any(math.prod(shape) != world for world, shape in SHAPES.items()):
    raise AssertionError("every SHAPES entry must multiply to its world size")


def expert_shape(shape: Sequence[int]) -> tuple[int, int, int, int, int]:
    """The expert view of a dense 5-d ``shape``: etp = tp, ep = 2 cp (cp when dp_shard
    is odd), efsdp the rest (torchtitan's rule with etp == tp)."""
    pp, dp_replicate, dp_shard, cp, tp = shape
    ep = 2 * cp if dp_shard % 2 == 0 else cp
    return (pp, dp_replicate, dp_shard * cp // ep, ep, tp)


@dataclass
class Row:
    """One line of the table: both figures, their ratio, and a note."""

    key: str  # the benchmark's id, the same at every size (e.g. ``pure.slice2``)
    section: str
    bench: str
    world: str  # the size shown (``2^17``, ``8 (1x2x2x1x2)``)
    ranks: int
    unit: str  # "s", "B", "count", "/s" or "x" (a ratio)
    fmesh: float | None
    torch: float | None
    note: str = ""
    skipped: str | None = None  # why the torch figure is missing
    resolution: float = 0.0  # differences below this are noise (e.g. RSS pages)
    every_size: bool = False  # shown on the page at every size, not only the largest
    ratio: float | None = None
    limit: str = ""  # where torch is ahead by design: the floor fmesh's guarantees set

    def __post_init__(self) -> None:
        if self.fmesh is not None and self.torch is not None and self.fmesh > 0:
            self.ratio = self.torch / self.fmesh


@dataclass
class Bench:
    """A run: its mode, its log, the rows so far and the raw measurements behind them."""

    mode: str
    log: Callable[[str], None]
    rows: list[Row] = field(default_factory=list)
    raw: Json = field(default_factory=dict)


def world_str(world: int) -> str:
    exp = world.bit_length() - 1
    return f"2^{exp}" if world == 1 << exp and world >= 64 else str(world)


def shape_str(shape: Sequence[object]) -> str:
    return TIMES.join(map(str, shape))


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "s":
        if value < 1e-3:
            return f"{value * 1e6:.3g} µs"
        return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"
    if unit == "B":
        for name, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if value >= scale:
                return f"{value / scale:.3g} {name}"
        return f"{value:.0f} B"
    if unit == "x":
        return f"{value:.3g}{TIMES}"
    text = f"{value:,.0f}" if value == int(value) or value >= 1000 else f"{value:,.3g}"
    return text + (" /s" if unit == "/s" else "")


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "—"
    return f"{ratio:,.0f}{TIMES}" if ratio >= 100 else f"{ratio:.3g}{TIMES}"


# -- timing and memory ------------------------------------------------------------------


def time_batch(fn: Callable[[], object], n: int) -> float:
    """Seconds per call over ``n`` calls, after a full collection (so neither library
    pays for the other's garbage); timeit keeps the collector off in the batch."""
    gc.collect()
    return timeit.Timer(fn).timeit(n) / n


def calibrate(fn: Callable[[], object], target_s: float, max_n: int) -> int:
    """Calls per batch so that a batch lasts about ``target_s`` (after a warm-up)."""
    fn()
    n = 1
    while True:
        per_call = time_batch(fn, n)
        if per_call * n >= target_s / 2 or n >= max_n:
            return n
        n = min(max_n, max(2 * n, math.ceil(target_s / max(per_call, 1e-9))))


def batches(fn: Callable[[], object], repeats: int, target_s: float, max_n: int) -> float:
    """The median over ``repeats`` calibrated batches of seconds per call."""
    n = calibrate(fn, target_s, max_n)
    return median([time_batch(fn, n) for _ in range(repeats)])


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    """(seconds, result) of one call."""
    start, result = time.perf_counter(), fn()
    return time.perf_counter() - start, result


def rss_kib() -> tuple[int, int]:
    """(current RSS, peak RSS since the last reset) of this process, in KiB."""
    found = {"VmRSS:": 0, "VmHWM:": 0}
    with open("/proc/self/status") as f:
        for line in f:
            if line[:6] in found:
                found[line[:6]] = int(line.split()[1])
    return found["VmRSS:"], found["VmHWM:"]


def reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS mark of this process (Linux ``clear_refs``)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def deep_size(root: object) -> int:
    """Bytes reachable from ``root``: ``sys.getsizeof`` of every object once, a torch
    tensor's storage once; classes, modules and functions belong to the program and
    are skipped."""
    torch_mod = sys.modules.get("torch")
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
    seen: set[int] = set()
    storages: set[int] = set()
    total, stack = 0, [root]
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
        elif isinstance(obj, dict):
            stack.extend([*obj.keys(), *obj.values()])
        elif isinstance(obj, tuple | list | set | frozenset):
            stack.extend(obj)
        elif not isinstance(obj, str | bytes | int | float | bool):
            stack.extend(getattr(obj, "__dict__", {}).values())
            for cls in type(obj).__mro__:
                for slot in getattr(cls, "__slots__", ()):
                    if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                        stack.append(getattr(obj, slot))
    return total
