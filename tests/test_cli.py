"""The ``fmesh`` command line, run as a subprocess; its output is checked against fmesh."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from _dist import run_cli
from hypothesis import given
from hypothesis import strategies as st
from strategies import tiling_layouts

import fmesh
import fmesh._cli.main
from fmesh._cli.describe import a_or_an
from fmesh._cli.main import describe, main
from fmesh._core.hosts import crossing_groups

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_ARGS = ("describe", "pp=2,dp=2,tp=4", "--rank", "5", "--local-world-size", "4")
EXAMPLE_CMD = 'python -m fmesh describe "pp=2,dp=2,tp=4" --rank 5 --local-world-size 4'


def ok(*args: str) -> str:
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    return result.stdout


# -- parsing the output back -----------------------------------------------------------


def parse_ranks(text: str) -> tuple[list[int], int | None]:
    """``[0, 1, 2]`` -> ([0, 1, 2], None); ``[0, 8, ..., 120]`` -> ([0, 8], 120)."""
    assert text.startswith("[") and text.endswith("]"), text
    items = [t.strip() for t in text[1:-1].split(",")]
    if "..." in items:
        cut = items.index("...")
        return [int(t) for t in items[:cut]], int(items[-1])
    return [int(t) for t in items], None


def assert_shows(shown: str, expected: Sequence[int]) -> None:
    """A printed group equals ``expected``, allowing the elided form."""
    head, last = parse_ranks(shown)
    if last is None:
        assert head == list(expected)
    else:
        assert len(head) < len(expected)
        assert head == list(expected[: len(head)])
        assert last == expected[-1]


def table(out: str) -> dict[str, dict[str, str]]:
    """The axis table: axis name -> column -> cell."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("axis "))
    header = re.split(r"\s{2,}", lines[start].strip())
    rows: dict[str, dict[str, str]] = {}
    for line in lines[start + 1 :]:
        if not line.strip() or line.startswith("flattened:"):
            break
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == len(header), line
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def placement(mesh: fmesh.Mesh, axis: str, host: int) -> str:
    """Brute force: how the axis's groups sit on hosts of ``host`` ranks."""
    groups = {fmesh.group(mesh, axis, r) for r in range(mesh.size)}
    crossing = sum(1 for g in groups if len({r // host for r in g}) > 1)
    if crossing == 0:
        return "intra-host"
    if crossing == len(groups):
        return "cross-host"
    return f"mixed: {crossing} of {len(groups)} groups cross hosts"


def grid(out: str) -> dict[str, list[list[int]]]:
    """The rank grid: block header -> rows of ranks (brackets stripped)."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("ranks by coordinate"))
    blocks: dict[str, list[list[int]]] = {}
    current = ""
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        if not line.startswith(" "):
            current = line
            blocks[current] = []
        elif "\\" not in line:
            cells = line.replace("[", " ").replace("]", " ").split()
            blocks[current].append([int(c) for c in cells[1:]])
    return blocks


# -- describe --------------------------------------------------------------------------


def test_import_does_not_import_torch() -> None:
    code = "import sys, fmesh._cli.main, fmesh.__main__; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_describe_3d_with_rank_matches_fmesh() -> None:
    spec, rank, host = "pp=2,dp=3,tp=4", 17, 4
    out = ok(
        "describe",
        spec,
        "--rank",
        str(rank),
        "--flatten",
        "tp,pp",
        "--local-world-size",
        str(host),
    )
    mesh = fmesh.make_mesh({"pp": 2, "dp": 3, "tp": 4})
    flat = fmesh.flatten(mesh, ("tp", "pp"))
    coord = fmesh.coordinate(mesh, rank)
    assert coord is not None
    shown = ", ".join(f"{n}={c}" for n, c in zip(mesh.axis_names, coord, strict=True))
    assert f"rank {rank}: coordinate ({shown}) on host {rank // host}" in out

    blocks = grid(out)
    inst = fmesh.instance(mesh, 0)
    assert list(blocks) == ["pp=0", "pp=1"]
    for pp, block in enumerate(blocks.values()):
        assert block == inst[pp].tolist()
    assert out.count(f"[{rank}]") == 1

    rows = table(out)
    assert list(rows) == ["pp", "dp", "tp", "tp_pp"]
    for name, m in [("pp", mesh), ("dp", mesh), ("tp", mesh), ("tp_pp", flat)]:
        row = rows[name]
        pos = m.axis_names.index(name)
        expected = fmesh.group(m, name, rank)
        assert parse_ranks(row[f"group of rank {rank}"]) == (list(expected), None)
        mine = fmesh.coordinate(m, rank)
        assert mine is not None
        assert int(row["coord"]) == mine[pos] == expected.index(rank)
        assert int(row["size"]) == m.axis_sizes[pos]
        assert int(row["groups"]) == len({fmesh.group(m, name, r) for r in range(m.size)})
        assert row["layout"] == str(m.axes[pos])
        assert row["hosts"] == placement(m, name, host)
    assert "flattened: tp_pp = (tp, pp)" in out


def test_describe_without_rank_shows_example_groups() -> None:
    spec, host = "pp=2,dp=3,cp=2,tp=4", 8
    out = ok("describe", spec, "--flatten", "dpcp=dp,cp")
    mesh = fmesh.make_mesh({"pp": 2, "dp": 3, "cp": 2, "tp": 4})
    flat = fmesh.flatten(mesh, ("dp", "cp"), "dpcp")
    assert len(grid(out)) == 2 * 3  # one block per (pp, dp)
    rows = table(out)
    for name, m in [(n, mesh) for n in mesh.axis_names] + [("dpcp", flat)]:
        row = rows[name]
        groups = {fmesh.group(m, name, r) for r in range(m.size)}
        assert int(row["groups"]) == len(groups)
        assert row["hosts"] == placement(m, name, host)
        examples = re.findall(r"\[[^\]]*\]", row["example groups"])
        assert 1 <= len(examples) <= 3
        for text in examples:
            first, _ = parse_ranks(text)
            assert_shows(text, fmesh.group(m, name, first[0]))


def test_describe_unflatten_matches_fmesh() -> None:
    out = describe(
        "world=24", unflattens=["world=dp:2,cp:3,tp:4"], rank=13, local_world_size=4
    )
    mesh = fmesh.unflatten(
        fmesh.make_mesh({"world": 24}), "world", {"dp": 2, "cp": 3, "tp": 4}
    )
    rows = table(out)
    for name in mesh.axis_names:
        assert_shows(rows[name]["group of rank 13"], fmesh.group(mesh, name, 13))


def test_describe_large_mesh_is_elided() -> None:
    rank = 70001
    out = ok("describe", "pp=16,dp=256,cp=4,tp=8", "--rank", str(rank))
    assert len(out.splitlines()) < 60
    assert max(len(line) for line in out.splitlines()) < 120
    assert f"[{rank}]" in out  # the rank's block and row are kept
    mesh = fmesh.make_mesh({"pp": 16, "dp": 256, "cp": 4, "tp": 8})
    for name, row in table(out).items():
        assert_shows(row[f"group of rank {rank}"], fmesh.group(mesh, name, rank))


def test_describe_mixed_hosts() -> None:
    out = describe("dp=3,tp=3", local_world_size=4)
    mesh = fmesh.make_mesh({"dp": 3, "tp": 3})
    rows = table(out)
    assert rows["tp"]["hosts"] == placement(mesh, "tp", 4)
    assert rows["tp"]["hosts"].startswith("mixed")


@given(tiling_layouts(), st.integers(1, 40))
def test_crossing_groups_matches_brute_force(
    drawn: tuple[fmesh.Layout, int], host: int
) -> None:
    layout, size = drawn
    values = layout.values()
    bases = layout.complement(size).values()
    expected = sum(1 for b in bases if len({(b + v) // host for v in values}) > 1)
    assert crossing_groups(layout, size, host) == expected


# -- plan ------------------------------------------------------------------------------


def check_plan(out: str, mesh: fmesh.Mesh, flats: list[fmesh.Mesh], rank: int) -> None:
    """Every row of a member rank's plan agrees with fmesh's pure queries."""
    rows = table(out)
    axes = [(n, mesh) for n in mesh.axis_names] + [
        (next(n for n in f.axis_names if n not in mesh.axis_names), f) for f in flats
    ]
    assert list(rows) == [n for n, _ in axes]
    groups = []
    for name, m in axes:
        row = rows[name]
        expected = fmesh.group(m, name, rank)
        groups.append(expected)
        assert_shows(row[f"group of rank {rank}"], expected)
        coord = fmesh.coordinate(m, rank)
        assert coord is not None
        assert int(row["group rank"]) == coord[m.axis_names.index(name)]
        assert int(row["size"]) == len(expected)
    created = len(set(groups))
    requests = mesh.ndim + sum(f.ndim for f in flats)
    assert f"process groups: {created} created, {requests - created} reused" in out
    match = re.search(r"realize: ([\d.]+) ms", out)
    assert match is not None
    assert float(match.group(1)) < 1000


def test_plan_131072_ranks() -> None:
    rank = 70001
    out = ok(
        "plan",
        "--world",
        "131072",
        "pp=16,dp=256,cp=4,tp=8",
        "--rank",
        str(rank),
        "--flatten",
        "dp,cp",
    )
    mesh = fmesh.make_mesh({"pp": 16, "dp": 256, "cp": 4, "tp": 8})
    check_plan(out, mesh, [fmesh.flatten(mesh, ("dp", "cp"))], rank)
    assert f"rank {rank} of a 131072-rank world" in out


def test_plan_2_to_the_20_ranks_with_a_reordered_flatten() -> None:
    rank = 2**20 - 3
    out = ok(
        "plan",
        "--world",
        "2**20",
        "pp=16,dp=1024,cp=8,tp=8",
        "--rank",
        str(rank),
        "--flatten",
        "tp,cp",
        "--backend",
        "gloo",
    )
    mesh = fmesh.make_mesh({"pp": 16, "dp": 1024, "cp": 8, "tp": 8})
    check_plan(out, mesh, [fmesh.flatten(mesh, ("tp", "cp"))], rank)
    assert "gloo communicator" in out


def test_plan_says_it_imports_torch_first() -> None:
    # Most of plan's wall time is importing torch: a phase line on stderr says so.
    result = run_cli("plan", "--world", "8", "dp=2,tp=4")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["fmesh plan: importing torch ..."]
    assert "process groups:" in result.stdout


def test_plan_non_member_of_a_sub_world() -> None:
    out = ok("plan", "--world", "24", "dp=2,tp=4", "--rank", "20")
    assert "ranks 8..23 of the world are not members" in out
    assert "rank 20 is not in the mesh" in out
    assert "process groups: 0 created" in out


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("describe", "dp=0"), "dp=0"),
        (("describe", "dp=x"), "'x'"),
        (("describe", "dp=2,dp=2"), "more than once"),
        (("describe", "dp"), "name=size"),
        (("describe", "dp=2,tp=4", "--flatten", "dp,xx"), "'xx'"),
        (("describe", "world=6", "--unflatten", "world=a:4,b:2"), "multiply"),
        (("plan", "--world", "4", "dp=2,tp=4"), "--world 4"),
        (("plan", "dp=2", "--rank", "2"), "--rank 2 is not in the world of 2 ranks"),
        (("describe", "dp=2", "--json", "--rank", "1"), "--json prints the mesh itself"),
        (("describe", "dp=2", "--keep-in-host", "tp,,cp"), "--keep-in-host"),
        (("plan", "--world", "2**31", "dp=2"), "at most 2147483647"),
    ],
)
def test_bad_arguments_give_one_error_line(args: tuple[str, ...], needle: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("fmesh: error: ")
    assert needle in lines[0]


# -- the documented example ------------------------------------------------------------


def readme_block(text: str) -> list[str] | None:
    """The output block for EXAMPLE_CMD in a README: None if the command is absent.

    The block is either the rest of the fenced block holding the command line, or the
    next fenced block after it; an empty list means the command has no block.
    """
    lines = text.splitlines()
    fenced = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if EXAMPLE_CMD not in line:
            continue
        if fenced:
            start = i + 1
        else:
            opening = [
                j for j in range(i + 1, len(lines)) if lines[j].lstrip().startswith("```")
            ]
            if not opening:
                return []
            start = opening[0] + 1
        end = next(
            (j for j in range(start, len(lines)) if lines[j].lstrip().startswith("```")),
            None,
        )
        if end is None:
            return []
        body = lines[start:end]
        if body and EXAMPLE_CMD in body[0]:
            body = body[1:]
        return body
    return None


def _normal(lines: Sequence[str]) -> list[str]:
    out = [ln.rstrip() for ln in lines]
    while out and not out[-1]:
        out.pop()
    return out


def test_readme_block_finder() -> None:
    out = ["line one", "line two"]
    inside = ["```console", f"$ {EXAMPLE_CMD}", *out, "```"]
    after = [f"Run `{EXAMPLE_CMD}`:", "", "```text", *out, "```"]
    repeated = [f"Run `{EXAMPLE_CMD}`:", "```", f"$ {EXAMPLE_CMD}", *out, "```"]
    for doc in (inside, after, repeated):
        assert readme_block("\n".join(["# t", *doc, "more"])) == out
    assert readme_block("# no example here") is None
    assert readme_block(f"Run `{EXAMPLE_CMD}`, then stop.") == []


def test_documented_example_is_the_real_output() -> None:
    live = ok(*EXAMPLE_ARGS)
    assert (ROOT / "docs" / "cli_example.txt").read_text() == live
    page = ROOT / "docs" / "cli.md"
    body = readme_block(page.read_text())
    assert body is not None, f"docs/cli.md no longer shows `{EXAMPLE_CMD}`"
    assert body, f"docs/cli.md shows `{EXAMPLE_CMD}` but no fenced output block after it"
    assert _normal(body) == _normal(live.splitlines())


# -- round 2: --version, --json, host warnings, articles, error handling --------------


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"fmesh {fmesh.__version__}\n"


def test_describe_json_is_the_mesh(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_main(capsys, "describe", "pp=2,dp=3,tp=4", "--json")
    assert status == 0
    assert out.count("\n") == 1
    assert fmesh.Mesh.from_json(out) == fmesh.make_mesh({"pp": 2, "dp": 3, "tp": 4})
    status, out, _ = run_main(
        capsys, "describe", "world=24", "--unflatten", "world=dp:2,cp:3,tp:4", "--json"
    )
    assert status == 0
    expected = fmesh.unflatten(
        fmesh.make_mesh({"world": 24}), "world", {"dp": 2, "cp": 3, "tp": 4}
    )
    assert fmesh.Mesh.from_json(out) == expected


def test_one_host_is_not_partly_filled() -> None:
    first = describe("dp=2,tp=2").splitlines()[0]
    assert first == "Mesh(dp=2, tp=2): 4 ranks on 1 host of 8 ranks"
    first = describe("dp=3,tp=3", local_world_size=4).splitlines()[0]
    assert (
        first == "Mesh(dp=3, tp=3): 9 ranks on 3 hosts of 4 ranks (the last one partly filled)"
    )
    first = describe("dp=2,tp=4", local_world_size=4).splitlines()[0]
    assert first == "Mesh(dp=2, tp=4): 8 ranks on 2 hosts of 4 ranks"


WARNING = re.compile(r"^warning: axis (\S+) crosses hosts of (\d+) ranks \((.*)\)$")


@pytest.mark.parametrize(
    ("spec", "flattens", "host", "keep"),
    [
        ("pp=2,tp=4,dp=2", ["dp,tp"], 4, ("tp", "cp", "ep")),
        ("dp=3,tp=3", [], 4, ("tp", "cp", "ep")),
        ("dp=2,cp=2,tp=4", ["dp_cp=dp,cp"], 4, ("tp", "cp", "ep")),
        ("dp=2,cp=2,tp=4", ["dp_cp=dp,cp"], 4, ("tp", "dp_cp")),
        ("pp=2,ep=4,tp=2", [], 8, ("tp", "cp", "ep")),
        ("dp=2,tp=8", [], 8, ("tp", "cp", "ep")),
        ("dp=2,tp=8", [], 4, ()),
    ],
)
def test_describe_warns_when_a_heavy_axis_crosses_hosts(
    spec: str, flattens: list[str], host: int, keep: tuple[str, ...]
) -> None:
    out = describe(spec, flattens=flattens, local_world_size=host, keep_in_host=keep)
    mesh = fmesh.make_mesh({k: int(v) for k, v in (p.split("=") for p in spec.split(","))})
    shown = [(n, mesh) for n in mesh.axis_names]
    for text in flattens:
        name, _, parts = text.rpartition("=")
        axes = tuple(parts.split(","))
        flat = fmesh.flatten(mesh, axes, name or None)
        shown.append((name or "_".join(axes), flat))
    expected = {
        name: placement(m, name, host)
        for name, m in shown
        if name in keep and placement(m, name, host) != "intra-host"
    }
    found = {}
    for line in out.splitlines():
        match = WARNING.match(line)
        if match:
            assert int(match.group(2)) == host
            found[match.group(1)] = match.group(3)
    assert found == expected
    assert ("fmesh.make_hybrid_mesh" in out) == bool(expected)
    if expected:
        assert f"bandwidth-heavy axes ({', '.join(keep)}) belong inside a host" in out


def test_describe_keep_in_host_flag(capsys: pytest.CaptureFixture[str]) -> None:
    _, default, _ = run_main(capsys, "describe", "tp=4,dp=2", "--local-world-size", "4")
    assert "warning: axis tp crosses hosts" in default
    _, none, _ = run_main(
        capsys, "describe", "tp=4,dp=2", "--local-world-size", "4", "--keep-in-host", ""
    )
    assert "warning" not in none
    _, dp, _ = run_main(
        capsys, "describe", "tp=4,dp=2", "--local-world-size", "4", "--keep-in-host", "dp"
    )
    assert "warning: axis dp crosses" not in dp and "warning: axis tp" not in dp


@pytest.mark.parametrize(
    ("number", "article"),
    [
        (1, "a"),
        (2, "a"),
        (8, "an"),
        (11, "an"),
        (12, "a"),
        (18, "an"),
        (80, "an"),
        (88, "an"),
        (100, "a"),
        (800, "an"),
        (1000, "a"),
        (8000, "an"),
        (11000, "an"),
        (18432, "an"),
        (65536, "a"),
        (80000, "an"),
        (131072, "a"),
        (800000, "an"),
        (1048576, "a"),
        (8388608, "an"),
    ],
)
def test_articles(number: int, article: str) -> None:
    assert a_or_an(number) == article


def test_plan_uses_the_right_article() -> None:
    out = ok("plan", "--world", "8", "dp=2,tp=4", "--rank", "3", "--backend", "gloo")
    assert "rank 3 of an 8-rank world" in out
    assert "1 host of 8 ranks" in out and "partly" not in out


def test_programming_errors_are_not_usage_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: object, **kwargs: object) -> str:
        raise TypeError("a bug, not a bad argument")

    monkeypatch.setattr(fmesh._cli.main, "describe", broken)
    with pytest.raises(TypeError, match="a bug"):
        main(["describe", "dp=2"])

    def refused(*args: object, **kwargs: object) -> str:
        raise fmesh.MeshError("bad mesh\n  on two lines")

    monkeypatch.setattr(fmesh._cli.main, "describe", refused)
    status, out, err = run_main(capsys, "describe", "dp=2")
    assert (status, out, err) == (2, "", "fmesh: error: bad mesh on two lines\n")


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (("plna", "dp=2"), " (did you mean 'plan'?)"),
        (("-v", "descrbe", "dp=2"), " (did you mean 'describe'?)"),
        (("bogus",), ""),
    ],
)
def test_an_unknown_command_names_a_close_one(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], hint: str
) -> None:
    with pytest.raises(SystemExit) as info:
        run_main(capsys, *args)
    assert info.value.code == 2
    command = next(a for a in args if not a.startswith("-"))
    assert capsys.readouterr().err == (
        f"fmesh: error: unknown command '{command}'{hint}; expected 'describe' or 'plan' "
        "(see 'fmesh --help')\n"
    )
