"""Dynamic sampling (DAPO §3.2, Algorithm 1), as pure decisions.

The trainer generates rounds of prompt groups and keeps only *informative* groups (those whose filter reward is not
constant across the group: `0 < #correct < G` for a binary verifier) until the generation batch holds its target
number of groups. This module decides, without a model:

- which groups are informative ([`classify_groups`]), when no refill round can find one because the filter
  reward gives every completion the same value ([`ConstantRewardWatch`]), and when recent rounds found none at all
  ([`NoInformativeWatch`]),
- how many prompts the next round asks for ([`RoundPlanner`]: adaptive oversampling from the informative rate seen so
  far, exact-deficit refill, or verl's fixed multiple),
- which groups are trained now, carried to the next step or discarded ([`plan_selection`]),
- which prompts come next ([`PromptStream`]: a shuffled stream over the training set that wraps into the next epoch
  and never repeats a prompt within an epoch).

Every object here has `state_dict()` / `load_state_dict()` so that a resumed run continues exactly where it stopped.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

STRATEGIES = ("adaptive", "deficit", "fixed")


@dataclass(frozen=True)
class GroupClassification:
    """
    Outcome of [`classify_groups`]; each field is a bool tensor of shape `(num_groups,)`. A group that is neither
    informative nor in one of the other fields had fewer than two scored completions.
    """

    informative: torch.Tensor
    all_correct: torch.Tensor
    all_wrong: torch.Tensor
    mixed: torch.Tensor | None = None  # values differ, but by no more than the tolerance (so not informative)
    # Per group: completions that succeeded (reached `correct_value`, or positive without one) and that were scored.
    successes: torch.Tensor | None = None
    scored: torch.Tensor | None = None


def classify_groups(
    values: torch.Tensor, num_generations: int, *, tolerance: float = 0.0, correct_value: float | None = None
) -> GroupClassification:
    """
    Split prompt groups into informative, all-correct, all-wrong and mixed.

    A group is informative when its values are not constant: `max - min > tolerance` over the completions that were
    scored. `NaN` marks an unscorable completion (a reward function returned `None`): it is ignored, and a group with
    fewer than two scored completions is not informative (its advantages would all be zero) and in no other class.
    The other groups are described as they are: all-correct when every value reaches `correct_value` (when it is
    given; else when every value is the same positive number), all-wrong when none does (else: the same number, not
    positive), and mixed otherwise (values that differ by no more than `tolerance`). `successes` counts, per group,
    the scored completions that reach `correct_value` (without it: that are positive), the thresholded outcome the
    prompt posterior of [`SkipPolicy`] learns from, made consistent with the informativeness test (mixed successes
    exactly for informative groups; see [`_success_counts`]).

    Args:
        values (`torch.Tensor` of shape `(num_groups * num_generations,)`):
            The filter reward of every completion, groups contiguous.
        num_generations (`int`):
            Group size `G`.
        tolerance (`float`, *optional*, defaults to `0.0`):
            Spread at or below which a group counts as constant (exact equality by default; raise it for continuous
            rewards).
        correct_value (`float`, *optional*):
            Reward of a correct answer, to tell all-correct from all-wrong groups.

    Example:
    ```python
    >>> c = classify_groups(torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0, -1.0]), 2, correct_value=1.0)
    >>> c.informative.tolist(), c.all_correct.tolist(), c.all_wrong.tolist()
    ([False, False, True], [True, False, False], [False, True, False])
    >>> classify_groups(torch.tensor([1.0, -1.0]), 2, tolerance=5.0, correct_value=1.0).mixed.tolist()
    [True]

    ```
    """
    if values.dim() != 1 or values.numel() % num_generations != 0:
        raise ValueError(
            f"Expected a flat tensor whose length is a multiple of num_generations={num_generations}, "
            f"got shape {tuple(values.shape)}."
        )
    grouped = values.float().view(-1, num_generations)  # (N, G)
    scored = ~torch.isnan(grouped)  # (N, G)
    high = torch.where(scored, grouped, torch.full_like(grouped, -math.inf)).max(dim=1).values  # (N,)
    low = torch.where(scored, grouped, torch.full_like(grouped, math.inf)).min(dim=1).values  # (N,)
    enough = scored.sum(dim=1) >= 2
    informative = enough & ((high - low) > tolerance)
    uninformative = enough & ~informative
    if correct_value is not None:
        every, none = low >= correct_value, high < correct_value
    else:  # no notion of "correct": only a single positive value reads as solved
        every, none = (low == high) & (high > 0), (low == high) & (high <= 0)
    all_correct, all_wrong = uninformative & every, uninformative & none
    mixed = uninformative & ~every & ~none
    return GroupClassification(
        informative=informative,
        all_correct=all_correct,
        all_wrong=all_wrong,
        mixed=mixed,
        successes=_success_counts(grouped, scored, informative, correct_value=correct_value),
        scored=scored.sum(dim=1),
    )


def _success_counts(
    grouped: torch.Tensor, scored: torch.Tensor, informative: torch.Tensor, *, correct_value: float | None
) -> torch.Tensor:
    """
    Successful completions per group `(N,)`, defined so that a group's successes are mixed (`0 < k < n`) exactly when
    the group is informative: the prompt posterior of the skip rule learns "how likely is this prompt's next group to
    be informative" from these counts, so they must agree with the test that decides informativeness.

    A completion succeeds when it reaches `correct_value` (without one: when it is positive). That threshold can
    disagree with the spread test: continuous rewards in `(0.1, 1)` are all "positive" while every group is
    informative, and a tolerance can leave an uninformative group straddling the threshold. So an informative group
    whose thresholded successes are `0` or `n` splits at the midpoint of its values instead, and an uninformative
    group counts all or none of its completions, by its mean against the threshold. For a two-valued reward both
    definitions agree and nothing changes.
    """
    threshold = 0.0 if correct_value is None else correct_value
    reached = grouped >= threshold if correct_value is not None else grouped > threshold  # (N, G); NaN: never
    successes = (reached & scored).sum(dim=1)  # (N,)
    counted = scored.sum(dim=1)  # (N,)
    filled = torch.where(scored, grouped, torch.zeros_like(grouped))
    high = torch.where(scored, grouped, torch.full_like(grouped, -math.inf)).max(dim=1, keepdim=True).values
    low = torch.where(scored, grouped, torch.full_like(grouped, math.inf)).min(dim=1, keepdim=True).values
    split = ((filled > (high + low) / 2) & scored).sum(dim=1)  # (N,): in 1 .. n - 1 whenever high > low
    one_sided = (successes == 0) | (successes == counted)
    successes = torch.where(informative & one_sided, split, successes)
    mean = filled.sum(dim=1) / counted.clamp(min=1)
    solved = mean >= threshold if correct_value is not None else mean > threshold
    return torch.where(~informative & (counted > 0), torch.where(solved, counted, 0), successes)


class ConstantRewardWatch:
    """
    Tells when the filter reward does not depend on the completion, so that refill rounds cannot find an informative
    group: a constant reward, or one that gives every completion the same score.

    It follows the run of rounds in which every scored value was one and the same number (across all groups, steps
    included). Once that run covers at least `min_completions` completions of at least `min_groups` prompts, a round
    that is again wholly that value ends the refill. A round that is not wholly one value (or another value) restarts
    the count. The thresholds keep a genuine reward from tripping it by chance: a verifier right 10% of the time gives
    64 wrong answers in a row with probability 0.001.

    Example:
    ```python
    >>> watch = ConstantRewardWatch(min_completions=8)
    >>> watch.update(torch.ones(2, 3)), watch.update(torch.ones(1, 3)), watch.value
    (False, True, 1.0)
    >>> watch.update(torch.tensor([[1.0, 0.0, 1.0]])), watch.completions
    (False, 0)

    ```
    """

    def __init__(self, *, min_completions: int = 64, min_groups: int = 2) -> None:
        self.min_completions = min_completions
        self.min_groups = min_groups
        self.value: float | None = None  # the one value of the current run of constant rounds
        self.completions = 0
        self.groups = 0
        # One watch per environment (TRL's `environment` column), for a reward each environment fixes on its own.
        self.by_environment: dict[str, ConstantRewardWatch] = {}
        self.scored = False  # any value scored yet (an environment no reward scores never settles on a value)

    @property
    def established(self) -> bool:
        """
        Whether the rounds seen so far already show a reward that gives every completion the same value, or, with
        several environments, one value per environment.
        """
        whole = self.value is not None and self.completions >= self.min_completions and self.groups >= self.min_groups
        watches = [w for w in self.by_environment.values() if w.scored]
        per_environment = bool(watches) and all(w.established for w in watches)
        return whole or per_environment

    def update(
        self, values: torch.Tensor, *, found_informative: bool = False, environments: list | None = None
    ) -> bool:
        """
        Record a round's filter values `(num_groups, G)` (`NaN`: unscored); `True` when the refill should end.
        `found_informative`: the selection kept groups of this round anyway (a `select_informative_groups` that decides
        on other grounds), so its values say nothing about what more rounds can find; it restarts the count.
        `environments`: each group's environment name (TRL's multi-environment rows), or `None`; with two or more
        names, each environment is also followed on its own, so that a reward that is one value per environment
        (an environment that owns its reward) ends the refill like a reward that is one value overall.
        """
        if environments is not None and len(set(environments)) > 1:
            for name in dict.fromkeys(environments):
                rows = torch.tensor([e == name for e in environments])
                watch = self.by_environment.setdefault(
                    str(name), ConstantRewardWatch(min_completions=self.min_completions, min_groups=self.min_groups)
                )
                watch.update(values[rows], found_informative=found_informative)
            self._update_whole(values, found_informative)
            return self.established
        return self._update_whole(values, found_informative)

    def _update_whole(self, values: torch.Tensor, found_informative: bool) -> bool:
        scored = values[~torch.isnan(values)]
        if scored.numel() == 0:
            return False  # nothing scored: the all-None rule ends the refill
        self.scored = True
        first = scored[0].item()
        if found_informative or not bool((scored == first).all()):
            self.value, self.completions, self.groups = None, 0, 0
            return False
        if self.value != first:
            self.value, self.completions, self.groups = first, 0, 0
        self.completions += scored.numel()
        self.groups += values.size(0)
        return self.established

    def state_dict(self) -> dict:
        by_environment = {name: w.state_dict() for name, w in self.by_environment.items()}
        return {
            "value": self.value,
            "completions": self.completions,
            "groups": self.groups,
            "scored": self.scored,
            "by_environment": by_environment,
        }

    def load_state_dict(self, state: dict) -> None:
        self.value = None if state["value"] is None else float(state["value"])
        self.completions, self.groups = int(state["completions"]), int(state["groups"])
        self.scored = bool(state.get("scored", True))
        self.by_environment = {}
        for name, sub in state.get("by_environment", {}).items():  # absent in earlier checkpoints
            watch = self.by_environment[name] = ConstantRewardWatch(
                min_completions=self.min_completions, min_groups=self.min_groups
            )
            watch.load_state_dict(sub)


class NoInformativeWatch:
    """
    Tells when a run's rounds find no informative group at all, so that spending a step's whole round budget again
    would buy nothing: an untrained model whose every completion is wrong, or a reward that fails every answer.

    It counts the groups generated since the last informative one and the steps that ran all `max_rounds` rounds
    without finding one. Once such a step has been seen and at least `min_groups` groups were generated since the last
    informative group, `established` is true, and the trainer runs one round per step until a round finds an
    informative group again (which resets the watch). Scarce groups keep the paper's behaviour: a single informative
    group among a step's rounds keeps the full budget.

    Example:
    ```python
    >>> watch = NoInformativeWatch(min_groups=8)
    >>> watch.update(10, 0); watch.end_step(rounds=3, max_rounds=3); watch.established
    True
    >>> watch.update(4, 1); watch.established
    False

    ```
    """

    def __init__(self, *, min_groups: int = 64) -> None:
        self.min_groups = min_groups
        self.groups = 0  # groups generated since the last informative one
        self.exhausted_steps = 0  # steps since then that ran every round of their budget

    @property
    def established(self) -> bool:
        return self.exhausted_steps >= 1 and self.groups >= self.min_groups

    def update(self, generated: int, informative: int) -> None:
        """Record a round: `generated` groups, `informative` of them informative."""
        if informative:
            self.groups, self.exhausted_steps = 0, 0
        else:
            self.groups += generated

    def end_step(self, *, rounds: int, max_rounds: int) -> None:
        """Record that a generation batch ended after `rounds` rounds (`max_rounds`: its whole budget)."""
        if rounds >= max_rounds and self.groups > 0:
            self.exhausted_steps += 1

    def state_dict(self) -> dict:
        return {"groups": self.groups, "exhausted_steps": self.exhausted_steps}

    def load_state_dict(self, state: dict) -> None:
        self.groups, self.exhausted_steps = int(state["groups"]), int(state["exhausted_steps"])


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class RoundPlanner:
    """
    Decides how many prompts each generation round asks for.

    Strategies:
    - `"adaptive"` (default): estimate the informative rate `p` from recent rounds (a Beta posterior whose counts decay
      by `decay` per round, so it follows the policy as it improves) and ask for enough prompts that the round yields
      the `needed` groups with high probability: the smallest `n` with `n p - z sqrt(n p (1 - p)) >= needed`. Mean rounds
      per step stay near 1, where exact-deficit refill costs 2-3. Surplus groups are either carried to the next step
      or discarded, depending on the trainer's `dynamic_sampling_carry_over`.
    - `"deficit"`: ask for exactly the missing number of groups (the naive refill; many rounds per step).
    - `"fixed"`: ask for `fixed_multiplier` times the target every round (verl's `gen_batch_size`).

    Every size is rounded up to `granularity` (so rows split evenly over processes) and capped at `max_round_prompts`.

    Args:
        target_groups (`int`):
            Groups the generation batch must hold.
        strategy (`str`, *optional*, defaults to `"adaptive"`):
            One of `"adaptive"`, `"deficit"`, `"fixed"`.
        granularity (`int`, *optional*, defaults to `1`):
            Round sizes are multiples of this.
        max_round_prompts (`int`, *optional*):
            Largest round; defaults to `8 * target_groups` (at an informative rate of 0.2, a 4x cap forces a
            second round on most steps; `benchmarks/dynamic_sampling.py` measures it).
        z (`float`, *optional*, defaults to `1.5`):
            Safety margin, in binomial standard deviations, of the adaptive strategy.
        prior_rate (`float`, *optional*, defaults to `0.5`), prior_strength (`float`, *optional*, defaults to `2.0`):
            Beta prior on the informative rate (mean and pseudo-count).
        decay (`float`, *optional*, defaults to `0.7`):
            Weight kept by past rounds' counts at each update.
        min_rate (`float`, *optional*, defaults to `0.02`):
            Floor on the estimated rate, so a streak of empty rounds cannot ask for an unbounded round.
        fixed_multiplier (`float`, *optional*, defaults to `3.0`):
            Size of every round of the `"fixed"` strategy, in targets.
    """

    def __init__(
        self,
        target_groups: int,
        *,
        strategy: str = "adaptive",
        granularity: int = 1,
        max_round_prompts: int | None = None,
        z: float = 1.5,
        prior_rate: float = 0.5,
        prior_strength: float = 2.0,
        decay: float = 0.7,
        min_rate: float = 0.02,
        fixed_multiplier: float = 3.0,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}.")
        if target_groups < 1 or granularity < 1:
            raise ValueError("target_groups and granularity must be positive.")
        if not 0.0 < prior_rate < 1.0 or not 0.0 < decay <= 1.0 or not 0.0 < min_rate <= 1.0:
            raise ValueError("prior_rate must be in (0, 1), decay in (0, 1] and min_rate in (0, 1].")
        self.target_groups = target_groups
        self.strategy = strategy
        self.granularity = granularity
        self.max_round_prompts = round_up(max_round_prompts or 8 * target_groups, granularity)
        self.z = z
        self.prior_rate = prior_rate
        self.prior_strength = prior_strength
        self.decay = decay
        self.min_rate = min_rate
        self.fixed_multiplier = fixed_multiplier
        self.generated = 0.0  # decayed count of groups generated
        self.informative = 0.0  # decayed count of informative groups among them

    @property
    def rate(self) -> float:
        """Posterior mean of the informative rate, floored at `min_rate`."""
        alpha = self.prior_rate * self.prior_strength + self.informative
        total = self.prior_strength + self.generated
        return max(alpha / total, self.min_rate)

    def next_round_size(self, needed: int) -> int:
        """Prompts to generate this round when `needed` informative groups are still missing."""
        if needed <= 0:
            return 0
        if self.strategy == "deficit":
            size = needed
        elif self.strategy == "fixed":
            size = math.ceil(self.fixed_multiplier * self.target_groups)
        else:
            p = self.rate
            # Smallest mean yield m = n p with m - z sqrt(m (1 - p)) >= needed (normal approximation to the binomial).
            b = self.z * math.sqrt(1.0 - p)
            sqrt_m = (b + math.sqrt(b * b + 4.0 * needed)) / 2.0
            size = math.ceil(sqrt_m * sqrt_m / p)
        return min(round_up(max(size, 1), self.granularity), self.max_round_prompts)

    def update(self, generated: int, informative: int) -> None:
        """Record a round's outcome."""
        self.generated = self.decay * self.generated + generated
        self.informative = self.decay * self.informative + informative

    def state_dict(self) -> dict:
        return {"generated": self.generated, "informative": self.informative}

    def load_state_dict(self, state: dict) -> None:
        self.generated = float(state["generated"])
        self.informative = float(state["informative"])


@dataclass(frozen=True)
class SelectionPlan:
    """
    Outcome of [`plan_selection`]. Group ids are positions in the step's candidate order: carried groups first
    (`0 .. num_carried - 1`), then this step's informative groups in generation order.
    """

    train: list[int]  # exactly `target` ids, or fewer when underfilled
    carry: list[int]  # surplus fresh groups kept for the next step
    discard: list[int]  # surplus fresh groups dropped, plus carried groups that would grow two versions stale


def plan_selection(
    *,
    num_carried: int,
    num_fresh: int,
    target: int,
    carry_over: bool,
    max_carry: int | None = None,
    keep_carried: Sequence[bool] | None = None,
) -> tuple[SelectionPlan, int]:
    """
    Choose the groups an optimizer batch trains on.

    Carried groups go first, oldest first. Those that do not fit wait for the next batch when `keep_carried` allows it
    (one bool per carried group: it would still be fresh enough there, see [`carry_keeps`]) and are discarded
    otherwise; without `keep_carried` none may wait (they would be two generation batches old). Fresh informative
    groups fill the rest in generation order; the surplus is carried when `carry_over` is on and discarded otherwise.
    At most `max_carry` groups (default `target`) are carried, waiting ones first.

    Returns:
        `(plan, missing)`: the plan and how many groups short of `target` the batch is (0 unless underfilled).

    Example:
    ```python
    >>> plan, missing = plan_selection(num_carried=2, num_fresh=5, target=4, carry_over=True)
    >>> plan.train, plan.carry, plan.discard, missing
    ([0, 1, 2, 3], [4, 5, 6], [], 0)
    >>> keep = [True, True, False]  # group 2 would grow too stale waiting another batch
    >>> plan_selection(num_carried=3, num_fresh=1, target=1, carry_over=True, max_carry=2, keep_carried=keep)[0]
    SelectionPlan(train=[0], carry=[1, 3], discard=[2])

    ```
    """
    if min(num_carried, num_fresh, target) < 0:
        raise ValueError("Group counts must be non-negative.")
    if keep_carried is not None and len(keep_carried) != num_carried:
        raise ValueError(f"keep_carried has {len(keep_carried)} entries for {num_carried} carried groups.")
    max_carry = target if max_carry is None else max_carry
    carried = list(range(num_carried))
    fresh = list(range(num_carried, num_carried + num_fresh))
    train = carried[:target]
    waiting = carried[target:]
    room = target - len(train)
    train += fresh[:room]
    surplus = fresh[room:]
    keep = [g for g in waiting if keep_carried is not None and keep_carried[g]] if carry_over else []
    carry = (keep + (surplus if carry_over else []))[:max_carry]
    discard = [g for g in waiting + surplus if g not in set(carry)]
    return SelectionPlan(train=train, carry=carry, discard=discard), target - len(train)


def carry_keeps(sampled_at: Sequence[int], *, now: int, updates_per_batch: float, max_staleness: float) -> list[bool]:
    """
    Whether each carried group may wait for the next generation batch: it would be trained there at most
    `max_staleness` optimizer updates after the policy that sampled it (`sampled_at`, in updates; `now` is the
    current count, and a generation batch lasts `updates_per_batch` updates).

    Example:
    ```python
    >>> carry_keeps([3, 5, 6], now=6, updates_per_batch=1.0, max_staleness=3)
    [False, True, True]

    ```
    """
    return [now + updates_per_batch - at <= max_staleness + 1e-9 for at in sampled_at]


class PromptStream:
    """
    A shuffled, resumable stream of dataset indices.

    Epoch `e` visits a permutation of `range(num_prompts)` drawn from `seed + e`, so no prompt repeats within an
    epoch, every process draws the same sequence (same seed), and reaching the end wraps into the next epoch instead
    of failing.

    Example:
    ```python
    >>> stream = PromptStream(3, seed=0)
    >>> first, second = stream.take(3), stream.take(3)
    >>> sorted(first), sorted(second), stream.epoch
    ([0, 1, 2], [0, 1, 2], 1)

    ```
    """

    def __init__(self, num_prompts: int, *, seed: int = 0, shuffle: bool = True) -> None:
        if num_prompts < 1:
            raise ValueError("The training dataset is empty.")
        self.num_prompts = num_prompts
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.cursor = 0
        self.consumed = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.num_prompts))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def take(self, n: int, *, skip: Callable[[int], bool] | None = None) -> list[int]:
        """
        Next `n` indices. `skip(index) -> True` passes over a prompt (e.g. a curriculum that retires solved prompts);
        if a whole epoch passes without finding `n` eligible prompts, fewer are returned rather than looping forever.
        """
        out: list[int] = []
        looked = 0
        while len(out) < n and looked < self.num_prompts + n:
            if self.cursor == self.num_prompts:
                self.epoch += 1
                self.cursor = 0
                self._order = self._permutation(self.epoch)
            index = self._order[self.cursor]
            self.cursor += 1
            looked += 1
            if skip is None or not skip(index):
                out.append(index)
        self.consumed += len(out)
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "consumed": self.consumed, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self.seed:
            raise ValueError(f"Checkpoint stream seed {state['seed']} differs from the run's seed {self.seed}.")
        self.epoch, self.cursor, self.consumed = int(state["epoch"]), int(state["cursor"]), int(state["consumed"])
        self._order = self._permutation(self.epoch)
