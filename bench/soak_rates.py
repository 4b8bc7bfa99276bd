"""Crash rates of the soak's training jobs, told apart: intervals and a test.

Each side's rate of ``native_abort`` jobs gets Wilson's score interval and the exact
Clopper-Pearson interval (95%); the difference fmesh - torch gets Newcombe's hybrid
score interval and Fisher's exact test (two-sided). Small counts are the point (a rare
crash in tens of jobs), so no normal approximation of the difference is used. The
intervals and the test are scipy's (``binomtest``, ``fisher_exact``).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from scipy import stats  # type: ignore[import-untyped]  # scipy ships no types

from .shared import Json

SIDES = ("torch", "fmesh")
OUTCOMES = ("ok", "native_abort", "other_failure", "timeout")


def _interval(k: int, n: int, method: str) -> tuple[float, float]:
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method=method)
    return float(ci.low), float(ci.high)


def wilson(k: int, n: int) -> tuple[float, float]:
    """Wilson's score interval (95%, no continuity correction) for k/n."""
    return _interval(k, n, "wilson")


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval (95%) for k/n."""
    return _interval(k, n, "exact")


def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> float:
    """Fisher's exact test of k1/n1 against k2/n2: the two-sided p-value."""
    _, p_value = stats.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]])  # (odds ratio, p)
    return float(p_value)


def newcombe(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float]:
    """Newcombe's hybrid score interval (from Wilson's) for k1/n1 - k2/n2."""
    p1, p2 = k1 / n1, k2 / n2
    (l1, u1), (l2, u2) = wilson(k1, n1), wilson(k2, n2)
    d = p1 - p2
    return d - math.hypot(p1 - l1, u2 - p2), d + math.hypot(u1 - p1, p2 - l2)


def rates(jobs: list[Json]) -> Json:
    """Counts by outcome, the abort rate and its intervals per side, the difference."""
    out: Json = {}
    for side in SIDES:
        mine = [j for j in jobs if j["side"] == side]
        n = len(mine)
        by_outcome = {o: sum(j["outcome"] == o for j in mine) for o in OUTCOMES}
        k = by_outcome["native_abort"]
        out[side] = by_outcome | {"jobs": n, "abort_rate": k / n if n else None}
        if n:
            walls = [float(j["wall_s"]) for j in mine]
            out[side] |= {"wilson95": wilson(k, n), "clopper_pearson95": clopper_pearson(k, n)}
            wall_s = {"median": statistics.median(walls), "min": min(walls), "max": max(walls)}
            out[side]["wall_s"] = wall_s
    t, f = out["torch"], out["fmesh"]
    if t["jobs"] and f["jobs"]:
        counts = (f["native_abort"], f["jobs"], t["native_abort"], t["jobs"])
        out["fmesh_minus_torch"] = {
            "difference": f["abort_rate"] - t["abort_rate"],
            "newcombe95": newcombe(*counts),
            "fisher_exact_p": fisher_exact(*counts),
        }
    return out


def summary(report: Json) -> str:
    """The report in a few lines: counts, rates, intervals, the test, the messages."""
    r, p = report["rates"], report["provenance"]
    lines = [
        f"torchtitan FSDP x TP (2 x 2 gloo, partial_dtensor), {report['steps']} steps a "
        f"job; torch {p['torch']}, fmesh {p['fmesh_commit']}",
        "side   jobs  ok  native_abort  other  timeout  abort rate  Wilson 95%"
        "        Clopper-Pearson 95%  job wall s (median, min-max)",
    ]
    for side in SIDES:
        s = r[side]
        if not s["jobs"]:
            continue
        w, cp, wall = s["wilson95"], s["clopper_pearson95"], s["wall_s"]
        lines.append(
            f"{side:6} {s['jobs']:4} {s['ok']:3} {s['native_abort']:13} "
            f"{s['other_failure']:6} {s['timeout']:8}  {s['abort_rate']:10.3f}  "
            f"[{w[0]:.3f}, {w[1]:.3f}]    [{cp[0]:.3f}, {cp[1]:.3f}]       "
            f"{wall['median']:.0f} ({wall['min']:.0f}-{wall['max']:.0f})"
        )
    if "fmesh_minus_torch" in r:
        d = r["fmesh_minus_torch"]
        lo, hi = d["newcombe95"]
        lines.append(
            f"fmesh - torch: {d['difference']:+.3f}, Newcombe 95% [{lo:+.3f}, {hi:+.3f}]; "
            f"Fisher's exact test p = {d['fisher_exact_p']:.3f}"
        )
    seen: dict[str, list[str]] = {}
    for job in report["jobs"]:
        if job["outcome"] != "ok":
            first = job["first_deaths"][0][0] if job["first_deaths"] else None
            fates = {str(rank): fate for rank, fate in job["fates"].items()}
            what = job["message"] or fates.get(str(first), "no rank died")
            key = f"{job['outcome']}: {what}"
            seen.setdefault(key, []).append(f"{job['side']} rank {first}")
    lines += [f"  {len(v)} x {key} ({', '.join(v)})" for key, v in sorted(seen.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.soak_rates REPORT.json [MORE.json ...]``: the rates and summary
    of one soak's report, or of several runs of the same settings pooled, computed again
    (with this module, whatever computed them before)."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(main.__doc__)
        return 2
    reports = [json.loads(Path(a).read_text()) for a in args]
    settings = {(r["steps"], r["tokens"], r["provenance"]["torch"]) for r in reports}
    if len(settings) != 1:
        raise SystemExit(f"reports of different settings (steps, tokens, torch): {settings}")
    report = reports[0] | {"jobs": [j for r in reports for j in r["jobs"]]}
    report["rates"] = rates(report["jobs"])
    print(summary(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
