"""The fmesh error hierarchy.

Every error fmesh raises for bad input derives from :class:`MeshError`, which is a
``ValueError``. Unknown axis names raise :class:`AxisNotFoundError`, which is also a
``KeyError`` so ``except KeyError`` code written for dict-like lookups keeps working.
Wrong argument types raise plain ``TypeError``. Where torch's ``init_device_mesh``
raises ``RuntimeError``, ``fmesh.device_mesh.init_device_mesh`` raises
:class:`DeviceMeshError`, which is also a ``RuntimeError``; where torch raises
``ValueError`` for a ``mesh_shape`` of the wrong type, :class:`DeviceMeshTypeError`,
also a ``TypeError``.
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
    "UnrepresentableSplitError",
]


class MeshError(ValueError):
    """Base class of every fmesh error about a mesh or its arguments."""


@final
class AxisNotFoundError(MeshError, KeyError):
    """An axis name that the mesh does not have.

    Also a ``KeyError``; ``str()`` gives the full message (not the quoted key form
    ``KeyError`` would use).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@final
class UnrepresentableSplitError(MeshError):
    """``unflatten`` was asked for a split that no layout can express."""


@final
class MeshMismatchError(MeshError):
    """Ranks disagree about the mesh being realized (raised instead of hanging)."""


@final
class LaunchError(MeshError):
    """No process group exists and none can be initialized from the environment."""


@final
class DeviceMeshError(MeshError, RuntimeError):
    """``fmesh.device_mesh.init_device_mesh`` refused its arguments where torch's
    ``init_device_mesh`` raises ``RuntimeError`` (repeated or mismatched dim names,
    a device type with an index, a bad ``backend_override``, a mesh larger than the
    world). Also a ``RuntimeError``, so ``except RuntimeError`` code written for torch
    keeps working."""


@final
class DeviceMeshTypeError(MeshError, TypeError):
    """``fmesh.device_mesh.init_device_mesh`` was given a ``mesh_shape`` entry that is
    not an int (a float, a str, a bool), where torch raises ``ValueError``. A
    ``MeshError`` (so a ``ValueError``) and a ``TypeError``: ``except`` clauses written
    for torch, or for a wrong argument type, catch it."""
