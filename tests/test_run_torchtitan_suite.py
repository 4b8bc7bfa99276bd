"""The torchtitan runner's one-import change takes, without a torchtitan checkout.

The runner itself (``tests/run_torchtitan_suite.py``) needs torchtitan and its test
dependencies; here a stand-in checkout holds only the module it changes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import run_torchtitan_suite as runner


def _checkout(tmp_path: Path, text: str) -> Path:
    package = tmp_path / "torchtitan" / "distributed"
    package.mkdir(parents=True)
    for folder in (package, package.parent):
        (folder / "__init__.py").write_text("")
    (package / "parallel_dims.py").write_text(text)
    return tmp_path


def test_the_overlay_loads_the_changed_module_under_its_own_name(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path, f"# torchtitan's module\n{runner.ANCHOR}X = 1\n")
    original = (checkout / "torchtitan/distributed/parallel_dims.py").read_text()
    overlay = runner.dropin_overlay(checkout)
    env = runner.environment(overlay)
    runner.check_dropin(checkout, env)  # raises if it did not take
    probe = "import torchtitan.distributed.parallel_dims as m; print(m.X, m.__name__)"
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.split() == ["1", "torchtitan.distributed.parallel_dims"]
    # The original file is left as it was; nothing is written into fmesh's repository.
    assert (checkout / "torchtitan/distributed/parallel_dims.py").read_text() == original
    assert overlay.parent == checkout


def test_a_module_without_torchs_import_is_refused(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path, "from torch.distributed import init_device_mesh\n")
    with pytest.raises(SystemExit, match="import not found"):
        runner.dropin_overlay(checkout)
