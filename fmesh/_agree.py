"""World-wide agreement on each realize call: ranks that disagree, stall, die or race
get a :class:`~fmesh.MeshMismatchError`, never a hang.

API (torch is imported on first use; ``store`` is any ``torch.distributed.Store``, in
practice the default group's store)::

    agree(store, *, rank, world, digest, summary, timeout, blocking=True,
          stream=None, call=None) -> Ticket
        Publish this rank's digest for its next call of ``stream`` and (blocking)
        wait until every rank of the world agreed, or raise.
    confirm_pending() -> None
        Raise if a call this rank made with ``blocking=False`` was aborted since
        (``agree`` does this first; never waits).
    abort(ticket, message) -> None
        After agreement (say group creation failed here): tell the other ranks why.
    failures(ticket, wait=0.0) -> dict[int, str]
        Why other ranks gave up on a call (``abort``), waiting up to ``wait`` seconds.
    next_call(stream) -> int
        Number the next call of ``stream`` on this rank: 1, 2, ... (``agree`` uses it).
    reset() -> None
        Forget every stream and pending call (``fmesh.destroy``): a new generation.
    count_keys(store) -> int
        How many keys of this protocol the store holds (for tests).
    thread_store(store) -> Store
        The connection this thread uses: the store itself on the main thread, a
        cached clone on others (give it to each group creation).

Calls are matched across ranks per *stream*, by default the calling thread's name:
the k-th call of the thread named T on one rank meets the k-th call of the thread
named T on every other rank, whatever other threads do meanwhile (threads started in
the same order get the same default names; name them otherwise).

Protocol for call k of stream T, keys under ``P = fmesh/agree/<generation>/<T>/<k>/``,
a constant number of store round trips per rank whatever the world size:

1. ``compare_set(P+"digest", "", "<digest>\\n<rank>\\n<summary>")`` returns the first
   publisher's record. A rank whose digest differs knows both meshes and both ranks at
   once: it sets ``P+"done"`` to an abort (first abort wins) and raises.
2. Otherwise ``append(P+"who", "<rank>,")`` and ``add(P+"arrived", 1)``; the rank that
   brings the count to ``world`` sets ``P+"done"`` to ok.
3. A blocking call waits on ``P+"done"`` for at most ``timeout``, on a connection of
   its own (a clone of the store per thread), holding no lock; an abort wakes every
   waiter at once. On timeout it names the ranks missing from ``P+"who"``, aborts the
   call for everyone (unless it completed meanwhile) and raises.
4. Each rank that has read the outcome adds 1 to ``P+"read"``; the rank that brings it
   to ``world`` deletes the call's keys.

Guarantee (the text for the README):

* Every rank of the world calls ``realize`` for every call, and no rank creates a
  group for a call until every rank has published the same digest for it. A rank
  whose digest differs from the first publisher's raises at once, naming both ranks
  and both meshes, and aborts the call; every rank then waiting on the call (or
  arriving later) raises within a fraction of a second, with that message.
* A rank that never reaches the call (it died, is stuck, skipped a call or made it
  from a thread with another name) makes every waiting rank raise after ``timeout``,
  naming the missing ranks.
* A fully memoized call (``blocking=False``: it creates nothing) costs the same few
  round trips and does not wait. A mismatch is still detected at once by every rank
  whose digest differs from the first publisher's, and every blocking rank of the
  call raises as above. The memoized rank itself raises at once when its digest
  differs from the first publisher's; when it *was* the first publisher (so the others
  differ from it), it raises at the start of its next ``realize`` call, in any
  thread, without waiting (one ``check`` per pending call). The only cost of this
  path: a process that never calls ``realize`` again after a mismatched memoized call
  does not raise for it.
* Keys are removed once every rank has read a call's outcome; a call some rank never
  reached (or a memoized call whose rank never calls ``realize`` again) leaves its
  handful of keys behind.
"""

from __future__ import annotations

import datetime
import threading
import urllib.parse
from typing import TYPE_CHECKING, Protocol, cast, final

import attrs

from ._errors import MeshMismatchError
from ._memo import on_reset

if TYPE_CHECKING:
    from ._c10d import Store

__all__ = [
    "KEY_ROOT",
    "Ticket",
    "abort",
    "agree",
    "confirm_pending",
    "count_keys",
    "failures",
    "new_connection",
    "thread_store",
    "next_call",
    "reset",
]

KEY_ROOT = "fmesh/agree/"
"""Every key of this protocol contains this string."""

_OK = "ok"
_ABORT = "abort\n"
_MAX_SUMMARY = 4000
"""Characters of a summary published to the store (a mesh over a custom rank order of
thousands of ranks has a long repr)."""

_MISMATCH_HELP = (
    "Every rank must call fmesh.realize() with the same mesh, backend and options, "
    "in the same order (SPMD). Check for rank-dependent mesh construction (e.g. sizes "
    "computed from the local device count) and for realize() calls made on some "
    "ranks only."
)
_MISSING_HELP = (
    "Every rank must call fmesh.realize() the same number of times, in the same order, "
    "from threads with the same names (calls are matched per thread name). Check the "
    "missing ranks' logs; if they are only slow (e.g. still loading data), pass a "
    "longer realize(timeout=...)."
)


@final
@attrs.frozen(slots=True, eq=False)
class Ticket:
    """One call of one stream on this rank, as published to the store."""

    store: Store
    rank: int
    world: int
    stream: str
    call: int
    """1 for the first call of the stream (in this generation), 2 for the next, ..."""
    prefix: str
    """Store key prefix of the call: ``fmesh/agree/<generation>/<stream>/<call>/``."""
    summary: str
    """What this rank realizes, for messages."""

    @property
    def where(self) -> str:
        """``realize call #k of thread 'T'``, for messages."""
        return f"realize call #{self.call} of thread {self.stream!r}"


class _Untyped(Protocol):
    """Store methods that exist on torch 2.11..2.15 but are missing from its stubs."""

    def append(self, key: str, value: str) -> None: ...
    def clone(self) -> Store: ...


def _append(store: Store, key: str, value: str) -> None:
    cast("_Untyped", store).append(key, value)


# -- process-wide state (a small lock, never held across a store operation) ------------


@attrs.define
class _State:
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    generation: int = 0
    counters: dict[str, int] = attrs.field(factory=dict)
    pending: list[Ticket] = attrs.field(factory=list)


_state = _State()
_local = threading.local()


def next_call(stream: str) -> int:
    """Number the next call of ``stream`` on this rank: 1, 2, ... (thread-safe).

    >>> reset(); next_call("doc"), next_call("doc"), next_call("other")
    (1, 2, 1)
    """
    with _state.lock:
        n = _state.counters.get(stream, 0) + 1
        _state.counters[stream] = n
        return n


def reset() -> None:
    """Start a new generation: every stream counts from 1 again, pending calls are dropped.

    Every rank must reset at the same point of its calls (``fmesh.destroy`` is SPMD).
    """
    with _state.lock:
        _state.generation += 1
        _state.counters.clear()
        _state.pending.clear()


on_reset(reset)


def _conn(store: Store) -> Store:
    """The connection to ``store`` this thread uses: ``store`` itself on the main
    thread, a clone of it (cached per thread) on any other.

    A TCPStore client serializes its operations, and a wait holds it: two threads
    sharing one client would stall each other (a realize waiting for peers, another
    thread's realize or group rendezvous). A clone has its own socket; it is made once
    per thread, since connecting costs a round trip (and, when many ranks connect at
    once, can stall for seconds on the store's accept queue).
    """
    if threading.current_thread() is threading.main_thread():
        return store
    conns: dict[int, tuple[Store, Store, int]] | None = getattr(_local, "conns", None)
    if conns is None:
        conns = _local.conns = {}
    generation = _state.generation
    entry = conns.get(id(store))
    # The entry keeps ``store`` alive, so its id cannot be reused while cached.
    if entry is not None and entry[0] is store and entry[2] == generation:
        return entry[1]
    clone = new_connection(store)
    conns.clear()
    conns[id(store)] = (store, clone, generation)
    return clone


def thread_store(store: Store) -> Store:
    """The connection to ``store`` for this thread (see :func:`_conn`).

    Give it to each process group creation: torch's gloo rendezvous waits in the
    store, and a wait on a TCPStore client shared between threads blocks the others,
    so two threads creating groups in different orders on different ranks would
    deadlock until the store timeout.
    """
    return _conn(store)


def new_connection(store: Store) -> Store:
    """A new client of the same store, with its own socket (the store itself if it
    cannot clone)."""
    try:
        return cast("_Untyped", store).clone()
    except (RuntimeError, NotImplementedError):
        return store


def _store_error(ticket: Ticket, err: Exception) -> MeshMismatchError:
    return MeshMismatchError(
        f"rank {ticket.rank} lost the store during {ticket.where} ({ticket.summary}): "
        f"{err}. The process hosting the store (rank 0 or the torchrun agent) may have "
        "died; see its logs."
    )


# -- agree ------------------------------------------------------------------------------


def agree(
    store: Store,
    *,
    rank: int,
    world: int,
    digest: str,
    summary: str,
    timeout: datetime.timedelta,
    blocking: bool = True,
    stream: str | None = None,
    call: int | None = None,
) -> Ticket:
    """Agree with every rank of the world on this rank's next call of ``stream``.

    Args:
        store: the world's store (``torch.distributed.Store``).
        rank: this rank, ``0 <= rank < world``.
        world: the number of ranks that must agree.
        digest: what must be equal on every rank (no newline).
        summary: what this rank realizes, in words, for messages.
        timeout: how long a blocking call waits for the other ranks.
        blocking: wait until every rank agreed; ``False`` for a call that creates
            nothing: publish, detect what can be detected now, and leave the outcome
            to :func:`confirm_pending`.
        stream: the name calls are matched by; default the current thread's name.
        call: the call number; default :func:`next_call` of ``stream``.

    Returns:
        The :class:`Ticket` of the call (for :func:`abort` and :func:`failures`).

    Raises:
        MeshMismatchError: a rank realizes something else at this call, a rank never
            reached it within ``timeout``, the call was aborted, or an earlier
            non-blocking call of this rank was aborted (then this call is not
            numbered, so a retry stays aligned with the other ranks).
        ValueError: ``rank``, ``world`` or ``digest`` are malformed.
    """
    if not 0 <= rank < world:
        raise ValueError(f"agree() needs 0 <= rank < world, got rank={rank}, world={world}")
    if not digest or "\n" in digest:
        raise ValueError(f"agree() needs a one-line, non-empty digest, got {digest!r}")
    confirm_pending()
    if stream is None:
        stream = threading.current_thread().name
    if call is None:
        call = next_call(stream)
    if len(summary) > _MAX_SUMMARY:
        summary = summary[: _MAX_SUMMARY - 1] + "…"
    with _state.lock:
        generation = _state.generation
    prefix = f"{KEY_ROOT}{generation}/{urllib.parse.quote(stream, safe='')}/{call}/"
    ticket = Ticket(store, rank, world, stream, call, prefix, summary)
    if world == 1:
        return ticket

    import torch.distributed as dist

    conn = _conn(store)
    try:
        first = conn.compare_set(prefix + "digest", "", f"{digest}\n{rank}\n{summary}")
        first_digest, first_rank, first_summary = first.decode().split("\n", 2)
        if first_digest != digest:
            reason = (
                f"ranks {rank} and {first_rank} disagree at {ticket.where}: rank {rank} "
                f"realizes {summary}, rank {first_rank} realizes {first_summary}"
            )
            message = f"{reason}. {_MISMATCH_HELP}"
            conn.compare_set(prefix + "done", "", _ABORT + message)
            _finish(conn, ticket)
            raise MeshMismatchError(message)
        _append(conn, prefix + "who", f"{rank},")
        if conn.add(prefix + "arrived", 1) == world:
            conn.compare_set(prefix + "done", "", _OK)
        if not blocking:
            if conn.check([prefix + "done"]):
                _settle(conn, ticket)
            else:
                with _state.lock:
                    if _state.generation == generation:
                        _state.pending.append(ticket)
            return ticket
        try:
            conn.wait([prefix + "done"], timeout)
        except dist.DistStoreError:
            _give_up(conn, ticket, timeout)
        _settle(conn, ticket)
        return ticket
    except dist.DistError as err:
        raise _store_error(ticket, err) from err


def _give_up(conn: Store, ticket: Ticket, timeout: datetime.timedelta) -> None:
    """Abort a call some ranks never reached (unless it completed meanwhile)."""
    who = conn.get(ticket.prefix + "who").decode()
    arrived = {int(r) for r in who.split(",") if r}
    missing = sorted(set(range(ticket.world)) - arrived)
    if missing:
        reason = (
            f"ranks {missing} never reached {ticket.where} within "
            f"{timeout.total_seconds():g}s (rank {ticket.rank} waited, realizing "
            f"{ticket.summary}); they may have died, be stuck, skipped this call, or made "
            "it from a thread with another name"
        )
    else:
        reason = (
            f"every rank reached {ticket.where}, but the agreement never completed "
            f"within {timeout.total_seconds():g}s; the last rank to arrive may have died"
        )
    conn.compare_set(ticket.prefix + "done", "", f"{_ABORT}{reason}. {_MISSING_HELP}")


def _settle(conn: Store, ticket: Ticket) -> None:
    """Read the outcome of a call whose ``done`` key exists; raise if it was aborted."""
    outcome = conn.get(ticket.prefix + "done").decode()
    _finish(conn, ticket)
    if outcome != _OK:
        raise MeshMismatchError(
            f"rank {ticket.rank} stopped at {ticket.where} ({ticket.summary}) because "
            + outcome.removeprefix(_ABORT)
        )


def _finish(conn: Store, ticket: Ticket) -> None:
    """This rank is done with the call; the last rank to be done removes its keys."""
    if conn.add(ticket.prefix + "read", 1) == ticket.world:
        for key in ("digest", "who", "arrived", "done", "read"):
            conn.delete_key(ticket.prefix + key)


def confirm_pending() -> None:
    """Raise if a non-blocking call of this rank was aborted; never waits.

    One ``check`` per call still pending (made with ``blocking=False`` and not yet
    complete on every rank); completed calls are forgotten.

    Raises:
        MeshMismatchError: the first pending call found aborted (every completed one
            is settled first).
    """
    import torch.distributed as dist

    with _state.lock:
        pending = list(_state.pending)
    if not pending:
        return
    error: MeshMismatchError | None = None
    for ticket in pending:
        conn = _conn(ticket.store)
        try:
            if not conn.check([ticket.prefix + "done"]):
                continue
            with _state.lock:
                if ticket not in _state.pending:
                    continue  # another thread settled it
                _state.pending.remove(ticket)
            _settle(conn, ticket)
        except MeshMismatchError as err:
            error = error or err
        except dist.DistError as err:
            error = error or _store_error(ticket, err)
    if error is not None:
        raise error


# -- after agreement ----------------------------------------------------------------------


def abort(ticket: Ticket, message: str) -> None:
    """Tell the other ranks why this rank gave up on ``ticket``'s call.

    For failures after :func:`agree` returned (group creation failed here): ranks
    whose own creation then fails read it with :func:`failures`. A non-blocking call
    not yet complete is aborted for every rank (unless an abort came first). The
    failure record is not removed (a failed call's keys are left behind).
    """
    conn = _conn(ticket.store)
    with _state.lock:
        pending = ticket in _state.pending
        if pending:
            _state.pending.remove(ticket)
    if pending:
        conn.compare_set(
            ticket.prefix + "done", "", f"{_ABORT}rank {ticket.rank} aborted it: {message}"
        )
        _finish(conn, ticket)
    _append(conn, ticket.prefix + "failed", f"{ticket.rank}\x1f{message}\x1e")


def failures(ticket: Ticket, wait: float = 0.0) -> dict[int, str]:
    """Why other ranks gave up on ``ticket``'s call (:func:`abort`), by rank.

    Waits up to ``wait`` seconds for a first report (a peer's own creation timeout can
    end a moment after this rank's), on this thread's own connection.
    """
    import torch.distributed as dist

    conn = _conn(ticket.store)
    key = ticket.prefix + "failed"
    if wait > 0:
        try:
            conn.wait([key], datetime.timedelta(seconds=wait))
        except dist.DistStoreError:
            return {}
    elif not conn.check([key]):
        return {}
    out: dict[int, str] = {}
    for record in conn.get(key).decode().split("\x1e"):
        if record:
            r, _, message = record.partition("\x1f")
            out.setdefault(int(r), message)
    return out


def count_keys(store: Store) -> int:
    """How many keys of this protocol ``store`` holds (hygiene checks in tests)."""
    return sum(KEY_ROOT in key for key in store.list_keys())
