"""Keep training when a rank dies: in-process on the survivors, or by restarting smaller.

The model is a two-layer MLP whose weights are DTensors on a ``dp x tp`` mesh: tensor
parallel over ``tp`` (``w1`` split by rows, ``w2`` by columns), replicated over ``dp``;
the full batch of a fixed regression task is split over ``dp``. Data and initial
weights come from fixed seeds, so the loss is the same function of the weights on
any mesh and every rank can check it falls.

**In-process recovery** (``--nproc``): a rank is SIGKILLed at a given step; the
collectives of its peers fail; every surviving rank calls ``fmesh.recover`` (they agree
on who is lost), drops the data-parallel replica that lost a rank with
``fmesh.shrink(mesh, lost, axis="dp")``, realizes the smaller mesh, re-wraps its local
shards onto the new DeviceMesh (the dropped replica held copies only) and trains on::

    python examples/elastic.py --nproc 4 --kill 1@2 --steps 8

The survivors wait ``recover``'s timeout (twice ``--timeout``) for the dead rank to check
in. torch's store client logs the end of that wait as a warning on stderr,
``[c10d] waitForInput: socket ... timed out after 10000ms``: expected, it is how the
survivors learn that the rank is gone, and the example says so when it recovers.

Ranks the smaller mesh leaves out are survivors still: they stand by and make the same
``realize`` and ``recover`` calls as non-members, as every survivor must (a survivor
that stops making them is declared lost at the next recovery).

Every ``--every`` steps, and at the end, the ranks of the current mesh save a DCP
checkpoint of the DTensor state, with the mesh as JSON (``Mesh.to_json()``) and the step,
into ``--checkpoint DIR`` (default: a fresh temporary directory, which the launcher
prints).

**Restart** (``--resume``): a job restarted by torchrun on the ranks the saved mesh
holds reads that mesh, numbers its ranks ``0..K-1`` in their order (the saved mesh may
hold old ranks such as ``[2, 3]``), optionally splits the same ranks another way
(``--tp``), loads the checkpoint resharded onto it and trains on from the saved step::

    torchrun --standalone --nproc-per-node 2 examples/elastic.py \
        --resume DIR --steps 12 --tp 1

Why the in-process mode has its own launcher: torchrun's agent stops every worker as
soon as one fails (and, with ``--max-restarts``, starts the whole group again), so under
torchrun no survivor is left to carry on; its restart is what ``--resume`` serves.
``--nproc`` starts the ranks itself and hosts the rendezvous store in the launching
process, which does not train -- as torchrun's agent hosts it
(``TORCHELASTIC_USE_AGENT_STORE``) -- because ``recover`` runs through the store, so the
store must outlive any rank. Production systems that keep survivors running bring
their own launch and control plane in the same way: torchft (a lighthouse server and
a manager per replica group decide membership at every step; the healthy replicas keep
training on reconfigurable process groups) and NVIDIA's Resiliency Extension
(``nvidia_resiliency_ext.inprocess.Wrapper`` restarts the training function inside the
surviving processes; its ``ft_launcher`` restarts workers within the job).

CPU and gloo only (``backend="gloo"``). Every step prints ``step S loss L mesh M`` from
the mesh's first rank. A worker exits 0 only if the loss fell at every step it saw and
the checks passed; the launcher exits 0 only if the killed rank died by SIGKILL and every
other rank exited 0.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import save
from torch.distributed.distributed_c10d import Store
from torch.distributed.tensor import DTensor

import fmesh
from fmesh import P

DIM, HIDDEN, OUT, SAMPLES = 16, 32, 4, 96  # SAMPLES: divisible by dp = 1, 2, 3, 4, 6, 8
LR, MOMENTUM = 0.2, 0.5
SPECS = {"w1": P("tp"), "w2": P(None, "tp")}
"""How each weight is split: over ``tp``, replicated over ``dp`` (the axis not named)."""
State = dict[str, DTensor]
"""The training state: each weight and its momentum (same spec), all DTensors."""
FAILURES = (RuntimeError, CheckpointException)
"""What a failed collective raises: torch's DistError (a RuntimeError), or DCP's
CheckpointException (a BaseException) when it happens inside a save or load."""
KEY = "examples/elastic/"
"""Prefix of this example's keys in the job's store."""
STAND_BY = datetime.timedelta(hours=1)
"""How long a rank out of the mesh waits for the members to finish or fail."""
TCPStore = dist.TCPStore  # type: ignore[attr-defined]  # public, but re-exported implicitly


# -- the task: plain tensors, the same on every rank ------------------------------------


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of a fixed teacher network (seeded, so equal on every rank)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, DIM, generator=gen)
    teacher1 = torch.randn(HIDDEN, DIM, generator=gen) / DIM**0.5
    teacher2 = torch.randn(OUT, HIDDEN, generator=gen) / HIDDEN**0.5
    return x, torch.relu(x @ teacher1.T) @ teacher2.T


def initial_state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    w1 = torch.randn(HIDDEN, DIM, generator=gen) / DIM**0.5
    w2 = torch.randn(OUT, HIDDEN, generator=gen) / HIDDEN**0.5
    return {
        "w1": w1,
        "w2": w2,
        "momentum.w1": torch.zeros_like(w1),
        "momentum.w2": torch.zeros_like(w2),
    }


def spec(name: str) -> fmesh.PartitionSpec:
    return SPECS[name.removeprefix("momentum.")]


# -- one training step on DTensors ------------------------------------------------------


def as_dtensor(t: torch.Tensor) -> DTensor:
    """DTensor ops return DTensors; torch's annotations say Tensor."""
    assert isinstance(t, DTensor), type(t)
    return t


def train_step(state: State, x: DTensor, y: DTensor, mesh: fmesh.Mesh) -> float:
    """One full-batch step of SGD with momentum; the loss before it.

    Every collective happens before the update, so a step that fails changes nothing
    and the survivors can run it again on the smaller mesh.
    """
    weights = [state["w1"], state["w2"]]
    hidden = torch.relu(x @ weights[0].T)  # column-parallel: hidden units split over tp
    out = as_dtensor(hidden @ weights[1].T)  # row-parallel: partial sums over tp
    out = out.redistribute(placements=fmesh.placements(mesh, P("dp"), out.ndim))
    loss = as_dtensor(((out - y) ** 2).mean())
    grads = torch.autograd.grad(loss, weights)
    # Each dp replica saw its share of the batch: summing the shares to the weights'
    # placements is data parallel's gradient all-reduce.
    reduced = [
        as_dtensor(g).redistribute(placements=w.placements) for g, w in zip(grads, weights)
    ]
    value = loss.full_tensor().item()
    with torch.no_grad():  # local from here on: the step commits on every rank alike
        for name, grad in zip(("w1", "w2"), reduced):
            velocity = state[f"momentum.{name}"]
            velocity.mul_(MOMENTUM).add_(grad)
            state[name].sub_(LR * velocity)
    return value


# -- meshes: realize, and move the state onto a new one --------------------------------


def realize_mesh(
    mesh: fmesh.Mesh, timeout: datetime.timedelta
) -> tuple[fmesh.RealizedMesh, fmesh.RealizedMesh]:
    """The mesh's groups, and one group over all its ranks (for DCP).

    Every survivor makes these calls, members and non-members alike: a call that
    creates a group agrees with every survivor first.
    """
    realized = fmesh.realize(mesh, backend="gloo", timeout=timeout)
    everyone = fmesh.flatten(mesh, mesh.axis_names, "ranks")
    return realized, fmesh.realize(everyone, backend="gloo", timeout=timeout)


def to_dtensors(tensors: dict[str, torch.Tensor], realized: fmesh.RealizedMesh) -> State:
    """Full tensors (equal on every rank) -> DTensors; no communication."""
    state = {
        name: fmesh.distribute(t, realized, spec(name), src_data_rank=None)
        for name, t in tensors.items()
    }
    for name in SPECS:  # the weights; their momentum needs no gradient
        state[name].requires_grad_()
    return state


def rewrap(state: State, old: fmesh.Mesh, new: fmesh.RealizedMesh) -> State:
    """This rank's shards as DTensors on the new mesh's DeviceMesh.

    ``shrink`` along ``dp`` keeps every rank's ``tp`` coordinate, so each shard is still
    the right piece of its tensor; only the replicas (copies) went away.
    """
    before, after = fmesh.coordinate(old, new.rank), new.coordinate
    assert before is not None and after is not None  # a member of both meshes
    if before[old.axis_index("tp")] != after[new.mesh.axis_index("tp")]:
        raise RuntimeError(f"rank {new.rank} moved along tp: {before} -> {after}")
    device_mesh = new.to_device_mesh("cpu")
    out: State = {}
    with torch.no_grad():
        for name, t in state.items():
            out[name] = DTensor.from_local(
                t.to_local(),
                device_mesh,
                fmesh.placements(new.mesh, spec(name), t.ndim),
                run_check=False,
                shape=t.shape,
                stride=t.stride(),
            )
    for name in SPECS:
        out[name].requires_grad_()
    return out


def first(realized: fmesh.RealizedMesh) -> bool:
    """Whether this rank is the mesh's first (it prints and writes files)."""
    return realized.coordinate is not None and not any(realized.coordinate)


# -- checkpoints: DCP shards, plus the mesh as JSON -------------------------------------


def weighted_sum(t: torch.Tensor) -> float:
    """A position-weighted sum: a value in the wrong place changes it."""
    flat = t.detach().double().flatten()
    return float(flat @ torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64))


def checksum(t: DTensor) -> float:
    """The full tensor's weighted sum (a collective over the tensor's mesh)."""
    return weighted_sum(t.full_tensor())


def save_checkpoint(
    directory: Path,
    step: int,
    loss: float,
    state: State,
    realized: fmesh.RealizedMesh,
    everyone: fmesh.RealizedMesh,
) -> None:
    """``directory/step-S``: DCP files, ``mesh.json`` and ``train.json``; then ``latest``
    names it. Only the ranks of the mesh take part (over ``everyone``'s group: the
    default group still holds lost ranks)."""
    path = directory / f"step-{step}"
    save(dict(state), checkpoint_id=path, process_group=everyone.group("ranks"))
    sums = {name: checksum(t) for name, t in state.items()}
    if first(realized):  # DCP's coordinator: it wrote the metadata last
        (path / "mesh.json").write_text(realized.mesh.to_json())
        meta = {"step": step, "loss": loss, "checksums": sums}
        (path / "train.json").write_text(json.dumps(meta, indent=1))
        tmp = directory / "latest.tmp"
        tmp.write_text(path.name)
        tmp.replace(directory / "latest")  # atomic: a complete checkpoint or none
        print(f"checkpoint: {step} steps done -> {path} (mesh {realized.mesh!r})", flush=True)


def saved_mesh(
    directory: Path, world: int, tp: int | None
) -> tuple[Path, fmesh.Mesh, fmesh.Mesh]:
    """The latest checkpoint, its mesh, and that mesh on this world: its ranks numbered
    0..K-1 in order, split as ``dp x tp`` when ``tp`` is given."""
    path = directory / (directory / "latest").read_text().strip()
    saved = fmesh.Mesh.from_json((path / "mesh.json").read_text())
    old_ranks = sorted(int(r) for r in fmesh.instances(saved).flat)
    if world != len(old_ranks):
        raise SystemExit(
            f"{path} was saved by {len(old_ranks)} ranks ({saved!r}); restart with "
            f"torchrun --standalone --nproc-per-node {len(old_ranks)} {sys.argv[0]} "
            f"--resume {directory}"
        )
    # Pure and equal on every rank: old rank old_ranks[i] becomes rank i.
    mesh = fmesh.replace(saved, dict(zip(old_ranks, range(world))))
    if tp is not None and tp != mesh.shape["tp"]:
        if world % tp:
            raise SystemExit(f"--tp {tp} does not divide the {world} ranks")
        ranks = fmesh.flatten(mesh, ("dp", "tp"), "ranks")
        mesh = fmesh.unflatten(ranks, "ranks", {"dp": world // tp, "tp": tp})
    return path, saved, mesh


def load_checkpoint(
    path: Path, realized: fmesh.RealizedMesh, everyone: fmesh.RealizedMesh
) -> tuple[State, int, float]:
    """The saved state resharded onto ``realized``'s mesh; the step and loss it saved.

    DCP reads each rank's pieces of the saved shards, whatever the split it was saved
    with; the checksums show that every value came back to its place.
    """
    meta = json.loads((path / "train.json").read_text())
    zeros = {name: torch.zeros_like(t) for name, t in initial_state().items()}
    state = to_dtensors(zeros, realized)  # the right shapes and splits; values follow
    with torch.no_grad():
        load(dict(state), checkpoint_id=path, process_group=everyone.group("ranks"))
    for name, t in state.items():
        got, want = checksum(t), meta["checksums"][name]
        if not math.isclose(got, want, rel_tol=1e-9):
            raise RuntimeError(f"{name}: checksum {got} after loading, {want} when saved")
    return state, int(meta["step"]), float(meta["loss"])


def replicas_agree(state: State, realized: fmesh.RealizedMesh) -> bool:
    """Every dp replica holds the same shards, bit for bit."""
    local = torch.tensor(
        [weighted_sum(t.to_local()) for t in state.values()], dtype=torch.float64
    )
    high, low = local.clone(), local.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=realized.group("dp"))
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=realized.group("dp"))
    return torch.equal(high, low)


# -- the worker: train, and recover in-process when a peer dies -------------------------


def recover_and_shrink(
    mesh: fmesh.Mesh, error: BaseException, timeout: datetime.timedelta
) -> tuple[set[int], fmesh.Mesh, fmesh.RealizedMesh, fmesh.RealizedMesh]:
    """After a failed collective: agree with the other survivors on who is lost, drop
    the dp replicas that lost a rank, and realize what is left."""
    lost: set[int] = set()
    while True:
        # Longer than a collective's timeout: a survivor still stuck in a collective
        # with a rank that already left for recover() must make it in time.
        now = fmesh.recover(timeout=2 * timeout)
        if not now:
            raise RuntimeError("a collective failed, but no rank was lost") from error
        lost |= now
        mesh = fmesh.shrink(
            mesh, {r for r in now if fmesh.coordinate(mesh, r) is not None}, axis="dp"
        )
        try:
            realized, everyone = realize_mesh(mesh, timeout)
        except fmesh.MeshMismatchError as err:  # another survivor died meanwhile
            error = err
            continue
        return lost, mesh, realized, everyone


def stand_by(store: Store, recoveries: int) -> str:
    """Out of the mesh: wait until its members finish (``"done"``) or fail (``"recover"``)."""
    key = f"{KEY}event/{recoveries}"
    store.wait([key], STAND_BY)
    value: bytes = store.get(key)
    return value.decode()


def worker(args: argparse.Namespace) -> int:
    """One rank: train on the mesh; when a peer dies, recover, shrink and train on (or,
    left out of the smaller mesh, stand by). Under torchrun too: ``--resume``."""
    code = train_or_stand_by(args)
    # Tear the groups down before the interpreter does: gloo's worker threads may still
    # hold the tensors of a collective that failed, and freeing them during interpreter
    # shutdown can abort the process.
    fmesh.destroy()
    dist.destroy_process_group()
    return code


def train_or_stand_by(args: argparse.Namespace) -> int:
    """Members train until ``--steps``, saving checkpoints; ranks out of the mesh wait.
    A failure sends every survivor, member or not, through ``recover_and_shrink``."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=args.timeout)  # realize's, hence the collectives'
    # The launcher's store (torchrun's agent's under torchrun): it outlives every rank.
    store = TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False
    )
    full_x, full_y = dataset()
    directory: Path | None = args.checkpoint or args.resume
    if args.resume is None:
        mesh = fmesh.make_mesh({"dp": world // args.tp, "tp": args.tp})
        realized, everyone = realize_mesh(mesh, timeout)
        state, step, last_loss = to_dtensors(initial_state(), realized), 0, math.inf
    else:
        path, saved, mesh = saved_mesh(args.resume, world, args.tp)
        realized, everyone = realize_mesh(mesh, timeout)
        state, step, last_loss = load_checkpoint(path, realized, everyone)
        if first(realized):
            print(
                f"resumed at step {step} from {path}: saved on {saved!r}, now {mesh!r}",
                flush=True,
            )
    losses: list[float] = []
    recoveries = 0
    while True:
        if realized.coordinate is None:
            if stand_by(store, recoveries) == "done":
                return 0
            error: BaseException = RuntimeError("the mesh's members failed")
        else:
            x = fmesh.distribute(full_x, realized, P("dp"), src_data_rank=None)
            y = fmesh.distribute(full_y, realized, P("dp"), src_data_rank=None)
            try:
                while step < args.steps:
                    if (rank, step) == args.kill:  # the demo's fault: this rank dies now
                        os.kill(os.getpid(), signal.SIGKILL)
                    loss = train_step(state, x, y, mesh)
                    losses.append(loss)
                    if first(realized):
                        print(f"step {step} loss {loss:.6f} mesh {mesh!r}", flush=True)
                    step += 1
                    if directory and (step % args.every == 0 or step == args.steps):
                        save_checkpoint(directory, step, loss, state, realized, everyone)
                agree = replicas_agree(state, realized)
            except FAILURES as err:
                store.compare_set(f"{KEY}event/{recoveries}", "", "recover")
                error = err
                if first(realized):
                    print(
                        f"a collective failed: recovering; fmesh.recover waits "
                        f"{2 * args.timeout:g}s for ranks that never check in (c10d "
                        "logs the end of that wait as a 'waitForInput ... timed out' "
                        "warning: expected)",
                        flush=True,
                    )
            else:
                store.compare_set(f"{KEY}event/{recoveries}", "", "done")
                dist.barrier(group=everyone.group("ranks"))  # done with every group
                return report(realized, last_loss, losses, agree)
        old = mesh
        lost, mesh, realized, everyone = recover_and_shrink(mesh, error, timeout)
        recoveries += 1
        if realized.coordinate is not None:
            state = rewrap(state, old, realized)
        if first(realized):
            print(
                f"recovered: lost ranks {sorted(lost)}; mesh {old!r} -> {mesh!r}", flush=True
            )
        elif realized.coordinate is None and fmesh.coordinate(old, rank) is not None:
            print(f"rank {rank}: not in {mesh!r}; standing by", flush=True)


def report(
    realized: fmesh.RealizedMesh, last_loss: float, losses: list[float], agree: bool
) -> int:
    """0 if the loss fell at every step (from the checkpoint's, on a restart) and the
    dp replicas agree."""
    fell = all(b < a for a, b in itertools.pairwise([last_loss, *losses]))
    if first(realized):
        trained = (
            f"{len(losses)} steps, loss {losses[0]:.6f} -> {losses[-1]:.6f}"
            if losses
            else "no step left to train"
        )
        print(
            f"done: {trained}, fell at every step: {fell}, replicas agree: {agree}, "
            f"mesh {realized.mesh!r}",
            flush=True,
        )
    return 0 if fell and agree else 1


# -- the launcher: ranks that outlive a dead peer ---------------------------------------


def launch(args: argparse.Namespace) -> int:
    """Start ``--nproc`` workers with torchrun's environment; host their store here."""
    n: int = args.nproc
    if args.checkpoint is None:
        args.checkpoint = Path(tempfile.mkdtemp(prefix="fmesh-elastic-"))
    print(f"launcher: checkpoints go to {args.checkpoint}", flush=True)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {
        **os.environ,
        "WORLD_SIZE": str(n),
        "LOCAL_WORLD_SIZE": str(n),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",  # ranks join this store, host none
    }
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    argv = [sys.executable, __file__, "--steps", str(args.steps), "--tp", str(args.tp)]
    argv += ["--every", str(args.every), "--timeout", str(args.timeout)]
    if args.checkpoint is not None:
        argv += ["--checkpoint", str(args.checkpoint)]
    if args.kill is not None:
        argv += ["--kill", "{}@{}".format(*args.kill)]
    procs = [
        subprocess.Popen(argv, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
        for r in range(n)
    ]
    codes = [p.wait() for p in procs]
    killed = {args.kill[0]} if args.kill is not None else set()
    print(f"launcher: exit codes by rank {codes}", flush=True)
    expected = [-signal.SIGKILL if r in killed else 0 for r in range(n)]
    return 0 if codes == expected else 1


def rank_at_step(text: str) -> tuple[int, int]:
    rank, _, step = text.partition("@")
    return int(rank), int(step)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, help="start this many ranks (in-process mode)")
    parser.add_argument("--resume", type=Path, help="restart from this checkpoint directory")
    parser.add_argument(
        "--checkpoint",
        "--checkpoint-dir",
        type=Path,
        help="save checkpoints here (--nproc default: a fresh temporary directory)",
    )
    parser.add_argument("--steps", type=int, default=8, help="train up to this step")
    parser.add_argument(
        "--tp", type=int, help="tensor-parallel size (default 2; resume: as saved)"
    )
    parser.add_argument("--every", type=int, default=4, help="checkpoint every N steps")
    parser.add_argument(
        "--kill", type=rank_at_step, metavar="RANK@STEP", help="SIGKILL a rank"
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="collective timeout, s")
    args = parser.parse_args()
    if args.resume is None and args.tp is None:
        args.tp = 2
    if args.nproc is not None:
        if args.resume is not None:
            parser.error(
                "--resume runs under torchrun: torchrun --standalone --nproc-per-node K"
            )
        if args.nproc % args.tp:
            parser.error(f"--tp {args.tp} must divide --nproc {args.nproc}")
        return launch(args)
    if "RANK" not in os.environ:
        parser.error("start the ranks with --nproc N, or under torchrun with --resume DIR")
    if args.resume is None and int(os.environ["WORLD_SIZE"]) % args.tp:
        parser.error(f"--tp {args.tp} must divide the world size {os.environ['WORLD_SIZE']}")
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())
