"""realize: the one side-effecting step, from a Mesh value to process groups.

Read top-down, ``realize`` is a sequence of steps, each in a module below that does
its job and returns: the arguments checked and keyed (``call.py``); a repeated call
served from its stream's table, else the call's turn in its stream (``turns.py``);
the new call laid out, its number in the stream taken (``call.py``); agreed with
every rank and this rank's groups created under the peer watch (``creation.py``,
over ``groups.py`` and the protocol's ``agreement.py`` and ``liveness.py``); the call
kept for the fast repeat as its turn ends (``turns.py``). Details:
``docs/design/agreement-protocol.md``.
"""

from __future__ import annotations

import datetime
import logging
import time
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .._protocol import liveness
from .call import Arguments, checked, expand
from .creation import create_groups
from .hooks import run_realized_hooks
from .realized_mesh import RealizedMesh
from .turns import turn

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from .._compat import BackendOptions
    from .._core.mesh import Mesh

__all__ = ["realize", "realize_for_torch"]

logger = logging.getLogger("fmesh")


def realize(
    mesh: Mesh,
    *,
    backend: str | Mapping[str, str | None] | None = None,
    options: BackendOptions | Mapping[str, BackendOptions | None] | None = None,
    timeout: datetime.timedelta | None = None,
    check: bool = False,
) -> RealizedMesh:
    """Create (or reuse) the process groups the calling rank needs for ``mesh``.

    Every rank calls ``realize`` with the same mesh, in the same order (SPMD); ranks
    outside the mesh get a [`RealizedMesh`][fmesh.RealizedMesh] with ``coordinate`` None
    and no groups. Calls are matched across ranks by the order each rank makes them,
    whatever thread makes them (per stream inside [`fmesh.stream`][fmesh.stream] blocks).
    A call that creates nothing (every axis realized before in the stream, with a group
    torch still holds, or served by the default group) is a local lookup: no store
    request, no peer. A call that creates groups checks its call against the first
    rank's before it creates a group, and ends once every rank has made its groups, so
    ranks that disagree raise instead of hanging. A group destroyed or aborted since is
    made afresh (agreed as usual). If no default process group exists, one is
    initialized from the torchrun environment: with ``backend`` when it is a single
    string, else NCCL with a bound device when CUDA is available and gloo otherwise.

    Args:
        mesh: the mesh to realize.
        backend: ``None`` (the default group's backend), a backend string such as
            ``"gloo"``, ``"nccl"`` or ``"cpu:gloo,cuda:nccl"``, or a mapping from axis
            name to backend for per-axis overrides.
        options: backend options (e.g. ``ProcessGroupNCCL.Options``), global or as a
            mapping from axis name to options.
        timeout: how long group creation and the cross-rank agreement may wait for
            peers. Default: torch's default timeout for the call's backend, as torch's
            own ``new_group`` waits for a late rank (30 minutes for gloo, 10 for NCCL;
            the longest where axes have different backends); a rank waiting longer
            than a minute logs a warning each minute on the ``fmesh`` logger, naming
            the ranks not there yet. Groups fmesh creates keep it as their collective
            timeout, so it is part of a group's identity: the same mesh realized with
            another timeout (or none) gets groups of its own.
        check: agree with every rank even if the call creates nothing (debugging;
            every rank must pass it for the same call). ``TORCH_DISTRIBUTED_DEBUG=DETAIL``
            does this for every call.

    Returns:
        A [`RealizedMesh`][fmesh.RealizedMesh]: this rank's coordinate and groups (none
        off the mesh), and a torch ``DeviceMesh`` on demand.

    Raises:
        MeshMismatchError: ranks disagree about this call (its axis names included),
            or about the calls made since the last agreement (memo hits included); a
            rank never arrived within the timeout. ``realize`` is strict: torch's API
            through fmesh (the drop-in, ``-m fmesh.route``) is not, as torch is not:
            there ranks agree on the groups only, and axis names that differ are a
            warning.
        PeerLostError: a rank died while the call's ranks created their groups;
            every surviving rank raises it within seconds (typically 4 to 6 s at
            default settings, 30 s at most), keeping no group of the call. Call
            ``fmesh.recover`` to carry on without it. A rank the others gave up on
            while it lived (its host or network silent for 8 s, or itself cut off from
            the store) raises it too, naming itself. A rank that is only slow
            (stopped, frozen, a thread holding the GIL) is waited for, as torch does.
        LaunchError: no process group and no usable torchrun environment.
        MeshError: the mesh needs ranks the world does not have; an unknown backend;
            a non-positive timeout.
    """
    return _carry_out(checked(mesh, backend, options, timeout, check))


def realize_for_torch(
    mesh: Mesh,
    *,
    backend: str | Mapping[str, str | None] | None = None,
    options: BackendOptions | Mapping[str, BackendOptions | None] | None = None,
    timeout: datetime.timedelta | None = None,
    prepare: Callable[[RealizedMesh], object] | None = None,
) -> RealizedMesh:
    """``realize`` for torch's API (the drop-in ``init_device_mesh``, torch's DeviceMesh
    methods on fmesh's meshes, ``-m fmesh.route``): as lenient as torch, whose group
    creation depends only on the groups asked for. The ranks agree on what determines
    the groups (layouts, rank map, backends, options), not on the axis names (the
    protocol compares them apart: a warning where they differ) nor on the memo hits
    made before, which create nothing and join no history (``Turn.lenient``).

    ``prepare(realized)``, for a call that creates groups: what the caller builds of
    the result (a DeviceMesh), made while the slowest rank finishes (before the
    closing round's wait); dropped if the call then fails. Not called for a memo hit.
    """
    args = checked(mesh, backend, options, timeout, False, lenient=True)
    return _carry_out(args, prepare)


def _carry_out(
    args: Arguments, prepare: Callable[[RealizedMesh], object] | None = None
) -> RealizedMesh:
    mesh = args.mesh
    with turn(args) as slot:
        if slot.repeat is not None:
            return slot.repeat
        start = time.perf_counter()
        liveness.warm()  # this process's liveness port opens while the call is laid out
        call = expand(args)
        made: list[RealizedMesh] = []

        def meanwhile(groups: dict[str, ProcessGroup], created: int) -> None:
            made.append(
                RealizedMesh(
                    mesh=mesh,
                    rank=call.world.rank,
                    coordinate=call.coordinate,
                    groups=types.MappingProxyType(groups),
                    created=created,
                )
            )
            if prepare is not None:
                prepare(made[0])

        groups, created = create_groups(call, meanwhile)
        (realized,) = made
        slot.kept = (call, realized)  # kept for the fast repeat as the turn ends
        run_realized_hooks(mesh, groups)
        logger.info(
            "fmesh.realize %r on rank %d: %d groups created, %d from memo, %.1f ms",
            mesh,
            call.world.rank,
            created,
            len(groups) - created,
            (time.perf_counter() - start) * 1e3,
        )
        return realized
