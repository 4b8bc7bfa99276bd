"""Run torchtitan's ParallelDims tests on plain torch and through fmesh's one-import change.

Usage (torchtitan is not part of fmesh; keep its checkout outside the repository)::

    PYTHONPATH=/path/to/fmesh python tests/run_torchtitan_suite.py /path/to/torchtitan

It runs torchtitan's ``tests/unit_tests/test_parallel_dims.py`` twice with pytest, from
the checkout's root: as it is, and with ``torchtitan/distributed/parallel_dims.py``
changed by one line, ``from fmesh.device_mesh import init_device_mesh`` after torch's
import, so ``ParallelDims.build_mesh`` gets its world mesh from fmesh and every
``_unflatten``, ``_flatten`` and slice after it runs on that mesh. The changed module
is written next to the original (``parallel_dims_fmesh.py``) and loaded under the
original name by a ``sitecustomize.py`` in ``<checkout>/.fmesh-dropin/``, first on
``PYTHONPATH`` for this run only, so the ranks the tests spawn load it too; the
original file is left as it is. It prints the pass counts and every test that passes
on plain torch but not through fmesh; exit status 1 if there is one. pytest's output
goes to ``<checkout>/.fmesh-dropin/{plain,fmesh}.log``.

torchtitan (checked at commit b5bcd76c6) needs, besides torch and pytest: spmd-types
(it pins 0.2.3), tyro, expecttest and triton (imported by a module the test imports;
nothing runs on a GPU). Installed with torch 2.13.0+cpu kept as it is (``--no-deps``
for the packages that would pull in another torch)::

    python3 -m venv --system-site-packages /tmp/titan-venv
    /tmp/titan-venv/bin/pip install --no-deps spmd-types==0.2.3 expecttest==0.3.0 \\
        triton==3.9.0
    /tmp/titan-venv/bin/pip install tyro==1.0.17
    /tmp/titan-venv/bin/python -c 'import torch; print(torch.__version__)'  # 2.13.0+cpu

then run this script with ``/tmp/titan-venv/bin/python``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from run_torch_suite import outcomes

ROOT = Path(__file__).resolve().parent.parent
SUITE = Path("tests/unit_tests/test_parallel_dims.py")
MODULE = "torchtitan.distributed.parallel_dims"
SOURCE = Path("torchtitan/distributed/parallel_dims.py")
ANCHOR = "from torch.distributed.device_mesh import DeviceMesh, init_device_mesh\n"
DROPIN = "from fmesh.device_mesh import init_device_mesh  # the one-import change\n"
OVERLAY = ".fmesh-dropin"
SITECUSTOMIZE = '''\
"""Written by fmesh's tests/run_torchtitan_suite.py: load {module} from {path}."""

import importlib.abc
import importlib.util
import sys


class _DropIn(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != {module!r}:
            return None
        return importlib.util.spec_from_file_location(fullname, {path!r})


sys.meta_path.insert(0, _DropIn())
'''


def dropin_overlay(checkout: Path) -> Path:
    """Write the changed module and the overlay that loads it; the overlay's folder."""
    source = checkout / SOURCE
    text = source.read_text()
    if text.count(ANCHOR) != 1:
        raise SystemExit(f"{source}: torch's init_device_mesh import not found ({ANCHOR!r})")
    patched = source.with_name(source.stem + "_fmesh.py")
    patched.write_text(text.replace(ANCHOR, ANCHOR + DROPIN))
    overlay = checkout / OVERLAY
    overlay.mkdir(exist_ok=True)
    (overlay / "sitecustomize.py").write_text(
        SITECUSTOMIZE.format(module=MODULE, path=str(patched))
    )
    return overlay


def environment(*first: Path) -> dict[str, str]:
    """This environment with ``first`` and fmesh's root in front of ``PYTHONPATH``."""
    paths = [*map(str, first), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))


def check_dropin(checkout: Path, env: dict[str, str]) -> None:
    """Stop unless the overlay really hands torchtitan fmesh's ``init_device_mesh``."""
    probe = f"import {MODULE} as m; print(m.init_device_mesh.__module__, m.__file__)"
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not proc.stdout.startswith("fmesh."):
        raise SystemExit(f"the one-import change did not take:\n{proc.stdout}{proc.stderr}")


def run(checkout: Path, env: dict[str, str], log: Path) -> dict[str, str]:
    """Each test's outcome (PASSED, FAILED, SKIPPED, ERROR) by its name."""
    found = outcomes([str(SUITE)], checkout, env, log)
    if not found:
        raise SystemExit(f"pytest ran no test (see {log})")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    checkout = Path(argv[0]).resolve()
    if not (checkout / SUITE).is_file():
        raise SystemExit(f"{checkout}: no {SUITE} (give the root of a torchtitan checkout)")
    overlay = dropin_overlay(checkout)
    plain = run(checkout, environment(), overlay / "plain.log")
    env = environment(overlay)
    check_dropin(checkout, env)
    dropin = run(checkout, env, overlay / "fmesh.log")
    for name, results in (("plain torch", plain), ("fmesh one-import", dropin)):
        counts = {
            k: sum(v == k for v in results.values())
            for k in ("PASSED", "FAILED", "ERROR", "SKIPPED")
        }
        print(
            f"{name}: {counts['PASSED']} passed, {counts['FAILED'] + counts['ERROR']} "
            f"failed, {counts['SKIPPED']} skipped"
        )
    lost = sorted(t for t, r in plain.items() if r == "PASSED" and dropin.get(t) != "PASSED")
    for test in lost:
        print(f"passes on plain torch only: {test} ({dropin.get(test, 'not run')})")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
