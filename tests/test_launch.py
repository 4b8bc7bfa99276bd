"""Bad launches and bad realize arguments fail with clear fmesh errors, before torch
sees them (no process group is created by any test here)."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import fmesh
from fmesh._runtime.launch import _program

MESH = fmesh.make_mesh({"dp": 2, "tp": 2})
TORCHRUN_ENV = {"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}


@pytest.fixture(autouse=True)
def no_world(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not dist.is_initialized()  # these tests must fail before initializing one
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)


def test_unknown_backend_is_a_mesh_error_not_a_torch_assertion() -> None:
    with pytest.raises(fmesh.MeshError, match=r"unknown backend 'bogus'; expected one of \["):
        fmesh.realize(MESH, backend="bogus")
    with pytest.raises(fmesh.MeshError, match=r"unknown backend 'cpu:gloo,cuda:bogus'"):
        fmesh.realize(MESH, backend={"dp": "cpu:gloo,cuda:bogus"})
    with pytest.raises(TypeError, match=r"a backend must be a str, got 3"):
        fmesh.realize(MESH, backend={"dp": 3})  # type: ignore[dict-item]  # the error under test


def test_device_mesh_backends_with_device_prefix_are_accepted_by_the_check() -> None:
    # Fails later, at launch (no torchrun env), not at the backend check.
    with pytest.raises(fmesh.LaunchError):
        fmesh.realize(MESH, backend="cpu:gloo,cuda:nccl")


@pytest.mark.parametrize("seconds", [0, -1])
def test_non_positive_timeout(seconds: int) -> None:
    with pytest.raises(fmesh.MeshError, match=r"timeout must be positive, got datetime"):
        fmesh.realize(MESH, timeout=datetime.timedelta(seconds=seconds))
    with pytest.raises(TypeError, match=r"timeout must be a datetime.timedelta, got 30"):
        fmesh.realize(MESH, timeout=30)  # type: ignore[arg-type]  # the error under test


def test_outside_torchrun_says_how_to_launch() -> None:
    with pytest.raises(fmesh.LaunchError, match=r"torchrun --standalone --nproc-per-node 4"):
        fmesh.realize(MESH)


@pytest.mark.parametrize(
    ("argv", "program"),
    [
        (["python", "train.py", "--steps", "10"], "train.py --steps 10"),
        (["python", "-u", "-W", "error", "-Xdev", "t.py", "a b"], "t.py 'a b'"),
        (
            ["python", "-m", "fmesh.route", "train.py", "--lr", "1"],
            "-m fmesh.route train.py --lr 1",
        ),
        (["python", "-Bm", "pkg.train"], "-m pkg.train"),
        (["python", "-mpkg"], "-m pkg"),
        (["python", "--check-hash-based-pycs", "always", "t.py"], "t.py"),
        (["python", "-Wm", "t.py"], "t.py"),  # -W's value is "m"
        (["python", "-c", "import fmesh"], None),
        (["python", "-Ic", "import fmesh"], None),
        (["python", "-"], None),
        (["python"], None),
        (["python", "-m", "ipykernel_launcher", "-f", "kernel.json"], None),
    ],
)
def test_the_program_a_launch_would_run(argv: list[str], program: str | None) -> None:
    """What the launch help puts after ``torchrun ...``: this process's own program,
    read from the interpreter's command line, or nothing to name."""
    assert _program(argv) == program


def _outside_torchrun(tmp_path: Path, *args: str) -> str:
    """stderr of ``python ARGS`` in ``tmp_path`` with no torchrun variable set."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV and k != "LOCAL_RANK"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run(
        [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fmesh.LaunchError: " in done.stderr, done.stderr
    return done.stderr


def test_outside_torchrun_the_help_names_the_script_or_module(tmp_path: Path) -> None:
    body = "import fmesh\n\nfmesh.realize(fmesh.make_mesh({'dp': 2}))\n"
    (tmp_path / "my_trainer.py").write_text(body)
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "train.py").write_text(body)
    script = _outside_torchrun(tmp_path, "my_trainer.py", "--steps", "3")
    assert "    torchrun --standalone --nproc-per-node 4 my_trainer.py --steps 3\n" in script
    module = _outside_torchrun(tmp_path, "-m", "mypkg.train", "--lr", "0.1")
    assert "    torchrun --standalone --nproc-per-node 4 -m mypkg.train --lr 0.1\n" in module
    code = _outside_torchrun(tmp_path, "-c", body)
    assert "    torchrun --standalone --nproc-per-node 4 your_script.py\n" in code


def test_missing_local_rank_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for var, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(
        fmesh.LaunchError, match=r"found RANK and WORLD_SIZE but no LOCAL_RANK"
    ):
        fmesh.realize(MESH)


def test_local_rank_without_a_gpu_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    for var, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(var, value)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    monkeypatch.setenv("LOCAL_RANK", str(count))  # one past the last device
    seen = "no CUDA device" if count == 0 else rf"{count} CUDA device\(s\)"
    pattern = (
        rf"would start NCCL on cuda:{count} \(LOCAL_RANK={count}\), but this process "
        rf"sees {seen}(.|\n)*backend=\"gloo\""
    )
    with pytest.raises(fmesh.LaunchError, match=pattern):
        fmesh.realize(MESH, backend="nccl")
    assert not dist.is_initialized()


def _unavailable_device_type() -> str:
    for name in ("cuda", "xpu", "mps"):
        module = getattr(torch, name, None)
        if module is None or not module.is_available():
            return name
    raise AssertionError("every device type is available here")


def test_to_device_mesh_refuses_a_device_torch_cannot_use() -> None:
    realized = fmesh.RealizedMesh(mesh=MESH, rank=0, coordinate=(0, 0), groups={})
    device = _unavailable_device_type()
    with pytest.raises(fmesh.MeshError, match=rf"device type '{device}' is not available"):
        realized.to_device_mesh(device)
    with pytest.raises(fmesh.MeshError, match=r"'warp' is not a torch device type"):
        realized.to_device_mesh("warp")
    with pytest.raises(fmesh.MeshError, match=r"without an index, e.g. 'cuda' rather"):
        realized.to_device_mesh("cpu:0")


def test_init_fake_world_checks_its_arguments() -> None:
    with pytest.raises(fmesh.MeshError, match=r"got rank 4 of world_size 4"):
        fmesh.init_fake_world(4, 4)
    with pytest.raises(TypeError, match=r"world_size must be int, got '4'"):
        fmesh.init_fake_world("4", 0)  # type: ignore[arg-type]  # the error under test
