"""Starting the default process group from the torchrun environment, and the facts
about it that every realize call uses (``World``; ``serves``: the axes it is the group
of). The checks of backends, devices and timeouts are in ``checks.py``.

torch is imported inside the functions, never by ``import fmesh``.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, final

import attrs

from .._compat import debug_detail
from .._core.errors import LaunchError, MeshError
from .memo import state

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from .._core.layout import Layout
    from .._core.mesh import Mesh

__all__ = [
    "World",
    "current_world",
    "ensure_default_group",
    "init_fake_world",
    "play_backend",
    "serves",
]

logger = logging.getLogger("fmesh")

_init_lock = threading.Lock()
"""Serializes the first initialization of the default group (which waits on peers,
so it is not the memo lock)."""

_played: list[str] = []
"""On a fake world: the backend the planned trainer started its default group with."""


def play_backend(backend: str | None) -> None:
    """On a fake world, let realize take the default group's backend to be
    ``backend`` (the one the planned trainer's ``init_process_group`` asked for), as
    a launch would: the calls it codes and compares name it. ``None``: ``fake``."""
    _played[:] = [] if backend is None else [backend]


_LAUNCH_HELP = """\
fmesh.realize() found no default process group and cannot create one: the torchrun
environment variables {missing} are not set.

Launch the script with torchrun, which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
and MASTER_PORT for every process, e.g.

    torchrun --standalone --nproc-per-node 4 {program}

or call torch.distributed.init_process_group(...) yourself before realize()."""

# Options of the interpreter that take a value (`python -W error train.py`).
_VALUED = frozenset("WX")


def _program(orig_argv: Sequence[str]) -> str | None:
    """What follows ``torchrun ...`` to run this process's program again: the script
    or ``-m module``, with its arguments, as the interpreter's command line gave them
    (``sys.orig_argv``); ``None`` when there is no program to name (``-c``, standard
    input, an interactive session, a Jupyter kernel)."""
    args = list(orig_argv[1:])
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):  # long options: one takes a value
            i += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        if not arg.startswith("-") or arg == "-":
            return None if arg == "-" else shlex.join(args[i:])
        for pos in range(1, len(arg)):  # a cluster of one-letter options: -u, -uBm
            letter, rest = arg[pos], arg[pos + 1 :]
            if letter == "c":
                return None
            if letter == "m":
                module = rest or (args[i + 1] if i + 1 < len(args) else "")
                tail = args[i + 1 :] if rest else args[i + 2 :]
                if not module or module.startswith("ipykernel"):
                    return None
                return shlex.join(["-m", module, *tail])
            if letter in _VALUED:
                i += 0 if rest else 1
                break
        i += 1
    return None


@final
@attrs.frozen(slots=True)
class World:
    """Facts about the default process group that shape every creation."""

    pg: ProcessGroup
    size: int
    rank: int
    backend: str
    fake: bool
    eager: bool
    """The default group has a bound device (eagerly initialized NCCL)."""
    intact: bool = True
    """No rank was declared lost: the default group may still be used."""


def serves(world: World, mesh: Mesh, layout: Layout, backend: str, options: object) -> bool:
    """The default group is the group along ``layout`` on every rank (O(1)): the axis
    is every rank of the world in rank order, on the world's backend and options."""
    return (
        world.intact
        and options is None
        and backend == world.backend
        and mesh.rank_map is None
        and mesh.index_size == world.size
        and layout.modes == ((world.size, 1),)
    )


def _device_help(local_rank: int, count: int) -> str:
    seen = (
        "sees no CUDA device"
        if count == 0
        else f"sees {count} CUDA device(s) (cuda:0..cuda:{count - 1})"
    )
    fixes = [
        'ask for a CPU world: fmesh.realize(mesh, backend="gloo")',
        "or initialize the default group yourself before realize() "
        "(torch.distributed.init_process_group(...))",
    ]
    if count:
        fixes.insert(
            0,
            f"launch at most {count} process(es) per node (torchrun --nproc-per-node {count})",
        )
        fixes[1] = "or " + fixes[1]
    return (
        f"fmesh.realize() would start NCCL on cuda:{local_rank} "
        f"(LOCAL_RANK={local_rank}), but this process {seen}. Either:\n"
        + "\n".join(f"  * {fix}," for fix in fixes).rstrip(",")
        + "."
    )


def ensure_default_group(backend: str | None) -> None:
    """Initialize the default group from the torchrun environment if there is none.

    ``backend`` is the global backend the caller asked realize for, or ``None``: then
    NCCL with a bound device when CUDA is available, gloo otherwise.
    """
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    needed = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    missing = [v for v in needed if v not in os.environ]
    if missing:
        program = _program(sys.orig_argv) or "your_script.py"
        raise LaunchError(_LAUNCH_HELP.format(missing=", ".join(missing), program=program))
    if "LOCAL_RANK" not in os.environ:
        raise LaunchError(
            "fmesh.realize() found RANK and WORLD_SIZE but no LOCAL_RANK, so it cannot "
            "tell which device this process owns. Launch with torchrun (it sets "
            "LOCAL_RANK), set LOCAL_RANK yourself, or call "
            "torch.distributed.init_process_group(...) before realize()."
        )
    try:
        local_rank = int(os.environ["LOCAL_RANK"])
    except ValueError:
        raise LaunchError(
            f"LOCAL_RANK={os.environ['LOCAL_RANK']!r} is not an integer"
        ) from None
    wants_nccl = (
        "nccl" in backend.lower() if backend is not None else torch.cuda.is_available()
    )
    if not wants_nccl:
        dist.init_process_group(backend=backend or "gloo")
    else:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not 0 <= local_rank < count:
            raise LaunchError(_device_help(local_rank, count))
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group(backend=backend or "cpu:gloo,cuda:nccl", device_id=device)
    logger.info(
        "fmesh: initialized the default process group (%s) from the torchrun "
        "environment, rank %d of %d",
        dist.get_backend(),
        dist.get_rank(),
        dist.get_world_size(),
    )


def init_fake_world(world_size: int, rank: int) -> None:
    """Start the default process group on torch's ``fake`` backend, for dry runs.

    This process then plays ``rank`` of a ``world_size``-rank world: [`realize`][fmesh.realize]
    creates this rank's groups as it would for real (nothing is communicated), so a
    100k-rank configuration can be checked on a laptop. Tear it down with
    ``fmesh.destroy()`` and ``torch.distributed.destroy_process_group()``.

    Raises:
        TypeError: for arguments that are not int.
        MeshError: for a rank outside ``0..world_size-1``, or when a default group
            already exists.
    """
    import torch.distributed as dist

    from .._compat import init_fake_world as init

    for name, value in (("world_size", world_size), ("rank", rank)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"init_fake_world() {name} must be int, got {value!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise MeshError(
            f"init_fake_world() got rank {rank} of world_size {world_size}; expected "
            f"world_size >= 1 and 0 <= rank < world_size"
        )
    if dist.is_initialized():
        raise MeshError(
            "init_fake_world() found a default process group already; call "
            "torch.distributed.destroy_process_group() first"
        )
    init(rank, world_size)


def current_world(backend: object) -> World:
    """The default group (started from the torchrun environment if needed); the memo
    is reset when it changed."""
    import torch.distributed as dist

    with _init_lock:
        ensure_default_group(backend if isinstance(backend, str) else None)
    world_pg = dist.group.WORLD
    assert world_pg is not None
    world_backend = str(dist.get_backend())
    if world_backend == "threaded":
        raise MeshError(
            "fmesh.realize() cannot run on torch's threaded test world: every rank is a "
            "thread of one process, but fmesh's memo and its order of calls are per "
            "process. Use real processes (torchrun, or the 'fake' "
            "backend via fmesh.init_fake_world for dry runs); "
            "fmesh.device_mesh.init_device_mesh hands threaded worlds to torch."
        )
    with state.lock:
        if state.world is not world_pg:
            if state.world is not None:
                logger.info("fmesh: the default process group changed; memo reset")
            state.reset()
            state.world = world_pg
        state.debug = debug_detail()
        intact = not state.loss.lost
    fake = world_backend == "fake"
    return World(
        pg=world_pg,
        size=dist.get_world_size(),
        rank=dist.get_rank(),
        backend=_played[0] if fake and _played else world_backend,
        fake=fake,
        eager=getattr(world_pg, "bound_device_id", None) is not None,
        intact=intact,
    )
