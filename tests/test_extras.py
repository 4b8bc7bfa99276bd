"""The ``test`` extra stays light: client libraries that only client tests run are in
an extra of their own, ``clients``, and those tests skip without it, naming it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _clients import INSTALL, require

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = ("accelerate", "transformers", "lightning", "pytorch_lightning", "lightning_fabric")
# A client module imported by a test: a statement, importlib or pytest.importorskip.
IMPORT = re.compile(
    rf"^\s*(?:import|from)\s+({'|'.join(CLIENTS)})\b"
    rf"|(?:import_module|importorskip)\(\s*[\"']({'|'.join(CLIENTS)})\b",
    re.M,
)


def _extra(name: str) -> list[str]:
    """The distribution names an extra of pyproject.toml lists."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(rf"^{name} = \[\n(.*?)^\]", text, re.M | re.S)
    assert block is not None, f"no extra {name!r} in pyproject.toml"
    return re.findall(r'^\s*"([\w.-]+)', block.group(1), re.M)


def test_the_test_extra_holds_no_client_library() -> None:
    clients = _extra("clients")
    assert {"accelerate", "transformers", "lightning"} <= set(clients)
    assert sorted(set(_extra("test")) & set(clients)) == []


def test_every_test_that_imports_a_client_requires_it() -> None:
    """Through ``_clients.require``, which skips saying which extra to install."""
    importing = {
        path.name: sorted({a or b for a, b in IMPORT.findall(path.read_text())})
        for path in sorted((ROOT / "tests").glob("test_*.py"))
        if path.name != "test_extras.py"
    }
    importing = {name: found for name, found in importing.items() if found}
    assert "test_route_clients.py" in importing  # accelerate's ParallelismConfig
    missing = [
        name
        for name in importing
        if "from _clients import require" not in (ROOT / "tests" / name).read_text()
    ]
    assert missing == []


def test_import_pattern() -> None:
    text = 'import lightning as L\nx = importlib.import_module("accelerate").X\nimport torch\n'
    assert [a or b for a, b in IMPORT.findall(text)] == ["lightning", "accelerate"]


def test_require_skips_naming_the_extra() -> None:
    require("fmesh")  # installed: no skip
    with pytest.raises(pytest.skip.Exception) as skipped:
        require("fmesh", "fmesh_no_such_client")
    assert str(skipped.value) == (
        "fmesh_no_such_client is in fmesh's clients extra, not installed here: "
        'pip install -e ".[test,docs,clients]"'
    )
    assert INSTALL in (ROOT / "README.md").read_text()


def test_every_extra_installed_anywhere_exists() -> None:
    """pip only warns about an extra that does not exist, and installs the rest."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text[text.index("[project.optional-dependencies]") :]
    section = section[: section.index("\n[", 1)]
    defined = set(re.findall(r"^([\w-]+) = \[", section, re.M))
    assert {"test", "docs", "clients"} <= defined
    sources = [
        ROOT / "README.md",
        ROOT / ".ci" / "run",
        *sorted((ROOT / "docs").rglob("*.md")),
    ]
    asked = {
        (path.relative_to(ROOT).as_posix(), extra)
        for path in sources
        for group in re.findall(r"-e \"?\.\[([\w,-]+)\]", path.read_text())
        for extra in group.split(",")
    }
    assert ("README.md", "clients") in asked
    assert sorted((page, extra) for page, extra in asked if extra not in defined) == []
