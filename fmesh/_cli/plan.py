"""``fmesh plan module:function``: plan a trainer's own mesh code for chosen ranks.

The target is ``package.module:function`` (imported with the current directory on
the path, as ``python -m`` does) or ``path/to/file.py:function``. ``--rank`` takes
ranks (``0,5,131071``), ``sample:K`` or ``all`` (worlds up to ``MAX_ALL`` ranks).
The work is ``fmesh.plan()``; this module parses, loads the target and prints. Exit
status: 0 when the planned ranks agree, 1 when they diverge (or the function raised),
2 for bad arguments.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import cast

import attrs

from .args import CliError, parse_count, parse_ranks

__all__ = [
    "MAX_ALL",
    "is_target",
    "load_target",
    "parse_rank_arg",
    "plan_command",
    "plan_target",
]

MAX_ALL = 4096
"""``--rank all`` plans every rank one after the other: worlds up to this size."""


def is_target(text: str) -> bool:
    """``module:function`` rather than a mesh spec (which has ``=`` and no ``:``)."""
    return ":" in text and "=" not in text


def parse_rank_arg(text: str, world: int) -> tuple[tuple[int, ...] | None, int | None]:
    """``--rank``: (ranks, None) for ``0,5`` (every rank for ``all``), (None, K) for
    ``sample:K``."""
    if text.strip() == "all":
        if world > MAX_ALL:
            raise CliError(
                f"--rank all plans each of the {world} ranks in turn; it takes worlds up "
                f"to {MAX_ALL} ranks. Plan a sample (--rank sample:64), or the ranks you "
                "suspect (--rank 0,77,131071)"
            )
        return tuple(range(world)), None
    kind, colon, count = text.strip().partition(":")
    if colon:
        if kind.strip() != "sample":
            raise CliError(
                f'--rank "{text}" is neither ranks, sample:K nor all; write e.g. --rank '
                "0,5, --rank sample:16 or --rank all"
            )
        k = parse_count(count, "the K of --rank sample:K")
        if k < 1:
            raise CliError(f'--rank "{text}": sample:K needs K >= 1')
        return None, k
    return parse_ranks(text, "--rank"), None


def load_target(text: str) -> Callable[[], object]:
    """The function ``module:function`` or ``file.py:function`` names."""
    where, _, name = text.rpartition(":")
    if not where or not name:
        raise CliError(
            f'"{text}" is not module:function; write e.g. '
            "examples/parallel_dims.py:torchtitan or mypackage.train:build_meshes"
        )
    if where.endswith(".py") or os.sep in where or "/" in where:
        path = Path(where)
        if not path.is_file():
            raise CliError(f'"{text}": no file {where}')
        module_name = path.stem
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise CliError(f'"{text}": cannot import {where}')
        module = importlib.util.module_from_spec(spec)
        # Registered first, as an import would: dataclasses and attrs look it up.
        sys.modules[module_name] = module
        sys.path.insert(0, str(path.resolve().parent))
        spec.loader.exec_module(module)
    else:
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as err:
            raise CliError(f'"{text}": no module {where!r} ({err})') from None
    fn = getattr(module, name, None)
    if not callable(fn):
        # Its own functions only, not the names it imported.
        found = sorted(
            k
            for k, v in vars(module).items()
            if inspect.isfunction(v)
            and v.__module__ == module.__name__
            and not k.startswith("_")
        )
        more = f" and {len(found) - 40} more" if len(found) > 40 else ""
        has = f"its functions: {', '.join(found[:40])}{more}" if found else "it defines none"
        raise CliError(f'"{text}": {where} has no function {name!r}; {has}')
    return cast("Callable[[], object]", fn)


def plan_target(
    target: str,
    *,
    world: int,
    rank: str,
    as_json: bool,
    backend: str | None = None,
    launch: str = "route",
) -> tuple[str, int]:
    """Plan ``target``; the text (or JSON) to print and the exit status."""
    if world < 1 or world > 2**31 - 1:
        raise CliError(f"--world {world} is out of range; expected 1..{2**31 - 1} ranks")
    ranks, sample = parse_rank_arg(rank, world)
    if ranks is not None and any(not 0 <= r < world for r in ranks):
        raise CliError(
            f"--rank {rank} is not in the world of {world} ranks; expected 0..{world - 1}"
        )
    fn = load_target(target)
    if "torch" not in sys.modules:
        print("fmesh plan: importing torch ...", file=sys.stderr, flush=True)
    if backend is not None:
        from .._runtime.checks import check_backend

        check_backend(backend, "--backend")
    from .._plan.render import plan_json, plan_text, rank_line
    from .._plan.report import RankPlan
    from .._plan.run import plan

    tty = sys.stderr.isatty()
    done = [0]
    total = len(set(ranks)) if ranks is not None else min(sample or 0, world)

    def progress(p: RankPlan) -> None:
        done[0] += 1
        if tty:
            print(f"[{done[0]}/{total}] {rank_line(p)}", file=sys.stderr, flush=True)

    try:
        report = plan(
            fn,
            world=world,
            ranks=ranks,
            sample=sample,
            backend=backend,
            launch=launch,
            on_rank=progress,
        )
    except Exception:
        traceback.print_exc()
        print(f"fmesh plan: {target} raised (see above)", file=sys.stderr)
        return "", 1
    report = attrs.evolve(report, target=target)
    text = plan_json(report) if as_json else plan_text(report)
    return text, 0 if report.ok else 1


def plan_command(args: argparse.Namespace) -> tuple[str, int]:
    spec_only = {
        "--flatten": bool(args.flatten),
        "--unflatten": bool(args.unflatten),
        "--local-world-size": args.local_world_size != "8",
    }
    given = [flag for flag, used in spec_only.items() if used]
    if given:
        raise CliError(
            f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for a mesh spec; "
            f'"{args.mesh_arg}" is a module:function, whose own code builds its meshes'
        )
    if args.world is None:
        raise CliError(
            f'plan "{args.mesh_arg}" needs --world N, the world size to play '
            "(e.g. --world 2**17): the function's meshes are not known before it runs"
        )
    return plan_target(
        args.mesh_arg,
        world=parse_count(args.world, "--world"),
        rank=args.rank or "sample:8",
        as_json=args.json,
        backend=args.backend,
        launch=args.launch,
    )
