"""What a DeviceMesh answers, for comparing torch's ``init_device_mesh`` with fmesh's.

Runs inside the workers of ``test_dropin.py`` and ``test_dropin_fake.py``: every public
answer of a mesh and of torch's own operations on it (slicing in every order,
``_flatten``, ``_unflatten``, ``_concatenate``, ``from_group``, pickling), with the
exception class where torch raises and the groups each operation created. Both meshes
go through the same calls on every rank, in the same order, so torch's collective
group creation stays in step.
"""

from __future__ import annotations

import functools
import itertools
import pickle
import warnings
from collections.abc import Callable
from typing import Any

__all__ = [
    "Facts",
    "answers",
    "init_errors",
    "init_inputs",
    "num_groups",
    "operations",
    "outcome",
]

Facts = dict[str, Any]


def outcome(fn: Callable[[], Any]) -> Any:
    """``fn()``, or ("raises", the exception's class name)."""
    try:
        return fn()
    except Exception as err:  # compared between torch's mesh and fmesh's
        return ("raises", type(err).__name__)


def num_groups() -> int:
    """Process groups this process holds (torch's registry)."""
    import torch.distributed as dist

    return len(dist.distributed_c10d._world.pg_map)


def _ranks(pg: Any) -> tuple[int, ...]:
    import torch.distributed as dist

    return tuple(dist.get_process_group_ranks(pg))


def answers(dm: Any) -> Facts:
    """Every public answer of ``dm`` on this rank (and a few torch helpers use)."""
    n = dm.ndim
    out: Facts = {
        "coordinate": dm.get_coordinate(),
        "mesh": outcome(lambda: dm.mesh.tolist()),
        "names": dm.mesh_dim_names,
        "shape": tuple(dm.shape),
        "size": dm.size(),
        "sizes": tuple(dm.size(i) for i in range(n)),
        "device_type": dm.device_type,
        "root_is_self": dm._get_root_mesh() is dm,
        "root_dim": outcome(dm._get_root_mesh_dim),
        "groups": outcome(lambda: tuple(_ranks(dm.get_group(i)) for i in range(n))),
        "all_groups": outcome(lambda: tuple(_ranks(g) for g in dm.get_all_groups())),
        "by_name": outcome(lambda: tuple(_ranks(dm.get_group(a)) for a in dm.mesh_dim_names)),
        "local_ranks": outcome(lambda: tuple(dm.get_local_rank(i) for i in range(n))),
        "local_rank": outcome(dm.get_local_rank),
        "group": outcome(lambda: _ranks(dm.get_group())),
        "group_unknown": outcome(lambda: dm.get_group("nope")),
    }
    return out


def _step(dm: Any, fn: Callable[[Any], Any]) -> Facts:
    """Answers of ``fn(dm)`` (a mesh), or how it raised, and the groups it created."""
    before = num_groups()
    got = outcome(lambda: fn(dm))
    facts = got if isinstance(got, tuple) else answers(got)
    return {"result": facts, "new_groups": num_groups() - before}


def _slicer(key: str | tuple[str, ...]) -> Callable[[Any], Any]:
    return lambda m: m[key]


def _flattener(names: tuple[str, ...], flat: str) -> Callable[[Any], Any]:
    return lambda m: m[names]._flatten(flat)


def operations(dm: Any, tag: str) -> Facts:
    """torch's operations on ``dm``: slicing by every ordered subset of its names (and
    by names it lacks), ``_flatten`` of every ascending subset and slicing by the
    flattened names, ``_unflatten``, ``_concatenate``, ``from_group`` and pickling."""
    from torch.distributed.device_mesh import DeviceMesh

    names = tuple(dm.mesh_dim_names or ())
    out: Facts = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates slicing flattens off a root
        for k in range(1, len(names) + 1):
            for sub in itertools.permutations(names, k):
                out[f"getitem {sub}"] = _step(dm, _slicer(sub))
        out["getitem unknown"] = _step(dm, lambda m: m["nope"])
        out["getitem dim0"] = _step(dm, lambda m: m["dim0"])
        out["flatten default"] = _step(dm, lambda m: m._flatten())
        for k in range(2, len(names) + 1):
            for sub in itertools.combinations(names, k):
                flat = f"{tag}_{'_'.join(sub)}"
                out[f"flatten {sub}"] = _step(dm, _flattener(sub, flat))
                out[f"getitem {flat}"] = _step(dm, _slicer(flat))
                rest = [a for a in names if a not in sub]
                if rest:
                    key = (flat, rest[-1])
                    out[f"getitem {key}"] = _step(dm, _slicer(key))
        if names:
            out["flatten own name"] = _step(dm, lambda m: m._flatten(names[0]))
        half = dm.size(0) // 2
        if dm.size(0) % 2 == 0:
            new = (f"{tag}_u", f"{tag}_v")
            out["unflatten"] = _step(dm, lambda m: m._unflatten(0, (2, half), new))
        if len(names) > 1:
            out["concatenate reversed"] = _step(
                dm, lambda m: DeviceMesh._concatenate([m[a] for a in reversed(names)])
            )
        if dm.get_coordinate() is not None and dm.ndim == 1:
            names_arg = dm.mesh_dim_names
            out["from_group equal"] = outcome(
                lambda: (
                    DeviceMesh.from_group(
                        dm.get_group(), dm.device_type, mesh_dim_names=names_arg
                    )
                    == dm
                )
            )
        again = pickle.loads(pickle.dumps(dm))
        out["pickle"] = {"equal": again == dm, "answers": answers(again)}
    return out


def init_errors(init: Callable[..., Any], world: int) -> Facts:
    """How ``init`` (torch's ``init_device_mesh`` or fmesh's) refuses bad arguments:
    the exception's class names, most derived first, and its message."""
    cases: dict[str, Callable[[], Any]] = {
        "duplicate names": lambda: init("cpu", (2, 2), mesh_dim_names=("dp", "dp")),
        "names length": lambda: init("cpu", (world,), mesh_dim_names=("dp", "tp")),
        "device index": lambda: init("cpu:0", (2, 2), mesh_dim_names=("dp", "tp")),
        "redundant override": lambda: init(
            "cpu",
            (2, 2),
            mesh_dim_names=("dp", "tp"),
            backend_override={"dp": "gloo", 0: "gloo"},
        ),
        "unknown override name": lambda: init(
            "cpu", (2, 2), mesh_dim_names=("dp", "tp"), backend_override={"cp": "gloo"}
        ),
        "unknown override index": lambda: init(
            "cpu", (2, 2), mesh_dim_names=("dp", "tp"), backend_override={42: "gloo"}
        ),
        "too large": lambda: init("cpu", (2, world), mesh_dim_names=("dp", "tp")),
    }
    out: Facts = {}
    for name, fn in cases.items():
        try:
            fn()
        except Exception as err:  # compared between the two
            out[name] = (tuple(c.__name__ for c in type(err).__mro__), str(err))
        else:
            out[name] = None
    return out


def init_inputs(init: Callable[..., Any], world: int, options: Any) -> Facts:
    """How ``init`` answers odd inputs on a fake world of ``world`` ranks (a multiple
    of 8): a mesh's device type, coordinate and group sizes where it accepts them, else
    the exception's class names, most derived first. ``options``: backend options of
    the fake backend."""
    shape, names = (8, world // 8), ("a", "b")
    devices = ("bogus", "CPU", "Cuda", "meta")
    overrides: dict[str, object] = {
        "one-item tuple": ("fake",),
        "three-item tuple": ("fake", None, 1),
        "int": 5,
        "None": None,
        "pair with None options": ("fake", None),
        "pair with None backend": (None, options),
        "pair of None": (None, None),
        "list pair": ["fake", options],
        "empty name": "",
        "bytes in a pair": (b"fake", None),
        "unknown backend": "nosuch",
        "unknown backend in a pair": ("nosuch", None),
    }
    cases: dict[str, Callable[[], Any]] = {
        f"device {d!r}": functools.partial(init, d, shape, mesh_dim_names=names)
        for d in devices
    }
    for tag, value in overrides.items():
        cases[f"backend_override {tag}"] = functools.partial(
            init, "cpu", shape, mesh_dim_names=names, backend_override={0: value}
        )
    out: Facts = {}
    for name, fn in cases.items():
        try:
            dm = fn()
        except Exception as err:  # compared between the two
            out[name] = ("raises", tuple(c.__name__ for c in type(err).__mro__))
        else:
            sizes = tuple(g.size() for g in dm.get_all_groups())
            out[name] = (dm.device_type, dm.get_coordinate(), sizes)
    return out
