"""examples/elastic.py: the survivors of a SIGKILLed rank train on in-process, and a
torchrun restart on the smaller world resumes from their checkpoint, resharded.

The expected meshes come from fmesh's pure functions. The expected losses and weights
come from a single-process reference run of the same task (the example's own data,
initial weights and hyperparameters; plain tensors, no mesh, no failure), so the
distributed run, its recovery and its restart must reproduce them.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest
import torch
from _dist import run_command

import fmesh

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "elastic.py"
NPROC, TP = 4, 2
KILLED, KILL_STEP = 1, 2
STEPS, EVERY = 6, 3
MORE_STEPS, RESUME_TP = 10, 1
TIMEOUT = "3"
"""The example's --timeout (realize's, so the collectives'); recover waits twice that."""
JOB_TIMEOUT_S = 180


def _run(
    cmd: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    return run_command(cmd, ROOT, JOB_TIMEOUT_S, env)


def _steps(stdout: str) -> list[tuple[int, float, str]]:
    """(step, loss, mesh repr) of every ``step S loss L mesh M`` line."""
    lines = re.findall(r"^step (\d+) loss (\S+) mesh (.+)$", stdout, re.M)
    return [(int(s), float(loss), mesh) for s, loss, mesh in lines]


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("elastic_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference(steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The losses of the first ``steps`` steps, and the state after them, computed in
    this process on full tensors."""
    example = _example()
    x, y = example.dataset()
    state: dict[str, torch.Tensor] = example.initial_state()
    losses = []
    for _ in range(steps):
        w1, w2 = (state[n].detach().requires_grad_() for n in ("w1", "w2"))
        loss = ((torch.relu(x @ w1.T) @ w2.T - y) ** 2).mean()
        grads = torch.autograd.grad(loss, [w1, w2])
        with torch.no_grad():
            for name, grad in zip(("w1", "w2"), grads):
                velocity = state[f"momentum.{name}"]
                velocity.mul_(example.MOMENTUM).add_(grad)
                state[name] = state[name] - example.LR * velocity
        losses.append(loss.item())
    return losses, state


def _saved_state(path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors, loaded whole in this process (no process group)."""
    from torch.distributed.checkpoint.state_dict_loader import load

    state = {n: torch.zeros_like(t) for n, t in _example().initial_state().items()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        load(state, checkpoint_id=path, no_dist=True)
    return state


def _close(got: list[float], want: list[float]) -> bool:
    # The example prints 6 decimals; DTensor sums in another order than one process.
    return got == pytest.approx(want, rel=1e-5, abs=2e-6)


MESH = fmesh.make_mesh({"dp": NPROC // TP, "tp": TP})
SHRUNK = fmesh.shrink(MESH, {KILLED}, axis="dp")
"""The mesh the survivors go on with: without the dp replica that held the killed rank."""


@pytest.fixture(scope="module")
def inprocess(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path, float]:
    """The in-process job: NPROC ranks, one SIGKILLed at KILL_STEP; its checkpoints,
    in the fresh temporary directory the launcher makes by default (under TMPDIR)."""
    tmp = tmp_path_factory.mktemp("elastic")
    cmd = [
        sys.executable, str(EXAMPLE), "--nproc", str(NPROC), "--tp", str(TP),
        "--kill", f"{KILLED}@{KILL_STEP}", "--steps", str(STEPS), "--every", str(EVERY),
        "--timeout", TIMEOUT,
    ]  # fmt: skip
    proc, elapsed = _run(cmd, env={**os.environ, "TMPDIR": str(tmp)})
    printed = re.search(r"^launcher: checkpoints go to (.+)$", proc.stdout, re.M)
    assert printed is not None, proc.stdout + proc.stderr
    checkpoint = Path(printed.group(1))
    assert checkpoint.parent == tmp and checkpoint.name.startswith("fmesh-elastic-")
    return proc, checkpoint, elapsed


def test_survivors_of_a_killed_rank_train_on_in_process(
    inprocess: tuple[subprocess.CompletedProcess[str], Path, float],
) -> None:
    proc, checkpoint, elapsed = inprocess
    output = f"after {elapsed:.1f}s:\n{proc.stdout}{proc.stderr}"
    assert proc.returncode == 0, output
    codes = [-signal.SIGKILL if r == KILLED else 0 for r in range(NPROC)]
    assert f"launcher: exit codes by rank {codes}" in proc.stdout, output
    assert f"recovered: lost ranks [{KILLED}]; mesh {MESH!r} -> {SHRUNK!r}" in proc.stdout
    left_out = [r for r in range(NPROC) if r != KILLED and fmesh.coordinate(SHRUNK, r) is None]
    assert left_out  # the killed rank's replica partner: a survivor out of the mesh
    for rank in left_out:
        assert f"rank {rank}: not in {SHRUNK!r}; standing by" in proc.stdout, output
    # recover's wait for the dead rank ends in c10d's socket-timeout warning on stderr;
    # the example says so first.
    recovering = proc.stdout.index(
        f"a collective failed: recovering; fmesh.recover waits {2 * float(TIMEOUT):g}s "
        "for ranks that never check in (c10d logs the end of that wait as a "
        "'waitForInput ... timed out' warning: expected)"
    )
    assert recovering < proc.stdout.index("recovered: lost ranks"), output

    # Every step once, on the full mesh before the kill and on the shrunk one from it;
    # the step that failed ran again on the shrunk mesh, from the same weights.
    steps = _steps(proc.stdout)
    assert [s for s, _, _ in steps] == list(range(STEPS)), output
    assert [m for _, _, m in steps] == [
        repr(MESH if s < KILL_STEP else SHRUNK) for s in range(STEPS)
    ]
    losses = [loss for _, loss, _ in steps]
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    reference, state = _reference(STEPS)
    assert _close(losses, reference), (losses, reference)

    # Checkpoints from the shrunk mesh, every EVERY steps and at the end.
    assert (checkpoint / "latest").read_text() == f"step-{STEPS}"
    for step in range(EVERY, STEPS + 1, EVERY):
        path = checkpoint / f"step-{step}"
        assert fmesh.Mesh.from_json((path / "mesh.json").read_text()) == SHRUNK
        assert json.loads((path / "train.json").read_text())["step"] == step
    saved = _saved_state(checkpoint / f"step-{STEPS}")
    for name, tensor in state.items():
        torch.testing.assert_close(saved[name], tensor, rtol=1e-5, atol=1e-6)


def test_a_torchrun_restart_on_fewer_ranks_resumes_resharded(
    inprocess: tuple[subprocess.CompletedProcess[str], Path, float],
) -> None:
    first, checkpoint, _ = inprocess
    assert first.returncode == 0, first.stdout + first.stderr
    k = SHRUNK.size
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(k), str(EXAMPLE), "--resume", str(checkpoint),
        "--steps", str(MORE_STEPS), "--tp", str(RESUME_TP), "--timeout", TIMEOUT,
    ]  # fmt: skip
    proc, elapsed = _run(cmd)
    output = f"after {elapsed:.1f}s:\n{proc.stdout}{proc.stderr}"
    assert proc.returncode == 0, output

    # The saved mesh held old ranks; the restart has ranks 0..k-1, split another way.
    resumed = fmesh.make_mesh({"dp": k // RESUME_TP, "tp": RESUME_TP})
    assert resumed.shape != SHRUNK.shape  # a real reshard: tp=2 shards -> tp=1
    path = checkpoint / f"step-{STEPS}"
    assert f"resumed at step {STEPS} from {path}: saved on {SHRUNK!r}, now {resumed!r}" in (
        proc.stdout
    ), output

    steps = _steps(proc.stdout)
    assert [s for s, _, _ in steps] == list(range(STEPS, MORE_STEPS)), output
    assert {m for _, _, m in steps} == {repr(resumed)}
    losses = [loss for _, loss, _ in steps]
    before = [loss for _, loss, _ in _steps(first.stdout)]
    assert all(b < a for a, b in itertools.pairwise([before[-1], *losses])), (before, losses)
    reference, state = _reference(MORE_STEPS)
    assert _close(losses, reference[STEPS:]), (losses, reference[STEPS:])
    assert re.search(r"^done: .* replicas agree: True, ", proc.stdout, re.M), output

    assert (checkpoint / "latest").read_text() == f"step-{MORE_STEPS}"
    path = checkpoint / f"step-{MORE_STEPS}"
    assert fmesh.Mesh.from_json((path / "mesh.json").read_text()) == resumed
    saved = _saved_state(path)
    for name, tensor in state.items():
        torch.testing.assert_close(saved[name], tensor, rtol=1e-5, atol=1e-6)


# -- the docs text ------------------------------------------------------------------------

EXCERPT = "# excerpt of examples/elastic.py\n"
# README.md and every docs page; the elastic page has one excerpt at least.
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))


def _python_blocks(path: Path) -> list[str]:
    return [
        b
        for lang, b in re.findall(r"```(\w+)\n(.*?)```", path.read_text(), re.S)
        if lang == "python"
    ]


def test_the_text_quotes_the_example_verbatim() -> None:
    source = EXAMPLE.read_text()
    excerpts = [b for page in PAGES for b in _python_blocks(page) if b.startswith(EXCERPT)]
    assert [b for b in _python_blocks(ROOT / "docs" / "elastic.md") if b.startswith(EXCERPT)]
    for block in excerpts:
        assert block.removeprefix(EXCERPT) in source, block
