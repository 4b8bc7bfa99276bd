"""``fmesh describe`` with the elastic flags: ``--lost R,... --shrink AXIS`` and
``--replace OLD=NEW,...``; the output is checked against ``fmesh.shrink``/``replace``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _dist import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import lost_sets, spare_maps
from test_cli import assert_shows, grid, ok, parse_ranks, run_main, table

import fmesh
from fmesh._cli.args import Edits
from fmesh._cli.main import describe, describe_json


def _check_grid(out: str, mesh: fmesh.Mesh) -> None:
    """The rank grid shows the mesh's one instance, cell for cell."""
    inst = fmesh.instance(mesh, fmesh.rank_at(mesh, (0,) * mesh.ndim))
    if mesh.ndim == 1:  # one row, no row label (test_cli.grid expects one)
        lines = out.splitlines()
        start = next(i for i, ln in enumerate(lines) if ln.startswith("ranks by coordinate"))
        cells = lines[start + 2].replace("[", " ").replace("]", " ").split()
        assert [int(c) for c in cells] == inst.tolist()
        return
    blocks = list(grid(out).values())
    lead = inst.reshape((-1, *inst.shape[-2:]))
    assert len(blocks) == lead.shape[0]
    for block, expected in zip(blocks, lead, strict=True):
        assert block == expected.tolist()


def _check_rows(out: str, shown: list[tuple[str, fmesh.Mesh]], rank: int | None) -> None:
    """Each axis row's groups (this rank's, or the examples) are fmesh's."""
    rows = table(out)
    assert list(rows) == [name for name, _ in shown]
    for name, m in shown:
        row = rows[name]
        pos = m.axis_names.index(name)
        assert int(row["size"]) == m.axis_sizes[pos]
        assert row["layout"] == str(m.axes[pos])
        if rank is not None:
            assert parse_ranks(row[f"group of rank {rank}"]) == (
                list(fmesh.group(m, name, rank)),
                None,
            )
            coord = fmesh.coordinate(m, rank)
            assert coord is not None and int(row["coord"]) == coord[pos]
            continue
        for text in re.findall(r"\[[^\]]*\]", row["example groups"]):
            first, _ = parse_ranks(text)
            assert_shows(text, fmesh.group(m, name, first[0]))


def test_describe_shrink_replace_flatten_matches_fmesh() -> None:
    out = ok(
        "describe",
        "pp=2,dp=4,tp=2",
        "--lost",
        "3,12",
        "--shrink",
        "dp",
        "--replace",
        "9=16",
        "--flatten",
        "dp,tp",
        "--rank",
        "16",
    )
    root = fmesh.make_mesh({"pp": 2, "dp": 4, "tp": 2})
    mesh = fmesh.replace(fmesh.shrink(root, {3, 12}, axis="dp"), {9: 16})
    flat = fmesh.flatten(mesh, ("dp", "tp"))
    lines = out.splitlines()
    assert lines[0] == f"{mesh!r}: 8 ranks on 3 hosts of 8 ranks (3 partly filled)"
    assert lines[1] == (
        "shrunk along dp (4 -> 2): dropped the slices at dp = 1, 2, holding lost ranks 3, 12"
    )
    assert lines[2] == "replaced: 9 -> 16"
    assert lines[3] == ""
    _check_grid(out, mesh)
    assert "[16]" in out
    assert "rank 16: coordinate (pp=1, dp=0, tp=1) on host 2 (ranks 16..23)" in out
    _check_rows(out, [(n, mesh) for n in mesh.axis_names] + [("dp_tp", flat)], 16)


def test_describe_example_groups_of_a_shrunk_mesh() -> None:
    out = describe("dp=4,cp=3,tp=2", edits=Edits(lost="0,11", shrink="cp"))
    mesh = fmesh.shrink(fmesh.make_mesh({"dp": 4, "cp": 3, "tp": 2}), {0, 11}, axis="cp")
    _check_grid(out, mesh)
    _check_rows(out, [(n, mesh) for n in mesh.axis_names], None)
    assert "dropped the slices at cp = 0, 2, holding lost ranks 0, 11" in out


def test_one_lost_rank_reads_singular() -> None:
    out = describe("dp=4,tp=2", edits=Edits(lost="3", shrink="dp"))
    assert "shrunk along dp (4 -> 3): dropped the slice at dp = 1, holding lost rank 3" in out


def test_describe_json_after_edits(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_main(
        capsys,
        "describe",
        "world=16",
        "--unflatten",
        "world=dp:4,tp:4",
        "--lost",
        "5",
        "--shrink",
        "dp",
        "--replace",
        "0=16,1=17",
        "--json",
    )
    assert status == 0
    root = fmesh.unflatten(fmesh.make_mesh({"world": 16}), "world", {"dp": 4, "tp": 4})
    expected = fmesh.replace(fmesh.shrink(root, {5}, axis="dp"), {0: 16, 1: 17})
    assert fmesh.Mesh.from_json(out) == expected
    assert (
        describe_json("dp=2", edits=Edits(replace="1=1"))
        == fmesh.make_mesh({"dp": 2}).to_json() + "\n"
    )


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_describe_any_shrink_and_replace(data: st.DataObject) -> None:
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3), label="sizes")
    names = ("dp", "cp", "tp")[: len(sizes)]
    root = fmesh.make_mesh(dict(zip(names, sizes, strict=True)))
    axis = data.draw(st.sampled_from(names), label="axis")
    lost = data.draw(lost_sets(tuple(range(root.size)), min_lost=1), label="lost")
    spec = ",".join(f"{n}={s}" for n, s in zip(names, sizes, strict=True))
    edits = Edits(lost=",".join(map(str, sorted(lost))), shrink=axis)
    try:
        shrunk = fmesh.shrink(root, lost, axis=axis)
    except fmesh.MeshError as err:
        with pytest.raises(fmesh.MeshError, match="nothing would remain"):
            describe(spec, edits=edits)
        assert "nothing would remain" in str(err)
        return
    spares = data.draw(spare_maps(tuple(int(r) for r in fmesh.instances(shrunk).flat)))
    mesh = fmesh.replace(shrunk, spares)
    if spares:
        edits = Edits(
            edits.lost, edits.shrink, ",".join(f"{o}={n}" for o, n in spares.items())
        )
    rank = data.draw(st.sampled_from([int(r) for r in fmesh.instances(mesh).flat]))
    out = describe(spec, edits=edits, rank=rank, local_world_size=4)
    _check_grid(out, mesh)
    _check_rows(out, [(n, mesh) for n in mesh.axis_names], rank)
    assert out.splitlines()[0].startswith(f"{mesh!r}: {mesh.size} ranks on ")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--lost", "3"), "--lost and --shrink go together"),
        (("--shrink", "dp"), "e.g. --lost 3,5 --shrink dp"),
        (("--lost", "3,,5", "--shrink", "dp"), '--lost "3,,5" is not a list of ranks'),
        (
            ("--lost", "x", "--shrink", "dp"),
            "--lost entry is 'x', which is not a whole number",
        ),
        (("--lost", "3", "--shrink", "pp"), "valid axis names are ['dp', 'tp']"),
        (("--lost", "9,3", "--shrink", "dp"), "lost rank 9 is not in Mesh(dp=4, tp=2)"),
        (("--lost", "-1", "--shrink", "dp"), "got lost rank -1; global ranks are >= 0"),
        (("--lost", "0,2,4,6", "--shrink", "dp"), "so nothing would remain"),
        (("--replace", "3:8"), '--replace "3:8" is not old=new'),
        (("--replace", "3=8,3=9"), "replaces rank 3 twice"),
        (("--replace", "3=8,5=8"), "spare rank 8 is given to ranks 3 and 5"),
        (("--replace", "3=4"), "spare rank 4 (for rank 3) is already in"),
        (("--replace", "9=10"), "rank 9 is not in Mesh(dp=4, tp=2)"),
        (("--lost", "3", "--shrink", "dp", "--rank", "3"), "--rank 3 is not in the mesh"),
        (
            ("--replace", "3=8", "--rank", "3"),
            "expected one of its 8 ranks [0, 1, 2, 4, 5, 6, 7, 8]",
        ),
    ],
)
def test_bad_elastic_flags_give_one_error_line(args: tuple[str, ...], needle: str) -> None:
    result = run_cli("describe", "dp=4,tp=2", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("fmesh: error: ")
    assert needle in lines[0]


def test_plan_takes_no_elastic_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run_main(capsys, "plan", "--world", "8", "dp=4,tp=2", "--lost", "3")
    assert info.value.code == 2
    assert "unrecognized argument --lost" in capsys.readouterr().err


def test_help_lists_the_elastic_flags() -> None:
    text = ok("describe", "--help")
    for flag in ("--lost R,...", "--shrink AXIS", "--replace OLD=NEW,..."):
        assert flag in text


# -- the documented example ------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
DOC_ARGS = (
    "describe",
    "dp=4,tp=2",
    "--lost",
    "3",
    "--shrink",
    "dp",
    "--rank",
    "5",
    "--local-world-size",
    "2",
)
DOC_CMD = (
    'python -m fmesh describe "dp=4,tp=2" --lost 3 --shrink dp --rank 5 --local-world-size 2'
)


def test_documented_elastic_example_is_real() -> None:
    """The elastic page shows the real output (its python blocks run in
    tests/test_readme.py)."""
    docs = [ROOT / "docs" / "elastic.md"]
    shown = [p for p in docs if DOC_CMD in p.read_text()]
    assert shown, f"neither {[str(p) for p in docs]} shows `{DOC_CMD}`"
    live = ok(*DOC_ARGS).splitlines()
    for path in shown:
        text = path.read_text()
        body = text[text.index(DOC_CMD) :].split("```text\n", 1)[1].split("```", 1)[0]
        assert body.splitlines() == live, path
