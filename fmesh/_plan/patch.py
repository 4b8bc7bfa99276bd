"""The launch a plan predicts, played for its duration, and torch restored afterwards.

``route`` (``torchrun ... -m fmesh.route``): torch's own ``init_device_mesh`` and
DeviceMesh methods routed through fmesh, as the launch routes them: the function
object itself runs fmesh's drop-in (``_compat/swap.py``), so copies of it captured at
import (a registry, a default argument) are routed too, and every module attribute
that holds it points at the drop-in (trainer code that imported it from torch). Modules
imported during the plan that picked up the drop-in are pointed back at torch's too.
``torch`` (a plain torchrun launch): torch's functions stay torch's own (a routed
process is unrouted for the plan), so its errors and its group creation are what the
plan sees.

Either way ``init_process_group`` (which the plan's fake world stands in for: it checks
its arguments as torch does and notes the device it binds) and ``split_group`` (played
with the launch's preconditions) are replaced, and every group torch itself makes is
reported to the rank's recorder (``_compat/planning.py``), real backends played by the
fake one.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["LAUNCHES", "holders", "routed_torch"]

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


LAUNCHES = ("route", "torch")
"""What ``fmesh plan --launch`` predicts: ``-m fmesh.route``, or plain torchrun."""


@contextlib.contextmanager
def routed_torch(launch: str = "route") -> Iterator[bool]:
    """Play ``launch`` (``LAUNCHES``) inside the block.

    ``route``: ``init_device_mesh`` becomes fmesh's drop-in (the function object and
    every module attribute holding it). ``torch``: it stays torch's. Either way
    ``init_process_group`` returns at once while the plan's fake world is the default
    group (trainer code starts its own group before it builds meshes), after
    checking its arguments as torch does. Yields whether torch's own DeviceMesh
    methods (``_unflatten``, ``_flatten``, ``__getitem__``, ...) on fmesh's meshes are
    routed: under ``route``, not with ``FMESH_TORCH_HOOK=0``, nor on a torch outside
    the supported range (then they run as torch's, which on a fake world still works,
    only in O(world) per call).
    """
    import torch.distributed as dist
    import torch.distributed.device_mesh as torch_device_mesh

    from .._compat import swap
    from .._compat.hook import install, installed, uninstall
    from .._compat.planning import observing, planned_split_group
    from .._runtime.launch import play_backend
    from .._torch.dropin import init_device_mesh as dropin
    from .events import active

    if launch not in LAUNCHES:
        raise ValueError(f"launch must be one of {LAUNCHES}, got {launch!r}")
    original: Callable[..., Any] = torch_device_mesh.init_device_mesh
    if original is dropin:  # an outer plan routes already
        yield installed()
        return
    torch_init: Callable[..., Any] = dist.init_process_group
    torch_split: Callable[..., Any] = dist.split_group
    recorders = active()
    torch_arguments = inspect.signature(torch_init)

    @functools.wraps(torch_init)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if dist.is_initialized() and dist.get_backend() == "fake":
            # The plan's fake world stands in for the job's default group; the
            # backend asked for is what a launch's calls would name.
            bound = torch_arguments.bind(*args, **kwargs).arguments  # torch's TypeError
            asked = bound.get("backend")
            backend = "undefined" if not asked else str(dist.Backend(str(asked)))
            play_backend(backend)
            if recorders:
                recorders[-1].init_call(backend, bound.get("device_id") is not None)
            return
        torch_init(*args, **kwargs)

    class _Observer:
        def torch_call(self, call: Any) -> None:
            if recorders:
                recorders[-1].torch_call(call)

        def dim_call(self, call: Any) -> None:
            if recorders:
                recorders[-1].dim_call(call)

        def bound_device(self) -> bool:
            return bool(recorders) and recorders[-1].bound_device()

    observer = _Observer()
    split_group = functools.wraps(torch_split)(planned_split_group(torch_split, observer))
    replacements: dict[int, Callable[..., Any]] = {
        id(torch_init): init_process_group,
        id(torch_split): split_group,
    }
    had_hook = installed()
    with contextlib.ExitStack() as stack:
        if launch == "route":
            replacements[id(original)] = dropin
            try:
                # The function object itself, before its holders: captured copies too.
                if swap.route_init_device_mesh(dropin):
                    stack.callback(swap.unroute_init_device_mesh)
            except RuntimeError:
                pass  # another library wrapped it: its module attributes only
        else:
            stack.enter_context(swap.unrouted())
        before = holders(original, torch_init, torch_split, dropin)
        own = {(id(ns), k) for ns, k in before.pop(id(dropin))}
        swapped = [
            (ns, k, v)
            for v in (original, torch_init, torch_split)
            if id(v) in replacements
            for ns, k in before[id(v)]
        ]
        for namespace, key, value in swapped:
            namespace[key] = replacements[id(value)]
        try:
            with observing(observer):
                yield install() if launch == "route" else installed()
        finally:
            for namespace, key, value in swapped:
                if namespace.get(key) is replacements[id(value)]:
                    namespace[key] = value
            # Modules imported meanwhile picked up the replacements: point them back.
            after = holders(dropin, init_process_group, split_group)
            if launch == "route":
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
