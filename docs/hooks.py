"""mkdocs hook: render the docstrings' doctest examples as Python code.

fmesh's docstrings carry bare ``>>>`` examples (they run as doctests). Markdown reads
``>>>`` as nested block quotes, so each run of example lines, up to the next blank
line, is fenced as ``pycon`` before the page (or docstring) is converted.
"""

from __future__ import annotations

from typing import Any

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor


class _DoctestFences(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        fenced = False  # inside a ``` or ~~~ block of the source
        example: str | None = None  # the indent of the open doctest block
        for line in lines:
            stripped = line.lstrip()
            if example is not None:
                if stripped:
                    out.append(line)
                    continue
                out.append(f"{example}```")
                example = None
            if stripped.startswith(("```", "~~~")):
                fenced = not fenced
            elif not fenced and stripped.startswith(">>>"):
                example = line[: len(line) - len(stripped)]
                out.append(f"{example}```pycon")
            out.append(line)
        if example is not None:
            out.append(f"{example}```")
        return out


class _DoctestFencesExtension(Extension):
    def extendMarkdown(self, md: Markdown) -> None:
        # After whitespace normalization (30), before the fences (25) that it adds to.
        md.preprocessors.register(_DoctestFences(md), "fmesh_doctest_fences", 29)


def on_config(config: Any) -> Any:
    """Add the extension to every Markdown instance, mkdocstrings' included."""
    config.markdown_extensions.append(_DoctestFencesExtension())
    return config
