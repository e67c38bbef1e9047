"""Batch-plan arithmetic (dapo_trl.run.plan) against hand-computed values at 1, 64 and 128 processes."""

from types import SimpleNamespace

import pytest

from dapo_trl.run.plan import (
    PAPER,
    batch_plan,
    format_plan,
    paper_differences,
    recipe_advice,
    recipe_differences,
    settings_for,
)


def paper_settings(**overrides):
    """configs/dapo_qwen2.5_32b.yaml's batch settings."""
    values = dict(
        per_device_train_batch_size=1,
        gradient_accumulation_steps=4,
        steps_per_generation=64,
        num_iterations=1,
        num_generations=16,
        warmup_steps=320,
        max_steps=16000,
        max_completion_length=20480,
        dynamic_sampling=True,
    )
    values.update(overrides)
    return SimpleNamespace(**values)


@pytest.mark.parametrize(
    ("processes", "prompts", "per_update"),
    [
        (1, 4, 4),  # 1 x 64 x 1 = 64 completions = 4 prompts; 1 x 4 x 1 = 4 per update
        (64, 256, 256),  # 1 x 64 x 64 = 4096 = 256 prompts; 1 x 4 x 64 = 256
        (128, 512, 512),  # the paper's §4.1 plan
    ],
)
def test_paper_recipe_plan_at_1_64_128_processes(processes, prompts, per_update):
    plan = batch_plan(paper_settings(), processes)
    assert plan.completions_per_rollout == prompts * 16
    assert plan.prompts_per_rollout == prompts
    assert plan.completions_per_update == per_update
    assert plan.updates_per_rollout == 16  # 64 / 4, whatever the process count
    assert plan.warmup_rollout_steps == 20  # 320 optimizer steps / 16
    assert plan.dynamic_sampling_groups == prompts
    assert plan.problems() == []
    differences = paper_differences(plan)
    if processes == 128:
        assert differences == []
    else:
        assert differences == [
            f"prompts per rollout: {prompts} (paper: 512)",
            f"completions per update: {per_update} (paper: 512)",
        ]


@pytest.mark.parametrize(
    ("processes", "expected"),
    [
        (1, {"gradient_accumulation_steps": 512, "steps_per_generation": 8192}),
        (64, {"gradient_accumulation_steps": 8, "steps_per_generation": 128}),
        (128, {"gradient_accumulation_steps": 4, "steps_per_generation": 64}),
    ],
)
def test_settings_that_restore_the_paper_plan(processes, expected):
    plan = batch_plan(paper_settings(), processes)
    fix = settings_for(plan, prompts_per_rollout=512, completions_per_update=512)
    assert fix == expected
    fixed = batch_plan(paper_settings(**fix), processes)
    assert (fixed.prompts_per_rollout, fixed.completions_per_update, fixed.updates_per_rollout) == (512, 512, 16)


def test_settings_change_the_per_device_batch_only_when_needed():
    # configs/dapo_qwen2.5_1.5b.yaml: 8 per device, written for 7 processes
    plan = batch_plan(
        paper_settings(per_device_train_batch_size=8, gradient_accumulation_steps=4, steps_per_generation=16), 7
    )
    assert settings_for(plan, prompts_per_rollout=56, completions_per_update=224) == {
        "gradient_accumulation_steps": 4,
        "steps_per_generation": 16,
    }
    one_gpu = batch_plan(
        paper_settings(per_device_train_batch_size=8, gradient_accumulation_steps=4, steps_per_generation=16), 1
    )
    assert settings_for(one_gpu, prompts_per_rollout=56, completions_per_update=224) == {
        "gradient_accumulation_steps": 28,
        "steps_per_generation": 112,
    }
    # 6 processes: 224 = 2^5 x 7 has no factor 3, so no b x 6 divides it
    six = batch_plan(
        paper_settings(per_device_train_batch_size=8, gradient_accumulation_steps=4, steps_per_generation=16), 6
    )
    assert settings_for(six, prompts_per_rollout=56, completions_per_update=224) is None
    # 16 processes: b = 8 gives 224 / 128, not an integer; the largest b that divides is 7 (224 / 112, 896 / 112)
    sixteen = batch_plan(
        paper_settings(per_device_train_batch_size=8, gradient_accumulation_steps=4, steps_per_generation=16), 16
    )
    assert settings_for(sixteen, prompts_per_rollout=56, completions_per_update=224) == {
        "per_device_train_batch_size": 7,
        "gradient_accumulation_steps": 2,
        "steps_per_generation": 8,
    }


def test_problems_name_what_trl_or_dapoconfig_refuse():
    plan = batch_plan(
        paper_settings(per_device_train_batch_size=3, steps_per_generation=6, gradient_accumulation_steps=4), 1
    )
    problems = plan.problems()
    assert any("not a multiple of num_generations" in p for p in problems)  # 18 completions, G = 16
    # 6 % 4: an update spans two rollout steps, which trains with TRL's normaliser (a warning, not a refusal)
    assert not any("gradient_accumulation_steps" in p for p in problems)


def test_warmup_ratio_and_iterations():
    plan = batch_plan(paper_settings(warmup_steps=0.05, num_iterations=2), 128)
    assert plan.warmup_optimizer_steps == 800  # ceil(0.05 x 16000)
    assert plan.updates_per_rollout == 32  # 64 x 2 / 4
    assert plan.warmup_rollout_steps == 25


def test_recipe_advice_names_the_settings_to_change():
    plan = batch_plan(paper_settings(), 64)
    advice = recipe_advice(plan, prompts_per_rollout=512, completions_per_update=512, num_processes=128)
    assert "written for 128 processes" in advice
    assert "prompts per rollout step: 256 (recipe: 512)" in advice
    assert "--gradient_accumulation_steps 8 --steps_per_generation 128" in advice
    assert (
        recipe_advice(batch_plan(paper_settings(), 128), prompts_per_rollout=512, completions_per_update=512) is None
    )
    assert recipe_differences(plan, prompts_per_rollout=None, completions_per_update=None) == []


def test_format_plan_lists_every_quantity():
    text = format_plan(
        batch_plan(paper_settings(), 64), recipe={"prompts_per_rollout": 512, "completions_per_update": 512}
    )
    for needle in (
        "256 prompts x 16 samples = 4096 completions",
        "256 completions (16 prompts x 16)",
        "updates per rollout step  16",
        "320 optimizer steps = 20 rollout steps",
        "256 informative groups",
        "20480 completion tokens",
        "differs from DAPO §4.1",
        "--steps_per_generation 128",
    ):
        assert needle in text, needle
    assert PAPER["prompts_per_rollout"] == 512


def test_zero_processes_is_refused():
    with pytest.raises(ValueError, match="num_processes"):
        batch_plan(paper_settings(), 0)


def test_doctests():
    import doctest

    from dapo_trl.run import plan

    assert doctest.testmod(plan).failed == 0
