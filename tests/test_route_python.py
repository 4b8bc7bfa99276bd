"""``python -m fmesh.route ARGS`` behaves as ``python ARGS``, routed.

Each case runs the same program both ways, as a user types it, and compares what
Python shows: the program's view of itself (``sys.argv``, ``sys.path[0]``,
``__file__``, ``__spec__``, ``__loader__``, ``__package__``, its globals, whether it
is ``sys.modules["__main__"]``), pickling a class of the script in an ``atexit`` hook,
stdout, stderr (tracebacks, a ``SyntaxError``, a ``KeyboardInterrupt``, Python's own
error messages) and the exit status, for a script, a directory and a zip file with a
``__main__.py``, and ``-m MODULE``. The one difference allowed: routed, torch's
``init_device_mesh`` is fmesh's once torch is imported (and torch is not imported
before the program imports it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """\
import atexit, json, pickle, sys

if __package__:  # run as a module (-m job.train)
    from . import helper
else:  # a script, a directory or a zip file: its place is first on sys.path
    import helper


class Point:
    pass


TORCH_AT_START = "torch" in sys.modules
atexit.register(lambda: print("atexit:", type(pickle.loads(pickle.dumps(Point()))).__name__))

if __name__ == "__main__":
    if sys.argv[1] == "exit":
        sys.exit(3)
    if sys.argv[1] == "raise":
        helper.fail()
    if sys.argv[1] == "interrupt":
        helper.interrupt()
    spec = __spec__
    facts = {
        "argv": sys.argv,
        "path0": sys.path[0],
        "file": __file__,
        "cached": __cached__,
        "package": __package__,
        "spec": None if spec is None else [spec.name, spec.origin, spec.parent],
        "loader": type(__loader__).__name__,
        "loader_name": getattr(__loader__, "name", None),
        "is_main": sys.modules["__main__"].__dict__ is globals(),
        "globals": sorted(globals()),
        "helper": helper.VALUE,
        "torch_at_start": TORCH_AT_START,
    }
    if sys.argv[1] == "torch":
        import torch.distributed.device_mesh

        from fmesh._compat import swap

        facts["routed"] = swap.routed()
    print(json.dumps(facts))
"""

HELPER = """\
VALUE = 7


def fail():
    raise ValueError("the script's own error")


def interrupt():
    raise KeyboardInterrupt
"""

BAD = """\
x = 1
def f(:
    pass
"""


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("FMESH_ROUTE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def _both(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], ...]:
    """``python ARGS`` and ``python -m fmesh.route ARGS``."""
    return _python(*args, cwd=cwd), _python("-m", "fmesh.route", *args, cwd=cwd)


def _same(args: tuple[str, ...], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Both runs print the same, exit the same; the routed run."""
    plain, routed = _both(*args, cwd=cwd)
    assert routed.stderr == plain.stderr, (args, routed.stderr, plain.stderr)
    assert routed.stdout == plain.stdout, (args, routed.stdout, plain.stdout)
    assert routed.returncode == plain.returncode, (args, routed.returncode, plain.returncode)
    return routed


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """``job/`` (a package with the script), ``app/`` and ``app.zip`` (the script as
    ``__main__.py``), ``bad.py`` (a syntax error); returns their folder."""
    job = tmp_path / "job"
    job.mkdir()
    for folder in (job, tmp_path / "app"):
        folder.mkdir(exist_ok=True)
        (folder / "helper.py").write_text(HELPER)
    (job / "__init__.py").write_text("")
    (job / "train.py").write_text(SCRIPT)
    (tmp_path / "app" / "__main__.py").write_text(SCRIPT)
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as archive:
        archive.writestr("__main__.py", SCRIPT)
        archive.writestr("helper.py", HELPER)
    (tmp_path / "bad.py").write_text(BAD)
    return tmp_path


def test_a_script_runs_as_python_runs_it_and_is_routed(work: Path) -> None:
    plain, routed = _both("job/train.py", "torch", "--flag", cwd=work)
    assert plain.returncode == routed.returncode == 0, routed.stderr
    ours, theirs = (json.loads(p.stdout.splitlines()[0]) for p in (routed, plain))
    assert (ours.pop("routed"), theirs.pop("routed")) == (True, False)
    assert ours == theirs
    script = str(work / "job" / "train.py")
    # What python gives a script (not what runpy.run_path gives).
    assert ours["argv"] == ["job/train.py", "torch", "--flag"]
    assert (ours["path0"], ours["file"], ours["cached"]) == (str(work / "job"), script, None)
    assert (ours["package"], ours["spec"]) == (None, None)
    assert (ours["loader"], ours["loader_name"]) == ("SourceFileLoader", "__main__")
    assert ours["is_main"] and not ours["torch_at_start"]
    # An atexit hook pickles a class the script defined: it is __main__'s.
    assert routed.stdout.splitlines()[1:] == ["atexit: Point"] == plain.stdout.splitlines()[1:]


@pytest.mark.parametrize(
    "target", ["app", "app.zip", "-mjob.train", "-m job.train", "-m app"], ids=str
)
def test_directories_zip_files_and_modules_run_as_python_runs_them(
    work: Path, target: str
) -> None:
    routed = _same((*target.split(), "ok"), cwd=work)
    facts = json.loads(routed.stdout.splitlines()[0])
    assert routed.stdout.splitlines()[1:] == ["atexit: Point"]
    assert facts["is_main"] and facts["spec"] is not None and facts["loader"] != "NoneType"
    if target.startswith("app"):  # python DIR and python ZIP: the __main__ module in it
        assert facts["argv"][0] == target and facts["path0"] == str(work / target)
        assert (facts["package"], facts["spec"][0]) == ("", "__main__")
    else:  # python -m: argv[0] is the module's file, the current folder first
        assert facts["argv"][0] == facts["file"] and facts["path0"] == str(work)
        assert facts["package"] == facts["spec"][2] != ""


@pytest.mark.parametrize(
    "args",
    [
        ("job/train.py", "exit"),
        ("job/train.py", "raise"),
        ("job/train.py", "interrupt"),
        ("-m", "job.train", "raise"),
        ("-m", "job.train", "interrupt"),
        ("app", "raise"),
        ("bad.py",),
        ("-m", "bad"),
        ("nosuch.py",),
        ("-m", "job.nosuch"),
        ("job",),  # a directory without __main__.py
    ],
    ids=" ".join,
)
def test_exits_and_errors_are_pythons(work: Path, args: tuple[str, ...]) -> None:
    routed = _same(args, cwd=work)
    err, case = routed.stderr, args[-1]
    assert str(ROOT / "fmesh") not in err, err  # no frame of the runner
    if case == "exit":
        assert routed.returncode == 3 and err == ""
    elif case in ("raise", "interrupt"):
        assert err.startswith("Traceback (most recent call last):\n"), err
        last = "ValueError: the script's own error" if case == "raise" else "KeyboardInterrupt"
        assert err.endswith(f"\n{last}\n"), err
        # python's exit status, and its death by SIGINT after an uncaught interrupt
        assert routed.returncode == (1 if case == "raise" else -signal.SIGINT)
        assert routed.stdout.splitlines()[-1] == "atexit: Point"
    elif case == "bad.py":  # no traceback: the error and where it is
        assert err.startswith(f'  File "{work / "bad.py"}", line 2\n'), err
        assert err.endswith("SyntaxError: invalid syntax\n") and routed.returncode == 1
    elif case == "bad":  # python -m shows runpy's frames, and the error
        assert err.startswith("Traceback (most recent call last):\n"), err
        assert err.endswith("SyntaxError: invalid syntax\n") and routed.returncode == 1
    elif case == "nosuch.py":
        assert routed.returncode == 2 and f"can't open file {str(work / 'nosuch.py')!r}" in err
    else:  # runpy's message, after python's name
        assert routed.returncode == 1 and err.startswith(f"{sys.executable}: "), err


def test_python_m_fmesh_route_says_how_to_call_it(tmp_path: Path) -> None:
    proc = _python("-m", "fmesh.route", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: python -m fmesh.route")
    proc = _python("-m", "fmesh.route", "--help", cwd=tmp_path)
    assert proc.returncode == 0 and "torchrun [TORCHRUN ARGS] -m fmesh.route" in proc.stdout
    proc = _python("-m", "fmesh.route", "--nproc-per-node", "2", "x.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert "unknown option '--nproc-per-node': options go to torchrun" in proc.stderr
    proc = _python("-m", "fmesh.route", "-m", cwd=tmp_path)
    assert proc.returncode == 2 and "-m needs a module name" in proc.stderr
