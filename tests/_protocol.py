"""One creating call of fmesh's cross-rank protocol with no group to create, for the
protocol's own tests: the rank's record in (``agreement.open_call``), then the closing
round under the call's watch (``watch.Watch.finish``), as ``_runtime/creation.py``
runs them around a rank's group creations."""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from fmesh import PeerLostError
from fmesh._protocol import agreement, liveness, port, ring
from fmesh._protocol.records import KEY_ROOT, Entry, Record, Ticket
from fmesh._protocol.watch import Watch

if TYPE_CHECKING:
    from fmesh._compat import Store

LONG = datetime.timedelta(seconds=60)
"""A timeout no healthy scenario gets near: failures must surface long before it."""


def call(
    store: Any,
    rank: int,
    world: int,
    code: int,
    number: int = 1,
    *,
    summary: str | None = None,
    history: str = "",
    names: str = "",
    timeout: datetime.timedelta = LONG,
    stream: str = "s",
    root: str = "t",
    during: Callable[[Watch, Ticket], object] | None = None,
) -> Ticket:
    """Rank ``rank`` of ``world`` makes call ``number`` of ``stream`` (code ``code``):
    its ticket, or the call's error. Keys under ``fmesh/a/<root>/<stream>/``;
    ``during(watch, ticket)`` stands for the rank's group creations."""
    text = summary if summary is not None else f"mesh#{code}"
    prefix = f"{KEY_ROOT}{root}/{stream}/"
    ticket = agreement.open_call(
        store,
        rank=rank,
        ranks=range(world),
        entry=Entry(number, code, rank, names),
        record=lambda: Record(rank, code, text, history),
        stream=prefix,
        prefix=f"{prefix}{number}/",
        where=f"call #{number} of {stream!r}",
    )
    with liveness.watching(ticket, timeout, timeout) as watch:
        if watch is not None:
            try:
                if during is not None:
                    during(watch, ticket)
                watch.finish(timeout)
            except BaseException as err:
                if not isinstance(err, PeerLostError):
                    watch.fail(err)
                raise
    return ticket


def no_liveness() -> None:
    """The protocol alone: no liveness port, no links (their requests not counted)."""
    os.environ["FMESH_PEER_WATCH"] = "0"


@contextlib.contextmanager
def protocol_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Thread-played ranks: the protocol alone, no liveness port (one per process),
    every stream forgotten before and after."""
    monkeypatch.setenv("FMESH_PEER_WATCH", "0")
    agreement.forget_streams()
    yield
    agreement.forget_streams()


@contextlib.contextmanager
def serving(host: str | None = None) -> Iterator[port.Port]:
    """This process's liveness port, its thread serving: every live simulated rank's
    (``host``: the address it listens on; ``None``, the one that reaches the store)."""
    ring.forget_addresses()
    p = port.mine(host)
    p.serve()
    yield p
    ring.forget_addresses()


_held: list[socket.socket] = []
"""The dead addresses' sockets: bound, never listening, kept for the process's life."""


def dead_address() -> port.Address:
    """The address of a port no process listens on (it refuses connections), kept bound
    by this process so that nothing else (the other test worker's stores and gloo
    listeners) can take it while a test expects the refusal."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _held.append(sock)
    return port.Address("127.0.0.1", int(sock.getsockname()[1]), "dead")


def keys(store: Store) -> list[str]:
    """The protocol's keys in ``store``, each after its root and stream."""
    return sorted(
        k.split(KEY_ROOT, 1)[1].split("/", 2)[2] for k in store.list_keys() if KEY_ROOT in k
    )
