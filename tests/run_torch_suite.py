"""Run torch's own DeviceMesh tests on plain torch and with fmesh's ``init_device_mesh``.

Usage (torch's test file is not part of fmesh; keep it outside the repository)::

    python tests/run_torch_suite.py ../shared/conformance/torch_test_device_mesh.py
    python tests/run_torch_suite.py FILE -k "flatten or unflatten"   # a subset
    python tests/run_torch_suite.py FILE --dropin-only -k test_flatten_mesh_3d
    python tests/run_torch_suite.py FILE --route -k flatten   # routed, file unchanged

It copies the given file into a fresh temporary folder (the original may be
read-only) together with ``<name>_dropin.py`` -- the same file with one line added
after torch's import, ``from fmesh.device_mesh import init_device_mesh``, so every
test (and every rank it spawns) calls fmesh's -- runs the drop-in copy with pytest
(needs ``expecttest``; ``-k`` is pytest's), then plain torch's copy on the tests the
drop-in did not pass (only those can pass on plain torch alone; ``--full`` runs plain
torch on every test, for its counts), and prints the pass counts and every test that
passes on plain torch but not with the drop-in. Exit status 1 if there is one.
``--dropin-only`` runs the drop-in copy alone and fails on any test that does not
pass or skip. ``--route`` runs ``<name>_routed.py`` instead of the drop-in copy: the
file unchanged, with ``fmesh.device_mesh.route()`` called at the start of every
Python process of the run (pytest and each rank it spawns), by a ``sitecustomize.py``
first on ``PYTHONPATH`` for this run only (``python -m fmesh.route`` routes one
process; the ranks this file spawns are fresh interpreters). The pytest logs stay in
the temporary folder (``--logs`` names another).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANCHOR = (
    "from torch.distributed.device_mesh import _mesh_resources, DeviceMesh, init_device_mesh\n"
)
DROPIN = "from fmesh.device_mesh import init_device_mesh  # the drop-in\n"
ROUTE_SITE = '''"""Written by fmesh's tests/run_torch_suite.py --route: every Python process
of this run has torch's own init_device_mesh routed through fmesh, or ends (Python
would only warn of a failed sitecustomize, and the run would be plain torch's)."""

try:
    from fmesh.device_mesh import route

    route()
except BaseException:
    import os
    import traceback

    traceback.print_exc()
    os._exit(97)
'''


def copies(path: Path, folder: Path) -> tuple[Path, Path]:
    """Torch's file and its drop-in copy, written into ``folder``."""
    text = path.read_text()
    if ANCHOR not in text:
        raise SystemExit(f"{path}: torch's init_device_mesh import not found ({ANCHOR!r})")
    plain = folder / path.name
    plain.write_text(text)
    dropin = folder / (path.stem + "_dropin.py")
    dropin.write_text(text.replace(ANCHOR, ANCHOR + DROPIN))
    return plain, dropin


def routed_copy(path: Path, folder: Path) -> tuple[Path, Path]:
    """Torch's file unchanged as ``<name>_routed.py``, and the folder whose
    ``sitecustomize.py`` routes every process started with it on ``PYTHONPATH``."""
    routed = folder / (path.stem + "_routed.py")
    routed.write_text(path.read_text())
    overlay = folder / "route"
    overlay.mkdir(exist_ok=True)
    (overlay / "sitecustomize.py").write_text(ROUTE_SITE)
    return routed, overlay


def outcomes(args: list[str], cwd: Path, env: dict[str, str], log: Path) -> dict[str, str]:
    """Run pytest with ``args`` in ``cwd``; each test's outcome (PASSED, FAILED,
    SKIPPED, ERROR) by its name. The whole output goes to ``log``."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "-v", "-rA", "-p", "no:cacheprovider"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    log.write_text(proc.stdout + proc.stderr)
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        # -v's progress lines name every test, skipped ones too ("FILE::TEST SKIPPED");
        # -rA's summary names failed and passed ones ("FAILED FILE::TEST - why").
        match = re.match(r"\S+?::(\S+) (PASSED|FAILED|ERROR|SKIPPED)\b", line)
        if match:
            found.setdefault(match.group(1), match.group(2))
        match = re.match(r"(PASSED|FAILED|ERROR) \S+?::(\S+)", line)
        if match:
            found[match.group(2)] = match.group(1)
    return found


def run(
    path: Path,
    select: str | None = None,
    logs: Path | None = None,
    *first: Path,
    only: list[str] | None = None,
) -> dict[str, str]:
    """Each test's outcome in torch's test file ``path`` (those matching ``-k select``,
    or the tests named in ``only``, as ``Class::test``), ``first`` and fmesh on the
    import path; the log is ``<logs>/<name>.log``."""
    paths = [*map(str, first), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    env.setdefault("CUDA_VISIBLE_DEVICES", "")  # the file runs on CPU with gloo
    if only is not None:
        args = [f"{path.name}::{test}" for test in only]
    else:
        args = [path.name] + ([] if select is None else ["-k", select])
    log = (logs or path.parent) / f"{path.stem}.log"
    return outcomes(args, path.parent, env, log)


def _counts(name: str, results: dict[str, str]) -> str:
    n = {k: sum(v == k for v in results.values()) for k in ("PASSED", "FAILED", "ERROR")}
    skipped = sum(v == "SKIPPED" for v in results.values())
    failed = n["FAILED"] + n["ERROR"]
    return f"{name}: {n['PASSED']} passed, {failed} failed, {skipped} skipped"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description="torch's DeviceMesh tests, plain and with fmesh's init_device_mesh"
    )
    parser.add_argument("file", type=Path, help="torch's test_device_mesh.py")
    parser.add_argument("-k", dest="select", help="only tests matching (pytest's -k)")
    parser.add_argument("--dropin-only", action="store_true", help="run the drop-in copy only")
    parser.add_argument(
        "--route", action="store_true", help="fmesh.device_mesh.route() instead of the drop-in"
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="plain torch on every test, not only those the drop-in did not pass",
    )
    parser.add_argument("--logs", type=Path, help="folder for the pytest logs")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="fmesh_torch_suite_"))
    logs = args.logs.resolve() if args.logs else folder
    logs.mkdir(parents=True, exist_ok=True)
    try:
        plain_file, dropin_file = copies(args.file.resolve(), folder)
        if args.route:
            dropin_file, overlay = routed_copy(args.file.resolve(), folder)
            dropin = run(dropin_file, args.select, logs, overlay)
        else:
            dropin = run(dropin_file, args.select, logs)
        missed = sorted(t for t, r in dropin.items() if r != "PASSED")
        if args.dropin_only:
            plain = {}
        elif args.full or not dropin:
            plain = run(plain_file, args.select, logs)
        else:
            plain = run(plain_file, args.select, logs, only=missed) if missed else {}
    finally:
        if args.logs:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"logs: {logs}")
    mode = "fmesh routed" if args.route else "fmesh drop-in"
    with_mode = "routed" if args.route else "with the drop-in"
    if args.dropin_only:
        print(_counts(mode, dropin))
        bad = sorted(t for t, r in dropin.items() if r in ("FAILED", "ERROR"))
        for test in bad:
            print(f"fails {with_mode}: {test} ({dropin[test]})")
        if not dropin:
            print(f"no test ran: see {dropin_file.stem}.log")
        return 1 if bad or not dropin else 0
    for name, results in (("plain torch", plain), (mode, dropin)):
        print(_counts(name, results))
    if not args.full:
        print("(plain torch ran only the tests the drop-in did not pass; --full runs all)")
    if not any(r == "PASSED" for r in (*plain.values(), *dropin.values())):
        # A file that does not load (e.g. one written for another torch) runs nothing:
        # that is no evidence, so it must not read as a pass.
        print(f"no test passed: see {plain_file.stem}.log and {dropin_file.stem}.log")
        return 1
    for test in sorted(t for t, r in plain.items() if r in ("FAILED", "ERROR")):
        print(f"fails on plain torch too: {test} ({plain[test]})")
    lost = sorted(t for t, r in plain.items() if r == "PASSED" and dropin.get(t) != "PASSED")
    for test in lost:
        print(f"passes on plain torch only: {test} ({dropin.get(test, 'not run')})")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
