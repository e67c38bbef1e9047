"""DAPOConfig: paper defaults, validation messages, YAML/CLI loading."""

import pytest
import yaml
from trl import GRPOConfig, TrlParser

from dapo_trl.dapo_config import DAPOConfig


def make(**kwargs):
    base = dict(output_dir="/tmp/dapo-config-test", use_cpu=True, bf16=False, report_to="none")
    base.update(kwargs)
    return DAPOConfig(**base)


def test_paper_defaults():
    cfg = make()
    assert (cfg.epsilon, cfg.epsilon_high, cfg.beta) == (0.2, 0.28, 0.0)
    assert cfg.num_generations == 16 and cfg.loss_type == "dapo"
    assert cfg.temperature == 1.0 and cfg.top_p == 1.0 and cfg.learning_rate == 1e-6
    assert cfg.lr_scheduler_type == "constant_with_warmup" and cfg.warmup_steps == 20
    assert cfg.dynamic_sampling and cfg.overlong_shaping and not cfg.mask_truncated_completions
    # overlong buffer scales with max length like the paper's 4,096 of 20,480
    assert make(max_completion_length=20480).overlong_buffer_len == 4096


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(epsilon=-0.1), "non-negative"),
        (dict(epsilon_high=-0.2), "non-negative"),
        (dict(epsilon=1.0), "below 1"),
        (dict(max_completion_length=100, overlong_buffer_len=100), "overlong_buffer_len"),
        (dict(overlong_buffer_len=0), "overlong_buffer_len"),
        (dict(overlong_penalty_factor=-1.0), "overlong_penalty_factor"),
        (dict(num_generations=1, per_device_train_batch_size=4), "at least 2"),
        (dict(num_generations=3, per_device_train_batch_size=4), "whole groups of num_generations"),
        (dict(dynamic_sampling_max_rounds=0), "max_rounds"),
        (dict(dynamic_sampling_on_exhausted="ignore"), "on_exhausted"),
        (dict(dynamic_sampling_round_sizing="greedy"), "round_sizing"),
        (dict(dynamic_sampling_tolerance=-1), "tolerance"),
        (dict(dynamic_sampling_carry_over=True, use_liger_kernel=True), "use_liger_kernel"),
        (dict(num_generations=0), "num_generations must be a positive integer"),
        (dict(gradient_accumulation_steps=0), "gradient_accumulation_steps must be a positive integer"),
        (dict(steps_per_generation=0), "steps_per_generation must be a positive integer"),
    ],
)
def test_nonsense_is_rejected_with_a_message(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_every_advantage_option_is_accepted_with_dynamic_sampling_and_shaping(scale_rewards, aggregation):
    cfg = make(scale_rewards=scale_rewards, multi_objective_aggregation=aggregation)
    assert cfg.dynamic_sampling and cfg.overlong_shaping
    assert (cfg.scale_rewards, cfg.multi_objective_aggregation) == (scale_rewards, aggregation)


def test_every_new_knob_loads_from_yaml(tmp_path):
    values = {
        "output_dir": str(tmp_path),
        "use_cpu": True,
        "bf16": False,
        "report_to": "none",
        "overlong_shaping": True,
        "overlong_buffer_len": 64,
        "overlong_penalty_factor": 0.5,
        "max_completion_length": 256,
        "dynamic_sampling": True,
        "dynamic_sampling_reward": "math_verifier",
        "dynamic_sampling_tolerance": 0.1,
        "dynamic_sampling_max_rounds": 4,
        "dynamic_sampling_on_exhausted": "raise",
        "dynamic_sampling_round_sizing": "deficit",
        "dynamic_sampling_max_round_prompts": 100,
        "dynamic_sampling_margin": 2.0,
        "dynamic_sampling_carry_over": True,
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(values))
    (cfg,) = TrlParser((DAPOConfig,)).parse_args_and_config(["--config", str(path)])
    for key, value in values.items():
        if key != "report_to":
            assert getattr(cfg, key) == value, key


def test_cli_overrides(tmp_path):
    (cfg,) = TrlParser((DAPOConfig,)).parse_args_and_config(
        [
            "--output_dir",
            str(tmp_path),
            "--use_cpu",
            "--bf16",
            "false",
            "--dynamic_sampling",
            "false",
            "--epsilon_high",
            "0.3",
            "--dynamic_sampling_max_rounds",
            "3",
        ]
    )
    assert cfg.dynamic_sampling is False and cfg.epsilon_high == 0.3 and cfg.dynamic_sampling_max_rounds == 3


def test_an_existing_grpo_yaml_loads_unchanged(tmp_path):
    grpo_yaml = {
        "output_dir": str(tmp_path),
        "use_cpu": True,
        "bf16": False,
        "learning_rate": 3e-6,
        "num_generations": 8,
        "per_device_train_batch_size": 8,
        "max_completion_length": 128,
        "loss_type": "dapo",
        "epsilon_high": 0.28,
        "beta": 0.0,
        "gradient_accumulation_steps": 2,
    }
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(grpo_yaml))
    (grpo,) = TrlParser((GRPOConfig,)).parse_args_and_config(["--config", str(path)])
    (dapo,) = TrlParser((DAPOConfig,)).parse_args_and_config(["--config", str(path)])
    for key in grpo_yaml:
        assert getattr(dapo, key) == getattr(grpo, key), key
