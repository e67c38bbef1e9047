"""Probing before completing a group: which probed groups are completed, as pure decisions."""

import math

import numpy as np
import pytest
import torch

from dapo_trl.trainer.probing import (
    ProbeRule,
    default_probe,
    pad_completions,
    probe_granularity,
    probe_problem,
    probe_warning,
)
from dapo_trl.trainer.prompt_history import ALL_CORRECT, ALL_WRONG, INFORMATIVE, UNSEEN
from dapo_trl.trainer.sampling import classify_groups


def probe_of(rows: list[list[float]]):
    values = torch.tensor(rows)
    return classify_groups(values.flatten(), values.size(1), correct_value=1.0)


def whole(probe_rows: list[list[float]], rest_rows: list[list[float] | None], G: int):
    """Groups of `G` as generated: the probe, then the rest where completed (NaN where not generated)."""
    out = torch.full((len(probe_rows), G), math.nan)
    for j, (probe, rest) in enumerate(zip(probe_rows, rest_rows, strict=True)):
        out[j, : len(probe)] = torch.tensor(probe)
        if rest is not None:
            out[j, len(probe) :] = torch.tensor(rest)
    return classify_groups(out.flatten(), G, correct_value=1.0)


def test_a_probe_must_be_able_to_show_a_mixed_group_and_leave_something_to_complete():
    assert probe_problem(0, 4) is None and probe_problem(2, 4) is None
    assert "never show a mixed group" in probe_problem(1, 16)
    assert "must be below num_generations=4" in probe_problem(4, 4)
    assert probe_warning(4, 16) is None and probe_warning(2, 4) is None
    assert "more than half of each group" in probe_warning(3, 4)
    assert [default_probe(g) for g in (2, 3, 4, 8, 16, 32)] == [0, 0, 2, 2, 4, 8]
    with pytest.raises(ValueError, match="must be below"):
        ProbeRule(4, 4)


def test_rounds_split_evenly_over_processes_for_every_call():
    for processes in (1, 2, 3, 4, 8):
        for G, k in ((16, 4), (8, 3), (8, 2), (6, 4)):
            n = probe_granularity(processes, G, k)
            assert all(n * size % processes == 0 for size in (G, k, G - k)), (processes, G, k)
    assert probe_granularity(2, 16, 0) == 1  # no probe: the whole-group granularity
    assert pad_completions(np.array([True, False, True, False]), 3).tolist() == [True, True, True, False]
    assert pad_completions(np.zeros(3, dtype=bool), 2).tolist() == [False, False, False]


def test_mixed_probes_are_completed_and_uniform_ones_by_their_class_rate():
    rule = ProbeRule(8, 2, num_prompts=10, seed=0, min_accept=0.0)
    probe = probe_of([[1, -1], [1, 1], [-1, -1]])
    # No evidence yet: every class sits at the prior 0.5 >= tau = 0.5 * 6 / 8, so everything is completed.
    assert rule.complete([0, 1, 2], probe).tolist() == [True, True, True]
    # All-correct probes of unseen prompts never complete informative; all-wrong ones always do.
    for _ in range(30):
        groups = whole([[1, -1], [1, 1], [-1, -1]], [[1] * 6, [1] * 6, [1] + [-1] * 5], 8)
        rule.record([3, 4, 5], probe, np.ones(3, dtype=bool), groups.informative, groups)
        rule.last_outcome[[3, 4, 5]] = UNSEEN  # keep measuring the never-seen class
    assert rule.class_rate(UNSEEN, ALL_CORRECT) < 0.05 and rule.class_rate(UNSEEN, ALL_WRONG) > 0.95
    assert rule.complete([6, 7, 8], probe).tolist() == [True, False, True]
    assert rule.last_outcome[[3, 4, 5]].tolist() == [UNSEEN] * 3


def test_the_exploration_floor_keeps_completing_some_uniform_probes():
    rule = ProbeRule(16, 4, seed=1, min_accept=0.1)
    rule._counts[0, 0] = (0.0, 1000.0)  # unseen prompts with an all-correct probe: never informative
    probe = probe_of([[1, 1, 1, 1]] * 2000)
    share = rule.complete(list(range(2000)), probe).mean()
    assert 0.08 < share < 0.12


def test_completions_are_priced_at_least_at_the_efficiency_floor():
    """
    In a run's first pass the measured rate is the lowest the run sees; priced at it, a uniform probe of a class
    informative 1 time in 5 always looked worth its rest. With the floor it is completed only sometimes.
    """
    probe = probe_of([[1, 1]] * 2000)
    shares = {}
    for floor in (0.0, 0.5):
        rule = ProbeRule(4, 2, seed=2, min_accept=0.0, min_efficiency=floor)
        rule._efficiency[:] = (10.0, 100.0)  # pi = 0.1, as in a first pass of mostly easy and hard prompts
        rule._counts[0, 0] = (20.0, 100.0)  # unseen prompts, all-correct probe: informative 1 time in 5
        assert rule.threshold == pytest.approx(max(0.1, floor) * 2 / 4)
        shares[floor] = rule.complete(list(range(2000)), probe).mean()
    assert shares[0.0] == 1.0
    assert shares[0.5] == pytest.approx(((20.5 / 101) / 0.25) ** 4, abs=0.03)  # (m / tau)^4, about 0.43
    with pytest.raises(ValueError, match="min_efficiency"):
        ProbeRule(4, 2, min_efficiency=1.5)


def test_outcomes_are_remembered_and_the_state_resumes_exactly():
    rule = ProbeRule(4, 2, num_prompts=6, seed=3)
    probe = probe_of([[1, 1], [-1, -1], [1, -1]])
    completed = rule.complete([0, 1, 2], probe)
    groups = whole([[1, 1], [-1, -1], [1, -1]], [[1, -1], None, [1, 1]], 4)
    rule.record([0, 1, 2], probe, np.array([True, False, True]), groups.informative, groups)
    assert rule.last_outcome[:3].tolist() == [INFORMATIVE, ALL_WRONG, INFORMATIVE]
    assert rule.efficiency == pytest.approx(2 / (3 * 0.5 + 2 * 0.5))
    assert rule.metrics()["probe_dropped"] == 1.0 and math.isnan(rule.metrics()["probe_completed_frac"])
    copy = ProbeRule(4, 2, num_prompts=6, seed=3)
    copy.load_state_dict(rule.state_dict())
    again = probe_of([[1, 1]] * 6)
    assert copy.complete(range(6), again).tolist() == rule.complete(range(6), again).tolist()
    assert completed.dtype == bool
    with pytest.raises(ValueError, match="resume with the same settings"):
        ProbeRule(4, 2, num_prompts=6, seed=4).load_state_dict(rule.state_dict())
    with pytest.raises(ValueError, match="another training set"):
        ProbeRule(4, 2, num_prompts=7, seed=3).load_state_dict(rule.state_dict())


def test_two_processes_decide_alike():
    rules = [ProbeRule(16, 4, num_prompts=50, seed=7) for _ in range(2)]
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        values = torch.where(torch.rand(20, 4, generator=gen) < 0.3, 1.0, -1.0)
        probe = classify_groups(values.flatten(), 4, correct_value=1.0)
        indices = torch.randint(0, 50, (20,), generator=gen).tolist()
        decisions = [rule.complete(indices, probe) for rule in rules]
        assert decisions[0].tolist() == decisions[1].tolist()
        full = torch.cat([values, torch.where(torch.rand(20, 12, generator=gen) < 0.3, 1.0, -1.0)], dim=1)
        groups = classify_groups(full.flatten(), 16, correct_value=1.0)
        for rule, done in zip(rules, decisions, strict=True):
            rule.record(indices, probe, done, groups.informative & torch.from_numpy(done), groups)
    assert rules[0].state_dict()["decisions"] == 100


def probe_config(**overrides):
    from dapo_trl import DAPOConfig

    values = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False, report_to="none", num_generations=16)
    return DAPOConfig(**{**values, **overrides})


def test_skipping_turns_on_the_sampler_that_measured_best_and_leaves_the_paper_defaults_alone():
    paper = probe_config()
    assert paper.dynamic_sampling_probe == 0 and paper.dynamic_sampling_carry_over is False
    skipping = probe_config(dynamic_sampling_skip=True)
    assert skipping.dynamic_sampling_probe == 4 and skipping.dynamic_sampling_carry_over is True
    assert skipping.dynamic_sampling_skip_rule == "streak"
    chosen = probe_config(dynamic_sampling_skip=True, dynamic_sampling_probe=0, dynamic_sampling_carry_over=False)
    assert chosen.dynamic_sampling_probe == 0 and chosen.dynamic_sampling_carry_over is False
    assert probe_config(dynamic_sampling_probe=2).dynamic_sampling_carry_over is False  # probing alone


def test_probe_and_carry_settings_that_cannot_work_are_refused(caplog):
    with pytest.raises(ValueError, match="must be below num_generations=16"):
        probe_config(dynamic_sampling_probe=16)
    with pytest.raises(ValueError, match="never show a mixed group"):
        probe_config(dynamic_sampling_probe=1)
    with caplog.at_level("WARNING"):
        probe_config(dynamic_sampling_probe=12)
    assert "more than half of each group" in caplog.text
    probe_config(dynamic_sampling_probe=16, dynamic_sampling=False)  # not used without dynamic sampling
    with pytest.raises(ValueError, match="below the 4 optimizer updates a carried group waits"):
        probe_config(
            dynamic_sampling_carry_over=True,
            dynamic_sampling_carry_max_staleness=2,
            per_device_train_batch_size=16,
            steps_per_generation=4,
        )
