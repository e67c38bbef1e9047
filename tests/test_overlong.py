"""Soft overlong punishment (DAPO Eq. 13) and truncation detection."""

import pytest

from dapo_trl.trainer.overlong import OverlongPenalty, is_truncated, soft_overlong_penalty

L_MAX, L_CACHE = 20, 4  # punishment zone: lengths 17..20


@pytest.mark.parametrize(
    "length,expected",
    [
        (0, 0.0),
        (16, 0.0),  # exactly L_max - L_cache: no penalty
        (17, -0.25),  # first token in the zone
        (18, -0.5),
        (20, -1.0),  # exactly L_max
        (21, -1.0),  # beyond
        (1000, -1.0),
    ],
)
def test_eq13_boundaries(length, expected):
    assert soft_overlong_penalty(length, max_length=L_MAX, buffer_len=L_CACHE) == pytest.approx(expected)


def test_penalty_factor_scales():
    assert soft_overlong_penalty(18, max_length=L_MAX, buffer_len=L_CACHE, penalty_factor=0.5) == pytest.approx(-0.25)
    assert soft_overlong_penalty(99, max_length=L_MAX, buffer_len=L_CACHE, penalty_factor=2.0) == -2.0


def test_paper_scale():
    # 20,480 / 4,096 as in the paper: 18,432 tokens sits halfway into the zone.
    assert soft_overlong_penalty(18432, max_length=20480, buffer_len=4096) == pytest.approx(-0.5)


@pytest.mark.parametrize("buffer_len", [0, -1, 20, 25])
def test_bad_buffer_rejected(buffer_len):
    with pytest.raises(ValueError, match="buffer_len"):
        soft_overlong_penalty(5, max_length=L_MAX, buffer_len=buffer_len)


def test_truncation_detection():
    eos = [2, 7]  # several EOS ids
    assert is_truncated([5] * 20, eos_token_ids=eos, max_length=20)
    assert not is_truncated([5] * 19 + [2], eos_token_ids=eos, max_length=20)  # ends exactly at max with EOS
    assert not is_truncated([5] * 19 + [7], eos_token_ids=eos, max_length=20)  # the second EOS id
    assert not is_truncated([5] * 5, eos_token_ids=eos, max_length=20)  # short: stopped on its own
    assert is_truncated([5] * 19 + [3], eos_token_ids=eos, max_length=20)


def test_reward_function_values_and_metrics():
    metrics = {}
    penalty = OverlongPenalty(max_length=L_MAX, buffer_len=L_CACHE, eos_token_ids=[2])
    ids = [[1] * 10, [1] * 18, [1] * 19 + [2], [1] * 20]
    values = penalty(completions=["x"] * 4, completion_ids=ids, log_metric=metrics.__setitem__)
    assert values == pytest.approx([0.0, -0.5, -1.0, -1.0])
    assert metrics["overlong/ratio"] == pytest.approx(3 / 4)
    assert metrics["overlong/truncated_ratio"] == pytest.approx(1 / 4)
    assert metrics["overlong/penalty_mean"] == pytest.approx(-2.5 / 4)
    assert penalty.__name__ == "overlong_penalty"
