"""Two "nodes" on one machine (two `accelerate launch --num_machines 2` processes, gloo, one shared filesystem).

Each node runs examples/train_math.py on configs/smoke.yaml through tests/scripts/cluster_run.py, which records what
every process decided. Both processes are their node's local main process, so any write guarded only by
"local main" would happen twice; `strace` shows which node wrote which file.
"""

import json
import re
import signal
import time

import pytest
from _cluster import (
    STRACE,
    TWO_NODE_EXTRA,
    free_port,
    node_lines,
    smoke_args,
    start_node,
    wait_all,
    wait_for,
    written_paths,
)

pytestmark = [pytest.mark.distributed, pytest.mark.integration]


def read_records(record_dir):
    return [json.loads((record_dir / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    base = tmp_path_factory.mktemp("two-nodes")
    out = base / "out"
    lines = node_lines("127.0.0.1", free_port(), smoke_args(out, *TWO_NODE_EXTRA))
    started = time.monotonic()
    nodes = [
        start_node(line, base, base / f"node{r}.log", base / f"trace{r}" if STRACE else None)
        for r, line in enumerate(lines)
    ]
    codes = wait_all(nodes, timeout=420)
    logs = [(base / f"node{r}.log").read_text() for r in range(2)]
    assert codes == [0, 0], "\n\n".join(log[-4000:] for log in logs)
    return {"base": base, "out": out, "records": read_records(base), "seconds": time.monotonic() - started}


def test_two_nodes_run_as_one_job(two_nodes):
    r0, r1 = two_nodes["records"]
    assert (r0["world_size"], r1["world_size"]) == (2, 2)
    assert (r0["process_index"], r1["process_index"]) == (0, 1)
    assert r0["local_process_index"] == r1["local_process_index"] == 0, "each node's process is a local main"
    assert r0["global_step"] == r1["global_step"] == 4


def test_same_decisions_and_equal_batch_shapes(two_nodes):
    r0, r1 = two_nodes["records"]
    assert r0["rounds"] == r1["rounds"], "the nodes drew different prompts or judged them differently"
    rounds_per_step = {}
    for entry in r0["rounds"]:
        rounds_per_step[entry["step"]] = rounds_per_step.get(entry["step"], 0) + 1
    assert max(rounds_per_step.values()) >= 2, "no refill round ran"
    verdicts = [v for entry in r0["rounds"] for v in entry["informative"]]
    assert any(verdicts) and not all(verdicts), "the filter must have kept some groups and dropped others"
    assert [b["shapes"] for b in r0["batches"]] == [b["shapes"] for b in r1["batches"]]
    assert len(r0["batches"]) == 4
    metrics = [
        [{k: v for k, v in h.items() if k.startswith("dynamic_sampling/")} for h in r["history"]] for r in (r0, r1)
    ]
    assert metrics[0] == metrics[1]


def test_the_main_job_frees_the_process_group_before_it_exits(two_nodes):
    # Unregistering the group is not enough: its gloo threads, left to interpreter exit, sometimes abort a finished
    # run (SIGABRT). They must be gone before exit begins.
    records = two_nodes["records"]
    assert [r["process_group_live"] for r in records] == [False, False]
    assert [r["gloo_threads_at_exit"] for r in records] == [[], []]


def test_checkpoints_and_outputs_are_complete(two_nodes):
    out = two_nodes["out"]
    assert not list(out.glob("_partial-*"))
    for step in (2, 4):
        files = {p.name for p in (out / f"checkpoint-{step}").iterdir()}
        wanted = {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json", "dapo_sampler_state.pt"}
        assert wanted | {"rng_state_0.pth", "rng_state_1.pth"} <= files, files
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert history and max(h.get("step", 0) for h in history) == 4
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["optimizer_steps"] == 4 and "accuracy_after_rl" in summary
    assert (out / "training_curves.png").stat().st_size > 10_000


@pytest.mark.skipif(STRACE is None, reason="needs strace to see which node wrote which file")
def test_every_file_is_written_by_one_node_only(two_nodes):
    base, out = two_nodes["base"], two_nodes["out"]
    node0, node1 = (written_paths(base / f"trace{r}", out) for r in range(2))
    assert node0, "the trace saw no write at all: is strace following the launcher's children?"
    assert not node0 & node1, f"written by both nodes: {sorted(node0 & node1)}"
    # The second node writes only its own RNG state and its own carried rows into each checkpoint, before the first
    # node publishes it.
    own = ("rng_state_1.pth", "dapo_carry_rank1.pt")
    assert node1 == {f"{out}/_partial-checkpoint-{s}/checkpoint-{s}/{f}" for s in (2, 4) for f in own}, sorted(node1)
    for name in ("metrics.jsonl", "eval_summary.json", "training_curves.png", "model.safetensors"):
        assert any(p.startswith(f"{out}/{name}") or p.startswith(f"{out}/.tmp") for p in node0), name


def preempt_one_node(tmp_path, max_steps):
    """
    Kubernetes reclaims one node: its launcher gets SIGTERM and forwards it to its training process; the other node
    hears nothing. Returns the two command lines, the step both stopped at and the seconds from signal to exit.
    """
    out = tmp_path / "out"
    lines = node_lines(
        "127.0.0.1", free_port(), smoke_args(out, "--max_steps", str(max_steps), "--preemption_stop_at", "rollout")
    )
    nodes = [start_node(line, tmp_path, tmp_path / f"node{r}.log") for r, line in enumerate(lines)]
    progress = [tmp_path / f"progress-rank{r}" for r in range(2)]
    wait_for(lambda: all(p.exists() for p in progress), nodes, 300, "the first optimizer step on both nodes")
    nodes[1].send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    codes = wait_all(nodes, timeout=120)
    stop_seconds = time.monotonic() - signalled
    logs = [(tmp_path / f"node{r}.log").read_text() for r in range(2)]
    assert codes == [1, 128 + signal.SIGTERM], "\n\n".join(log[-3000:] for log in logs)
    assert re.search(r"exitcode\s*:\s*75", logs[0]), logs[0][-3000:]  # torch elastic names the worker's code
    r0, r1 = read_records(tmp_path)
    assert r0["stopped_at_step"] == r1["stopped_at_step"] == r0["global_step"] == r1["global_step"]
    assert r0["gloo_threads_at_exit"] == r1["gloo_threads_at_exit"] == [], "a stop must free the group too (exit 75)"
    step = r0["global_step"]
    assert 0 < step < max_steps and step % 2 == 0, "stops at a rollout boundary (2 steps per rollout), early"
    checkpoint = out / f"checkpoint-{step}"
    assert {"rng_state_0.pth", "rng_state_1.pth", "dapo_sampler_state.pt", "optimizer.pt", "trainer_state.json"} <= {
        p.name for p in checkpoint.iterdir()
    }
    assert not list(out.glob("_partial-*")) and not (out / "eval_summary.json").exists()
    for p in progress:
        p.unlink()
    return lines, step, stop_seconds


def test_sigterm_to_one_node_stops_both_at_the_same_step(tmp_path):
    _, step, stop_seconds = preempt_one_node(tmp_path, max_steps=12)
    print(f"stopped at step {step}, both nodes exited {stop_seconds:.1f} s after the signal")
    assert stop_seconds < 60


@pytest.mark.slow
def test_the_same_commands_resume_a_preempted_two_node_run(tmp_path):
    max_steps = 12
    lines, step, _ = preempt_one_node(tmp_path, max_steps)
    restarted = [start_node(line, tmp_path, tmp_path / f"restart{r}.log") for r, line in enumerate(lines)]
    codes = wait_all(restarted, timeout=300)
    assert codes == [0, 0], (tmp_path / "restart0.log").read_text()[-3000:]
    r0, r1 = read_records(tmp_path)
    assert r0["global_step"] == r1["global_step"] == max_steps
    assert len(r0["batches"]) == len(r1["batches"]) == max_steps - step, "did not resume from the checkpoint"
    assert json.loads((tmp_path / "out" / "eval_summary.json").read_text())["optimizer_steps"] == max_steps
