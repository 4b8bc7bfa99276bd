"""Every code block in README.md runs, and the quick start matches CI."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, re.S)
# Blocks that quote an example ("# excerpt of examples/elastic.py") are not run here:
# tests/test_example_elastic.py checks that they are verbatim in that file.
PYTHON = [
    body for lang, body in BLOCKS if lang == "python" and not body.startswith("# excerpt of ")
]
BASH = [body for lang, body in BLOCKS if lang == "bash"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_readme_has_code_blocks() -> None:
    assert len(PYTHON) >= 2
    assert len(BASH) >= 2


@pytest.mark.parametrize("index", range(len(PYTHON)))
def test_python_block_runs(index: int, tmp_path: Path) -> None:
    body = PYTHON[index]
    script = tmp_path / f"block{index}.py"
    script.write_text(body)
    first = body.splitlines()[0]
    match = re.match(r"# torchrun --nproc-per-node (\d+)", first)
    if match:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            match.group(1),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_free_port()),
            str(script),
        ]
    else:
        cmd = [sys.executable, str(script)]
    result = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_quick_start_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = next(b for b in BASH if "pytest" in b and "torch==2.13.0" in b).strip()
    parts = [p.strip() for p in test_cmd.split("&&")]
    assert parts[0] == "pip install torch==2.13.0"
    assert parts[1] == 'pip install -e ".[test]"'
    assert '"torch==2.13.0"' in ci
    assert '-e ".[test]"' in ci
    # The very command the README gives is what CI runs right after installing (then
    # the same suite again on the oldest and newest supported torch).
    ci_lines = [ln.strip() for ln in ci.splitlines() if ln.strip() and not ln.startswith("#")]
    assert parts[2] in ci_lines
    first_test = next(ln for ln in ci_lines if "pytest" in ln)
    assert first_test == parts[2]


def test_quick_start_demo_command_is_what_the_example_test_runs() -> None:
    demo = next(b for b in BASH if "examples/train_fsdp_tp.py" in b).strip()
    parts = [p.strip() for p in demo.split("&&")]
    assert parts[0] == "pip install torch==2.13.0"
    assert parts[-1] == ("torchrun --standalone --nproc-per-node 4 examples/train_fsdp_tp.py")
    example_test = (ROOT / "tests" / "test_example.py").read_text()
    assert "--standalone" in example_test
    assert "examples/train_fsdp_tp.py" in example_test
