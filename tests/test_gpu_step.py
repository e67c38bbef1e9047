"""benchmarks/gpu_step.py: its CPU smoke mode runs both trainers and prints figures that parse; its pieces (tokenizer,
scripted reward) do what the GPU run relies on; scripts/fetch_gpu_wheels.sh lists what it would download."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def load_gpu_step():
    if "gpu_step" in sys.modules:
        return sys.modules["gpu_step"]
    spec = importlib.util.spec_from_file_location("gpu_step", ROOT / "benchmarks" / "gpu_step.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_step"] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


def test_tokenizer_fills_the_model_vocabulary_and_the_model_has_qwen25_05b_shape():
    gpu_step = load_gpu_step()
    tokenizer = gpu_step.build_tokenizer(500)
    assert len(tokenizer) == 500
    assert tokenizer.decode(tokenizer("#3 easy: 12\n")["input_ids"]) == "#3 easy: 12\n"
    assert tokenizer.convert_ids_to_tokens(499) == "<f499>"  # a sampled filler id decodes to text
    full = gpu_step.build_tokenizer(gpu_step.QWEN25_05B["vocab_size"])
    assert len(full) == 151_936
    # Qwen2.5-0.5B's exact parameter count, built on the meta device (no memory, no time)
    model = gpu_step.build_model(gpu_step.QWEN25_05B, full, dtype=torch.bfloat16, device="meta", seed=0)
    assert sum(p.numel() for p in model.parameters()) == 494_032_768
    with pytest.raises(ValueError, match="vocab_size"):
        gpu_step.build_tokenizer(10)


def test_prompts_have_the_requested_length_and_half_the_groups_are_constant():
    gpu_step = load_gpu_step()
    tokenizer = gpu_step.build_tokenizer(128)
    data = gpu_step.make_dataset(40, 24)
    assert {len(tokenizer(p)["input_ids"]) for p in data["prompt"]} == {24}
    reward = gpu_step.ScriptedReward()
    completions = [f"completion {i}" for i in range(8)]
    constant = 0
    for kind in data["kind"]:
        scores = reward(completions, [[1, 2, 3]] * 8, [kind] * 8)
        assert set(scores) <= {-1.0, 1.0}
        constant += len(set(scores)) == 1
    assert constant == 20  # easy and hard prompts; every mixed group varies
    assert reward.completion_tokens == 40 * 8 * 3


@pytest.mark.integration
def test_cpu_tiny_mode_prints_figures_that_parse(capsys):
    gpu_step = load_gpu_step()
    results = gpu_step.main(["--cpu", "--tiny"])
    out = capsys.readouterr().out
    rows = {}
    for kind in gpu_step.KINDS:
        (line,) = [ln for ln in out.splitlines() if ln.startswith(f"| {gpu_step.LABELS[kind]} |")]
        cells = [c.strip() for c in line.strip("|").split("|")][1:]
        rows[kind] = [float(c) for c in cells[:-1]] + [cells[-1]]
        steps_per_s, tokens_per_s, informative_per_s, generated, trained, peak = rows[kind]
        assert steps_per_s > 0 and tokens_per_s > 0 and informative_per_s >= 0
        assert generated >= trained == 4  # --tiny: 4 prompts per step
        assert peak == "n/a"  # no GPU memory on CPU
        assert steps_per_s == pytest.approx(results[kind]["steps_per_s"], rel=1e-3)
    # GRPO generates exactly the batch; DAPO generated and scored more rows than it trained (refill happened)
    assert rows["GRPO"][3] == 4 and rows["DAPO"][3] > 4
    ratio = re.search(r"DAPO / GRPO ratio: steps/s ([\d.]+), completion tokens/s ([\d.]+)", out)
    assert ratio and float(ratio.group(1)) == pytest.approx(rows["DAPO"][0] / rows["GRPO"][0], rel=1e-2)
    metrics = dict(re.findall(r"^  (dynamic_sampling/\w+): ([-\d.]+)$", out, flags=re.M))
    assert float(metrics["dynamic_sampling/rounds"]) >= 1
    assert float(metrics["dynamic_sampling/groups_trained"]) == 4
    assert 0 < float(metrics["dynamic_sampling/informative_frac"]) < 1


def test_fetch_script_lists_the_wheels_it_would_download():
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "fetch_gpu_wheels.sh"), "--list"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    packages = [line.split()[0] for line in out.splitlines() if line.strip()]
    for name in ("trl==1.16.", "latex2sympy2_extended", "antlr4-python3-runtime", "pyarrow", "pandas"):
        assert any(p.startswith(name) for p in packages), name
    assert any(p.startswith("datasets==") for p in packages)
    assert not any(p.split("=")[0] in ("torch", "transformers", "accelerate", "peft") for p in packages)


def test_word_problems_are_distinct_chat_prompts_and_the_splits_are_disjoint():
    gpu_step = load_gpu_step()
    train = gpu_step.make_word_problems(200, seed=0, split="train")
    test = gpu_step.make_word_problems(40, seed=0, split="test")
    texts = {
        split: [row["prompt"][0]["content"] for row in data] for split, data in (("train", train), ("test", test))
    }
    assert len(set(texts["train"])) == 200 and len(set(texts["test"])) == 40
    assert not set(texts["train"]) & set(texts["test"])
    assert all(row["prompt"][0]["role"] == "user" and int(row["answer"]) >= 0 for row in train)
    assert gpu_step.make_word_problems(5, seed=0, split="test")["answer"] == test["answer"][:5]  # seeded
    with pytest.raises(ValueError, match="split"):
        gpu_step.make_word_problems(1, seed=0, split="valid")


@pytest.mark.real_model
@pytest.mark.slow
def test_real_model_cpu_tiny_mode_trains_smollm2_with_both_trainers(capsys, smollm2_dir):
    gpu_step = load_gpu_step()
    results = gpu_step.main(["--cpu", "--tiny", "--real-model", str(smollm2_dir)])
    out = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct (pretrained) (134,515,008 parameters)" in out
    for kind in gpu_step.KINDS:
        (line,) = [ln for ln in out.splitlines() if ln.startswith(f"| {gpu_step.LABELS[kind]} |")]
        steps_per_s, tokens_per_s = (float(c) for c in line.strip("|").split("|")[1:3])
        assert steps_per_s == pytest.approx(results[kind]["steps_per_s"], abs=5e-5) and tokens_per_s > 0  # 4 decimals
    accuracy = re.search(r"before training ([\d.]+), after GRPOTrainer ([\d.]+), after DAPOTrainer ([\d.]+)", out)
    assert accuracy, out
    assert float(accuracy.group(2)) == pytest.approx(results["GRPO"]["heldout_accuracy"], abs=1e-4)
    assert float(accuracy.group(3)) == pytest.approx(results["DAPO"]["heldout_accuracy"], abs=1e-4)
    assert all(0 <= float(a) <= 1 for a in accuracy.groups())
    # DAPO's mechanisms acted on the real completions: overlong metrics logged, dynamic sampling ran
    metrics = dict(re.findall(r"^  ([\w/]+): ([-\d.]+)$", out, flags=re.M))
    assert "overlong/truncated_ratio" in metrics and float(metrics["dynamic_sampling/rounds"]) >= 1


def test_a_ratio_over_zero_informative_groups_reads_na():
    gpu_step = load_gpu_step()
    assert gpu_step.ratio(3.0, 2.0) == "1.500" and gpu_step.ratio(1.0, 0.0) == "n/a"
