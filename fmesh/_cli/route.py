"""``python -m fmesh.route``: run a script or module exactly as ``python`` runs it, with
torch's ``init_device_mesh`` routed through fmesh.

The runner routes nothing itself and imports no torch: it sets ``FMESH_ROUTE=1`` and
puts the finder of ``fmesh/_torch/children.py`` on ``sys.meta_path``, so the process
is routed when torch is imported, and so is every Python process it starts. Then it
runs the program as CPython's own ``main`` does:

* a script runs in a fresh ``__main__`` module that *is* ``sys.modules["__main__"]``
  (pickle finds its classes, in an ``atexit`` hook too), with the ``__file__``,
  ``__loader__`` (a ``SourceFileLoader``), ``__spec__`` and ``__package__`` (``None``)
  Python gives a script, its folder first on ``sys.path`` and ``sys.argv`` as given;
* a directory or zip file with a ``__main__.py``, and ``-m MODULE``, run through
  ``runpy._run_module_as_main``, the function CPython's ``main`` calls for them;
* an uncaught exception leaves as it leaves ``python``: Python prints it (through
  ``sys.excepthook``, with no frame of this runner) and exits with its status, 1, or
  by SIGINT for a ``KeyboardInterrupt``; a ``SyntaxError`` prints as Python prints it.
"""

from __future__ import annotations

import builtins
import os
import pkgutil
import runpy
import sys
from collections.abc import Callable
from importlib.machinery import SourceFileLoader, SourcelessFileLoader
from types import CodeType, ModuleType, TracebackType
from typing import Any

from .._torch.children import carry, route_on_torch_import

__all__ = ["main"]

USAGE = """\
usage: python -m fmesh.route SCRIPT [ARG ...]
       python -m fmesh.route -m MODULE [ARG ...]
       torchrun [TORCHRUN ARGS] -m fmesh.route SCRIPT [ARG ...]

Run SCRIPT (a file, or a directory or zip file with a __main__.py) or MODULE (as
`python -m` runs it) with torch's init_device_mesh and DeviceMesh methods routed
through fmesh for the whole process, and for the Python processes it starts: the
one-import drop-in (`from fmesh.device_mesh import init_device_mesh`) with no line
changed.
"""

_run_module_as_main: Callable[[str, bool], object] = vars(runpy)["_run_module_as_main"]
"""What CPython's ``main`` runs for ``python -m MODULE``, ``python DIR`` and ``python
ZIP`` (private to runpy, but called by name from C in every CPython since 2.7)."""


def main(argv: list[str]) -> int:
    """``python -m fmesh.route ARGS``: the exit status of a usage error, or 0 after the
    program ran; the program's own exits and exceptions leave as they leave ``python``."""
    if not argv or argv[0] in ("-h", "--help"):
        (sys.stdout if argv else sys.stderr).write(USAGE)
        return 0 if argv else 2
    first, rest = argv[0], argv[1:]
    if first.startswith("-m"):  # -m MODULE or -mMODULE, as python takes it
        module = first[2:] or (rest.pop(0) if rest else "")
        if not module:
            return _usage_error("-m needs a module name, e.g. -m package.train")
        _route()
        sys.argv = ["-m", *rest]  # python's argv[0] while it looks for the module
        _execute(_fresh_main(), module=module)
        return 0
    if first.startswith("-"):
        return _usage_error(
            f"unknown option {first!r}: options go to torchrun or python before "
            "`-m fmesh.route`, the script's own after the script"
        )
    _route()
    return _run_path(first, rest)


def _usage_error(message: str) -> int:
    sys.stderr.write(f"python -m fmesh.route: {message}\n{USAGE}")
    return 2


def _route() -> None:
    carry()
    route_on_torch_import()


def _fresh_main() -> ModuleType:
    """A ``__main__`` module as CPython makes it at startup, now ``sys.modules``'s."""
    module = ModuleType("__main__")
    vars(module).update(__annotations__={}, __builtins__=builtins)
    sys.modules["__main__"] = module
    return module


def _run_path(given: str, rest: list[str]) -> int:
    """``python PATH ARGS``: a directory or zip file runs its ``__main__``, any other
    path is a script."""
    path = os.path.abspath(given)
    sys.argv = [given, *rest]
    if pkgutil.get_importer(path) is not None:  # a directory or a zip file
        # python puts it first on sys.path, -P or not; `-m fmesh.route` put the
        # current folder there (unless -P), which python DIR does not.
        sys.path[: 0 if _safe_path() else 1] = [path]
        _execute(_fresh_main(), module="__main__")
        return 0
    try:
        with open(path, "rb") as file:
            source = file.read()
    except OSError as err:
        sys.stderr.write(
            f"{sys.orig_argv[0]}: can't open file {path!r}: [Errno {err.errno}] "
            f"{err.strerror}\n"
        )
        return 2
    if not _safe_path():  # the script's folder (symbolic links resolved)
        sys.path[0] = os.path.dirname(os.path.realpath(path))
    module = _fresh_main()
    loader: SourceFileLoader | SourcelessFileLoader
    if path.endswith(".pyc"):
        loader = SourcelessFileLoader("__main__", path)
    else:
        loader = SourceFileLoader("__main__", path)
    vars(module).update(__file__=path, __cached__=None, __loader__=loader)
    _execute(module, source=source)
    return 0


def _safe_path() -> bool:
    """``python -P`` (3.11+): no folder of the program was put first on ``sys.path``."""
    return bool(getattr(sys.flags, "safe_path", False))


def _execute(main: ModuleType, *, module: str = "", source: bytes = b"") -> None:
    """Run ``module`` as ``__main__`` (``runpy``, as python does for ``-m`` and
    directories), or compile and run a script's ``source`` in ``main``. The last
    frame of this runner: a traceback Python prints starts after it."""
    try:
        if module:
            _run_module_as_main(module, module != "__main__")
        else:
            loader = vars(main)["__loader__"]
            code: CodeType | None
            if isinstance(loader, SourcelessFileLoader):
                code = loader.get_code("__main__")
            else:
                code = compile(source, main.__file__ or "", "exec", dont_inherit=True)
            assert code is not None  # get_code raises where a .pyc file holds none
            exec(code, vars(main))
    except SystemExit:
        raise  # python's own exit status and message
    except BaseException:
        # Python prints it and picks the exit status (1, or SIGINT for a
        # KeyboardInterrupt); the hook it calls leaves this runner's frames out.
        sys.excepthook = _without_runner_frames(sys.excepthook)
        raise


def _without_runner_frames(hook: Callable[..., Any]) -> Callable[..., Any]:
    def excepthook(
        kind: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> Any:
        tb = _after_runner(tb)
        return hook(kind, value.with_traceback(tb), tb)

    return excepthook


def _after_runner(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` from the frame after this module's last one (the frames above the
    program: runpy's and this runner's)."""
    rest = tb
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__") == __name__:
            rest = tb.tb_next
        tb = tb.tb_next
    return rest
