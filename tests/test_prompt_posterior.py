"""The posterior skip rule: Beta posteriors per prompt, population prior, forgetting, Thompson draws."""

import numpy as np
import pytest
import torch

from dapo_trl.trainer.prompt_history import PromptHistory, SkipPolicy
from dapo_trl.trainer.prompt_posterior import (
    fit_prior,
    forgetting_weight,
    informative_chance,
    informative_chance_at,
    thompson_informative,
)
from dapo_trl.trainer.sampling import PromptStream, classify_groups

G = 8


def score(indices, rng):
    """Prompt `i` is always solved (`i % 3 == 0`), never (`1`), or half the time (`2`)."""
    rates = torch.tensor([(1.0, 0.0, 0.5)[i % 3] for i in indices])
    correct = torch.rand((len(indices), G), generator=rng) < rates[:, None]
    return classify_groups(torch.where(correct, 1.0, 0.0).flatten(), G, correct_value=1.0)


def drive(policy, stream, rng, rounds, size=12):
    decisions = []
    for step in range(rounds):
        indices = stream.take(size, skip=policy.should_skip)
        policy.record(indices, score(indices, rng), step=step)
        decisions.append((indices, policy.metrics()))
    return decisions


def test_classify_groups_counts_thresholded_successes():
    c = classify_groups(torch.tensor([1.0, 0.2, float("nan"), 0.0, 2.0, 3.0]), 3, correct_value=1.0)
    assert c.successes.tolist() == [1, 2] and c.scored.tolist() == [2, 3]
    assert classify_groups(torch.tensor([0.5, -1.0]), 2).successes.tolist() == [1]  # no correct value: positive


def test_informative_chance_matches_a_monte_carlo_estimate():
    rng = np.random.default_rng(0)
    q = rng.beta(0.3, 2.0, size=200_000)
    assert float(informative_chance(0.3, 2.0, G)) == pytest.approx(informative_chance_at(q, G).mean(), abs=5e-3)
    assert informative_chance_at(np.array([0.0, 1.0]), G).tolist() == [0.0, 0.0]


def test_prior_is_the_population_fit_and_capped_at_one_group():
    polarised = np.array([100.0, 30.0, 30.0])  # 30 prompts solved, 70 never
    a, b = fit_prior(polarised, G)
    assert a / (a + b) == pytest.approx(0.3) and a + b < 0.05
    homogeneous = np.array([100.0, 50.0, 25.0 + 100 * 0.25 / G])  # every prompt at 0.5: binomial spread only
    assert sum(fit_prior(homogeneous, G)) == pytest.approx(G)


def test_forgetting_halves_counts_every_half_life():
    history = PromptHistory(2, half_life=10.0)
    history.record([0], np.array([1], dtype=np.int8), 0, successes=[8.0], failures=[0.0])
    history.record([0], np.array([2], dtype=np.int8), 10, successes=[0.0], failures=[8.0])
    assert history.successes[0] == pytest.approx(4.0) and history.failures[0] == pytest.approx(8.0)
    assert history.counts(0, 20)[0] == pytest.approx(2.0)
    assert forgetting_weight(5.0, None) == 1.0


def test_posterior_rule_skips_known_zero_variance_prompts_and_never_unseen_ones():
    policy = SkipPolicy(300, seed=0, rule="posterior", target=1.0, num_generations=G)
    stream, rng = PromptStream(300, seed=0), torch.Generator().manual_seed(0)
    unseen_skips = 0
    for step in range(60):
        indices = []
        for _ in range(20):
            index = stream.take(1)[0]
            skipped = policy.should_skip(index)
            unseen_skips += skipped and policy.history.groups[index] == 0
            if not skipped:
                indices.append(index)
        policy.record(indices, score(indices, rng), step=step)
    assert unseen_skips == 0
    skipped = policy.run_totals()["skipped"]
    assert skipped > 0
    # prompts that are always solved or never are skipped far more often than those that are half right
    share = [policy.skipped[k::3].sum() + policy.looks[k::3].sum() for k in range(3)]
    assert policy.history.groups[2::3].mean() > 2 * policy.history.groups[0::3].mean()
    assert share[2] > 0
    metrics = policy.metrics()
    for name in ("skip_predicted_informative", "skip_observed_informative", "posterior_std"):
        assert name in metrics


def test_exploration_floor_keeps_every_prompt_drawn():
    policy = SkipPolicy(3, seed=1, rule="posterior", target=1.0, max_skip=0.9, num_generations=G)
    rng = torch.Generator().manual_seed(0)
    for step in range(10):  # prompt 0 solved 80 times out of 80: its posterior is sure
        policy.record([0, 1, 2], score([0, 1, 2], rng), step=step)
    decisions = [policy.should_skip(0) for _ in range(2000)]
    # the 10% floor, plus the few Thompson draws (about 2%) that come out informative
    assert 0.08 < 1 - np.mean(decisions) < 0.16


def test_posterior_state_is_exact_across_save_and_load_and_identical_per_process():
    policy, stream = SkipPolicy(45, seed=3, rule="posterior", target=1.0), PromptStream(45, seed=3)
    rng = torch.Generator().manual_seed(5)
    drive(policy, stream, rng, 15)
    saved, saved_stream, saved_rng = policy.state_dict(), stream.state_dict(), rng.get_state()
    rest = drive(policy, stream, rng, 15)
    resumed, resumed_stream = SkipPolicy(45, seed=3, rule="posterior", target=1.0), PromptStream(45, seed=3)
    resumed.load_state_dict(saved)
    resumed_stream.load_state_dict(saved_stream)
    rng.set_state(saved_rng)
    again = drive(resumed, resumed_stream, rng, 15)
    assert [d[0] for d in again] == [d[0] for d in rest]
    assert policy.run_totals() == resumed.run_totals() and policy.run_totals()["skipped"] > 0
    np.testing.assert_array_equal(policy.history.successes, resumed.history.successes)
    with pytest.raises(ValueError, match="skip rule"):
        SkipPolicy(45, seed=3, rule="streak").load_state_dict(saved)


def test_thompson_draws_are_a_function_of_the_generator():
    a = thompson_informative(0.5, 20.0, G, np.random.default_rng([1, 2, 3]), draws=4)
    b = thompson_informative(0.5, 20.0, G, np.random.default_rng([1, 2, 3]), draws=4)
    assert a == b and 0.0 <= a <= 1.0


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"dynamic_sampling_skip_rule": "greedy"}, "dynamic_sampling_skip_rule"),
        ({"dynamic_sampling_skip_half_life": 0.0}, "dynamic_sampling_skip_half_life"),
        ({"dynamic_sampling_skip_draws": 0}, "dynamic_sampling_skip_draws"),
    ],
)
def test_posterior_settings_are_validated(overrides, message):
    from dapo_trl import DAPOConfig

    with pytest.raises(ValueError, match=message):
        DAPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none", **overrides)
    with pytest.raises(ValueError, match="rule"):
        SkipPolicy(3, rule="greedy")


@pytest.mark.integration
def test_trainer_with_the_posterior_rule_logs_its_metrics_and_resumes_exactly(tmp_path):
    from test_dynamic_sampling import skip_run

    common = dict(save_strategy="steps", save_steps=6, dynamic_sampling_skip_rule="posterior")
    full = skip_run(tmp_path / "full", **common)
    full.train()
    assert full._skip_policy.rule == "posterior" and full._skip_policy.run_totals()["skipped"] > 0
    logged_keys = set().union(*full.state.log_history)
    assert {"dynamic_sampling/skip_predicted_informative", "dynamic_sampling/posterior_std"} <= logged_keys
    resumed = skip_run(tmp_path / "resumed", **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-6"))
    for key in ("loss", "dynamic_sampling/prompts_skipped", "dynamic_sampling/prompts_consumed"):
        tail_full = [h.get(key) for h in full.state.log_history if h.get("step", 0) > 6 and "loss" in h]
        tail_resumed = [h.get(key) for h in resumed.state.log_history if h.get("step", 0) > 6 and "loss" in h]
        assert tail_full and tail_full == pytest.approx(tail_resumed), key
    np.testing.assert_array_equal(full._skip_policy.history.successes, resumed._skip_policy.history.successes)
