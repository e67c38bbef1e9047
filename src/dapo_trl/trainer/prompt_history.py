r"""Pre-rollout prompt skipping for dynamic sampling, as pure decisions.

Dynamic sampling (DAPO §3.2) filters *after* generation, so with an informative rate `p` every trained group costs at
least `1 / p` generated groups. That floor only holds for a sampler that knows nothing about its prompts, and prompt
value persists over training: a prompt whose `G` answers were all correct is very likely to be all correct the next
time it is drawn (GRESO, arXiv 2506.02177, makes the same observation). This module remembers each training prompt's
recent outcomes ([`PromptHistory`]) and passes over prompts whose recent groups were all zero-variance before they are
generated ([`SkipPolicy`]), with a probability that is explored and adapted online rather than fixed.

Everything here is a function of the calls it receives: two instances fed the same calls (one per process) make the
same decisions, and `state_dict()` / `load_state_dict()` resume a run exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .prompt_posterior import (
    decision_rng,
    fit_prior,
    forgetting_weight,
    informative_chance,
    posterior_std,
    thompson_informative,
)
from .sampling import GroupClassification

# Outcome codes stored per prompt.
UNSEEN, INFORMATIVE, ALL_CORRECT, ALL_WRONG = -1, 0, 1, 2
OUTCOME_NAMES = {INFORMATIVE: "informative", ALL_CORRECT: "all_correct", ALL_WRONG: "all_wrong"}
OUTCOMES = (INFORMATIVE, ALL_CORRECT, ALL_WRONG)
ZERO_VARIANCE = (ALL_CORRECT, ALL_WRONG)

_MASK = (1 << 64) - 1

# Decision and outcome counters of SkipPolicy (per generation batch and per run).
_COUNTERS = (
    "eligible_all_correct",
    "eligible_all_wrong",
    "skipped_all_correct",
    "skipped_all_wrong",
    "generated",
    "informative",
    "redrawn",
    "missed",
    "eligible_informative",
    "skipped_informative",
)
RULES = ("posterior", "streak")


def outcome_codes(classification: GroupClassification, informative: torch.Tensor | None = None) -> np.ndarray:
    """
    One outcome code per group: `INFORMATIVE`, `ALL_CORRECT` or `ALL_WRONG`.

    `informative` (the trainer's own verdict, when a subclass overrides it) wins over `classification.informative`; a
    group that is not informative and not all-correct counts as all-wrong (no learning signal, not solved).
    """
    verdict = classification.informative if informative is None else informative
    verdict = verdict.detach().cpu().bool().numpy()
    all_correct = classification.all_correct.detach().cpu().bool().numpy()
    if verdict.shape != all_correct.shape:
        raise ValueError(f"informative has shape {verdict.shape}, the classification {all_correct.shape}.")
    return np.where(verdict, INFORMATIVE, np.where(all_correct, ALL_CORRECT, ALL_WRONG)).astype(np.int8)


def _mix(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers with good avalanche."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def hashed_uniform(seed: int, index: int, count: int) -> float:
    """A uniform number in `[0, 1)` that depends only on `(seed, index, count)`: no generator state to carry around."""
    x = _mix((seed + 0x9E3779B97F4A7C15) & _MASK)
    x = _mix(x ^ (index & _MASK))
    x = _mix(x ^ (count & _MASK))
    return (x >> 11) * 2.0**-53


class PromptHistory:
    """
    The outcomes of every training prompt's recent groups, as arrays over the dataset index.

    Run-length encoded: for prompt `i`, its last `streak[i]` groups all had outcome `last_outcome[i]` (`UNSEEN` before
    its first group), the last of them generated at training step `last_step[i]`; `groups[i]` counts all its groups.
    That is all the streak rule needs ("were the recent groups all zero-variance, and how many of them?"). For the
    posterior rule, `successes[i]` and `failures[i]` count its completions that succeeded and failed, each group's
    counts weighted by `2^{-age / half_life}` (age in steps, as of `last_step[i]`). 29 bytes per prompt.

    Args:
        num_prompts (`int`):
            Size of the training dataset; indices are `0 .. num_prompts - 1`.
        half_life (`float`, *optional*):
            Half-life of the success counts, in training steps; `None` never forgets.
    """

    def __init__(self, num_prompts: int, *, half_life: float | None = None) -> None:
        if num_prompts < 1:
            raise ValueError("The training dataset is empty.")
        if half_life is not None and not half_life > 0:
            raise ValueError(f"half_life must be positive or None, got {half_life}.")
        self.num_prompts = num_prompts
        self.half_life = half_life
        self.last_outcome = np.full(num_prompts, UNSEEN, dtype=np.int8)
        self.streak = np.zeros(num_prompts, dtype=np.int32)
        self.last_step = np.full(num_prompts, -1, dtype=np.int32)
        self.groups = np.zeros(num_prompts, dtype=np.int32)
        self.successes = np.zeros(num_prompts, dtype=np.float64)
        self.failures = np.zeros(num_prompts, dtype=np.float64)

    def record(
        self,
        indices: Sequence[int],
        codes: np.ndarray,
        step: int,
        *,
        successes: np.ndarray | None = None,
        failures: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """
        Append one outcome per group (in order: an index may appear twice when a round crosses an epoch boundary),
        and, when given, its numbers of successful and failed completions.

        Returns:
            `(previous_outcome, previous_streak)` per group: the history each group was drawn with.
        """
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        codes = np.asarray(codes, dtype=np.int8).reshape(-1)
        if indices.shape != codes.shape:
            raise ValueError(f"Got {indices.size} prompt indices for {codes.size} group outcomes.")
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_prompts):
            raise ValueError(
                f"Prompt indices must be in [0, {self.num_prompts}), got {indices.min()}..{indices.max()}."
            )
        wins = np.zeros(indices.size) if successes is None else np.asarray(successes, dtype=np.float64).reshape(-1)
        losses = np.zeros(indices.size) if failures is None else np.asarray(failures, dtype=np.float64).reshape(-1)
        if wins.shape != indices.shape or losses.shape != indices.shape:
            raise ValueError(f"Got {indices.size} prompt indices for {wins.size} / {losses.size} success counts.")
        previous_outcome = np.empty_like(codes)
        previous_streak = np.empty(codes.shape, dtype=np.int32)
        start = 0
        while start < indices.size:
            # Largest run of distinct indices from `start`, so that each run can be written at once.
            _, first = np.unique(indices[start:], return_index=True)
            seen = np.zeros(indices.size - start, dtype=bool)
            seen[first] = True
            stop = start + (int(np.argmin(seen)) if not seen.all() else seen.size)
            chunk, new = indices[start:stop], codes[start:stop]
            previous_outcome[start:stop] = self.last_outcome[chunk]
            previous_streak[start:stop] = self.streak[chunk]
            same = self.last_outcome[chunk] == new
            self.streak[chunk] = np.where(same, self.streak[chunk] + 1, 1)
            self.last_outcome[chunk] = new
            kept = forgetting_weight(step - self.last_step[chunk], self.half_life)
            self.successes[chunk] = self.successes[chunk] * kept + wins[start:stop]
            self.failures[chunk] = self.failures[chunk] * kept + losses[start:stop]
            self.last_step[chunk] = step
            self.groups[chunk] += 1
            start = stop
        return previous_outcome, previous_streak

    def counts(self, indices: np.ndarray | int, now: int) -> tuple[np.ndarray, np.ndarray]:
        """Success and failure counts of `indices`, forgotten up to step `now`."""
        kept = forgetting_weight(now - self.last_step[indices], self.half_life)
        return self.successes[indices] * kept, self.failures[indices] * kept

    def state_dict(self) -> dict:
        return {
            "last_outcome": torch.from_numpy(self.last_outcome.copy()),
            "streak": torch.from_numpy(self.streak.copy()),
            "last_step": torch.from_numpy(self.last_step.copy()),
            "groups": torch.from_numpy(self.groups.copy()),
            "successes": torch.from_numpy(self.successes.copy()),
            "failures": torch.from_numpy(self.failures.copy()),
        }

    def load_state_dict(self, state: dict) -> None:
        arrays = {k: state[k].numpy() for k in ("last_outcome", "streak", "last_step", "groups")}
        if any(a.shape != (self.num_prompts,) for a in arrays.values()):
            raise ValueError(
                f"Checkpoint prompt history covers {arrays['groups'].shape[0]} prompts, the training dataset has "
                f"{self.num_prompts}: resume with the same dataset."
            )
        self.last_outcome = arrays["last_outcome"].astype(np.int8)
        self.streak = arrays["streak"].astype(np.int32)
        self.last_step = arrays["last_step"].astype(np.int32)
        self.groups = arrays["groups"].astype(np.int32)
        # Checkpoints written before the posterior rule have no success counts: its posteriors restart from the prior.
        zeros = torch.zeros(self.num_prompts, dtype=torch.float64)
        self.successes = state.get("successes", zeros).numpy().astype(np.float64)
        self.failures = state.get("failures", zeros).numpy().astype(np.float64)


class SkipPolicy:
    r"""
    Passes over prompts whose recent groups were all zero-variance, with an explored, online-adapted probability.

    **The rule.** A prompt is *eligible* when its last `z >= 1` groups all had the same zero-variance outcome `c`
    (all-correct, or all-wrong); a prompt never drawn, or informative last time, is always generated. When the prompt
    stream draws an eligible prompt, it is generated with probability

    $$ a(c, z) = \mathrm{clip}\left(\left(\frac{m(c, z)}{\lambda}\right)^{s},\ 1 - \text{max\_skip},\ 1\right) $$

    and skipped otherwise, where

    - `m(c, z)` is the informative rate measured on the eligible prompts of outcome `c` and streak `min(z, B)` that
      were generated anyway: a Beta estimate (mean `prior_rate`, `prior_strength` pseudo-groups) whose counts decay by
      `decay` per round, so it follows training as prompts move between classes. Each class is split in two by whether
      the prompt ever gave an informative group (`m(c, z, h)`): a prompt of middling difficulty that came out uniform
      once is far likelier to be informative next time than one that never was (easy or hard for now), and pooling
      them skipped the first with the second (on the held-out task of `benchmarks/dynamic_sampling.py`, the split
      halved the informative groups lost per trained group, 1.93 to 0.91);
    - `λ` is one threshold, updated after every round as
      `λ <- clip(λ exp(gain (target - π)), min_threshold, π)`, with `π` the decayed informative rate of all the groups
      generated (the prompts actually drawn);
    - `s = sharpness` turns the threshold into a smooth step: a class well below `λ` is skipped at `max_skip`, a class
      at or above it never.

    **Why.** Generating a prompt of class `k` costs one group and yields `m_k` informative groups in expectation, so
    the informative rate of what is generated, `π = Σ_k w_k a_k m_k / Σ_k w_k a_k` (`w_k` the share of class `k` in
    the stream), rises when a class with `m_k < π` is skipped and falls when a class with `m_k > π` is. The mix with
    the highest `π` (fewest groups generated per trained group) therefore skips, as far as exploration allows, every
    class less informative than the rate it reaches and none that is more: a threshold at `π` (a linear-fractional
    objective is optimised at a vertex). Capping `λ` at `π` gives exactly that when `target` is out of reach; when the
    generated groups are already more informative than `target`, the controller lowers `λ` and skips less, since every
    skip of a class with `m > 0` loses an informative group with probability `m` (fewer distinct prompts trained). The
    streak length enters through the measured rates (two all-wrong groups in a row predict a third better than one
    does) rather than a fixed power law, and the smooth step keeps a class whose estimate hovers around `λ` from being
    switched on and off round by round. Two bounds keep it honest:

    - `max_skip < 1`: every skipped prompt keeps a `1 - max_skip` chance to be generated each time the stream reaches
      it again, so prompts that become learnable as training improves (or unlearned) are found again, and those
      exploration draws are what measure `m` (the predictor's miss rate is measured, not assumed);
    - only zero-variance histories are ever skipped: a fresh prompt is always tried once.

    GRESO (arXiv 2506.02177) skips with probability `1 - p_e^z` and moves a per-class exploration rate `p_e` in fixed
    steps towards a target share of zero-variance groups; here each class's probability follows from its own measured
    miss rate against one threshold.

    **Randomness** is derived by hashing `(seed, index, n)`, `n` being how many decisions prompt `index` has had: no
    generator to carry, identical on every process that makes the same calls, and exact across save/load.

    **Round sizing.** Skipped prompts are passed over by [`PromptStream.take`] and never generated, so the groups fed
    to [`RoundPlanner.update`] are exactly the prompts drawn: its informative-rate estimate is the rate of drawn prompts
    and needs no correction. [`expected_informative_rate`] is the same quantity as this policy estimates it.

    Args:
        num_prompts (`int`):
            Size of the training dataset.
        seed (`int`, *optional*, defaults to `0`):
            Seed of the skip decisions (the trainer passes `args.seed`).
        target (`float`, *optional*, defaults to `0.75`):
            Informative rate of the generated groups that skipping steers towards, in `(0, 1]`: above it, skipping
            relaxes. `1` always skips as far as the measured rates justify.
        max_skip (`float`, *optional*, defaults to `0.99`):
            Highest skip probability, in `[0, 1)`; `0` never skips.
        streak_buckets (`int`, *optional*, defaults to `3`):
            Streak lengths `1 .. B - 1` get their own estimate, longer streaks share the last one.
        decay (`float`, *optional*, defaults to `0.9`):
            Weight kept by past rounds in the estimates, per round.
        gain (`float`, *optional*, defaults to `0.5`):
            Step of the threshold's update, in log space per unit of error.
        prior_rate (`float`, *optional*, defaults to `0.5`), prior_strength (`float`, *optional*, defaults to `1.0`):
            Beta prior of every class's informative rate.
        min_threshold (`float`, *optional*, defaults to `0.02`):
            Lowest threshold: classes informative less than once in `1 / min_threshold` draws are still skipped in part.
        sharpness (`float`, *optional*, defaults to `4.0`):
            Exponent `s` of the step around the threshold (`1`: acceptance proportional to `m`; large: a hard step).
        rule (`str`, *optional*, defaults to `"streak"`):
            `"posterior"`: every prompt already seen is judged by a Thompson draw from its own Beta posterior (below);
            `"streak"`: the class rule above.
        half_life (`float`, *optional*, defaults to `100.0`):
            Half-life, in training steps, of each prompt's success counts (posterior rule); `None` never forgets.
        draws (`int`, *optional*, defaults to `1`):
            Thompson draws per decision (posterior rule): a prompt is skipped only when all of them say so.
        num_generations (`int`, *optional*):
            Group size `G`; defaults to the largest number of scored completions of a group recorded so far.

    **The posterior rule** (`rule="posterior"`, MoPPS, arXiv 2507.04632). Each prompt's success rate has a Beta
    posterior: the population prior fitted to the first group of every prompt ([`fit_prior`]) plus the prompt's own
    successes and failures, forgotten with `half_life` ([`PromptHistory`]). A prompt already seen is generated when,
    for one success rate `q` drawn from its posterior, the chance `1 - q^G - (1 - q)^G` that its next group is
    informative reaches `λ` (the same threshold as above); prompts never seen are always generated (skipping one would
    learn nothing: the next is as unknown), and every decision keeps the `1 - max_skip` exploration chance. Thompson
    sampling rather than the posterior mean: a prompt whose estimate is uncertain (few groups, or old ones forgotten)
    draws widely and is tried again in proportion to how likely it is to be worth it, which the mean would not do.
    """

    def __init__(
        self,
        num_prompts: int,
        *,
        seed: int = 0,
        target: float = 0.75,
        max_skip: float = 0.99,
        streak_buckets: int = 3,
        decay: float = 0.9,
        gain: float = 0.5,
        prior_rate: float = 0.5,
        prior_strength: float = 1.0,
        min_threshold: float = 0.02,
        sharpness: float = 4.0,
        rule: str = "streak",
        half_life: float | None = 100.0,
        draws: int = 1,
        num_generations: int | None = None,
    ) -> None:
        if not 0.0 < target <= 1.0:
            raise ValueError(f"target must be in (0, 1], got {target}.")
        if not 0.0 <= max_skip < 1.0:
            raise ValueError(
                f"max_skip must be in [0, 1) so that a skipped prompt can be drawn again, got {max_skip}."
            )
        if streak_buckets < 1 or not 0.0 < decay <= 1.0 or gain < 0:
            raise ValueError("streak_buckets must be >= 1, decay in (0, 1] and gain >= 0.")
        if not 0.0 < prior_rate < 1.0 or prior_strength <= 0 or not 0.0 < min_threshold <= 1.0 or sharpness <= 0:
            raise ValueError(
                "prior_rate must be in (0, 1), prior_strength > 0, min_threshold in (0, 1] and sharpness > 0."
            )
        if rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {rule!r}.")
        if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
            raise ValueError(f"draws must be a positive integer, got {draws!r}.")
        self.history = PromptHistory(num_prompts, half_life=half_life)
        self.rule = rule
        self.draws = draws
        self.num_generations = num_generations
        self.clock = 0  # latest training step recorded: the "now" of forgetting
        self._prior_moments = np.zeros(
            3, dtype=np.float64
        )  # (count, sum, sum of squares) of first-group success shares
        self._predicted = np.zeros(2, dtype=np.float64)  # this batch: (predicted, observed) informative groups
        self.num_prompts = num_prompts
        self.seed = seed
        self.target = target
        self.max_skip = max_skip
        self.streak_buckets = streak_buckets
        self.decay = decay
        self.gain = gain
        self.prior_rate = prior_rate
        self.prior_strength = prior_strength
        self.min_threshold = min_threshold
        self.sharpness = sharpness
        self.looks = np.zeros(num_prompts, dtype=np.int32)  # decisions made per prompt: the hash counter
        self.skipped = np.zeros(num_prompts, dtype=np.int32)  # skips since the prompt was last generated
        # Decayed (informative, generated) counts of eligible prompts generated, per zero-variance outcome and streak.
        # ... split by whether the prompt ever gave an informative group: a prompt that did (a mixed prompt that came
        # out uniform once) is far likelier to be informative again than one that never did (easy or hard for now).
        self._counts = np.zeros((len(ZERO_VARIANCE), streak_buckets, 2, 2), dtype=np.float64)
        self.informative_seen = np.zeros(num_prompts, dtype=bool)
        self._drawn = np.zeros(2, dtype=np.float64)  # decayed (informative, generated) over every generated group
        self.threshold = target
        # Per generation batch (reset by `metrics`) and whole-run counters.
        self._batch = np.zeros(len(_COUNTERS), dtype=np.int64)
        self.totals = np.zeros(len(_COUNTERS), dtype=np.int64)
        self._skip_table = self._table()

    # ------------------------------------------------------------------ decisions

    def class_rate(self, outcome: int, streak: int, informative_before: bool = False) -> float:
        """
        Measured informative rate `m(c, z, h)` of eligible prompts with this history (posterior mean): last outcome
        `c`, streak `z`, and `h` whether the prompt ever gave an informative group before.
        """
        informative, generated = self._counts[(*self._cell(outcome, streak), int(informative_before))]
        return (self.prior_rate * self.prior_strength + informative) / (self.prior_strength + generated)

    def skip_probability(self, outcome: int, streak: int, informative_before: bool = False) -> float:
        """Probability of skipping a prompt whose last `streak` groups all had `outcome` (0 unless zero-variance)."""
        if outcome not in ZERO_VARIANCE or streak < 1:
            return 0.0
        return float(self._skip_table[(*self._cell(outcome, streak), int(informative_before))])

    def _cell(self, outcome: int | np.ndarray, streak: int | np.ndarray) -> tuple:
        """Class index `(c, z)` of a zero-variance `outcome` and its `streak` (the last bucket takes every longer
        streak) in the rate counts and the skip table; elementwise on arrays."""
        return outcome - ALL_CORRECT, np.minimum(streak, self.streak_buckets) - 1

    def _table(self) -> np.ndarray:
        table = np.zeros((len(ZERO_VARIANCE), self.streak_buckets, 2))
        for c, outcome in enumerate(ZERO_VARIANCE):
            for b in range(self.streak_buckets):
                for h in (0, 1):
                    ratio = self.class_rate(outcome, b + 1, bool(h)) / self.threshold
                    accept = 1.0 if ratio >= 1 else ratio**self.sharpness
                    table[c, b, h] = 1.0 - min(max(accept, 1.0 - self.max_skip), 1.0)
        return table

    def should_skip(self, index: int) -> bool:
        """
        Whether to pass over prompt `index`, just drawn by the prompt stream. Usable as the `skip` callable of
        [`PromptStream.take`]; every call on an eligible prompt is one decision (counted in the metrics).
        """
        if not 0 <= index < self.num_prompts:
            raise IndexError(f"Prompt index {index} is outside the training dataset (size {self.num_prompts}).")
        outcome = int(self.history.last_outcome[index])
        if self.rule == "posterior":
            return self._posterior_skip(index, outcome)
        if outcome not in ZERO_VARIANCE:
            return False
        c, b = self._cell(outcome, int(self.history.streak[index]))
        count = int(self.looks[index])
        self.looks[index] = count + 1
        skip = hashed_uniform(self.seed, index, count) < self._skip_table[c, b, int(self.informative_seen[index])]
        self._count("eligible_" + OUTCOME_NAMES[outcome])
        if skip:
            self.skipped[index] += 1
            self._count("skipped_" + OUTCOME_NAMES[outcome])
        return bool(skip)

    @property
    def prior(self) -> tuple[float, float]:
        """Beta prior `(a, b)` of a prompt's success rate: the population's, fitted to each prompt's first group."""
        return fit_prior(self._prior_moments, self.num_generations or 2)

    def posterior(self, indices: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
        """Beta posterior `(a, b)` of the success rate of `indices`, forgotten up to the latest recorded step."""
        a0, b0 = self.prior
        successes, failures = self.history.counts(indices, self.clock)
        return a0 + successes, b0 + failures

    def _posterior_skip(self, index: int, outcome: int) -> bool:
        if outcome == UNSEEN:
            return False
        count = int(self.looks[index])
        self.looks[index] = count + 1
        self._count("eligible_" + OUTCOME_NAMES[outcome])
        if hashed_uniform(self.seed, index, count) < 1.0 - self.max_skip:
            return False  # exploration floor
        a, b = self.posterior(index)
        rng = decision_rng(self.seed, index, count)
        skip = thompson_informative(float(a), float(b), self.num_generations, rng, self.draws) < self.threshold
        if skip:
            self.skipped[index] += 1
            self._count("skipped_" + OUTCOME_NAMES[outcome])
        return bool(skip)

    # ------------------------------------------------------------------ learning from outcomes

    def record(
        self,
        indices: Sequence[int],
        classification: GroupClassification,
        *,
        step: int,
        informative: torch.Tensor | None = None,
    ) -> None:
        """
        Learn from one generated round: `indices[j]` is the dataset index of group `j`, `classification` its
        [`classify_groups`] outcome, `step` the training step (kept as the "when" of the history). Pass the trainer's
        own `informative` verdict when it differs from `classification.informative` (a custom filter).
        """
        codes = outcome_codes(classification, informative)
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        successes, scored = _success_counts(classification, codes, self.num_generations)
        if self.num_generations is None and scored.size:
            self.num_generations = int(max(scored.max(), 2))
        if indices.size and self.num_generations is not None:
            # The posterior each group was drawn with, against what it gave (before this round updates it).
            a, b = self.posterior(indices)
            self._predicted += (informative_chance(a, b, self.num_generations).sum(), (codes == INFORMATIVE).sum())
        seen_before = self.informative_seen[indices]  # as the decisions saw it, before this round
        _, first = np.unique(indices, return_index=True)
        redrawn = np.zeros(indices.size, dtype=bool)
        redrawn[first] = self.skipped[indices[first]] > 0
        previous_outcome, previous_streak = self.history.record(
            indices, codes, step, successes=successes, failures=scored - successes
        )
        self.clock = max(self.clock, int(step))
        first = (previous_outcome == UNSEEN) & (scored > 0)
        share = successes[first] / scored[first]
        self._prior_moments += (share.size, share.sum(), (share**2).sum())
        self.skipped[indices] = 0
        is_informative = codes == INFORMATIVE

        self._counts *= self.decay
        eligible = np.isin(previous_outcome, ZERO_VARIANCE)
        cls, bucket = self._cell(previous_outcome[eligible].astype(np.int64), previous_streak[eligible])
        before = seen_before[eligible].astype(np.int64)
        np.add.at(self._counts[..., 0], (cls, bucket, before), is_informative[eligible])
        np.add.at(self._counts[..., 1], (cls, bucket, before), 1.0)
        self.informative_seen[indices[is_informative]] = True

        self._drawn = self.decay * self._drawn + (is_informative.sum(), indices.size)
        if self._drawn[1] > 0:
            rate = self.expected_informative_rate
            threshold = min(self.threshold * math.exp(self.gain * (self.target - rate)), rate)
            self.threshold = max(threshold, self.min_threshold)
        self._skip_table = self._table()

        self._count("generated", indices.size)
        self._count("informative", int(is_informative.sum()))
        self._count("redrawn", int(redrawn.sum()))
        self._count("missed", int((redrawn & is_informative).sum()))

    @property
    def expected_informative_rate(self) -> float:
        """Decayed informative rate of the groups generated (the drawn prompts): what the threshold steers."""
        informative, generated = self._drawn
        return float(informative / generated) if generated > 0 else math.nan

    # ------------------------------------------------------------------ metrics and state

    def _count(self, name: str, value: int = 1) -> None:
        self._batch[_COUNTERS.index(name)] += value
        self.totals[_COUNTERS.index(name)] += value

    def metrics(self) -> dict[str, float]:
        """
        This generation batch's skipping statistics (since the previous call), for `dynamic_sampling/<name>`:

        - `prompts_skipped`: prompts passed over; `prompts_skip_eligible`: prompts drawn with a zero-variance history;
        - `skip_prob/all_correct`, `skip_prob/all_wrong`: current skip probability of a prompt whose last group was
          all-correct (all-wrong);
        - `skip_threshold`: `λ`; `drawn_informative_rate`: the decayed informative rate of generated groups;
        - `skip_miss_rate`: share of the prompts generated after being skipped that turned out informative (the
          predictor's miss rate; NaN when none).
        """
        batch = dict(zip(_COUNTERS, self._batch.tolist(), strict=True))
        self._batch[:] = 0
        stats = {
            "prompts_skipped": float(sum(batch["skipped_" + OUTCOME_NAMES[o]] for o in OUTCOMES)),
            "prompts_skip_eligible": float(sum(batch["eligible_" + OUTCOME_NAMES[o]] for o in OUTCOMES)),
            "skip_threshold": self.threshold,
            "drawn_informative_rate": self.expected_informative_rate,
            "skip_miss_rate": batch["missed"] / batch["redrawn"] if batch["redrawn"] else math.nan,
        }
        if self.rule == "streak":
            stats["skip_prob/all_correct"] = self.skip_probability(ALL_CORRECT, 1)
            stats["skip_prob/all_wrong"] = self.skip_probability(ALL_WRONG, 1)
        else:
            predicted, observed = self._predicted
            generated = batch["generated"]
            stats["skip_predicted_informative"] = predicted / generated if generated else math.nan
            stats["skip_observed_informative"] = observed / generated if generated else math.nan
            seen = np.flatnonzero(self.history.groups)
            stats["posterior_std"] = float(posterior_std(*self.posterior(seen)).mean()) if seen.size else math.nan
        self._predicted[:] = 0
        return stats

    def run_totals(self) -> dict[str, int]:
        """Whole-run counts: `eligible`, `skipped`, `generated`, `informative`, `redrawn` and `missed` (informative
        among the redrawn)."""
        totals = dict(zip(_COUNTERS, self.totals.tolist(), strict=True))
        return {
            "eligible": sum(totals["eligible_" + OUTCOME_NAMES[o]] for o in OUTCOMES),
            "skipped": sum(totals["skipped_" + OUTCOME_NAMES[o]] for o in OUTCOMES),
            **{k: totals[k] for k in ("generated", "informative", "redrawn", "missed")},
        }

    def state_dict(self) -> dict:
        return {
            "num_prompts": self.num_prompts,
            "seed": self.seed,
            "history": self.history.state_dict(),
            "looks": torch.from_numpy(self.looks.copy()),
            "skipped": torch.from_numpy(self.skipped.copy()),
            "counts": torch.from_numpy(self._counts.copy()),
            "informative_seen": torch.from_numpy(self.informative_seen.copy()),
            "drawn": torch.from_numpy(self._drawn.copy()),
            "threshold": self.threshold,
            "batch": torch.from_numpy(self._batch.copy()),
            "totals": torch.from_numpy(self.totals.copy()),
            "rule": self.rule,
            "clock": self.clock,
            "num_generations": self.num_generations,
            "prior_moments": torch.from_numpy(self._prior_moments.copy()),
            "predicted": torch.from_numpy(self._predicted.copy()),
        }

    def load_state_dict(self, state: dict) -> None:
        if int(state["num_prompts"]) != self.num_prompts:
            raise ValueError(
                f"Checkpoint skip state covers {state['num_prompts']} prompts, the training dataset has "
                f"{self.num_prompts}: resume with the same dataset."
            )
        if int(state["seed"]) != self.seed:
            raise ValueError(f"Checkpoint skip seed {state['seed']} differs from the run's seed {self.seed}.")
        counts = state["counts"].numpy()
        if counts.ndim == 3:  # saved before the classes were split by an earlier informative group: both halves
            counts = np.stack([counts, np.zeros_like(counts)], axis=2)
        if counts.shape != self._counts.shape:
            raise ValueError(
                f"Checkpoint skip state has {counts.shape[1]} streak buckets, this run {self.streak_buckets}."
            )
        self.history.load_state_dict(state["history"])
        self.looks = state["looks"].numpy().astype(np.int32)
        self.skipped = state["skipped"].numpy().astype(np.int32)
        self._counts = counts.astype(np.float64)
        seen = state.get("informative_seen")
        self.informative_seen = np.zeros(self.num_prompts, dtype=bool) if seen is None else seen.numpy().astype(bool)
        self._drawn = state["drawn"].numpy().astype(np.float64)
        self.threshold = float(state["threshold"])
        # Older checkpoints (streak rule only) lack the posterior's state and the last two counters.
        pad = len(_COUNTERS) - state["batch"].numel()
        self._batch = np.pad(state["batch"].numpy().astype(np.int64), (0, pad))
        self.totals = np.pad(state["totals"].numpy().astype(np.int64), (0, pad))
        if state.get("rule", "streak") != self.rule:
            raise ValueError(
                f"Checkpoint skip rule {state.get('rule', 'streak')!r} differs from this run's {self.rule!r}: resume "
                "with the same dynamic_sampling_skip_rule."
            )
        self.clock = int(state.get("clock", 0))
        if state.get("num_generations") is not None:
            self.num_generations = int(state["num_generations"])
        self._prior_moments = state.get("prior_moments", torch.zeros(3)).numpy().astype(np.float64)
        self._predicted = state.get("predicted", torch.zeros(2)).numpy().astype(np.float64)
        self._skip_table = self._table()


def _success_counts(
    classification: GroupClassification, codes: np.ndarray, num_generations: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Successful and scored completions per group; from the outcome codes when the classification lacks them."""
    if classification.successes is not None and classification.scored is not None:
        successes = classification.successes.detach().cpu().numpy().astype(np.float64)
        return successes, classification.scored.detach().cpu().numpy().astype(np.float64)
    G = float(num_generations or 2)
    successes = np.select([codes == ALL_CORRECT, codes == INFORMATIVE], [G, G / 2], 0.0)
    return successes, np.full(codes.shape, G)
