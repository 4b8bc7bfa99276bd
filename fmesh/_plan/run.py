"""``fmesh.plan``: run a function that builds meshes as chosen ranks of a fake world.

For each rank, in turn and independently: a fresh ``fake`` default group of ``world``
ranks, the launch predicted played (torch's ``init_device_mesh`` and DeviceMesh
methods routed through fmesh, or torch's own) and torch's own group creation observed
(``patch.py``), the torchrun variables set
(``environment.py``), then the function; its group-creating calls are recorded
(``events.py``), and everything is torn down before the next rank. torch is imported
on first use, never by ``import fmesh``.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Sequence

from .._core.errors import MeshError
from .._core.mesh import Mesh
from .._protocol.stream import stream_words
from .._runtime.cache import cache_stats, destroy
from .._runtime.checks import check_backend
from .._runtime.launch import init_fake_world, play_backend
from .._runtime.memo import state
from .compare import first_divergence, name_warnings
from .environment import peak, reset_peak, torchrun_environment
from .events import Recorder, active
from .meshes import meshes
from .patch import LAUNCHES, routed_torch
from .report import PlanReport, RankPlan
from .sample import spread

__all__ = ["plan", "trailing_hits"]

MAX_WORLD = 2**31 - 1
"""c10d ranks and world sizes are 32-bit ints."""
DEFAULT_SAMPLE = 8
DEFAULT_BACKEND = "cpu:gloo,cuda:nccl"
"""The default group's backend fmesh starts on a GPU host (``launch.py``)."""


def plan(
    fn: Callable[[], object],
    *,
    world: int,
    ranks: Sequence[int] | None = None,
    sample: int | None = None,
    backend: str | None = None,
    launch: str = "route",
    on_rank: Callable[[RankPlan], None] | None = None,
) -> PlanReport:
    """Run ``fn()`` as each of some ranks of a fake world and report what it built.

    For each rank, in turn: a fresh default group of ``world`` ranks on torch's
    ``fake`` backend (``fmesh.init_fake_world()``), the variables torchrun sets for a
    worker (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
    ``TORCHELASTIC_RUN_ID``, ...; hosts of 8), and the launch it predicts: under
    ``launch="route"`` (``torchrun ... -m fmesh.route``) torch's own
    ``init_device_mesh`` (wherever it is held, copies captured at import included)
    and DeviceMesh methods are routed through fmesh, so unmodified trainer code is
    planned as that launch runs it; under ``launch="torch"`` (plain torchrun) they
    stay torch's, with its errors (arguments it does not take) and its group
    creation. Then ``fn()`` runs. Every group it makes is recorded, whatever makes it:
    fmesh's realize calls, and torch's own ``new_group``, ``split_group``,
    ``init_process_group`` and a DeviceMesh torch builds itself (from a tensor, or by
    an ``init_device_mesh`` held since before the routing), with the backend and
    options each asks for; real backends (``nccl``, ``gloo``) are played by the fake
    one. Its meshes, wall time and peak memory are recorded too, and everything is
    torn down (torch's functions restored, ``fmesh.destroy()``, the default group
    destroyed). Finally the ranks' group-creating calls are compared as a launch needs
    them to match: the same calls in the same order with the same ranks, backends and
    options (a local ``new_group`` among its members), fmesh's realize calls by the
    digest its agreement compares.

    Args:
        fn: builds the meshes (through fmesh or torch's DeviceMesh API); takes no
            arguments: read the world size and rank as a trainer would (the
            environment, or ``torch.distributed``). If it returns a mapping of names
            to meshes (``DeviceMesh``, ``Mesh`` or ``RealizedMesh``), they are
            reported under those names.
        world: the world size to play, e.g. ``2**17``.
        ranks: the ranks to plan (``range(world)`` for all of them).
        sample: instead of ``ranks``, plan this many ranks spread over the world: the
            first, the last, and ranks at distinct coordinates of every axis of the
            meshes rank 0 built (default: 8 when ``ranks`` is not given either). A
            sample can miss a rank that alone diverges: plan every rank of a small
            world to be sure.
        backend: the default group's backend at launch, where ``fn`` does not start
            the group itself (its own ``init_process_group(backend)`` wins): fmesh's
            realize calls name it where no backend is given, as a launch's would. Default
            ``"cpu:gloo,cuda:nccl"``, what fmesh starts on a GPU host.
        launch: the launch to predict: ``"route"`` (default; ``torchrun ... -m
            fmesh.route``, or code that calls ``fmesh.device_mesh.route()``) or
            ``"torch"`` (plain torchrun with the installed torch: a group only some
            ranks create hangs it; ``split_group`` without a device bound to the
            default group raises, as torch does).
        on_rank: called with each rank's plan as soon as it is done (progress).

    Returns:
        A ``PlanReport`` of that launch (``launch``), whose ``check()`` raises
            ``MeshMismatchError`` when two ranks would disagree at launch and whose
            ``outcome`` says what the launch does: ``"finished"``,
            ``"MeshMismatchError"`` or ``"hang"``.

    Raises:
        MeshError: a world or rank out of range; a default process group exists.
        TypeError: ``ranks`` and ``sample`` both given, or arguments of the wrong type.
        ValueError: ``launch`` is neither ``"route"`` nor ``"torch"``.
        Exception: whatever ``fn`` raised, with a note naming the rank.

    Example:
        >>> import fmesh
        >>> def build():
        ...     fmesh.realize(fmesh.make_mesh({"dp": 4, "tp": 2}))
        >>> report = fmesh.plan(build, world=8, ranks=[0, 7])
        >>> report.ok, [r.created for r in report.ranks]
        (True, [2, 2])
    """
    world = _check_int(world, "world")
    if not 1 <= world <= MAX_WORLD:
        raise MeshError(f"plan() world is {world}; expected 1..{MAX_WORLD} ranks")
    if ranks is not None and sample is not None:
        raise TypeError("plan() takes ranks or sample, not both")
    wanted: list[int] | None = None
    if ranks is not None:
        if isinstance(ranks, int | str):
            raise TypeError(f"plan() ranks must be a sequence of ints, got {ranks!r}")
        wanted = list(dict.fromkeys(_check_int(r, "ranks entry") for r in ranks))
        outside = [r for r in wanted if not 0 <= r < world]
        if not wanted or outside:
            raise MeshError(
                f"plan() ranks {list(ranks)}: expected one or more ranks in 0..{world - 1}"
            )
    if launch not in LAUNCHES:
        raise ValueError(f"plan() launch must be 'route' or 'torch', got {launch!r}")
    count = DEFAULT_SAMPLE if sample is None else _check_int(sample, "sample")
    if count < 1:
        raise MeshError(f"plan() sample is {count}; expected at least 1 rank")
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        raise MeshError(
            "fmesh.plan() plays each rank on a fresh fake world, but this process has a "
            "default process group already; call it before init_process_group(), or "
            "after torch.distributed.destroy_process_group()"
        )
    played = (
        DEFAULT_BACKEND if backend is None else check_backend(backend, "plan(backend=...)")
    )
    plans: list[RankPlan] = []
    queue = list(wanted) if wanted is not None else [0]
    # Routed once for all ranks: finding every module that holds torch's function
    # scans all modules (tens of ms with torch loaded).
    with routed_torch(launch):
        while queue:
            rank = queue.pop(0)
            rank_plan, meshes = _plan_rank(fn, world, rank, played)
            plans.append(rank_plan)
            if on_rank is not None:
                on_rank(rank_plan)
            if wanted is None and len(plans) == 1:
                queue = [r for r in spread(world, meshes, count) if r != rank]
    target = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
    return PlanReport(
        target,
        world,
        tuple(plans),
        first_divergence(plans),
        launch,
        torch.__version__,
        name_warnings(plans),
    )


def _check_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"plan() {what} must be int, got {value!r}")
    return value


# -- one rank ---------------------------------------------------------------------------


def _plan_rank(
    fn: Callable[[], object], world: int, rank: int, backend: str
) -> tuple[RankPlan, list[Mesh]]:
    """Plan one rank; returns its plan and the meshes it realized."""
    import torch.distributed as dist

    recorder = Recorder(rank, backend)
    play_backend(backend)
    recorders = active()
    # torch's init_process_group wraps sys.excepthook to prefix "[rank<r>]" and never
    # unwraps it: a launch does that once, a plan once per rank.
    excepthook = sys.excepthook
    with torchrun_environment(world, rank), warnings.catch_warnings():
        # Nothing runs on NCCL here: torch's warning that it is not built in is noise.
        warnings.filterwarnings("ignore", "Attempted to get default timeout for nccl")
        init_fake_world(world, rank)
        recorders.append(recorder)
        try:
            before = cache_stats().created
            resident = reset_peak()
            start = time.perf_counter()
            try:
                result = fn()
            except Exception as err:
                err.add_note(f"fmesh.plan: raised on rank {rank} of a fake world of {world}")
                raise
            seconds = time.perf_counter() - start
            top = peak()
            created = cache_stats().created - before
            tail = trailing_hits()
            planned, held, comms = meshes(recorder, result)
        finally:
            recorders.remove(recorder)
            play_backend(None)
            sys.excepthook = excepthook
            destroy()
            if dist.is_initialized():  # the function may have torn it down itself
                dist.destroy_process_group()
    growth = None if top is None or resident is None else max(top - resident, 0)
    rank_plan = RankPlan(
        rank=rank,
        meshes=tuple(planned),
        calls=tuple(recorder.calls),
        created=created,
        held=held,
        communicators=comms,
        seconds=seconds,
        peak_memory=top,
        memory_growth=growth,
        tail=tail,
    )
    return rank_plan, [m for m, _ in recorder.realized]


def trailing_hits() -> str:
    """The memo hits since the last creating realize call, per stream, in words."""
    with state.lock:
        return "; ".join(
            s.stream.describe_history() + stream_words(name)
            for name, s in state.streams.items()
            if s.stream.hits
        )
