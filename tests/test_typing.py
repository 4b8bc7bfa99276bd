"""Tests of fmesh's public types: one snippet must pass ``mypy --strict``, one must fail.

``tests/typing/pass.py`` pins exact result types with ``assert_type`` under
``disallow-any-expr``; ``tests/typing/fail.py`` marks each line mypy must reject with
``# E: <error code>``. Both run with the project's own configuration (strict).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PASS = Path("tests/typing/pass.py")
FAIL = Path("tests/typing/fail.py")
ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[\w-]+)\]$")
MARK = re.compile(r"#\s*E:\s*(?P<code>[\w-]+)\s*$")


@pytest.fixture(scope="module")
def mypy_errors() -> dict[str, set[tuple[int, str]]]:
    """Errors mypy reports for both snippets: path -> {(line, code)}."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            "pyproject.toml",
            "--show-error-codes",
            "--no-pretty",
            "--no-error-summary",
            str(PASS),
            str(FAIL),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    # 0: no errors, 1: type errors found; anything else means mypy itself failed.
    assert done.returncode in (0, 1), done.stdout + done.stderr
    found: dict[str, set[tuple[int, str]]] = {str(PASS): set(), str(FAIL): set()}
    for line in done.stdout.splitlines():
        match = ERROR.match(line)
        if match:
            path = Path(match["path"]).as_posix()
            found.setdefault(path, set()).add((int(match["line"]), match["code"]))
        else:
            assert ": note: " in line, f"unexpected mypy output: {line}"
    return found


def test_pass_snippet_type_checks(mypy_errors: dict[str, set[tuple[int, str]]]) -> None:
    assert mypy_errors[str(PASS)] == set()
    assert set(mypy_errors) == {str(PASS), str(FAIL)}  # errors nowhere else either


def test_fail_snippet_is_rejected_exactly_where_marked(
    mypy_errors: dict[str, set[tuple[int, str]]],
) -> None:
    expected = set()
    for number, text in enumerate((ROOT / FAIL).read_text().splitlines(), start=1):
        match = MARK.search(text)
        if match:
            expected.add((number, match["code"]))
    assert len(expected) >= 15
    assert mypy_errors[str(FAIL)] == expected
