"""The command line's mesh flags, from text to the mesh and the axes to report.

``fmesh describe`` and ``fmesh plan`` build their mesh the same way: the spec, then
each ``--unflatten``; finally each ``--flatten`` adds an axis to report. Every bad
value raises :class:`CliError`, which ``fmesh._cli`` prints as one line. Pure: no
torch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ._describe import ShownAxis
from ._errors import MeshError
from ._mesh import Mesh, make_mesh
from ._ops import flatten, unflatten

__all__ = [
    "SPEC_HELP",
    "CliError",
    "build",
    "parse_count",
    "parse_flatten",
    "parse_names",
    "parse_spec",
    "parse_unflatten",
]

SPEC_HELP = 'comma-separated name=size pairs in axis order, e.g. "pp=2,dp=4,tp=8"'


class CliError(MeshError):
    """A bad command-line argument (reported as one line, exit status 2)."""


# -- parsing ---------------------------------------------------------------------------


def parse_count(text: str, what: str) -> int:
    """An int written as ``1024``, ``1_024`` or ``2**10``."""
    m = re.fullmatch(r"\s*(-?\d[\d_]*)\s*(?:\*\*\s*(\d+)\s*)?", text)
    if m is None:
        raise CliError(
            f"{what} is {text!r}, which is not a whole number; write e.g. 8, 1024 or 2**10"
        )
    base = int(m.group(1))
    return base ** int(m.group(2)) if m.group(2) is not None else base


def parse_spec(text: str) -> Mesh:
    """The root mesh of a spec such as ``"pp=2,dp=4,tp=8"``.

    >>> parse_spec("dp=2, tp=4")
    Mesh(dp=2, tp=4)
    """
    names: list[str] = []
    sizes: list[int] = []
    try:
        items = [item.strip() for item in text.split(",")]
        if not text.strip() or any(not item for item in items):
            raise CliError("it has an empty entry")
        for item in items:
            name, eq, size = (part.strip() for part in item.partition("="))
            if not eq:
                raise CliError(f"entry {item!r} is not name=size")
            names.append(name)
            sizes.append(parse_count(size, f"the size of axis {name!r}"))
        return make_mesh(sizes, names)
    except MeshError as err:
        raise CliError(f'mesh spec "{text}": {err}; expected {SPEC_HELP}') from None


def parse_flatten(text: str) -> tuple[str | None, tuple[str, ...]]:
    """``"dp,tp"`` or ``"name=dp,tp"``: the new axis name (or None) and its axes."""
    name, eq, axes = text.rpartition("=") if "=" in text else ("", "", text)
    parts = tuple(a.strip() for a in axes.split(","))
    if not all(parts) or (eq and not name.strip()):
        raise CliError(
            f'--flatten "{text}" is not a list of axis names; write --flatten dp,tp '
            "or --flatten dp_tp=dp,tp"
        )
    return (name.strip() if eq else None), parts


def parse_unflatten(text: str) -> tuple[str, dict[str, int]]:
    """``"world=dp:2,tp:4"``: the axis to split and the new axes' sizes, in order."""
    axis, eq, rest = text.partition("=")
    sizes: dict[str, int] = {}
    for item in rest.split(","):
        name, colon, size = (p.strip() for p in item.partition(":"))
        if not colon or not name or name in sizes:
            sizes = {}
            break
        sizes[name] = parse_count(size, f"the size of {name!r} in --unflatten {text!r}")
    if not eq or not axis.strip() or not sizes:
        raise CliError(
            f'--unflatten "{text}" is not axis=name:size,...; write e.g. '
            '--unflatten "world=dp:2,tp:4" (distinct new names)'
        )
    return axis.strip(), sizes


def parse_names(text: str, flag: str) -> tuple[str, ...]:
    """``"tp,cp,ep"`` -> ``("tp", "cp", "ep")``; an empty string gives ``()``."""
    parts = tuple(p.strip() for p in text.split(",")) if text.strip() else ()
    if not all(parts):
        raise CliError(f'{flag} "{text}" is not a list of axis names; write e.g. tp,cp,ep')
    return parts


# -- building ----------------------------------------------------------------------------


def build(
    spec: str,
    unflattens: Sequence[str],
    flattens: Sequence[str],
) -> tuple[Mesh, list[ShownAxis]]:
    """The root mesh (after the unflattens) and every axis to report."""
    mesh = parse_spec(spec)
    for text in unflattens:
        axis, sizes = parse_unflatten(text)
        try:
            mesh = unflatten(mesh, axis, sizes)
        except MeshError as err:
            raise CliError(f'--unflatten "{text}": {err}') from None
    axes = [ShownAxis(name, mesh) for name in mesh.axis_names]
    for text in flattens:
        name, parts = parse_flatten(text)
        try:
            flat = flatten(mesh, parts, name)
        except MeshError as err:
            raise CliError(f'--flatten "{text}": {err}') from None
        new = name if name is not None else "_".join(parts)
        if new in {a.name for a in axes}:
            raise CliError(
                f'--flatten "{text}" names its axis {new!r}, which is taken; name it '
                f"with --flatten NAME={','.join(parts)}"
            )
        axes.append(ShownAxis(new, flat, parts))
    return mesh, axes
