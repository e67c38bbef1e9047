"""Two "nodes" on one machine: the `accelerate launch` lines of a 2-node CPU run, built by `dapo_trl.launch`.

tests/test_cluster.py runs these lines; tests/test_launch.py checks that the SLURM script and the Kubernetes manifests
produce the same ones from their own variables.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from dapo_trl.run.launch import NodeLaunch, accelerate_command, command_line, launcher_environment

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "tests/scripts/cluster_run.py"  # examples/train_math.py plus per-process records
NUM_NODES = 2


# Dynamic sampling on the total reward (the correctness reward alone is constant after the smoke config's short
# warm-up), with round sizes equal to the deficit: the first round of a batch leaves groups missing and a refill
# round runs. Checkpoints at steps 2 and 4; the end-of-run evaluation and summary come from train_math.py.
TWO_NODE_EXTRA = ("--save_strategy", "steps", "--save_steps", "2", "--dynamic_sampling_reward", "total",
                  "--dynamic_sampling_round_sizing", "deficit")  # fmt: skip


def smoke_args(output_dir, *extra: str) -> list[str]:
    """
    configs/smoke.yaml with auto-resume on, in the order the SLURM script writes them; with a 20-step warm-up (the
    config's longer one, which makes its correctness rewards vary, would only slow these process-layout tests down).
    """
    return ["--config", "configs/smoke.yaml", "--auto_resume", "true", "--output_dir", str(output_dir),
            "--disable_tqdm", "true", "--demo_sft_steps", "20", *extra]  # fmt: skip


def node_lines(main_process_ip: str, port: int, train_args: list[str]) -> list[str]:
    """One shell line per node, as `python -m dapo_trl.launch env --cpu --dry_run` prints it."""
    env = launcher_environment(cpu=True)
    return [
        command_line(
            env,
            accelerate_command(NodeLaunch(NUM_NODES, rank, main_process_ip, port, 1), SCRIPT, train_args, cpu=True),
        )
        for rank in range(NUM_NODES)
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def split_line(line: str) -> tuple[dict[str, str], list[str]]:
    """`NAME=value ... command args` -> (environment, argv)."""
    words = shlex.split(line)
    env = {}
    while re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return env, words


def _working_strace() -> str | None:
    """`strace`, if it is installed and may trace here (containers can forbid ptrace)."""
    path = shutil.which("strace")
    if path is None:
        return None
    probe = subprocess.run([path, "-f", "-qq", "-o", os.devnull, "true"], capture_output=True, timeout=60)
    return path if probe.returncode == 0 else None


STRACE = _working_strace()
TRACED_CALLS = "openat,open,creat,rename,renameat,renameat2,unlink,unlinkat"


def start_node(line: str, record_dir: Path, log: Path, trace_dir: Path | None = None) -> subprocess.Popen:
    """Run one node's line here: `accelerate` through this Python, optionally under `strace` (file writes only)."""
    env, argv = split_line(line)
    assert argv[:2] == ["accelerate", "launch"], argv
    argv = [sys.executable, "-m", "accelerate.commands.launch", *argv[2:]]
    if trace_dir is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)
        argv = [STRACE, "-f", "--seccomp-bpf", "-qq", "-s", "4096", "-e", f"trace={TRACED_CALLS}", "-ff", "-o",
                str(trace_dir / "t"), *argv]  # fmt: skip
    full_env = {**os.environ, **env, "CLUSTER_RECORD_DIR": str(record_dir), "OMP_NUM_THREADS": "1"}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    with open(log, "w") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=full_env, stdout=out, stderr=subprocess.STDOUT)


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL a launcher and every process below it (torch starts its workers in their own sessions)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, queue = [], [process.pid]
    while queue:
        pid = queue.pop()
        tree.append(pid)
        queue += parents.get(pid, [])
    for pid in tree:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    process.wait()


def wait_all(processes: list[subprocess.Popen], timeout: float) -> list[int]:
    """Exit codes of all processes; on a timeout, kill every process tree (a hang must not outlive the test)."""
    deadline = time.monotonic() + timeout
    try:
        return [process.wait(max(deadline - time.monotonic(), 1)) for process in processes]
    except subprocess.TimeoutExpired:
        for process in processes:
            kill_tree(process)
        raise


def wait_for(condition, processes: list[subprocess.Popen], timeout: float, what: str) -> None:
    """Poll `condition()` while the processes run; kill them all if it does not come true in time."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            for process in processes:
                kill_tree(process)
            raise AssertionError(f"{what} did not happen within {timeout} s (or a process exited)")
        time.sleep(0.05)


_CALL = re.compile(r"^(\w+)\((.*)\)\s+=\s+(-?\d+)")


def written_paths(trace_dir: Path, under: Path) -> set[str]:
    """Paths under `under` that a traced node opened for writing, created, renamed or deleted (successful calls)."""
    paths = set()
    for trace in trace_dir.glob("t.*"):
        for line in trace.read_text(errors="replace").splitlines():
            match = _CALL.match(line)
            if not match or int(match.group(3)) < 0:
                continue
            call, args = match.group(1), match.group(2)
            if call in ("open", "openat") and not re.search(r"O_WRONLY|O_RDWR|O_CREAT", args):
                continue
            paths.update(p for p in re.findall(r'"((?:[^"\\]|\\.)*)"', args) if p.startswith(str(under)))
    return paths
