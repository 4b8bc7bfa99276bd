"""Which creation path realize picks per axis, with torch's constructors stubbed.

The eagerly initialized NCCL path needs GPUs, which CI does not have; these tests pin
the decisions that path rests on (split_group only for ascending axes, every rank of
the world taking part once per axis, coordinate order kept otherwise, size-1 axes
never split) by recording the calls realize would make. They do not run NCCL.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest

import fmesh
from fmesh import _compat as _c10d
from fmesh._core.queries import placement
from fmesh._core.rank_map import rank_map_key
from fmesh._runtime import groups as _groups
from fmesh._runtime import launch as _launch
from fmesh._runtime import memo as _memo

Call = tuple[str, tuple[int, ...], str]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Call]]:
    """Record world splits and member-created groups instead of making them."""
    made: list[Call] = []

    def split_from_world(ranks: tuple[int, ...], backend: str, *_: Any) -> object:
        made.append(("split_group", tuple(ranks), backend))
        return ("pg", tuple(ranks)) if ME in ranks else None

    def new_named_group(ranks: tuple[int, ...], me: int, backend: str, *_: Any) -> object:
        made.append(("new_group", tuple(ranks), backend))
        return ("pg", tuple(ranks)) if me in ranks else None

    monkeypatch.setattr(_c10d, "split_from_world", split_from_world)
    monkeypatch.setattr(_c10d, "new_named_group", new_named_group)
    monkeypatch.setattr(_c10d, "default_timeout", lambda _: datetime.timedelta(seconds=1))
    _memo.state.reset()
    yield made
    _memo.state.reset()


ME = 5
WORLD_PG: Any = object()  # stands for the default group; only compared by identity


def _run(
    mesh: fmesh.Mesh,
    axis: str,
    me: int = ME,
    backend: str = "nccl",
    explicit: bool = False,
) -> object:
    # An eagerly initialized NCCL world (a bound device).
    world = _launch.World(
        pg=WORLD_PG, size=8, rank=me, backend="cpu:gloo,cuda:nccl", fake=False, eager=True
    )
    return _axis_group(mesh, axis, world, backend, explicit)


def _axis_group(
    mesh: fmesh.Mesh, axis: str, world: Any, backend: str, explicit: bool = False
) -> object:
    """This rank's group along ``axis``, as realize gets it (through the axis memo)."""
    pos = mesh.axis_names.index(axis)
    coord, ranks = placement(mesh, world.rank, (True,) * mesh.ndim)
    request = _groups.AxisRequest(
        mesh=mesh,
        name=axis,
        layout=mesh.axes[pos],
        member=coord is not None,
        backend=backend,
        options=None,
        options_id=0,
        explicit=explicit,
        ranks=ranks[pos],
        key=(mesh.axes[pos], mesh.index_size, rank_map_key(mesh), backend, 0),
        served=_launch.serves(world, mesh, mesh.axes[pos], backend, None),
    )
    pg, _ = _groups.axis_group(request, world, None)
    return pg


def test_ascending_axis_is_split_from_the_world(calls: list[Call]) -> None:
    mesh = fmesh.make_mesh({"dp": 2, "tp": 4})
    assert _run(mesh, "tp") == ("pg", fmesh.group(mesh, "tp", ME))
    assert calls == [("split_group", fmesh.group(mesh, "tp", ME), "nccl")]


def test_non_ascending_axis_keeps_coordinate_order(calls: list[Call]) -> None:
    mesh = fmesh.flatten(fmesh.make_mesh({"dp": 2, "tp": 4}), ("tp", "dp"))
    members = fmesh.group(mesh, "tp_dp", ME)
    assert list(members) != sorted(members)  # split_group would sort these
    assert _run(mesh, "tp_dp") == ("pg", members)
    assert calls == [("new_group", members, "nccl")]


def test_custom_decreasing_rank_order_is_not_split(calls: list[Call]) -> None:
    mesh = fmesh.make_mesh({"dp": 2, "tp": 4}, ranks=list(range(7, -1, -1)))
    members = fmesh.group(mesh, "tp", ME)
    assert _run(mesh, "tp") == ("pg", members)
    assert calls == [("new_group", members, "nccl")]


def test_non_member_still_takes_part_once(calls: list[Call]) -> None:
    mesh = fmesh.make_mesh({"dp": 2, "tp": 2})  # ranks 0..3; rank 5 is outside
    assert fmesh.coordinate(mesh, ME) is None
    assert _run(mesh, "tp") is None
    assert len(calls) == 1 and calls[0][0] == "split_group"
    assert ME not in calls[0][1]
    assert _run(mesh, "tp") is None  # memoized: no second collective
    assert len(calls) == 1


def test_size_one_axis_gets_a_member_only_gloo_group(calls: list[Call]) -> None:
    mesh = fmesh.make_mesh({"pp": 1, "dp": 8})
    assert _run(mesh, "pp") == ("pg", (ME,))
    assert calls == [("new_group", (ME,), "gloo")]


def test_full_world_in_rank_order_is_the_default_group(calls: list[Call]) -> None:
    mesh = fmesh.make_mesh({"world": 8})
    assert _run(mesh, "world", backend="cpu:gloo,cuda:nccl") is WORLD_PG
    assert calls == []
    # Another backend, or another order, is a group of its own.
    assert _run(mesh, "world", backend="nccl") == ("pg", tuple(range(8)))
    reordered = fmesh.make_mesh({"world": 8}, ranks=[1, 0, 2, 3, 4, 5, 6, 7])
    assert _run(reordered, "world", backend="cpu:gloo,cuda:nccl") == (
        "pg",
        (1, 0, 2, 3, 4, 5, 6, 7),
    )


def test_each_axis_key_is_created_once(calls: list[Call]) -> None:
    mesh = fmesh.make_mesh({"dp": 2, "tp": 4})
    first = _run(mesh, "tp")
    again = _run(fmesh.slice(mesh, "tp"), "tp")
    assert first is again
    assert len(calls) == 1


def test_size_one_axis_honours_a_backend_named_for_it(calls: list[Call]) -> None:
    mesh = fmesh.make_mesh({"pp": 1, "dp": 8})
    assert _run(mesh, "pp", backend="nccl", explicit=True) == ("pg", (ME,))
    assert calls == [("new_group", (ME,), "nccl")]


def test_split_passes_the_axis_backend(calls: list[Call]) -> None:
    mesh = fmesh.make_mesh({"dp": 2, "tp": 4})
    _run(mesh, "tp", backend="nccl", explicit=True)
    _run(mesh, "dp", backend="gloo", explicit=True)
    assert calls == [
        ("split_group", fmesh.group(mesh, "tp", ME), "nccl"),
        ("new_group", fmesh.group(mesh, "dp", ME), "gloo"),
    ]


# -- after a loss (fmesh.recover declared ranks lost) ---------------------------------------


@pytest.fixture
def shrinks(
    monkeypatch: pytest.MonkeyPatch, calls: list[Call]
) -> list[tuple[object, list[int]]]:
    """Record NCCL communicator shrinks instead of making them."""
    made: list[tuple[object, list[int]]] = []

    def shrink_from(parent: object, exclude: list[int]) -> object:
        made.append((parent, list(exclude)))
        return ("shrunk", parent, tuple(exclude))

    monkeypatch.setattr(_c10d, "shrink_from", shrink_from)
    return made


def _lose(ranks: set[int], world: int = 8) -> None:
    with _memo.state.lock:
        _memo.state.forget_lost(frozenset(ranks), world)


def _run_after_loss(mesh: fmesh.Mesh, axis: str, backend: str = "nccl") -> object:
    world = _launch.World(
        pg=WORLD_PG,
        size=8,
        rank=ME,
        backend="cpu:gloo,cuda:nccl",
        fake=False,
        eager=True,
        intact=False,
    )
    return _axis_group(mesh, axis, world, backend)


def test_after_a_loss_a_group_of_survivors_is_shrunk_from_the_retired_one(
    calls: list[Call], shrinks: list[tuple[object, list[int]]]
) -> None:
    mesh = fmesh.make_mesh({"dp": 4, "tp": 2})  # dp groups [1, 3, 5, 7] for rank 5
    old = _run(mesh, "dp")
    assert old == ("pg", (1, 3, 5, 7))
    _lose({3})
    smaller = fmesh.shrink(mesh, {3}, axis="dp")
    assert fmesh.group(smaller, "dp", ME) == (1, 5, 7)
    got = _run_after_loss(smaller, "dp")
    # No world split (the world holds rank 3), no new rendezvous: group rank 1 of
    # the old group goes, the survivors keep their order.
    assert got == ("shrunk", old, (1,))
    assert shrinks == [(old, [1])]
    assert [c[0] for c in calls] == ["split_group"]  # only the first, before the loss


def test_after_a_loss_other_groups_are_made_by_their_members(
    calls: list[Call], shrinks: list[tuple[object, list[int]]]
) -> None:
    mesh = fmesh.make_mesh({"dp": 4, "tp": 2})
    tp = _run(mesh, "tp")  # [4, 5]: no lost rank
    _lose({3})
    assert _run_after_loss(mesh["tp"], "tp") is tp  # a survivor group stays memoized
    survivors = fmesh.make_mesh({"dp": 2, "tp": 2}, ranks=[4, 5, 6, 7])
    # dp [5, 7] is no retired group less lost ranks (rank 5's was [1, 3, 5, 7] only
    # if realized; here none was): made by its members, not split from the world.
    assert _run_after_loss(survivors, "dp") == ("pg", (5, 7))
    assert calls[-1] == ("new_group", (5, 7), "nccl")
    assert shrinks == []
    # The whole world is no longer the default group's job.
    world = _run_after_loss(fmesh.make_mesh({"w": 8}), "w", backend="cpu:gloo,cuda:nccl")
    assert world == ("pg", tuple(range(8))) and world is not WORLD_PG
