"""Train a tiny model with FSDP2 over a ``dp`` axis and tensor parallel over ``tp``.

Both meshes come from one fmesh value, composed functionally:
``make_mesh({"world": N})`` -> ``unflatten`` into ``dp x tp`` -> ``realize`` ->
``to_device_mesh()``, sliced by name for ``fully_shard`` and ``parallelize_module``.

Run (no init_process_group needed, ``realize`` initializes the default group from the
torchrun environment):

    torchrun --standalone --nproc-per-node 4 examples/train_fsdp_tp.py

``--device auto`` (the default) uses CUDA/NCCL when every local rank has a GPU of its
own, else CPU/gloo, so the command works unchanged on a machine with fewer GPUs than
ranks; ``--device cpu`` or ``--device cuda`` forces one.

The task is fixed and identical on every rank: map each token to a secret
permutation of the vocabulary. Exits 0 only if the loss fell.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    loss_parallel,
    parallelize_module,
)

import fmesh

VOCAB, DIM, HIDDEN, BATCH, SEQ = 64, 64, 256, 32, 16


class Block(nn.Module):
    """Attention-free residual MLP block: the classic Colwise -> Rowwise TP pair."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.down(torch.relu(self.up(self.norm(x))))
        return x + h


class TinyModel(nn.Module):
    def __init__(self, n_blocks: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(n_blocks))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x: torch.Tensor = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(x)
        return logits


def tp_plan(n_blocks: int) -> dict[str, ParallelStyle]:
    plan: dict[str, ParallelStyle] = {
        "embed": RowwiseParallel(input_layouts=Replicate()),
        # Logits stay sharded over the vocabulary (a DTensor) for loss_parallel().
        "head": ColwiseParallel(use_local_output=False),
    }
    for i in range(n_blocks):
        plan[f"blocks.{i}.up"] = ColwiseParallel()
        plan[f"blocks.{i}.down"] = RowwiseParallel()
    return plan


def mesh_size_error(world: int, tp: int, dp: int | None, script: str) -> str:
    """What to say when ``dp x tp`` is not the world size: what was given, two fixes."""
    fits = ", ".join(str(t) for t in range(1, world + 1) if world % t == 0)
    if dp is None:  # dp defaults to world // tp: only --tp was given (or its default)
        nproc = tp * max(world // tp, 1)
        return (
            f"--tp {tp} does not divide the world size {world} (torchrun's "
            f"--nproc-per-node); launch a multiple of {tp} processes, e.g. torchrun "
            f"--standalone --nproc-per-node {nproc} {script} --tp {tp}, or keep "
            f"{world} processes and pass a --tp that divides {world}: {fits}"
        )
    return (
        f"--dp {dp} x --tp {tp} is {dp * tp} ranks, but the world size is {world} "
        f"(torchrun's --nproc-per-node); launch {dp * tp} processes: torchrun "
        f"--standalone --nproc-per-node {dp * tp} {script} --dp {dp} --tp {tp}, or keep "
        f"{world} processes and pick --dp and --tp whose product is {world} "
        f"(--tp one of {fits}, and --dp {world} // tp)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--dp", type=int, default=None, help="default: world // tp")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tp: int = args.tp
    dp: int = args.dp if args.dp is not None else max(world // tp, 1)
    if dp * tp != world:
        parser.error(mesh_size_error(world, tp, args.dp, sys.argv[0]))

    # Pure and identical on every rank: a value, no process groups yet.
    world_mesh = fmesh.make_mesh({"world": world})
    mesh = fmesh.unflatten(world_mesh, "world", {"dp": dp, "tp": tp})
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    use_cuda = args.device == "cuda" or (
        args.device == "auto" and torch.cuda.device_count() >= local_ranks
    )
    # realize() initializes the default group from the torchrun environment: NCCL with
    # this rank's GPU bound, or gloo when asked for.
    realized = fmesh.realize(mesh, backend=None if use_cuda else "gloo")
    rank = realized.rank
    device = (
        torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    )
    dm = realized.to_device_mesh("cuda" if use_cuda else "cpu")
    if rank == 0:
        undone = fmesh.flatten(mesh, ("dp", "tp"), "world") == world_mesh
        print(f"mesh: {mesh!r}  flatten(mesh) == {world_mesh!r}: {undone}")
        print(f"device mesh: {dm}")
        joined = {a: dist.get_process_group_ranks(realized.group(a)) for a in mesh.axis_names}
        print(
            f"rank {rank} coordinate {realized.coordinate} groups: "
            + " ".join(f"{a}={g}" for a, g in joined.items()),
            flush=True,
        )

    torch.manual_seed(0)  # same initial weights on every rank
    n_blocks = 2
    model = TinyModel(n_blocks).to(device)
    parallelize_module(model, dm["tp"], tp_plan(n_blocks))
    for block in model.blocks:
        fully_shard(block, mesh=dm["dp"])
    fully_shard(model, mesh=dm["dp"])
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)

    # Every rank draws the same global batch; each dp coordinate trains on its share,
    # so the tp ranks of one dp group see the same tokens.
    data = torch.Generator().manual_seed(1234)
    secret = torch.randperm(VOCAB, generator=data)
    dp_index, dp_group = realized.local_rank("dp"), realized.group("dp")
    losses: list[float] = []
    for step in range(args.steps):
        tokens = torch.randint(VOCAB, (BATCH * dp, SEQ), generator=data)
        mine = tokens.chunk(dp)[dp_index]
        logits = model(mine.to(device))
        with loss_parallel():  # cross entropy over vocab-sharded logits
            loss = nn.functional.cross_entropy(
                logits.flatten(0, 1), secret[mine].flatten().to(device)
            )
            torch.autograd.backward(loss)  # == loss.backward(), which is untyped
        optim.step()
        optim.zero_grad()
        local = loss.full_tensor() if isinstance(loss, DTensor) else loss
        total = local.detach().clone()
        dist.all_reduce(total, group=dp_group)  # SUM (gloo has no AVG)
        losses.append(total.item() / dp)
        if rank == 0:
            print(f"step {step:3d} loss {losses[-1]:.4f}", flush=True)

    fell = losses[-1] < losses[0]
    if rank == 0:
        print(f"loss: first={losses[0]:.4f} last={losses[-1]:.4f} fell={fell}")
    # Every rank is done with every group before any rank tears one down.
    dist.barrier()
    fmesh.destroy()
    dist.destroy_process_group()
    return 0 if fell else 1


if __name__ == "__main__":
    sys.exit(main())
