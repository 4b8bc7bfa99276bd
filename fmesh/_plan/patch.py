"""torch's own ``init_device_mesh`` and DeviceMesh methods routed through fmesh, for
the duration of a plan, and torch restored afterwards.

A trainer that imported ``init_device_mesh`` from torch holds torch's function in its
own module (``from torch.distributed.device_mesh import init_device_mesh``), so
replacing the attribute of torch's module is not enough: every module attribute that
is torch's function is pointed at fmesh's drop-in, and back on exit. Modules imported
during the plan that picked up the drop-in are pointed back at torch's too.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["holders", "routed_torch"]

Slot = tuple[dict[str, Any], str]
"""A module's namespace and an attribute name in it."""


def holders(value: object) -> list[Slot]:
    """Every module attribute that is ``value`` (by identity)."""
    found: list[Slot] = []
    for module in list(sys.modules.values()):
        if not isinstance(module, types.ModuleType):
            continue
        namespace = vars(module)
        found.extend((namespace, k) for k, v in list(namespace.items()) if v is value)
    return found


@contextlib.contextmanager
def routed_torch() -> Iterator[bool]:
    """Route torch's DeviceMesh entry points through fmesh inside the block.

    Yields whether torch's own DeviceMesh methods (``_unflatten``, ``_flatten``,
    ``__getitem__``, ...) are routed too: not with ``FMESH_TORCH_HOOK=0``, nor on a
    torch outside the supported range (then they run as torch's, which on a fake world
    still works, only in O(world) per call).
    """
    import torch.distributed.device_mesh as torch_device_mesh

    from .._compat.hook import install, installed, uninstall
    from .._torch.dropin import init_device_mesh as dropin

    original: Callable[..., Any] = torch_device_mesh.init_device_mesh
    if original is dropin:  # an outer plan routes already
        yield installed()
        return
    had_hook = installed()
    own = {(id(ns), k) for ns, k in holders(dropin)}
    swapped = holders(original)
    for namespace, key in swapped:
        namespace[key] = dropin
    try:
        yield install()
    finally:
        for namespace, key in swapped:
            if namespace.get(key) is dropin:
                namespace[key] = original
        for namespace, key in holders(dropin):
            if (id(namespace), key) not in own:
                namespace[key] = original
        if not had_hook:
            uninstall()
