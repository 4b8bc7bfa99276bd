"""How a case of :mod:`bench.cases` is run and read into rows.

A runner turns each size of a case into *runs* per library: ``{"fmesh": [job, ...],
"torch": [...]}``, a job being a list of rank results (one for a fake-world process).
``fake`` and ``gloo`` cases run, per repeat, a fresh process or a real gloo job per
library, fmesh's and torch's interleaved (the machine's load drifts), after one
counting job per library where a metric counts store requests; ``store`` cases run
:func:`bench.store_load.measure`. A metric reads one figure from every job (over its
ranks: the slowest, the mean, ...) and takes the median over jobs (the least, where a
metric says ``best``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .launch import run_gloo_job, run_worker
from .shared import Bench, Json, Row, median, shape_str, world_str

IMPLS = ("fmesh", "torch")
Runs = dict[str, list[list[Json]]]
PerMode = Mapping[str, int | tuple[int, ...]]


@dataclass(frozen=True)
class Metric:
    """One row of a case at every size: where its figures are, and how it reads."""

    key: str
    read: str  # where a rank's result holds it: "new.seconds" (a phase's), "*.x" (most)
    label: str
    note: str = ""  # "{name}": a string fmesh's worker returned, "same", "n_fmesh", ...
    unit: str = "s"
    ranks: str = "max"  # over a job's ranks: max, mean, sum, rank0, per:<read of a total>
    torch: str | None = None  # where torch's figure is (None: the same place)
    skipped: str | None = None  # torch has no figure: what its column says instead
    counted: bool = False  # from the counting jobs (store requests), not the timed ones
    every_size: bool = False
    resolution: float = 0.0
    best: bool = False  # the least over jobs (noise only adds time), not the median
    limit: str = ""  # the floor fmesh's guarantees set where torch is ahead ({torch}, {fmesh})


@dataclass(frozen=True)
class Case:
    """A worker, the sizes and repeats it runs at in each mode, and its metrics."""

    name: str  # what ``--section`` selects it by
    section: str
    runner: str  # "fake", "gloo" or "store"
    worker: Callable[[Json], Json] | None
    metrics: tuple[Metric, ...]
    sizes: Mapping[str, tuple[Any, ...]]  # per mode: world sizes, or gloo jobs' shapes
    repeats: PerMode = field(default_factory=dict)  # per mode (1 where absent), or size
    torch_repeats: PerMode = field(default_factory=dict)  # where torch runs fewer times
    spec: Json = field(default_factory=dict)  # what the worker is given in every mode
    per_mode: Mapping[str, Json] = field(default_factory=dict)  # and in each mode
    impls: tuple[str, ...] = IMPLS
    both: bool = False  # the worker measures both libraries in one process
    skip_torch: Mapping[str, str] = field(default_factory=dict)  # modes that do, and why
    interleave: bool = False  # the sizes' jobs round by round (rows compared across sizes)
    timeout_s: float = 600.0
    may_die: tuple[int, ...] = ()  # ranks of a gloo job that may die by SIGKILL
    after: Callable[[list[Row]], list[Row]] | None = None  # more rows from the measured

    def plan(self, mode: str) -> list[tuple[Any, int, int]]:
        """(size, repeats, torch's repeats) of each size in ``mode``."""
        sizes = self.sizes[mode]

        def each(per: PerMode, default: int | tuple[int, ...]) -> tuple[int, ...]:
            n = per.get(mode, default)
            return n if isinstance(n, tuple) else (n,) * len(sizes)

        repeats = each(self.repeats, 1)
        return list(zip(sizes, repeats, each(self.torch_repeats, repeats), strict=True))

    def spec_in(self, mode: str) -> Json:
        return {**self.spec, **self.per_mode.get(mode, {})}

    @property
    def raw_key(self) -> str:  # where the raw runs go: its metrics' common key
        return self.metrics[0].key.rpartition(".")[0]


def ranks_of(size: Any) -> int:
    return size if isinstance(size, int) else math.prod(size)


def run_jobs(b: Bench, case: Case, plan: list[tuple[Any, int, int]]) -> list[Json]:
    """Fresh processes or gloo jobs at each (size, repeats, torch's repeats) of ``plan``:
    a counting job per library first (when a metric counts), then the timed ones, the
    libraries interleaved, and the sizes too, round by round: they share the machine's
    slow and fast spells."""
    assert case.worker is not None, case.raw_key
    skipped = case.skip_torch.get(b.mode)
    counting = int(any(m.counted for m in case.metrics))
    out: list[Json] = [{"runs": {i: [] for i in case.impls}, "skipped": skipped} for _ in plan]
    for i in range(counting + max(repeats for _, repeats, _ in plan)):
        for (size, repeats, torch_repeats), got in zip(plan, out, strict=True):
            if i >= counting + repeats:
                continue
            for impl in [None] if case.both else case.impls:
                if impl == "torch" and (skipped or i - counting >= torch_repeats):
                    continue
                world = ranks_of(size)
                spec = case.spec_in(b.mode) | {"impl": impl, "count": i < counting}
                spec |= {"world": world, "shape": size}
                if case.runner == "gloo":
                    job = run_gloo_job(case.worker, world, spec, case.timeout_s, case.may_die)
                else:
                    job = [run_worker(case.worker, spec, case.timeout_s)]
                for name in job[0]:
                    got["runs"][name].append(
                        [{**r[name], "counted": i < counting} for r in job]
                    )
    return out


def _get(result: Json, read: str) -> Any:
    phase, _, rest = read.partition(".")
    if not rest:
        return result.get(read)
    if phase == "*":
        values = [_get(v, rest) for v in result.values() if isinstance(v, dict)]
        return max((v for v in values if v is not None), default=None)
    return _get(result.get(phase, {}), rest)


def figure(jobs: list[list[Json]], metric: Metric, read: str) -> float | None:
    """The median over jobs (the counting jobs, or the others) of a job's figure (the
    least with ``metric.best``)."""
    values = []
    for job in jobs:
        if job[0].get("counted", False) != metric.counted:
            continue
        got = [(r, _get(r, read)) for r in job]
        each = [float(v) for _, v in got if v is not None]
        how = metric.ranks
        if not each:
            continue
        if how == "rank0":
            values.append(float(next(v for r, v in got if r.get("rank", 0) == 0)))
        elif how.startswith("per:"):
            total = sum(float(_get(r, how[4:]) or 0) for r in job)
            values.append(sum(each) / total if total else 0.0)
        else:
            values.append({"sum": sum, "mean": lambda e: sum(e) / len(e)}.get(how, max)(each))
    return (min if metric.best else median)(values) if values else None


def same_meshes(runs: Runs) -> bool | None:
    """Every rank of every run built the same meshes with both libraries (``None``:
    the workers report no digest)."""
    digests = {
        impl: {(r.get("rank", 0), r["digest"]) for job in jobs for r in job if "digest" in r}
        for impl, jobs in runs.items()
    }
    if not digests.get("fmesh") or "torch" not in digests:
        return None
    fm = digests["fmesh"]
    return fm == digests["torch"] and len(fm) == len({rank for rank, _ in fm})


SAME = "same meshes on both sides (ranks, local ranks, group ranks)"


def run_case(b: Bench, case: Case) -> None:
    """Every size of ``case``: its runs in ``b.raw``, its rows in ``b.rows`` (each
    metric at every size, in the table's order)."""
    raw: Json = {}
    rows: list[Row] = []
    plan = case.plan(b.mode)
    if case.interleave:
        b.log(f"{case.section}: {case.raw_key}, sizes interleaved ...")
    together = run_jobs(b, case, plan) if case.interleave else None
    for k, (size, repeats, torch_repeats) in enumerate(plan):
        label = (
            world_str(size)
            if isinstance(size, int)
            else f"{ranks_of(size)} ({shape_str(size)})"
        )
        b.log(f"{case.section}: {case.raw_key} at {label} ...")
        if case.runner == "store":
            from .store_load import measure

            measured = measure(size, repeats, **case.spec_in(b.mode))
            got = raw[label] = {"runs": measured, "skipped": None}
        elif together is not None:
            got = raw[label] = together[k]
        else:
            got = raw[label] = run_jobs(b, case, [(size, repeats, torch_repeats)])[0]
        runs: Runs = got["runs"]
        same = same_meshes(runs)
        if same is False:
            b.log(f"{case.raw_key} at {label}: fmesh and torch built DIFFERENT meshes")
        first = runs["fmesh"][0][0] if runs["fmesh"] else {}
        notes = {k: v for k, v in first.items() if isinstance(v, str)}
        notes["same"] = SAME if same else "**meshes differ from torch's**"
        notes |= {f"n_{impl}": str(len(jobs)) for impl, jobs in runs.items()}
        for m in case.metrics:
            torch = None
            if m.skipped is None and runs.get("torch") and got["skipped"] is None:
                torch = figure(runs["torch"], m, m.torch or m.read)
            # fmt: off
            fm = figure(runs["fmesh"], m, m.read)
            limit = m.limit.format(fmesh=fm, torch=torch) if torch is not None else ""
            rows.append(Row(
                m.key, case.section, m.label, label, ranks_of(size), m.unit,
                fm, torch, note=m.note.format_map(notes),
                skipped=(got["skipped"] or m.skipped) if torch is None else None,
                resolution=m.resolution, every_size=m.every_size, limit=limit,
            ))
            # fmt: on
    b.raw[case.raw_key] = raw
    order = [m.key for m in case.metrics]
    rows.sort(key=lambda r: order.index(r.key))
    b.rows.extend([*rows, *(case.after(rows) if case.after else [])])


# -- rows derived from the measured ones (a case's ``after``) ------------------------------

EXTRAPOLATE = (2**17, 2**20)
CPU_CALL = "a creating call (gloo): server CPU per call (all ranks)"


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
    out = []
    for n in EXTRAPOLATE:
        fm, th = (_fit([(r.ranks, (getattr(r, s) or 0.0) * r.ranks) for r in cpu], n)
                  for s in ("fmesh", "torch"))  # fmt: skip
        scale = settings(last.ranks, None)[0] / settings(n, None)[0]
        w = world_str(n)
        # fmt: off
        out += [
            Row("store.watch.server_extrapolated", last.section, label, w, n, "/s",
                (last.fmesh or 0.0) * n * scale, None, skipped=last.skipped, every_size=True,
                note=f"extrapolated (N x the rate per rank at {last.world} x I({last.world})"
                " / I(N), the watch's interval I), not measured"),
            Row("store.call.cpu_per_call_extrapolated", last.section, CPU_CALL, w, n, "s", fm,
                th, note=f"extrapolated (straight line from N={sizes}), not measured",
                every_size=True),
        ]
        # fmt: on
    return sorted(out, key=lambda r: r.key, reverse=True)


def _fit(points: list[tuple[int, float]], x: int) -> float:
    if len(points) == 1:  # through the origin
        return points[0][1] * x / points[0][0]
    slope, intercept = statistics.linear_regression(*zip(*points, strict=True))
    return float(slope * x + intercept)
