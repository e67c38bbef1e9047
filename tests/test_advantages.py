"""`compute_advantages`: TRL's formulas exactly, plus the overlong penalty on scorable rows only."""

import math

import pytest
import torch
from _tiny import config, scripted_dataset, tiny_model_and_tokenizer
from trl import GRPOTrainer

from dapo_trl.trainer.advantages import compute_advantages, nanstd

NAN = math.nan


def test_unscorable_row_is_out_of_the_baseline_and_gets_no_advantage():
    rewards = torch.tensor([[1.0], [1.0], [-1.0], [NAN]])
    plain = compute_advantages(rewards, torch.ones(1), num_generations=4)
    assert plain.advantages.tolist() == pytest.approx([0.577, 0.577, -1.155, 0.0], abs=1e-3)
    # The unscorable row's length penalty must not reach it nor move the others (issue: it gave -0.261 and shifted
    # the group's mean and std).
    shaped = compute_advantages(rewards, torch.ones(1), num_generations=4, penalty=torch.tensor([0.0, 0.0, 0.0, -1.0]))
    assert shaped.advantages.tolist() == pytest.approx(plain.advantages.tolist(), abs=1e-6)
    assert not shaped.scorable[3] and math.isnan(shaped.rewards[3])


def test_sum_then_normalize_adds_the_penalty_before_the_group_statistics():
    rewards = torch.tensor([[1.0], [1.0], [-1.0], [-1.0]])
    penalty = torch.tensor([0.0, -0.5, 0.0, -1.0])
    out = compute_advantages(rewards, torch.ones(1), num_generations=4, penalty=penalty)
    shaped = torch.tensor([1.0, 0.5, -1.0, -2.0])  # Eq. 13: R + R_length
    expected = (shaped - shaped.mean()) / (shaped.std() + 1e-4)
    torch.testing.assert_close(out.advantages, expected)


def test_batch_scale_divides_by_the_std_of_every_scorable_row():
    rewards = torch.tensor([[1.0], [-1.0], [1.0], [1.0], [0.5], [NAN]])
    out = compute_advantages(rewards, torch.ones(1), num_generations=3, scale_rewards="batch")
    flat = torch.tensor([1.0, -1.0, 1.0, 1.0, 0.5])
    group_means = torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.75, 0.75])
    expected = (flat - group_means) / (flat.std() + 1e-4)
    torch.testing.assert_close(out.advantages[:5], expected)
    assert out.advantages[5] == 0


def test_normalize_then_sum_adds_the_penalty_raw_after_per_reward_normalisation():
    rewards = torch.tensor([[1.0, 0.0], [-1.0, 2.0], [1.0, 1.0], [-1.0, 1.0]])
    weights = torch.tensor([1.0, 0.5])
    penalty = torch.tensor([0.0, -0.25, 0.0, -1.0])
    out = compute_advantages(rewards, weights, num_generations=4, aggregation="normalize_then_sum", penalty=penalty)
    normalized = (rewards - rewards.mean(0)) / (rewards.std(0) + 1e-4)
    total = (normalized * weights).sum(1) + penalty
    expected = (total - total.mean()) / (total.std() + 1e-4)
    torch.testing.assert_close(out.advantages, expected)


def test_nanstd_is_bessel_corrected_and_nan_below_two_values():
    assert nanstd(torch.tensor([1.0, 3.0, NAN])).item() == pytest.approx(math.sqrt(2))
    assert math.isnan(nanstd(torch.tensor([1.0, NAN])).item())


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="scale_rewards"):
        compute_advantages(torch.zeros(4, 1), torch.ones(1), num_generations=2, scale_rewards="row")
    with pytest.raises(ValueError, match="multi_objective_aggregation"):
        compute_advantages(torch.zeros(4, 1), torch.ones(1), num_generations=2, aggregation="max")
    with pytest.raises(ValueError, match="multiple of num_generations"):
        compute_advantages(torch.zeros(5, 1), torch.ones(1), num_generations=2)


def _reward_a(completions, **kwargs):
    return [0.0] * len(completions)


def _reward_b(completions, **kwargs):
    return [0.0] * len(completions)


@pytest.mark.integration
@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none", True, False])
@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_equal_to_grpo_trainer_for_every_advantage_option(tmp_path, scale_rewards, aggregation):
    """GRPOTrainer's own advantages on a rewards table with unscorable and partly scored rows, to 1e-6."""
    model, tokenizer = tiny_model_and_tokenizer()
    args = config(
        tmp_path,
        scale_rewards=scale_rewards,
        multi_objective_aggregation=aggregation,
        reward_weights=[1.0, 0.3],
        dynamic_sampling=False,
        overlong_shaping=False,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[_reward_a, _reward_b],
        args=args,
        train_dataset=scripted_dataset(),
        processing_class=tokenizer,
    )
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randn(8, 2, generator=generator)
    rewards[1] = NAN  # unscorable
    rewards[5, 0] = NAN  # scored by one function only
    trainer._calculate_rewards = lambda *a, **k: rewards.clone()
    rows = [dict(row) for row in scripted_dataset(2) for _ in range(4)]
    out = trainer._generate_and_score_completions(rows)
    ours = compute_advantages(
        rewards,
        torch.tensor([1.0, 0.3]),
        num_generations=4,
        scale_rewards=scale_rewards,
        aggregation=aggregation,
    )
    torch.testing.assert_close(ours.advantages, out["advantages"], atol=1e-6, rtol=1e-6)
