"""The API reference covers every public name, each once, under its public path, and
the built site reads as prose with links.

The reference pages (``docs/reference/*.md``) render objects with mkdocstrings
directives (``::: fmesh.make_mesh``). Every name in ``fmesh.__all__`` and in
``fmesh.device_mesh.__all__`` must have one, by the path users import it from, never
by the private module it is defined in (those move). ``mkdocs build --strict`` in
.ci/run checks that each directive renders and each cross-reference resolves; it
does not see a reST role (``:class:`X```) left in a docstring, which renders as
literal text, nor a Returns section parsed into a name and a description. The site
is built once here (a few seconds; skipped without the ``docs`` extra) and read back:
no raw role, Returns and Raises tables as mkdocstrings renders prose, and every link
a file, so that ``site/`` opened from disk never lands on a directory listing.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fmesh
import fmesh.device_mesh

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
DIRECTIVE = re.compile(r"^::: *(\S+) *$", re.M)
# A Sphinx role: :class:`Mesh`, :py:func:`realize`, :meth:`~fmesh.Mesh.to_json` ...
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|exc|mod|data|obj|const|ref):`")
# The same role once rendered: the backticks became <code>, the role stays as text.
RENDERED_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|exc|mod|data|obj|const|ref):\S")


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


def test_role_pattern() -> None:
    assert ROLE.search("a :class:`Mesh` b") and ROLE.search(":py:func:`fmesh.realize`")
    assert not ROLE.search("a [`Mesh`][fmesh.Mesh] b, ``x: y``, {'class': 1}")
    assert RENDERED_ROLE.search("A :class:<code>RealizedMesh</code>.")


def test_no_rest_role_in_the_sources() -> None:
    """Docstrings cross-reference in markdown (``[`Mesh`][fmesh.Mesh]``), which
    mkdocstrings renders as links; a reST role renders as literal text."""
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "fmesh").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ROLE.search(line)
    ]
    assert found == []


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs site, built strictly from this checkout."""
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings_handlers.python")
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def _pages(site: Path) -> list[Path]:
    return sorted(site.rglob("*.html"))


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", fragment))).strip()


def _sections(page: Path, title: str) -> list[tuple[list[str], list[list[str]]]]:
    """(header cells, rows of cells) of each ``title`` section table of a page."""
    tables = re.findall(
        rf'doc-section-title">{title}:</span></p>\s*<table>(.*?)</table>',
        page.read_text(),
        re.S,
    )
    return [
        (
            [_text(cell) for cell in re.findall(r"<th>(.*?)</th>", table, re.S)],
            [
                [_text(cell) for cell in re.findall(r"<td>(.*?)</td>", row, re.S)]
                for row in re.findall(r'<tr class="doc-section-item">(.*?)</tr>', table, re.S)
            ],
        )
        for table in tables
    ]


def test_the_site_shows_no_raw_role_and_no_unfenced_example(site: Path) -> None:
    raw = {
        page.relative_to(site).as_posix(): RENDERED_ROLE.findall(_text(page.read_text()))
        for page in _pages(site)
    }
    assert {page: found for page, found in raw.items() if found} == {}
    # A doctest under a reST ``::`` or indented under prose becomes a code block that
    # shows the hook's fence as text.
    fences = [page.name for page in _pages(site) if "```" in page.read_text()]
    assert fences == []


def test_returns_sections_read_as_one_prose_item(site: Path) -> None:
    """One row, a type and a sentence: never a Name column (griffe reads a line that
    starts ``A :class:`` as a value named ``A``), never a row per wrapped line."""
    returns = [
        (page.name, header, rows)
        for page in _pages(site / "reference")
        for header, rows in _sections(page, "Returns")
    ]
    assert len(returns) >= 10  # realize, make_mesh, shrink, spec_of, ...
    bad = [r for r in returns if r[1] != ["Type", "Description"] or len(r[2]) != 1]
    assert bad == []
    realize = next(rows for page, _, rows in returns if page == "realize.html")
    assert realize[0][0] == "RealizedMesh"
    assert realize[0][1].startswith("A RealizedMesh")


def test_raises_sections_name_an_exception_per_row(site: Path) -> None:
    raises = [
        (page.name, row)
        for page in _pages(site / "reference")
        for header, rows in _sections(page, "Raises")
        for row in rows
    ]
    assert len(raises) >= 20
    named = re.compile(r"([A-Z]\w*)?(Error|Exception)")
    assert [r for r in raises if not named.fullmatch(r[1][0])] == []


def test_reference_links_resolve_to_the_documented_objects(site: Path) -> None:
    page = (site / "reference" / "realize.html").read_text()
    # The Returns prose links to the class (an autoref, not literal text).
    assert 'href="#fmesh.RealizedMesh"><code>RealizedMesh</code></a>' in page
    ops = (site / "reference" / "operations.html").read_text()
    assert 'href="mesh.html#fmesh.Mesh"' in ops


def test_every_link_of_the_site_is_a_file(site: Path) -> None:
    """Opened from disk (file://), a link to a folder shows a directory listing: with
    ``use_directory_urls: false`` every page links ``page.html``."""
    broken = []
    # 404.html is for a web server (absolute links from the site root), not for disk.
    for page in [p for p in _pages(site) if p.name != "404.html"]:
        for href in re.findall(r'(?:href|src)="([^"]+)"', page.read_text()):
            if re.match(r"[a-z]+:|#|//", href):
                continue
            target = (page.parent / href.split("#")[0].split("?")[0]).resolve()
            if not target.is_file():
                broken.append(f"{page.relative_to(site)} -> {href}")
    assert broken == []


def test_search_works_on_the_site_opened_from_disk(site: Path) -> None:
    """A browser opening ``site/index.html`` as ``file://`` can fetch nothing: the
    search index ships as a script (Material's offline plugin) and the search worker
    runs in an iframe (the shim in ``docs/javascripts/``). A headless Chromium, where
    one is installed, searches for "realize" and must list results; nothing is loaded
    from the network."""
    assert (site / "search" / "search_index.js").is_file()
    index = (site / "index.html").read_text()
    assert re.findall(r'<script src="(https?:[^"]+)"', index) == []
    browser = next(
        (b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None
    )
    if browser is None:
        pytest.skip("no Chromium here to open the site from disk")
    result = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=20000",
            "--dump-dom",
            (site / "index.html").as_uri() + "?q=realize",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    found = re.search(r'md-search-result__meta">(\d+) matching documents?<', result.stdout)
    assert found is not None and int(found.group(1)) > 0, result.stdout[-2000:]
