"""One `accelerate launch` command per node, built from a scheduler's variables: SLURM, or plain ones (Kubernetes).

The launch recipes under `examples/slurm/` and `examples/kubernetes/` run this module on every training node; the
tests build the two-node run on one machine with the same functions, so the command a cluster runs is the one the
tests ran.

```
python -m dapo_trl.launch slurm [options] SCRIPT [ARGS...]   # in each task of `srun` on the training nodes
python -m dapo_trl.launch env [options] SCRIPT [ARGS...]     # NUM_MACHINES, MACHINE_RANK, MAIN_PROCESS_IP, ...
python -m dapo_trl.launch slurm-hosts [--server_nodes 1]     # prints: VLLM_HOST TRAIN_NODES NUM_TRAIN_NODES
```

Options: `--processes_per_machine N` (default: `PROCESSES_PER_MACHINE`, then SLURM's `SLURM_GPUS_ON_NODE`),
`--config_file` (an accelerate config, e.g. `configs/accelerate/zero3.yaml`), `--cpu` (gloo processes without GPUs,
for tests), `--server_nodes` (SLURM: how many leading nodes of the allocation run the vLLM server, default 1),
`--port` (default: `MAIN_PROCESS_PORT`, then a port derived from `SLURM_JOB_ID` or 29500), `--shutdown_timeout`,
`--dry_run` (print the command instead of running it).

The command runs with two settings of the torch elastic agent that `accelerate launch` uses: SIGUSR1 is forwarded to
the training processes like SIGTERM (`PET_SIGNALS_TO_HANDLE`), and after forwarding a signal the agent waits
`--shutdown_timeout` seconds (default 1800, instead of 30) for them to save their checkpoint
(`TORCH_ELASTIC_SHUTDOWN_TIMEOUT`). This module imports neither torch nor TRL.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

DEFAULT_PORT = 29500
DEFAULT_SHUTDOWN_TIMEOUT_S = 1800
FORWARDED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"  # torch's default list plus SIGUSR1 (SLURM)


@dataclass(frozen=True)
class NodeLaunch:
    """Where one node stands in a multi-node run: what `accelerate launch` needs besides the script."""

    num_machines: int
    machine_rank: int
    main_process_ip: str
    main_process_port: int
    processes_per_machine: int

    def __post_init__(self):
        if self.num_machines < 1 or not 0 <= self.machine_rank < self.num_machines:
            raise ValueError(f"machine_rank {self.machine_rank} is not in [0, num_machines={self.num_machines}).")
        if self.processes_per_machine < 1:
            raise ValueError(f"processes_per_machine must be at least 1, got {self.processes_per_machine}.")
        if not 0 < self.main_process_port < 65536:
            raise ValueError(f"main_process_port {self.main_process_port} is not a TCP port.")


# ---------------------------------------------------------------------------------------------------- SLURM


def expand_hostlist(hostlist: str) -> list[str]:
    """
    Expand a SLURM host list as `scontrol show hostnames` does, keeping zero padding.

    >>> expand_hostlist("gpu[01-03,07],login1")
    ['gpu01', 'gpu02', 'gpu03', 'gpu07', 'login1']
    >>> expand_hostlist("rack[1-2]-n[1-2]")
    ['rack1-n1', 'rack1-n2', 'rack2-n1', 'rack2-n2']
    """
    hosts: list[str] = []
    for item in _split_top_level(hostlist.strip()):
        if not re.fullmatch(r"[^\[\]]*(\[[^\[\]]*\][^\[\]]*)*", item):
            raise ValueError(f"Unbalanced brackets in SLURM host list {hostlist!r}.")
        parts = re.split(r"\[([^\]]*)\]", item)  # text, range, text, range, ..., text
        choices = [[text] if i % 2 == 0 else _expand_ranges(text, hostlist) for i, text in enumerate(parts)]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    if not hosts:
        raise ValueError(f"Empty SLURM host list {hostlist!r}.")
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item for item in items if item]


def _expand_ranges(text: str, hostlist: str) -> list[str]:
    values = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if match is None:
            raise ValueError(f"Cannot read the range {part!r} of SLURM host list {hostlist!r}.")
        low, high = match.group(1), match.group(2) or match.group(1)
        width = len(low) if low.startswith("0") else 0
        values += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return values


def slurm_hosts(env: Mapping[str, str], *, server_nodes: int = 1) -> tuple[list[str], list[str]]:
    """`(server nodes, training nodes)`: the first `server_nodes` nodes of `SLURM_JOB_NODELIST` serve, the rest train."""
    nodes = expand_hostlist(_require(env, "SLURM_JOB_NODELIST"))
    if not 0 <= server_nodes < len(nodes):
        raise ValueError(
            f"The job has {len(nodes)} nodes ({', '.join(nodes)}): with {server_nodes} for the vLLM server none is left "
            "for training. Allocate more nodes (sbatch --nodes) or lower --server_nodes."
        )
    return nodes[:server_nodes], nodes[server_nodes:]


def from_slurm(
    env: Mapping[str, str],
    *,
    server_nodes: int = 1,
    processes_per_machine: int | None = None,
    port: int | None = None,
) -> NodeLaunch:
    """
    This node's place in the run, from the variables SLURM sets in each task of an `srun` step.

    Training nodes are the job's nodes after the `server_nodes` first ones, in `SLURM_JOB_NODELIST` order; the machine
    rank is the position of `SLURMD_NODENAME` among them, so it does not depend on how `srun` numbers its tasks, and
    the first training node is the head. The port is `MAIN_PROCESS_PORT` or `20000 + SLURM_JOB_ID % 20000` (two jobs
    sharing a node do not collide; a requeued job keeps its port).
    """
    _, training = slurm_hosts(env, server_nodes=server_nodes)
    node = _require(env, "SLURMD_NODENAME")
    if node not in training:
        raise ValueError(
            f"This task runs on {node}, which is not a training node ({', '.join(training)}): start the training step "
            "on the training nodes only (srun --nodelist=$TRAIN_NODES)."
        )
    step_nodes = env.get("SLURM_STEP_NUM_NODES")
    if step_nodes is not None and _integer("SLURM_STEP_NUM_NODES", step_nodes) != len(training):
        raise ValueError(
            f"The srun step spans {step_nodes} nodes but the job has {len(training)} training nodes: the rendezvous "
            "would wait forever. Run one task per training node (srun --nodes=$NUM_TRAIN_NODES --ntasks-per-node=1)."
        )
    if port is None:
        port = _integer("MAIN_PROCESS_PORT", env["MAIN_PROCESS_PORT"]) if "MAIN_PROCESS_PORT" in env else None
    if port is None:
        port = 20000 + _integer("SLURM_JOB_ID", _require(env, "SLURM_JOB_ID")) % 20000
    return NodeLaunch(
        num_machines=len(training),
        machine_rank=training.index(node),
        main_process_ip=training[0],
        main_process_port=port,
        processes_per_machine=_processes(env, processes_per_machine, "SLURM_GPUS_ON_NODE"),
    )


# ---------------------------------------------------------------------------------------------------- plain variables


def from_env(
    env: Mapping[str, str], *, processes_per_machine: int | None = None, port: int | None = None
) -> NodeLaunch:
    """
    This node's place in the run from plain variables: `NUM_MACHINES`, `MACHINE_RANK` (or `JOB_COMPLETION_INDEX`,
    which Kubernetes sets in the pods of an Indexed Job), `MAIN_PROCESS_IP`, `MAIN_PROCESS_PORT` (default 29500) and
    `PROCESSES_PER_MACHINE`.
    """
    rank = env.get("MACHINE_RANK", env.get("JOB_COMPLETION_INDEX"))
    if rank is None:
        raise ValueError("Set MACHINE_RANK (or run as a Kubernetes Indexed Job, which sets JOB_COMPLETION_INDEX).")
    if port is None:
        port = _integer("MAIN_PROCESS_PORT", env.get("MAIN_PROCESS_PORT", DEFAULT_PORT))
    return NodeLaunch(
        num_machines=_integer("NUM_MACHINES", _require(env, "NUM_MACHINES")),
        machine_rank=_integer("MACHINE_RANK" if "MACHINE_RANK" in env else "JOB_COMPLETION_INDEX", rank),
        main_process_ip=_require(env, "MAIN_PROCESS_IP"),
        main_process_port=port,
        processes_per_machine=_processes(env, processes_per_machine, None),
    )


def _require(env: Mapping[str, str], name: str) -> str:
    value = env.get(name)
    if not value:
        raise ValueError(f"The environment variable {name} is not set.")
    return value


def _integer(name: str, value: str | int) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"The environment variable {name} must be an integer, got {value!r}.") from None


def _processes(env: Mapping[str, str], given: int | None, scheduler_variable: str | None) -> int:
    if given is not None:
        return given
    for name in ("PROCESSES_PER_MACHINE", scheduler_variable):
        if name and env.get(name):
            return _integer(name, env[name])
    raise ValueError(
        "How many training processes per node? Pass --processes_per_machine or set PROCESSES_PER_MACHINE."
    )


# ---------------------------------------------------------------------------------------------------- the command


def accelerate_command(
    node: NodeLaunch,
    script: str,
    script_args: Sequence[str] = (),
    *,
    config_file: str | None = None,
    cpu: bool = False,
) -> list[str]:
    """
    The `accelerate launch` command line of one node.

    Args:
        node ([`NodeLaunch`]): the node's place in the run.
        script (`str`): the training script; `script_args` follow it.
        config_file (`str`, *optional*): an accelerate config (DeepSpeed, FSDP, ...); the command-line flags below
            override its process layout.
        cpu (`bool`, *optional*, defaults to `False`): gloo processes without GPUs (what the tests run). Starts them
            with `--multi_gpu`: accelerate's CPU mode would start a single process per node.
    """
    command = ["accelerate", "launch"]
    if config_file is not None:
        command += ["--config_file", config_file]
    if cpu:
        command += ["--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no"]
    command += [
        "--num_machines", str(node.num_machines),
        "--machine_rank", str(node.machine_rank),
        "--main_process_ip", node.main_process_ip,
        "--main_process_port", str(node.main_process_port),
        "--num_processes", str(node.num_machines * node.processes_per_machine),  # accelerate counts all nodes
        "--rdzv_backend", "static",
        "--same_network",
    ]  # fmt: skip
    return [*command, script, *script_args]


def launcher_environment(*, shutdown_timeout: int = DEFAULT_SHUTDOWN_TIMEOUT_S, cpu: bool = False) -> dict[str, str]:
    """Variables the command runs with (see the module docstring)."""
    env = {"PET_SIGNALS_TO_HANDLE": FORWARDED_SIGNALS, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(shutdown_timeout)}
    if cpu:
        env["ACCELERATE_USE_CPU"] = "true"
    return env


def command_line(env: Mapping[str, str], command: Sequence[str]) -> str:
    """One shell line: `NAME=value ... accelerate launch ...` (what `--dry_run` prints)."""
    return shlex.join([f"{name}={value}" for name, value in sorted(env.items())] + list(command))


# ---------------------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    from .cli import positive_int

    parser = argparse.ArgumentParser(prog="python -m dapo_trl.launch", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="source", required=True, metavar="{slurm,env,slurm-hosts}")
    hosts = sub.add_parser("slurm-hosts", help="print VLLM_HOST TRAIN_NODES NUM_TRAIN_NODES for a batch script")
    hosts.add_argument("--server_nodes", type=int, default=1, help=_SERVER_NODES_HELP)
    for name in ("slurm", "env"):
        variables = (
            "SLURM_JOB_NODELIST, SLURMD_NODENAME, SLURM_JOB_ID"
            if name == "slurm"
            else "NUM_MACHINES, MACHINE_RANK (or JOB_COMPLETION_INDEX), MAIN_PROCESS_IP"
        )
        launch = sub.add_parser(
            name,
            help=f"launch this node's training processes (reads {variables})",
            description=f"Launch this node's training processes with `accelerate launch`, from {variables}.",
        )
        if name == "slurm":
            launch.add_argument("--server_nodes", type=int, default=1, help=_SERVER_NODES_HELP)
        launch.add_argument(
            "--processes_per_machine",
            type=positive_int,
            help="training processes per node (default: PROCESSES_PER_MACHINE"
            + (", then SLURM_GPUS_ON_NODE)" if name == "slurm" else ")"),
        )
        launch.add_argument("--config_file", help="an accelerate config (e.g. configs/accelerate/zero3.yaml)")
        launch.add_argument("--cpu", action="store_true", help="gloo processes without GPUs (what the tests run)")
        launch.add_argument(
            "--port",
            type=int,
            help="rendezvous port (default: MAIN_PROCESS_PORT, then "
            + ("20000 + SLURM_JOB_ID %% 20000)" if name == "slurm" else f"{DEFAULT_PORT})"),
        )
        launch.add_argument(
            "--shutdown_timeout",
            type=positive_int,
            default=DEFAULT_SHUTDOWN_TIMEOUT_S,
            help="seconds the launcher waits, after forwarding a signal, for the processes to save a checkpoint "
            "(default: %(default)s)",
        )
        launch.add_argument("--dry_run", action="store_true", help="print the command instead of running it")
        launch.add_argument("script", help="the training script, e.g. examples/train_math.py")
        launch.add_argument("script_args", nargs=argparse.REMAINDER, help="the training script's arguments")
    return parser


_SERVER_NODES_HELP = "how many leading nodes of the allocation run the vLLM server (default: %(default)s)"


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """The command line; a missing or malformed variable or option ends in one line on stderr and exit code 2."""
    parser = _parser()
    args = parser.parse_args(argv)
    env = dict(os.environ if env is None else env)
    try:
        if args.source == "slurm-hosts":
            servers, training = slurm_hosts(env, server_nodes=args.server_nodes)
            print(servers[0] if servers else "-", ",".join(training), len(training))
            return 0
        if args.source == "slurm":
            node = from_slurm(
                env, server_nodes=args.server_nodes, processes_per_machine=args.processes_per_machine, port=args.port
            )
        else:
            node = from_env(env, processes_per_machine=args.processes_per_machine, port=args.port)
    except ValueError as error:  # int() of a variable included: its message names the value
        parser.error(f"{args.source}: {error}")
    command = accelerate_command(node, args.script, args.script_args, config_file=args.config_file, cpu=args.cpu)
    extra_env = launcher_environment(shutdown_timeout=args.shutdown_timeout, cpu=args.cpu)
    line = command_line(extra_env, command)
    if args.dry_run:
        print(line, flush=True)
        return 0
    print(f"dapo_trl.launch: {line}", file=sys.stderr, flush=True)
    try:
        os.execvpe(command[0], command, {**env, **extra_env})  # the launcher becomes the node's main process
    except FileNotFoundError:
        parser.error(f"{command[0]} is not on PATH: install accelerate in this environment (pip install accelerate).")


if __name__ == "__main__":
    sys.exit(main())
