"""Pre-rollout skipping as pure decisions: the prompt history, the skip policy, and the sampler without it."""

import io
import math
import random

import _reference_sampling as reference
import numpy as np
import pytest
import torch

from dapo_trl.trainer.prompt_history import (
    ALL_CORRECT,
    ALL_WRONG,
    INFORMATIVE,
    UNSEEN,
    PromptHistory,
    SkipPolicy,
    hashed_uniform,
)
from dapo_trl.trainer.sampling import GroupClassification, PromptStream, RoundPlanner


def groups(*outcomes: int) -> GroupClassification:
    codes = torch.tensor(outcomes)
    return GroupClassification(
        informative=codes == INFORMATIVE, all_correct=codes == ALL_CORRECT, all_wrong=codes == ALL_WRONG
    )


def comparable(values):
    """NaN-free copy (NaN != NaN), so that recorded decisions and metrics compare with ==."""
    if isinstance(values, dict):
        return {k: comparable(v) for k, v in values.items()}
    if isinstance(values, list | tuple):
        return [comparable(v) for v in values]
    return "nan" if isinstance(values, float) and math.isnan(values) else values


def state_arrays(policy: SkipPolicy) -> dict:
    state = policy.state_dict()
    flat = {**{f"history/{k}": v for k, v in state.pop("history").items()}, **state}
    return {k: v.tolist() if torch.is_tensor(v) else v for k, v in flat.items()}


def drive(policy: SkipPolicy, stream: PromptStream, rng: random.Random, rounds: int, start: int = 0) -> list:
    """
    Rounds of (draw with the policy, score, record, metrics). Prompt `i` has a persistent type (`i % 3`: informative,
    all-correct, all-wrong) that it shows 85% of the time, so the history classes carry signal.
    """
    log = []
    for step in range(start, start + rounds):

        def skip(index: int) -> bool:
            decision = policy.should_skip(index)
            log.append((index, decision))
            return decision

        indices = stream.take(rng.randint(1, 12), skip=skip)
        outcomes = [i % 3 if rng.random() < 0.85 else rng.randint(0, 2) for i in indices]
        policy.record(indices, groups(*outcomes), step=step)
        log.append(policy.metrics())
    return log


# ---------------------------------------------------------------------------------------------------------------------
# PromptHistory
# ---------------------------------------------------------------------------------------------------------------------


def test_history_keeps_run_lengths_and_when():
    history = PromptHistory(4)
    history.record([0, 1, 2], np.array([ALL_WRONG, INFORMATIVE, ALL_CORRECT]), step=3)
    previous, streak = history.record([0, 1], np.array([ALL_WRONG, ALL_WRONG]), step=5)
    assert previous.tolist() == [ALL_WRONG, INFORMATIVE] and streak.tolist() == [1, 1]
    assert history.last_outcome.tolist() == [ALL_WRONG, ALL_WRONG, ALL_CORRECT, UNSEEN]
    assert history.streak.tolist() == [2, 1, 1, 0]
    assert history.last_step.tolist() == [5, 5, 3, -1]
    assert history.groups.tolist() == [2, 2, 1, 0]


def test_history_applies_a_repeated_index_in_order():
    """A round that crosses an epoch boundary can hold a prompt twice: the second group sees the first."""
    history = PromptHistory(3)
    previous, streak = history.record([2, 0, 2, 2], np.array([ALL_WRONG, INFORMATIVE, ALL_WRONG, INFORMATIVE]), step=1)
    assert previous.tolist() == [UNSEEN, UNSEEN, ALL_WRONG, ALL_WRONG]
    assert streak.tolist() == [0, 0, 1, 2]
    assert history.last_outcome[2] == INFORMATIVE and history.streak[2] == 1 and history.groups[2] == 3


def test_history_rejects_bad_input():
    history = PromptHistory(3)
    with pytest.raises(ValueError, match="2 prompt indices for 1 group"):
        history.record([0, 1], np.array([INFORMATIVE]), step=0)
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        history.record([3], np.array([INFORMATIVE]), step=0)
    with pytest.raises(ValueError, match="same dataset"):
        PromptHistory(4).load_state_dict(history.state_dict())


# ---------------------------------------------------------------------------------------------------------------------
# SkipPolicy: exactness and determinism
# ---------------------------------------------------------------------------------------------------------------------


def test_state_is_exact_across_save_and_load():
    policy, stream, rng = SkipPolicy(50, rule="streak", seed=7, target=1.0), PromptStream(50, seed=7), random.Random(0)
    drive(policy, stream, rng, 60)
    buffer = io.BytesIO()
    torch.save({"skip": policy.state_dict(), "stream": stream.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)  # what the trainer does with dapo_sampler_state.pt
    resumed, resumed_stream = SkipPolicy(50, rule="streak", seed=7, target=1.0), PromptStream(50, seed=7)
    resumed.load_state_dict(saved["skip"])
    resumed_stream.load_state_dict(saved["stream"])
    assert state_arrays(resumed) == state_arrays(policy)

    rng_state = rng.getstate()
    tail = drive(policy, stream, rng, 80, start=60)
    rng.setstate(rng_state)
    resumed_tail = drive(resumed, resumed_stream, rng, 80, start=60)
    assert comparable(resumed_tail) == comparable(tail)
    assert state_arrays(resumed) == state_arrays(policy)
    assert any(entry is True or (isinstance(entry, tuple) and entry[1]) for entry in tail), "nothing was skipped"


def test_two_processes_make_identical_decisions():
    logs = []
    for _ in range(2):
        policy, stream = SkipPolicy(40, rule="streak", seed=3, target=1.0), PromptStream(40, seed=3)
        logs.append((comparable(drive(policy, stream, random.Random(1), 120)), state_arrays(policy)))
    assert logs[0] == logs[1]
    other = drive(SkipPolicy(40, rule="streak", seed=4, target=1.0), PromptStream(40, seed=3), random.Random(1), 120)
    assert comparable(other) != logs[0][0]  # the decisions do depend on the seed


def test_load_refuses_another_dataset_or_seed():
    state = SkipPolicy(10, rule="streak", seed=1).state_dict()
    with pytest.raises(ValueError, match="same dataset"):
        SkipPolicy(11, rule="streak", seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        SkipPolicy(10, rule="streak", seed=2).load_state_dict(state)


def test_hashed_uniform_is_a_pure_function_spread_over_0_1():
    values = [hashed_uniform(5, index, count) for index in range(200) for count in range(50)]
    assert values == [hashed_uniform(5, index, count) for index in range(200) for count in range(50)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert statistics_close(values)
    assert hashed_uniform(5, 1, 2) != hashed_uniform(6, 1, 2) != hashed_uniform(5, 2, 1)


def statistics_close(values: list[float]) -> bool:
    counts = np.histogram(values, bins=10, range=(0, 1))[0]
    expected = len(values) / 10
    return bool(np.all(np.abs(counts - expected) < 5 * math.sqrt(expected)))


# ---------------------------------------------------------------------------------------------------------------------
# SkipPolicy: the rule
# ---------------------------------------------------------------------------------------------------------------------


def test_only_zero_variance_histories_are_skipped():
    policy = SkipPolicy(4, rule="streak", max_skip=0.9)
    policy.record([0, 1, 2], groups(INFORMATIVE, ALL_CORRECT, ALL_WRONG), step=0)
    assert policy.skip_probability(INFORMATIVE, 1) == policy.skip_probability(UNSEEN, 0) == 0.0
    for _ in range(100):
        assert not policy.should_skip(0) and not policy.should_skip(3)
    assert policy.looks.tolist() == [0, 0, 0, 0]  # no decision was made for them
    with pytest.raises(IndexError, match="outside the training dataset"):
        policy.should_skip(4)


def test_a_skipped_prompt_is_redrawn_and_found_again_when_it_becomes_learnable():
    """Skip probability stays below 1: prompts skipped over and over are generated again, and once they turn out
    informative the class's measured rate rises and they are no longer skipped."""
    num_prompts, hard, max_skip = 24, set(range(12)), 0.9
    policy, stream = (
        SkipPolicy(num_prompts, rule="streak", seed=0, target=1.0, max_skip=max_skip),
        PromptStream(num_prompts, seed=0),
    )
    skipped_once: set[int] = set()
    redrawn: set[int] = set()

    def skip(index: int) -> bool:
        decision = policy.should_skip(index)
        if decision:
            skipped_once.add(index)
        elif index in skipped_once:
            redrawn.add(index)
        return decision

    # Phase 1: the hard prompts are all-wrong whenever generated, the others informative.
    step = 0
    while redrawn != hard and step < 3000:
        indices = stream.take(2, skip=skip)
        policy.record(indices, groups(*[ALL_WRONG if i in hard else INFORMATIVE for i in indices]), step=step)
        step += 1
    assert redrawn == hard, "a skipped prompt was never drawn again"
    assert policy.skip_probability(ALL_WRONG, 3) == pytest.approx(max_skip)  # its measured rate is ~0
    assert policy.skip_probability(ALL_WRONG, 3) < 1

    # Phase 2: the model has learned; every generated group is informative. Exploration finds every prompt again.
    policy.metrics()
    misses = []
    while (policy.history.last_outcome != INFORMATIVE).any() and step < 6000:
        indices = stream.take(2, skip=skip)
        policy.record(indices, groups(*[INFORMATIVE] * len(indices)), step=step)
        misses.append(policy.metrics()["skip_miss_rate"])
        step += 1
    assert (policy.history.last_outcome == INFORMATIVE).all(), "a prompt that became learnable was never found"
    assert 1.0 in misses  # redrawn after a skip, and informative: the predictor's miss is measured


def test_nothing_is_skipped_when_nothing_is_informative():
    """Skipping an all-wrong prompt only helps if something else is more informative: with nothing informative at
    all, the threshold falls to its floor (no wind-up) and only classes measured below that floor could be skipped."""
    policy, stream = SkipPolicy(10, rule="streak", target=1.0, min_threshold=1e-3), PromptStream(10, seed=0)
    for step in range(200):
        indices = stream.take(3, skip=policy.should_skip)
        policy.record(indices, groups(*[ALL_WRONG] * len(indices)), step=step)
    assert policy.run_totals()["skipped"] == 0 and policy.run_totals()["eligible"] > 500
    assert policy.threshold == policy.min_threshold


def test_each_class_is_skipped_by_its_own_measured_rate():
    """Redrawn all-correct prompts are never informative, redrawn all-wrong ones always: only the first are skipped."""
    policy = SkipPolicy(200, rule="streak", target=1.0, max_skip=0.95)
    policy.record(list(range(200)), groups(*[INFORMATIVE] * 100, *[ALL_CORRECT] * 50, *[ALL_WRONG] * 50), step=0)
    for step in range(1, 40):
        easy = [100 + (step * 7 + k) % 50 for k in range(5)]
        hard = [150 + (step * 7 + k) % 50 for k in range(5)]
        policy.record(easy + hard + list(range(20)), groups(*[ALL_CORRECT] * 5, *[INFORMATIVE] * 25), step=step)
        policy.record(hard, groups(*[ALL_WRONG] * 5), step=step)  # back to all-wrong, ready to be redrawn
    # the hard prompts were informative in between: their class is the one of prompts with an informative past
    assert policy.class_rate(ALL_CORRECT, 3) < 0.05 and policy.class_rate(ALL_WRONG, 1, informative_before=True) > 0.9
    assert policy.skip_probability(ALL_CORRECT, 3) == pytest.approx(0.95)
    assert policy.skip_probability(ALL_WRONG, 1, informative_before=True) == 0.0


def test_a_never_informative_class_is_generated_once_in_a_hundred_draws_by_default():
    """
    The default exploration floor: skipping makes the stream pass faster, so each skipped prompt is reached more
    often; at 1 - 0.95 the easy and hard prompts of the held-out task were each generated again 0.84 times in 5 passes.
    """
    policy = SkipPolicy(200, rule="streak", target=1.0)
    policy.record(list(range(200)), groups(*[ALL_CORRECT] * 200), step=0)
    for step in range(1, 20):
        policy.record([(step * 10 + k) % 200 for k in range(10)], groups(*[ALL_CORRECT] * 10), step=step)
    assert policy.class_rate(ALL_CORRECT, 1) < 0.05
    assert policy.skip_probability(ALL_CORRECT, 1) == pytest.approx(0.99)
    skipped = [policy.should_skip(i) for _ in range(1000) for i in range(10)]  # prompts 0-9: one all-correct group
    assert 1 - np.mean(skipped) == pytest.approx(0.01, abs=0.004)


def test_a_uniform_group_after_an_informative_one_is_its_own_class():
    """
    Mixed prompts (informative 2 times in 3) that come out all-wrong once are not easy or hard prompts: they keep being
    generated while prompts that never gave an informative group, with the same last outcome and streak, are skipped.
    """
    rng = random.Random(0)
    policy = SkipPolicy(200, rule="streak", target=1.0, max_skip=0.95)
    for step in range(200):
        mixed = [(step * 5 + k) % 100 for k in range(5)]  # prompts 0-99
        hard = [100 + (step * 5 + k) % 100 for k in range(5)]  # prompts 100-199: never informative
        outcomes = [INFORMATIVE if rng.random() < 2 / 3 else ALL_WRONG for _ in mixed]
        policy.record(mixed + hard, groups(*outcomes, *[ALL_WRONG] * 5), step=step)
    # with the same last outcome and streak, the prompts that were never informative are (nearly) never so again
    assert policy.class_rate(ALL_WRONG, 3, informative_before=True) > 0.35
    assert policy.class_rate(ALL_WRONG, 3, informative_before=False) < 0.1
    assert policy.skip_probability(ALL_WRONG, 3, informative_before=False) == pytest.approx(0.95)
    assert policy.skip_probability(ALL_WRONG, 3, informative_before=True) < 0.5
    state = policy.state_dict()
    resumed = SkipPolicy(200, rule="streak", target=1.0, max_skip=0.95)
    resumed.load_state_dict(state)
    assert (resumed.informative_seen == policy.informative_seen).all() and policy.informative_seen[:100].any()
    assert not policy.informative_seen[100:].any()


@pytest.mark.parametrize("target, skips", [(1.0, True), (0.2, False)])
def test_skipping_relaxes_once_generated_groups_beat_the_target(target, skips):
    """Same calls, same measured class rate (~0.3); generated groups are ~0.65 informative. Above that target the
    class is skipped (it drags the mix down); below it, the threshold falls under the class rate and nothing is."""
    policy = SkipPolicy(100, rule="streak", target=target)
    rng = random.Random(0)
    probes = list(range(10))
    for step in range(300):
        fresh = [10 + (step * 10 + k) % 90 for k in range(10)]
        outcomes = [INFORMATIVE if rng.random() < 0.3 else ALL_WRONG for _ in probes]
        policy.record(probes + fresh, groups(*outcomes, *[INFORMATIVE] * 10), step=step)
    # the probed prompts have all been informative before: their class is the one with an informative past
    assert policy.class_rate(ALL_WRONG, 1, informative_before=True) == pytest.approx(0.3, abs=0.12)
    assert 0.55 < policy.expected_informative_rate < 0.75
    if skips:
        assert policy.skip_probability(ALL_WRONG, 1, informative_before=True) > 0.8
    else:
        assert policy.skip_probability(ALL_WRONG, 1, informative_before=True) == 0.0


def test_metrics_count_this_batch_only():
    policy = SkipPolicy(12, rule="streak", seed=0, target=1.0, max_skip=0.9)
    policy.record(list(range(6)), groups(*[ALL_WRONG] * 6), step=0)
    for step in range(1, 30):  # redrawn all-wrong prompts stay all-wrong (class rate ~0), prompts 6.. are informative
        policy.record([step % 6, 6 + step % 6], groups(ALL_WRONG, INFORMATIVE), step=step)
    policy.metrics()
    decisions = [policy.should_skip(i) for i in range(6) for _ in range(5)]
    metrics = policy.metrics()
    assert metrics["prompts_skip_eligible"] == 30 and metrics["prompts_skipped"] == sum(decisions) > 0
    assert metrics["skip_prob/all_wrong"] == policy.skip_probability(ALL_WRONG, 1) > 0.5
    assert policy.skip_probability(ALL_WRONG, 3) == pytest.approx(0.9)  # the redrawn prompts' streaks grew
    assert metrics["skip_prob/all_correct"] < 0.5  # no evidence on that class: its prior keeps it explored
    assert math.isnan(metrics["skip_miss_rate"])
    again = policy.metrics()
    assert again["prompts_skipped"] == again["prompts_skip_eligible"] == 0
    assert policy.run_totals()["skipped"] == sum(decisions)


def test_policy_validates_its_settings():
    with pytest.raises(ValueError, match="max_skip"):
        SkipPolicy(3, rule="streak", max_skip=1.0)
    with pytest.raises(ValueError, match="target"):
        SkipPolicy(3, rule="streak", target=0.0)
    with pytest.raises(ValueError, match="streak_buckets"):
        SkipPolicy(3, rule="streak", streak_buckets=0)


# ---------------------------------------------------------------------------------------------------------------------
# With skipping disabled, the sampler is today's, bit for bit
# ---------------------------------------------------------------------------------------------------------------------


def test_sampler_is_bit_identical_to_the_reference_without_skipping():
    """A long random sequence of calls on the live PromptStream / RoundPlanner and on frozen copies of them."""
    rng = random.Random(12345)
    live_stream, ref_stream = PromptStream(97, seed=5), reference.PromptStream(97, seed=5)
    kwargs = {"granularity": 3, "z": 1.3, "decay": 0.8}
    live_planner, ref_planner = RoundPlanner(16, **kwargs), reference.RoundPlanner(16, **kwargs)
    skips = [None, lambda i: i % 7 == 0, lambda i: i % 7 != 0, lambda i: True]  # the last ones hit take's bound
    for call in range(3000):
        kind = rng.randrange(5)
        if kind == 0:
            n, skip = rng.randint(0, 150), rng.choice(skips)
            assert live_stream.take(n, skip=skip) == ref_stream.take(n, skip=skip), call
        elif kind == 1:
            needed = rng.randint(-2, 40)
            assert live_planner.next_round_size(needed) == ref_planner.next_round_size(needed), call
        elif kind == 2:
            generated = rng.randint(0, 200)
            informative = rng.randint(0, generated)
            live_planner.update(generated, informative)
            ref_planner.update(generated, informative)
        elif kind == 3:
            live_stream.load_state_dict(live_stream.state_dict())
            live_planner.load_state_dict(live_planner.state_dict())
        assert live_stream.state_dict() == ref_stream.state_dict(), call
        assert live_planner.state_dict() == ref_planner.state_dict(), call
        assert live_planner.rate == ref_planner.rate, call


def test_a_policy_that_never_skips_leaves_the_stream_unchanged():
    """max_skip=0 composed with the user's skip rule draws exactly what the user's rule alone draws."""
    policy = SkipPolicy(60, rule="streak", seed=1, max_skip=0.0)
    policy.record(list(range(60)), groups(*[ALL_WRONG] * 30, *[ALL_CORRECT] * 30), step=0)
    with_policy, alone = PromptStream(60, seed=2), PromptStream(60, seed=2)
    user = lambda i: i % 5 == 0  # noqa: E731

    def composed(index: int) -> bool:
        return user(index) or policy.should_skip(index)

    for n in [7, 30, 1, 59, 100, 3] * 5:
        assert with_policy.take(n, skip=composed) == alone.take(n, skip=user)
    assert policy.run_totals()["skipped"] == 0 and policy.run_totals()["eligible"] > 0
    # the user's rule goes first: prompts it skips are never shown to the policy
    assert all(policy.looks[i] == 0 for i in range(0, 60, 5))


# ---------------------------------------------------------------------------------------------------------------------
# DAPOConfig settings
# ---------------------------------------------------------------------------------------------------------------------


def skip_config(**overrides):
    from dapo_trl import DAPOConfig

    return DAPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none", **overrides)


def test_skip_settings_default_off_and_match_the_policy_defaults():
    args = skip_config()
    assert args.dynamic_sampling_skip is False
    policy = SkipPolicy(1)
    assert (args.dynamic_sampling_skip_target, args.dynamic_sampling_skip_max_prob) == (policy.target, policy.max_skip)
    assert (args.dynamic_sampling_skip_rule, args.dynamic_sampling_skip_half_life) == (policy.rule, 100.0)
    assert (policy.history.half_life, args.dynamic_sampling_skip_draws) == (100.0, policy.draws)
    on = skip_config(dynamic_sampling_skip=True, dynamic_sampling_skip_target=1.0, dynamic_sampling_skip_max_prob=0.0)
    assert on.dynamic_sampling_skip and on.dynamic_sampling_skip_max_prob == 0.0


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"dynamic_sampling_skip_target": 0.0}, "dynamic_sampling_skip_target"),
        ({"dynamic_sampling_skip_target": 1.5}, "dynamic_sampling_skip_target"),
        ({"dynamic_sampling_skip_max_prob": 1.0}, "dynamic_sampling_skip_max_prob"),
        ({"dynamic_sampling_skip_max_prob": -0.1}, "dynamic_sampling_skip_max_prob"),
        ({"dynamic_sampling_skip": True, "dynamic_sampling": False}, "dynamic_sampling=True"),
    ],
)
def test_skip_settings_are_validated(overrides, message):
    with pytest.raises(ValueError, match=message):
        skip_config(**overrides)


def test_skip_settings_parse_from_the_command_line():
    from trl import TrlParser

    from dapo_trl import DAPOConfig

    (args,) = TrlParser((DAPOConfig,)).parse_args_and_config(
        [
            "--output_dir",
            "unused",
            "--use_cpu",
            "--bf16",
            "false",
            "--dynamic_sampling_skip",
            "true",
            "--dynamic_sampling_skip_target",
            "0.6",
            "--dynamic_sampling_skip_max_prob",
            "0.9",
        ]
    )
    assert args.dynamic_sampling_skip and args.dynamic_sampling_skip_target == 0.6
    assert args.dynamic_sampling_skip_max_prob == 0.9


def _posterior_skips(draw_values, *, num_prompts: int = 64, G: int = 8, steps: int = 3) -> int:
    """Prompts the posterior rule skips after `steps` rounds over every prompt, each scored by `draw_values(n, G)`."""
    from dapo_trl.trainer.sampling import classify_groups

    policy = SkipPolicy(num_prompts, rule="posterior", seed=0, num_generations=G)
    indices = list(range(num_prompts))
    for step in range(steps):
        values = draw_values(num_prompts, G)
        policy.record(indices, classify_groups(values.flatten(), G), step=step)
    return sum(policy.should_skip(i) for i in indices)


def test_the_posterior_rule_reads_continuous_rewards_by_the_informativeness_test():
    # Rewards in (0.1, 1): every group is informative, yet every completion is "positive". Counting successes as
    # rewards above 0 made each group 8/8 successful and the rule skipped 62 of 64 prompts after 3 steps.
    generator = torch.Generator().manual_seed(0)
    continuous = _posterior_skips(lambda n, G: 0.1 + 0.9 * torch.rand(n, G, generator=generator))
    binary = _posterior_skips(lambda n, G: torch.tensor([[0.0, 1.0] * (G // 2)] * n))
    assert binary <= 6  # the 0/1 control: informative groups are generated again (only the exploration floor varies)
    assert continuous <= 6, f"the posterior rule skipped {continuous} of 64 prompts whose groups were all informative"


def test_success_counts_are_mixed_exactly_for_informative_groups():
    from dapo_trl.trainer.sampling import classify_groups

    values = torch.tensor(
        [
            [0.2, 0.5, 0.9, 0.3],  # continuous, informative: all positive, split at the midpoint
            [0.7, 0.7, 0.7, 0.7],  # constant positive: all successes
            [-0.4, -0.4, -0.4, -0.4],  # constant, not positive: none
            [0.0, 1.0, 1.0, 0.0],  # a two-valued reward: its own count
            [-0.05, 0.05, 0.0, 0.02],  # within the tolerance below: uninformative, mean above 0 -> all
        ]
    )
    classes = classify_groups(values.flatten(), 4, tolerance=0.2)
    assert classes.informative.tolist() == [True, False, False, True, False]
    assert classes.successes.tolist() == [1, 4, 0, 2, 4]
    # With a declared correct value, an informative group below it everywhere is still split, not read as 0/4.
    verified = classify_groups(torch.tensor([-1.0, -0.5, -1.0, -0.5, 1.0, 1.0, -1.0, 1.0]), 4, correct_value=1.0)
    assert verified.successes.tolist() == [2, 3]
