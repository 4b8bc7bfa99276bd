"""NCCL on a real GPU: eager init with a bound device, size-1 axes, per-axis NCCL,
DTensor and FSDP2 x TP on CUDA, a collective on every axis group, destroy and
realize again. Needs CUDA; without it every test here skips, saying so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (NCCL paths)"
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def facts() -> dict[str, Any]:
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(ROOT))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "1",
            str(ROOT / "tests" / "gpu_job.py"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("FACTS "))
    out: dict[str, Any] = json.loads(line.removeprefix("FACTS "))
    return out


def test_eager_nccl_init_binds_the_local_device(facts: dict[str, Any]) -> None:
    assert "nccl" in facts["world_backend"]
    assert facts["bound_device"] == "cuda:0"
    assert facts["current_device"] == 0


def test_size_one_axes_get_a_cheap_group_that_works(facts: dict[str, Any]) -> None:
    for axis, got in facts["collectives"].items():
        assert got["size"] == 1, axis
        assert "nccl" not in got["backend"], axis  # no NCCL communicator
        assert got["cpu"] == 1, (axis, got)  # all_reduce of this rank's bit


def test_a_backend_named_for_a_size_one_axis_is_honoured(facts: dict[str, Any]) -> None:
    got = facts["explicit_nccl_tp"]
    assert got["backend"] == "nccl"
    assert got["cuda"] == 1


def test_dtensor_and_fsdp2_with_tp_on_cuda(facts: dict[str, Any]) -> None:
    assert facts["device_mesh"] == {"device_type": "cuda", "shape": [1, 1, 1]}
    assert facts["dtensor_round_trip"] is True
    assert facts["dtensor_sum"] == float(sum(range(32)))
    losses = facts["fsdp_tp_losses"]
    assert len(losses) == 3 and losses[-1] < losses[0]


def test_destroy_then_realize_again(facts: dict[str, Any]) -> None:
    d = facts["destroy"]
    assert d["live_before"] >= 1 and d["live_after"] >= 1
    assert d["new_group"] is True
    assert all(got["cpu"] == 1 for got in d["collectives"].values())


@pytest.fixture(scope="module")
def creation() -> dict[str, Any]:
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "gpu_job.py"), "--creation"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("CREATION "))
    out: dict[str, Any] = json.loads(line.removeprefix("CREATION "))
    print(json.dumps(out, indent=1))  # the GIL facts are read, not asserted
    return out


def test_fmesh_names_the_nccl_backend_torch_made(facts: dict[str, Any]) -> None:
    expected = {"ProcessGroupNCCL": "legacy", "ProcessGroupNCCL2": "nccl2"}
    assert expected.get(facts["world_nccl_class"]) == facts["fmesh_flavor"], facts


def test_a_missing_root_ends_each_id_exchange_as_the_design_page_says(
    creation: dict[str, Any],
) -> None:
    cases = {c["case"]: c for c in creation["cases"]}
    legacy = cases["legacy_plain"]
    assert legacy.get("error") and "ncclUniqueId" in legacy["error"], legacy
    assert 4.0 <= legacy["seconds"] < 60.0, legacy  # the store's timeout (5 s)
    if cases["nccl2_plain"].get("absent"):
        pytest.skip(f"no nccl2 in torch {creation['torch']}")
    plain, watched = cases["nccl2_plain"], cases["nccl2_watch"]
    assert plain.get("error") and 4.0 <= plain["seconds"] < 60.0, plain  # group timeout
    assert watched.get("error") and "given up by the watch" in watched["error"], watched
    assert watched["seconds"] < 15.0, watched  # cancelled at 2 s, not at 60 s
