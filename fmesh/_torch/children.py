"""Routing carried into the processes a routed job starts itself.

A routed job often starts its own ranks: Lightning's launcher runs ``python train.py``
again for ranks 1..N-1, ``torch.multiprocessing.spawn`` starts fresh interpreters, a
script runs ``subprocess.run([sys.executable, ...])``. Those interpreters did not run
``route()``. fmesh follows coverage.py's way of reaching them: the routed process sets
an environment variable, ``FMESH_ROUTE=1``, which its children inherit, and the
``fmesh-route.pth`` file installed with fmesh (in site-packages, by ``pip install``
and ``pip install -e`` alike) runs one line at every interpreter start:

    import os, sys; os.environ.get('FMESH_ROUTE') == '1' and exec("...")

With the variable unset that is one dict lookup and nothing is imported (the rest of
the line is a string, compiled only when the variable is set). Set, it puts a
finder (one: site may read a ``.pth`` twice) first on ``sys.meta_path`` that answers
only for ``torch``, by calling ``find_spec`` below: fmesh is imported when torch is,
and torch's ``init_device_mesh`` is routed as soon as torch's top-level module has run,
before any code can call it. Nothing is imported at startup, so a script that sets
environment variables before importing torch (or numpy) has them applied, as it
would without fmesh.

``python -m fmesh.route`` uses the same finder in its own process, and ``route()`` /
``unroute()`` set and clear the variable, so ``unroute()`` stops routing the processes
started after it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["ENV", "RouteOnTorchImport", "carry", "drop", "find_spec", "route_on_torch_import"]

ENV = "FMESH_ROUTE"
"""The variable children inherit: ``1`` routes every Python process started with it
(where fmesh is installed)."""

_finding = False
"""True while ``find_spec`` asks the other finders for torch (they ask it too)."""


def carry() -> None:
    """Route the Python processes started from now on (the variable, inherited)."""
    os.environ[ENV] = "1"


def drop() -> None:
    """Stop routing the Python processes started from now on."""
    os.environ.pop(ENV, None)


def route_on_torch_import() -> None:
    """Route this process when torch is imported (at once if it is already)."""
    if "torch" in sys.modules:
        _route()
    elif all(type(f).__name__ != "RouteOnTorchImport" for f in sys.meta_path):
        sys.meta_path.insert(0, RouteOnTorchImport())  # unless the .pth put one there


def find_spec(
    name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
) -> ModuleSpec | None:
    """The import hook: for ``torch`` while the variable says so, torch's own spec,
    whose module routes this process once it has run; ``None`` (ask the next finder)
    for every other module."""
    global _finding
    if name != "torch" or _finding or os.environ.get(ENV) != "1":
        return None
    _finding = True
    try:
        spec = importlib.util.find_spec(name)  # the finders after this one
    finally:
        _finding = False
    if spec is None or spec.loader is None:
        return None
    loader = spec.loader
    run = loader.exec_module

    def exec_module(module: ModuleType) -> None:
        # Only for this import: the loader is torch's own and stays in its spec.
        del vars(loader)["exec_module"]
        run(module)
        _route()

    # An attribute of this loader object alone (its class is untouched).
    vars(loader)["exec_module"] = exec_module
    return spec


class RouteOnTorchImport(importlib.abc.MetaPathFinder):
    """``find_spec`` as a finder object, for ``sys.meta_path``."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        return find_spec(fullname, path, target)


def _route() -> None:
    """Route torch's ``init_device_mesh`` through ``_first_call``: torch may have been
    imported by one of fmesh's own modules, still importing, so the drop-in is imported
    at the first call."""
    from .._compat.swap import route_init_device_mesh

    route_init_device_mesh(_first_call)


def _first_call(*args: Any, **kwargs: Any) -> Any:
    """The drop-in, the target from now on (as ``route()`` makes it)."""
    from .._compat.swap import route_init_device_mesh
    from .dropin import init_device_mesh

    route_init_device_mesh(init_device_mesh)
    return init_device_mesh(*args, **kwargs)
