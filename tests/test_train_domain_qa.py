"""examples/train_domain_qa.py: multiple-choice QA with a reasoning block, end to end on CPU."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from dapo_trl import DAPOTrainer

ROOT = Path(__file__).resolve().parents[1]


def load_example():
    spec = importlib.util.spec_from_file_location("train_domain_qa", ROOT / "examples" / "train_domain_qa.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


train_domain_qa = load_example()


def test_no_arguments_parse_to_the_demo():
    script_args, training_args, model_args = train_domain_qa.parse_args([])
    assert model_args.model_name_or_path is None and script_args.dataset_name is None
    assert training_args.dynamic_sampling_reward == "multiple_choice"
    assert training_args.steps_per_generation > training_args.gradient_accumulation_steps  # clip-higher can act


def test_flags_override_the_demo_config():
    demo = yaml.safe_load((ROOT / "configs" / "cpu_domain_qa.yaml").read_text())
    script_args, training_args, model_args = train_domain_qa.parse_args(["--max_steps", "2", "--eval_k", "1"])
    assert training_args.max_steps == 2 and script_args.eval_k == 1
    assert training_args.use_cpu and not training_args.bf16 and model_args.model_name_or_path is None
    for key in ("per_device_train_batch_size", "num_generations", "learning_rate", "dynamic_sampling_reward"):
        assert getattr(training_args, key) == demo[key], key
    assert script_args.demo_sft_steps == demo["demo_sft_steps"]


def test_print_plan_shows_the_demo_plan(capsys):
    result = train_domain_qa.main(["--print_plan"])
    printed = capsys.readouterr().out
    assert "16 prompts x 8 samples = 128 completions" in printed and "recipe plan               reached" in printed
    assert result["plan"].steps_per_generation == 4
    train_domain_qa.main(["--print_plan", "--num_generations", "4"])
    assert "32 prompts x 4 samples = 128 completions" in capsys.readouterr().out


def test_the_answer_reward_comes_first():
    names = [getattr(f, "__name__", None) for f in train_domain_qa.rewards()]
    assert names == ["multiple_choice", "think_format_reward"]


@pytest.mark.integration
def test_demo_trains_end_to_end_and_filters_on_the_answer_reward(tmp_path, monkeypatch):
    """
    A few steps of the CPU demo after a 40-step warm-up (enough for mixed correctness and format, ~15-30 s). Every
    generation round is recorded through two extension points, `filter_values` (called with the round's rewards of
    every function just before the round is judged) and `on_groups_scored`: the values dynamic sampling filtered on
    must be the multiple-choice rewards (-1/1), never the format rewards (0/1), and a group is kept exactly when its
    answers differ in correctness, whatever their format.
    """
    rounds, last_filtered = [], {}
    filter_values = DAPOTrainer.filter_values

    def spy_filter(self, rewards_per_func):
        values = filter_values(self, rewards_per_func)
        last_filtered.update(rewards=rewards_per_func.clone(), values=values.clone())
        return values

    def record(self, prompt_indices, values, informative, classification):
        G = values.size(1)
        assert torch.equal(last_filtered["values"].view(-1, G), values)  # the call just before judged this round
        names = self.reward_func_names
        rewards = last_filtered["rewards"].view(-1, G, len(names))  # (groups, G, F)
        rounds.append(
            {
                "values": values.clone(),
                "informative": informative.clone(),
                "answer": rewards[..., names.index("multiple_choice")],
                "format": rewards[..., names.index("think_format_reward")],
            }
        )

    monkeypatch.setattr(DAPOTrainer, "filter_values", spy_filter)
    monkeypatch.setattr(DAPOTrainer, "on_groups_scored", record)
    out = tmp_path / "run"
    summary = train_domain_qa.main(
        [
            "--output_dir", str(out), "--use_cpu", "--bf16", "false", "--gradient_checkpointing", "false",
            "--report_to", "none", "--save_strategy", "no", "--logging_steps", "1",
            "--max_steps", "2", "--num_generations", "4", "--per_device_train_batch_size", "16",
            "--steps_per_generation", "1", "--max_completion_length", "40", "--learning_rate", "1e-4",
            "--warmup_steps", "0", "--dynamic_sampling_reward", "multiple_choice", "--dynamic_sampling_max_rounds", "3",
            "--demo_sft_steps", "40", "--max_train_samples", "400", "--eval_max_samples", "8", "--eval_k", "2",
        ]
    )  # fmt: skip
    assert summary["optimizer_steps"] == 2
    for when in ("before", "after"):
        assert summary[when]["num_questions"] == 8 and 0 <= summary[when]["accuracy"] <= 1

    entries = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = set().union(*entries)
    for key in ("rewards/multiple_choice/mean", "rewards/think_format_reward/mean", "dynamic_sampling/rounds"):
        assert key in logged, key
    saved = json.loads((out / "eval_summary.json").read_text())
    assert "diagnoses" in saved and saved["optimizer_steps"] == 2
    assert (out / "training_curves.png").exists()

    assert rounds, "dynamic sampling never scored a round"
    answer = torch.cat([r["answer"] for r in rounds])
    format_ = torch.cat([r["format"] for r in rounds])
    assert torch.equal(torch.cat([r["values"] for r in rounds]), answer)
    spread = answer.amax(dim=1) > answer.amin(dim=1)
    assert torch.equal(torch.cat([r["informative"] for r in rounds]).cpu(), spread.cpu())
    format_only = (format_.amax(dim=1) > format_.amin(dim=1)) & ~spread
    assert format_only.any(), "no group varied in format alone: the check above would not tell the filters apart"
