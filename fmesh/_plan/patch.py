"""torch's own ``init_device_mesh`` and DeviceMesh methods routed through fmesh, for
the duration of a plan, and torch restored afterwards (``init_process_group`` too,
which the plan's fake world stands in for, and ``split_group``, which it plays).
Every group torch itself makes meanwhile is reported to the rank's recorder
(``_compat/planning.py``), and real backends are played by the fake one.

A trainer that imported ``init_device_mesh`` from torch holds torch's function in its
own module (``from torch.distributed.device_mesh import init_device_mesh``), so
replacing the attribute of torch's module is not enough: every module attribute that
is torch's function is pointed at fmesh's drop-in, and back on exit. Modules imported
during the plan that picked up the drop-in are pointed back at torch's too.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["holders", "routed_torch"]

Slot = tuple[dict[str, Any], str]
"""A module's namespace and an attribute name in it."""


def holders(*values: object) -> dict[int, list[Slot]]:
    """Every module attribute that is one of ``values`` (by identity), by ``id`` of
    the value; one pass over every module."""
    wanted = {id(v): v for v in values}
    found: dict[int, list[Slot]] = {k: [] for k in wanted}
    for module in list(sys.modules.values()):
        if not isinstance(module, types.ModuleType):
            continue
        namespace = vars(module)
        for k, v in list(namespace.items()):
            if id(v) in wanted and v is wanted[id(v)]:
                found[id(v)].append((namespace, k))
    return found


@contextlib.contextmanager
def routed_torch() -> Iterator[bool]:
    """Route torch's DeviceMesh entry points through fmesh inside the block.

    ``init_device_mesh`` becomes fmesh's drop-in, and ``init_process_group`` returns
    at once while the plan's fake world is the default group (trainer code starts its
    own group before it builds meshes). Yields whether torch's own DeviceMesh methods
    (``_unflatten``, ``_flatten``, ``__getitem__``, ...) are routed too: not with
    ``FMESH_TORCH_HOOK=0``, nor on a torch outside the supported range (then they run
    as torch's, which on a fake world still works, only in O(world) per call).
    """
    import torch.distributed as dist
    import torch.distributed.device_mesh as torch_device_mesh

    from .._compat.hook import install, installed, uninstall
    from .._compat.planning import observing, planned_split_group
    from .._runtime.launch import play_backend
    from .._torch.dropin import init_device_mesh as dropin
    from .events import active

    original: Callable[..., Any] = torch_device_mesh.init_device_mesh
    if original is dropin:  # an outer plan routes already
        yield installed()
        return
    torch_init: Callable[..., Any] = dist.init_process_group
    torch_split: Callable[..., Any] = dist.split_group
    recorders = active()

    @functools.wraps(torch_init)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if dist.is_initialized() and dist.get_backend() == "fake":
            # The plan's fake world stands in for the job's default group; the
            # backend asked for is what a launch's calls would name.
            asked = kwargs.get("backend", args[0] if args else None)
            backend = "undefined" if not asked else str(dist.Backend(str(asked)))
            play_backend(backend)
            if recorders:
                recorders[-1].init_call(backend)
            return
        torch_init(*args, **kwargs)

    class _Observer:
        def torch_call(self, call: Any) -> None:
            if recorders:
                recorders[-1].torch_call(call)

        def dim_call(self, call: Any) -> None:
            if recorders:
                recorders[-1].dim_call(call)

    observer = _Observer()
    split_group = functools.wraps(torch_split)(planned_split_group(torch_split, observer))
    replacements = {
        id(original): dropin,
        id(torch_init): init_process_group,
        id(torch_split): split_group,
    }
    had_hook = installed()
    before = holders(original, torch_init, torch_split, dropin)
    own = {(id(ns), k) for ns, k in before.pop(id(dropin))}
    swapped = [
        (ns, k, v) for v in (original, torch_init, torch_split) for ns, k in before[id(v)]
    ]
    for namespace, key, value in swapped:
        namespace[key] = replacements[id(value)]
    try:
        with observing(observer):
            yield install()
    finally:
        for namespace, key, value in swapped:
            if namespace.get(key) is replacements[id(value)]:
                namespace[key] = value
        # Modules imported meanwhile picked up the replacements: point them back too.
        after = holders(dropin, init_process_group, split_group)
        for namespace, key in after[id(dropin)]:
            if (id(namespace), key) not in own:
                namespace[key] = original
        for namespace, key in after[id(init_process_group)]:
            namespace[key] = torch_init
        for namespace, key in after[id(split_group)]:
            namespace[key] = torch_split
        play_backend(None)
        if not had_hook:
            uninstall()
