"""The processes a routed job starts itself are routed too (issue 42, item 3).

``python -m fmesh.route`` and ``route()`` set ``FMESH_ROUTE=1``, which child processes
inherit, and ``fmesh-route.pth`` (installed with fmesh, editable or from a wheel) routes
every interpreter that starts with it, as torch is imported. Checked here:

* the ``.pth`` line: installed in this interpreter and in a wheel, one line, free of
  imports and cheap without the variable; with it, one finder and still no import
  until torch's;
* a ``subprocess`` run of ``sys.executable`` from a routed script is routed, not after
  ``unroute()``, again after ``route()``;
* ``torch.multiprocessing.spawn``'s ranks (2 gloo ranks) build fmesh's meshes, with no
  torch ``new_group`` call, and torch's own on the same script run plainly.

Lightning's launcher, with a training run, is in test_route_clients.py.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
from _installed import PTH, install_wheel, route_pth

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240


def _env(**extra: str) -> dict[str, str]:
    """This environment with the checkout first on ``PYTHONPATH``, no GPU and no
    ``FMESH_ROUTE`` of its own."""
    env = {k: v for k, v in os.environ.items() if k != "FMESH_ROUTE"}
    env.update(CUDA_VISIBLE_DEVICES="", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _python(*args: str, cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=_env(**extra),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def installed() -> Path:
    """The ``.pth`` this interpreter runs at startup (this checkout's install)."""
    return route_pth()


CHECK_LINE = """\
import os, site, sys, timeit
pth = sys.argv[1]
line = compile(open(pth).read(), "pth", "exec")
finders, modules = list(sys.meta_path), set(sys.modules)
unset_us = timeit.timeit(lambda: exec(line), number=20000) / 20000 * 1e6
# What site does with the file at startup: read it, compile the line, run it.
read = lambda: site.addpackage(os.path.dirname(pth), os.path.basename(pth), set())
site_us = timeit.timeit(read, number=1000) / 1000 * 1e6
unset_changed = [sys.meta_path != finders, sorted(set(sys.modules) - modules)]
os.environ["FMESH_ROUTE"] = "1"
exec(line)
exec(line)  # site may read a .pth twice: still one finder
added = [type(f).__name__ for f in sys.meta_path if f not in finders]
before_torch = sorted(m for m in set(sys.modules) - modules if m.split(".")[0] == "fmesh")
import torch.distributed.device_mesh
from fmesh._compat import swap
print(repr((unset_us, site_us, unset_changed, added, before_torch, swap.routed())))
"""


def test_the_pth_line_is_installed_and_costs_one_lookup_when_unset(
    installed: Path, tmp_path: Path
) -> None:
    text = installed.read_text()
    assert text == (ROOT / PTH).read_text() and len(text.splitlines()) == 1
    assert text.startswith("import os, sys; os.environ.get('FMESH_ROUTE') == '1' and ")
    (tmp_path / "check.py").write_text(CHECK_LINE)
    proc = _python("check.py", str(installed), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    unset_us, site_us, unset_changed, added, before_torch, routed = eval(proc.stdout)
    # Unset: no finder, no import; the line runs in the time of a dict lookup (2-3 us
    # on a 2-core machine under load), and site reads, compiles and runs the file in
    # about 60 us (setuptools' distutils-precedence.pth: about 80 us), against about
    # 11 ms for `python -c pass`. The bounds leave room for slower machines.
    assert unset_changed == [False, []]
    assert unset_us < 50 and site_us < 1000, (unset_us, site_us)
    # Set: one finder, nothing of fmesh imported until torch is; then routed.
    assert added == ["RouteOnTorchImport"] and before_torch == [] and routed


def test_a_wheel_installs_the_pth(installed: Path, tmp_path: Path) -> None:
    pytest.importorskip("hatchling", reason='the build backend: pip install -e ".[test]"')
    build = [
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
        "--no-index", "-q", "-w", str(tmp_path / "wheels"), str(ROOT),
    ]  # fmt: skip
    done = subprocess.run(build, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "wheels").glob("fmesh-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(PTH).decode() == installed.read_text()
        (record,) = (n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        assert f"{PTH}," in archive.read(record).decode()  # pip uninstall removes it

    # A fresh environment with only the wheel's fmesh (torch from this one's paths,
    # whose .pth files, an editable fmesh's among them, are not read there).
    venv.create(tmp_path / "venv", with_pip=False)
    python = str(tmp_path / "venv" / "bin" / "python")
    ask = [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
    purelib = Path(subprocess.check_output(ask, text=True, timeout=TIMEOUT_S).strip())
    outer = [*site.getsitepackages(), sysconfig.get_path("purelib")]
    (purelib / "outer.pth").write_text("\n".join(dict.fromkeys(outer)) + "\n")
    install_wheel(wheel, purelib, TIMEOUT_S)
    probe = (
        "import torch.distributed.device_mesh, fmesh; from fmesh._compat import swap; "
        "print(fmesh.__file__, swap.routed())"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FMESH_ROUTE")}
    for value, routed in ((None, "False"), ("1", "True")):
        run_env = env if value is None else dict(env, FMESH_ROUTE=value)
        done = subprocess.run(
            [python, "-c", probe], cwd=tmp_path, env=run_env,
            capture_output=True, text=True, timeout=TIMEOUT_S,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [str(purelib / "fmesh" / "__init__.py"), routed]


PARENT = """\
import json, subprocess, sys


def child():
    done = subprocess.run([sys.executable, "child.py"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


import torch.distributed.device_mesh  # routed here, by python -m fmesh.route

from fmesh.device_mesh import route, unroute

facts = {"routed": child()}
unroute()
facts["after unroute()"] = child()
route()
facts["after route()"] = child()
print(json.dumps(facts))
"""

CHILD = """\
import json, sys

fmesh_at_start = [m for m in sys.modules if m.split(".")[0] == "fmesh"]
from torch.distributed.device_mesh import init_device_mesh

import fmesh

fmesh.init_fake_world(8, 5)  # one rank of a dry run
mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
print(json.dumps([fmesh_at_start, mesh.get_coordinate(), fmesh.cache_stats().created]))
"""


def test_subprocess_runs_of_python_are_routed_until_unroute(
    installed: Path, tmp_path: Path
) -> None:
    (tmp_path / "parent.py").write_text(PARENT)
    (tmp_path / "child.py").write_text(CHILD)
    proc = _python("-m", "fmesh.route", "parent.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)
    # fmesh made the child's 2 groups where it was routed; torch made them after
    # unroute() (the child inherited no FMESH_ROUTE). Nothing of fmesh at startup.
    assert facts == {
        "routed": [[], [1, 1], 2],
        "after unroute()": [[], [1, 1], 0],
        "after route()": [[], [1, 1], 2],
    }


SPAWN = """\
import json, sys
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed import device_mesh, distributed_c10d
from torch.distributed.device_mesh import init_device_mesh


def rank_main(rank, folder):
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2
    )
    calls = [0]
    torch_new_group = distributed_c10d.new_group

    def counting(*args, **kwargs):
        calls[0] += 1
        return torch_new_group(*args, **kwargs)

    # torch's DeviceMesh calls the name it imported from distributed_c10d.
    distributed_c10d.new_group = dist.new_group = device_mesh.new_group = counting
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))
    from fmesh._compat.hook import space_of  # only to tell who made the mesh

    facts = {
        "dp": dist.get_process_group_ranks(mesh.get_group("dp")),
        "coordinate": mesh.get_coordinate(),
        "new_group": calls[0],
        "fmesh_made": space_of(mesh._rank_map) is not None,
    }
    Path(folder, f"rank{rank}.json").write_text(json.dumps(facts))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(rank_main, args=(sys.argv[1],), nprocs=2)
"""


def test_torch_multiprocessing_spawn_ranks_are_routed(installed: Path, tmp_path: Path) -> None:
    (tmp_path / "spawn.py").write_text(SPAWN)
    runs = {}
    for name, runner in (("routed", ["-m", "fmesh.route"]), ("plain", [])):
        out = tmp_path / name
        out.mkdir()
        proc = _python(*runner, "spawn.py", str(out), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        runs[name] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, (ours, theirs) in enumerate(zip(runs["routed"], runs["plain"], strict=True)):
        assert ours["dp"] == theirs["dp"] == [0, 1]
        assert ours["coordinate"] == theirs["coordinate"] == [rank, 0]
        # Routed, fmesh made the mesh and torch's new_group never ran; plainly,
        # torch made its own (its size-1 tp groups at least).
        assert (ours["fmesh_made"], ours["new_group"]) == (True, 0), rank
        assert not theirs["fmesh_made"] and theirs["new_group"] > 0, rank
