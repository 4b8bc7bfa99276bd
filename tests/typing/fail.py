"""Uses of fmesh's public API that ``mypy --strict`` must reject.

Each line marked ``# E: <code>`` must get exactly that error and no other line may
get one (tests/test_typing.py). Precise public types are what make these fail: were
any of these functions typed ``Any``, the checks would pass silently.
Excluded from the project's own mypy run; the functions are never called.
"""

from __future__ import annotations

import fmesh


def wrong_results(m: fmesh.Mesh) -> object:
    coord: str = fmesh.coordinate(m, 0)  # E: assignment
    members: list[int] = fmesh.group(m, "dp", 0)  # E: assignment
    first: int = fmesh.coordinate(m, 0)[0]  # E: index
    size: str = m.size  # E: assignment
    rank_map: tuple[int, ...] = m.rank_map  # E: assignment
    mesh: fmesh.Mesh = fmesh.instance(m, 0)  # E: assignment
    values: str = fmesh.Layout.of((2,)).values()  # E: assignment
    return coord, members, first, size, rank_map, mesh, values


def wrong_arguments(m: fmesh.Mesh) -> None:
    fmesh.make_mesh(3)  # E: call-overload
    fmesh.make_mesh((2, 4))  # E: call-overload
    fmesh.make_mesh({"dp": 2}, ("dp",))  # E: call-overload
    fmesh.slice(m, 1)  # E: arg-type
    fmesh.flatten(m, ("dp",), name=3)  # E: arg-type
    fmesh.unflatten(m, "dp", [("a", 2)])  # E: arg-type
    fmesh.rename(m, {"dp": 1})  # E: dict-item
    fmesh.group(m, "dp")  # E: call-arg
    fmesh.coordinate(m, "0")  # E: arg-type
    fmesh.slice("m", "dp")  # E: arg-type
    fmesh.Layout.of(3)  # E: arg-type


def immutability(m: fmesh.Mesh) -> None:
    m.axis_names = ("x",)  # E: misc
    m.size = 3  # E: misc


class Sub(fmesh.Mesh):  # E: misc
    pass


def realize_misuse(m: fmesh.Mesh) -> str:
    fmesh.realize(m, backend=3)  # E: arg-type
    fmesh.realize(m, timeout=5.0)  # E: arg-type
    fmesh.realize(m, "gloo")  # E: call-arg
    r = fmesh.realize(m)
    r.coordinate = (0,)  # E: misc
    name: str = r.local_rank("dp")  # E: assignment
    return name


def spec_misuse(r: fmesh.RealizedMesh) -> fmesh.PartitionSpec:
    import torch

    fmesh.P(3)  # E: arg-type
    fmesh.P(("dp", 3))  # E: arg-type
    spec: fmesh.PartitionSpec = ("dp",)  # E: assignment
    fmesh.distribute(torch.zeros(2), r.mesh, fmesh.P("dp"))  # E: arg-type
    fmesh.spec_of(torch.zeros(2), r.mesh)  # E: arg-type
    fmesh.placements(r, fmesh.P("dp"))  # E: call-arg
    return spec


def elastic_misuse(m: fmesh.Mesh) -> object:
    fmesh.shrink(m, {3}, "dp")  # E: call-arg
    fmesh.shrink(m, {3})  # E: call-arg
    fmesh.shrink(m, {"3"}, axis="dp")  # E: arg-type
    fmesh.replace(m, [(3, 8)])  # E: arg-type
    fmesh.replace(m, {3: "8"})  # E: dict-item
    grown: int = fmesh.shrink(m, {3}, axis="dp")  # E: assignment
    return grown


def drop_in_misuse() -> object:
    from fmesh.device_mesh import init_device_mesh

    init_device_mesh("cpu", (2, 2), ("dp", "tp"))  # E: call-arg
    init_device_mesh("cpu", (2, "2"))  # E: arg-type
    init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", 3))  # E: arg-type
    init_device_mesh("cpu", (4,), backend_override={0: 3})  # E: dict-item
    named: str = init_device_mesh("cpu", (4,))  # E: assignment
    return named
