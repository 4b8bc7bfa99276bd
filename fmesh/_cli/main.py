"""The ``fmesh`` command line: parse arguments, then draw a mesh, dry-run realize of a
mesh spec for one rank, or plan a trainer's own mesh code for chosen ranks.

    python -m fmesh describe "pp=2,dp=4,tp=8" --rank 5 --flatten dp,tp
    python -m fmesh describe "dp=2,tp=4" --json
    python -m fmesh describe "dp=4,tp=2" --lost 3,5 --shrink dp --replace 0=8
    python -m fmesh plan --world 131072 "pp=16,dp=256,cp=4,tp=8" --rank 5
    python -m fmesh plan --world 2**17 --rank sample:16 examples/parallel_dims.py:torchtitan
    python -m fmesh plan --world 64 --rank all examples/parallel_dims.py:torchtitan

This module only dispatches: the mesh flags are parsed in ``fmesh._cli.args``, the
text of ``describe`` comes from ``fmesh._cli.describe`` (pure), the host analysis from
``fmesh._core.hosts``, and the dry run of ``plan`` from ``fmesh._cli.dry_run``, which alone
imports torch.

A *host* is a block of ``--local-world-size`` consecutive global ranks (default 8); an
axis is intra-host when every one of its groups lies inside one host.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from .._core.errors import MeshError
from .._core.hosts import BANDWIDTH_HEAVY_AXES
from .._core.queries import coordinate
from .args import (
    MESH_ARG_HELP,
    CliError,
    Edits,
    build,
    not_in_mesh,
    parse_count,
    parse_mesh_arg,
    parse_names,
    refuse_unknown_command,
    refuse_unknown_flags,
)
from .describe import describe_text
from .plan import is_target, plan_command

__all__ = ["describe", "describe_json", "main", "parse_mesh_arg", "plan"]

logger = logging.getLogger("fmesh")

# c10d ranks and world sizes are 32-bit ints.
_MAX_WORLD = 2**31 - 1


# -- commands -------------------------------------------------------------------------


def _check_host(local_world_size: int) -> None:
    if local_world_size < 1:
        raise CliError(
            f"--local-world-size is {local_world_size}; expected the number of ranks "
            "per host, >= 1 (e.g. 8)"
        )


def describe(
    mesh_arg: str,
    *,
    flattens: Sequence[str] = (),
    unflattens: Sequence[str] = (),
    rank: int | None = None,
    local_world_size: int = 8,
    keep_in_host: Sequence[str] = BANDWIDTH_HEAVY_AXES,
    edits: Edits | None = None,
) -> str:
    """The text ``fmesh describe`` prints; ``edits`` are ``--lost``, ``--shrink`` and
    ``--replace``, applied after the unflattens and before the flattens."""
    _check_host(local_world_size)
    mesh, axes, notes = build(mesh_arg, unflattens, flattens, edits)
    if rank is not None and coordinate(mesh, rank) is None:
        raise CliError(not_in_mesh(rank, mesh_arg, mesh, edits))
    return describe_text(
        mesh,
        axes,
        rank=rank,
        ranks_per_host=local_world_size,
        keep_in_host=keep_in_host,
        notes=notes,
    )


def describe_json(
    mesh_arg: str, *, unflattens: Sequence[str] = (), edits: Edits | None = None
) -> str:
    """The text ``fmesh describe --json`` prints: the mesh as ``Mesh.to_json``."""
    mesh, _, _ = build(mesh_arg, unflattens, (), edits)
    return mesh.to_json() + "\n"


def plan(
    mesh_arg: str,
    *,
    world: int | None = None,
    rank: int = 0,
    flattens: Sequence[str] = (),
    unflattens: Sequence[str] = (),
    backend: str = "nccl",
    local_world_size: int = 8,
) -> str:
    """The text ``fmesh plan`` prints: a dry run of realize on the fake backend, in a
    world of ``world`` ranks (default: the mesh's size)."""
    _check_host(local_world_size)
    mesh, axes, _ = build(mesh_arg, unflattens, flattens)
    if world is None:
        world = mesh.size
    if world < mesh.size:
        raise CliError(
            f'--world {world} is smaller than the mesh "{mesh_arg}" of {mesh.size} ranks; '
            f"give --world {mesh.size} or more, or shrink the mesh"
        )
    if world > _MAX_WORLD:
        raise CliError(
            f"--world {world} is more ranks than torch can address; expected at most "
            f"{_MAX_WORLD} (2**31 - 1)"
        )
    if not 0 <= rank < world:
        raise CliError(
            f"--rank {rank} is not in the world of {world} ranks; expected 0..{world - 1}"
        )
    if "torch" not in sys.modules:
        # Importing torch is most of the wall time (seconds); the plan itself takes ms.
        print("fmesh plan: importing torch ...", file=sys.stderr, flush=True)
    from .dry_run import dry_run_text, known_backends

    known = known_backends()
    for part in backend.split(","):
        name = part.rpartition(":")[2].strip().lower()
        if name not in known:
            raise CliError(
                f"--backend {backend!r} names backend {name!r}; expected one of "
                f"{known}, or a device map such as 'cpu:gloo,cuda:nccl'"
            )
    return dry_run_text(
        mesh,
        axes,
        world=world,
        rank=rank,
        backend=backend,
        ranks_per_host=local_world_size,
    )


# -- entry point -----------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line too."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"fmesh: error: {message} (see '{self.prog} --help')\n")
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = _Parser(
        prog="fmesh",
        description="Draw an fmesh mesh (describe); dry-run a mesh spec for one rank, or "
        "run a trainer's own mesh code for chosen ranks and compare them, on torch's fake "
        "backend (plan).",
    )
    parser.add_argument("--version", action="version", version=f"fmesh {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log progress to stderr (-vv: debug)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(
        p: argparse.ArgumentParser,
        metavar: str = "spec",
        what: str = f"the mesh: {MESH_ARG_HELP}",
    ) -> None:
        p.add_argument("mesh_arg", metavar=metavar, help=what)
        p.add_argument(
            "--flatten",
            action="append",
            default=[],
            metavar="[NAME=]A,B",
            help="add an axis flattening these axes (repeatable)",
        )
        p.add_argument(
            "--unflatten",
            action="append",
            default=[],
            metavar="AXIS=NAME:SIZE,...",
            help="split an axis of the mesh, before any --flatten, e.g. "
            "world=dp:2,tp:4 (repeatable)",
        )
        p.add_argument(
            "--local-world-size", default="8", metavar="N", help="ranks per host (default 8)"
        )
        p.add_argument(
            "-v",
            "--verbose",
            action="count",
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )

    d = sub.add_parser("describe", help="draw the rank grid and each axis's groups")
    common(d)
    d.add_argument("--rank", default=None, metavar="R", help="show this rank's groups")
    d.add_argument(
        "--json",
        action="store_true",
        help="print the mesh (after any --unflatten, --shrink, --replace) as "
        "fmesh.Mesh.to_json() instead",
    )
    d.add_argument(
        "--lost",
        default=None,
        metavar="R,...",
        help="lost global ranks, e.g. 3,5; with --shrink, describe the mesh without them",
    )
    d.add_argument(
        "--shrink",
        default=None,
        metavar="AXIS",
        help="drop every slice along AXIS that holds a --lost rank (fmesh.shrink)",
    )
    d.add_argument(
        "--replace",
        default=None,
        metavar="OLD=NEW,...",
        help="hot spares: rank NEW takes rank OLD's place, e.g. 3=8,5=9, after any "
        "--shrink (fmesh.replace)",
    )
    d.add_argument(
        "--keep-in-host",
        default=",".join(BANDWIDTH_HEAVY_AXES),
        metavar="AXES",
        help="warn when these axes cross hosts (default %(default)s; '' for none)",
    )
    p = sub.add_parser(
        "plan",
        help="dry-run a mesh spec for one rank, or run a trainer's module:function for "
        "chosen ranks and compare their group-creating calls (fake backend)",
    )
    common(
        p,
        "spec or module:function",
        f"the mesh: {MESH_ARG_HELP}; or the function "
        "that builds the trainer's meshes, as package.module:function or "
        "path/to/file.py:function",
    )
    p.add_argument(
        "--world",
        default=None,
        metavar="N",
        help="world size, e.g. 2**17 (default for a spec: the mesh's size)",
    )
    p.add_argument(
        "--rank",
        default=None,
        metavar="R[,R...]|sample:K|all",
        help="the rank (spec: one, default 0); for module:function, ranks, sample:K "
        "(K ranks spread over the world; default sample:8; it can miss a rank that "
        "alone diverges) or all (every rank, worlds up to 4096)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="module:function only: print the report as one JSON object",
    )
    p.add_argument(
        "--launch",
        choices=("route", "torch"),
        default="route",
        help="module:function only: the launch to predict: route (default; torchrun "
        "... -m fmesh.route, torch's DeviceMesh API routed through fmesh) or torch "
        "(plain torchrun with the installed torch: its hangs and errors)",
    )
    p.add_argument(
        "--backend",
        default=None,
        help="the default group's backend at launch: for a spec, named in the report "
        "(default nccl); for module:function, what its realize calls name where its own "
        "code starts no group (default cpu:gloo,cuda:nccl)",
    )
    return parser


def _run(args: argparse.Namespace) -> tuple[str, int]:
    """The text to print and the exit status."""
    if args.command == "plan" and is_target(args.mesh_arg):
        return plan_command(args)
    host = parse_count(args.local_world_size, "--local-world-size")
    rank = None if args.rank is None else parse_count(args.rank, "--rank")
    edits = Edits(args.lost, args.shrink, args.replace) if args.command == "describe" else None
    if args.command == "describe" and args.json:
        if args.rank is not None or args.flatten:
            raise CliError(
                "--json prints the mesh itself, so it takes no --rank or --flatten; "
                "drop them, or flatten in Python and call Mesh.to_json()"
            )
        return describe_json(args.mesh_arg, unflattens=args.unflatten, edits=edits), 0
    if args.command == "describe":
        text = describe(
            args.mesh_arg,
            flattens=args.flatten,
            unflattens=args.unflatten,
            rank=rank,
            local_world_size=host,
            keep_in_host=parse_names(args.keep_in_host, "--keep-in-host"),
            edits=edits,
        )
        return text, 0
    if args.json:
        raise CliError(
            "plan --json is for module:function targets; for a mesh spec, use describe --json"
        )
    if args.launch != "route":
        raise CliError(
            "plan --launch is for module:function targets, whose own code a launch runs; "
            "a mesh spec is realized by fmesh alike under either launch"
        )
    text = plan(
        args.mesh_arg,
        world=None if args.world is None else parse_count(args.world, "--world"),
        rank=0 if rank is None else rank,
        flattens=args.flatten,
        unflattens=args.unflatten,
        backend=args.backend or "nccl",
        local_world_size=host,
    )
    return text, 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for bad arguments)."""
    parser = _parser()
    refuse_unknown_command(parser, sys.argv[1:] if argv is None else argv)
    refuse_unknown_flags(parser, argv)
    args = parser.parse_args(argv)
    if args.verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG if args.verbose > 1 else logging.INFO)
    try:
        text, status = _run(args)
    except MeshError as err:
        # Bad specs and flags raise MeshError (the CLI's own errors subclass it);
        # anything else is a bug and keeps its traceback.
        message = " ".join(str(err).split())
        print(f"fmesh: error: {message}", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away; silence the flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status
