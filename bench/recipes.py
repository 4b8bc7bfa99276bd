"""The meshes a trainer builds, written once for fmesh and once for torch.

fmesh's side uses only the public API (values composed with pure operations, then
``fmesh.realize``), so the rows measure whatever the implementation becomes; torch's
side is in :mod:`bench.torch_ref`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import fmesh

from . import torch_ref
from .shared import EXPERT_NAMES, FLATTENS, NAMES, TRAINER_FLATTENS, expert_shape


def fmesh_trainer5(shape: Sequence[int]) -> object:
    """realize the 5-d mesh and the 1-d mesh of each of its three flattens."""
    mesh = fmesh.make_mesh(dict(zip(NAMES, shape, strict=True)))
    realized = [fmesh.realize(mesh)]
    for axes, name in FLATTENS:
        realized.append(fmesh.realize(fmesh.slice(fmesh.flatten(mesh, axes, name), name)))
    return realized


def fmesh_titan(shape: Sequence[int]) -> object:
    """torchtitan's meshes as one value: the world, unflattened twice, flattened."""
    root = fmesh.make_mesh({"world": math.prod(shape)})
    dense = fmesh.unflatten(root, "world", dict(zip(NAMES, shape, strict=True)))
    expert = fmesh.unflatten(
        root, "world", dict(zip(EXPERT_NAMES, expert_shape(shape), strict=True))
    )
    realized = [fmesh.realize(m) for m in (root, dense, expert)]
    for axes, name in TRAINER_FLATTENS:
        realized.append(fmesh.realize(fmesh.slice(fmesh.flatten(dense, axes, name), name)))
    return realized


def fmesh_world_1d(shape: Sequence[int]) -> object:
    return fmesh.realize(fmesh.make_mesh({"world": math.prod(shape)}))


@dataclass(frozen=True)
class Recipe:
    """A set of meshes to realize, for both libraries, at a given world size."""

    key: str
    label: str
    fmesh: Callable[[Sequence[int]], object]
    """Realizes the meshes of a dense 5-d shape; returns what must stay alive."""
    torch: Callable[[Sequence[int]], object]
    torch_note: str


TRAINER5 = Recipe(
    "trainer5",
    "realize + 3 flattens",
    fmesh_trainer5,
    torch_ref.trainer5,
    "init_device_mesh + 3 _flatten calls",
)
TITAN = Recipe(
    "titan",
    "torchtitan's trainer meshes (world, dense, expert, 3 flattens)",
    fmesh_titan,
    torch_ref.titan,
    "1-d init_device_mesh, _unflatten into dense and expert views, 3 _flatten calls",
)
WORLD_1D = Recipe(
    "world_1d",
    "a 1-d mesh over the whole world",
    fmesh_world_1d,
    torch_ref.world_1d,
    "init_device_mesh of the 1-d world",
)
RECIPES = {r.key: r for r in (TRAINER5, TITAN, WORLD_1D)}
