"""The DAPO objective as pure functions, against the paper's formulas computed by hand."""

import math

import pytest
import torch

from dapo_trl.trainer.loss import (
    clipped_surrogate,
    dapo_loss,
    sequence_level_mean,
    token_level_mean,
    trl_num_items_for_exact_normalizer,
    window_token_counts,
)


def test_clipped_surrogate_matches_eq10_by_hand():
    # ratios 1.5 (A>0: clipped at 1.28), 0.5 (A<0: clipped at 0.8), 1.1 (A>0: inside), 0.7 (A>0: min picks 0.7)
    ratios = torch.tensor([[1.5, 0.5, 1.1, 0.7]])
    advantages = torch.tensor([[2.0, -1.0, 1.0, 1.0]])
    loss = clipped_surrogate(torch.log(ratios), advantages, epsilon_low=0.2, epsilon_high=0.28)
    expected = torch.tensor([[-1.28 * 2.0, -(0.8 * -1.0), -1.1, -0.7]])
    torch.testing.assert_close(loss, expected)


def test_clip_higher_is_asymmetric():
    # A ratio of 1.25 with positive advantage is inside [0.8, 1.28] (no clip) but outside [0.8, 1.2] (clipped).
    log_ratio = torch.log(torch.tensor([[1.25]]))
    adv = torch.tensor([1.0])
    assert clipped_surrogate(log_ratio, adv, epsilon_low=0.2, epsilon_high=0.28).item() == pytest.approx(-1.25)
    assert clipped_surrogate(log_ratio, adv, epsilon_low=0.2, epsilon_high=0.2).item() == pytest.approx(-1.2)


def test_token_level_mean_is_sum_over_all_tokens():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert token_level_mean(loss, mask).item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert sequence_level_mean(loss, mask).item() == pytest.approx((2.0 + 4.0) / 2)


def test_long_sequence_gets_ten_times_the_weight_at_token_level():
    """Lengths 10 and 100: token-level gives the long one 10x the total weight; sequence-level gives equal weight."""
    mask = torch.zeros(2, 100)
    mask[0, :10] = 1
    mask[1, :] = 1
    per_token = torch.ones(2, 100, requires_grad=True)
    token_level_mean(per_token, mask).backward()
    weights = per_token.grad.sum(dim=1)
    assert weights[1] / weights[0] == pytest.approx(10.0)
    per_token.grad = None
    sequence_level_mean(per_token, mask).backward()
    weights = per_token.grad.sum(dim=1)
    assert weights[1] / weights[0] == pytest.approx(1.0)


def test_dapo_loss_on_policy_gradient_is_minus_advantage_over_tokens():
    # At ratio 1 the gradient of the loss w.r.t. each token's log-prob is -A_i / total_tokens (Eq. 12).
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([1.0, -2.0])
    dapo_loss(logps, logps.detach(), adv, mask).backward()
    expected = torch.tensor([[-1.0, -1.0, -1.0], [2.0, 2.0, 0.0]]) / 5
    torch.testing.assert_close(logps.grad, expected)


def test_window_token_counts_replays_and_windows():
    # S=4, GA=2, one iteration: windows (0,1) and (2,3)
    assert window_token_counts(
        [1, 2, 3, 4], steps_per_generation=4, num_iterations=1, gradient_accumulation_steps=2
    ) == [3, 3, 7, 7]
    # S=3 replayed twice with GA=2: windows straddle the replay boundary
    assert window_token_counts(
        [10, 20, 30], steps_per_generation=3, num_iterations=2, gradient_accumulation_steps=2
    ) == [30, 30, 40, 40, 50, 50]
    with pytest.raises(ValueError, match="multiple of gradient_accumulation_steps"):
        window_token_counts([1, 2], steps_per_generation=2, num_iterations=1, gradient_accumulation_steps=4)
    with pytest.raises(ValueError, match="Expected 3"):
        window_token_counts([1, 2], steps_per_generation=3, num_iterations=1, gradient_accumulation_steps=1)


@pytest.mark.parametrize("processes,spg,ga", [(1, 4, 4), (2, 8, 4), (4, 2, 1)])
def test_trl_num_items_inversion_reproduces_window_count(processes, spg, ga):
    """TRL 1.16 divides by num_items / P * GA / S; the inverted value must make that W / P exactly."""
    window = 1234.0
    num_items = trl_num_items_for_exact_normalizer(window, steps_per_generation=spg, gradient_accumulation_steps=ga)
    trl_normalizer = num_items / processes * ga / spg
    assert math.isclose(trl_normalizer, window / processes, rel_tol=1e-12)
