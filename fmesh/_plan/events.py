"""One planned rank's group-creating calls, as a launch would need every rank to make
them: fmesh's creating realize calls (from the runtime's hooks) and torch's own calls
that made groups fmesh did not make (from ``_compat/planning.py``), in the order made.

A torch call is coded by what torch's rendezvous depends on: which call, the ranks,
the backend and options asked for (not the fake backend that plays them), and for a
local ``new_group`` the number of groups the rank holds, which torch's name for the
group hashes. Two ranks' calls match exactly when their codes are equal.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .._core.mesh import Mesh
from .._protocol.stream import call_code, combine
from .._runtime.hooks import on_creating_call, on_realized
from .report import PlannedCall

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from .._compat.planning import DimCall, TorchGroupCall

__all__ = ["Recorder", "active", "backends_made", "options_words", "ranks_head"]


class Recorder:
    """What one rank's function realized and called, fed by the runtime's hooks and
    the compat package's observer of torch's group creation."""

    def __init__(self, rank: int, backend: str) -> None:
        self.rank = rank
        self.calls: list[PlannedCall] = []
        self.realized: list[tuple[Mesh, dict[str, ProcessGroup]]] = []
        self.backend = backend
        """The default group's backend at launch (as the function's own
        ``init_process_group`` asked, if it called one)."""
        self.started: str | None = None
        """What starts the default group at launch, as far as seen: ``"init"`` (the
        function's own ``init_process_group``), ``"fmesh"`` (a realize call came
        first) or ``"torch"`` (torch's own group calls came first)."""
        self.device = False
        """The function's own ``init_process_group`` bound a device (``device_id=``)."""
        self._torch = 0

    def bound_device(self) -> bool:
        """Whether the default group has a bound device at launch (what torch's
        ``split_group`` needs): the function's own ``init_process_group`` passed
        ``device_id``; else fmesh starts the group with a device bound where it starts
        NCCL (the backend played names nccl: a GPU host), torch with none."""
        if self.started == "init":
            return self.device
        return self.started == "fmesh" and "nccl" in self.backend

    # -- the compat observer ---------------------------------------------------------

    def torch_call(self, call: TorchGroupCall) -> None:
        self.started = self.started or "torch"
        if call.local and call.held is None:
            return  # a local new_group on a non-member makes nothing
        self._add(call.api, _code(call, self.backend), _words(call), call)

    def dim_call(self, call: DimCall) -> None:
        self.started = self.started or "torch"
        # Not the dim's name: torch names its groups by their sequence number, so
        # ranks that name a dim otherwise still meet (the name is only a description).
        code = call_code("DeviceMesh")
        for inner in call.calls:
            code = combine(code, _code(inner, self.backend))
        sizes = sorted({len(c.ranks) for c in call.calls})
        mine = next((c for c in call.calls if c.held is not None), None)
        ranks = "rank" if sizes == [1] else "ranks"
        summary = (
            f"torch's DeviceMesh making the groups of dim {call.dim!r} itself: "
            f"{len(call.calls)} new_group calls, groups of "
            f"{' or '.join(map(str, sizes))} {ranks}{_asked(call.backend, call.options)}"
        )
        self._add("DeviceMesh", code, summary, mine)

    def init_call(self, backend: str, device: bool = False) -> None:
        self.started = self.started or "init"
        self.backend = backend
        self.device = device
        code = call_code("init_process_group", backend)
        self._add("init_process_group", code, f"torch's init_process_group({backend!r})", None)

    def _add(self, kind: str, code: int, summary: str, call: TorchGroupCall | None) -> None:
        self._torch += 1
        members = call.ranks if call is not None and call.local else None
        held = None if call is None else call.held
        self.calls.append(PlannedCall(self._torch, code, summary, "", kind, members, held))

    # -- the runtime's hooks -----------------------------------------------------------

    def realize_call(self, number: int, code: int, summary: object, history: str) -> None:
        self.started = self.started or "fmesh"
        mesh = getattr(summary, "mesh", None)
        names = mesh.axis_names if isinstance(mesh, Mesh) else ()
        self.calls.append(PlannedCall(number, code, str(summary), history, names=names))


_active: list[Recorder] = []


def active() -> list[Recorder]:
    """The recorders of the ranks being planned (the last one is fed)."""
    return _active


def _on_call(number: int, code: int, summary: object, history: str) -> None:
    if _active:
        _active[-1].realize_call(number, code, summary, history)


def _on_realized(mesh: Mesh, groups: Mapping[str, ProcessGroup]) -> None:
    if _active:
        recorder = _active[-1]
        recorder.started = recorder.started or "fmesh"
        recorder.realized.append((mesh, dict(groups)))


on_creating_call(_on_call)
on_realized(_on_realized)


def _code(call: TorchGroupCall, played: str) -> int:
    return call_code(
        call.api,
        call.ranks,
        call.splits,
        backends_made(call.backend or played),  # the default group's where none is named
        options_words(call.options),
        call.local,
        call.holding if call.local else None,
    )


def backends_made(backend: str) -> tuple[str, ...]:
    """The backends a group asked for as ``backend`` makes, each once: what its
    members' rendezvous meet over (torch makes one gloo backend for every device type
    it serves, so ``gloo`` and ``cpu:gloo`` meet, while ``cpu:gloo,cuda:nccl`` also
    makes an NCCL communicator).

    >>> backends_made("cpu:gloo"), backends_made("gloo"), backends_made("cpu:gloo,cuda:nccl")
    (('gloo',), ('gloo',), ('gloo', 'nccl'))
    """
    return tuple(sorted({part.rpartition(":")[2].strip() for part in backend.split(",")}))


def _asked(backend: str | None, options: object) -> str:
    words = options_words(options)
    return (f", backend={backend!r}" if backend else "") + (
        f", pg_options={words}" if words else ""
    )


def _words(call: TorchGroupCall) -> str:
    """The call in words (``torch's new_group([0, 1], backend='gloo')``)."""
    asked = _asked(call.backend, call.options)
    if call.api == "split_group":
        splits, start = [], 0
        for size in call.splits:
            splits.append(ranks_head(call.ranks[start : start + size]))
            start += size
        shown = ", ".join(splits[:2]) + (", ..." if len(splits) > 2 else "")
        return f"torch's split_group([{shown}] ({len(splits)} splits){asked})"
    if call.local:
        return (
            f"torch's new_group({ranks_head(call.ranks)}{asked}, "
            f"use_local_synchronization=True) holding {call.holding} "
            f"group{'s' if call.holding != 1 else ''} (torch names a local group by its "
            "ranks and that count)"
        )
    return f"torch's {call.api}({ranks_head(call.ranks)}{asked})"


def options_words(options: object) -> str:
    """Backend options in words, equal on every rank for equal options: the class and
    its plain settings (never an ``id``); ``""`` for none."""
    if options is None:
        return ""
    plain = (bool, int, float, str, datetime.timedelta)
    fields = []
    for name in sorted(dir(options)):
        if name.startswith("__"):
            continue
        try:
            value = getattr(options, name)
        except Exception:  # a property some builds leave unimplemented
            continue
        if isinstance(value, plain):
            fields.append(f"{name.lstrip('_')}={value!r}")
    return f"{type(options).__qualname__}({', '.join(fields)})"


def ranks_head(ranks: Sequence[int], count: int = 4) -> str:
    """``[0, 1, 2]``, or ``[0, 8, 16, 24, ..., 120]`` for a longer group."""
    if len(ranks) <= count + 1:
        return "[" + ", ".join(map(str, ranks)) + "]"
    return "[" + ", ".join(map(str, ranks[:count])) + f", ..., {ranks[-1]}]"
