"""Hooks through which the layers above the runtime (the DeviceMesh interop) follow it.

The runtime calls these; it never imports the modules that register them, so the
layering stays one way: core, then runtime, then torch interop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .._core.errors import MeshError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

    from .._core.mesh import Mesh

__all__ = [
    "on_creating_call",
    "on_dead",
    "on_loss",
    "on_realized",
    "on_reset",
    "provide_device_mesh",
    "run_creating_call_hooks",
    "run_dead_hooks",
    "run_loss_hooks",
    "run_realized_hooks",
    "run_reset_hooks",
    "to_device_mesh",
]

Realized = Callable[["Mesh", Mapping[str, "ProcessGroup"]], None]
ToDeviceMesh = Callable[
    ["Mesh", "tuple[int, ...] | None", Mapping[str, "ProcessGroup"], "str | None"],
    "DeviceMesh",
]

_reset_hooks: list[Callable[[], None]] = []
_loss_hooks: list[Callable[[], None]] = []
_dead_hooks: list[Callable[[frozenset[int]], None]] = []
_realized_hooks: list[Realized] = []
_device_mesh: list[ToDeviceMesh] = []
CreatingCall = Callable[[int, int, object, Callable[[], str]], None]
_creating_call_hooks: list[CreatingCall] = []


def on_reset(hook: Callable[[], None]) -> None:
    """Call ``hook`` (under the memo lock) whenever the memo is reset: by
    ``destroy``, or when the default process group changes. Modules that keep
    per-group state of their own (the DeviceMesh interop) register here, so this
    package never imports them."""
    _reset_hooks.append(hook)


def on_loss(hook: Callable[[], None]) -> None:
    """Call ``hook`` (under the memo lock) after ``fmesh.recover`` declared ranks
    lost: state built on groups that may hold them must go."""
    _loss_hooks.append(hook)


def on_dead(hook: Callable[[frozenset[int]], None]) -> None:
    """Call ``hook(ids)`` (under the memo lock) when the memo forgets groups torch no
    longer holds (destroyed or aborted): ``ids`` are the ``id()`` of those groups."""
    _dead_hooks.append(hook)


def on_realized(hook: Realized) -> None:
    """Call ``hook(mesh, groups)`` after every realize call (outside the memo lock)."""
    _realized_hooks.append(hook)


def on_creating_call(hook: CreatingCall) -> None:
    """Call ``hook(number, code, summary, history)`` for every realize call that
    agrees before creating groups (on a fake world too, where nothing is published):
    its number, the code the ranks must publish alike, the call in words (``str()`` of
    ``summary``) and what gives the memo hits since the previous one in words (a
    call: built only where a hook wants them). ``fmesh plan`` compares ranks with it.
    Runs outside the memo lock."""
    _creating_call_hooks.append(hook)


def provide_device_mesh(convert: ToDeviceMesh) -> None:
    """The DeviceMesh interop's converter, behind ``RealizedMesh.to_device_mesh``."""
    _device_mesh[:] = [convert]


def run_reset_hooks() -> None:
    for hook in _reset_hooks:
        hook()


def run_loss_hooks() -> None:
    for hook in _loss_hooks:
        hook()


def run_creating_call_hooks(
    number: int, code: int, summary: object, history: Callable[[], str]
) -> None:
    for hook in _creating_call_hooks:
        hook(number, code, summary, history)


def run_dead_hooks(ids: frozenset[int]) -> None:
    for hook in _dead_hooks:
        hook(ids)


def run_realized_hooks(mesh: Mesh, groups: Mapping[str, ProcessGroup]) -> None:
    for hook in _realized_hooks:
        hook(mesh, groups)


def to_device_mesh(
    mesh: Mesh,
    coordinate: tuple[int, ...] | None,
    groups: Mapping[str, ProcessGroup],
    device_type: str | None,
) -> DeviceMesh:
    """A DeviceMesh for a realized mesh, made by the interop that registered itself."""
    if not _device_mesh:  # only when fmesh._torch was never imported
        raise MeshError("no DeviceMesh converter is registered: import fmesh first")
    return _device_mesh[0](mesh, coordinate, groups, device_type)
