"""What a planned rank sees of its launch: the variables torchrun sets for a worker,
and the process's peak memory while the function runs (Linux).

The variables are those torch's elastic agent gives every worker
(``torch/distributed/elastic/agent/server/local_elastic_agent.py``,
``_start_workers``, and the error file of ``elastic/multiprocessing/api.py``), for a
single-role job on hosts of ``LOCAL_WORLD_SIZE`` ranks, as
``torchrun --nnodes N --nproc-per-node 8`` starts it (first attempt, static
rendezvous). Each is restored after the rank.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator

__all__ = ["LOCAL_WORLD_SIZE", "peak", "reset_peak", "torchrun_environment", "torchrun_values"]

LOCAL_WORLD_SIZE = 8
"""``LOCAL_RANK`` and the host's variables are set as on hosts of this many ranks."""

MASTER_ADDR = "127.0.0.1"
MASTER_PORT = 29500
"""torchrun's defaults (``--master-addr``, ``--master-port``)."""


def torchrun_values(world: int, rank: int, error_dir: str) -> dict[str, str]:
    """The variables torchrun sets for ``rank`` of a ``world``-rank job.

    >>> v = torchrun_values(32, 13, "/tmp/x")
    >>> v["RANK"], v["LOCAL_RANK"], v["GROUP_RANK"], v["GROUP_WORLD_SIZE"], v["MASTER_PORT"]
    ('13', '5', '1', '4', '29500')
    """
    local_world = min(LOCAL_WORLD_SIZE, world)
    local = rank % local_world
    env = os.environ.get
    values = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(rank // local_world),
        "GROUP_WORLD_SIZE": str(-(-world // local_world)),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": MASTER_ADDR,
        "MASTER_PORT": str(MASTER_PORT),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": "none",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_ERROR_FILE": os.path.join(
            error_dir, "attempt_0", str(local), "error.json"
        ),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": env("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }
    if local_world > 1:  # torchrun sets it for several processes a host, unless set
        values["OMP_NUM_THREADS"] = env("OMP_NUM_THREADS", "1")
    return values


@contextlib.contextmanager
def torchrun_environment(world: int, rank: int) -> Iterator[None]:
    """Inside, the environment is a torchrun worker's (restored on exit). The error
    file torch's ``@record`` writes lands in a directory removed on exit."""
    with tempfile.TemporaryDirectory(prefix="fmesh-plan-") as error_dir:
        values = torchrun_values(world, rank, error_dir)
        os.makedirs(os.path.dirname(values["TORCHELASTIC_ERROR_FILE"]), exist_ok=True)
        saved = {k: os.environ.get(k) for k in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            text = f.read()
    except OSError:
        return None
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return None if m is None else int(m.group(1))


def reset_peak() -> int | None:
    """Reset the process's peak resident memory (Linux); the resident memory now."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    now = _status_kib("VmRSS")
    return None if now is None else now * 1024


def peak() -> int | None:
    """The peak resident memory since ``reset_peak()``, in bytes."""
    kib = _status_kib("VmHWM")
    if kib is None:
        return None
    return kib * 1024
