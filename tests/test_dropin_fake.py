"""``fmesh.device_mesh.init_device_mesh`` on torch's fake and threaded backends, and the
rule that decides which fmesh axes a DeviceMesh root offers torch's ``_flatten``.

Dry runs: one process plays one rank of a 64-rank fake world (no GPU needed, ``"cuda"``
accepted, as torch accepts it there) and compares every answer with torch's own
``init_device_mesh`` in the same process; a 2^17-rank world checks that a dry run of a
trainer-sized mesh stays cheap. Threaded worlds (all ranks as threads of one process)
get torch's own mesh. DeviceMeshes fmesh assembles field by field are compared with
the ones ``DeviceMesh.__init__`` builds.
"""

from __future__ import annotations

import importlib
import itertools
import math
from pathlib import Path
from typing import Any

import pytest
from _compare import no_more_groups, results
from _dist import run_spawn, threaded_world
from dropin_facts import Facts, answers, init_errors, init_inputs, num_groups, operations
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import build_chain, derived_specs

import fmesh
from fmesh import Layout
from fmesh._torch.interop import is_flatten_of

WORLD = 64
RANK = 37
CASES: dict[str, tuple[tuple[int, ...], tuple[str, ...] | None]] = {
    "named": ((4, 16), ("dp", "tp")),
    "unnamed": ((8, 8), None),
    "world": ((WORLD,), None),
    "3d": ((2, 4, 8), ("pp", "dp", "tp")),
    "part": ((32,), ("dp",)),  # rank 37 is beyond it
}
BIG = {"pp": 4, "dp_replicate": 8, "dp_shard": 32, "cp": 4, "tp": 32}  # 2^17 ranks


def _fields(dm: Any) -> Facts:
    """Everything a DeviceMesh holds but its group registry and group names."""
    skip = ("_pg_registry", "_dim_group_names", "_flatten_mapping", "_root_mesh", "_rank_map")
    out = {k: v for k, v in vars(dm).items() if k not in skip}
    out["rank_map"] = dm._rank_map.tolist()
    out["is_root"] = dm._get_root_mesh() is dm
    return out


def fake_job(_: int, __: int) -> Facts:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh as torch_init

    from fmesh.device_mesh import init_device_mesh

    fmesh.init_fake_world(WORLD, RANK)
    out: Facts = {"cases": {}}
    for tag, (shape, names) in CASES.items():
        for device in ("cpu", "cuda"):
            theirs = torch_init(device, shape, mesh_dim_names=names)
            ours = init_device_mesh(device, shape, mesh_dim_names=names)
            created = fmesh.cache_stats().created
            before = num_groups()
            again = init_device_mesh(device, shape, mesh_dim_names=names)
            slices = [()] if names is None else [(n,) for n in names] + [names[-2:]]
            out["cases"][f"{tag}/{device}"] = {
                "torch": answers(theirs),
                "fmesh": answers(ours),
                "equal": ours == theirs and hash(ours) == hash(theirs),
                "fields": [_fields(theirs[s] if s else theirs) for s in slices],
                "fmesh_fields": [_fields(ours[s] if s else ours) for s in slices],
                "repeat": (
                    again is not ours and again == ours,
                    fmesh.cache_stats().created - created,
                ),
                "repeat_groups": num_groups() - before,
                "torch_ops": operations(theirs, tag) if device == "cpu" else None,
                "fmesh_ops": operations(ours, tag) if device == "cpu" else None,
            }
    out["errors"] = {
        "torch": init_errors(torch_init, WORLD),
        "fmesh": init_errors(init_device_mesh, WORLD),
    }
    out["override"] = _override(torch_init, init_device_mesh)
    fake_pg: Any = importlib.import_module("torch.testing._internal.distributed.fake_pg")
    opts = fake_pg.FakeProcessGroup.Options()
    out["inputs"] = {
        "torch": init_inputs(torch_init, WORLD, opts),
        "fmesh": init_inputs(init_device_mesh, WORLD, opts),
    }
    realized = fmesh.realize(fmesh.make_mesh({"a": 8, "b": 8}))
    out["to_device_mesh_cuda"] = realized.to_device_mesh("cuda").device_type
    fmesh.destroy()
    dist.destroy_process_group()
    fmesh.init_fake_world(math.prod(BIG.values()), 123_457)
    dm = init_device_mesh("cuda", tuple(BIG.values()), mesh_dim_names=tuple(BIG))
    out["big"] = {
        "coordinate": dm.get_coordinate(),
        "sub": dm["dp_shard", "tp"].get_coordinate(),
        "groups": [g.size() for g in dm.get_all_groups()],
        "created": fmesh.cache_stats().created,
    }
    return out


def _override(torch_init: Any, ours: Any) -> Facts:
    """``backend_override`` by index, by name, with options, both ways."""
    # Typed loosely: the fake backend's options are not in torch's stubs.
    fake_pg: Any = importlib.import_module("torch.testing._internal.distributed.fake_pg")
    opts = fake_pg.FakeProcessGroup.Options()
    opts.fake_option = 42
    out: Facts = {}
    for who, init in (("torch", torch_init), ("fmesh", ours)):
        dm = init(
            "cpu",
            (2, 4, 8),
            mesh_dim_names=("dp", "tp", "cp"),
            backend_override={0: "fake", "cp": ("fake", opts), "tp": opts},
        )
        backends = []
        for i in range(3):
            backend = dm.get_group(i)._get_backend(__import__("torch").device("cpu"))
            backends.append(
                (type(backend).__name__, getattr(backend.options, "fake_option", None))
            )
        out[who] = backends
    return out


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Facts:
    job = run_spawn(fake_job, 1, tmp_path=tmp_path_factory.mktemp("fake"), launch_env=False)
    value: Facts = job.values()[0]
    return value


@pytest.mark.parametrize("case", [f"{t}/{d}" for t in CASES for d in ("cpu", "cuda")])
def test_dry_runs_answer_as_torch(fake: Facts, case: str) -> None:
    facts = fake["cases"][case]
    assert facts["fmesh"] == facts["torch"]
    assert facts["equal"] is True
    assert facts["fmesh_fields"] == facts["fields"]  # fmesh's assembly == __init__'s
    # A new root per call, as torch's, equal to the first; no group created again.
    assert facts["repeat"] == (True, 0) and facts["repeat_groups"] == 0
    if facts["torch_ops"] is not None:
        assert results(facts["fmesh_ops"]) == results(facts["torch_ops"])
        assert no_more_groups(facts["torch_ops"], facts["fmesh_ops"]) == []
    if case.startswith("part"):
        assert facts["fmesh"]["coordinate"] is None  # rank 37 is beyond the mesh


def test_cuda_is_accepted_on_a_fake_world_without_gpus(fake: Facts) -> None:
    assert fake["to_device_mesh_cuda"] == "cuda"
    facts = fake["cases"]["named/cuda"]
    assert facts["fmesh"]["device_type"] == "cuda"
    assert facts["fmesh"]["coordinate"] == (RANK // 16, RANK % 16)


def test_errors_on_a_fake_world_match_torch(fake: Facts) -> None:
    theirs, ours = fake["errors"]["torch"], fake["errors"]["fmesh"]
    for case in theirs:
        assert theirs[case] is not None and ours[case] is not None, case
        assert theirs[case][0][0] in ours[case][0], case


def test_backend_override_by_index_and_name_with_options(fake: Facts) -> None:
    assert fake["override"]["fmesh"] == fake["override"]["torch"]
    assert [o for _, o in fake["override"]["fmesh"]] == [None, 42, 42]
    assert {name for name, _ in fake["override"]["fmesh"]} == {"FakeProcessGroup"}


LISTED_INPUT_DIFFERENCES = {
    # torch's group constructor raises AssertionError ("Unknown backend type"); fmesh
    # refuses before any group with an fmesh.MeshError (a ValueError) naming the
    # backends it knows. Listed on docs/device-mesh.md.
    "backend_override unknown backend": ("AssertionError", "MeshError"),
    "backend_override unknown backend in a pair": ("AssertionError", "MeshError"),
}


def test_odd_inputs_are_taken_or_refused_as_torch(fake: Facts) -> None:
    """Where torch accepts an input the drop-in gives the same mesh; where torch
    raises, the drop-in's error is an instance of torch's class; the two exceptions
    are the differences docs/device-mesh.md lists."""
    theirs, ours = fake["inputs"]["torch"], fake["inputs"]["fmesh"]
    assert theirs.keys() == ours.keys()
    for case, torch_got in theirs.items():
        got = ours[case]
        if case in LISTED_INPUT_DIFFERENCES:
            want_torch, want_ours = LISTED_INPUT_DIFFERENCES[case]
            assert torch_got[0] == "raises" and torch_got[1][0] == want_torch, case
            assert got[0] == "raises" and want_ours in got[1], (case, got)
            assert "AssertionError" not in got[1], (case, got)
        elif torch_got[0] == "raises":
            assert got[0] == "raises" and torch_got[1][0] in got[1], (case, torch_got, got)
        else:
            assert got == torch_got, (case, torch_got, got)
    accepted = {c for c, v in theirs.items() if v[0] != "raises"}
    # The inputs of issue 33 that torch takes: every device type, pairs with None.
    assert {"device 'bogus'", "device 'CPU'", "backend_override pair of None"} <= accepted
    assert theirs["backend_override one-item tuple"][1][0] == "ValueError"
    assert theirs["backend_override int"][1][0] == "TypeError"


def test_a_trainer_sized_dry_run(fake: Facts) -> None:
    big = fake["big"]
    mesh = fmesh.make_mesh(BIG)
    assert big["coordinate"] == fmesh.coordinate(mesh, 123_457)
    coord = big["coordinate"]
    assert big["sub"] == (coord[2], coord[4])
    assert big["groups"] == list(BIG.values())
    assert big["created"] == 5


# -- threaded worlds ------------------------------------------------------------------------


def threaded_job(_: int, __: int) -> dict[int, Any]:
    """Four ranks as threads of this process on torch's threaded backend."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh as torch_init

    from fmesh.device_mesh import init_device_mesh

    def rank_main(rank: int) -> object:
        ours = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        theirs = torch_init("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        total = torch.ones(1) * rank
        dist.all_reduce(total, group=ours["tp"].get_group())
        # torch's own methods on it stay torch's too (the hook passes them on).
        flat = ours._flatten("dp_tp")
        try:
            fmesh.realize(fmesh.make_mesh({"dp": 2, "tp": 2}))
            refused = ""
        except fmesh.MeshError as err:
            refused = str(err)
        return {
            "refused": refused,
            "equal": ours == theirs,
            "coordinate": ours.get_coordinate(),
            "tp_sum": float(total.item()),
            "flat": flat.mesh.tolist(),
            "fmesh_created": fmesh.cache_stats().created,
        }

    return threaded_world(rank_main)


def test_threaded_worlds_get_torchs_own_mesh(tmp_path: Path) -> None:
    results = run_spawn(threaded_job, 1, tmp_path=tmp_path, launch_env=False).values()[0]
    for rank in range(4):
        facts = results[rank]
        assert isinstance(facts, dict), facts
        assert facts["equal"] is True
        assert facts["coordinate"] == (rank // 2, rank % 2)
        assert facts["tp_sum"] == (rank // 2 * 2) * 2 + 1
        assert facts["flat"] == [0, 1, 2, 3]
        assert facts["fmesh_created"] == 0  # torch made the groups, the flatten's too
        # fmesh.realize itself says at once why it cannot serve a threaded world.
        assert "cannot run on torch's threaded test world" in facts["refused"]


# -- which realized axes a root offers torch's _flatten -------------------------------------


def _flattens(axes: tuple[Layout, ...]) -> set[Layout]:
    """Brute force: the layout of every ordered choice of two or more axes of size > 1."""
    real = [a for a in axes if a.size > 1]
    return {
        Layout.concat([real[i] for i in perm])
        for k in range(2, len(real) + 1)
        for perm in itertools.permutations(range(len(real)), k)
    }


@settings(max_examples=150, deadline=None)
@given(derived_specs(), derived_specs(), st.data())
def test_is_flatten_of_matches_brute_force(a: Any, b: Any, data: st.DataObject) -> None:
    mesh = build_chain(*a)
    other = build_chain(*b)
    candidates = list(mesh.axes) + list(other.axes)
    names = data.draw(st.permutations(mesh.axis_names))
    k = data.draw(st.integers(1, len(names)))
    flat = fmesh.flatten(mesh, names[:k], "zz_flat")
    candidates.append(flat.axes[flat.axis_index("zz_flat")])
    want = _flattens(mesh.axes)
    for layout in candidates:
        assert is_flatten_of(layout, mesh.axes) is (layout in want), (layout, mesh)
