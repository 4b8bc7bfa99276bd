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


# Private attributes of torch objects (DeviceMesh, DTensor, c10d) that fmesh reads.
_TORCH_PRIVATE_ATTRS = {
    "_concatenate",
    "_device_type",
    "_dim_group_names",
    "_flatten",
    "_flatten_mapping",
    "_get_root_mesh",
    "_layout",
    "_mesh_dim_names",
    "_pg_registry",
    "_rank_map",
    "_root_mesh",
    "_spec",
    "_unflatten",
    "_world",
}


def _private_torch_uses(path: Path) -> list[str]:
    """Private torch names in one module: imports from private torch modules or of
    private names, attributes starting with ``_`` on names bound to torch, and the
    known private attributes of torch objects."""
    import ast

    tree = ast.parse(path.read_text())
    torch_names: set[str] = set()
    found: list[str] = []

    def private(part: str) -> bool:
        return part.startswith("_") and not part.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    torch_names.add((alias.asname or alias.name).split(".")[0])
                    if any(private(p) for p in alias.name.split(".")):
                        found.append(f"{path.name}:{node.lineno} import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
            module = node.module or ""
            for alias in node.names:
                torch_names.add(alias.asname or alias.name)
                if any(private(p) for p in module.split(".")) or private(alias.name):
                    found.append(
                        f"{path.name}:{node.lineno} from {module} import {alias.name}"
                    )
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            root: ast.expr = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            on_torch = isinstance(root, ast.Name) and root.id in torch_names
            if on_torch or node.attr in _TORCH_PRIVATE_ATTRS:
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
    return found


def test_private_torch_names_live_only_in_the_compat_module() -> None:
    offenders = [
        use
        for path in sorted((ROOT / "fmesh").glob("*.py"))
        if path.name != "_c10d.py"
        for use in _private_torch_uses(path)
    ]
    assert offenders == []
    # The checker itself finds what the compat module uses.
    assert len(_private_torch_uses(ROOT / "fmesh" / "_c10d.py")) > 10
