"""What the suite needs of fmesh's install: ``fmesh-route.pth`` in site-packages.

The processes a routed job starts are routed by that file (``pip install -e .`` and a
wheel install it), so the tests of them need it in the interpreter running the suite.
Where fmesh is installed from another checkout (this one on ``PYTHONPATH`` only), this
checkout's packaging is not what runs: those tests skip, as tests/test_install_typing.py
does.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PTH = "fmesh-route.pth"

__all__ = ["PTH", "install_wheel", "route_pth"]


def route_pth() -> Path:
    """The ``.pth`` this interpreter reads at startup; skips where fmesh is installed
    from another checkout, fails where this checkout's install lacks it."""
    where = subprocess.run(
        [sys.executable, "-c", "import fmesh; print(fmesh.__file__)"],
        cwd=ROOT.parent,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.strip()
    if not where or not Path(where).resolve().is_relative_to(ROOT / "fmesh"):
        pytest.skip(f'fmesh is not installed from this checkout: pip install -e "{ROOT}"')
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    found = [Path(d, PTH) for d in dirs if Path(d, PTH).is_file()]
    assert found, f"{PTH} is not in {dirs}: pip install -e . installs it (pyproject.toml)"
    return found[0]


def install_wheel(wheel: Path, purelib: Path, timeout: float) -> None:
    """pip-install ``wheel`` (no dependencies, no index) into the folder ``purelib``."""
    install = [
        sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
        "--target", str(purelib), str(wheel),
    ]  # fmt: skip
    done = subprocess.run(install, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
