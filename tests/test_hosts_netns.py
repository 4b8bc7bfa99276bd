"""Ranks on separate hosts, and a host cut off in the middle of group creation.

Three Linux network namespaces joined by veth pairs to one bridge (made as root, as CI
runs): ``S`` holds the job's store (as torchrun's agent or a c10d rendezvous host
does), ``A`` ranks 0 and 1, ``B`` ranks 2 and 3, each namespace with its own address,
and every rank launched with the variables ``torchrun --nnodes 2 --nproc-per-node 2``
sets (``GROUP_RANK``, ``LOCAL_RANK``, the store's address). No traffic leaves these
namespaces and loopback. Ranks realize ``dp x tp`` (dp across the hosts, tp within
each); B's ranks are held a few seconds at their first group, so that A's ranks wait
for them in creation, and B's link is cut then:

* cut for good: every survivor raises ``PeerLostError`` naming B's ranks within 30 s
  (its watcher's keepalive finds B's host silent, the walk along the ring finds B's
  other rank silent too); B's ranks, cut off from the store, raise the documented
  "given up on" ``PeerLostError`` (their store requests end at ``TCP_USER_TIMEOUT``);
  nothing hangs.
* cut, then restored: B's ranks raise the "given up on" ``PeerLostError`` within seconds
  of running again, never a transport error nor ``MeshMismatchError``.

Skipped, saying why, where namespaces cannot be made (not root, no ``ip``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _dist import kill_tree

ROOT = Path(__file__).resolve().parents[1]
SURVIVOR_BOUND = 30.0
"""Seconds from the cut to every survivor's error (the contract at default settings)."""
HOLD = 6.0
"""Seconds B's ranks are held at their first group (A's ranks wait for them there)."""


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *args] if ns is None else ["ip", "netns", "exec", ns, "ip", *args]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def _cannot_make_namespaces() -> str:
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    probe = f"fmprobe{os.getpid() % 100000}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as err:
        return f"ip netns add failed: {err.stderr.strip()}"
    _ip("netns", "del", probe)
    return ""


class Hosts:
    """Namespaces S (the store), A and B on one bridge, 10.79.<net>.{1,2,3}/24."""

    def __init__(self, net: int) -> None:
        tag = f"{os.getpid() % 10000}{net}"
        self.bridge = f"fmbr{tag}"
        self.names = {h: f"fm{h}{tag}" for h in "SAB"}
        self.addr = {h: f"10.79.{net}.{i}" for i, h in enumerate("SAB", start=1)}
        self.outer = {h: f"fm{h.lower()}{tag}" for h in "SAB"}
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for h, ns in self.names.items():
            _ip("netns", "add", ns)
            _ip("link", "set", "lo", "up", ns=ns)
            _ip(
                "link",
                "add",
                self.outer[h],
                "type",
                "veth",
                "peer",
                "name",
                "fmeth0",
                "netns",
                ns,
            )
            _ip("link", "set", self.outer[h], "master", self.bridge)
            _ip("link", "set", self.outer[h], "up")
            _ip("addr", "add", f"{self.addr[h]}/24", "dev", "fmeth0", ns=ns)
            _ip("link", "set", "fmeth0", "up", ns=ns)

    def cut(self, host: str) -> None:
        _ip("link", "set", self.outer[host], "down")

    def restore(self, host: str) -> None:
        _ip("link", "set", self.outer[host], "up")

    def remove(self) -> None:
        for h, ns in self.names.items():
            subprocess.run(["ip", "link", "del", self.outer[h]], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def run(self, host: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["ip", "netns", "exec", self.names[host], *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


STORE = """\
import sys, time
import torch.distributed as dist
store = dist.TCPStore(sys.argv[1], 0, 4, True, wait_for_workers=False)
print("PORT", store.port, flush=True)
time.sleep(600)
"""


@pytest.fixture
def hosts(request: pytest.FixtureRequest) -> Iterator[Hosts]:
    why = _cannot_make_namespaces()
    if why:
        pytest.skip(f"cannot put ranks on separate hosts here: {why}")
    h = Hosts(int(request.node.callspec.id == "restored") + 1)
    try:
        yield h
    finally:
        h.remove()


def _job(hosts: Hosts, out: Path, restore_after: float | None) -> tuple[float, dict[int, Any]]:
    """The store and 4 ranks; B cut once every rank is in its first group (restored
    ``restore_after`` seconds later). (the cut's wall-clock time, each rank's report)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "RANK"))}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    store = hosts.run("S", [sys.executable, "-c", STORE, hosts.addr["S"]], env)
    procs: list[subprocess.Popen[str]] = [store]
    try:
        assert store.stdout is not None
        line = ""
        while not line.startswith("PORT "):  # past torch's warnings
            line = store.stdout.readline()
            assert line, "the store did not start"
        port = line.split()[1]
        for rank in range(4):
            host = "AB"[rank // 2]
            rank_env = dict(
                env,
                RANK=str(rank),
                LOCAL_RANK=str(rank % 2),
                GROUP_RANK=str(rank // 2),
                WORLD_SIZE="4",
                LOCAL_WORLD_SIZE="2",
                MASTER_ADDR=hosts.addr["S"],
                MASTER_PORT=port,
                TORCHELASTIC_USE_AGENT_STORE="True",
                GLOO_SOCKET_IFNAME="fmeth0",
                FMESH_TEST_DELAY=str(HOLD if host == "B" else 0),
            )
            argv = [sys.executable, str(ROOT / "tests" / "netns_rank.py"), str(out)]
            procs.append(hosts.run(host, argv, rank_env))
        deadline = time.monotonic() + 120
        while not all((out / f"in{r}").exists() for r in range(4)):
            assert time.monotonic() < deadline, "the ranks never reached their groups"
            assert all(p.poll() is None for p in procs[1:]), _said(procs)
            time.sleep(0.1)
        cut_at = time.time()
        hosts.cut("B")
        if restore_after is not None:
            time.sleep(restore_after)
            hosts.restore("B")
        end = time.monotonic() + 150
        for p in procs[1:]:
            p.wait(max(1.0, end - time.monotonic()))
        reports = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(4)}
        return cut_at, reports
    except subprocess.TimeoutExpired:
        hung = [i - 1 for i, p in enumerate(procs) if i and p.poll() is None]
        pytest.fail(f"ranks {hung} hung:\n" + _said(procs, kill=True))
    finally:
        for p in procs:
            kill_tree(p.pid)
            p.wait()


def _said(procs: list[subprocess.Popen[str]], kill: bool = False) -> str:
    """What the ranks printed (the store apart), the last lines of each."""
    outs = []
    for rank, p in enumerate(procs[1:]):
        if kill:
            kill_tree(p.pid)
        if p.poll() is not None or kill:
            text = p.communicate()[0] if p.stdout is not None else ""
            lines = [line for line in text.splitlines() if "socket.cpp" not in line]
            outs.append(f"rank {rank}:\n" + "\n".join(lines[-60:]))
    return "\n".join(outs)


@pytest.mark.parametrize("restore_after", [None, 20.0], ids=["cut", "restored"])
def test_a_host_cut_off_mid_creation(
    hosts: Hosts, tmp_path: Path, restore_after: float | None
) -> None:
    cut_at, reports = _job(hosts, tmp_path, restore_after)
    for rank in (0, 1):  # host A: the survivors
        out = reports[rank]
        assert out["error"] == "PeerLostError", (rank, out)
        assert out["lost"] == [2, 3], (rank, out)
        assert "rank(s) [2, 3] died during realize call #1" in out["message"], out
        assert out["at"] - cut_at < SURVIVOR_BOUND, (rank, out["at"] - cut_at)
    for rank in (2, 3):  # host B: cut off (and back)
        out = reports[rank]
        assert out["error"] == "PeerLostError" and out["lost"] == [rank], (rank, out)
        assert f"rank {rank} was given up on during realize call #1" in out["message"], out
        if restore_after is not None:  # within seconds of running again
            assert out["at"] - (cut_at + restore_after) < 15.0, (rank, out)
