"""configs/smollm2_cpu.yaml: SmolLM2-135M-Instruct through a format warm-up and DAPO on CPU, scored before and after RL
on the same held-out problems (dapo_trl.run.warmup). The full recipe's measured run is in docs/real_model.md; the slow
test runs a reduced version of it (2 warm-up steps, one rollout of 2 updates, 8 held-out problems)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from _real_model import ROOT

from dapo_trl.run.warmup import freeze_below, paired_change


def scored(correct: list[float]) -> dict:
    return {"n": len(correct), "accuracy": sum(correct) / len(correct), "correct": correct}


def test_paired_change_uses_the_per_problem_difference():
    # the same 4 problems: two flipped right, none flipped wrong -> +0.5, SE of [0, 1, 1, 0] = 0.2887
    change = paired_change(scored([1, 0, 0, 0]), scored([1, 1, 1, 0]))
    assert change["change"] == pytest.approx(0.5)
    assert change["paired_se"] == pytest.approx(0.5 / 3**0.5)
    assert change["above_2_se"] is False
    with pytest.raises(ValueError):  # not the same problems
        paired_change(scored([1, 0]), scored([1, 0, 1]))


def test_freeze_below_trains_only_the_top_layers_and_the_final_norm():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=4, num_attention_heads=2,
        tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    trainable = freeze_below(model, 1)
    names = {name for name, p in model.named_parameters() if p.requires_grad}
    assert names and all(name.startswith(("model.layers.3.", "model.norm.")) for name in names)
    assert trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    model(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    assert model.model.embed_tokens.weight.grad is None and model.model.layers[3].mlp.up_proj.weight.grad is not None
    with pytest.raises(ValueError, match="train_top_layers"):
        freeze_below(model, 5)


@pytest.mark.real_model
@pytest.mark.slow
def test_smollm2_cpu_recipe_reduced_writes_the_paired_heldout_change(tmp_path, smollm2_dir):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    args = ["--config", "configs/smollm2_cpu.yaml", "--model_name_or_path", str(smollm2_dir)]
    args += ["--output_dir", str(out), "--sft_steps", "2", "--max_steps", "2", "--eval_max_samples", "8"]
    result = subprocess.run(
        [sys.executable, "examples/train_math.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=1500,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["optimizer_steps"] == 2
    heldout = summary["heldout"]
    assert heldout["n"] == 8 and set(heldout) >= {"before", "after", "change", "paired_se"}
    assert heldout["change"] == pytest.approx(heldout["after"] - heldout["before"])
    assert summary["warmup"]["steps"] == 2 and summary["trainable_parameters"] < 134_515_008 / 2
    assert set(summary["seconds"]) >= {"warmup", "eval_before", "rl", "eval_after", "total"}
    # only the final model: no periodic checkpoint (model + optimizer state) in the run folder
    assert (out / "model.safetensors").is_file() and not list(out.glob("checkpoint-*"))
