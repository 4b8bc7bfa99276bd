"""Run torch's own DeviceMesh tests on plain torch and with fmesh's ``init_device_mesh``.

Usage (torch's test file is not part of fmesh; keep it outside the repository)::

    python tests/run_torch_suite.py /path/to/test/distributed/test_device_mesh.py

It writes ``<name>_dropin.py`` next to the given file -- the same file with one line
added after torch's import, ``from fmesh.device_mesh import init_device_mesh``, so
every test (and every rank it spawns) calls fmesh's -- runs both with pytest (needs
``expecttest``), and prints the pass counts and every test that passes on plain torch
but not with the drop-in. Exit status 1 if there is one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANCHOR = (
    "from torch.distributed.device_mesh import _mesh_resources, DeviceMesh, init_device_mesh\n"
)
DROPIN = "from fmesh.device_mesh import init_device_mesh  # the drop-in\n"


def dropin_copy(path: Path) -> Path:
    text = path.read_text()
    if ANCHOR not in text:
        raise SystemExit(f"{path}: torch's init_device_mesh import not found ({ANCHOR!r})")
    out = path.with_name(path.stem + "_dropin.py")
    out.write_text(text.replace(ANCHOR, ANCHOR + DROPIN))
    return out


def outcomes(args: list[str], cwd: Path, env: dict[str, str], log: Path) -> dict[str, str]:
    """Run pytest with ``args`` in ``cwd``; each test's outcome (PASSED, FAILED,
    SKIPPED, ERROR) by its name. The whole output goes to ``log``."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "-q", "-rA", "-p", "no:cacheprovider"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    log.write_text(proc.stdout + proc.stderr)
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        match = re.match(r"(PASSED|FAILED|ERROR|SKIPPED) \S+?::(\S+)", line)
        if match:
            found[match.group(2)] = match.group(1)
    return found


def run(path: Path) -> dict[str, str]:
    """Each test's outcome in torch's test file ``path``, fmesh on the import path."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    return outcomes([path.name], path.parent, env, path.parent / f"{path.stem}.log")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    plain_file = Path(argv[0]).resolve()
    plain = run(plain_file)
    dropin = run(dropin_copy(plain_file))
    for name, results in (("plain torch", plain), ("fmesh drop-in", dropin)):
        counts = {
            k: sum(v == k for v in results.values()) for k in ("PASSED", "FAILED", "ERROR")
        }
        print(
            f"{name}: {counts['PASSED']} passed, {counts['FAILED'] + counts['ERROR']} failed"
        )
    if not any(r == "PASSED" for r in plain.values()):
        # A file that does not load (e.g. one written for another torch) runs nothing:
        # that is no evidence, so it must not read as a pass.
        print(f"no test passed on plain torch: see {plain_file.stem}.log")
        return 1
    lost = sorted(t for t, r in plain.items() if r == "PASSED" and dropin.get(t) != "PASSED")
    for test in lost:
        print(f"passes on plain torch only: {test} ({dropin.get(test, 'not run')})")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
