"""Comparing what torch's DeviceMesh and fmesh's answered, report by report."""

from __future__ import annotations

from typing import Any

__all__ = ["diff", "no_more_groups", "results"]


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Where nested reports ``a`` (torch) and ``b`` (fmesh) differ, one line each."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            out += diff(a.get(k, "<missing>"), b.get(k, "<missing>"), f"{path}/{k}")
        return out
    return [] if a == b else [f"{path}: torch {a!r} fmesh {b!r}"]


def results(ops: dict[str, Any]) -> dict[str, Any]:
    """What each operation of an operations report (``tests/dropin_facts.operations``)
    answered, without the count of groups it created on this rank."""
    return {
        k: v["result"] if isinstance(v, dict) and "result" in v else v for k, v in ops.items()
    }


def _created(ops: dict[str, Any]) -> dict[str, int]:
    return {
        k: v["new_groups"] for k, v in ops.items() if isinstance(v, dict) and "new_groups" in v
    }


def no_more_groups(torch_ops: dict[str, Any], fmesh_ops: dict[str, Any]) -> list[str]:
    """The operations where fmesh created more groups than torch did (should be none:
    the answers must be torch's, the counts may be lower because fmesh's memo serves
    groups made before and each rank creates only its own)."""
    theirs, ours = _created(torch_ops), _created(fmesh_ops)
    return [
        f"{k}: torch {theirs.get(k)} fmesh {n}"
        for k, n in ours.items()
        if n > theirs.get(k, 0)
    ]
