"""Launch recipes: `dapo_trl.launch`, the SLURM batch script under simulated SLURM, the Kubernetes manifests."""

import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _cluster import ROOT, SCRIPT, TWO_NODE_EXTRA, free_port, node_lines, smoke_args, split_line, wait_for

from dapo_trl.run.launch import (
    FORWARDED_SIGNALS,
    NodeLaunch,
    accelerate_command,
    command_line,
    expand_hostlist,
    from_env,
    from_slurm,
    launcher_environment,
    main,
)

SBATCH = ROOT / "examples" / "slurm" / "dapo.sbatch"
K8S = ROOT / "examples" / "kubernetes"


# ---------------------------------------------------------------------------------------------------- the module


@pytest.mark.parametrize(
    ("hostlist", "expected"),
    [
        ("node1", ["node1"]),
        ("gpu[01-03,07],login1", ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]),
        ("a[8-10]", ["a8", "a9", "a10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("x[098-101]", ["x098", "x099", "x100", "x101"]),
    ],
)
def test_expand_hostlist(hostlist, expected):
    assert expand_hostlist(hostlist) == expected


@pytest.mark.parametrize("bad", ["", "gpu[a-b]", "gpu[1-2"])
def test_expand_hostlist_refuses_what_it_cannot_read(bad):
    with pytest.raises(ValueError):
        expand_hostlist(bad)


SLURM = {"SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_JOB_ID": "4321", "SLURM_GPUS_ON_NODE": "8"}


def test_slurm_node_rank_head_and_port():
    nodes = [from_slurm({**SLURM, "SLURMD_NODENAME": name}) for name in ("gpu02", "gpu03", "gpu04")]
    assert [n.machine_rank for n in nodes] == [0, 1, 2]
    assert {(n.num_machines, n.main_process_ip, n.main_process_port, n.processes_per_machine) for n in nodes} == {
        (3, "gpu02", 20000 + 4321, 8)
    }
    no_server = from_slurm({**SLURM, "SLURMD_NODENAME": "gpu01", "MAIN_PROCESS_PORT": "29600"}, server_nodes=0)
    assert (no_server.num_machines, no_server.machine_rank, no_server.main_process_port) == (4, 0, 29600)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SLURMD_NODENAME": "gpu01"}, "not a training node"),
        ({"SLURMD_NODENAME": "gpu02", "SLURM_STEP_NUM_NODES": "2"}, "rendezvous would wait forever"),
        ({"SLURMD_NODENAME": "gpu02", "SLURM_JOB_NODELIST": "gpu01"}, "none is left for training"),
        ({"SLURMD_NODENAME": "gpu02", "SLURM_GPUS_ON_NODE": ""}, "processes_per_machine"),
    ],
)
def test_slurm_mistakes_are_named(env, message):
    with pytest.raises(ValueError, match=message):
        from_slurm({**SLURM, **env})


def test_env_node_reads_the_kubernetes_index():
    env = {
        "NUM_MACHINES": "4",
        "JOB_COMPLETION_INDEX": "3",
        "MAIN_PROCESS_IP": "job-0.svc",
        "PROCESSES_PER_MACHINE": "8",
    }
    assert from_env(env) == NodeLaunch(4, 3, "job-0.svc", 29500, 8)
    with pytest.raises(ValueError, match="machine_rank 4"):
        from_env({**env, "MACHINE_RANK": "4"})
    with pytest.raises(ValueError, match="MACHINE_RANK"):
        from_env({k: v for k, v in env.items() if k != "JOB_COMPLETION_INDEX"})


def test_command_counts_processes_over_all_nodes():
    command = accelerate_command(NodeLaunch(2, 1, "head", 29500, 8), "train.py", ["--x", "1"], config_file="z.yaml")
    assert command[:4] == ["accelerate", "launch", "--config_file", "z.yaml"]
    flags = dict(zip(command[4:-3:2], command[5:-3:2]))
    assert flags["--num_processes"] == "16" and flags["--machine_rank"] == "1" and flags["--main_process_ip"] == "head"
    assert command[-3:] == ["train.py", "--x", "1"]


def test_cli_dry_run_prints_the_line_it_would_run(capsys):
    env = {**SLURM, "SLURMD_NODENAME": "gpu03"}
    assert main(["slurm", "--dry_run", "--config_file", "c.yaml", "train.py", "--lr", "1e-6"], env=env) == 0
    launch_env, argv = split_line(capsys.readouterr().out.strip())
    assert launch_env == launcher_environment() and "SIGUSR1" in launch_env["PET_SIGNALS_TO_HANDLE"]
    assert argv == accelerate_command(from_slurm(env), "train.py", ["--lr", "1e-6"], config_file="c.yaml")


def test_cli_runs_accelerate_with_the_forwarding_settings(tmp_path):
    """Without --dry_run the module replaces itself with `accelerate` (here a stand-in that prints what it got)."""
    fake = tmp_path / "accelerate"
    fake.write_text('#!/bin/sh\necho "$PET_SIGNALS_TO_HANDLE $TORCH_ELASTIC_SHUTDOWN_TIMEOUT $*"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "NUM_MACHINES": "2", "MACHINE_RANK": "1"}
    env.update(MAIN_PROCESS_IP="head", PROCESSES_PER_MACHINE="1", PYTHONPATH=str(ROOT / "src"))
    cmd = [sys.executable, "-m", "dapo_trl.launch", "env", "--shutdown_timeout", "77", "t.py", "--a", "b"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert out[:2] == [FORWARDED_SIGNALS, "77"]
    assert out[2:] == accelerate_command(NodeLaunch(2, 1, "head", 29500, 1), "t.py", ["--a", "b"])[1:]


# ---------------------------------------------------------------------------------------------------- SLURM


FAKE_SRUN = """#!{python}
# Stands in for srun: records the step, then runs its command once per node of --nodelist with the variables slurmd
# sets in a task (a vLLM server step just waits to be killed; with FAKE_SRUN_BLOCK a training step waits for SIGUSR1).
import json, os, signal, subprocess, sys, time
args, opts = sys.argv[1:], {{}}
while args[0].startswith("--"):
    key, _, value = args.pop(0)[2:].partition("=")
    opts[key] = value
def log(event):
    with open(os.environ["FAKE_SLURM_LOG"], "a") as f:
        f.write(json.dumps(event) + "\\n")
log({{"srun": opts, "command": args}})
if args[0] == "trl":
    time.sleep(600)
if os.environ.get("FAKE_SRUN_BLOCK"):
    signal.signal(signal.SIGUSR1, lambda *a: (log({{"signal": "USR1"}}), sys.exit(0)))
    open(os.environ["FAKE_SRUN_BLOCK"], "w").close()
    while True:
        time.sleep(1)
for node in opts["nodelist"].split(","):
    env = dict(os.environ, SLURMD_NODENAME=node, SLURM_STEP_NUM_NODES=opts["nodes"])
    code = subprocess.call(args, env=env)
    if code:
        sys.exit(code)
"""


def run_sbatch(tmp_path, nodelist, settings, block=False):
    """Run examples/slurm/dapo.sbatch here with simulated SLURM variables and stand-ins for srun, curl, scontrol."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(FAKE_SRUN.format(python=sys.executable))
    (bin_dir / "curl").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "{\\"scontrol\\": \\"$*\\"}" >> "$FAKE_SLURM_LOG"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    log = tmp_path / "slurm.log"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT / "src"),
        "FAKE_SLURM_LOG": str(log),
        "SLURM_JOB_ID": "1234",
        "SLURM_JOB_NODELIST": nodelist,
        **settings,
    }
    if block:
        env["FAKE_SRUN_BLOCK"] = str(tmp_path / "training-started")
    process = subprocess.Popen(["bash", str(SBATCH)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    return process, log


def finish(process, log):
    out, _ = process.communicate(timeout=120)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    return process.returncode, out, events


def launch_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if " accelerate launch " in f" {line} "]


def test_sbatch_builds_the_two_node_test_lines(tmp_path):
    """With the two-node test's settings, the script's lines are the ones tests/test_cluster.py runs."""
    out_dir = tmp_path / "out"
    train_args = smoke_args(out_dir, *TWO_NODE_EXTRA)
    assert train_args[:4] == ["--config", "configs/smoke.yaml", "--auto_resume", "true"]  # what the script adds
    settings = {
        "VLLM_NODES": "0",
        "TRAIN_SCRIPT": SCRIPT,
        "TRAIN_CONFIG": "configs/smoke.yaml",
        "TRAIN_ARGS": shlex.join(train_args[4:]),
        "ACCELERATE_CONFIG": "",
        "LAUNCH_ARGS": "--cpu --processes_per_machine 1 --dry_run",
    }
    code, out, events = finish(*run_sbatch(tmp_path, "cpu-node[1-2]", settings))
    assert code == 0, out
    assert launch_lines(out) == node_lines("cpu-node1", 20000 + 1234, train_args)
    (step,) = events
    assert step["srun"]["nodelist"] == "cpu-node1,cpu-node2" and step["srun"]["nodes"] == "2"


def test_sbatch_puts_the_vllm_server_on_the_first_node(tmp_path):
    code, out, events = finish(
        *run_sbatch(tmp_path, "gpu[07-09]", {"SLURM_GPUS_ON_NODE": "8", "LAUNCH_ARGS": "--dry_run"})
    )
    assert code == 0, out
    # the server's srun is started in the background, so the two steps may be recorded in either order
    (server,) = [e for e in events if e["command"][:1] == ["trl"]]
    (training,) = [e for e in events if e["command"][:1] != ["trl"]]
    assert server["srun"]["nodelist"] == "gpu07"
    assert server["command"][:3] == ["trl", "vllm-serve", "--model"] and "Qwen/Qwen2.5-32B" in server["command"]
    assert training["srun"]["nodelist"] == "gpu08,gpu09"
    args = ["--config", "configs/dapo_qwen2.5_32b.yaml", "--auto_resume", "true"]
    args += ["--vllm_server_host", "gpu07", "--vllm_server_port", "8000"]
    expected = [
        command_line(
            launcher_environment(),
            accelerate_command(
                NodeLaunch(2, rank, "gpu08", 21234, 8),
                "examples/train_math.py",
                args,
                config_file="configs/accelerate/zero3.yaml",
            ),
        )
        for rank in range(2)
    ]
    assert launch_lines(out) == expected
    assert_recipe_arguments_parse(args, tmp_path)


def test_sbatch_forwards_sigusr1_and_requeues(tmp_path):
    process, log = run_sbatch(tmp_path, "gpu[1-3]", {"SLURM_GPUS_ON_NODE": "8"}, block=True)
    wait_for((tmp_path / "training-started").exists, [process], 60, "the training step's start")
    process.send_signal(signal.SIGUSR1)  # what SLURM sends the batch shell before the time limit
    code, out, events = finish(process, log)
    assert code == 0, out
    assert {"signal": "USR1"} in events, "the training step did not receive the signal"
    assert events[-1] == {"scontrol": "requeue 1234"}


# ---------------------------------------------------------------------------------------------------- Kubernetes


def manifests() -> dict:
    docs = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def env_of(container) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_manifests_parse_and_wire_the_vllm_server():
    docs = manifests()
    assert set(docs) == {
        ("PersistentVolumeClaim", "dapo-runs"),
        ("Deployment", "dapo-vllm"),
        ("Service", "dapo-vllm"),
        ("Service", "dapo-train"),
        ("Job", "dapo-train"),
    }
    deployment, service = docs[("Deployment", "dapo-vllm")], docs[("Service", "dapo-vllm")]
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (server,) = pod["spec"]["containers"]
    command = server["command"]
    port = int(command[command.index("--port") + 1])
    assert service["spec"]["ports"][0]["targetPort"] == server["ports"][0]["containerPort"] == port
    assert server["readinessProbe"]["httpGet"]["port"] == port
    assert int(command[command.index("--tensor_parallel_size") + 1]) == server["resources"]["limits"]["nvidia.com/gpu"]

    job = docs[("Job", "dapo-train")]
    (trainer,) = job["spec"]["template"]["spec"]["containers"]
    args = trainer["command"][trainer["command"].index("examples/train_math.py") + 1 :]
    assert args[args.index("--vllm_server_host") + 1] == service["metadata"]["name"]
    assert int(args[args.index("--vllm_server_port") + 1]) == service["spec"]["ports"][0]["port"]
    recipe = yaml.safe_load((ROOT / args[args.index("--config") + 1]).read_text())
    assert command[command.index("--model") + 1] == recipe["model_name_or_path"]
    assert int(command[command.index("--max_model_len") + 1]) == recipe["vllm_max_model_length"]
    (init,) = job["spec"]["template"]["spec"]["initContainers"]
    assert f"http://dapo-vllm:{port}/health" in " ".join(init["command"])
    claims = {v["persistentVolumeClaim"]["claimName"] for d in (deployment, job) for v in d["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v}  # fmt: skip
    assert (
        claims == {"dapo-runs"}
        and "ReadWriteMany" in docs[("PersistentVolumeClaim", "dapo-runs")]["spec"]["accessModes"]
    )


def test_training_job_env_wiring_gives_each_pod_its_accelerate_line(capsys, tmp_path):
    docs = manifests()
    job, headless = docs[("Job", "dapo-train")], docs[("Service", "dapo-train")]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    (trainer,) = pod["containers"]
    env = env_of(trainer)
    machines = int(env["NUM_MACHINES"])
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == machines
    assert env["MACHINE_RANK"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["selector"] == {"job-name": "dapo-train"}
    assert pod["subdomain"] == headless["metadata"]["name"]
    assert env["MAIN_PROCESS_IP"] == f"{job['metadata']['name']}-0.{headless['metadata']['name']}"
    assert int(env["MAIN_PROCESS_PORT"]) == headless["spec"]["ports"][0]["port"]
    assert int(env["PROCESSES_PER_MACHINE"]) == trainer["resources"]["limits"]["nvidia.com/gpu"]
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] >= 300
    rules = spec["podFailurePolicy"]["rules"]
    assert {"type": "DisruptionTarget"} in rules[0]["onPodConditions"] and rules[1]["onExitCodes"]["values"] == [143]

    command = trainer["command"]
    assert command[:4] == ["python", "-m", "dapo_trl.launch", "env"]
    script = command.index("examples/train_math.py")
    args = command[script + 1 :]
    assert args[args.index("--auto_resume") + 1] == "true"
    assert args[args.index("--output_dir") + 1].startswith(trainer["volumeMounts"][0]["mountPath"] + "/")
    config_file = command[command.index("--config_file") + 1]
    assert (ROOT / config_file).is_file()
    for index in range(machines):
        pod_env = {**{k: v for k, v in env.items() if isinstance(v, str)}, "MACHINE_RANK": str(index)}
        assert main(["env", "--dry_run", *command[4:]], env=pod_env) == 0
        expected = accelerate_command(
            NodeLaunch(machines, index, "dapo-train-0.dapo-train", 29500, 8),
            "examples/train_math.py",
            args,
            config_file=config_file,
        )
        assert split_line(capsys.readouterr().out.strip()) == (launcher_environment(), expected)
    assert_recipe_arguments_parse(args, tmp_path)


def assert_recipe_arguments_parse(args, output_dir):
    """The recipe's script arguments are real flags of examples/train_math.py and pass DAPOConfig's checks."""
    spec = importlib.util.spec_from_file_location("train_math_for_launch", ROOT / "examples" / "train_math.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    args = [str(ROOT / a) if a.startswith("configs/") else a for a in args]
    cpu = ["--use_cpu", "true", "--bf16", "false", "--output_dir", str(output_dir)]  # this machine has no GPU
    _, training_args, _ = module.parse_args(args + cpu)
    assert training_args.auto_resume is True and training_args.preemption_handling is True


WORKER = """
import os, signal, sys, time
received = []
signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
rank = os.environ["RANK"]
open(sys.argv[1] + rank, "w").close()
deadline = time.monotonic() + 120
while not received and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(1)  # saving a checkpoint
open(sys.argv[2] + rank, "w").write(repr(received))
sys.exit(75)
"""


@pytest.mark.distributed
def test_the_launcher_forwards_sigusr1_and_waits_for_the_save(tmp_path):
    """SLURM signals the node's launcher: it must pass SIGUSR1 on (torch only forwards SIGTERM & co by default)."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    ready, done = tmp_path / "ready", tmp_path / "done"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT / "src"),
    }
    env.update(NUM_MACHINES="1", MACHINE_RANK="0", MAIN_PROCESS_IP="127.0.0.1", MAIN_PROCESS_PORT=str(free_port()))
    cmd = [sys.executable, "-m", "dapo_trl.launch", "env", "--cpu", "--processes_per_machine", "2"]
    launcher = subprocess.Popen([*cmd, str(script), str(ready), str(done)], env=env, cwd=tmp_path)
    wait_for(lambda: all(Path(f"{ready}{rank}").exists() for rank in range(2)), [launcher], 120, "worker start")
    launcher.send_signal(signal.SIGUSR1)
    assert launcher.wait(timeout=120) == 128 + signal.SIGUSR1
    for rank in range(2):
        assert Path(f"{done}{rank}").read_text() == repr([int(signal.SIGUSR1)]), "no signal, or killed while saving"
