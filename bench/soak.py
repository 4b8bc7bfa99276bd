"""A soak on 4 gloo ranks: leaks and crash rates, not timings (not a ``python -m bench``
section, and nothing here is written to ``results.*``).

::

    python -m bench.soak                           # leaks, then 40 trainings a side
    python -m bench.soak --cycles 0 --builds 0 --jobs 2 --steps 3   # a pilot
    python -m bench.soak --cycles 0 --builds 0 --jobs 40 --out soak.json

1. **Realize/destroy cycles**: every rank realizes a ``dp x tp`` mesh (a creating call:
   agreement, the liveness watch, gloo groups) and destroys it, ``--cycles`` times.
2. **Drop-in builds with torch's own methods**: ``fmesh.device_mesh.init_device_mesh``,
   then torch's ``_flatten`` and ``_unflatten`` on the result (routed into realize),
   then ``fmesh.destroy()``, ``--builds`` times.

Each rank reports its open file descriptors, threads and RSS at the start, after the
cycles, and at the end (before and after a garbage collection).

3. **Crash rates, side by side**: torchtitan's llama3 debug model trained with FSDP2 x
   tensor parallelism on 2 x 2 (``spmd_backend="partial_dtensor"``, bf16 parameters,
   fp32 reductions, grad-norm clipping, AdamW), ``--jobs`` jobs of ``--steps`` steps a
   side, alternating sides so that the machine's load falls on both alike.
   ``ParallelDims.build_mesh``'s ``init_device_mesh`` is torch's, or fmesh's (the
   one-import change). Two CPU stand-ins: FlexAttention (no backward on CPU) runs as
   causal ``scaled_dot_product_attention`` on the same tensors, and FSDP's
   ``PREMUL_SUM`` (not in gloo) as a sum. A job ends ``ok``, ``native_abort`` (a rank
   killed by SIGABRT; glibc's message read from its stderr), ``other_failure`` or
   ``timeout``; a dead rank's peers are killed 20 s later. Rates and their test:
   :mod:`bench.soak_rates`; see ``docs/troubleshooting.md``. Needs torchtitan at commit
   b5bcd76c6 beside torch, installed so as to keep that torch: ``pip install --no-deps
   -e <torchtitan checkout> spmd-types==0.2.3`` and ``pip install tyro``.

Writes one JSON document (``--out``, rewritten after every job) and prints a summary.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import gc
import importlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from . import launch, torch_ref
from .shared import Json, rss_kib
from .soak_rates import SIDES, rates, summary

WORLD = 4
GRACE_S = 20.0
"""How long the peers of a dead rank may go on before they are killed."""
NATIVE = re.compile(
    r"^(?:\w+\(\): .+|double free or corruption.*|corrupted .+|terminate called .+)$",
    re.MULTILINE,
)
"""glibc's and the runtime's fatal messages (``malloc(): unaligned tcache chunk ...``)."""


def _usage() -> Json:
    rss_mb, fds = round(rss_kib()[0] / 1024, 1), len(os.listdir("/proc/self/fd"))
    return {"fds": fds, "threads": threading.active_count(), "rss_mb": rss_mb}


def soak_worker(spec: Json) -> Json:
    """One rank: realize/destroy cycles, then drop-in builds; usage before and after."""
    import fmesh
    from fmesh.device_mesh import init_device_mesh

    rank = int(os.environ["RANK"])
    path = Path(spec["dir"]) / f"soak-rank{rank}.txt"
    faulthandler.enable(file=open(path, "w"))  # noqa: SIM115 - kept open for a crash
    torch_ref.init_gloo(spec)
    out = {"rank": rank, "start": _usage()}
    mesh = fmesh.make_mesh({"dp": 2, "tp": 2})
    timeout = datetime.timedelta(seconds=60)
    created = 0
    t0 = time.monotonic()
    for _ in range(spec["cycles"]):
        created += fmesh.realize(mesh, timeout=timeout).created
        fmesh.destroy()
    cycles_s = round(time.monotonic() - t0, 1)
    out["after_cycles"] = _usage()
    t0 = time.monotonic()
    for _ in range(spec["builds"]):
        dm = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        flat = dm["dp", "tp"]._flatten("dp_tp")
        flat._unflatten(0, (2, 2), ("a", "b"))
        del dm, flat
        fmesh.destroy()
    builds_s = round(time.monotonic() - t0, 1)
    # torch's DeviceMesh objects form reference cycles that hold their groups (and
    # gloo's sockets) until the collector runs: measure before and after it.
    out["end_before_gc"] = _usage()
    gc.collect()
    out |= {"end": _usage(), "groups_created_in_cycles": created}
    return out | {"cycles_s": cycles_s, "builds_s": builds_s}


def _causal_attention(self: object, q_TNH: Any, k_TNH: Any, v_TNH: Any, **kw: Any) -> Any:
    """FlexAttention's forward on CPU: causal attention over (tokens, heads, dim) (the
    names are FlexAttention's: its local_map reads them)."""
    import torch.nn.functional as F

    q, k, v = (t.transpose(0, 1) for t in (q_TNH, k_TNH, v_TNH))
    gqa = bool(kw.get("enable_gqa"))
    out = F.scaled_dot_product_attention(
        q, k, v, scale=kw.get("scale"), is_causal=True, enable_gqa=gqa
    )
    return out.transpose(0, 1)


def titan_worker(spec: Json) -> Json:
    """One rank: torchtitan's llama3 debug model, FSDP x TP on 2 x 2, ``spec["steps"]``."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    import fmesh
    import fmesh.device_mesh

    # The whole stderr to a file: glibc writes its abort message there, faulthandler
    # the Python stacks.
    path = Path(spec["dir"]) / f"{spec['name']}-rank{os.environ['RANK']}.txt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable()
    torch.set_num_threads(1)  # torchrun's OMP_NUM_THREADS=1
    t0 = time.monotonic()
    torch_ref.init_gloo(spec)
    names = "config distributed.parallel_dims distributed.utils models.llama3"
    names += " models.llama3.sharding models.common.attention"
    tt: dict[str, Any] = {m: importlib.import_module(f"torchtitan.{m}") for m in names.split()}
    dims = tt["distributed.parallel_dims"]
    dims.device_type = "cpu"
    if spec["maker"] == "fmesh":  # the one-import change
        dims.init_device_mesh = fmesh.device_mesh.init_device_mesh
    tt["models.common.attention"].FlexAttention.forward = _causal_attention
    tt["distributed.utils"].set_spmd_backend("partial_dtensor")
    parallelism = tt["config"].ParallelismConfig(
        spmd_backend="partial_dtensor", data_parallel_shard_degree=2, tensor_parallel_degree=2
    )
    parallel_dims = dims.ParallelDims(
        dp_replicate=1, dp_shard=2, cp=1, tp=2, pp=1, ep=1, world_size=WORLD,
        spmd_backend="partial_dtensor",
    )  # fmt: skip
    parallel_dims.build_mesh()
    config = tt["models.llama3"].model_registry("debugmodel").model
    tt["models.llama3.sharding"].set_llama3_sharding_config(
        config, enable_sp=parallelism.enable_sequence_parallel
    )
    with torch.device("meta"):
        model = config.build()
    model = tt["models.llama3"].parallelize_llama(
        model,
        parallel_dims=parallel_dims,
        training=tt["config"].TrainingConfig(),
        parallelism=parallelism,
        compile_config=tt["config"].CompileConfig(),
        ac_config=None,
        dump_folder=spec["dir"],
    )
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=8e-4, betas=(0.9, 0.95), weight_decay=0.1)
    dp_rank = parallel_dims.get_mesh("batch").get_local_rank()
    setup_s, t0, losses = time.monotonic() - t0, time.monotonic(), []
    for step in range(spec["steps"]):
        gen = torch.Generator().manual_seed(1000 * step + dp_rank)
        tokens = torch.randint(0, config.vocab_size, (spec["tokens"] + 1,), generator=gen)
        pred = model(tokens[:-1])
        if isinstance(pred, DTensor):
            pred = pred.full_tensor()
        loss: Any = F.cross_entropy(pred.reshape(-1, pred.shape[-1]).float(), tokens[1:])
        loss.backward()
        tt["distributed.utils"].clip_grad_norm_(params, 1.0, foreach=True, pp_mesh=None)
        opt.step()
        opt.zero_grad()
        losses.append(round(loss.item(), 4))
    out = {"rank": int(os.environ["RANK"]), "losses": losses, "setup_s": round(setup_s, 1)}
    train_s = round(time.monotonic() - t0, 1)
    return out | {"fmesh_groups": fmesh.cache_stats().created, "train_s": train_s}


def _titan_job(spec: Json, limit_s: float) -> Json:
    """One training job: its outcome, wall time and every rank's fate."""
    t0 = time.monotonic()
    env = {"LIBC_FATAL_STDERR_": "1"}  # glibc's fatal messages to stderr, not the tty
    store, ranks = launch.start_job(titan_worker, WORLD, spec, limit_s, env)
    deadline = t0 + limit_s
    fates: dict[int, str] = {}
    results: dict[int, Json] = {}
    dead: list[tuple[int, float]] = []
    while len(fates) < WORLD and time.monotonic() < deadline:
        for r, rank in enumerate(ranks):
            if r in fates or not (rank.conn.poll(0) or not rank.proc.is_alive()):
                continue
            try:
                fates[r], results[r] = "ok", rank.receive(0)
                continue
            except launch.WorkerError as err:  # glibc's abort: "killed by SIGABRT"
                code = rank.proc.exitcode or 0
                last = f"error: {str(err).strip().splitlines()[-1][:300]}"
                fates[r] = f"killed by {signal.Signals(-code).name}" if code < 0 else last
            dead.append((r, round(time.monotonic() - t0, 1)))
            deadline = min(deadline, time.monotonic() + GRACE_S)
        time.sleep(0.1)
    late = "still running: killed" + (f" {GRACE_S:.0f} s after" if dead else "")
    for r, rank in enumerate(ranks):
        fates.setdefault(r, late)
        rank.stop(0)  # only the processes this soak started
    del store
    wall_s = round(time.monotonic() - t0, 1)
    messages = {}
    for r in range(WORLD):
        text = (Path(spec["dir"]) / f"{spec['name']}-rank{r}.txt").read_text(errors="replace")
        found = NATIVE.findall(text)
        if found or fates[r] != "ok":
            messages[r] = {"native": found, "stderr_tail": text[-3000:]}
    aborts = [r for r, f in fates.items() if f == "killed by SIGABRT"]
    outcome = "native_abort" if aborts else "other_failure" if dead else "timeout"
    outcome = "ok" if len(results) == WORLD else outcome
    job: Json = {"side": spec["maker"], "job": spec["job"], "outcome": outcome}
    job |= {"wall_s": wall_s, "aborted_ranks": aborts, "first_deaths": dead}
    job["message"] = next((m for r in aborts for m in messages[r]["native"]), None)
    job |= {"fates": fates, "stderr": messages}
    if 0 in results:
        job |= {f"rank0_{k}": results[0][k] for k in ("setup_s", "train_s", "losses")}
    job["fmesh_groups"] = sorted({int(v["fmesh_groups"]) for v in results.values()})
    return job


def _provenance() -> Json:
    """What the soak ran on: torch, torchtitan and fmesh (its git commit, if any)."""
    import torch

    import fmesh

    root = Path(fmesh.__file__).resolve().parent.parent
    git = ["git", "-C", str(root)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "fmesh"], capture_output=True)
    out: Json = {"torch": torch.__version__, "python": sys.version.split()[0]}
    out |= {"fmesh_commit": head.stdout.strip() or None, "fmesh_dirty": bool(dirty.stdout)}
    found = importlib.util.find_spec("torchtitan")
    return out | {"torchtitan": found.origin if found else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--builds", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=40, help="training jobs a side")
    parser.add_argument("--steps", type=int, default=10, help="training steps a job")
    parser.add_argument("--tokens", type=int, default=128, help="tokens a step per rank")
    parser.add_argument("--job-limit-s", type=float, default=600.0)
    parser.add_argument("--budget-s", type=float, default=None, help="start no pair after")
    parser.add_argument("--out", type=Path, default=None, help="the JSON report's file")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="fmesh-soak-"))
    out = args.out or folder / "soak.json"
    report: Json = {"stacks_dir": str(folder), "provenance": _provenance()}
    # torchtitan imported once in the fork server, as torch is (before it starts).
    launch.context().set_forkserver_preload(
        [*torch_ref.PRELOAD, "numpy", "fmesh", "bench.shared", "torchtitan.models.llama3"]
    )
    if args.cycles or args.builds:
        spec: Json = {"cycles": args.cycles, "builds": args.builds, "dir": str(folder)}
        limit = 600.0 + 2.0 * (args.cycles + args.builds)
        crashes: list[str] = []
        ranks = launch.run_gloo_job(soak_worker, WORLD, spec, limit, crashes=crashes)
        soak = {"ranks": ranks, "crashes": crashes}
        stacks = {p.name: p.read_text()[-4000:] for p in sorted(folder.glob("soak*.txt"))}
        report["soak"] = soak | {"stacks": {k: v for k, v in stacks.items() if v}}
        out.write_text(json.dumps(report, indent=1) + "\n")
    report |= {"steps": args.steps, "tokens": args.tokens, "jobs": []}
    t0 = time.monotonic()
    for number in range(args.jobs):
        if args.budget_s is not None and time.monotonic() - t0 > args.budget_s:
            break
        for side in SIDES:
            spec = {"maker": side, "job": number, "steps": args.steps, "tokens": args.tokens}
            spec |= {"dir": str(folder), "name": f"titan-{number:03d}-{side}"}
            job = _titan_job(spec, args.job_limit_s)
            report["jobs"].append(job)
            line = f"job {number} {side}: {job['outcome']} in {job['wall_s']} s"
            line += f" {job['message'] or ''}"
            print(f"[{time.monotonic() - t0:6.0f} s] {line}", file=sys.stderr, flush=True)
            report["rates"] = rates(report["jobs"])
            out.write_text(json.dumps(report, indent=1) + "\n")
    if report["jobs"]:
        print(summary(report))
    print(f"report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
