"""The API reference covers every public name, each once, under its public path.

The reference pages (``docs/reference/*.md``) render objects with mkdocstrings
directives (``::: fmesh.make_mesh``). Every name in ``fmesh.__all__`` and in
``fmesh.device_mesh.__all__`` must have one, by the path users import it from, never
by the private module it is defined in (those move). ``mkdocs build --strict`` in
.ci/run checks that each directive renders.
"""

from __future__ import annotations

import re
from pathlib import Path

import fmesh
import fmesh.device_mesh

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
DIRECTIVE = re.compile(r"^::: *(\S+) *$", re.M)


def _directives() -> list[tuple[str, str]]:
    """(page, object path) for every ``:::`` directive of the reference pages."""
    return [
        (page.name, match.group(1))
        for page in sorted(REFERENCE.glob("*.md"))
        for match in DIRECTIVE.finditer(page.read_text())
    ]


def _public() -> set[str]:
    return {f"fmesh.{name}" for name in fmesh.__all__} | {
        f"fmesh.device_mesh.{name}" for name in fmesh.device_mesh.__all__
    }


def test_directive_parser() -> None:
    text = "# t\n\n::: fmesh.Mesh\n\n:::fmesh.slice\nsee ::: not this\n"
    assert [m.group(1) for m in DIRECTIVE.finditer(text)] == ["fmesh.Mesh", "fmesh.slice"]


def test_every_public_name_is_in_the_reference() -> None:
    shown = {path for _, path in _directives()}
    assert sorted(_public() - shown) == [], "add a `::: fmesh.NAME` to docs/reference/"


def test_the_reference_shows_only_public_names_each_once() -> None:
    paths = [path for _, path in _directives()]
    assert sorted(set(paths) - _public()) == [], "not a public name (private path?)"
    assert sorted({p for p in paths if paths.count(p) > 1}) == []


def test_no_directive_names_a_private_module() -> None:
    private = [
        (page, path)
        for page, path in _directives()
        if any(part.startswith("_") for part in path.split("."))
    ]
    assert private == []
