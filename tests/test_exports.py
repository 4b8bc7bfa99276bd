"""The public surface of fmesh, in the style of trio's ``test_exports.py``.

Every public name is exported exactly once, in a form static tools see (the
``from ._x import Name as Name`` re-export), ``__all__`` is sorted, modules other than
the package itself are private, and public classes are final and frozen.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pickle
import pkgutil
import subprocess
import sys
import traceback
from pathlib import Path

import attrs
import pytest

import fmesh

PUBLIC = sorted(fmesh.__all__)
# Base classes meant to be subclassed (the root of the error hierarchy).
NOT_FINAL = {"MeshError", "MeshMismatchError"}
# Short aliases, as in JAX (``P`` for ``PartitionSpec``): the same object as the name.
ALIASES = {"P": "PartitionSpec"}
# torch's own classes, re-exported for annotations and looked up lazily (no torch import
# at `import fmesh`).
FROM_TORCH = {"BackendOptions"}
# Classes whose ``__module__`` is the public path (tracebacks read ``fmesh.MeshError``);
# they are defined in fmesh._core.errors. Other classes keep their private module, where
# doctest finds their methods' examples.
SHOWN_AS_PUBLIC = {
    "AxisNotFoundError",
    "LaunchError",
    "MeshError",
    "MeshMismatchError",
    "PeerLostError",
    "UnrepresentableSplitError",
}


def _static_reexports() -> list[str]:
    """Names that fmesh/__init__.py re-exports explicitly, as a type checker sees them."""
    tree = ast.parse(Path(fmesh.__file__).read_text())
    names: list[str] = []
    body = list(tree.body)
    for node in tree.body:  # `if TYPE_CHECKING:` re-exports count too
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            body += node.body
    for node in body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names += [a.name for a in node.names if a.asname == a.name]
    return names


def test_all_has_no_duplicates() -> None:
    assert len(set(fmesh.__all__)) == len(fmesh.__all__)


def test_all_is_sorted() -> None:
    assert fmesh.__all__ == sorted(fmesh.__all__)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_exists_and_is_exported_once(name: str) -> None:
    assert hasattr(fmesh, name)
    assert _static_reexports().count(name) == 1, f"{name} is not re-exported exactly once"
    obj = getattr(fmesh, name)
    if name in FROM_TORCH:
        assert obj.__module__.startswith("torch"), obj.__module__
    elif name in SHOWN_AS_PUBLIC:
        assert obj.__module__ == "fmesh" and obj.__name__ == name
        assert vars(importlib.import_module("fmesh._core.errors"))[name] is obj
    elif inspect.isclass(obj) or inspect.isfunction(obj):
        assert obj.__module__.startswith("fmesh._"), obj.__module__
        assert obj.__name__ == ALIASES.get(name, name)
    if name in ALIASES:
        assert obj is getattr(fmesh, ALIASES[name])


def test_nothing_public_is_left_out_of_all() -> None:
    public = {
        n
        for n, obj in vars(fmesh).items()
        if not n.startswith("_") and not inspect.ismodule(obj)
    }
    assert public | FROM_TORCH == set(fmesh.__all__)
    # Static re-exports are exactly __all__ too (nothing re-exported by accident).
    assert set(_static_reexports()) == set(fmesh.__all__)


# The public submodules: thin modules over private code (like ``jax.sharding``), and
# ``python -m fmesh.route`` (the runner, which exports nothing).
PUBLIC_MODULES = {"device_mesh", "route"}


def test_modules_other_than_the_package_are_private() -> None:
    found = list(pkgutil.iter_modules(fmesh.__path__))
    assert found
    for module in found:
        if module.name not in PUBLIC_MODULES:
            assert module.name.startswith("_"), f"fmesh.{module.name} should be private"
    assert {m.name for m in found} >= PUBLIC_MODULES


def test_the_public_submodule_is_only_re_exports() -> None:
    import fmesh.device_mesh as dm

    assert dm.__all__ == sorted(dm.__all__)
    assert dm.__all__ == [
        "DeviceMeshError",
        "DeviceMeshTypeError",
        "init_device_mesh",
        "route",
        "unroute",
    ]
    public = {n for n in vars(dm) if not n.startswith("_")}
    assert public == set(dm.__all__)
    for name in ("init_device_mesh", "route", "unroute"):
        assert getattr(dm, name).__module__.startswith("fmesh._")
        assert getattr(dm, name).__name__ == name
    import fmesh.route as runner

    assert runner.__all__ == [] and not {n for n in vars(runner) if not n.startswith("_")}
    for name, torch_class in (
        ("DeviceMeshError", RuntimeError),
        ("DeviceMeshTypeError", TypeError),
    ):
        error = getattr(dm, name)
        assert error.__module__ == "fmesh.device_mesh" and error.__name__ == name
        assert getattr(error, "__final__", False) is True
        # torch's exception type where torch raises, and fmesh's.
        assert issubclass(error, torch_class) and issubclass(error, fmesh.MeshError)


def test_peer_lost_error_is_a_mismatch_and_torchs_runtime_error() -> None:
    import pickle

    error = fmesh.PeerLostError
    assert getattr(error, "__final__", False) is True
    assert issubclass(error, fmesh.MeshMismatchError) and issubclass(error, RuntimeError)
    again = pickle.loads(pickle.dumps(error("rank 3 died", (3,))))
    assert str(again) == "rank 3 died" and again.lost == (3,)


@pytest.mark.parametrize(
    "name",
    [
        n
        for n in PUBLIC
        if n not in FROM_TORCH and n not in NOT_FINAL and inspect.isclass(getattr(fmesh, n))
    ],
)
def test_public_classes_are_final(name: str) -> None:
    cls = getattr(fmesh, name)
    # typing.final records itself on the class (Python 3.11+), also on attrs classes.
    assert getattr(cls, "__final__", False) is True, f"{name} is not @final"
    example = _EXAMPLES.get(name)
    if attrs.has(cls) and example is not None:
        field = attrs.fields(cls)[0].name
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            setattr(example, field, getattr(example, field))


_EXAMPLES: dict[str, object] = {
    "Mesh": fmesh.make_mesh({"dp": 2}),
    "Layout": fmesh.Layout.of((2,)),
    "PlannedCall": fmesh.PlannedCall(1, 7, "Mesh(dp=2) on nccl", ""),
    "PlanReport": fmesh.PlanReport("m:f", 8, (), None),
}


ERRORS = [
    *(f"fmesh.{name}" for name in sorted(SHOWN_AS_PUBLIC)),
    "fmesh.device_mesh.DeviceMeshError",
]


def _error(path: str) -> type[Exception]:
    module, _, name = path.rpartition(".")
    cls: type[Exception] = getattr(importlib.import_module(module), name)
    return cls


@pytest.mark.parametrize("path", ERRORS)
def test_errors_show_their_public_path(path: str) -> None:
    cls = _error(path)
    err = cls("what was given; what was expected")
    assert repr(cls) == f"<class '{path}'>"
    shown = traceback.format_exception_only(type(err), err)
    assert shown == [f"{path}: what was given; what was expected\n"]
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and str(back) == str(err)
    assert b"_core" not in pickle.dumps(err)


def test_a_raised_error_reads_fmesh_mesh_error_in_a_traceback() -> None:
    try:
        fmesh.make_mesh({"dp": 2})["tp"]
    except fmesh.AxisNotFoundError as err:
        last = traceback.format_exception(err)[-1]
    assert last.startswith("fmesh.AxisNotFoundError: Mesh.__getitem__(): "), last


def test_an_error_pickled_in_one_process_unpickles_in_another() -> None:
    """pickle looks the class up by its public path in a fresh interpreter."""
    dump = (
        "import pickle, sys, fmesh, fmesh.device_mesh as dm; "
        "sys.stdout.buffer.write(pickle.dumps([fmesh.MeshMismatchError('m'), "
        "dm.DeviceMeshError('d')]))"
    )
    load = (
        "import pickle, sys; errs = pickle.loads(sys.stdin.buffer.read()); "
        "print([repr(type(e)) for e in errs], [str(e) for e in errs])"
    )
    data = subprocess.run(
        [sys.executable, "-c", dump], capture_output=True, check=True, timeout=120
    ).stdout
    out = subprocess.run(
        [sys.executable, "-c", load],
        input=data,
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout.decode()
    assert out.strip() == (
        "[\"<class 'fmesh.MeshMismatchError'>\", "
        "\"<class 'fmesh.device_mesh.DeviceMeshError'>\"] ['m', 'd']"
    )
