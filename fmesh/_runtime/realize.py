"""realize: the one side-effecting step, from a Mesh value to process groups.

A repeated call is a dictionary lookup in its stream (``stream.py``). A new one waits
for its turn in the stream, is laid out by ``call.py``, agreed with every rank when it
creates groups (``agreement.py``), then ``groups.py`` creates this rank's groups while
``liveness.py`` watches the peers they wait for. Details:
``docs/design/agreement-protocol.md``.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
import time
import types
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from .._compat import live_groups
from .._core.errors import MeshMismatchError, PeerLostError
from . import agreement as _agree
from . import liveness
from .call import Arguments, checked, expand
from .groups import AxisRequest, World, create
from .hooks import run_creating_call_hooks, run_realized_hooks
from .memo import state
from .realized_mesh import RealizedMesh
from .stream import stream_key, stream_words

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from .._compat import BackendOptions
    from .._core.mesh import Mesh

__all__ = ["realize"]

logger = logging.getLogger("fmesh")

DEFAULT_CHECK_TIMEOUT = datetime.timedelta(minutes=5)


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
    request, no peer. A call that creates groups first agrees with every rank, so ranks
    that disagree raise instead of hanging. A group destroyed or aborted since is made
    afresh (agreed as usual). If no default process group exists, one is initialized from
    the torchrun environment: with ``backend`` when it is a single string, else NCCL
    with a bound device when CUDA is available and gloo otherwise.

    Args:
        mesh: the mesh to realize.
        backend: ``None`` (the default group's backend), a backend string such as
            ``"gloo"``, ``"nccl"`` or ``"cpu:gloo,cuda:nccl"``, or a mapping from axis
            name to backend for per-axis overrides.
        options: backend options (e.g. ``ProcessGroupNCCL.Options``), global or as a
            mapping from axis name to options.
        timeout: how long group creation and the cross-rank agreement may wait for
            peers (default: torch's backend timeout for creation, 5 minutes for the
            agreement). Groups fmesh creates keep it as their collective timeout, so
            it is part of a group's identity: the same mesh realized with another
            timeout (or none) gets groups of its own.
        check: agree with every rank even if the call creates nothing (debugging;
            every rank must pass it for the same call). ``TORCH_DISTRIBUTED_DEBUG=DETAIL``
            does this for every call.

    Returns:
        A [`RealizedMesh`][fmesh.RealizedMesh]: this rank's coordinate and groups (none
        off the mesh), and a torch ``DeviceMesh`` on demand.

    Raises:
        MeshMismatchError: ranks disagree about this call, or about the calls made
            since the last agreement; a rank never arrived within the timeout.
        PeerLostError: a rank died after every rank agreed on the call, before its
            groups were all made; every surviving rank raises it within seconds
            (about half of ``timeout``, at least 4 s, when that is shorter than
            16 s), keeping no group of the call. Call ``fmesh.recover`` to carry on without it.
        LaunchError: no process group and no usable torchrun environment.
        MeshError: the mesh needs ranks the world does not have; an unknown backend;
            a non-positive timeout.
    """
    args = checked(mesh, backend, options, timeout, check)
    realized: RealizedMesh | None = _repeat(args)
    if realized is not None:
        return realized
    with _turn(args.stream_name):
        # Another thread may have made the same call while this one waited its turn.
        realized = _repeat(args)
        return realized if realized is not None else _realize_new(args)


def _repeat(args: Arguments) -> RealizedMesh | None:
    """A repeated call's value, if its groups are all alive (a hit: no peer, no
    store; O(number of axes)); else ``None``."""
    if args.key is None or args.check or state.world is None:
        return None
    import torch.distributed as dist

    alive = live_groups().__contains__
    with state.lock:
        stream = state.streams.get(args.stream_name)
        if stream is None or state.debug or state.world is not dist.group.WORLD:
            return None
        realized: RealizedMesh | None = stream.replay(
            args.key, lambda r: all(map(alive, r.groups.values()))
        )
        if realized is not None:
            state.reused += args.mesh.ndim
        return realized


@contextlib.contextmanager
def _turn(name: str) -> Iterator[None]:
    """Carry out a call that is not a repeat in its turn: the calls of one stream go
    one at a time, in the order they started. A call queued behind one that failed
    to agree fails with it. A nested call of the thread carrying one out goes on."""
    me = threading.get_ident()
    with state.lock:
        stream = state.stream(name)
        nested = stream.holder == me
        if not nested:
            ticket = stream.enter()
            state.turns.wait_for(lambda: stream.ready(ticket))
            stream.holder = me
            doomed = stream.doomed(ticket)
            if doomed:
                stream.leave(ticket)
                state.turns.notify_all()
    if nested:
        yield
        return
    if doomed:
        raise MeshMismatchError(
            f"this realize call{stream_words(name)} was waiting for its turn behind one "
            f"that failed ({doomed}), so it cannot be matched across ranks either. If "
            "threads of this process realize meshes at the same time, their order can "
            "differ between ranks: give each thread's calls a stream of their own, "
            "with fmesh.stream(name), the same name on every rank"
        )
    failure = ""
    try:
        yield
    except MeshMismatchError as err:
        failure = str(err).split(";")[0][:200]
        raise
    finally:
        with state.lock:
            stream.leave(ticket, failure)
            state.turns.notify_all()


def _realize_new(args: Arguments) -> RealizedMesh:
    """A call that is not a repeat, in its turn: lay it out, agree if it creates
    groups, create them."""
    mesh, timeout = args.mesh, args.timeout
    start = time.perf_counter()
    call = expand(args)
    if call.agrees:  # fmesh plan compares these across ranks, fake worlds included
        turn = call.turn
        run_creating_call_hooks(turn.number, turn.code, call.summary, lambda: turn.history)
    world, me = call.world, call.world.rank
    ticket: _agree.Ticket | None = None
    if call.agrees and not world.fake and world.size > 1:
        from .._compat import default_store

        where = f"realize call #{call.turn.number}{stream_words(args.stream_name)}"
        turn, summary = call.turn, call.summary
        ticket = _agree.agree(
            default_store(),
            rank=me,
            ranks=call.ranks,
            code=turn.code,
            record=lambda: _agree.Record(me, turn.code, str(summary), turn.history),
            timeout=timeout or DEFAULT_CHECK_TIMEOUT,
            prefix=(
                f"{_agree.KEY_ROOT}{call.generation}/"
                f"{stream_key(args.stream_name)}/{call.turn.number}/"
            ),
            where=where,
        )

    groups: dict[str, ProcessGroup] = {}
    made_now: list[ProcessGroup] = []
    watch = liveness.start(ticket, timeout)
    try:
        with liveness.active(watch):
            for request in call.requests:
                with liveness.waiting_for(watch, request.members):
                    pg, made = _axis_group(request, world, timeout, ticket)
                if made and pg is not None:
                    made_now.append(pg)
                if pg is not None:
                    groups[request.name] = pg
            if watch is not None:
                from .._compat import default_timeout

                # Every peer's creation of each group is bounded by the timeout, and a
                # peer that fails or dies says so at once: wait for the slowest.
                patience = timeout or default_timeout(world.backend)
                watch.finish(patience * (len(call.requests) + 1))
    except BaseException as err:
        if watch is not None:
            if not isinstance(err, PeerLostError):
                watch.fail(err)
            watch.close()
        _forget(made_now)
        raise
    if watch is not None:
        watch.close()
    created = len(made_now)
    realized = RealizedMesh(
        mesh=mesh,
        rank=me,
        coordinate=call.coordinate,
        groups=types.MappingProxyType(groups),
        created=created,
    )
    with state.lock:
        if state.generation == call.generation:
            call.stream.known.update(r.key for r in call.requests)
            if args.key is not None:
                hit_value = realized if created == 0 else _as_hit(realized)
                call.stream.remember(args.key, hit_value, call.code, call.summary)
    run_realized_hooks(mesh, groups)
    logger.info(
        "fmesh.realize %r on rank %d: %d groups created, %d from memo, %.1f ms",
        mesh,
        me,
        created,
        len(groups) - created,
        (time.perf_counter() - start) * 1e3,
    )
    return realized


def _axis_group(
    request: AxisRequest,
    world: World,
    timeout: datetime.timedelta | None,
    ticket: _agree.Ticket | None,
) -> tuple[ProcessGroup | None, int]:
    """This rank's group along one axis: from the axis memo, else created once."""
    return state.axis(request.key, lambda: create(request, world, timeout, ticket))


def _forget(made: list[ProcessGroup]) -> None:
    """A failed call keeps none of the groups it made: out of the memo, destroyed."""
    if not made:
        return
    import torch.distributed as dist

    ids = {id(pg) for pg in made}
    with state.lock:
        for key, pg in list(state.group_memo.items()):
            if id(pg) in ids:
                del state.group_memo[key]
        for axis, value in list(state.axis_memo.items()):
            if value is not None and id(value) in ids:
                del state.axis_memo[axis]
        state.created_pgs[:] = [pg for pg in state.created_pgs if id(pg) not in ids]
        state.created -= len(made)
    for pg in made:
        try:
            dist.destroy_process_group(pg)
        except (RuntimeError, ValueError) as err:  # already gone
            logger.debug("fmesh: destroying a group of a failed call: %s", err)


def _as_hit(realized: RealizedMesh) -> RealizedMesh:
    """The value a later hit of the same call returns (it creates nothing)."""
    return RealizedMesh(
        mesh=realized.mesh,
        rank=realized.rank,
        coordinate=realized.coordinate,
        groups=realized.groups,
        created=0,
    )
