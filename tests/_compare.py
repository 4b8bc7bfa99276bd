"""Comparing what torch's DeviceMesh and fmesh's answered, report by report."""

from __future__ import annotations

from typing import Any

__all__ = ["diff"]


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Where nested reports ``a`` (torch) and ``b`` (fmesh) differ, one line each."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            out += diff(a.get(k, "<missing>"), b.get(k, "<missing>"), f"{path}/{k}")
        return out
    return [] if a == b else [f"{path}: torch {a!r} fmesh {b!r}"]
