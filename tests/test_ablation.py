"""The ablation benchmark: variants are built cumulatively in the paper's order, and `--quick` writes its table and PNG."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ablation.py"


def load_ablation():
    if "ablation" in sys.modules:
        return sys.modules["ablation"]
    spec = importlib.util.spec_from_file_location("ablation", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["ablation"] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


def test_variants_add_one_technique_at_a_time_in_the_papers_order():
    ablation = load_ablation()
    rows = ablation.variants()
    names = [v.name for v in rows]
    assert names == [
        "naive GRPO",
        "+ overlong filtering",
        "+ clip-higher",
        "+ soft overlong punishment",
        "+ token-level loss",
        "+ dynamic sampling",
        ablation.FULL_DAPO,
        ablation.SKIPPING,
        ablation.POSTERIOR,
    ]
    naive = rows[0].overrides
    assert naive["epsilon"] == naive["epsilon_high"] == 0.2
    assert naive["loss_type"] == "grpo"
    assert not (naive["dynamic_sampling"] or naive["overlong_shaping"] or naive["mask_truncated_completions"])
    # Each row differs from the previous one in exactly the fields of its technique.
    for previous, row in zip(rows[:-4], rows[1:-3], strict=True):
        changed = {k for k in row.overrides if row.overrides[k] != previous.overrides[k]}
        assert len(changed) == 1, (row.name, changed)
    assert rows[-4].overrides == {
        "epsilon": 0.2,
        "epsilon_high": 0.28,
        "loss_type": "dapo",
        "mask_truncated_completions": True,
        "overlong_shaping": True,
        "dynamic_sampling": True,
    }
    assert rows[-3].overrides == {}  # full DAPO: DAPOConfig's own defaults
    assert rows[-2].overrides == {"dynamic_sampling_skip": True}  # full DAPO + prompt skipping (streak rule)
    assert rows[-1].overrides == {"dynamic_sampling_skip": True, "dynamic_sampling_skip_rule": "posterior"}


def test_full_dapo_is_the_last_technique_row_without_overlong_filtering():
    from dapo_trl import DAPOConfig

    ablation = load_ablation()
    *_, last_technique, full, _skipping, _posterior = ablation.variants()
    defaults = DAPOConfig(output_dir="unused", use_cpu=True, bf16=False)
    for key, value in last_technique.overrides.items():
        expected = False if key == "mask_truncated_completions" else value
        assert getattr(defaults, key) == expected, key
    assert full.overrides == {}


def test_target_is_a_gain_over_each_seeds_own_warm_up():
    ablation = load_ablation()
    curve = [{"step": 0, "accuracy": 0.3}, {"step": 8, "accuracy": 0.45}, {"step": 16, "accuracy": 0.6}]
    assert ablation.first_reaching(curve, 0.2)["step"] == 16
    assert ablation.first_reaching(curve, 0.15)["step"] == 8
    assert ablation.first_reaching(curve, 0.4) is None
    # the warm-up checkpoint itself never counts, even for a seed that starts high
    assert ablation.first_reaching([{"step": 0, "accuracy": 0.9}, {"step": 8, "accuracy": 0.8}], 0.01) is None
    weak = [{"step": 0, "accuracy": 0.5}, {"step": 8, "accuracy": 0.6}]
    runs = {"a": [{"curve": curve}], "b": [{"curve": weak}]}
    # half the weakest variant's mean gain (0.1), rounded down to 0.005
    assert ablation.choose_target(runs) == pytest.approx(0.05)


@pytest.mark.integration
def test_quick_run_writes_table_and_png(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out-dir", str(tmp_path), "--cache-dir", str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        env=env,
        timeout=170,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ablation = load_ablation()
    header = "| variant | optimizer steps |"
    assert header in result.stdout
    table = (tmp_path / "ablation_quick.md").read_text()
    assert header in table
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith(header)]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == [
        "naive GRPO",
        ablation.FULL_DAPO,
        ablation.SKIPPING,
    ]
    # --quick narrows the RL prompts to 4, so the skip policy meets prompts it has seen and reports what it did.
    assert "RL prompts: the first 4 distinct training prompts" in table
    assert "Prompt skipping, per seed (0)" in table
    png = tmp_path / "ablation_quick.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000


def test_skipping_variant_is_full_dapo_with_prompt_skipping():
    from dapo_trl import DAPOConfig

    ablation = load_ablation()
    row = ablation.skipping_variant()
    assert row.name == ablation.SKIPPING and row.overrides == {"dynamic_sampling_skip": True}
    assert ablation.variants()[-2] == row  # the row after full DAPO
    args = DAPOConfig(output_dir="unused", use_cpu=True, bf16=False, **row.overrides)
    assert args.dynamic_sampling and args.dynamic_sampling_skip
    posterior = ablation.skipping_variant("posterior")
    assert posterior.name == ablation.POSTERIOR and ablation.variants()[-1] == posterior
    args = DAPOConfig(output_dir="unused", use_cpu=True, bf16=False, **posterior.overrides)
    assert args.dynamic_sampling_skip and args.dynamic_sampling_skip_rule == "posterior"
    with pytest.raises(ValueError, match="Unknown skip rule 'thompson'"):
        ablation.skipping_variant("thompson")


def test_table_without_naive_grpo_leaves_the_comparison_column_empty_not_nan():
    ablation = load_ablation()

    def run(seed, final):
        keys = ("clip_ratio/high_mean", "clip_ratio/low_mean", "completions/clipped_ratio")
        history = [{"entropy": 0.5, **dict.fromkeys(keys, 0.0)}]
        curve = [{"step": 0, "tokens": 0, "accuracy": 0.3}, {"step": 8, "tokens": 900, "accuracy": final}]
        return {
            "seed": seed,
            "steps": 8,
            "groups": 16,
            "tokens": 900,
            "seconds": 1.0,
            "curve": curve,
            "history": history,
        }

    args = SimpleNamespace(budget_groups=16, num_generations=4, train_size=100, rl_train_size=None)
    table = ablation.format_table({ablation.FULL_DAPO: [run(0, 0.5)], ablation.SKIPPING: [run(0, 0.6)]}, 0.1, args)
    rows = [line for line in table.splitlines() if line.startswith(f"| {ablation.FULL_DAPO} |")]
    assert len(rows) == 1 and "nan" not in table
    assert rows[0].split(" | ")[6] == "-"  # the "final - naive GRPO" column
    with_naive = {ablation.NAIVE: [run(0, 0.4)], ablation.FULL_DAPO: [run(0, 0.5)]}
    assert "| +0.100 +- 0.000 |" in ablation.format_table(with_naive, 0.1, args)


def test_paired_final_line_compares_the_same_seeds_final_accuracy():
    ablation = load_ablation()

    def run(seed, final, tokens):
        return {"seed": seed, "tokens": tokens, "curve": [{"accuracy": 0.1}, {"accuracy": final}]}

    runs = {
        ablation.FULL_DAPO: [run(0, 0.50, 1000), run(1, 0.60, 3000), run(2, 0.40, 2000)],
        # seed 3 has no full-DAPO partner and is left out of the pairs
        ablation.POSTERIOR: [run(1, 0.70, 2000), run(0, 0.50, 2000), run(2, 0.45, 2000), run(3, 0.0, 9000)],
    }
    line = ablation.paired_final_line(runs, ablation.POSTERIOR, ablation.FULL_DAPO)
    # differences +0.10, 0.00, +0.05: mean 0.05, sample std 0.05, standard error 0.05 / sqrt(3) = 0.029
    assert "+0.050 +- 0.029 (standard error over 3 seeds; per seed +0.100, +0.000, +0.050)" in line
    assert "at 2k and 2k generated tokens" in line
    assert ablation.paired_final_line(runs, ablation.SKIPPING, ablation.FULL_DAPO) is None


def test_rl_train_size_keeps_the_first_distinct_prompts_in_order():
    import argparse

    ablation = load_ablation()
    # 1+1-digit problems only: fewer than 100 distinct, so the set repeats prompts early.
    args = argparse.Namespace(train_size=300, level_weights=(1.0, 0, 0, 0, 0), work_prob=0.5, rl_train_size=None)
    full = ablation.training_set(args, seed=0)["prompt"]
    assert ablation.rl_training_set(args, seed=0)["prompt"] == full
    distinct = list(dict.fromkeys(full))
    assert len(distinct) < len(full)
    args.rl_train_size = 30
    assert ablation.rl_training_set(args, seed=0)["prompt"] == distinct[:30]
    args.rl_train_size = len(distinct)  # the last distinct prompt comes after repeats: they are dropped, not kept
    rl = ablation.rl_training_set(args, seed=0)
    assert rl["prompt"] == distinct and full.index(distinct[-1]) >= len(distinct)
    assert rl["answer"] == [ablation.training_set(args, seed=0)["answer"][full.index(q)] for q in distinct]
    args.rl_train_size = len(distinct) + 1
    with pytest.raises(SystemExit, match="distinct prompts"):
        ablation.rl_training_set(args, seed=0)
    with pytest.raises(SystemExit):
        ablation.parse_args(["--rl-train-size", "0"])


def test_ratio_line_compares_tokens_to_target_per_seed():
    ablation = load_ablation()

    def run(seed, tokens_at_target):
        curve = [{"step": 0, "tokens": 0, "accuracy": 0.4}, {"step": 8, "tokens": tokens_at_target, "accuracy": 0.5}]
        return {"seed": seed, "curve": curve}

    runs = {"base": [run(0, 100), run(1, 200)], "new": [run(0, 50), run(1, 300)]}

    def rows(target):
        return {
            name: {f"to_target_{k}": v for k, v in ablation.to_target(rs, target).items()} for name, rs in runs.items()
        }

    line = ablation.ratio_line(runs, rows(0.05), "new", "base", 0.05)
    assert "1.17x the generated tokens" in line  # (50 + 300) / (100 + 200)
    assert "per seed: 0.50x, 1.50x" in line
    assert ablation.ratio_line(runs, rows(0.5), "new", "base", 0.5) is None  # nobody reaches it
