"""Tables that keep only their most recent entries.

A memo keyed by meshes or calls forgets the oldest entries beyond a bound, in the
order of the calls that filled it (the same on every rank), never by garbage
collection (whose timing differs between ranks). Only tables whose lost entries are
merely rebuilt use it: what decides whether a call is a hit is never dropped here.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

__all__ = ["KEPT", "bound"]

KEPT = 1024
"""Entries kept per bounded table."""


def bound(table: MutableMapping[Any, Any], kept: int = KEPT) -> None:
    """Drop the oldest entries of ``table`` (in insertion order) beyond ``kept``.

    >>> t = {i: i for i in range(5)}; bound(t, 2); t
    {3: 3, 4: 4}
    """
    while len(table) > kept:
        del table[next(iter(table))]
