"""torch's own ``init_device_mesh`` function object, made to call another function.

A process that imported torch holds torch's ``init_device_mesh`` in many places before
any user code runs: ``torch.distributed``, ``torch.distributed.tensor`` and FSDP bind it
at import, and a trainer or library may have done ``from torch.distributed.device_mesh
import init_device_mesh``, kept it in a registry, a ``functools.partial`` or a default
argument. Replacing module attributes reaches only some of those (and only after a scan
of every module); replacing what the one function object runs reaches all of them, in
O(1), and is exactly undone. So ``route`` gives the function a small trampoline as its
code (the same object, the same name, ``__module__`` and signature as ``inspect`` shows
it), and ``unroute`` gives back its own code, defaults and attributes.

The trampoline looks its target up here on every call, so it needs nothing from torch's
module globals and holds no closure (torch's function has none; a code object can only
replace one with the same free variables). A copy of torch's function with its own code
stays callable (``torch_init_device_mesh``) for callers that need torch's behaviour.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "route_init_device_mesh",
    "routed",
    "torch_init_device_mesh",
    "unroute_init_device_mesh",
    "unrouted",
]

_lock = threading.Lock()
_target: Callable[..., Any] | None = None
"""What the routed function calls (kept after ``unroute``: a call already inside the
trampoline finishes)."""
_saved: tuple[types.CodeType, Any, Any, dict[str, Any]] | None = None
"""torch's code, ``__defaults__``, ``__kwdefaults__`` and ``__dict__``, while routed."""
_torch: types.FunctionType | None = None
"""torch's function object, once seen."""
_pristine: types.FunctionType | None = None
"""A copy of torch's function running torch's code (made once, at the first route)."""


def init_device_mesh(*args: Any, **kwargs: Any) -> Any:
    """The trampoline: its code becomes that of torch's ``init_device_mesh`` while
    routed, and runs with torch's module globals (so it imports by absolute name)."""
    from fmesh._compat.swap import _target as target

    assert target is not None  # set before the code is swapped in
    return target(*args, **kwargs)


def _torch_function(target: object) -> types.FunctionType | None:
    """torch's function object: the module attribute, or ``None`` where that is
    ``target`` already (``fmesh plan`` points it at the drop-in for its run) and
    torch's was never seen; raises where it is anything else."""
    global _torch
    import torch.distributed.device_mesh as device_mesh

    fn: object = device_mesh.init_device_mesh
    if fn is target or fn is _torch:
        return _torch
    if (
        not isinstance(fn, types.FunctionType)
        or fn.__closure__
        or fn.__module__ != device_mesh.__name__
    ):
        raise RuntimeError(
            f"torch.distributed.device_mesh.init_device_mesh is {fn!r} here, not "
            "torch's plain Python function: fmesh cannot route it in place (another "
            "library replaced or wrapped it); use `from fmesh.device_mesh import "
            "init_device_mesh` instead"
        )
    _torch = fn
    return fn


def routed() -> bool:
    """Whether torch's ``init_device_mesh`` runs the trampoline now."""
    return _saved is not None


def route_init_device_mesh(target: Callable[..., Any]) -> bool:
    """Make torch's ``init_device_mesh`` (the function object, wherever it is held)
    call ``target`` with its arguments. Returns False where it was routed already
    (the target is replaced)."""
    global _target, _saved, _pristine
    with _lock:
        if _saved is not None:
            _target = target
            return False
        fn = _torch_function(target)
        if fn is None:
            return False  # the module attribute is the target already
        _target = target
        signature = inspect.signature(fn)
        if _pristine is None:
            _pristine = _copy(fn)
        _saved = (fn.__code__, fn.__defaults__, fn.__kwdefaults__, dict(fn.__dict__))
        fn.__code__ = init_device_mesh.__code__
        fn.__defaults__, fn.__kwdefaults__ = None, None
        # inspect shows torch's parameters still (help(), IDEs, argument checks).
        vars(fn)["__signature__"] = signature
    return True


def unroute_init_device_mesh() -> bool:
    """Give torch's ``init_device_mesh`` its own code back. Returns False where it was
    not routed; raises where another library replaced its code since."""
    global _saved
    with _lock:
        if _saved is None:
            return False
        fn = _torch
        assert fn is not None  # seen by route
        if fn.__code__ is not init_device_mesh.__code__:
            raise RuntimeError(
                "torch's init_device_mesh runs code that is not fmesh's any more "
                f"({fn.__code__.co_filename}): another library replaced it after "
                "fmesh.device_mesh.route(); undo that first"
            )
        code, defaults, kwdefaults, attributes = _saved
        fn.__code__, fn.__defaults__, fn.__kwdefaults__ = code, defaults, kwdefaults
        vars(fn).clear()
        vars(fn).update(attributes)
        _saved = None
    return True


@contextlib.contextmanager
def unrouted() -> Iterator[None]:
    """Inside, torch's ``init_device_mesh`` runs torch's own code (``fmesh plan
    --launch torch`` in a routed process); routed again to the same target after, as
    it was. A route made inside is undone on exit where there was none before."""
    with _lock:
        target = _target if _saved is not None else None
    if target is not None:
        unroute_init_device_mesh()
    try:
        yield
    finally:
        if target is not None:
            route_init_device_mesh(target)
        elif routed():
            unroute_init_device_mesh()


def torch_init_device_mesh() -> Callable[..., DeviceMesh]:
    """torch's ``init_device_mesh`` as torch wrote it, routed or not."""
    with _lock:
        if _saved is not None:
            assert _pristine is not None
            return _pristine
        import torch.distributed.device_mesh as device_mesh

        fn = device_mesh.init_device_mesh
        if fn.__module__ != device_mesh.__name__ and _torch is not None:
            return _torch  # the attribute points elsewhere (fmesh plan): torch's own
        return fn


def _copy(fn: types.FunctionType) -> types.FunctionType:
    copy = types.FunctionType(
        fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__, copy.__doc__, copy.__module__ = (
        fn.__qualname__,
        fn.__doc__,
        fn.__module__,
    )
    vars(copy).update(vars(fn))
    return copy
