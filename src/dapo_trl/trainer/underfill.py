"""Why a dynamic-sampling batch came out underfilled, in words that name the cause a user can change.

An underfilled batch means that too few prompt groups were informative. The usual reason is the data (prompts far too
easy or too hard for the model), but a setting can make every group uninformative whatever the data: a tolerance
wider than the reward's spread, a completion limit too short to hold an answer, or a filter reward that gives every
completion the same value. [`underfill_cause`] checks those first and describes the groups as they were.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Share of truncated completions from which the length limit, not the prompts, explains uninformative groups.
TRUNCATED_CAUSE = 0.9


@dataclass(frozen=True)
class UnderfillFacts:
    """What the rounds of one generation batch saw, gathered (the same on every process)."""

    rounds: int
    needed: int  # fresh informative groups the batch needed
    groups: int  # prompt groups generated
    informative: int
    all_correct: int
    all_wrong: int
    mixed: int  # values differ by no more than the tolerance
    widest_spread: float  # largest max - min of the filter reward within a mixed group
    constant_value: float | None  # the single filter value of every scored completion of the batch, else None
    truncated_frac: float  # share of the batch's completions cut at max_completion_length
    filter_label: str  # how the filter reward is named in the message
    varying: tuple[str, ...]  # other reward functions whose values differ within some group
    ended_early: bool  # the refill stopped because the filter reward gave every completion one value
    max_rounds: int
    tolerance: float
    max_completion_length: int | None
    has_correct_value: bool
    # Groups generated since the last informative one, once a whole step's rounds found none (0 otherwise): later
    # steps then run one round each (see `NoInformativeWatch`).
    quiet_groups: int = 0


def group_spreads(values: torch.Tensor) -> torch.Tensor:
    """`max - min` of the scored values `(num_groups, G)` of each group (`NaN` for a group with nothing scored)."""
    scored = ~torch.isnan(values)
    high = torch.where(scored, values, torch.full_like(values, -torch.inf)).max(dim=1).values
    low = torch.where(scored, values, torch.full_like(values, torch.inf)).min(dim=1).values
    return torch.where(scored.any(dim=1), high - low, torch.full_like(high, torch.nan))


def single_value(values: torch.Tensor) -> float | None:
    """The one value every scored entry of `values` has, or `None` (several values, or nothing scored)."""
    scored = values[~torch.isnan(values)]
    if scored.numel() == 0 or not bool((scored == scored[0]).all()):
        return None
    return scored[0].item()


def _share(count: int, total: int) -> str:
    return f"{count / total:.0%}"


def describe_groups(facts: UnderfillFacts) -> str:
    """The groups as they were: informative, all-correct, all-wrong, mixed within the tolerance, unscorable."""
    n = facts.groups
    parts = [f"{_share(facts.informative, n)} informative"]
    if facts.has_correct_value:
        parts += [f"{_share(facts.all_correct, n)} all-correct", f"{_share(facts.all_wrong, n)} all-wrong"]
    else:  # without a correct value, a constant group is neither solved nor failed
        parts.append(f"{_share(facts.all_correct + facts.all_wrong, n)} with one value for the whole group")
    if facts.mixed:
        parts.append(f"{_share(facts.mixed, n)} mixed but within dynamic_sampling_tolerance")
    unscored = n - facts.informative - facts.all_correct - facts.all_wrong - facts.mixed
    if unscored > 0:
        parts.append(f"{_share(unscored, n)} with fewer than two scored completions")
    rounds = f"{facts.rounds} round{'s' if facts.rounds != 1 else ''}"
    return f"Of the {n} prompt groups generated in {rounds} (dynamic_sampling_max_rounds={facts.max_rounds}), " + (
        ", ".join(parts)
    )


def underfill_kind(facts: UnderfillFacts) -> str:
    """
    Which cause [`underfill_cause`] names: `"tolerance"`, `"filter_reward"` (constant while another reward varies),
    `"constant_reward"`, `"truncation"`, else the data's difficulty, `"too_easy"` or `"too_hard"`.
    """
    if facts.mixed and facts.informative + facts.mixed >= facts.needed:  # without the tolerance, the batch was full
        return "tolerance"
    if facts.constant_value is not None and facts.varying:
        return "filter_reward"
    if facts.constant_value is not None and not facts.has_correct_value:
        return "constant_reward"
    if facts.truncated_frac >= TRUNCATED_CAUSE:
        return "truncation"
    return "too_easy" if facts.all_correct > facts.all_wrong else "too_hard"


def underfill_cause(facts: UnderfillFacts) -> str:
    """
    The cause of an underfilled batch and what to change: the setting that makes groups uninformative when it is one
    (the tolerance, the completion limit, the filter reward), else the data's difficulty. Always quotes the groups as
    they were, and says when later steps run one round each because recent rounds found nothing informative.
    """
    return _cause(facts) + _quiet(facts)


def _cause(facts: UnderfillFacts) -> str:
    figures = describe_groups(facts)
    kind = underfill_kind(facts)
    if kind == "tolerance":
        return (
            f"{figures}: dynamic_sampling_tolerance={facts.tolerance:g} is at least the spread of {facts.filter_label} "
            f"within a group (up to {facts.widest_spread:g} here), so groups whose completions scored differently "
            "count as constant; they would have filled the batch. Lower dynamic_sampling_tolerance below the "
            "reward's spread (0 for a reward with distinct values such as correct/wrong)."
        )
    truncated = facts.truncated_frac >= TRUNCATED_CAUSE
    if kind == "filter_reward":
        others = ", ".join(repr(name) for name in facts.varying)
        return (
            f"{figures}: dynamic sampling filters on {facts.filter_label}, which gave every completion of this batch "
            f"the same value {facts.constant_value:g}, while {others} scored completions of the same prompt "
            f"differently. Set dynamic_sampling_reward to the reward that tells completions apart (e.g. "
            f"dynamic_sampling_reward={facts.varying[0]!r}), or to 'total'.{_early(facts)}"
        )
    if kind == "constant_reward":
        also = f" ({_truncation(facts)} too)" if truncated else ""
        return (
            f"{figures}: dynamic sampling filters on {facts.filter_label}, which gave every completion of this batch "
            f"the same value {facts.constant_value:g}{also}. A reward that does not depend on the completion leaves "
            "no group informative: check that it reads the completion, or choose the filter with "
            f"dynamic_sampling_reward.{_early(facts)}"
        )
    if kind == "truncation":
        return (
            f"{figures}; {_truncation(facts)}, too short to reach an answer, so completions score alike. Raise "
            "max_completion_length."
        )
    if facts.informative == 0:  # more rounds draw more of the same: only the data or the model can change it
        remedy = (
            "use harder prompts (or a harder share of the dataset)"
            if kind == "too_easy"
            else "use easier prompts, or warm the model up first (a short supervised pass on answers in the reward's "
            "format, see docs/real_model.md), and check that the reward reads the answers the model writes"
        )
        return (
            f"{figures}: no group was informative, so more rounds (dynamic_sampling_max_rounds) would draw more of "
            f"the same; the prompts are too {'easy' if kind == 'too_easy' else 'hard'} for the model. To get a "
            f"training signal, {remedy}.{_early(facts)}"
        )
    return (
        f"{figures}: most prompts are too "
        f"{'easy' if kind == 'too_easy' else 'hard'} for the model. Raise dynamic_sampling_max_rounds, or use a "
        f"dataset closer to the model's level.{_early(facts)}"
    )


def _truncation(facts: UnderfillFacts) -> str:
    return (
        f"{facts.truncated_frac:.0%} of the completions were cut off at max_completion_length="
        f"{facts.max_completion_length} tokens"
    )


def _quiet(facts: UnderfillFacts) -> str:
    if not facts.quiet_groups:
        return ""
    return (
        f" None of the last {facts.quiet_groups} groups generated was informative: until a round finds one, each step "
        f"runs a single round of the prompts it needs instead of up to dynamic_sampling_max_rounds={facts.max_rounds} "
        "(dynamic_sampling_on_exhausted='raise' stops the run instead)."
    )


def _early(facts: UnderfillFacts) -> str:
    if not facts.ended_early or facts.rounds >= facts.max_rounds:
        return ""
    return (
        f" The refill was ended after round {facts.rounds} instead of running up to dynamic_sampling_max_rounds="
        f"{facts.max_rounds}: the filter reward had given one value to every completion of the recent rounds, which "
        "more rounds would not change."
    )
