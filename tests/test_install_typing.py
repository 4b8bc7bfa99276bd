"""A user's ``mypy --strict`` sees fmesh's types after installing it (PEP 561).

tests/test_typing.py checks the types from inside the repository, with the project's
configuration; that cannot see how fmesh is *installed*. These tests run mypy the way a
user does: on their own script in a directory outside the repository, with no
configuration, no ``MYPYPATH`` and no ``PYTHONPATH``, against

* the fmesh installed in the interpreter running the suite (CI and the README install it
  with ``pip install -e ".[test]"``: an editable install, which must be path-based --
  setuptools' import hook for this layout hides fmesh from mypy), and
* a wheel built from this checkout and installed into a fresh environment.

Neither can pass vacuously: the script reveals fmesh's own types and a second script
must get an ``arg-type`` error from fmesh's signature, which a missing or untyped module
(``Any``) would not give; and the wheel copy without its ``py.typed`` must be rejected,
so mypy read the wheel's copy and accepted it because of the marker.
"""

from __future__ import annotations

import os
import re
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from _installed import install_wheel

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 600

APP = """\
import fmesh
from fmesh.device_mesh import init_device_mesh

mesh: fmesh.Mesh = fmesh.make_mesh({"dp": 2, "tp": 4})
coordinate: tuple[int, ...] | None = fmesh.coordinate(mesh, 5)
reveal_type(mesh)
reveal_type(init_device_mesh)
"""
WRONG = """\
import fmesh

fmesh.slice(fmesh.make_mesh({"dp": 2}), 3)
"""
REVEALED = (
    re.compile(r'^app\.py:6: note: Revealed type is "fmesh\.[\w.]*Mesh"$', re.M),
    re.compile(
        r'^app\.py:7: note: Revealed type is "def \(.*\) -> torch\.[\w.]*DeviceMesh"$', re.M
    ),
)
"""fmesh's own class, and torch's DeviceMesh through fmesh.device_mesh: not ``Any``."""
WRONG_CALL = (
    'wrong.py:3: error: Argument 2 to "slice" has incompatible type "int"; '
    'expected "str"  [arg-type]'
)


def _env() -> dict[str, str]:
    """The environment without anything that would point mypy or Python at fmesh."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}


def _mypy(workdir: Path, python: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """``mypy --strict app.py wrong.py`` in ``workdir`` for ``python``'s packages."""
    (workdir / "app.py").write_text(APP)
    (workdir / "wrong.py").write_text(WRONG)
    cmd = [
        sys.executable, "-m", "mypy", "--strict", "--python-executable", python,
        "--cache-dir", str(cache), "--no-pretty", "app.py", "wrong.py",
    ]  # fmt: skip
    return subprocess.run(
        cmd, cwd=workdir, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S
    )


def _check_types_seen(done: subprocess.CompletedProcess[str]) -> None:
    output = done.stdout + done.stderr
    assert done.returncode == 1, output  # 1: type errors (wrong.py's); 2: mypy failed
    for pattern in REVEALED:
        assert pattern.search(done.stdout), output
    errors = [line for line in done.stdout.splitlines() if ": error: " in line]
    assert errors == [WRONG_CALL], output  # app.py is clean; the wrong call is caught


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for the module: torch is analysed once, not per run."""
    return tmp_path_factory.mktemp("mypy-cache")


def test_mypy_sees_the_installed_fmesh(tmp_path: Path, cache: Path) -> None:
    where = subprocess.run(
        [sys.executable, "-c", "import fmesh; print(fmesh.__file__)"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert where.returncode == 0, (
        "fmesh is not installed in this interpreter; install it as the README says, "
        'pip install -e ".[test]"\n' + where.stderr
    )
    if not Path(where.stdout.strip()).resolve().is_relative_to(ROOT / "fmesh"):
        # Another worktree's install (this one is on PYTHONPATH only): not this
        # checkout's packaging to judge. CI installs the checkout it tests.
        pytest.skip(
            f"the installed fmesh is another checkout ({where.stdout.strip()}); "
            f'run pip install -e ".[test]" in {ROOT}'
        )
    _check_types_seen(_mypy(tmp_path, sys.executable, cache))


def _fresh_env(path: Path) -> tuple[str, Path]:
    """A venv whose own site-packages is empty and which also sees this interpreter's
    (torch, numpy, attrs) through a ``.pth`` of plain paths: their own ``.pth`` files,
    such as an editable install of fmesh, are not processed."""
    venv.create(path, with_pip=False)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True, timeout=TIMEOUT_S,
    ).stdout.strip()  # fmt: skip
    ours = [*site.getsitepackages(), sysconfig.get_path("purelib")]
    Path(purelib, "outer.pth").write_text("\n".join(dict.fromkeys(ours)) + "\n")
    return str(python), Path(purelib)


def test_mypy_sees_fmesh_installed_from_a_wheel(tmp_path: Path, cache: Path) -> None:
    pytest.importorskip("hatchling", reason='the build backend: pip install -e ".[test]"')
    wheels = tmp_path / "wheels"
    build = [
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
        "--no-index", "-q", "-w", str(wheels), str(ROOT),
    ]  # fmt: skip
    done = subprocess.run(build, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = wheels.glob("fmesh-*.whl")

    python, purelib = _fresh_env(tmp_path / "venv")
    install_wheel(wheel, purelib, TIMEOUT_S)
    marker = purelib / "fmesh" / "py.typed"
    assert marker.is_file()
    assert (purelib / "fmesh" / "device_mesh.py").is_file()

    work = tmp_path / "app"
    work.mkdir()
    _check_types_seen(_mypy(work, python, cache))

    # The control: the same copy without its marker is an untyped package to mypy.
    marker.unlink()
    done = _mypy(work, python, cache)
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'app.py:1: error: Skipping analyzing "fmesh": module is installed, but missing' in (
        done.stdout
    ), done.stdout + done.stderr
