"""``examples/parallel_dims.py``: torchtitan's ParallelDims views as one fmesh value.

Expected groups come from torch's own recipe, written here as torchtitan writes it
(``init_device_mesh`` of a 1-d world, one ``_unflatten`` per view, ``_flatten`` for
the loss mesh), never from the example or fmesh:

* on torch's ``fake`` backend (one process plays several ranks of worlds up to 2**17):
  torch's group ranks (``get_process_group_ranks``, which torch sorts) as sets, and
  its ``DeviceMesh.mesh`` rows (in coordinate order) as orders;
* on 8 real gloo ranks: the same, plus an all_reduce of ``2**rank`` over fmesh's
  group and over torch's, which shows exactly who is in each;
* sharing: two (view, axis) pairs must get the same fmesh process group object exactly
  when torch's rows for them are equal, and fmesh must create one group per distinct
  row (torch creates one per dimension; its count is checked too).
"""

from __future__ import annotations

import contextlib
import doctest
import io
import math
import random
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _dist import run_spawn

import fmesh

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import parallel_dims  # lives in examples/, put on the path above
from parallel_dims import DimsError, ParallelDims, build_meshes

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

Row = tuple[int, ...]

FAKE_CONFIGS: dict[str, dict[str, int]] = {
    "all_axes": {"pp": 2, "dp_replicate": 2, "cp": 2, "tp": 2, "ep": 2, "etp": 2},
    "etp1_ep_borrows_tp": {"pp": 2, "dp_replicate": 2, "tp": 2, "ep": 4},
    "cp_tp_ep_is_cp": {"dp_replicate": 4, "dp_shard": 4, "cp": 2, "tp": 4, "ep": 2, "etp": 4},
    "no_ep_hsdp": {"dp_replicate": 4, "tp": 2},
    "ep_spans_all": {"tp": 2, "ep": 64},
}
"""Configurations on 128 ranks (dp_shard the rest unless given)."""
FAKE_WORLD = 128
BIG_CONFIGS: dict[str, dict[str, int]] = {
    "etp_tp": {"pp": 8, "dp_replicate": 4, "cp": 2, "tp": 8, "ep": 16, "etp": 8},
    "etp1": {"pp": 4, "dp_replicate": 4, "dp_shard": 512, "cp": 4, "tp": 4, "ep": 32},
    "no_ep_size_one_axes": {"dp_replicate": 16, "tp": 8},
}
"""Configurations on 2**17 ranks, compared with torch's layout algebra only: there
torch's recipe would call new_group about half a million times per rank."""
BIG_WORLD = 2**17
GLOO_CONFIGS: dict[str, dict[str, int]] = {
    "pp_tp_ep_etp_tp": {"pp": 2, "tp": 2, "ep": 2, "etp": 2},
    "hsdp_ep_borrows_tp": {"dp_replicate": 2, "tp": 2, "ep": 4},
    "cp_ep_is_cp": {"dp_shard": 2, "cp": 2, "tp": 2, "ep": 2, "etp": 2},
    "fsdp_only_ep4": {"ep": 4},
}
"""Configurations on 8 gloo ranks."""
GLOO_WORLD = 8
MAIN_ARGS = ["--pp", "2", "--dp-shard", "-1", "--tp", "2", "--ep", "2", "--etp", "2"]


# -- torch's recipe (independent of the example) -----------------------------------------


def torch_recipe(d: ParallelDims, groups: bool = True) -> dict[str, DeviceMesh]:
    """torchtitan's ``build_mesh``: one ``_unflatten`` of the world per view, and the
    loss mesh by ``_flatten`` of the data-loading mesh's ``batch, cp``.

    Without ``groups``, torch's layout algebra alone: no process groups, and no loss
    mesh (torch cannot slice a mesh without groups; see :func:`_loss_row`).
    """
    import torch
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if groups:
        world = init_device_mesh("cpu", (d.world,), mesh_dim_names=("world",))
    else:
        # torch's layout algebra alone: a mesh (and unflattens) with no groups.
        world = DeviceMesh(
            "cpu", torch.arange(d.world), mesh_dim_names=("world",), _init_backend=False
        )

    def unflatten(sizes: tuple[int, ...], names: tuple[str, ...]) -> DeviceMesh:
        return world._unflatten(0, sizes, names)

    batch = d.dp_replicate * d.dp_shard
    efsdp = d.dp_shard * d.cp * d.tp // (d.ep * d.etp)
    dataloading = unflatten((d.pp, batch, d.cp, d.tp), ("pp", "batch", "cp", "tp"))
    recipe = {
        "world": world,
        "dense": unflatten(
            (d.pp, d.dp_replicate, d.dp_shard, d.cp, d.tp),
            ("pp", "dp_replicate", "dp_shard", "cp", "tp"),
        ),
        "dataloading": dataloading,
        "dense_fsdp": unflatten(
            (d.pp, d.dp_replicate, d.dp_shard * d.cp, d.tp),
            ("pp", "dp_replicate", "fsdp", "tp"),
        ),
        "fwdbwd": unflatten((d.pp, batch, d.cp, d.tp), ("pp", "dp", "cp", "tp")),
        "sparse": unflatten(
            (d.pp, d.dp_replicate, efsdp, d.ep, d.etp),
            ("pp", "dp_replicate", "efsdp", "ep", "etp"),
        ),
    }
    if groups:
        recipe["loss"] = dataloading["batch", "cp"]._flatten("loss")
    return recipe


def _loss_row(dataloading: DeviceMesh) -> Row:
    """The loss group as ``_flatten`` defines it: this rank's ``batch x cp`` block of
    the data-loading mesh, row-major."""
    coord = dataloading.get_coordinate()
    assert coord is not None
    block = dataloading.mesh[coord[0], :, :, coord[3]]
    return tuple(int(r) for r in block.flatten().tolist())


def _row(dm: DeviceMesh, axis: int) -> Row:
    """This rank's row of ``dm.mesh`` along ``axis``: its group in coordinate order."""
    coord = dm.get_coordinate()
    assert coord is not None
    index = tuple(slice(None) if i == axis else c for i, c in enumerate(coord))
    return tuple(int(r) for r in dm.mesh[index].tolist())


def _mask(pg: ProcessGroup, rank: int) -> int:
    """All-reduce ``2**rank`` over ``pg``: the bit mask of its members."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([1 << rank], dtype=torch.int64)
    dist.all_reduce(t, group=pg)
    return int(t.item())


def _facts(
    d: ParallelDims, rank: int, collectives: bool, torch_groups: bool = True
) -> dict[str, Any]:
    """Realize every view with fmesh and build torch's recipe; report both.

    ``collectives``: also all-reduce ``2**rank`` over every group (real backends).
    ``torch_groups``: build torch's recipe with its process groups (else layouts only).
    """
    import torch.distributed as dist

    meshes = build_meshes(d)
    before = fmesh.cache_stats()
    realized = {name: fmesh.realize(m) for name, m in meshes.items()}
    after = fmesh.cache_stats()
    objects: list[ProcessGroup] = []

    def ident(pg: ProcessGroup) -> int:
        """Index of ``pg`` among the distinct group objects seen so far."""
        for i, seen in enumerate(objects):
            if seen is pg:
                return i
        objects.append(pg)
        return len(objects) - 1

    fm: dict[str, dict[str, Any]] = {}
    for name, r in realized.items():
        fm[name] = {}
        for axis in r.mesh.axis_names:
            pg = r.group(axis)
            fm[name][axis] = {
                "ranks": tuple(dist.get_process_group_ranks(pg)),
                "group_rank": pg.rank(),
                "coordinate": r.local_rank(axis),
                "object": ident(pg),
                "is_world": pg is dist.group.WORLD,
                "mask": _mask(pg, rank) if collectives else None,
            }
    recipe = torch_recipe(d, groups=torch_groups)
    torch_pgs: list[ProcessGroup] = []
    tm: dict[str, dict[str, Any]] = {}
    for name, dm in recipe.items():
        names = dm.mesh_dim_names
        assert names is not None
        coord = dm.get_coordinate()
        assert coord is not None
        tm[name] = {}
        for i, axis in enumerate(names):
            row = _row(dm, i)
            tm[name][axis] = {"ranks": tuple(sorted(row)), "row": row, "coordinate": coord[i]}
            tm[name][axis]["mask"] = None
            if torch_groups:
                pg = dm.get_group(axis)
                if pg is not dist.group.WORLD and all(pg is not p for p in torch_pgs):
                    torch_pgs.append(pg)
                tm[name][axis]["ranks"] = tuple(dist.get_process_group_ranks(pg))
                if collectives:
                    tm[name][axis]["mask"] = _mask(pg, rank)
    if not torch_groups:
        row = _loss_row(recipe["dataloading"])
        tm["loss"] = {"loss": {"ranks": tuple(sorted(row)), "row": row, "mask": None}}
        tm["loss"]["loss"]["coordinate"] = row.index(rank)
    tm = {name: tm[name] for name in fm}  # fmesh's view order
    return {
        "rank": rank,
        "fmesh": fm,
        "torch": tm,
        "created": after.created - before.created,
        "realize_created": {name: r.created for name, r in realized.items()},
        "torch_groups": len(torch_pgs) if torch_groups else None,
    }


def fake_job(
    _: int,
    __: int,
    cases: list[tuple[str, int, dict[str, int], list[int]]],
    torch_groups: bool,
) -> Any:
    """Play each rank of each configuration in a fresh fake world."""
    import torch.distributed as dist

    out: dict[str, list[dict[str, Any]]] = {}
    for label, world, config, ranks in cases:
        d = ParallelDims.resolve(world, **config)
        out[label] = []
        for rank in ranks:
            fmesh.init_fake_world(world, rank)
            out[label].append(_facts(d, rank, False, torch_groups))
            fmesh.destroy()
            dist.destroy_process_group()
    return out


def check_facts(d: ParallelDims, facts: dict[str, Any]) -> None:
    """fmesh's groups equal torch's recipe's, and each distinct group is created once."""
    rank = facts["rank"]
    fm, tm = facts["fmesh"], facts["torch"]
    assert list(fm) == list(tm)
    rows: dict[tuple[str, str], Row] = {}
    for view in tm:
        assert list(fm[view]) == list(tm[view]), view
        for axis, t in tm[view].items():
            f = fm[view][axis]
            where = (view, axis, rank)
            # torch sorts its group ranks; its mesh rows are in coordinate order.
            assert set(f["ranks"]) == set(t["ranks"]), where
            assert f["ranks"] == t["row"], where
            assert f["group_rank"] == f["coordinate"] == t["coordinate"], where
            assert t["row"][t["coordinate"]] == rank, where
            if t["mask"] is not None:
                members = sum(1 << r for r in t["row"])
                assert f["mask"] == t["mask"] == members, where
            rows[view, axis] = t["row"]
    # One fmesh group per distinct row (the whole world in order is the default group).
    whole = tuple(range(d.world))
    for a, row_a in rows.items():
        fa = fm[a[0]][a[1]]
        assert fa["is_world"] == (row_a == whole), a
        for b, row_b in rows.items():
            fb = fm[b[0]][b[1]]
            assert (fa["object"] == fb["object"]) == (row_a == row_b), (a, b, rank)
    distinct = {row for row in rows.values() if row != whole}
    assert facts["created"] == len(distinct)
    assert sum(facts["realize_created"].values()) == len(distinct)
    # torch makes one group per dimension of every _unflatten/_flatten (none for the
    # world mesh, nor for a dimension spanning the whole world).
    per_dimension = sum(
        1 for (view, _), row in rows.items() if view != "world" and row != whole
    )
    if facts["torch_groups"] is not None:
        assert facts["torch_groups"] == per_dimension
        assert facts["torch_groups"] == parallel_dims.torchtitan_groups_per_rank(d)


# -- fake backend ------------------------------------------------------------------------


def _cases(
    configs: dict[str, dict[str, int]], world: int, per_config: int, seed: int
) -> list[tuple[str, int, dict[str, int], list[int]]]:
    rng = random.Random(seed)
    return [
        (
            label,
            world,
            config,
            [0, world - 1, *rng.sample(range(1, world - 1), per_config - 2)],
        )
        for label, config in configs.items()
    ]


@pytest.fixture(scope="module")
def fake_small(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    cases = _cases(FAKE_CONFIGS, FAKE_WORLD, 5, seed=1)
    job = run_spawn(
        fake_job,
        1,
        cases,
        True,
        tmp_path=tmp_path_factory.mktemp("fake"),
        launch_env=False,
        timeout=150,
    )
    (reports,) = job.values()
    assert isinstance(reports, dict)
    return reports


@pytest.mark.parametrize("label", list(FAKE_CONFIGS))
def test_fake_groups_equal_torch_recipe(
    fake_small: dict[str, list[dict[str, Any]]], label: str
) -> None:
    d = ParallelDims.resolve(FAKE_WORLD, **FAKE_CONFIGS[label])
    assert len(fake_small[label]) == 5
    for facts in fake_small[label]:
        check_facts(d, facts)


def test_fake_groups_equal_torch_layouts_at_2_to_the_17(tmp_path: Path) -> None:
    cases = _cases(BIG_CONFIGS, BIG_WORLD, 4, seed=17)
    (reports,) = run_spawn(
        fake_job, 1, cases, False, tmp_path=tmp_path, launch_env=False, timeout=200
    ).values()
    for label, world, config, ranks in cases:
        d = ParallelDims.resolve(world, **config)
        assert [f["rank"] for f in reports[label]] == ranks
        for facts in reports[label]:
            check_facts(d, facts)


# -- 8 gloo ranks ------------------------------------------------------------------------


def gloo_job(rank: int, world: int) -> dict[str, Any]:
    """Every configuration on real gloo groups, then the example's own main()."""
    out: dict[str, Any] = {}
    for label, config in GLOO_CONFIGS.items():
        out[label] = _facts(ParallelDims.resolve(world, **config), rank, collectives=True)
        fmesh.destroy()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        out["main_status"] = parallel_dims.main(MAIN_ARGS)
    out["main_stdout"] = buf.getvalue()
    return out


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    job = run_spawn(
        gloo_job, GLOO_WORLD, tmp_path=tmp_path_factory.mktemp("gloo"), timeout=240
    )
    return job.values()


@pytest.mark.parametrize("label", list(GLOO_CONFIGS))
def test_gloo_groups_equal_torch_recipe_by_collectives(
    gloo: list[dict[str, Any]], label: str
) -> None:
    d = ParallelDims.resolve(GLOO_WORLD, **GLOO_CONFIGS[label])
    assert [r[label]["rank"] for r in gloo] == list(range(GLOO_WORLD))
    for report in gloo:
        check_facts(d, report[label])


def test_gloo_shared_axes_are_created_once(gloo: list[dict[str, Any]]) -> None:
    # pp=2, tp=2, ep=2, etp=2 on 8 ranks: dense is (pp=2, dp_replicate=1, dp_shard=2,
    # cp=1, tp=2); sparse is (pp=2, dp_replicate=1, efsdp=1, ep=2, etp=2).
    for report in gloo:
        fm = report["pp_tp_ep_etp_tp"]["fmesh"]
        same = [
            (("dense", "tp"), ("sparse", "etp")),
            (("dense", "dp_shard"), ("sparse", "ep")),
            (("dense", "dp_shard"), ("dataloading", "batch")),
            (("dataloading", "batch"), ("fwdbwd", "dp")),
        ] + [(("dense", "pp"), (view, "pp")) for view in fm if view not in ("world", "loss")]
        for (va, aa), (vb, ab) in same:
            assert fm[va][aa]["object"] == fm[vb][ab]["object"], (va, aa, vb, ab)
        # dense: pp, dp_replicate (size 1), dp_shard, cp (size 1: the same one-member
        # group as dp_replicate), tp. Then nothing new: batch, loss and fsdp have
        # dp_shard's ranks here, ep too, etp is tp and efsdp is another size-1 axis.
        assert report["pp_tp_ep_etp_tp"]["realize_created"] == {
            "world": 0,
            "dense": 4,
            "dataloading": 0,
            "loss": 0,
            "dense_fsdp": 0,
            "fwdbwd": 0,
            "sparse": 0,
        }
        assert report["pp_tp_ep_etp_tp"]["created"] == 4
        assert report["pp_tp_ep_etp_tp"]["torch_groups"] == 23


def test_main_under_torchrun_checks_every_group(gloo: list[dict[str, Any]]) -> None:
    d = ParallelDims.resolve(GLOO_WORLD, pp=2, tp=2, ep=2, etp=2)
    views = sum(m.ndim for m in build_meshes(d).values())
    for rank, report in enumerate(gloo):
        assert report["main_status"] == 0, report["main_stdout"]
        lines = report["main_stdout"].splitlines()
        assert lines[-1] == (
            f"rank {rank}: 7 views, {views} axis groups checked by all_reduce: all match "
            f"fmesh.group; fmesh created 4 groups and reused {views - 4}, where torch's "
            "DeviceMesh recipe creates 23"
        )
        if rank == 0:
            assert lines[0].startswith(
                "ParallelDims(world=8, pp=2, dp_replicate=1, dp_shard=2"
            )
            for name, mesh in build_meshes(d).items():
                sizes = " ".join(f"{a}={s}" for a, s in mesh.shape.items())
                how = parallel_dims.DERIVATIONS[name]
                row = rf"\s+{name}\s+{re.escape(sizes)}\s+{re.escape(how)}"
                assert any(re.fullmatch(row, line) for line in lines), (name, lines)


# -- the --plan command line -------------------------------------------------------------


def plan_job(_: int, __: int, argv: list[str]) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = parallel_dims.main(argv)
    return status, buf.getvalue()


_ROW = re.compile(
    r"^(?P<view>\w+)\s+(?P<axis>\w+)\s+(?P<size>\d+)\s+(?P<grank>\d+)\s+"
    r"(?P<origin>.+?)\s+(?P<group>\[[\d, .]+\])$"
)


def _expected_group(ranks: tuple[int, ...]) -> str:
    if len(ranks) <= 8:
        return "[" + ", ".join(map(str, ranks)) + "]"
    return "[" + ", ".join(map(str, ranks[:4])) + f", ..., {ranks[-1]}]"


@pytest.mark.parametrize(
    ("world", "config", "rank"),
    [
        (2**17, {"pp": 8, "dp_replicate": 4, "cp": 2, "tp": 8, "ep": 16}, 77777),
        (64, {"pp": 2, "dp_replicate": 2, "cp": 2, "tp": 2, "ep": 4, "etp": 2}, 45),
    ],
)
def test_plan_prints_fmesh_groups(
    tmp_path: Path, world: int, config: dict[str, int], rank: int
) -> None:
    argv = ["--plan", "--world", str(world), "--rank", str(rank)]
    for key, value in config.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    ((status, out),) = run_spawn(
        plan_job, 1, argv, tmp_path=tmp_path, launch_env=False, timeout=120
    ).values()
    assert status == 0, out
    d = ParallelDims.resolve(world, **config)
    meshes = build_meshes(d)
    rows = [m.groupdict() for line in out.splitlines() if (m := _ROW.match(line))]
    expected = [(v, a) for v, m in meshes.items() for a in m.axis_names]
    assert [(r["view"], r["axis"]) for r in rows] == expected
    first: dict[tuple[int, ...], str] = {}
    created = 0
    for r in rows:
        mesh = meshes[r["view"]]
        group = fmesh.group(mesh, r["axis"], rank)
        coord = fmesh.coordinate(mesh, rank)
        assert coord is not None
        assert r["group"] == _expected_group(group), r
        assert int(r["size"]) == len(group)
        assert int(r["grank"]) == coord[mesh.axis_index(r["axis"])] == group.index(rank)
        # "created" exactly for the first view.axis with these ranks, in realize order.
        if group == tuple(range(world)):
            assert r["origin"] == "default group (whole world)"
        elif group in first:
            assert r["origin"] == f"reused: same as {first[group]}", r
        else:
            first[group] = f"{r['view']}.{r['axis']}"
            assert r["origin"].startswith("created"), r
            created += 1
    assert f"fmesh: {created} process groups created, {len(rows) - created} reused" in out
    assert f"sum of RealizedMesh.created: {created})" in out
    torch_count = parallel_dims.torchtitan_groups_per_rank(d)
    assert f"torch's DeviceMesh recipe (torchtitan): {torch_count} process groups" in out


# -- validation and pure parts -----------------------------------------------------------


@pytest.mark.parametrize(
    ("world", "config", "match"),
    [
        (8, {"tp": 0}, r"--tp is 0; expected a degree >= 1"),
        (8, {"dp_shard": 0}, r"--dp-shard is 0; expected -1 \(the rest of the world\)"),
        (8, {"dp_shard": -1, "tp": 3}, r"= 3 does not divide the world size 8"),
        (8, {"dp_shard": 2, "tp": 2}, r"= 4, but the world has 8 ranks"),
        (
            8,
            {"tp": 2, "ep": 2, "etp": 4},
            r"--etp is 4 with --ep 2; .* equal to --tp \(2\) or 1",
        ),
        (8, {"tp": 2, "ep": 16}, r"ep\*etp = 16\*1 = 16 does not divide; choose"),
        (16, {"dp_shard": 4, "tp": 4, "ep": 8, "etp": 4}, r"= 16 ranks, which ep\*etp = 8\*4"),
        (0, {}, r"the world size is 0"),
    ],
)
def test_bad_degrees_raise_clear_errors(
    world: int, config: dict[str, int], match: str
) -> None:
    with pytest.raises(DimsError, match=match):
        ParallelDims.resolve(world, **config)
    assert issubclass(DimsError, fmesh.MeshError)


def test_wrong_types_raise_type_error() -> None:
    with pytest.raises(TypeError, match=r"tp must be an int, got '2'"):
        ParallelDims.resolve(8, tp="2")  # type: ignore[arg-type]  # the error under test


def test_dp_shard_minus_one_takes_the_rest() -> None:
    d = ParallelDims.resolve(2**17, pp=8, dp_replicate=4, cp=2, tp=8, ep=16)
    assert d.dp_shard == 2**17 // (8 * 4 * 2 * 8)
    assert (d.batch, d.loss, d.fsdp, d.efsdp) == (
        4 * 256,
        4 * 256 * 2,
        256 * 2,
        256 * 2 * 8 // 16,
    )


@pytest.mark.parametrize(
    ("argv", "launched", "needle"),
    [
        (["--plan", "--world", "8", "--tp", "3"], None, "does not divide the world size 8"),
        (["--plan", "--world", "8", "--rank", "8"], None, "--rank 8 is not in the world of 8"),
        (["--world", "8", "--rank", "3"], None, "--rank is for --plan"),
        (["--tp", "2"], None, "no --world and no $WORLD_SIZE"),
        (["--world", "16"], "8", "--world 16 but torchrun started 8 processes"),
    ],
)
def test_main_reports_bad_flags(
    argv: list[str],
    launched: str | None,
    needle: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if launched is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", launched)
    assert parallel_dims.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("parallel_dims.py: error: ") and needle in err, err


def test_views_equal_torchtitans_direct_unflattens() -> None:
    # build_meshes derives every view from `dense`; torchtitan unflattens the world
    # once per view. Same values (fmesh meshes compare by layout).
    for world, config in [(FAKE_WORLD, c) for c in FAKE_CONFIGS.values()] + [
        (BIG_WORLD, c) for c in BIG_CONFIGS.values()
    ]:
        d = ParallelDims.resolve(world, **config)
        meshes = build_meshes(d)
        root = fmesh.make_mesh({"world": world})
        for name, sizes in d.views().items():
            if name in ("world", "loss"):
                continue
            assert meshes[name] == fmesh.unflatten(root, "world", sizes), name
        assert math.prod(meshes["loss"].axis_sizes) == d.loss


def test_example_doctests() -> None:
    result = doctest.testmod(parallel_dims)
    assert result.attempted >= 4
    assert result.failed == 0
