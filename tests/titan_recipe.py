"""torchtitan's ``ParallelDims.build_mesh`` as a sequence of torch DeviceMesh calls,
shared by the tests that run it through torch and through fmesh's drop-in, and the
model the training tests train on those meshes."""

from __future__ import annotations

from typing import Any, cast

import fmesh

__all__ = [
    "CONFIG",
    "OTHER",
    "WORLD",
    "build",
    "count_new_group",
    "fmesh_views",
    "full_params",
    "mlp",
    "register_fake",
    "sgd_losses",
    "tp_plan",
]

WORLD = 4

# (pp, dp_replicate, dp_shard, cp, tp): torchtitan's dims, on 4 ranks.
CONFIG = (1, 1, 2, 1, 2)
OTHER = (1, 2, 2, 1, 1)


def build(init: Any, config: tuple[int, ...]) -> dict[str, Any]:
    """ParallelDims.build_mesh's calls (torchtitan, spmd_types branch), through
    ``init``: a 1-d world, unflattened into its views ("fake" for size-1 dims), a
    flattened loss mesh and the single-axis slices. Returns the meshes by name."""
    register_fake()
    pp, dp_replicate, dp_shard, cp, tp = config
    world = init("cpu", (WORLD,), mesh_dim_names=("world",))

    def unflatten(names: tuple[str, ...], sizes: tuple[int, ...]) -> Any:
        fake = {n: "fake" for n, s in zip(names, sizes) if s == 1 and n != "dp_shard"}
        return world._unflatten(0, sizes, names, backend_override=fake)

    batch = dp_replicate * dp_shard
    loading = unflatten(("pp", "batch", "cp", "tp"), (pp, batch, cp, tp))
    loss = loading["batch", "cp"]._flatten("loss_mesh")
    dense = unflatten(
        ("pp", "dp_replicate", "dp_shard", "cp", "tp"), (pp, dp_replicate, dp_shard, cp, tp)
    )
    fwdbwd = unflatten(("pp", "dp", "cp", "tp"), (pp, batch, cp, tp))["dp", "cp", "tp"]
    return {
        "world": world,
        "pp": loading["pp"],
        "batch": loading["batch"],
        "loss": loss,
        "cp": loading["cp"],
        "tp": loading["tp"],
        "dp_replicate": dense["dp_replicate"],
        "dp_shard": dense["dp_shard"],
        "dp": fwdbwd["dp"],
        "dense": dense,
    }


def register_fake() -> None:
    """The "fake" backend torchtitan asks for disabled dims (registered on import)."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401


def fmesh_views(config: tuple[int, ...]) -> list[tuple[fmesh.Mesh, dict[str, str]]]:
    """The same views with fmesh's own API, and the backends ``build`` asks for."""
    pp, dp_replicate, dp_shard, cp, tp = config
    world = fmesh.make_mesh({"world": WORLD})
    batch = dp_replicate * dp_shard

    def view(
        names: tuple[str, ...], sizes: tuple[int, ...]
    ) -> tuple[fmesh.Mesh, dict[str, str]]:
        fake = {n: "fake" for n, s in zip(names, sizes) if s == 1 and n != "dp_shard"}
        return fmesh.unflatten(world, "world", dict(zip(names, sizes))), fake

    loading = view(("pp", "batch", "cp", "tp"), (pp, batch, cp, tp))
    return [
        (world, {}),
        loading,
        (fmesh.flatten(loading[0]["batch", "cp"], ("batch", "cp"), "loss_mesh"), {}),
        view(
            ("pp", "dp_replicate", "dp_shard", "cp", "tp"),
            (pp, dp_replicate, dp_shard, cp, tp),
        ),
        view(("pp", "dp", "cp", "tp"), (pp, batch, cp, tp)),
    ]


def count_new_group() -> list[int]:
    """Count torch's ``new_group`` calls from here on (fmesh makes none)."""
    import torch.distributed as dist
    from torch.distributed import device_mesh, distributed_c10d

    calls = [0]
    previous = dist.new_group

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return previous(*args, **kwargs)

    # DeviceMesh calls the name it imported from distributed_c10d.
    dist.new_group = distributed_c10d.new_group = counting
    cast(Any, device_mesh).new_group = counting
    return calls


def sgd_losses(model: Any, seed: int, steps: int = 2) -> list[float]:
    """A few SGD steps on inputs seeded by ``seed`` (equal where the inputs must be)."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        torch.manual_seed(1000 + 10 * step + seed)
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def mlp() -> Any:
    """A two-layer MLP, seeded: every rank and every run starts from the same weights."""
    import torch
    from torch import nn

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1 = nn.Linear(8, 16)
            self.w2 = nn.Linear(16, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.w2(torch.relu(self.w1(x)))
            return out

    torch.manual_seed(0)
    return MLP()


def tp_plan() -> dict[str, Any]:
    """torch's tensor-parallel plan for ``mlp``: column-wise, then row-wise."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"w1": ColwiseParallel(), "w2": RowwiseParallel()}


def full_params(model: Any) -> dict[str, list[Any]]:
    """Every parameter, gathered (DTensor) or as is."""
    from torch.distributed.tensor import DTensor

    return {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().tolist()
        for name, p in model.named_parameters()
    }
