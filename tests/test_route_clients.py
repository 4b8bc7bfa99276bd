"""Real clients nobody here wrote, routed through fmesh with no line of theirs changed.

* torchtitan's meshes and training loop (``titan_script.py``: torch's imports only)
  under ``torchrun ... -m fmesh.route``, against the same script on plain torch: the
  same meshes and groups, every loss and parameter bit for bit, and no torch
  ``new_group`` call when routed.
* HF accelerate's ``ParallelismConfig(...).build_device_mesh("cpu")`` on 8 gloo ranks,
  with dp_replicate, dp_shard and tp above 1 (and dp_shard, cp and tp), once on plain
  torch and once after ``fmesh.device_mesh.route()`` in the same processes: the same
  meshes, groups and local ranks of every dim and every flattened mesh it makes, and
  no torch ``new_group`` call when routed.
* Lightning's ``Trainer`` with ``ModelParallelStrategy`` (data parallel 2 x tensor
  parallel 2, FSDP2 over tensor parallel, 4 CPU ranks on gloo) trains a few steps of a
  script with Lightning's and torch's imports only: as plain ``python train.py``
  (Lightning starts ranks 1-3 itself, as new ``python train.py`` processes), routed
  the same way (``python -m fmesh.route train.py``: those ranks are routed by
  ``fmesh-route.pth``) and routed under torchrun: every loss and parameter bit for bit
  as on plain torch, and fmesh's groups on every routed rank.

The client tests skip, naming the extra, without fmesh's ``clients`` extra
(``_clients.py``).
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

from _clients import require
from _dist import run_command, run_spawn
from _installed import route_pth
from titan_recipe import count_new_group

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "titan_script.py"
WORLD = 4
TIMEOUT_S = 240


def plain_script(rank: int, world: int, out: Path) -> None:
    """The script on plain torch, as ``torchrun tests/titan_script.py OUT`` runs it
    (a forked rank with torchrun's environment: cheaper than a second torchrun)."""
    sys.argv = [str(SCRIPT), str(out)]
    runpy.run_path(str(SCRIPT), run_name="__main__")


NATIVE_ABORT = "terminate called without an active exception"


def _told(proc: subprocess.CompletedProcess[str]) -> str:
    """A failed job's stderr without DTensor's redistribution warnings (one per rank
    per step), so the failure shows."""
    lines = proc.stderr.splitlines()
    return "\n".join(line for line in lines if "_redistribute.py" not in line)


def _launch(
    cmd: list[str], cwd: Path, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], float]:
    """``run_command``, once more after a native gloo abort."""
    proc, elapsed = run_command(cmd, cwd, TIMEOUT_S, env)
    if proc.returncode != 0 and NATIVE_ABORT in proc.stderr:
        # torch's gloo aborts a rank so now and then, without fmesh too (seen in CI
        # once on torch 2.11; docs/troubleshooting.md): the job runs once more, and a
        # second abort fails the test.
        warnings.warn(
            f"a rank aborted natively ({NATIVE_ABORT!r}); the job ran again", stacklevel=1
        )
        proc, elapsed = run_command(cmd, cwd, TIMEOUT_S, env)
    return proc, elapsed


def _ranks(folder: Path) -> list[dict[str, Any]]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_torchtitans_training_routed_with_no_import_changed(tmp_path: Path) -> None:
    routed, plain = tmp_path / "routed", tmp_path / "plain"
    routed.mkdir()
    plain.mkdir()
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone", "--nproc-per-node", str(WORLD),
        "-m", "fmesh.route", "tests/titan_script.py", str(routed),
    ]  # fmt: skip
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc, elapsed = _launch(cmd, ROOT, env)
    assert proc.returncode == 0, f"exit {proc.returncode} after {elapsed:.0f}s:\n{_told(proc)}"
    job = run_spawn(plain_script, WORLD, plain, tmp_path=tmp_path / "job", timeout=150)
    assert all(o.ok for o in job.outcomes), job.describe()
    for rank, (ours, theirs) in enumerate(zip(_ranks(routed), _ranks(plain), strict=True)):
        # The same meshes and groups; the same losses and parameters, bit for bit
        # (floats compared exactly): the same collectives over the same groups.
        for key in ("meshes", "fsdp_tp", "hsdp", "fsdp_int"):
            assert ours[key] == theirs[key], (rank, key)
        # Routed: every group is fmesh's (torch's new_group never ran); plain torch
        # made its own.
        assert ours["new_group"] == 0 < theirs["new_group"], rank
    # Not vacuous: the dp_shard replicas saw different batches.
    first, third = _ranks(routed)[0], _ranks(routed)[2]
    assert first["fsdp_tp"]["losses"] != third["fsdp_tp"]["losses"]


# -- accelerate ---------------------------------------------------------------------------

ACCELERATE_WORLD = 8
CONFIGS: dict[str, dict[str, int]] = {
    "hsdp_tp": {"dp_replicate_size": 2, "dp_shard_size": 2, "tp_size": 2},
    "fsdp_cp_tp": {"dp_shard_size": 2, "cp_size": 2, "tp_size": 2},
}


def _describe(config: Any, mesh: Any) -> dict[str, Any]:
    """Every dim and every flattened mesh accelerate made of its root, as a trainer
    reads them: ranks, local rank, coordinate, the members of its group."""
    import torch.distributed as dist

    flattened = {
        "dp": config.dp_dim_names,
        "dp_shard_cp": config.dp_shard_cp_dim_names,
        "dp_cp": config.dp_cp_dim_names,
    }
    names = [*mesh.mesh_dim_names, *(n for n, dims in flattened.items() if dims)]
    out: dict[str, Any] = {"names": names, "root": mesh.mesh.tolist()}
    for name in names:
        sub = mesh[name]
        out[name] = {
            "mesh": sub.mesh.tolist(),
            "local_rank": sub.get_local_rank(),
            "coordinate": sub.get_coordinate(),
            "group": dist.get_process_group_ranks(sub.get_group()),
        }
    return out


def accelerate_job(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    import fmesh
    from fmesh.device_mesh import route, unroute

    # accelerate ships no type information: its class, typed loosely.
    ParallelismConfig: Any = importlib.import_module("accelerate").ParallelismConfig
    dist.init_process_group("gloo")
    new_groups = count_new_group()
    out: dict[str, Any] = {"torch": {}, "fmesh": {}}
    for name, sizes in CONFIGS.items():
        config = ParallelismConfig(**sizes)
        out["torch"][name] = _describe(config, config.build_device_mesh("cpu"))
    out["torch_new_group"] = new_groups[0]
    route()
    try:
        start = new_groups[0]
        for name, sizes in CONFIGS.items():
            config = ParallelismConfig(**sizes)
            out["fmesh"][name] = _describe(config, config.build_device_mesh("cpu"))
        out["fmesh_new_group"] = new_groups[0] - start
        out["fmesh_created"] = fmesh.cache_stats().created
    finally:
        unroute()
    dist.barrier()
    return out


def test_accelerates_parallelism_config_routed_matches_torch(tmp_path: Path) -> None:
    require("accelerate", "transformers")  # transformers: accelerate's tp checks it
    job = run_spawn(accelerate_job, ACCELERATE_WORLD, tmp_path=tmp_path, timeout=180)
    for rank, out in enumerate(job.values()):
        for name in CONFIGS:
            ours, theirs = out["fmesh"][name], out["torch"][name]
            assert ours == theirs, (rank, name)
        # Not vacuous: the flattened meshes accelerate asks for are there.
        assert out["fmesh"]["hsdp_tp"]["names"] == [
            "dp_replicate", "dp_shard", "tp", "dp", "dp_shard_cp", "dp_cp",
        ], out["fmesh"]["hsdp_tp"]["names"]  # fmt: skip
        assert "cp" in out["fmesh"]["fsdp_cp_tp"]["names"]
        assert out["fmesh_new_group"] == 0 < out["torch_new_group"], rank
        assert out["fmesh_created"] > 0, rank


# -- Lightning ----------------------------------------------------------------------------

LIGHTNING = """\
# A trainer as its authors would write it: Lightning's and torch's imports only.
import json, sys
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed import device_mesh, distributed_c10d
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.distributed.tensor.parallel import parallelize_module
from torch.utils.data import DataLoader, TensorDataset

NEW_GROUP = [0]  # torch's new_group calls (none when fmesh makes the groups)
TORCH_NEW_GROUP = distributed_c10d.new_group


def counting(*args, **kwargs):
    NEW_GROUP[0] += 1
    return TORCH_NEW_GROUP(*args, **kwargs)


# torch's DeviceMesh calls the name it imported from distributed_c10d.
distributed_c10d.new_group = dist.new_group = device_mesh.new_group = counting


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)
        )
        self.losses = []

    def configure_model(self):
        tp, dp = self.device_mesh["tensor_parallel"], self.device_mesh["data_parallel"]
        parallelize_module(self.net, tp, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(self.net, mesh=dp)

    def training_step(self, batch, index):
        loss = self.net(batch[0]).pow(2).mean()
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


L.seed_everything(7)
model = Net()
trainer = L.Trainer(
    accelerator="cpu",
    devices=4,
    strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2),
    max_steps=3,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(model, DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=4))
mesh = model.device_mesh
params = {n: p.full_tensor().flatten().tolist() for n, p in model.net.named_parameters()}
fmesh = sys.modules.get("fmesh")  # imported by fmesh's routing only
facts = {
    "dp": dist.get_process_group_ranks(mesh["data_parallel"].get_group()),
    "tp": dist.get_process_group_ranks(mesh["tensor_parallel"].get_group()),
    "coordinate": mesh.get_coordinate(),
    "losses": model.losses,
    "params": params,
    "new_group": NEW_GROUP[0],
    "fmesh_created": None if fmesh is None else fmesh.cache_stats().created,
}
Path(sys.argv[1], f"rank{trainer.global_rank}.json").write_text(json.dumps(facts))
"""
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "NODE_RANK", "GROUP_RANK", "FMESH_ROUTE")  # fmt: skip


def test_lightnings_model_parallel_training_routed_matches_plain(tmp_path: Path) -> None:
    require("lightning")
    route_pth()  # ranks 1-3 of the self-launched routed run are routed by it
    (tmp_path / "train.py").write_text(LIGHTNING)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    commands = {
        "plain": [sys.executable, "train.py"],  # Lightning starts ranks 1-3 itself
        "routed": [sys.executable, "-m", "fmesh.route", "train.py"],  # and here too
        "torchrun": [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(WORLD), "-m", "fmesh.route", "train.py",
        ],
    }  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {}
    for name, command in commands.items():
        out = tmp_path / name
        out.mkdir()
        proc, elapsed = _launch([*command, str(out)], tmp_path, env)
        assert proc.returncode == 0, (
            f"{name}: exit {proc.returncode} after {elapsed:.0f}s:\n{_told(proc)}"
        )
        runs[name] = _ranks(out)
    plain = runs["plain"]
    for rank, theirs in enumerate(plain):
        # Lightning's mesh (data_parallel x tensor_parallel), built by torch's own code.
        assert theirs["dp"] == [rank % 2, rank % 2 + 2], rank
        assert theirs["tp"] == [rank // 2 * 2, rank // 2 * 2 + 1], rank
        assert theirs["fmesh_created"] is None and theirs["new_group"] > 0, rank
        for name in ("routed", "torchrun"):
            ours = runs[name][rank]
            # The same meshes and groups; every loss and parameter bit for bit (floats
            # compared exactly): the same collectives over the same groups.
            for key in ("dp", "tp", "coordinate", "losses", "params"):
                assert ours[key] == theirs[key], (name, rank, key)
            # fmesh made this rank's groups; torch's new_group never ran.
            assert ours["new_group"] == 0 < ours["fmesh_created"], (name, rank)
    # Not vacuous: the data-parallel replicas saw different batches.
    assert plain[0]["losses"] != plain[2]["losses"] and len(plain[0]["losses"]) == 3
