"""Bad launches and bad realize arguments fail with clear fmesh errors, before torch
sees them (no process group is created by any test here)."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

import fmesh

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
