"""The FSDP2 + tensor-parallel example runs under torchrun and its loss falls.

Runs the command the README shows, with 4 gloo processes on CPU (NCCL when GPUs
exist), and checks what rank 0 printed against fmesh's pure queries.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from _dist import run_command

import fmesh

ROOT = Path(__file__).resolve().parents[1]
NPROC = 4
TIMEOUT_S = 240


def _run_example() -> tuple[subprocess.CompletedProcess[str], float]:
    # `torchrun --standalone` picks a free port itself, so concurrent runs don't clash.
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone", "--nproc-per-node", str(NPROC),
        "examples/train_fsdp_tp.py",  # as in the README; cwd is the repo root
    ]  # fmt: skip
    return run_command(cmd, ROOT, TIMEOUT_S)


def test_train_fsdp_tp_loss_falls() -> None:
    proc, elapsed = _run_example()
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode} after {elapsed:.1f}s:\n{output}"

    losses = [float(x) for x in re.findall(r"^step\s+\d+ loss (\S+)$", proc.stdout, re.M)]
    assert len(losses) >= 2, f"no per-step losses in the output:\n{output}"
    assert losses[-1] < losses[0], f"loss did not fall: {losses}"
    assert re.search(r"^loss: first=\S+ last=\S+ fell=True$", proc.stdout, re.M)

    groups = re.search(r"^rank 0 coordinate \(0, 0\) groups: (.*)$", proc.stdout, re.M)
    assert groups is not None, f"rank 0 printed no groups:\n{output}"
    printed = {
        axis: tuple(int(r) for r in ranks.split(", "))
        for axis, ranks in re.findall(r"(\w+)=\[([\d, ]+)\]", groups.group(1))
    }
    mesh = fmesh.unflatten(
        fmesh.make_mesh({"world": NPROC}), "world", {"dp": NPROC // 2, "tp": 2}
    )
    expected = {axis: fmesh.group(mesh, axis, 0) for axis in mesh.axis_names}
    assert printed == expected
    assert f"mesh: {mesh!r}" in proc.stdout


def test_a_wrong_process_count_says_what_was_given_and_both_fixes() -> None:
    # The example checks the world size before it starts any process group, so
    # WORLD_SIZE alone stands in for torchrun here.
    script = "examples/train_fsdp_tp.py"
    env = {**os.environ, "WORLD_SIZE": "3"}
    cases = {
        (): [
            "--tp 2 does not divide the world size 3 (torchrun's --nproc-per-node)",
            f"torchrun --standalone --nproc-per-node 2 {script} --tp 2",
            "pass a --tp that divides 3: 1, 3",
        ],
        ("--dp", "2", "--tp", "2"): [
            "--dp 2 x --tp 2 is 4 ranks, but the world size is 3",
            f"torchrun --standalone --nproc-per-node 4 {script} --dp 2 --tp 2",
            "pick --dp and --tp whose product is 3",
        ],
    }
    for args, needles in cases.items():
        proc = subprocess.run(
            [sys.executable, script, *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stdout + proc.stderr
        message = proc.stderr.partition("error: ")[2]  # after argparse's usage line
        for needle in needles:
            assert needle in message, message
        if not args:
            assert "--dp" not in message  # a flag the user never gave
