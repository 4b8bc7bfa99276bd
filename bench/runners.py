"""How a case of :mod:`bench.cases` is run and read into rows.

A case names a worker, the sizes it runs at and the metrics it reports. Its runner
turns each size into *runs* per library: ``{"fmesh": [job, ...], "torch": [...]}``,
where a job is a list of rank results (one for a fake-backend process). A metric reads
one figure from every job (over its ranks: the slowest, the mean, ...) and takes the
median over jobs. Three runners:

* ``fake``: one fresh process per library and repeat (or one per repeat for workers
  that measure both libraries side by side), fmesh's and torch's interleaved: the
  machine's load drifts. torch is skipped where its time, extrapolated from the
  smaller sizes, passes the case's limit;
* ``gloo``: one real gloo job per library and repeat, interleaved, after one counting
  job per library when a metric counts store requests;
* ``store``: :func:`bench.store_load.measure` (one store server, many simulated ranks).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .launch import WorkerTimeout, run_gloo_job, run_worker
from .shared import Bench, Json, Row, median, shape_str, world_str

IMPLS = ("fmesh", "torch")
Runs = dict[str, list[list[Json]]]


@dataclass(frozen=True)
class Metric:
    """One row of a case at every size: where its figures are, and how it reads."""

    key: str
    read: str
    """Where a rank's result holds the figure (``new.seconds``: a phase's; ``*.x``:
    the most of ``x`` over the phases)."""
    label: str
    note: str = ""
    """Shown in the note column; ``{name}`` takes a string fmesh's worker returned."""
    unit: str = "s"
    ranks: str = "max"
    """Over a job's ranks: ``max``, ``mean``, ``sum``, ``rank0``, or ``per:<read>``
    (the sum of the figure over the sum of another)."""
    torch: str | None = None
    """Where torch's figure is (``None``: the same place; ``""``: none)."""
    skipped: str | None = None
    """What the torch column says when there is no torch figure."""
    counted: bool = False
    """From the counting job (store requests); else from the timed jobs."""
    every_size: bool = False
    resolution: float = 0.0


@dataclass(frozen=True)
class Case:
    """A worker, the sizes and repeats it runs at in each mode, and its metrics."""

    name: str
    """What ``--section`` selects it by."""
    section: str
    runner: str
    worker: Callable[..., Any] | None
    metrics: tuple[Metric, ...]
    sizes: Mapping[str, tuple[Any, ...]]
    """Per mode: world sizes (fake), 5-d shapes or world sizes (gloo)."""
    repeats: Mapping[str, int | tuple[int, ...]] = field(default_factory=dict)
    """Per mode (1 where absent): jobs or processes per library, or one per size."""
    spec: Callable[[str, Any], Json] = lambda mode, size: {}
    impls: tuple[str, ...] = IMPLS
    both: bool = False
    """The worker measures both libraries in one process."""
    torch_limit_s: float | None = None
    """Skip torch past this many seconds (estimated, or by timeout)."""
    skip_torch: Mapping[str, str] = field(default_factory=dict)
    """Modes that skip torch, and why."""
    timeout_s: float = 600.0
    may_die: tuple[int, ...] = ()
    """Ranks of a gloo job that may die by SIGKILL."""
    after: Callable[[list[Row]], list[Row]] | None = None
    """More rows from the measured ones (extrapolations)."""

    def plan(self, mode: str) -> list[tuple[Any, int]]:
        """(size, repeats) of each size in ``mode``."""
        sizes = self.sizes[mode]
        repeats = self.repeats.get(mode, 1)
        each = repeats if isinstance(repeats, tuple) else (repeats,) * len(sizes)
        return list(zip(sizes, each, strict=True))

    @property
    def raw_key(self) -> str:
        """Where the raw runs go: the common part of its metrics' keys."""
        return self.metrics[0].key.rpartition(".")[0]


def _worker(case: Case) -> Callable[[Json], Json]:
    if case.worker is None:
        raise ValueError(f"{case.raw_key}: the {case.runner} runner needs a worker")
    return case.worker


def ranks_of(size: Any) -> int:
    return size if isinstance(size, int) else math.prod(size)


def label_of(case: Case, size: Any) -> str:
    if isinstance(size, int):
        return world_str(size)
    return f"{ranks_of(size)} ({shape_str(size)})"


# -- runners ------------------------------------------------------------------------------


def run_fake(
    b: Bench, case: Case, size: Any, repeats: int, torch_points: list[tuple[int, float]]
) -> Json:
    """Fresh processes; torch skipped past the case's limit (estimated from
    ``torch_points``, the (size, seconds) of torch's smaller sizes)."""
    runs: Runs = {impl: [] for impl in case.impls}
    skipped = case.skip_torch.get(b.mode)
    limit = case.torch_limit_s
    if skipped is None and limit is not None and torch_points:
        est = estimate(torch_points, size)
        if est > limit:
            skipped = f"skipped (>{limit:.0f} s est.: {est:.0f} s)"
    impls = [i for i in case.impls if i == "fmesh" or skipped is None]
    for _ in range(repeats):
        for impl in [None] if case.both else impls:
            spec = {**case.spec(b.mode, size), "impl": impl, "world": size}
            try:
                timeout = case.timeout_s if impl != "torch" or limit is None else limit + 30
                out = run_worker(_worker(case), spec, timeout)
            except WorkerTimeout:
                if impl != "torch":
                    raise
                skipped = f"skipped (ran past {limit:.0f} s)"
                runs["torch"] = []
                impls = ["fmesh"]
                continue
            for name, figures in out.items():
                runs[name].append([figures])
    if runs.get("torch") and "seconds" in runs["torch"][0][0]:
        torch_points.append((size, median([job[0]["seconds"] for job in runs["torch"]])))
    # Past a time limit the note says why; a mode's skip only fills the torch column.
    return {"runs": runs, "skipped": skipped, "over": skipped != case.skip_torch.get(b.mode)}


def estimate(points: list[tuple[int, float]], world: int) -> float:
    """Extrapolate a time to ``world`` from smaller sizes (at least linearly)."""
    (w1, t1) = points[-1]
    exponent = 1.0
    if len(points) >= 2 and points[-2][1] > 0 and t1 > 0:
        (w0, t0) = points[-2]
        exponent = max(1.0, math.log(t1 / t0) / math.log(w1 / w0))
    return float(t1 * (world / w1) ** exponent)


def run_gloo(b: Bench, case: Case, size: Any, repeats: int, _: object) -> Json:
    """Real gloo jobs: a counting job per library first (when a metric counts), then
    ``repeats`` timed ones, fmesh's and torch's interleaved."""
    world = ranks_of(size)
    runs: Runs = {impl: [] for impl in case.impls}
    counting = any(m.counted for m in case.metrics)
    for count in [True] * counting + [False] * repeats:
        for impl in case.impls:
            spec = {**case.spec(b.mode, size), "impl": impl, "count": count, "shape": size}
            job = run_gloo_job(_worker(case), world, spec, case.timeout_s, case.may_die)
            runs[impl].append([{**r, "counted": count} for r in job])
    return {"runs": runs, "skipped": None}


def run_store(b: Bench, case: Case, size: Any, repeats: int, _: object) -> Json:
    from .store_load import measure

    return {"runs": measure(size, repeats, **case.spec(b.mode, size)), "skipped": None}


RUNNERS = {"fake": run_fake, "gloo": run_gloo, "store": run_store}


# -- reading ------------------------------------------------------------------------------


def _get(result: Json, read: str) -> Any:
    phase, _, rest = read.partition(".")
    if not rest:
        return result.get(read)
    if phase == "*":
        values = [_get(v, rest) for v in result.values() if isinstance(v, dict)]
        return max((v for v in values if v is not None), default=None)
    return _get(result.get(phase, {}), rest)


def figure(jobs: list[list[Json]], metric: Metric, read: str) -> float | None:
    """The median over jobs (the counting jobs, or the others) of a job's figure."""
    chosen = [job for job in jobs if job[0].get("counted", False) == metric.counted]
    values = []
    for job in chosen:
        got = [(r, _get(r, read)) for r in job]
        each = [float(v) for _, v in got if v is not None]
        if not each:
            continue
        how = metric.ranks
        if how == "rank0":
            values.append(float(next(v for r, v in got if r.get("rank", 0) == 0)))
        elif how == "sum":
            values.append(sum(each))
        elif how == "mean":
            values.append(sum(each) / len(each))
        elif how.startswith("per:"):
            total = sum(float(_get(r, how[4:]) or 0) for r in job)
            values.append(sum(each) / total if total else 0.0)
        else:
            values.append(max(each))
    return median(values) if values else None


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
    points: list[tuple[int, float]] = []
    for size, repeats in case.plan(b.mode):
        label = label_of(case, size)
        b.log(f"{case.section}: {case.raw_key} at {label} ...")
        got = RUNNERS[case.runner](b, case, size, repeats, points)
        raw[label] = got
        runs: Runs = got["runs"]
        same = same_meshes(runs)
        if same is False:
            b.log(f"{case.raw_key} at {label}: fmesh and torch built DIFFERENT meshes")
        first = runs["fmesh"][0][0] if runs["fmesh"] else {}
        notes = {k: v for k, v in first.items() if isinstance(v, str)}
        notes["same"] = SAME if same else "**meshes differ from torch's**"
        for m in case.metrics:
            torch_read = m.read if m.torch is None else m.torch
            skipped = got["skipped"] or m.skipped
            torch = None
            if torch_read and runs.get("torch") and got["skipped"] is None:
                torch = figure(runs["torch"], m, torch_read)
            note = got["skipped"] if got.get("over") else m.note.format_map(notes)
            rows.append(
                Row(
                    m.key,
                    case.section,
                    m.label,
                    label,
                    ranks_of(size),
                    m.unit,
                    figure(runs["fmesh"], m, m.read),
                    torch,
                    note=note,
                    skipped=skipped if torch is None else None,
                    resolution=m.resolution,
                    every_size=m.every_size,
                )
            )
    b.raw[case.raw_key] = raw
    order = [m.key for m in case.metrics]
    rows.sort(key=lambda r: order.index(r.key))
    b.rows.extend([*rows, *(case.after(rows) if case.after else [])])
