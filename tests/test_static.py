"""Static checks as tests, so the README's one test command covers them too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
    )


def test_mypy_strict_is_clean_on_package_tests_examples_and_bench() -> None:
    # The file list and `strict = true` come from [tool.mypy] in pyproject.toml.
    result = _run(sys.executable, "-m", "mypy", "--config-file", "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout


def test_mypy_config_is_strict_without_blanket_ignores() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert "strict = true" in text
    assert "ignore_missing_imports" not in text
    assert 'mypy_path = "typestubs"' in text


def test_type_ignores_name_an_error_code() -> None:
    offenders = []
    for path in [
        *ROOT.glob("fmesh/**/*.py"),
        *ROOT.glob("tests/**/*.py"),
        *ROOT.glob("examples/**/*.py"),
        *ROOT.glob("bench/**/*.py"),
    ]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "type: ignore" in line and "type: ignore[" not in line:
                offenders.append(f"{path.relative_to(ROOT)}:{number}")
    assert offenders == []


def test_ruff_is_clean() -> None:
    result = _run(sys.executable, "-m", "ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = _run(sys.executable, "-m", "ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr
