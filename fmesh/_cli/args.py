"""The command line's mesh flags, from text to the mesh and the axes to report.

``fmesh describe`` and ``fmesh plan`` build their mesh the same way: the mesh text, then
each ``--unflatten``; ``describe`` then applies the elastic edits (``--lost R,...
--shrink AXIS``, then ``--replace OLD=NEW,...``); finally each ``--flatten`` adds an
axis to report. Every bad value raises ``CliError``, which ``fmesh._cli`` prints
as one line. Pure: no torch.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from typing import final

import attrs

from .._core.elastic import replace, shrink
from .._core.errors import MeshError
from .._core.mesh import Mesh, make_mesh
from .._core.ops import flatten, unflatten
from .._core.queries import coordinate
from .describe import ShownAxis, format_ranks

__all__ = [
    "MESH_ARG_HELP",
    "CliError",
    "Edits",
    "build",
    "not_in_mesh",
    "parse_count",
    "parse_flatten",
    "parse_names",
    "parse_ranks",
    "parse_spares",
    "parse_mesh_arg",
    "parse_unflatten",
    "refuse_unknown_flags",
]

MESH_ARG_HELP = 'comma-separated name=size pairs in axis order, e.g. "pp=2,dp=4,tp=8"'


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


def parse_mesh_arg(text: str) -> Mesh:
    """The root mesh of mesh text such as ``"pp=2,dp=4,tp=8"``.

    >>> parse_mesh_arg("dp=2, tp=4")
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
        raise CliError(f'mesh spec "{text}": {err}; expected {MESH_ARG_HELP}') from None


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


def parse_ranks(text: str, flag: str) -> tuple[int, ...]:
    """``"3,5"`` -> ``(3, 5)``: one or more global ranks."""
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise CliError(f'{flag} "{text}" is not a list of ranks; write e.g. {flag} 3,5')
    return tuple(parse_count(p, f"{flag} entry") for p in parts)


def parse_spares(text: str) -> dict[int, int]:
    """``"3=8,5=9"`` -> ``{3: 8, 5: 9}``: each old rank and the spare taking its place."""
    spares: dict[int, int] = {}
    for item in text.split(","):
        old, eq, new = (p.strip() for p in item.partition("="))
        if not eq or not old or not new:
            raise CliError(
                f'--replace "{text}" is not old=new,...; write e.g. --replace 3=8,5=9 '
                "(rank 8 takes rank 3's place)"
            )
        rank = parse_count(old, f"the old rank in --replace {text!r}")
        if rank in spares:
            raise CliError(
                f'--replace "{text}" replaces rank {rank} twice; give each rank one spare'
            )
        spares[rank] = parse_count(new, f"the spare in --replace {text!r}")
    return spares


# -- building ----------------------------------------------------------------------------


@final
@attrs.frozen
class Edits:
    """The elastic flags, as typed: ``--lost``, ``--shrink``, ``--replace``."""

    lost: str | None = None
    """Lost global ranks, e.g. ``"3,5"``; needs ``shrink``."""
    shrink: str | None = None
    """The axis whose slices holding a lost rank are dropped; needs ``lost``."""
    replace: str | None = None
    """``"old=new,..."``: spares taking lost ranks' places (after the shrink)."""

    def apply(self, mesh: Mesh) -> tuple[Mesh, list[str]]:
        """The edited mesh, and one note per edit for ``describe`` to print."""
        notes: list[str] = []
        if (self.lost is None) != (self.shrink is None):
            raise CliError(
                "--lost and --shrink go together: --lost names the lost ranks, --shrink "
                "the axis whose slices holding them are dropped; e.g. --lost 3,5 --shrink dp"
            )
        if self.lost is not None and self.shrink is not None:
            flags = f"--lost {self.lost} --shrink {self.shrink}"
            lost, axis = parse_ranks(self.lost, "--lost"), self.shrink.strip()
            try:
                shrunk = shrink(mesh, lost, axis=axis)
            except MeshError as err:
                raise CliError(f"{flags}: {err}") from None
            pos = mesh.axis_index(axis)
            coords = [coordinate(mesh, r) for r in lost]
            dropped = sorted({c[pos] for c in coords if c is not None})
            held = sorted(set(lost))
            notes.append(
                f"shrunk along {axis} ({mesh.shape[axis]} -> {shrunk.shape[axis]}): "
                f"dropped the slice{'s' if len(dropped) > 1 else ''} at {axis} = "
                f"{', '.join(map(str, dropped))}, holding lost "
                f"rank{'s' if len(held) > 1 else ''} {', '.join(map(str, held))}"
            )
            mesh = shrunk
        if self.replace is not None:
            spares = parse_spares(self.replace)
            try:
                mesh = replace(mesh, spares)
            except MeshError as err:
                raise CliError(f"--replace {self.replace}: {err}") from None
            shown = ", ".join(f"{old} -> {new}" for old, new in sorted(spares.items()))
            notes.append(f"replaced: {shown}")
        return mesh, notes

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.lost, self.shrink, self.replace))


def build(
    mesh_arg: str,
    unflattens: Sequence[str],
    flattens: Sequence[str],
    edits: Edits | None = None,
) -> tuple[Mesh, list[ShownAxis], list[str]]:
    """The mesh (after the unflattens and edits), every axis to report, and the
    notes of the edits."""
    mesh = parse_mesh_arg(mesh_arg)
    for text in unflattens:
        axis, sizes = parse_unflatten(text)
        try:
            mesh = unflatten(mesh, axis, sizes)
        except MeshError as err:
            raise CliError(f'--unflatten "{text}": {err}') from None
    mesh, notes = (mesh, []) if edits is None else edits.apply(mesh)
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
    return mesh, axes, notes


def not_in_mesh(rank: int, mesh_arg: str, mesh: Mesh, edits: Edits | None) -> str:
    """Why ``--rank`` is refused: the rank is not in the (edited) mesh."""
    if not edits:
        return (
            f'--rank {rank} is not in the mesh "{mesh_arg}" of {mesh.size} ranks; '
            f"expected a rank in 0..{mesh.size - 1}"
        )
    ranks = range(mesh.size) if mesh.rank_map is None else sorted(mesh.rank_map)
    return (
        f'--rank {rank} is not in the mesh "{mesh_arg}" after --lost/--shrink/--replace; '
        f"expected one of its {mesh.size} ranks {format_ranks(ranks)}"
    )


# -- unknown flags ------------------------------------------------------------------------


def refuse_unknown_command(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Refuse a command that does not exist, suggesting a close one (``fmesh plna``:
    did you mean 'plan'?); argparse would only list the choices."""
    commands = list(_subparsers(parser))
    for arg in argv:
        if arg in ("-h", "--help", "--version") or arg in commands:
            return
        if arg.startswith("-"):  # the options before the command take no value
            continue
        close = difflib.get_close_matches(arg, commands, n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        expected = " or ".join(f"'{name}'" for name in commands)
        parser.error(f"unknown command '{arg}'{hint}; expected {expected}")
        return


def refuse_unknown_flags(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> None:
    """Refuse arguments argparse did not recognize, suggesting a close flag: argparse
    would take ``--ranks 4 dp=4``'s ``4`` as the mesh and only then complain."""
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return
    subs = _subparsers(parser)
    command = getattr(args, "command", None) or ""
    sub = subs.get(command)
    known = _flags(sub or parser)
    for item in extra:
        flag = item.partition("=")[0]
        if flag.startswith("-"):
            others = [n for n, p in subs.items() if n != command and flag in _flags(p)]
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
            if others:
                other = subs[others[0]]
                action = next(a for a in other._actions if flag in a.option_strings)
                metavar = f" {action.metavar}" if isinstance(action.metavar, str) else ""
                hint = (
                    f"; {flag} is an option of 'fmesh {others[0]}' (fmesh {others[0]} "
                    f"{flag}{metavar} ...), not of 'fmesh {command}'"
                )
            else:
                hint = f"; did you mean {close[0]}?" if close else ""
            (sub or parser).error(f"unrecognized argument {flag}{hint}")
    (sub or parser).error(f"unrecognized arguments: {' '.join(extra)}")


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions for o in a.option_strings if o.startswith("--")]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}
