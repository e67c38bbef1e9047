"""Dynamic sampling decisions as pure functions (no model)."""

import dataclasses
import math

import pytest
import torch

from dapo_trl.trainer.sampling import (
    ConstantRewardWatch,
    NoInformativeWatch,
    PromptStream,
    RoundPlanner,
    carry_keeps,
    classify_groups,
    plan_selection,
)
from dapo_trl.trainer.underfill import UnderfillFacts, underfill_cause


def test_classify_binary_groups():
    values = torch.tensor([1, 1, 1, -1, -1, -1, 1, -1, -1, -1, -1, 1], dtype=torch.float)
    c = classify_groups(values, 3, correct_value=1.0)
    assert c.informative.tolist() == [False, False, True, True]
    assert c.all_correct.tolist() == [True, False, False, False]
    assert c.all_wrong.tolist() == [False, True, False, False]


def test_tolerance_for_continuous_rewards():
    values = torch.tensor([0.50, 0.51, 0.2, 0.9])
    assert classify_groups(values, 2).informative.tolist() == [True, True]
    assert classify_groups(values, 2, tolerance=0.05).informative.tolist() == [False, True]


def test_unscorable_completions_are_ignored():
    nan = float("nan")
    values = torch.tensor([1.0, nan, 1.0, nan, -1.0, 1.0, nan, nan, nan, nan, 1.0, nan])
    # group 0: scored values {1, 1} constant; group 1: {-1, 1} informative; group 2: nothing scored; group 3: one
    c = classify_groups(values, 3, correct_value=1.0)
    assert c.informative.tolist() == [False, True, False, False]


def test_classify_rejects_ragged_input():
    with pytest.raises(ValueError, match="multiple of num_generations"):
        classify_groups(torch.zeros(5), 2)


def test_overlong_shaped_sum_would_leak_all_wrong_groups():
    """Why the default filters on correctness alone: an all-wrong group with different lengths has varying sums."""
    correctness = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    shaped = correctness + torch.tensor([0.0, -0.3, 0.0, -1.0])  # overlong penalties
    assert not classify_groups(correctness, 4).informative.item()
    assert classify_groups(shaped, 4).informative.item()


def test_adaptive_round_size_meets_need_with_margin():
    planner = RoundPlanner(32, z=1.5, max_round_prompts=1000)
    for _ in range(20):
        planner.update(100, 25)  # p = 0.25
    assert planner.rate == pytest.approx(0.25, abs=0.01)
    n = planner.next_round_size(32)
    # Expected informative groups n p must exceed 32 by ~1.5 binomial standard deviations.
    mean, std = n * 0.25, math.sqrt(n * 0.25 * 0.75)
    assert mean - 1.6 * std < 32 <= mean - 1.4 * std + 1


def test_adaptive_tracks_a_changing_rate():
    planner = RoundPlanner(10, decay=0.5, max_round_prompts=1000)
    for _ in range(10):
        planner.update(10, 9)
    high = planner.next_round_size(10)
    for _ in range(10):
        planner.update(10, 2)
    assert planner.next_round_size(10) > 3 * high


def test_round_sizes_respect_granularity_cap_and_strategies():
    planner = RoundPlanner(8, granularity=3, max_round_prompts=20, min_rate=0.01)
    for _ in range(30):
        planner.update(10, 0)
    assert planner.next_round_size(8) == 21  # cap 20 rounded up to the granularity
    assert planner.next_round_size(0) == 0
    assert RoundPlanner(8, strategy="deficit", granularity=4).next_round_size(5) == 8
    assert RoundPlanner(8, strategy="fixed", fixed_multiplier=3).next_round_size(1) == 24
    with pytest.raises(ValueError, match="strategy"):
        RoundPlanner(8, strategy="greedy")


def test_planner_state_roundtrip():
    a = RoundPlanner(16)
    a.update(40, 10)
    b = RoundPlanner(16)
    b.load_state_dict(a.state_dict())
    assert b.next_round_size(16) == a.next_round_size(16)


def test_plan_selection_carried_first_and_surplus():
    plan, missing = plan_selection(num_carried=3, num_fresh=6, target=5, carry_over=True)
    assert plan.train == [0, 1, 2, 3, 4] and plan.carry == [5, 6, 7, 8] and plan.discard == [] and missing == 0
    plan, _ = plan_selection(num_carried=3, num_fresh=6, target=5, carry_over=False)
    assert plan.carry == [] and plan.discard == [5, 6, 7, 8]


def test_plan_selection_drops_carried_groups_that_would_go_stale():
    plan, missing = plan_selection(num_carried=7, num_fresh=0, target=5, carry_over=True)
    assert plan.train == [0, 1, 2, 3, 4] and plan.discard == [5, 6] and missing == 0


def test_carried_groups_wait_until_used_while_fresh_enough():
    # Groups sampled at updates 0, 2 and 3; now 3, one update per batch, at most 2 updates stale when trained.
    keep = carry_keeps([0, 2, 3], now=3, updates_per_batch=1.0, max_staleness=2)
    assert keep == [False, True, True]
    plan, missing = plan_selection(
        num_carried=3, num_fresh=2, target=0, carry_over=True, max_carry=8, keep_carried=keep
    )
    assert plan.train == [] and plan.carry == [1, 2, 3, 4] and plan.discard == [0] and missing == 0
    # Waiting groups are carried before fresh surplus, within max_carry; with carry-over off nothing waits.
    plan, _ = plan_selection(num_carried=3, num_fresh=2, target=1, carry_over=True, max_carry=2, keep_carried=keep)
    assert plan.train == [0] and plan.carry == [1, 2] and plan.discard == [3, 4]
    plan, _ = plan_selection(num_carried=3, num_fresh=2, target=1, carry_over=False, keep_carried=keep)
    assert plan.carry == [] and plan.discard == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="2 entries for 3 carried groups"):
        plan_selection(num_carried=3, num_fresh=0, target=1, carry_over=True, keep_carried=[True, True])


def test_no_informative_watch_needs_a_whole_budget_spent_on_nothing_and_resets_on_any_informative_group():
    watch = NoInformativeWatch(min_groups=64)
    for _ in range(3):
        watch.update(30, 0)
    assert not watch.established  # rounds found nothing, but no step has spent its whole budget yet
    watch.end_step(rounds=2, max_rounds=3)
    assert not watch.established  # ended before its budget (a full batch, or no prompt left)
    watch.end_step(rounds=3, max_rounds=3)
    assert watch.established and watch.groups == 90
    copy = NoInformativeWatch(min_groups=64)
    copy.load_state_dict(watch.state_dict())
    assert copy.established
    # Scarce, not absent: one informative group in a step keeps the full budget.
    watch.update(40, 1)
    watch.end_step(rounds=3, max_rounds=3)
    assert not watch.established and watch.groups == 0
    # Too few groups to tell scarce from none.
    small = NoInformativeWatch(min_groups=64)
    small.update(20, 0)
    small.end_step(rounds=3, max_rounds=3)
    assert not small.established


def test_plan_selection_underfilled():
    plan, missing = plan_selection(num_carried=0, num_fresh=3, target=5, carry_over=True)
    assert plan.train == [0, 1, 2] and missing == 2


def test_stream_never_repeats_within_an_epoch_and_wraps():
    stream = PromptStream(10, seed=3)
    first = stream.take(4) + stream.take(6)
    assert sorted(first) == list(range(10))
    second = stream.take(10)
    assert sorted(second) == list(range(10)) and second != first  # a new permutation per epoch
    assert stream.epoch == 1 and stream.consumed == 20


def test_stream_is_identical_for_the_same_seed_and_resumes():
    a, b = PromptStream(50, seed=1), PromptStream(50, seed=1)
    a.take(37)
    b.load_state_dict(a.state_dict())
    assert a.take(30) == b.take(30)
    with pytest.raises(ValueError, match="seed"):
        PromptStream(50, seed=2).load_state_dict(a.state_dict())


def test_stream_skip_is_bounded():
    stream = PromptStream(5, seed=0)
    assert stream.take(3, skip=lambda i: True) == []  # gives up after an epoch instead of looping forever
    assert all(i % 2 == 0 for i in stream.take(3, skip=lambda i: i % 2 == 1))


def test_stream_without_shuffle_is_sequential():
    assert PromptStream(4, shuffle=False).take(6) == [0, 1, 2, 3, 0, 1]


def test_groups_are_described_as_they_are_whatever_the_tolerance():
    values = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, -1.0, 1.0, 0.9])
    c = classify_groups(values, 2, tolerance=5.0, correct_value=1.0)
    assert not c.informative.any()
    assert c.all_correct.tolist() == [False, True, False, False]  # a tolerance never makes a wrong answer correct
    assert c.all_wrong.tolist() == [False, False, True, False]
    assert c.mixed.tolist() == [True, False, False, True]
    nan = float("nan")
    unscored = classify_groups(torch.tensor([1.0, nan, nan, nan]), 2, correct_value=1.0)
    assert not (unscored.all_correct | unscored.all_wrong | unscored.mixed).any()  # not "all wrong": unscored


def test_constant_reward_watch_needs_enough_completions_of_one_value():
    watch = ConstantRewardWatch(min_completions=12, min_groups=2)
    assert not watch.update(torch.full((1, 8), -1.0))  # one prompt: a verifier's hard prompt looks like this
    assert watch.update(torch.full((1, 8), -1.0))
    assert not watch.update(torch.full((1, 8), 1.0))  # another value starts a new count
    assert watch.completions == 8 and watch.value == 1.0
    assert watch.update(torch.full((1, 8), 1.0))
    copy = ConstantRewardWatch(min_completions=12, min_groups=2)
    copy.load_state_dict(watch.state_dict())
    assert copy.established and copy.update(torch.tensor([[1.0, float("nan")]]))  # unscored rows are ignored
    assert not copy.update(torch.tensor([[1.0, 0.0]])) and copy.value is None  # a round with two values resets it
    assert copy.update(torch.full((2, 8), 1.0))
    # a round whose groups were kept anyway (a selection deciding on other grounds) resets it too
    assert not copy.update(torch.full((2, 8), 1.0), found_informative=True) and copy.value is None


def facts(**overrides) -> UnderfillFacts:
    values = dict(
        rounds=2, needed=4, groups=10, informative=0, all_correct=5, all_wrong=5, mixed=0, widest_spread=0.0,
        constant_value=None, truncated_frac=0.0, filter_label="reward function 'acc'", varying=(),
        ended_early=False, max_rounds=10, tolerance=0.0, max_completion_length=64, has_correct_value=True,
    )  # fmt: skip
    values.update(overrides)
    return UnderfillFacts(**values)


def test_underfill_cause_names_the_setting_before_blaming_the_prompts():
    assert "too hard" in underfill_cause(facts(all_correct=2, all_wrong=8))
    tolerance = underfill_cause(facts(all_correct=0, all_wrong=0, mixed=10, widest_spread=2.0, tolerance=5.0))
    assert "dynamic_sampling_tolerance=5 is at least the spread" in tolerance and "100% mixed" in tolerance
    few = underfill_cause(facts(all_correct=8, all_wrong=1, mixed=1, widest_spread=0.01, tolerance=0.05))
    assert "too easy" in few and "10% mixed" in few  # a few mixed groups would not have filled the batch
    cut = underfill_cause(facts(all_correct=0, all_wrong=10, truncated_frac=1.0, max_completion_length=1))
    assert "100% of the completions were cut off at max_completion_length=1" in cut and "too hard" not in cut
    constant = facts(all_correct=10, all_wrong=0, constant_value=1.0, has_correct_value=False, ended_early=True)
    text = underfill_cause(constant)
    assert "100% with one value for the whole group" in text and "all-correct" not in text
    assert "does not depend on the completion" in text and "ended after round 2" in text
    named = underfill_cause(dataclasses.replace(constant, varying=("verifier",)))
    assert "dynamic_sampling_reward='verifier'" in named


def test_underfill_with_no_informative_group_does_not_advise_more_rounds():
    """0 of 153 groups informative: more rounds draw more of the same, so the advice is the data or the model."""
    hard = underfill_cause(facts(groups=153, all_correct=0, all_wrong=153, informative=0))
    assert "Raise dynamic_sampling_max_rounds" not in hard and "no group was informative" in hard
    assert "easier prompts" in hard and "warm the model up" in hard
    easy = underfill_cause(facts(groups=20, all_correct=20, all_wrong=0, informative=0))
    assert "Raise dynamic_sampling_max_rounds" not in easy and "harder prompts" in easy
    some = underfill_cause(facts(groups=20, all_correct=2, all_wrong=16, informative=2))
    assert "Raise dynamic_sampling_max_rounds" in some  # a few informative groups: more rounds fill the batch


def test_underfill_says_when_later_steps_run_one_round_and_keeps_the_fix():
    """The untrained-model case: the same explanation and fix, and that the round budget is no longer spent."""
    hard = underfill_cause(facts(groups=153, all_correct=0, all_wrong=153, informative=0, quiet_groups=153))
    assert "warm the model up" in hard and "check that the reward reads the answers" in hard
    assert "None of the last 153 groups generated was informative" in hard
    assert "each step runs a single round" in hard and "dynamic_sampling_on_exhausted='raise'" in hard
    assert "single round" not in underfill_cause(facts(groups=153, all_correct=0, all_wrong=153, informative=0))
