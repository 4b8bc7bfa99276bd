"""The drop-in against torch's own ``init_device_mesh`` on the same inputs, side by side.

One process plays rank 3 of a 16-rank fake world and calls both on every input:

- **Error classes**: wherever torch rejects an input with ``RuntimeError``,
  ``ValueError`` or ``TypeError``, the drop-in's error is an instance of that class
  (fmesh's own, with a clearer message); never a raw internal error.
- **What torch accepts**: odd dim names (``""``, ints, ``None``, a str's letters),
  ``_flatten``/``_unflatten`` with non-str names and the private ``_rank=`` keyword
  give the drop-in's meshes the same answers as torch's, ``group_desc``
  (``mesh_<dim>``, what torch's flight recorder and logs show) included. numpy
  integer sizes, which torch refuses, are taken as ints.

The fmesh memo is reset between cases, so each case's groups are made by that case
(the memo shares one group between meshes, and a shared group keeps the description
of the call that created it: ``docs/device-mesh.md``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _dist import run_spawn

import fmesh

WORLD = 16
RANK = 3

# Each case: (mesh_shape, mesh_dim_names[, device_type]); run as init(device, shape, names).
INIT_CASES: dict[str, tuple[Any, ...]] = {
    "float size": ((2.5, 4), None),
    "integral float size": ((2.0, 8), None),
    "str size": (("2", 4), None),
    "bool size": ((True, 4), None),
    "nested size": (((2,), 4), None),
    "str shape": ("24", None),
    "negative sizes": ((-2, -4), None),
    "size -1": ((-1, 4), None),
    "int shape": (8, None),
    "None shape": (None, None),
    "bigger than world": ((4, 8), None),
    "names too short": ((2, 4), ("a",)),
    "names too long": ((2, 4), ("a", "b", "c")),
    "names empty tuple": ((2, 4), ()),
    "names repeated": ((2, 4), ("a", "a")),
    "names an int": ((2, 4), 5),
    "names unhashable": ((2, 4), (["a"], "b")),
    "one-dim names as a str": ((16,), "dp"),
    "device with index": ((2, 4), None, "cpu:0"),
    "unknown override": ((2, 4), ("a", "b"), "cpu", {"c": "fake"}),
    "redundant override": ((2, 4), ("a", "b"), "cpu", {"a": "fake", 0: "fake"}),
}

# Refused by torch 2.13 and 2.15, accepted by torch 2.11; the drop-in refuses them on all.
OLD_TORCH_ACCEPTS = frozenset({"nested size"})

# Each case: a function of (init, DeviceMesh) that returns the mesh to compare.
ACCEPT_CASES: dict[str, Callable[[Any, Any], Any]] = {
    "named": lambda init, _: init("cpu", (2, 2, 4), mesh_dim_names=("dp", "cp", "tp")),
    "unnamed": lambda init, _: init("cpu", (4, 4)),
    "tensor shape": lambda init, _: init("cpu", __import__("torch").Size([4, 4])),
    "list names": lambda init, _: init("cpu", [4, 4], mesh_dim_names=["dp", "tp"]),
    "str names": lambda init, _: init("cpu", (4, 4), mesh_dim_names="ab"),
    "empty name": lambda init, _: init("cpu", (4, 4), mesh_dim_names=("", "x")),
    "empty name sliced": lambda init, _: init("cpu", (4, 4), mesh_dim_names=("", "x"))[""],
    "int names": lambda init, _: init("cpu", (4, 4), mesh_dim_names=(1, 2)),
    "None name": lambda init, _: init("cpu", (4, 4), mesh_dim_names=(None, "x")),
    "int names flattened as 3": lambda init, _: init(
        "cpu", (4, 4), mesh_dim_names=(1, 2)
    )._flatten(3),
    "empty device type": lambda init, _: init("", (4, 4), mesh_dim_names=("dp", "tp")),
    "flatten default name": lambda init, _: init(
        "cpu", (2, 2, 4), mesh_dim_names=("dp", "cp", "tp")
    )["dp", "cp"]._flatten(),
    "flatten int name": lambda init, _: init(
        "cpu", (2, 2, 4), mesh_dim_names=("dp", "cp", "tp")
    )["cp", "tp"]._flatten(1),
    "flatten then slice": lambda init, _: _flatten_then_slice(init),
    "unflatten int names": lambda init, _: init(
        "cpu", (4, 4), mesh_dim_names=("dp", "tp")
    )._unflatten(1, (2, 2), (1, 2)),
    "unflatten empty name": lambda init, _: init(
        "cpu", (4, 4), mesh_dim_names=("dp", "tp")
    )._unflatten(0, (2, 2), ("", "b")),
    "unflatten unnamed world": lambda init, _: init(
        "cpu", (16,), mesh_dim_names=("w",)
    )._unflatten(0, (2, 8), ("dp", "tp")),
    "_rank root": lambda init, dm: _with_rank(init, dm, 9, None),
    "_rank slice": lambda init, dm: _with_rank(init, dm, 1, "tp"),
    "_rank with backend": lambda init, dm: _with_rank(init, dm, 9, None, backend=True),
}


def _flatten_then_slice(init: Any) -> Any:
    root = init("cpu", (2, 2, 4), mesh_dim_names=("dp", "cp", "tp"))
    root["dp", "cp"]._flatten()
    return root["dp_cp", "tp"]


def _with_rank(
    init: Any, dm_class: Any, rank: int, sub: str | None, backend: bool = False
) -> Any:
    """torch's private ``DeviceMesh(..., _rank=)`` over a root's rank map: the
    coordinate is ``rank``'s, not this process's."""
    root = init("cpu", (4, 4), mesh_dim_names=("dp", "tp"))
    mesh = root if sub is None else root[sub]
    return dm_class(
        "cpu",
        _layout=mesh._layout,
        _rank_map=root._rank_map,
        mesh_dim_names=mesh.mesh_dim_names,
        _rank=rank,
        _init_backend=backend,
    )


def _facts(dm: Any) -> dict[str, Any]:
    import torch.distributed as dist

    out: dict[str, Any] = {
        "mesh": dm.mesh.tolist(),
        "names": dm.mesh_dim_names,
        "coordinate": dm.get_coordinate(),
        "rank": dm._rank,
        "device_type": dm.device_type,
    }
    if hasattr(dm, "_dim_group_names"):
        groups = [dm.get_group(i) for i in range(dm.ndim)]
        out["group_desc"] = [g.group_desc for g in groups]
        out["group_ranks"] = [dist.get_process_group_ranks(g) for g in groups]
        out["local_ranks"] = [dm.get_local_rank(i) for i in range(dm.ndim)]
    return out


def _error(fn: Callable[[], Any]) -> tuple[type[BaseException] | None, str]:
    try:
        fn()
    except Exception as err:  # the class is what is compared
        return type(err), str(err)
    return None, ""


def _init(init: Any, case: tuple[Any, ...]) -> Any:
    shape, names, *rest = case
    device = rest[0] if rest else "cpu"
    override = rest[1] if len(rest) > 1 else None
    return init(
        device,
        shape,
        mesh_dim_names=names,
        backend_override=None if override is None else dict(override),
    )


def _made(make: Callable[[Any, Any], Any], init: Any, dm_class: Any) -> dict[str, Any]:
    return _facts(make(init, dm_class))


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as err:  # compared with torch's answer
        return ("raises", type(err).__name__, str(err))


def parity_job(_: int, __: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.device_mesh import init_device_mesh as torch_init

    from fmesh.device_mesh import init_device_mesh

    fmesh.init_fake_world(WORLD, RANK)
    inits = (torch_init, init_device_mesh)
    errors: dict[str, Any] = {}
    for name, case in INIT_CASES.items():
        errors[name] = tuple(_error(functools.partial(_init, init, case)) for init in inits)
        fmesh.destroy()
    accepted: dict[str, Any] = {}
    for name, make in ACCEPT_CASES.items():
        accepted[name] = tuple(
            _outcome(functools.partial(_made, make, init, DeviceMesh)) for init in inits
        )
        fmesh.destroy()
    numpy = __import__("numpy")
    sizes = (numpy.int64(4), numpy.int32(4))
    numpy_ints = (_facts(init_device_mesh("cpu", sizes)), _facts(torch_init("cpu", (4, 4))))
    return {"errors": errors, "accepted": accepted, "numpy_ints": numpy_ints}


@pytest.fixture(scope="module")
def parity(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp: Path = tmp_path_factory.mktemp("parity")
    out: dict[str, Any] = run_spawn(
        parity_job, 1, tmp_path=tmp, launch_env=False, timeout=240
    ).values()[0]
    return out


@pytest.mark.parametrize("case", sorted(INIT_CASES))
def test_init_errors_are_instances_of_torchs(parity: dict[str, Any], case: str) -> None:
    (theirs, their_msg), (ours, our_msg) = parity["errors"][case]
    if theirs is None and case in OLD_TORCH_ACCEPTS:
        # torch 2.11 takes a nested size as a hierarchical layout; 2.13 and 2.15 refuse
        # it, and so does the drop-in on every torch (docs/device-mesh.md).
        assert ours is not None and issubclass(ours, TypeError), (case, ours, our_msg)
        return
    assert theirs is not None, f"torch accepts {case}: not an error case ({INIT_CASES[case]})"
    assert ours is not None, f"the drop-in accepts {case}, torch raised {theirs}: {their_msg}"
    if issubclass(theirs, RuntimeError | ValueError | TypeError):
        assert issubclass(ours, theirs), (case, theirs, ours, our_msg)
    # Never a raw internal error: fmesh's own class, or one of its plain TypeErrors.
    assert ours.__module__.startswith("fmesh") or "init_device_mesh" in our_msg, (
        case,
        ours,
        our_msg,
    )
    # fmesh's errors stay MeshErrors (ValueErrors) or TypeErrors (DESIGN 4).
    assert issubclass(ours, fmesh.MeshError | TypeError), ours


@pytest.mark.parametrize("case", sorted(ACCEPT_CASES))
def test_the_drop_in_accepts_what_torch_accepts(parity: dict[str, Any], case: str) -> None:
    theirs, ours = parity["accepted"][case]
    assert ours == theirs


def test_group_desc_is_torchs(parity: dict[str, Any]) -> None:
    """What the comparison above covers, spelled out: torch's ``mesh_<dim>``."""
    accepted = parity["accepted"]
    assert accepted["named"][1]["group_desc"] == ["mesh_dp", "mesh_cp", "mesh_tp"]
    assert accepted["unnamed"][1]["group_desc"] == ["mesh_dim_0", "mesh_dim_1"]
    assert accepted["flatten default name"][1]["group_desc"] == ["mesh_dp_cp"]
    assert accepted["flatten int name"][1]["group_desc"] == ["mesh_1"]
    assert accepted["unflatten empty name"][1]["group_desc"] == ["mesh_", "mesh_b", "mesh_tp"]
    assert accepted["_rank root"][1]["coordinate"] == (2, 1)  # rank 9's, not rank 3's


def test_numpy_integer_sizes_are_ints(parity: dict[str, Any]) -> None:
    ours, torchs_of_ints = parity["numpy_ints"]
    assert ours == torchs_of_ints
