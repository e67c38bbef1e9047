"""Two processes on CPU (gloo): dynamic sampling stays collective, balanced and exact."""

import os
import socket
import subprocess
import sys

import pytest
import torch
from _tiny import assert_no_gloo_thread_left, reference_gradients, tiny_model_and_tokenizer

pytestmark = [pytest.mark.distributed, pytest.mark.integration]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "distributed_run.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(out_dir, mode, script=SCRIPT, results="rank{r}.pt"):
    """Run `script out_dir mode` on 2 processes; each rank's results file (`results` with its rank), loaded."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    cmd += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd += ["--main_process_port", str(free_port()), script, str(out_dir), mode]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert_no_gloo_thread_left(out_dir, mode, 2)
    return [torch.load(out_dir / results.format(r=r), weights_only=False) for r in range(2)]


@pytest.mark.parametrize("mode", ["discard", "carry", "probe"])
def test_two_processes_balanced_exact_and_filtered(tmp_path, mode):
    ranks = launch(tmp_path, mode)
    assert ranks[0]["world"] == 2, "accelerate started a single process"
    kinds = ranks[0]["kinds"]
    _, tokenizer = tiny_model_and_tokenizer()
    reference_model, _ = tiny_model_and_tokenizer()
    steps = list(zip(ranks[0]["steps"], ranks[1]["steps"], strict=True))
    assert len(steps) == 3
    for step0, step1 in steps:
        # balanced: same number of rows on both ranks for every micro-batch
        for b0, b1 in zip(step0["batches"], step1["batches"], strict=True):
            assert b0["completion_ids"].size(0) == b1["completion_ids"].size(0) == 6
        # only informative (mixed) prompts carry weight
        for batch in step0["batches"] + step1["batches"]:
            texts = tokenizer.batch_decode(batch["prompt_ids"], skip_special_tokens=True)
            for text, advantage in zip(texts, batch["advantages"]):
                if advantage != 0:
                    assert kinds[int(text.strip()[1:-1])] == "mixed", text
        # DDP gradients equal the token-mean gradient over both ranks' micro-batches
        for name in step0["grads"]:
            torch.testing.assert_close(step0["grads"][name], step1["grads"][name])
        reference_model.load_state_dict(step0["params"])
        expected = reference_gradients(
            reference_model, step0["batches"] + step1["batches"], epsilon_low=0.2, epsilon_high=0.28
        )
        for name, grad in step0["grads"].items():
            torch.testing.assert_close(grad, expected[name], atol=1e-6, rtol=1e-5, msg=name)
    # every forward outside generation runs on every rank, equally often, with the same number of rows (ZeRO-3/FSDP)
    assert len(ranks[0]["forwards"]) == len(ranks[1]["forwards"]) > 0
    assert [f[0] for f in ranks[0]["forwards"]] == [f[0] for f in ranks[1]["forwards"]]
    history = ranks[0]["history"]
    assert all(h.get("dynamic_sampling/underfilled", 0) == 0 for h in history)
    if mode != "discard":  # probing: the same decisions on both ranks, and some groups stopped after their probe
        probe0, probe1 = ranks[0]["probe"], ranks[1]["probe"]
        for name, value in probe0.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(probe1[name])), name
        assert sum(h.get("dynamic_sampling/probe_dropped", 0) for h in history) > 0
    if mode == "carry":
        assert any(h.get("dynamic_sampling/groups_carried", 0) > 0 for h in history)
        skip0, skip1 = ranks[0]["skip"], ranks[1]["skip"]
        assert int(skip0["history"]["groups"].sum()) > 0
        for name in ("looks", "skipped", "counts", "totals"):
            assert torch.equal(skip0[name], skip1[name]), name
        for name in skip0["history"]:
            assert torch.equal(torch.as_tensor(skip0["history"][name]), torch.as_tensor(skip1["history"][name])), name


def test_two_processes_skip_the_update_of_a_batch_without_an_informative_group(tmp_path):
    ranks = launch(tmp_path, "skip")
    assert ranks[0]["world"] == 2, "accelerate started a single process"
    history = ranks[0]["history"]
    assert [h["dynamic_sampling/skipped_updates"] for h in history if "dynamic_sampling/skipped_updates" in h] == [
        0.0,
        1.0,
        1.0,
    ]
    for rank in ranks:
        first, *skipped = rank["steps"]
        assert first["optimizer"]["state"], "the first step must have given AdamW moments"
        for state in skipped:
            for name, value in first["params"].items():
                assert torch.equal(value, state["params"][name]), name
            for index, moments in first["optimizer"]["state"].items():
                for key, value in moments.items():
                    assert torch.equal(value, state["optimizer"]["state"][index][key]), (index, key)
            assert state["lr"] == first["lr"]


def test_two_processes_resumed_past_the_first_epoch_train_the_same_prompts(tmp_path):
    ranks = launch(tmp_path, "resume")
    assert ranks[0]["world"] == 2, "accelerate started a single process"
    for rank in ranks:
        full, resumed = rank["full"], rank["resumed"]
        assert len(full) == 6 and len(resumed) == 1
        assert not torch.equal(full[1], full[5]), "the test needs epochs in different orders"
        assert torch.equal(resumed[0], full[5])


CARRY_SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "carry_resume_run.py")


def test_two_processes_resume_with_carried_rows_trains_the_same_batches(tmp_path):
    def run(mode):
        return launch(tmp_path, mode, script=CARRY_SCRIPT, results=f"{mode}_rank{{r}}.pt")

    full = run("full")
    assert full[0]["world"] == 2, "accelerate started a single process"
    checkpoint = tmp_path / "checkpoint-1"
    carried = [torch.load(checkpoint / f"dapo_carry_rank{r}.pt", weights_only=True)["carry"] for r in range(2)]
    assert any(c is not None for c in carried), "the scenario must carry groups over the checkpoint"
    assert torch.load(checkpoint / "dapo_sampler_state.pt", weights_only=True)["carry"] is None  # never replicated
    resumed = run("resume")
    for rank in range(2):
        expected, got = full[rank]["batches"][1:], resumed[rank]["batches"]
        assert len(got) == len(expected) == 2
        for want, have in zip(expected, got, strict=True):
            assert want.keys() == have.keys()
            for key in want:
                torch.testing.assert_close(have[key], want[key], msg=f"rank {rank}, {key}")
