"""torch's DeviceMesh suite runner (``tests/run_torch_suite.py``), on a stand-in file.

PyTorch's own file takes about 15 minutes (``.ci/run`` runs it); here a four-test file
with torch's import line shows the runner copies a read-only file, runs it with the
drop-in and then plain torch on the tests the drop-in did not pass (a skip included),
or on every test with ``--full``, honours ``-k`` and ``--dropin-only``, and fails on a
lost test.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import run_torch_suite as runner

RUNNER = Path(runner.__file__)

STAND_IN = f"""
import pytest
import torch
{runner.ANCHOR.rstrip()}


def test_builds_a_mesh_either_way():
    assert init_device_mesh.__name__ == "init_device_mesh"


def test_only_torchs():
    assert init_device_mesh.__module__ == "torch.distributed.device_mesh"


def test_fails_everywhere():
    assert False


def test_skips_with_the_drop_in():
    if init_device_mesh.__module__ != "torch.distributed.device_mesh":
        pytest.skip("not torch's")
"""


def _stand_in(tmp_path: Path) -> Path:
    folder = tmp_path / "shared"
    folder.mkdir()
    path = folder / "torch_test_device_mesh.py"
    path.write_text(STAND_IN)
    path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)  # read-only, as ../shared is
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    return subprocess.run(
        [sys.executable, str(RUNNER), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env=env,
    )


def test_a_test_lost_with_the_drop_in_fails_the_run(tmp_path: Path) -> None:
    path = _stand_in(tmp_path)
    logs = tmp_path / "logs"
    try:
        proc = _run(str(path), "--logs", str(logs))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        lines = proc.stdout.splitlines()
        # Plain torch ran the three tests the drop-in did not pass, the skip included.
        assert "plain torch: 2 passed, 1 failed, 0 skipped" in lines, proc.stdout
        assert "fmesh drop-in: 1 passed, 2 failed, 1 skipped" in lines, proc.stdout
        assert "fails on plain torch too: test_fails_everywhere (FAILED)" in lines
        assert "passes on plain torch only: test_only_torchs (FAILED)" in lines
        assert "passes on plain torch only: test_skips_with_the_drop_in (SKIPPED)" in lines
        assert sorted(p.name for p in logs.iterdir()) == [
            "torch_test_device_mesh.log",
            "torch_test_device_mesh_dropin.log",
        ]
        # --full: plain torch runs every test.
        proc = _run(str(path), "--full")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "plain torch: 3 passed, 1 failed, 0 skipped" in proc.stdout.splitlines()
        # --dropin-only with -k: any failure of the selected tests fails the run.
        proc = _run(str(path), "--dropin-only", "-k", "not everywhere")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        lines = proc.stdout.splitlines()
        assert "fmesh drop-in: 1 passed, 1 failed, 1 skipped" in lines, proc.stdout
        assert "fails with the drop-in: test_only_torchs (FAILED)" in lines
        assert "plain torch" not in proc.stdout
    finally:
        path.parent.chmod(stat.S_IRWXU)


def test_a_file_without_torchs_import_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.py"
    path.write_text("def test_x():\n    pass\n")
    proc = _run(str(path))
    assert proc.returncode != 0
    assert "import not found" in proc.stderr


ROUTED_STAND_IN = f"""
import pytest
import torch
{runner.ANCHOR.rstrip()}


def test_torchs_own_function():
    assert init_device_mesh.__module__ == "torch.distributed.device_mesh"


def test_torchs_own_code():
    assert init_device_mesh.__code__.co_filename.endswith("device_mesh.py")
"""


def test_route_runs_the_file_unchanged_with_torchs_function_routed(tmp_path: Path) -> None:
    path = tmp_path / "torch_test_device_mesh.py"
    path.write_text(ROUTED_STAND_IN)
    proc = _run(str(path), "--route")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    # Plain torch ran the one test fmesh's run did not pass.
    assert "plain torch: 1 passed, 0 failed, 0 skipped" in lines, proc.stdout
    # Routed, torch's function is still torch's object; it runs fmesh's code.
    assert "fmesh routed: 1 passed, 1 failed, 0 skipped" in lines, proc.stdout
    assert "passes on plain torch only: test_torchs_own_code (FAILED)" in lines
