"""The soak's intervals and test (bench/soak_rates.py) against published values.

The references: Wilson's and the exact interval for 1/9 as scipy's ``binomtest``
gives them, Fisher's tea-tasting table (p = 0.4857), Newcombe's (1998) example
56/70 - 48/80 (0.0524 to 0.3339), and the closed form of the exact upper bound when
no job crashed, 1 - (alpha/2)^(1/n).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.soak_rates import (
    clopper_pearson,
    fisher_exact,
    main,
    newcombe,
    rates,
    summary,
    wilson,
)


def test_wilson_interval() -> None:
    assert wilson(1, 9) == pytest.approx((0.019891, 0.435000), abs=1e-6)
    assert wilson(0, 40)[0] == 0.0 and wilson(40, 40)[1] == 1.0


def test_clopper_pearson_interval() -> None:
    assert clopper_pearson(1, 9) == pytest.approx((0.002809, 0.482497), abs=1e-6)
    assert clopper_pearson(5, 40) == pytest.approx((0.041860, 0.268033), abs=1e-6)
    assert clopper_pearson(0, 40) == pytest.approx((0.0, 1 - 0.025 ** (1 / 40)), abs=1e-9)
    assert clopper_pearson(40, 40) == pytest.approx((0.025 ** (1 / 40), 1.0), abs=1e-9)


def test_fisher_exact_two_sided() -> None:
    assert fisher_exact(3, 4, 1, 4) == pytest.approx(0.485714, abs=1e-6)
    assert fisher_exact(0, 40, 5, 40) == pytest.approx(0.054743, abs=1e-6)
    assert fisher_exact(1, 9, 2, 9) == pytest.approx(1.0)


def test_newcombe_difference_interval() -> None:
    assert newcombe(56, 70, 48, 80) == pytest.approx((0.0524, 0.3339), abs=1e-4)
    low, high = newcombe(0, 40, 0, 40)
    assert low < 0 < high and low == pytest.approx(-high)


def _job(side: str, outcome: str, wall: float, rank: int = 0) -> dict[str, Any]:
    aborted = outcome == "native_abort"
    return {
        "side": side,
        "outcome": outcome,
        "wall_s": wall,
        "message": "malloc(): unaligned tcache chunk detected" if aborted else None,
        "first_deaths": [[rank, 5.0]] if outcome != "ok" else [],
        "fates": {rank: "killed by SIGABRT" if aborted else "ok"},
    }


def test_rates_count_each_side_and_the_summary_names_the_rank() -> None:
    jobs = [_job("torch", "ok", 30.0), _job("fmesh", "ok", 40.0)] * 4
    jobs += [_job("torch", "native_abort", 20.0, rank=2)]
    report = {"jobs": jobs, "steps": 10, "provenance": {"torch": "2.15", "fmesh_commit": "x"}}
    report["rates"] = out = rates(jobs)
    assert out["torch"]["jobs"] == 5 and out["torch"]["native_abort"] == 1
    assert out["fmesh"]["jobs"] == 4 and out["fmesh"]["abort_rate"] == 0.0
    assert out["torch"]["wall_s"] == {"median": 30.0, "min": 20.0, "max": 30.0}
    assert out["fmesh_minus_torch"]["difference"] == pytest.approx(-0.2)
    assert out["fmesh_minus_torch"]["fisher_exact_p"] == pytest.approx(1.0)
    text = summary(report)
    assert "1 x native_abort: malloc(): unaligned tcache chunk detected (torch rank 2)" in text


def test_reports_of_the_same_settings_pool_and_others_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    provenance = {"torch": "2.15", "fmesh_commit": "x"}
    report = {"steps": 10, "tokens": 128, "provenance": provenance}
    one, two, other = tmp_path / "1.json", tmp_path / "2.json", tmp_path / "3.json"
    one.write_text(json.dumps(report | {"jobs": [_job("torch", "ok", 1.0)] * 3}))
    two.write_text(json.dumps(report | {"jobs": [_job("fmesh", "native_abort", 1.0)]}))
    assert main([str(one), str(two)]) == 0
    text = capsys.readouterr().out
    assert "torch     3   3" in text and "fmesh     1   0             1" in text
    other.write_text(json.dumps(report | {"steps": 5, "jobs": []}))
    with pytest.raises(SystemExit, match="different settings"):
        main([str(one), str(other)])
