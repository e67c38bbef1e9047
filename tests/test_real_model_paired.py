"""The pre-registered analysis of the DAPO-against-GRPO comparison (benchmarks/real_model_paired.py), on synthetic
results, and the one-command rebuild of a unit (`benchmarks/real_model.py --phase rebuild`) on the tiny model."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load():
    spec = importlib.util.spec_from_file_location("real_model_paired", ROOT / "benchmarks" / "real_model_paired.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_t_distribution_matches_tabulated_quantiles():
    paired = load()
    # two-sided 95% and one-sided 80% quantiles from a t table
    for df, q975, q80 in [(1, 12.706, 1.376), (2, 4.303, 1.061), (7, 2.365, 0.896), (15, 2.131, 0.866)]:
        assert paired.t_quantile(0.975, df) == pytest.approx(q975, abs=1e-3)
        assert paired.t_quantile(0.80, df) == pytest.approx(q80, abs=1e-3)
    assert paired.t_cdf(-2.365, 7) == pytest.approx(0.025, abs=1e-4)


def test_paired_summary_is_the_paired_t_test():
    paired = load()
    dapo, grpo = [0.61, 0.63, 0.60, 0.66], [0.60, 0.60, 0.61, 0.62]
    s = paired.paired_summary(dapo, grpo)
    diffs = [0.01, 0.03, -0.01, 0.04]
    mean = sum(diffs) / 4
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 3)
    assert s["mean"] == pytest.approx(mean) and s["sd"] == pytest.approx(sd) and s["se"] == pytest.approx(sd / 2)
    assert s["ci95"] == pytest.approx((mean - 3.182 * sd / 2, mean + 3.182 * sd / 2), abs=1e-4)
    assert s["t"] == pytest.approx(mean / (sd / 2)) and s["p"] == pytest.approx(0.2126, abs=2e-3)  # t = 1.578 on 3 df
    with pytest.raises(ValueError):
        paired.paired_summary([0.5], [0.4])


def test_the_power_rule_picks_8_or_16_pairs():
    paired = load()
    assert paired.largest_sd(8) == pytest.approx(0.02 * math.sqrt(8) / (2.365 + 0.896), abs=1e-4)
    assert paired.pairs_needed(0.017) == 8 and paired.pairs_needed(0.018) == 16
    # with few disagreements the first comparison's SD was mostly training noise, which stays
    assert paired.predicted_sd(0.05) == pytest.approx(math.sqrt(0.036**2 - 0.05 / 150 + 0.05 / 1000))
    assert paired.predicted_sd(0.5) == pytest.approx(math.sqrt(0.5 / 1000))  # held-out noise explains it all


def test_the_pilot_budget_is_the_largest_point_where_neither_arm_has_plateaued():
    paired = load()
    grid = [0, 2500, 5000, 7500, 10000, 12500, 15000, 17500, 20000, 22500, 25000]
    rising = list(zip(grid, [0.40 + 0.01 * i for i in range(11)], strict=True))  # +0.01 per point to the end
    flat_late = list(zip(grid, [0.40, 0.45, 0.50, 0.55, 0.58, 0.60, 0.61, 0.615, 0.62, 0.62, 0.62], strict=True))
    decision = paired.pilot_budget({"grpo": flat_late, "dapo": rising}, dapo_min_tokens=6100)
    assert decision["b_min"] == 7500 and not decision["fallback"]
    # flat_late gains < 0.015 to the end from 15,000 on: the largest open point in [7,500, 16,000] is 12,500
    assert decision["budget"] == 12500
    early = list(zip(grid, [0.40, 0.60] + [0.60] * 9, strict=True))
    fallback = paired.pilot_budget({"grpo": early, "dapo": rising}, dapo_min_tokens=6100)
    assert fallback["fallback"] and fallback["budget"] == 7500


def test_mechanisms_are_averaged_over_the_same_token_ranges_in_every_arm():
    paired = load()
    # GRPO takes 4 steps per range, DAPO 1: per-range means, not per-step means over different ranges
    grpo = [{"step": i + 1, "tokens": 250 * i + 100, "entropy": 1.0 - 0.05 * i} for i in range(16)]
    dapo = [{"step": i + 1, "tokens": 1000 * (i + 1) - 1, "entropy": 0.9} for i in range(4)]
    edges = [0, 1000, 2000, 3000, 4000]
    assert paired.at_equal_tokens(grpo, "entropy", edges) == pytest.approx([0.925, 0.725, 0.525, 0.325])
    assert paired.at_equal_tokens(dapo, "entropy", edges) == pytest.approx([0.9] * 4)
    history = [
        {"tokens": 100, "completions_so_far": 10, "overlong_zone_so_far": 1},
        {"tokens": 200, "completions_so_far": 20, "overlong_zone_so_far": 5},
    ]
    assert paired.zone_share(history, [0, 150, 300]) == pytest.approx([0.1, 0.4])


def synthetic(seeds: int, effect: float, noise: float, budget: int = 10_000) -> dict:
    rng = random.Random(0)
    arms: dict = {"grpo": {"seeds": []}, "dapo": {"seeds": []}}
    for seed in range(100, 100 + seeds):
        base = 0.6 + rng.gauss(0, noise)
        for arm, accuracy in (("grpo", base), ("dapo", base + effect + rng.gauss(0, noise))):
            correct = "".join("1" if rng.random() < accuracy else "0" for _ in range(200))
            arms[arm]["seeds"].append(
                {
                    "seed": seed,
                    "generated_tokens": budget + rng.randint(-300, 300),
                    "heldout_accuracy": correct.count("1") / 200,
                    "heldout_correct": correct,
                    "optimizer_steps": 18 if arm == "grpo" else 10,
                    "seconds": 600.0,
                    "curve": [
                        {"step": 0, "tokens": 0, "accuracy": 0.4, "correct": correct},
                        {"step": 8, "tokens": budget // 2, "accuracy": accuracy - 0.02, "correct": correct},
                        {"step": 18, "tokens": budget, "accuracy": correct.count("1") / 200, "correct": correct},
                    ],
                    "history": [
                        {"step": s, "tokens": 600 * s, "entropy": 0.2, "clip_ratio/high_mean": 0.01}
                        for s in range(1, 18)
                    ],  # fmt: skip
                }
            )
    settings = {"model": "m", "budget_tokens": budget, "updates_per_rollout": 2, "shared_order": True}
    return {"settings": settings, "arms": arms, "warmup": {"heldout_accuracy": 0.4, "heldout_correct": "0" * 200}}


def test_the_report_states_the_primary_comparison_with_its_interval():
    paired = load()
    data = synthetic(seeds=8, effect=0.0, noise=0.01)
    text, numbers = paired.format_report(data)
    primary = numbers["primary"]
    dapo = [s["heldout_accuracy"] for s in data["arms"]["dapo"]["seeds"]]
    grpo = [s["heldout_accuracy"] for s in data["arms"]["grpo"]["seeds"]]
    assert primary["mean"] == pytest.approx(sum(dapo) / 8 - sum(grpo) / 8)
    assert f"{primary['mean']:+.4f}" in text and "95% CI" in text
    low, high = primary["ci95"]
    assert ("no difference detected" in text) == (low <= 0 <= high)
    assert numbers["half_budget"]["n"] == 8 and numbers["by_problem"] is not None
    assert numbers["off_budget"] == []
    assert numbers["mechanisms"]["dapo"]["entropy"][0] == pytest.approx((0.2, 0.0))


def test_the_report_summarises_cost_and_sets_off_budget_pairs_aside_only_in_a_labelled_sensitivity():
    paired = load()
    data = synthetic(seeds=6, effect=0.0, noise=0.01)
    far = data["arms"]["dapo"]["seeds"][2]
    far["generated_tokens"] = 10_800  # 8% over the 10,000-token budget
    far["heldout_accuracy"] += 0.3  # an outlier the sensitivity leaves out
    text, numbers = paired.format_report(data)
    assert numbers["off_budget"] == [("dapo", far["seed"], 10_800)]
    assert numbers["primary"]["n"] == 6 and numbers["within_budget"]["n"] == 5
    assert numbers["within_budget"]["mean"] == pytest.approx(
        (sum(numbers["primary"]["diffs"]) - numbers["primary"]["diffs"][2]) / 5
    )
    assert "not pre-registered" in text
    grpo_tokens = [s["generated_tokens"] for s in data["arms"]["grpo"]["seeds"]]
    assert numbers["means"]["grpo"]["generated_tokens"][0] == pytest.approx(sum(grpo_tokens) / 6)
    assert numbers["means"]["dapo"]["optimizer_steps"] == (10, 0.0)
    assert numbers["means"]["grpo"]["minutes"][0] == pytest.approx(10.0)
    assert "within_budget" not in paired.format_report(synthetic(seeds=6, effect=0.0, noise=0.01))[1]


def test_a_report_with_one_pair_has_no_primary_comparison():
    paired = load()
    text, numbers = paired.format_report(synthetic(seeds=1, effect=0.0, noise=0.0))
    assert "primary" not in numbers and "Primary" not in text


def test_the_rebuild_command_line_carries_every_recorded_setting(tmp_path):
    spec = importlib.util.spec_from_file_location("real_model_benchmark", ROOT / "benchmarks" / "real_model.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules["real_model_benchmark"] = bench
    spec.loader.exec_module(bench)
    argv = ["--model", str(tmp_path / "SmolLM2-135M-Instruct"), "--phase", "unit", "--vllm", "--shared-order"]
    argv += ["--stop-rule", "nearest", "--eval-at-start", "--test-size", "1000", "--two-step", "0"]
    argv += ["--warmup-two-step", "0.6", "--eval-fractions", "0.5", "1.0", "--budget-tokens", "12500", "--lr", "3e-5"]
    argv += ["--max-rounds", "0", "--overlong-buffer-len", "0", "--rl-seed", "3", "--arms", "dapo"]
    settings = bench.unit_settings(bench.parse_args(argv))
    again = bench.unit_command(
        settings, model=str(tmp_path / "SmolLM2-135M-Instruct"), arm="dapo", seed=3, cache_dir="c", results_dir="r"
    )
    rebuilt = bench.parse_args(again)
    assert (rebuilt.arms, rebuilt.rl_seed, rebuilt.cache_dir, rebuilt.results_dir) == (["dapo"], 3, "c", "r")
    assert {k: v for k, v in bench.unit_settings(rebuilt).items() if k != "code"} == {
        k: v for k, v in settings.items() if k != "code"
    }


@pytest.mark.integration
def test_a_unit_is_rebuilt_from_its_recorded_settings_with_one_command(tmp_path):
    script = ROOT / "benchmarks" / "real_model.py"
    common = ["--quick", "--cache-dir", str(tmp_path / "cache"), "--results-dir", str(tmp_path / "results")]
    unit = [*common, "--phase", "unit", "--arms", "dapo", "--rl-seed", "4", "--shared-order", "--eval-at-start"]
    run = subprocess.run(
        [sys.executable, str(script), *unit, "--stop-rule", "nearest"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    recorded = json.loads((tmp_path / "results" / "real_model_quick.json").read_text())
    assert recorded["settings"]["stop_rule"] == "nearest" and recorded["settings"]["shared_order"]
    # the rebuild takes every setting from the JSON: none is repeated on its command line
    rebuild = [*common, "--phase", "rebuild", "--arms", "dapo", "--rl-seed", "4"]
    again = subprocess.run([sys.executable, str(script), *rebuild], capture_output=True, text=True)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert "identical" in again.stdout and "problems scored differently: recorded 0, rebuilt 0" in again.stdout
    # a recorded outcome that differs is reported and fails the command
    seeds = recorded["arms"]["dapo"]["seeds"]
    seeds[0]["heldout_correct"] = "".join("1" if c == "0" else "0" for c in seeds[0]["heldout_correct"])
    (tmp_path / "results" / "real_model_quick.json").write_text(json.dumps(recorded))
    changed = subprocess.run([sys.executable, str(script), *rebuild], capture_output=True, text=True)
    assert changed.returncode == 1 and "DIFFERENT" in changed.stdout


def test_the_committed_report_and_the_readme_follow_from_the_committed_units(tmp_path):
    """docs/dapo_vs_grpo.md's report command, run on a copy of the committed results JSON, writes the committed
    report again, and the README's one-line result states its primary comparison."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "real_model.json").write_text((ROOT / "benchmarks" / "results" / "real_model.json").read_text())
    command = [sys.executable, str(ROOT / "benchmarks" / "real_model.py"), "--model", "models/SmolLM2-135M-Instruct"]
    command += ["--phase", "report", "--shared-order", "--results-dir", str(results), "--cache-dir", str(tmp_path)]
    run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    report = (results / "real_model.md").read_text()
    assert report == (ROOT / "benchmarks" / "results" / "real_model.md").read_text()
    primary = json.loads((results / "real_model.json").read_text())["analysis"]["primary"]
    assert primary["n"] >= 8
    low, high = primary["ci95"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"DAPO - GRPO = {primary['mean']:+.3f}, SE {primary['se']:.4f}, 95% CI [{low:+.3f}, {high:+.3f}]" in readme
    verdict = "no difference detected" if low <= 0 <= high else "DAPO above GRPO" if low > 0 else "GRPO above DAPO"
    assert f"**DAPO against TRL's GRPO:** {verdict}" in readme
