"""The client libraries some tests run, from fmesh's ``clients`` extra (accelerate,
transformers, Lightning): apart from ``test``, so that the test tools install in
seconds. A test that needs one calls ``require`` first and skips without it, naming
the extra; CI installs it (.ci/run, the README's test command)."""

from __future__ import annotations

import pytest

INSTALL = 'pip install -e ".[test,docs,clients]"'
"""The README's install line for the whole suite, the clients included."""


def require(*modules: str) -> None:
    """Skip the calling test unless every module is importable, saying which extra
    holds it."""
    for module in modules:
        pytest.importorskip(
            module,
            reason=f"{module} is in fmesh's clients extra, not installed here: {INSTALL}",
        )
