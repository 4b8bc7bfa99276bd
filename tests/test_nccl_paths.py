"""NCCL group creation under a watch, without a GPU (``docs/design/nccl.md``).

Which NCCL implementation makes a group (torch 2.15's nccl2 or the legacy backend)
decides whether its unique-id exchange may wait in the watch's store. In-process, on
torch's ``HashStore``: a rank whose group root never publishes the id waits the way
torch 2.15's ``NCCLBootstrap`` does (a C++ ``PrefixStore`` over the store it was given:
``wait(keys, timeout)``, then ``multi_get``); the watch ends that wait once it finds the
root lost (its liveness port closed: no process holds it) on the nccl2 path, and leaves
it to torch's timeout on the legacy one. The real backends need GPUs:
``tests/gpu_job.py --creation``.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
import torch.distributed as dist
from _protocol import dead_address, serving

from fmesh import PeerLostError
from fmesh._compat import memory_store, nccl
from fmesh._protocol import liveness, port
from fmesh._protocol.records import Entry, Record, Ticket

if TYPE_CHECKING:
    from fmesh._compat import Store

PrefixStore: Any = dist.PrefixStore  # type: ignore[attr-defined]  # implicit re-export


@pytest.fixture
def torch_215(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend to run torch 2.15 (its NCCL backend not registered yet)."""
    monkeypatch.setattr(nccl, "_version", lambda: (2, 15))
    monkeypatch.delenv("TORCH_DIST_USE_NCCL2", raising=False)
    monkeypatch.delitem(dist.Backend._plugins, "NCCL", raising=False)


@pytest.fixture
def torch_213(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nccl, "_version", lambda: (2, 13))


# -- which backend -------------------------------------------------------------------------


@pytest.mark.usefixtures("torch_213")
def test_before_215_every_nccl_group_is_legacy_and_waits_in_a_plain_store() -> None:
    for name in ("nccl", "cuda:nccl", "cpu:gloo,cuda:nccl", "nccl-legacy"):
        assert nccl.flavor(name) == "legacy", name
        assert not nccl.creation_waits_in_given_store(name), name
    assert nccl.flavor("nccl2") is None  # no such backend before 2.15
    assert nccl.flavor("gloo") is None


@pytest.mark.usefixtures("torch_215")
def test_on_215_nccl_is_nccl2_unless_torch_was_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("nccl", "cpu:gloo,cuda:nccl", "nccl2"):
        assert nccl.creation_waits_in_given_store(name), name
    assert nccl.flavor("nccl-legacy") == "legacy"
    assert nccl.flavor("nccl-lazy") is None  # unknown: kept on a plain store
    assert not nccl.creation_waits_in_given_store("nccl-lazy")
    monkeypatch.setenv("TORCH_DIST_USE_NCCL2", "0")  # torch reads it when it registers
    assert nccl.flavor("nccl") == "legacy"
    assert nccl.flavor("nccl2") == "nccl2"


@pytest.mark.usefixtures("torch_215")
def test_on_215_what_torch_registered_for_nccl_decides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def _create_nccl_process_group() -> None: ...

    def _create_nccl2_process_group() -> None: ...

    monkeypatch.setenv("TORCH_DIST_USE_NCCL2", "0")  # read at registration, not now
    plugin = SimpleNamespace(creator_fn=_create_nccl2_process_group)
    monkeypatch.setitem(dist.Backend._plugins, "NCCL", plugin)
    assert nccl.flavor("nccl") == "nccl2"
    plugin.creator_fn = _create_nccl_process_group
    assert nccl.flavor("nccl") == "legacy"


# -- the unique-id exchange under a watch ----------------------------------------------------

PATIENCE_TIMEOUT = datetime.timedelta(seconds=1)
"""The call's timeout: its verdict read every 0.25 s, silence 2 s (``watch.settings``)."""


def _bootstrap_wait(store: Store, wait_s: float) -> list[bytes]:
    """What torch 2.15's ``NCCLBootstrap::exchangeUniqueIds`` does on a non-root rank,
    in the store its group was given."""
    prefixed = PrefixStore("fmesh_g0_test", store)
    keys = ["nccl_storekey_0"]
    prefixed.wait(keys, datetime.timedelta(seconds=wait_s))
    return [bytes(v) for v in prefixed.multi_get(keys)]


@pytest.fixture
def live() -> Iterator[port.Port]:
    """This process's liveness port: rank 1's (and a live rank 0's)."""
    with serving() as p:
        yield p


def _creating(
    backend: str, root_alive: bool, wait_s: float, live: port.Port
) -> tuple[BaseException | None, float]:
    """Rank 1 of a call over ranks (0, 1) waits for the NCCL id of rank 0, the group's
    root, which publishes it after 0.5 s or is dead: its port closed before the call
    (its watcher, rank 1, finds it refused). Both addresses are published as
    ``liveness.prepare`` does. (error, seconds)."""
    store = memory_store()
    store.set_timeout(datetime.timedelta(seconds=60))
    root = live.address if root_alive else dead_address()
    store.set(port.KEY + "0", root.text())
    store.set(port.KEY + "1", live.address.text())
    record = lambda: Record(1, 0, "m", "")  # noqa: E731
    entry = Entry(1, 0, 1)
    ticket = Ticket(store, store, 1, (0, 1), "t/", "realize call #1", entry, record, entry)
    if root_alive:
        publish = PrefixStore("fmesh_g0_test", store)
        threading.Timer(0.5, publish.set, ("nccl_storekey_0", b"id")).start()
    start = time.monotonic()
    with liveness.watching(ticket, PATIENCE_TIMEOUT, PATIENCE_TIMEOUT) as w:
        assert w is not None
        try:
            got = liveness.creating(backend, store, lambda s: _bootstrap_wait(s, wait_s))
            assert got == [b"id"]
            return None, time.monotonic() - start
        except Exception as err:
            found = w.error("creating the group [0, 1]", err)
            return (found if found is not None else err), time.monotonic() - start


@pytest.mark.usefixtures("torch_215")
def test_on_215_a_dead_root_ends_the_id_exchange_with_peer_lost_in_seconds(
    live: port.Port,
) -> None:
    err, took = _creating("nccl", root_alive=False, wait_s=60.0, live=live)
    assert isinstance(err, PeerLostError), err
    assert err.lost == (0,)
    assert "rank(s) [0] died" in str(err)
    assert took < 30.0  # patience 1 s; generous for a loaded machine


@pytest.mark.usefixtures("torch_215")
def test_on_215_a_live_root_s_id_arrives_through_the_watch_store(
    live: port.Port,
) -> None:
    err, took = _creating("nccl", root_alive=True, wait_s=60.0, live=live)
    assert err is None, err
    assert took < 30.0


@pytest.mark.usefixtures("torch_213")
def test_legacy_nccl_waits_for_torchs_timeout_not_the_watch(live: port.Port) -> None:
    # The watch gives the call up after ~3 s (GRACE) once asked; the legacy exchange is
    # not cut short (nothing asks while it waits in native code).
    err, took = _creating("nccl", root_alive=False, wait_s=6.0, live=live)
    assert isinstance(err, PeerLostError), err  # the verdict explains it
    assert "torch said: wait timeout" in str(err).lower(), err  # the store's own timeout
    assert took >= 5.5, took
