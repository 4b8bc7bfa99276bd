"""Which NCCL implementation makes a group, and whether its creation may wait in a
store that fmesh can cut short (``docs/design/nccl.md``).

torch 2.11-2.14 have one NCCL backend, ``ProcessGroupNCCL`` ("legacy" here). torch 2.15
adds ``ProcessGroupNCCL2`` ("nccl2") and makes it what ``"nccl"`` names, unless
``TORCH_DIST_USE_NCCL2=0`` was set when torch first registered the ``nccl`` backend
(the legacy one stays available as ``"nccl-legacy"``). They wait for the NCCL unique id
differently:

* legacy: non-root ranks ``get`` key ``<n>`` from the store the group was given (up to
  that store's timeout); the group keeps the store, and its own native threads (the
  heartbeat monitor, error propagation) read it for as long as it lives, without the
  GIL. fmesh must hand it a plain connection, never a Python store.
* nccl2: every rank ``wait``s for ``nccl_storekey_<generation>`` under a prefix of the
  group's name, with the group's timeout, then reads it; nothing else of the group
  reads the store afterwards (its one thread, the timeout watchdog, does not). So the
  creation may wait in the watch's interruptible store (``interruptible.py``), and a
  watch that finds a peer lost ends the wait.

No ``abort`` in torch 2.11-2.15 can end a creation another thread is blocked in: the
group is registered (``_abort_process_group`` finds it) only when its creation has
returned, nccl2 makes its communicator inside the backend's constructor (no object to
call ``abort`` on yet), and NCCL lets a blocking ``ncclCommInitRank`` / ``ncclCommSplit``
be aborted from another thread only in non-blocking mode. The store is the one handle.
"""

from __future__ import annotations

import os

__all__ = ["creation_waits_in_given_store", "flavor"]

NCCL2_FROM = (2, 15)
"""The first torch whose ``"nccl"`` is ``ProcessGroupNCCL2`` by default."""


def _version() -> tuple[int, int]:
    from .c10d import torch_version

    return torch_version()


def _nccl_is_nccl2() -> bool:
    """What torch's ``"nccl"`` resolves to on torch >= 2.15: the creator it registered,
    or, before it registered one (at first use), the one it will register."""
    from torch.distributed import Backend

    plugin = Backend._plugins.get("NCCL")
    if plugin is not None:
        return "nccl2" in getattr(plugin.creator_fn, "__name__", "")
    return os.environ.get("TORCH_DIST_USE_NCCL2") != "0"


def flavor(backend: str) -> str | None:
    """``"legacy"`` or ``"nccl2"``: the NCCL implementation that makes the CUDA part of
    a group of ``backend`` (``"nccl"``, ``"cuda:nccl"``, ``"cpu:gloo,cuda:nccl2"``);
    ``None`` where no part of it is NCCL, or it is one fmesh does not know
    (``"nccl-lazy"``: treated as unknown, so kept on a plain store)."""
    names = [part.split(":")[-1].strip().lower() for part in backend.split(",")]
    found = [n for n in names if "nccl" in n]
    if not found:
        return None
    kinds = set()
    for name in found:
        if name == "nccl-legacy" or (name == "nccl" and _version() < NCCL2_FROM):
            kinds.add("legacy")
        elif name == "nccl2" and _version() >= NCCL2_FROM:
            kinds.add("nccl2")
        elif name == "nccl":
            kinds.add("nccl2" if _nccl_is_nccl2() else "legacy")
        else:
            return None
    return kinds.pop() if len(kinds) == 1 else None


def creation_waits_in_given_store(backend: str) -> bool:
    """A group of ``backend`` waits for its NCCL unique id in the store it is given and
    keeps no native thread reading that store: fmesh may give it a store whose waits
    the watch can cut short (torch 2.15's nccl2). ``False`` for the legacy backend and
    for names fmesh does not know."""
    return flavor(backend) == "nccl2"
