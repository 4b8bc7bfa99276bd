"""The fmesh error hierarchy.

Every error fmesh raises for bad input derives from ``MeshError``, which is a
``ValueError``. Unknown axis names raise ``AxisNotFoundError``, which is also a
``KeyError`` so ``except KeyError`` code written for dict-like lookups keeps working.
Wrong argument types raise plain ``TypeError``. Where torch's ``init_device_mesh``
raises ``RuntimeError``, ``fmesh.device_mesh.init_device_mesh`` raises
``DeviceMeshError``, which is also a ``RuntimeError``; where torch raises
``ValueError`` for a ``mesh_shape`` of the wrong type, ``DeviceMeshTypeError``,
also a ``TypeError``.

Each class names the path users import it from in ``__module__`` (``fmesh.MeshError``,
``fmesh.device_mesh.DeviceMeshError``): tracebacks and reprs show that path, and pickle
finds the class there.
"""

from __future__ import annotations

from typing import final

__all__ = [
    "AxisNotFoundError",
    "DeviceMeshError",
    "DeviceMeshTypeError",
    "LaunchError",
    "MeshError",
    "MeshMismatchError",
    "PeerLostError",
    "UnrepresentableSplitError",
]


class MeshError(ValueError):
    """Base class of every fmesh error about a mesh or its arguments."""

    __module__ = "fmesh"


@final
class AxisNotFoundError(MeshError, KeyError):
    """An axis name that the mesh does not have.

    Also a ``KeyError``; ``str()`` gives the full message (not the quoted key form
    ``KeyError`` would use).
    """

    __module__ = "fmesh"

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@final
class UnrepresentableSplitError(MeshError):
    """``unflatten`` was asked for a split that no layout can express."""

    __module__ = "fmesh"


class MeshMismatchError(MeshError):
    """Ranks disagree about the mesh being realized (raised instead of hanging)."""

    __module__ = "fmesh"


@final
class PeerLostError(MeshMismatchError, RuntimeError):
    """A rank that a realize call waited for died while the call's ranks created their
    groups; raised on every surviving rank of the call.

    ``lost`` holds the lost ranks, ascending. The call made no group on any survivor:
    call ``fmesh.recover`` and carry on without the lost ranks. Also a
    ``RuntimeError``, the class of torch's own store and connection errors. A rank
    the others declared lost while it lived (its host or network silent to its watcher,
    or itself cut off from the store) raises it too, with ``lost`` naming itself and a
    message that says it was given up on and why.
    """

    __module__ = "fmesh"

    def __init__(self, message: str, lost: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.lost = lost

    def __reduce__(self) -> tuple[type[PeerLostError], tuple[str, tuple[int, ...]]]:
        return (PeerLostError, (str(self), self.lost))


@final
class LaunchError(MeshError):
    """No process group exists and none can be initialized from the environment."""

    __module__ = "fmesh"


@final
class DeviceMeshError(MeshError, RuntimeError):
    """``fmesh.device_mesh.init_device_mesh`` refused its arguments where torch's
    ``init_device_mesh`` raises ``RuntimeError`` (repeated or mismatched dim names,
    a device type with an index, a bad ``backend_override``, a mesh larger than the
    world). Also a ``RuntimeError``, so ``except RuntimeError`` code written for torch
    keeps working."""

    __module__ = "fmesh.device_mesh"


@final
class DeviceMeshTypeError(MeshError, TypeError):
    """``fmesh.device_mesh.init_device_mesh`` was given a ``mesh_shape`` entry that is
    not an int (a float, a str, a bool), where torch raises ``ValueError``, or a
    ``backend_override`` value that is no backend, options or pair of them, where
    torch's unpacking raises ``ValueError`` or ``TypeError``. A ``MeshError`` (so a
    ``ValueError``) and a ``TypeError``: ``except`` clauses written for torch, or for
    a wrong argument type, catch it."""

    __module__ = "fmesh.device_mesh"
