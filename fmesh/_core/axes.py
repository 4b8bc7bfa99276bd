"""Checks of axis names and sizes, and axis lookup by name.

Shared by ``fmesh._core.mesh`` (the ``Mesh`` constructor, ``Mesh.axis_index``,
``mesh[...]``) and ``fmesh._core.ops`` (the operations), so neither imports the other's
privates. Knows nothing of ``Mesh`` beyond its ``axis_names``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from .errors import AxisNotFoundError, MeshError

__all__ = [
    "HasAxisNames",
    "axis_position",
    "check_axis_name",
    "check_names",
    "check_size",
    "names_tuple",
]


class HasAxisNames(Protocol):
    """Anything with named axes (a ``Mesh``); its repr names it in error messages."""

    @property
    def axis_names(self) -> tuple[str, ...]: ...


def check_size(name: str, size: object) -> int:
    """``size`` as an int >= 1, for the axis ``name``."""
    if isinstance(size, bool) or not isinstance(size, int | np.integer):
        raise TypeError(
            f"axis {name!r} has size {size!r} of type {type(size).__name__}; "
            "axis sizes must be int (not bool or float)"
        )
    if size < 1:
        raise MeshError(
            f"axis {name!r} has size {size}; axis sizes must be >= 1 "
            "(use 1 for an axis that is present but not split)"
        )
    return int(size)


def check_axis_name(name: object, *, where: str = "", context: str = "", if_empty: str) -> str:
    """``name`` if it is a non-empty str. The messages start with ``where`` (the
    caller's place, e.g. a PartitionSpec entry); ``context`` ends the type error and
    ``if_empty`` the error for an empty name.

    >>> check_axis_name(3, if_empty="")
    Traceback (most recent call last):
    TypeError: axis names must be str, got 3 of type int
    """
    if not isinstance(name, str):
        raise TypeError(
            f"{where}axis names must be str, got {name!r} of type {type(name).__name__}"
            f"{context}"
        )
    if not name:
        raise MeshError(f"{where}axis names must be non-empty strings{if_empty}")
    return name


def check_names(names: object) -> tuple[str, ...]:
    """``names`` if it is a tuple of unique, non-empty strings."""
    if not isinstance(names, tuple):
        raise TypeError(f"axis_names must be a tuple of str, got {names!r}")
    for name in names:
        if type(name) is not str or not name:  # the messages are built only here
            check_axis_name(
                name,
                context=f" in {names!r}",
                if_empty=f", got {names!r}; name every axis, e.g. ('dp', 'tp')",
            )
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise MeshError(
                f"axis name {name!r} appears more than once in {names!r}; "
                "axis names must be unique"
            )
        seen.add(name)
    return names


def names_tuple(axis_names: object) -> tuple[str, ...]:
    """A checked tuple from any sequence of names (a bare string is refused)."""
    if isinstance(axis_names, str):
        raise TypeError(
            f"axis_names must be a sequence of names, got the string {axis_names!r}; "
            f"write ({axis_names!r},) for a single axis"
        )
    if not isinstance(axis_names, Sequence):
        raise TypeError(f"axis_names must be a sequence of str, got {axis_names!r}")
    return check_names(tuple(axis_names))


def axis_position(mesh: HasAxisNames, name: object, fn: str) -> int:
    """Index of axis ``name`` in ``mesh``, with a helpful error when missing.

    ``fn`` names the public function the user called, for the message.
    """
    if not isinstance(name, str):
        raise TypeError(
            f"{fn}() axis names must be str, got {name!r} of type {type(name).__name__}"
        )
    try:
        return mesh.axis_names.index(name)
    except ValueError:
        raise AxisNotFoundError(
            f"{fn}(): {mesh!r} has no axis {name!r}; valid axis names are "
            f"{list(mesh.axis_names)}"
        ) from None
