"""The drop-in for a whole process, with no line of the trainer changed.

``route()`` makes torch's own ``init_device_mesh`` call fmesh's drop-in: the function
object itself runs fmesh's code (``_compat/swap.py`` says why it is the function and
not the module attributes), so every module that holds it, imported before or after,
gets fmesh's meshes. torch's DeviceMesh methods on those meshes go through fmesh as
they do for the one-import drop-in (``_compat/hook.py``, installed with the first
mesh). ``python -m fmesh.route SCRIPT`` (or ``-m MODULE``) routes, then runs the
script with runpy as Python would run it.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Callable
from types import TracebackType

from .._compat.swap import route_init_device_mesh, unroute_init_device_mesh
from .dropin import init_device_mesh

__all__ = ["main", "route", "unroute"]

USAGE = """\
usage: python -m fmesh.route SCRIPT [ARG ...]
       python -m fmesh.route -m MODULE [ARG ...]
       torchrun [TORCHRUN ARGS] -m fmesh.route SCRIPT [ARG ...]

Run SCRIPT (or MODULE, as `python -m` runs it) with torch's init_device_mesh and
DeviceMesh methods routed through fmesh for the whole process: the one-import
drop-in (`from fmesh.device_mesh import init_device_mesh`) with no line changed.
"""


def route() -> None:
    """Route torch's own ``init_device_mesh`` through fmesh for the whole process.

    After it, torch's ``init_device_mesh`` (``torch.distributed.device_mesh``'s, and
    the same function wherever it is held: ``from ... import`` done before or after,
    ``torch.distributed.init_device_mesh``, libraries, registries) behaves exactly as
    [`fmesh.device_mesh.init_device_mesh`][fmesh.device_mesh.init_device_mesh], and
    torch's DeviceMesh methods on its meshes go through fmesh. Calling it again
    changes nothing. ``python -m fmesh.route SCRIPT`` calls it before the script.

    Raises:
        RuntimeError: this torch's ``init_device_mesh`` is not a plain Python function
            (fmesh cannot route it in place; the one-import drop-in still works).

    Example, one rank of a dry run on the fake backend:

    >>> import torch.distributed as dist
    >>> import fmesh
    >>> from fmesh.device_mesh import route, unroute
    >>> from torch.distributed.device_mesh import init_device_mesh
    >>> route()
    >>> fmesh.init_fake_world(8, 5)
    >>> dm = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
    >>> fmesh.cache_stats().created  # fmesh made its groups
    2
    >>> unroute(); fmesh.destroy(); dist.destroy_process_group()
    """
    route_init_device_mesh(init_device_mesh)


def unroute() -> None:
    """Undo [`route`][fmesh.device_mesh.route]: torch's ``init_device_mesh`` runs
    torch's own code again (the same function object, its code, defaults and
    attributes restored). Meshes made while routed keep fmesh's groups, and torch's
    methods on them still go through fmesh. Without a route before, it does nothing.

    Raises:
        RuntimeError: another library replaced the code of torch's ``init_device_mesh``
            after ``route()`` (fmesh leaves it as it is).
    """
    unroute_init_device_mesh()


def main(argv: list[str]) -> int:
    """``python -m fmesh.route``: route, then run the script or module; the exit
    status (the script's own ``sys.exit`` passes through as ``SystemExit``)."""
    if not argv or argv[0] in ("-h", "--help"):
        (sys.stdout if argv else sys.stderr).write(USAGE)
        return 0 if argv else 2
    first, rest = argv[0], argv[1:]
    if first.startswith("-m"):  # -m MODULE or -mMODULE, as python takes it
        module = first[2:] or (rest.pop(0) if rest else "")
        if not module:
            return _usage_error("-m needs a module name, e.g. -m package.train")
        return _run(
            lambda: runpy.run_module(module, run_name="__main__", alter_sys=True),
            [module, *rest],
        )
    if first.startswith("-"):
        return _usage_error(
            f"unknown option {first!r}: options go to torchrun or python before "
            "`-m fmesh.route`, the script's own after the script"
        )
    path = os.path.abspath(first)
    if not os.path.isfile(path):
        sys.stderr.write(
            f"python -m fmesh.route: can't open file {path!r}: [Errno 2] No such file\n"
        )
        return 2
    if not sys.flags.safe_path:  # as `python SCRIPT`: the script's folder first
        sys.path[:1] = [os.path.dirname(os.path.realpath(path))]
    return _run(lambda: runpy.run_path(path, run_name="__main__"), [first, *rest])


def _usage_error(message: str) -> int:
    sys.stderr.write(f"python -m fmesh.route: {message}\n{USAGE}")
    return 2


def _run(run: Callable[[], object], argv: list[str]) -> int:
    """Route, set ``sys.argv`` and run; an exception the script raised is printed as
    Python prints it, without this runner's frames (exit status 1)."""
    route()
    sys.argv = argv  # runpy sets argv[0] to the script's (or module's) path
    try:
        run()
    except (SystemExit, KeyboardInterrupt):
        raise  # Python's own exit and interrupt handling
    except BaseException as err:
        tb = _script_frames(err.__traceback__)
        if tb is None:  # raised before any code of the script ran (runpy's own error)
            sys.stderr.write(f"python -m fmesh.route: {err}\n")
        else:  # Python prints the exception's own traceback: set it too
            sys.excepthook(type(err), err.with_traceback(tb), tb)
        return 1
    return 0


def _script_frames(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` from the script's first frame on (this module's and runpy's dropped)."""
    while tb is not None and tb.tb_frame.f_globals.get("__name__") in (__name__, "runpy"):
        tb = tb.tb_next
    return tb
