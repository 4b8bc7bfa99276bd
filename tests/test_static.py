"""Static checks as tests, so the README's one test command covers them too."""

from __future__ import annotations

import ast
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


COMPAT = ROOT / "fmesh" / "_compat"
"""The compat package: process groups (``c10d.py``), DTensor (``dtensor.py``) and
DeviceMesh (``mesh.py``); its ``__init__.py`` only re-exports."""


def test_private_torch_names_live_only_in_the_compat_package() -> None:
    offenders = [
        use
        for path in sorted((ROOT / "fmesh").rglob("*.py"))
        if COMPAT not in path.parents
        for use in _private_torch_uses(path)
    ]
    assert offenders == []
    # The checker itself finds what the compat package's modules use (spaces.py, the
    # registry of fmesh's rank spaces, touches only public tensor methods).
    for name in ("c10d.py", "dtensor.py", "mesh.py", "hook.py"):
        assert len(_private_torch_uses(COMPAT / name)) >= 3, name


# -- the shape of the package ---------------------------------------------------------------

MAX_MODULE_LINES = 400
"""A module longer than this is doing more than one thing: split it."""


def _node(path: Path) -> str:
    """The dotted module name of ``path`` inside the package (``_core.mesh``; a
    package's ``__init__.py`` is the package itself, ``_compat``)."""
    parts = path.relative_to(ROOT / "fmesh").with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"


def _package_imports(path: Path) -> set[str]:
    """Modules of the package that ``path`` imports anywhere: at the top, inside a
    function (a lazy import is still a dependency) or for type checking only."""
    here = path.relative_to(ROOT / "fmesh").parent.parts  # the file's package
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module or ""
        if node.level:
            base = list(here[: len(here) - (node.level - 1)])
        elif module.startswith("fmesh."):
            base, module = [], module.removeprefix("fmesh.")
        else:
            continue
        # from .x import a, b: the modules x.a and x.b, or names in the module x
        # (from . import a: the module a, or a name of the package itself).
        parts = [*base, *module.split(".")] if module else base
        found.update(".".join([*parts, alias.name]) for alias in node.names)
    modules = {_node(p) for p in (ROOT / "fmesh").rglob("*.py")}
    # Keep the longest prefix of each that is a module (or package).
    resolved: set[str] = set()
    for name in found:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            resolved.add(name)
    return resolved - {_node(path)}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, or ``None``."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_module_is_longer_than_the_limit() -> None:
    long = {
        p.name: n
        for p in sorted((ROOT / "fmesh").rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_the_package_has_no_import_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "fmesh").rglob("*.py"):
        graph.setdefault(_node(path), set()).update(_package_imports(path))
    graph.pop("__init__")  # re-exports all; nothing imports it
    assert _cycle(graph) is None
    # The checker finds a cycle when there is one.
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert "_runtime.turns" in graph["_runtime.realize"]
    assert "_runtime.realized_mesh" in graph["_runtime.realize"]
    assert "_protocol.agreement" in graph["_protocol.watch"]
    assert "_compat.mesh" in graph["_torch.interop"]


# -- layering: core -> protocol -> runtime -> torch interop and CLI ------------------------

LAYERS = {
    "_core": {"_core"},
    "_compat": {"_compat"},
    "_protocol": {"_core", "_compat", "_protocol"},
    "_runtime": {"_core", "_compat", "_protocol", "_runtime"},
    "_torch": {"_core", "_compat", "_runtime", "_torch"},
    "_plan": {"_core", "_compat", "_protocol", "_runtime", "_torch", "_plan"},
    "_cli": {"_core", "_compat", "_runtime", "_torch", "_plan", "_cli"},
}
"""Subpackage -> the subpackages it may import (lazily and for type checking too): the
core needs nothing, the cross-rank protocol (agreement, streams, liveness) knows
nothing of one process's runtime (the runtime calls it, and resets its caches), the
runtime knows nothing that builds DeviceMeshes (the interop registers hooks in
``_runtime/hooks.py``), the torch interop sits on top, the planner (``fmesh plan``:
runs code with torch routed through the interop) on it, and the CLI on top of all."""


def _imports_torch(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(name.split(".")[0] == "torch" for name in names):
            return True
    return False


def test_layers_import_one_way() -> None:
    offenders = []
    for path in sorted((ROOT / "fmesh").rglob("*.py")):
        layer = _node(path).split(".")[0]
        if layer not in LAYERS:
            continue  # the public faces at the top re-export from every layer
        offenders += [
            f"{_node(path)} -> {dep}"
            for dep in sorted(_package_imports(path))
            if dep.split(".")[0] not in LAYERS[layer]
        ]
    assert offenders == []
    assert set(LAYERS) == {
        p.name for p in (ROOT / "fmesh").iterdir() if (p / "__init__.py").exists()
    }
    # The checker sees lazy imports (destroy) and TYPE_CHECKING ones (realize).
    assert "_compat" in _package_imports(ROOT / "fmesh/_runtime/cache.py")
    assert "_compat" in _package_imports(ROOT / "fmesh/_runtime/realize.py")
    # It sees the protocol's imports, relative (``from .records import``) and up.
    assert {"_protocol.records", "_core.errors"} <= _package_imports(
        ROOT / "fmesh/_protocol/agreement.py"
    )
    assert "_protocol.liveness" in _package_imports(ROOT / "fmesh/_runtime/creation.py")


def test_the_core_imports_no_torch() -> None:
    assert [
        p.name for p in sorted((ROOT / "fmesh/_core").glob("*.py")) if _imports_torch(p)
    ] == []
    assert _imports_torch(ROOT / "fmesh/_runtime/launch.py")  # the checker finds it


def test_the_public_faces_stay_few() -> None:
    assert len(list((ROOT / "fmesh").glob("*.py"))) <= 6
