"""Every code block of README.md and the docs pages runs, and the quick start matches CI.

The conventions, in every page alike:

* a ``python`` block runs as a script; one whose first line is
  ``# torchrun --nproc-per-node N`` runs under torchrun with N processes, and
  ``# torchrun --nproc-per-node N -m fmesh.route`` through ``-m fmesh.route`` too;
* every other ``python`` block passes ``mypy --strict`` as a file of its own (the
  project's configuration), as a reader's copy of it would;
* a ``python`` block that starts ``# excerpt of PATH`` quotes a file and is neither run
  nor type-checked on its own: tests/test_example_elastic.py checks that it is verbatim
  in that file, and PATH must be one ``mypy --strict`` checks with the package
  (tests/test_static.py);
* a ``text`` block right after the line ``<!-- the output of the python block above -->``
  is what the last ``python`` block before it prints: its stdout must be exactly that;
* ``bash`` blocks are not run: the quick start is checked against .ci/run and the
  example test, every copy of it must be the README's, and every script a bash block
  names must exist.
"""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = (README, *sorted((ROOT / "docs").rglob("*.md")))


def _blocks(path: Path, lang: str) -> list[str]:
    """The bodies of the fenced blocks of one language in a page, in order."""
    found = re.findall(r"```(\w+)\n(.*?)```", path.read_text(), re.S)
    return [body for block_lang, body in found if block_lang == lang]


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _python_blocks(path: Path) -> list[tuple[int, str]]:
    """(line of the page where its body starts, body) of each ``python`` block."""
    text = path.read_text()
    return [
        (text.count("\n", 0, match.start(2)) + 1, match.group(2))
        for match in re.finditer(r"```(\w+)\n(.*?)```", text, re.S)
        if match.group(1) == "python"
    ]


PYTHON = [
    (_name(path), index, body)
    for path in PAGES
    for index, body in enumerate(_blocks(path, "python"))
    if not body.startswith("# excerpt of ")
]
OUTPUT_MARK = "<!-- the output of the python block above -->"


def _outputs(path: Path) -> dict[int, str]:
    """The printed output a page shows, by the index of the python block printing it."""
    text = path.read_text()
    found: dict[int, str] = {}
    index = -1
    for match in re.finditer(r"```(\w+)\n(.*?)```", text, re.S):
        lang, body = match.groups()
        if lang == "python":
            index += 1
        elif lang == "text" and text[: match.start()].rstrip().endswith(OUTPUT_MARK):
            found[index] = body
    return found


OUTPUTS = {
    (_name(path), index): body for path in PAGES for index, body in _outputs(path).items()
}
TYPED = [
    (_name(path), line, body)
    for path in PAGES
    for line, body in _python_blocks(path)
    if not body.startswith("# excerpt of ")
]
EXCERPTS = [
    (_name(path), body.splitlines()[0].removeprefix("# excerpt of ").strip())
    for path in PAGES
    for _, body in _python_blocks(path)
    if body.startswith("# excerpt of ")
]
BASH = _blocks(README, "bash")
ALL_BASH = [(_name(path), body) for path in PAGES for body in _blocks(path, "bash")]
QUICK_START = "pip install torch==2.13.0 && "


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_pages_have_code_blocks() -> None:
    assert len(PAGES) > 10
    assert len(PYTHON) >= 8
    assert len([b for b in _blocks(README, "python") if not b.startswith("#")]) >= 1
    assert len(BASH) >= 2


@pytest.mark.parametrize(
    ("page", "index", "body"), PYTHON, ids=[f"{page}:{index}" for page, index, _ in PYTHON]
)
def test_python_block_runs(page: str, index: int, body: str, tmp_path: Path) -> None:
    script = tmp_path / f"block{index}.py"
    script.write_text(body)
    first = body.splitlines()[0]
    match = re.match(r"# torchrun --nproc-per-node (\d+)( -m fmesh\.route)?$", first)
    if match:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            match.group(1),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_free_port()),
            *(["-m", "fmesh.route"] if match.group(2) else []),
            str(script),
        ]
    else:
        cmd = [sys.executable, str(script)]
    result = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, page + result.stdout[-3000:] + result.stderr[-3000:]
    shown = OUTPUTS.get((page, index))
    if shown is not None:
        assert result.stdout == shown, f"{page} shows output this block does not print"


def test_every_python_block_passes_mypy_strict(tmp_path: Path) -> None:
    """A reader who copies a block into a file of their own and runs ``mypy --strict``
    on it sees no error (e.g. ``coordinate()`` may return ``None``: index it only after
    a check). One mypy run for every block, each a module of its own, with a fresh
    cache: a cached module of the same name must not answer for a block."""
    pages = {_name(path) for path in PAGES}
    assert {"README.md", "docs/getting-started.md"} <= {page for page, _, _ in TYPED}
    assert {page for page, _, _ in TYPED} <= pages
    where: dict[str, tuple[str, int]] = {}
    for number, (page, line, body) in enumerate(TYPED):
        script = tmp_path / f"block_{number}.py"
        script.write_text(body)
        where[script.as_posix()] = (page, line)
    result = subprocess.run(
        [
            sys.executable, "-m", "mypy", "--strict", "--config-file", "pyproject.toml",
            "--cache-dir", str(tmp_path / "mypy-cache"), "--show-error-codes",
            "--no-pretty", "--no-error-summary", *where,
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    # 0: clean, 1: type errors; anything else means mypy itself failed.
    assert result.returncode in (0, 1), result.stdout + result.stderr
    errors = []
    for message in result.stdout.splitlines():
        found = re.match(r"(.+?\.py):(\d+): (.*)$", message)
        assert found, f"unexpected mypy output: {message}"
        page, line = where[Path(found.group(1)).as_posix()]
        errors.append(f"{page}:{line + int(found.group(2)) - 1}: {found.group(3)}")
    assert errors == []
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_excerpt_quotes_a_file_mypy_checks() -> None:
    """An excerpt is not type-checked on its own: the file it quotes is, with the
    package (the ``files`` of ``[tool.mypy]``, which tests/test_static.py runs)."""
    config = (ROOT / "pyproject.toml").read_text()
    files = re.search(r"^files = \[(.*?)\]$", config, re.M)
    assert files is not None
    checked = re.findall(r'"([^"]+)"', files.group(1))
    assert "examples" in checked
    outside = [
        (page, path)
        for page, path in EXCERPTS
        if not (ROOT / path).is_file() or path.split("/")[0] not in checked
    ]
    assert EXCERPTS  # docs/elastic.md quotes examples/elastic.py
    assert outside == []


def test_every_output_shown_belongs_to_a_block() -> None:
    marks = sum(path.read_text().count(OUTPUT_MARK) for path in PAGES)
    assert marks >= 1  # docs/device-mesh.md's one-import example
    assert len(OUTPUTS) == marks
    run = {(page, index) for page, index, _ in PYTHON}
    assert sorted(set(OUTPUTS) - run) == []


def _words(command: str) -> list[str]:
    """A command line's words as the shell passes them; ``python -m pip`` is ``pip``
    (none for a line that is not a command: .ci/run's Python between heredoc marks)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return []
    return words[2:] if words[:3] == ["python", "-m", "pip"] else words


def test_quick_start_test_command_is_what_ci_runs() -> None:
    """The README's three commands are CI's first three, in order: torch, fmesh with
    every extra (a newcomer's suite skips nothing that CI runs), then the suite."""
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = next(b for b in BASH if "pytest" in b and "torch==2.13.0" in b).strip()
    parts = [p.strip() for p in test_cmd.split("&&")]
    assert parts[:2] == ["pip install torch==2.13.0", 'pip install -e ".[test,docs,clients]"']
    assert len(parts) == 3
    ci_lines = [ln.strip() for ln in ci.splitlines() if ln.strip() and not ln.startswith("#")]
    installs = [_words(ln) for ln in ci_lines if _words(ln)[:2] == ["pip", "install"]]
    installs = [words for words in installs if "--upgrade" not in words]
    assert installs[:2] == [_words(parts[0]), _words(parts[1])]
    # The very command the README gives is what CI runs right after installing (then
    # the same suite again on the oldest and newest supported torch).
    first_test = next(ln for ln in ci_lines if "pytest" in ln)
    assert first_test == parts[2]
    assert ci_lines.index(first_test) > max(
        i for i, ln in enumerate(ci_lines) if _words(ln) in installs[:2]
    )


def test_ci_installs_the_client_extra_wherever_it_runs_the_suite() -> None:
    """The venvs for the oldest and newest torch run the client tests too."""
    ci = (ROOT / ".ci" / "run").read_text()
    extras = re.findall(r'-e "\.\[([\w,]+)\]"', ci)
    assert len(extras) == 2  # torch 2.13's environment, then each other torch's
    assert [e for e in extras if not {"test", "clients"} <= set(e.split(","))] == []


def test_quick_start_demo_command_is_what_the_example_test_runs() -> None:
    demo = next(b for b in BASH if "examples/train_fsdp_tp.py" in b).strip()
    parts = [p.strip() for p in demo.split("&&")]
    assert parts[0] == "pip install torch==2.13.0"
    assert parts[-1] == ("torchrun --standalone --nproc-per-node 4 examples/train_fsdp_tp.py")
    example_test = (ROOT / "tests" / "test_example.py").read_text()
    assert "--standalone" in example_test
    assert "examples/train_fsdp_tp.py" in example_test


def test_every_copy_of_the_quick_start_is_the_readmes() -> None:
    readme = {b.strip() for b in BASH if b.startswith(QUICK_START)}
    assert len(readme) == 2
    copies = [(page, body.strip()) for page, body in ALL_BASH if "torch==2.13.0" in body]
    assert [(page, body) for page, body in copies if body not in readme] == []


def test_scripts_named_in_bash_blocks_exist() -> None:
    named = {
        (page, path)
        for page, body in ALL_BASH
        for path in re.findall(r"(?:examples|tests|bench)/[\w/]+\.py", body)
    }
    assert named  # the quick start names the demo
    assert [(page, path) for page, path in sorted(named) if not (ROOT / path).is_file()] == []


# A path of this repository as pages name it: a file with its extension, a private
# package of fmesh, or a script of .ci/ (store keys such as `fmesh/a/` are not paths).
REPO_PATH = re.compile(
    r"(?<![\w./-])("
    r"(?:fmesh|tests|examples|bench|typestubs|docs)/(?:[\w.-]+/)*[\w-]+"
    r"\.(?:pyi|py|md|toml|yml|txt|json|js|css)(?!\w)"
    r"|fmesh/_\w+|\.ci/[\w-]+)"
)
# Paths of other repositories that a page names, each with whose it is.
OTHER_REPOSITORIES = {"tests/unit_tests/test_parallel_dims.py": "torchtitan's"}


def test_every_repository_path_a_page_names_exists() -> None:
    """A page that names `fmesh/_c10d/` after it moved sends a reader nowhere."""
    named = {
        (_name(path), match.group(1))
        for path in PAGES
        for match in REPO_PATH.finditer(path.read_text())
    }
    assert len(named) > 50
    text = "in `fmesh/_c10d/`; keys `fmesh/a/`; bench/results.json, `.ci/run`, fmesh/py.typed"
    found = [match.group(1) for match in REPO_PATH.finditer(text)]
    assert found == ["fmesh/_c10d", "bench/results.json", ".ci/run"]
    dead = [
        (page, path)
        for page, path in sorted(named)
        if path not in OTHER_REPOSITORIES and not (ROOT / path).exists()
    ]
    assert dead == []


def _table(text: str, header: str) -> str:
    """The markdown table that starts with this header row."""
    start = text.index(header)
    return text[start : text.index("\n\n", start)]


def test_the_docs_home_page_has_the_readmes_rows() -> None:
    """docs/index.md, the site's front page, is the README's opening: the same "Why"
    table, and a row for every page the README's documentation list links."""
    readme, index = README.read_text(), (ROOT / "docs" / "index.md").read_text()
    header = "| torch 2.13 `DeviceMesh` | fmesh |"
    assert _table(index, header) == _table(readme, header)
    listed = readme[readme.index("## Documentation\n") :]
    listed = listed[: listed.index("\n## ")]
    linked = {
        page.removeprefix("docs/") for page in re.findall(r"\]\((docs/[\w/.-]+)\)", listed)
    }
    rows = set(re.findall(r"^\| \[[^]]+\]\(([\w/.-]+)\)", index, re.M))
    assert len(linked) > 10
    assert sorted(linked - rows) == []


def test_the_module_tree_names_every_package_and_only_files_that_exist() -> None:
    (tree,) = [body for body in _blocks(README, "text") if body.startswith("fmesh/\n")]
    packages = {p.name for p in (ROOT / "fmesh").iterdir() if (p / "__init__.py").is_file()}
    rows = dict(re.findall(r"^[├└]── (_\w+)/ +(.*)$", tree, re.M))
    assert set(rows) == packages
    missing = [
        f"{package}/{name}"
        for package, text in rows.items()
        for name in re.findall(r"\b\w+\.py\b", text)
        if not (ROOT / "fmesh" / package / name).is_file()
    ]
    assert missing == []
