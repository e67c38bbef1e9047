r"""Sample efficiency of dynamic sampling's round sizing (DAPO §3.2) and pre-rollout skipping, on simulated prompts.

Drives the real [`RoundPlanner`], [`plan_selection`], [`PromptStream`], [`classify_groups`] and [`SkipPolicy`]
through a loop that mirrors `DAPOTrainer._dynamic_sampling_batch` ([`sample_generation_batch`]), with the model
replaced by a population of prompts whose pass rates follow a Beta distribution. A group of `G` completions of a prompt with pass rate `q`
holds `Binomial(G, q)` correct answers, and is informative when it is neither all-correct nor all-wrong, so the
population's informative rate is

$$ p = 1 - \mathbb{E}[q^G] - \mathbb{E}[(1 - q)^G], \qquad
   \mathbb{E}[q^G] = \frac{B(a + G, b)}{B(a, b)} \text{ for } q \sim \mathrm{Beta}(a, b). $$

Training `T` groups needs at least `T / p` generated groups on average: the floor the table compares against.

Strategies (one `RoundPlanner` each, fresh per population, same seed):

| name           | round size                                  | surplus informative groups           |
|----------------|---------------------------------------------|--------------------------------------|
| fixed-3x       | `3 * target` every round (verl's gen batch) | discarded                            |
| deficit        | exactly the missing groups                  | none (a round never overshoots)      |
| adaptive       | from the estimated informative rate         | discarded                            |
| adaptive+carry | from the estimated informative rate         | carried to the next step (<= target) |

Columns: `gen/trained` (groups generated per group trained), `x floor` (that over the floor `1 / p`),
`rounds/step` (mean generation rounds per optimizer batch), `underfilled` (share of batches that ran out of rounds
before holding `target` groups), `stale` (share of trained groups that were carried, one generation batch old:
`steps_per_generation * num_iterations / gradient_accumulation_steps` optimizer updates).
Exact-deficit refill wastes nothing either, so it sits on the floor too; what it pays is rounds (each one a full,
sequential generation pass) and underfilled batches.

`--drift D` lets the policy improve during training: every prompt's pass-rate logit grows linearly by `D` over the
run, so the informative rate (and the floor, computed step by step) moves.

Pre-rollout skipping and probing (`--section skip`): the same loop with a [`SkipPolicy`] passing over prompts whose
recent groups were all zero-variance and, on `+probe` rows, a [`ProbeRule`] that generates `k` of a group's `G`
completions first and completes the group only when the probe is mixed or its kind of prompt completes informative
often enough (`k = default_probe(G)`, `G // 4`), over several epochs of a dataset whose prompts change as training
improves: every prompt's pass-rate logit rises linearly over the run by `--skip-drift` times its learnability
`k ~ Exponential(1)` (most prompts move a little, a few a lot), so some unsolved prompts become solvable and solved ones
stay solved. The run lasts `--epochs` passes over the dataset of a sampler without skipping (the same number of steps
for every variant; with skipping the stream passes faster). Variants ([`SKIP_VARIANTS`]): adaptive sizing without
carry-over (DAPOConfig's defaults, and skipping as `dynamic_sampling_skip=True` was before carry-over and probing
became its defaults), and with carry-over (carried groups wait up to `--carry-max-staleness` batches) with no skip,
the streak rule or the posterior rule, each without and with probing, and `adaptive+carry+oracle`, a reference that
skips seen prompts on their true pass rates ([`OracleSkipPolicy`]). `adaptive+carry+skip+probe` is what
`dynamic_sampling_skip=True` does with its defaults. Generated groups count a probe of `k` as `k / G` of a group.
Extra columns: `epochs` (passes the stream made), `x oracle` (x floor over the oracle's), `x floor after epoch 1`
(steps once a history exists), `discarded / 100 generated` (informative groups generated and never trained),
`skipped / drawn` (prompts passed over, per prompt the stream drew), `probes completed` (share of probed groups
completed), `lost / trained` (informative groups the skipped prompts and the dropped probes would have given, from
their true pass rates, per trained group) and `miss rate` (share of the prompts generated after being skipped that
were informative, the policy's own measure).

Held-out task (`--section heldout`): the same variants on [`HELD_OUT`], persistent easy, hard and mixed prompts (pass
rates from a mixture of Beta(30, 0.5), Beta(0.5, 30) and Beta(2, 2); about a quarter of the groups informative at
G = 4), 5 passes, no drift, seed 1: a task the defaults were not tuned on.

Launch:
```
python benchmarks/dynamic_sampling.py                 # every section: target 32 groups, 300 steps / 3 epochs
python benchmarks/dynamic_sampling.py --section rounds --target 512    # the paper's 512 prompts per batch
python benchmarks/dynamic_sampling.py --section rounds --drift 2       # pass rates improve over training
python benchmarks/dynamic_sampling.py --section rounds --max-round-prompts 256   # round cap at 8x the target
python benchmarks/dynamic_sampling.py --section skip --epochs 5        # skipping and probing over 5 epochs
python benchmarks/dynamic_sampling.py --section heldout                # the held-out task
python benchmarks/dynamic_sampling.py --quick         # about half a minute
```
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dapo_trl.trainer.probing import ProbeRule, default_probe, pad_completions, probe_granularity
from dapo_trl.trainer.prompt_history import UNSEEN, SkipPolicy
from dapo_trl.trainer.sampling import (
    GroupClassification,
    NoInformativeWatch,
    PromptStream,
    RoundPlanner,
    carry_keeps,
    classify_groups,
    plan_selection,
    round_up,
)

# Adaptive+carry targets this benchmark reports against.
TARGET_FLOOR_RATIO = 1.05
TARGET_ROUNDS = 1.3
# Targets of `dynamic_sampling_skip=True` with its defaults (skipping, probing, carry-over), over several epochs.
TARGET_ORACLE_RATIO = 1.15  # x floor over the seen-once oracle's, on every population
TARGET_HELD_OUT_RATIO = 0.45  # x floor on the held-out task
# The `+oracle` reference row skips a prompt already generated when its true informative chance is below this share
# of the highest chance a group of G can have (0.9 at G = 16).
ORACLE_THRESHOLD = 0.9
SKIP_TARGET_POPULATIONS = ("mostly unsolved", "polarised")


@dataclass(frozen=True)
class Population:
    """
    Prompts whose pass rates follow `Beta(a, b)`, or with `components` a mixture: `(weight, a, b)` per component.
    """

    name: str
    a: float
    b: float
    components: tuple[tuple[float, float, float], ...] = ()

    @property
    def describe(self) -> str:
        if not self.components:
            return f"Beta({self.a:g}, {self.b:g})"
        return " + ".join(f"{w:.0%} Beta({a:g}, {b:g})" for w, a, b in self.components)


POPULATIONS: tuple[Population, ...] = (
    Population("mostly unsolved", 0.05, 0.2),
    Population("polarised", 0.15, 0.15),
    Population("mostly solved", 2.0, 0.3),
    Population("U-shaped", 0.5, 0.5),
    Population("uniform", 1.0, 1.0),
)
# A task none of the rules or defaults were tuned on: persistent easy, hard and mixed prompts, about a quarter of the
# groups informative at G = 4 (run with `--section heldout`: 5 passes, no drift, seed 1).
HELD_OUT = Population(
    "held-out: easy, hard, mixed", 0.0, 0.0, components=((0.35, 30.0, 0.5), (0.35, 0.5, 30.0), (0.30, 2.0, 2.0))
)


@dataclass(frozen=True)
class Strategy:
    name: str
    round_sizing: str
    carry_over: bool


STRATEGIES: tuple[Strategy, ...] = (
    Strategy("fixed-3x", "fixed", False),
    Strategy("deficit", "deficit", False),
    Strategy("adaptive", "adaptive", False),
    Strategy("adaptive+carry", "adaptive", True),
)


def population_informative_rate(population: Population, num_generations: int) -> float:
    """`p` of a population (exact): the weighted rate of its components, or of its one Beta."""
    if not population.components:
        return beta_informative_rate(population.a, population.b, num_generations)
    return sum(w * beta_informative_rate(a, b, num_generations) for w, a, b in population.components)


def beta_informative_rate(a: float, b: float, num_generations: int) -> float:
    """`p = 1 - E[q^G] - E[(1-q)^G]` for `q ~ Beta(a, b)` (exact)."""

    def log_beta(x: float, y: float) -> float:
        return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)

    all_correct = math.exp(log_beta(a + num_generations, b) - log_beta(a, b))
    all_wrong = math.exp(log_beta(a, b + num_generations) - log_beta(a, b))
    return 1.0 - all_correct - all_wrong


def informative_prob(pass_rates: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Probability that a group of each prompt is informative: `1 - q^G - (1-q)^G`."""
    return 1.0 - pass_rates.pow(num_generations) - (1.0 - pass_rates).pow(num_generations)


def drifted(
    base_logits: torch.Tensor, drift: float, progress: float, learnability: torch.Tensor | None = None
) -> torch.Tensor:
    """Pass rates after the policy improved by `drift * progress` in logit (times each prompt's `learnability`)."""
    if learnability is None:
        return torch.sigmoid(base_logits + drift * progress)
    return torch.sigmoid(base_logits + drift * progress * learnability)


@dataclass(frozen=True)
class BatchOutcome:
    rounds: int
    generated: float  # prompt groups generated this batch (a probed group counts k / G until completed)
    fresh: int  # informative groups among them
    trained: int
    carried_in: int  # trained groups that came from the previous batch
    carried_out: int
    discarded: int
    missing: int
    round_sizes: tuple[int, ...]
    carried_at: tuple[int, ...] = ()  # policy version that sampled each carried-out group
    prompts: int = 0  # prompts generated (probed or whole)
    dropped: tuple[tuple[int, int], ...] = ()  # (prompt, probe's outcome: 1 all correct, 0 all wrong) not completed


@dataclass(frozen=True)
class Carry:
    """How long carried groups may wait: `max_staleness` updates, `updates_per_batch` per generation batch."""

    max_staleness: float = 2.0
    updates_per_batch: float = 1.0
    max_carry: int | None = None  # default: the target times the batches a group may wait

    def keeps(self, carried_at: Sequence[int], now: int) -> list[bool]:
        return carry_keeps(
            carried_at, now=now, updates_per_batch=self.updates_per_batch, max_staleness=self.max_staleness
        )

    def cap(self, target: int) -> int:
        return self.max_carry or target * max(int(self.max_staleness // self.updates_per_batch), 1)


ONE_BATCH = Carry(max_staleness=1.0)  # carry-over as it was: a carried group is trained at the next batch or dropped


def sample_generation_batch(
    planner: RoundPlanner,
    stream: PromptStream,
    score: Callable[[list[int]], torch.Tensor | GroupClassification],
    *,
    target: int,
    num_carried: int,
    max_rounds: int,
    carry_over: bool,
    skip: Callable[[int], bool] | None = None,
    policy: SkipPolicy | None = None,
    step: int = 0,
    carried_at: Sequence[int] = (),
    carry: Carry = ONE_BATCH,
    watch: NoInformativeWatch | None = None,
    probe: ProbeRule | None = None,
    sample: Callable[[list[int], int], torch.Tensor] | None = None,
    processes: int = 1,
    observe: Callable[[SkipPolicy, list[int], GroupClassification], None] | None = None,
) -> BatchOutcome:
    """
    One generation batch, decided exactly as `DAPOTrainer._dynamic_sampling_batch` decides it.

    The same statements in the same order (carried groups count first, rounds until enough informative groups or
    `max_rounds` (one round once `watch` says recent rounds found nothing informative), round sizes rounded down to the
    planner's granularity, the planner updated after every round, then [`plan_selection`], carried groups waiting while
    `carry` allows); only generation and scoring are replaced by `score(prompt_indices)`, which returns the
    informative verdicts `(n,)` or, when a skip `policy` is given, the round's [`GroupClassification`].
    `tests/test_benchmarks.py` runs the real trainer with the same verdicts and checks the two agree step by step.

    With a `policy` ([`SkipPolicy`]), the stream passes over a prompt when `skip` (the trainer's `skip_prompt`) or
    the policy says so, the user's rule first, and the policy learns from every scored round at training step `step`.
    With a `probe` ([`ProbeRule`]) each round generates `k` completions per prompt with `sample(indices, k)` (values
    `(n, k)`, +1 correct, -1 wrong), completes the groups the rule picks with `sample(completed, G - k)`, and scores the
    groups as generated (the rest of a dropped group unscored). `observe(policy, indices, classification)` sees
    every scored round just before the policy learns from it (instrumentation: `skip_decomposition.py`).
    """
    if policy is not None:
        user_skip = skip
        skip = policy.should_skip if user_skip is None else (lambda i: user_skip(i) or policy.should_skip(i))
    needed = max(target - num_carried, 0)
    num_fresh = rounds = prompts = 0
    generated = 0.0
    sizes: list[int] = []
    dropped: list[tuple[int, int]] = []
    while num_fresh < needed and rounds < max_rounds:
        if rounds and watch is not None and watch.established:
            break
        if watch is not None and watch.established:
            size = round_up(needed - num_fresh, planner.granularity)
        else:
            size = planner.next_round_size(needed - num_fresh)
        indices = stream.take(size, skip=skip)
        indices = indices[: len(indices) - len(indices) % planner.granularity]
        if not indices:
            break
        rounds += 1
        sizes.append(len(indices))
        if probe is None:
            scored = score(indices)
            generated += len(indices)
        else:
            scored, probed, completed = probe_and_complete(probe, sample, indices, processes)
            generated += len(indices) * probe.probe / probe.num_generations + completed.sum() * probe.rest_share
            outcome = probed.all_correct.long().tolist()
            dropped += [(i, outcome[j]) for j, i in enumerate(indices) if not completed[j]]
        informative = scored.informative if isinstance(scored, GroupClassification) else scored  # (n,)
        if policy is not None:
            if not isinstance(scored, GroupClassification):
                raise TypeError("With a skip policy, score must return the round's GroupClassification.")
            if observe is not None:
                observe(policy, indices, scored)
            policy.record(indices, scored, step=step)
        if probe is not None:
            probe.record(indices, probed, completed, informative, scored)
        planner.update(len(indices), int(informative.sum()))
        if watch is not None:
            watch.update(len(indices), int(informative.sum()))
        prompts += len(indices)
        num_fresh += int(informative.sum())
    if watch is not None:
        watch.end_step(rounds=rounds, max_rounds=max_rounds)
    keep = carry.keeps(carried_at, step) if carry_over and carried_at else None
    plan, missing = plan_selection(
        num_carried=num_carried,
        num_fresh=num_fresh,
        target=target,
        carry_over=carry_over,
        max_carry=carry.cap(target),
        keep_carried=keep,
    )
    return BatchOutcome(
        rounds=rounds,
        generated=generated,
        fresh=num_fresh,
        trained=len(plan.train),
        carried_in=min(num_carried, target),
        carried_out=len(plan.carry),
        discarded=len(plan.discard),
        missing=missing,
        round_sizes=tuple(sizes),
        carried_at=tuple(carried_at[g] if g < num_carried else step for g in sorted(plan.carry)),
        prompts=prompts,
        dropped=tuple(dropped),
    )


def probe_and_complete(
    rule: ProbeRule, sample: Callable[[list[int], int], torch.Tensor], indices: list[int], processes: int = 1
) -> tuple[GroupClassification, GroupClassification, np.ndarray]:
    """
    A probed round, as the trainer generates it: the probe, the rule's choice (padded so the completion call splits
    evenly over the processes), the rest of the chosen groups. Returns the groups as generated (`(n, G)`, NaN where a
    dropped group's rest was never generated), the probe's classification and which groups were completed.
    """
    G, k = rule.num_generations, rule.probe
    probe_values = sample(indices, k)  # (n, k)
    probed = classify_groups(probe_values.flatten(), k, correct_value=1.0)
    completed = pad_completions(rule.complete(indices, probed), processes // math.gcd(G - k, processes))
    values = torch.full((len(indices), G), math.nan, dtype=probe_values.dtype)
    values[:, :k] = probe_values
    chosen = torch.from_numpy(completed)
    values[chosen, k:] = sample([i for i, c in zip(indices, completed, strict=True) if c], G - k).to(values.dtype)
    return classify_groups(values.flatten(), G, correct_value=1.0), probed, completed


@dataclass(frozen=True)
class RunResult:
    generated: float  # prompt groups generated (a probe of k counts k / G of a group)
    trained: int
    floor_generated: float  # sum over steps of trained / p(step): what a perfect sampler would generate
    rounds: list[int]
    underfilled: int
    stale: int
    steps: int
    # Pre-rollout skipping (zero without a skip policy)
    epochs: float = 0.0  # passes over the dataset made by the prompt stream
    skipped: int = 0  # prompts passed over before generation
    missed: float = 0.0  # expected informative groups among the skipped prompts (from their true pass rates)
    redrawn: int = 0  # prompts generated after having been skipped
    redrawn_informative: int = 0  # ... whose group was informative (the predictor's misses)
    # The same totals over the steps that start after the stream's first epoch (when a history exists)
    later_generated: float = 0
    later_trained: int = 0
    later_floor_generated: float = 0.0
    prompts: int = 0  # prompts generated (probed or whole)
    discarded: int = 0  # informative groups generated and never trained
    dropped: float = 0.0  # expected informative groups among the groups dropped after their probe
    completed: int = 0  # probed groups completed
    probed: int = 0  # prompts probed

    @property
    def gen_per_trained(self) -> float:
        return self.generated / self.trained if self.trained else math.inf

    @property
    def floor(self) -> float:
        return self.floor_generated / self.trained if self.trained else math.inf

    @property
    def floor_ratio(self) -> float:
        return self.gen_per_trained / self.floor

    @property
    def later_floor_ratio(self) -> float:
        if not self.later_trained:
            return math.nan
        return self.later_generated / self.later_floor_generated

    @property
    def mean_rounds(self) -> float:
        return statistics.fmean(self.rounds)

    @property
    def missed_share(self) -> float:
        """Informative groups lost to skipping, per trained group."""
        return self.missed / self.trained if self.trained else math.nan

    @property
    def lost_share(self) -> float:
        """Informative groups lost to skipping and to dropped probes, per trained group."""
        return (self.missed + self.dropped) / self.trained if self.trained else math.nan

    @property
    def discarded_per_100(self) -> float:
        """Informative groups discarded (generated, never trained) per 100 groups generated."""
        return 100 * self.discarded / self.generated if self.generated else math.nan

    @property
    def miss_rate(self) -> float:
        return self.redrawn_informative / self.redrawn if self.redrawn else math.nan


def sample_population(population: Population, *, num_prompts: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Pass rate of every simulated prompt at the start of training, `(num_prompts,)` float64, and the index of the
    mixture component each was drawn from, `(num_prompts,)` int64 (all 0 for a population of one component).
    """
    components = population.components or ((1.0, population.a, population.b),)
    # Beta's sampler draws through torch's global generator: fork it so the population only depends on `seed`.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draws = [
            torch.distributions.Beta(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64))
            .sample((num_prompts,))
            .clamp(1e-12, 1 - 1e-12)
            for _, a, b in components
        ]
        if len(draws) == 1:
            return draws[0], torch.zeros(num_prompts, dtype=torch.int64)
        weights = torch.tensor([w for w, _, _ in components], dtype=torch.float64)
        kind = torch.multinomial(weights, num_prompts, replacement=True)
        return torch.stack(draws, dim=1).gather(1, kind[:, None]).squeeze(1), kind


def sample_pass_rates(population: Population, *, num_prompts: int, seed: int) -> torch.Tensor:
    """Pass rate of every simulated prompt at the start of training, `(num_prompts,)` float64."""
    return sample_population(population, num_prompts=num_prompts, seed=seed)[0]


def sample_learnability(num_prompts: int, *, seed: int) -> torch.Tensor:
    """Per-prompt learning speed `k ~ Exponential(1)` (mean 1): most prompts move a little, a few a lot."""
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    return -torch.log1p(-torch.rand(num_prompts, generator=gen, dtype=torch.float64))


class MeasuredSkipPolicy(SkipPolicy):
    """[`SkipPolicy`] that also remembers which prompts it skipped, to add up how informative they would have been."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.skipped_now: list[int] = []

    def should_skip(self, index: int) -> bool:
        skip = super().should_skip(index)
        if skip:
            self.skipped_now.append(index)
        return skip


class OracleSkipPolicy(MeasuredSkipPolicy):
    """
    A reference, not a rule: passes over every prompt already generated once whose true chance of an informative group
    (from its current pass rate, `informative`, set by [`simulate`] every step) is below `oracle_threshold`, and never
    over a prompt not yet generated. No estimate, no exploration: what it reaches is about the least generation any
    rule that must see a prompt before judging it can reach on the same stream.
    """

    def __init__(self, *args, oracle_threshold: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.oracle_threshold = oracle_threshold
        self.informative: torch.Tensor | None = None  # (num_prompts,) float64
        self.oracle_skipped = 0

    def should_skip(self, index: int) -> bool:
        if int(self.history.last_outcome[index]) == UNSEEN:
            return False
        skip = bool(self.informative[index] < self.oracle_threshold)
        if skip:
            self.skipped_now.append(index)
            self.oracle_skipped += 1
        return skip

    def run_totals(self) -> dict[str, int]:
        return {**super().run_totals(), "skipped": self.oracle_skipped}


def simulate(
    population: Population,
    strategy: Strategy,
    *,
    target: int,
    steps: int,
    num_generations: int,
    max_rounds: int,
    num_prompts: int,
    drift: float = 0.0,
    learnability: bool = False,
    processes: int = 1,
    seed: int = 0,
    planner_kwargs: dict | None = None,
    skip_kwargs: dict | None = None,
    oracle_threshold: float | None = None,
    probe: int = 0,
    carry: Carry = ONE_BATCH,
    rule_kwargs: dict | None = None,
    observe: Callable[[SkipPolicy, list[int], GroupClassification], None] | None = None,
) -> RunResult:
    """
    Run `steps` generation batches of one strategy on one population.

    `drift` raises every prompt's pass-rate logit linearly over the run, by `drift` times the prompt's learnability
    (1 for every prompt, or `Exponential(1)` per prompt with `learnability=True`). `skip_kwargs` (a dict, possibly
    empty) turns on pre-rollout skipping with a [`SkipPolicy`] built from it, or with `oracle_threshold` an
    [`OracleSkipPolicy`] (the same keywords, its own decisions). `probe = k > 0` probes `k` completions of each prompt
    before completing its group ([`ProbeRule`], built with `rule_kwargs`). `carry` bounds how long carried groups wait
    (one policy update per step). Every run also has the trainer's [`NoInformativeWatch`] (it never acts on these
    populations). `observe` is handed to [`sample_generation_batch`].
    """
    G = num_generations
    population_gen = torch.Generator().manual_seed(seed)
    pass_rates = sample_pass_rates(population, num_prompts=num_prompts, seed=seed)
    base_logits = torch.logit(pass_rates)
    speed = sample_learnability(num_prompts, seed=seed) if learnability else None
    granularity = probe_granularity(processes, G, probe)  # as DAPOTrainer sizes rounds for multi-process runs
    planner = RoundPlanner(target, strategy=strategy.round_sizing, granularity=granularity, **(planner_kwargs or {}))
    rule = ProbeRule(G, probe, num_prompts=num_prompts, seed=seed, **(rule_kwargs or {})) if probe else None
    watch = NoInformativeWatch()
    stream = PromptStream(num_prompts, seed=seed)
    policy = None
    if skip_kwargs is not None and oracle_threshold is not None:
        policy = OracleSkipPolicy(num_prompts, seed=seed, oracle_threshold=oracle_threshold, **skip_kwargs)
    elif skip_kwargs is not None:
        policy = MeasuredSkipPolicy(num_prompts, seed=seed, **skip_kwargs)
    rates = pass_rates

    def sample(indices: list[int], completions: int) -> torch.Tensor:
        q = rates[torch.tensor(indices, dtype=torch.long)]  # (n,)
        correct = torch.rand((len(indices), completions), generator=population_gen, dtype=torch.float64) < q[:, None]
        return torch.where(correct, 1.0, -1.0).double()  # (n, completions)

    def score(indices: list[int]) -> GroupClassification:
        return classify_groups(sample(indices, G).flatten(), G, correct_value=1.0)

    carried = trained = underfilled = stale = discarded = completed = probed = prompts = 0
    generated = dropped = 0.0
    carried_at: tuple[int, ...] = ()
    later = [0, 0, 0.0]  # generated, trained, floor after the first epoch
    floor_generated = missed = 0.0
    rounds: list[int] = []
    for step in range(steps):
        if drift:
            rates = drifted(base_logits, drift, step / max(steps - 1, 1), speed)
        informative_now = informative_prob(rates, G)  # (num_prompts,)
        p_now = informative_now.mean().item()
        if isinstance(policy, OracleSkipPolicy):
            policy.informative = informative_now
        after_first_epoch = stream.epoch >= 1
        out = sample_generation_batch(
            planner,
            stream,
            score,
            target=target,
            num_carried=carried,
            max_rounds=max_rounds,
            carry_over=strategy.carry_over,
            policy=policy,
            step=step,
            carried_at=carried_at,
            carry=carry,
            watch=watch,
            probe=rule,
            sample=sample,
            processes=processes,
            observe=observe,
        )
        carried, carried_at = out.carried_out, out.carried_at
        discarded += out.discarded
        prompts += out.prompts
        probed += out.prompts if rule is not None else 0
        completed += out.prompts - len(out.dropped) if rule is not None else 0
        if out.dropped:
            # Expected informative groups the dropped groups' rest would have made (the probe agreed throughout).
            index = torch.tensor([i for i, _ in out.dropped], dtype=torch.long)
            solved = torch.tensor([c for _, c in out.dropped], dtype=torch.bool)
            rest = rates[index].pow(G - probe)
            rest_wrong = (1 - rates[index]).pow(G - probe)
            dropped += (1 - torch.where(solved, rest, rest_wrong)).sum().item()
        generated += out.generated
        trained += out.trained
        floor_generated += out.trained / p_now
        underfilled += out.missing > 0
        stale += out.carried_in
        rounds.append(out.rounds)
        if policy is not None and policy.skipped_now:
            # Expected informative groups the skipped prompts would have given (pass rates are fixed within a step).
            missed += informative_prob(rates[torch.tensor(policy.skipped_now)], G).sum().item()
            policy.skipped_now.clear()
        if after_first_epoch:
            later[0] += out.generated
            later[1] += out.trained
            later[2] += out.trained / p_now
    totals = dict.fromkeys(("skipped", "redrawn", "missed"), 0)
    if policy is not None:
        totals = policy.run_totals()
    return RunResult(
        generated=generated,
        trained=trained,
        floor_generated=floor_generated,
        rounds=rounds,
        underfilled=underfilled,
        stale=stale,
        steps=steps,
        epochs=stream.epoch + stream.cursor / num_prompts,
        skipped=totals["skipped"],
        missed=missed,
        redrawn=totals["redrawn"],
        redrawn_informative=totals["missed"],
        later_generated=later[0],
        later_trained=later[1],
        later_floor_generated=later[2],
        prompts=prompts,
        discarded=discarded,
        dropped=dropped,
        completed=completed,
        probed=probed,
    )


def population_rate(
    population: Population,
    *,
    num_generations: int,
    num_prompts: int,
    seed: int,
    drift: float = 0.0,
    learnability: bool = False,
    progress: float = 1.0,
):
    """Informative rate of the simulated population (finite sample) at the start of training and at `progress`."""
    pass_rates = sample_pass_rates(population, num_prompts=num_prompts, seed=seed)
    speed = sample_learnability(num_prompts, seed=seed) if learnability else None
    start = informative_prob(pass_rates, num_generations).mean().item()
    end = informative_prob(drifted(torch.logit(pass_rates), drift, progress, speed), num_generations).mean().item()
    return start, end


def format_populations(args: argparse.Namespace) -> str:
    lines = [
        "| population | pass rate | p (exact, Beta) | p (simulated prompts, start) | p (end) | 1/p (start) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for pop in POPULATIONS:
        exact = beta_informative_rate(pop.a, pop.b, args.num_generations)
        start, end = population_rate(
            pop, num_generations=args.num_generations, num_prompts=args.num_prompts, seed=args.seed, drift=args.drift
        )
        lines.append(
            f"| {pop.name} | Beta({pop.a:g}, {pop.b:g}) | {exact:.3f} | {start:.3f} | {end:.3f} | {1 / start:.2f} |"
        )
    return "\n".join(lines)


def format_results(results: dict[tuple[str, str], RunResult], p_start: dict[str, float]) -> str:
    lines = [
        "| population | p (start) | strategy | gen/trained | x floor (1/p) | rounds/step | max rounds | underfilled "
        "| stale |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for pop in POPULATIONS:
        for strat in STRATEGIES:
            r = results[pop.name, strat.name]
            lines.append(
                f"| {pop.name} | {p_start[pop.name]:.3f} | {strat.name} | {r.gen_per_trained:.3f} | "
                f"{r.floor_ratio:.3f} | {r.mean_rounds:.2f} | {max(r.rounds)} | {r.underfilled / r.steps:.1%} | "
                f"{r.stale / r.trained:.1%} |"
            )
    return "\n".join(lines)


def format_targets(results: dict[tuple[str, str], RunResult]) -> str:
    lines = [
        f"Targets for adaptive+carry: x floor <= {TARGET_FLOOR_RATIO}, rounds/step <= {TARGET_ROUNDS}",
        "",
        "| population | x floor | rounds/step | meets targets |",
        "|---|---:|---:|---|",
    ]
    for pop in POPULATIONS:
        r = results[pop.name, "adaptive+carry"]
        ok = r.floor_ratio <= TARGET_FLOOR_RATIO and r.mean_rounds <= TARGET_ROUNDS
        lines.append(f"| {pop.name} | {r.floor_ratio:.3f} | {r.mean_rounds:.2f} | {'yes' if ok else 'NO'} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class SkipVariant:
    name: str
    carry_over: bool
    skip: bool
    rule: str = "streak"
    probe: bool = False  # probe `default_probe(G)` completions before completing a group


SKIP_VARIANTS: tuple[SkipVariant, ...] = (
    SkipVariant("adaptive", False, False),  # DAPOConfig's defaults
    SkipVariant("adaptive+skip", False, True),  # dynamic_sampling_skip=True before probing and carry-over by default
    SkipVariant("adaptive+carry", True, False),
    SkipVariant("adaptive+carry+probe", True, False, probe=True),
    SkipVariant("adaptive+carry+skip", True, True),
    SkipVariant("adaptive+carry+skip+probe", True, True, probe=True),  # dynamic_sampling_skip=True's defaults
    SkipVariant("adaptive+carry+posterior", True, True, "posterior"),
    SkipVariant("adaptive+carry+posterior+probe", True, True, "posterior", probe=True),
    SkipVariant("adaptive+carry+oracle", True, True, "oracle"),  # a reference: OracleSkipPolicy
)
DEFAULT_SKIP_VARIANT = "adaptive+carry+skip+probe"


def oracle_threshold(num_generations: int) -> float:
    """The oracle's skip threshold: `ORACLE_THRESHOLD` of the highest informative chance, `1 - 2^(1 - G)`."""
    return ORACLE_THRESHOLD * (1.0 - 2.0 ** (1 - num_generations))


def skip_run_steps(population: Population, args: argparse.Namespace) -> int:
    """Steps in which a sampler without skipping passes `args.epochs` times over the dataset (on average)."""
    progress = [i / 20 for i in range(21)]
    rates = [
        population_rate(
            population,
            num_generations=args.num_generations,
            num_prompts=args.num_prompts,
            seed=args.seed,
            drift=args.skip_drift,
            learnability=True,
            progress=t,
        )[1]
        for t in progress
    ]
    return max(1, math.ceil(args.epochs * args.num_prompts * statistics.fmean(rates) / args.target))


def format_skip_results(
    results: dict[tuple[str, str], RunResult],
    rates: dict[str, tuple[float, float]],
    populations: Sequence[Population] = POPULATIONS,
) -> str:
    lines = [
        "| population | p (start -> end) | variant | steps | epochs | gen/trained | x floor (1/p) | x oracle "
        "| x floor after epoch 1 | rounds/step | max rounds | underfilled | discarded / 100 generated "
        "| skipped / drawn | probes completed | lost / trained | miss rate |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for pop in populations:
        start, end = rates[pop.name]
        oracle = results.get((pop.name, "adaptive+carry+oracle"))
        for variant in SKIP_VARIANTS:
            r = results[pop.name, variant.name]
            draws = r.skipped + r.prompts
            versus = f"{r.floor_ratio / oracle.floor_ratio:.2f}" if oracle is not None else "-"
            completed = f"{r.completed / r.probed:.0%}" if r.probed else "-"
            lines.append(
                f"| {pop.name} | {start:.3f} -> {end:.3f} | {variant.name} | {r.steps} | {r.epochs:.2f} "
                f"| {r.gen_per_trained:.3f} | {r.floor_ratio:.3f} | {versus} | {r.later_floor_ratio:.3f} "
                f"| {r.mean_rounds:.2f} | {max(r.rounds)} | {r.underfilled / r.steps:.1%} | {r.discarded_per_100:.1f} "
                f"| {r.skipped / draws:.1%} | {completed} | {r.lost_share:.2f} | {_percent(r.miss_rate)} |"
            )
    return "\n".join(lines)


def _percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1%}"


def format_skip_targets(
    results: dict[tuple[str, str], RunResult], held_out: dict[tuple[str, str], RunResult] | None = None
) -> str:
    lines = [
        f"Targets of dynamic_sampling_skip=True with its defaults ({DEFAULT_SKIP_VARIANT}): x floor within "
        f"{TARGET_ORACLE_RATIO}x of the seen-once oracle on every population, at most {TARGET_HELD_OUT_RATIO} on the "
        f"held-out task, rounds/step <= {TARGET_ROUNDS}",
        "",
        "| population | x floor | oracle | x oracle | rounds/step | lost / trained | meets targets |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    rows = [(results, pop.name, False) for pop in POPULATIONS if (pop.name, DEFAULT_SKIP_VARIANT) in results]
    if held_out:
        rows.append((held_out, HELD_OUT.name, True))
    for table, name, is_held_out in rows:
        r, oracle = table[name, DEFAULT_SKIP_VARIANT], table[name, "adaptive+carry+oracle"]
        ratio = r.floor_ratio / oracle.floor_ratio
        ok = ratio <= TARGET_ORACLE_RATIO and r.mean_rounds <= TARGET_ROUNDS
        if is_held_out:
            ok = ok and r.floor_ratio <= TARGET_HELD_OUT_RATIO
        lines.append(
            f"| {name} | {r.floor_ratio:.3f} | {oracle.floor_ratio:.3f} | {ratio:.2f} | {r.mean_rounds:.2f} "
            f"| {r.lost_share:.2f} | {'yes' if ok else 'NO'} |"
        )
    return "\n".join(lines)


def run_skip_variants(
    populations: Sequence[Population], args: argparse.Namespace, planner_kwargs: dict, *, drift: float
) -> tuple[dict[tuple[str, str], RunResult], dict[str, tuple[float, float]]]:
    """Every variant of [`SKIP_VARIANTS`] on each population, for the steps of `args.epochs` passes."""
    overrides = (
        ("target", args.skip_target),
        ("max_skip", args.max_skip),
        ("half_life", args.skip_half_life),
        ("draws", args.skip_draws),
    )
    skip_kwargs = {k: v for k, v in overrides if v is not None}
    G = args.num_generations
    probe = default_probe(G) if args.probe is None else args.probe
    results: dict[tuple[str, str], RunResult] = {}
    rates: dict[str, tuple[float, float]] = {}
    for pop in populations:
        rates[pop.name] = population_rate(
            pop, num_generations=G, num_prompts=args.num_prompts, seed=args.seed, drift=drift, learnability=True
        )
        steps = skip_run_steps(pop, argparse.Namespace(**{**vars(args), "skip_drift": drift}))
        for variant in SKIP_VARIANTS:
            oracle = variant.rule == "oracle"  # OracleSkipPolicy on a posterior-rule base (its decisions are its own)
            rule = "posterior" if oracle else variant.rule
            results[pop.name, variant.name] = simulate(
                pop,
                Strategy(variant.name, "adaptive", variant.carry_over),
                target=args.target,
                steps=steps,
                num_generations=G,
                max_rounds=args.max_rounds,
                num_prompts=args.num_prompts,
                drift=drift,
                learnability=True,
                processes=args.processes,
                seed=args.seed,
                planner_kwargs=planner_kwargs,
                skip_kwargs={**skip_kwargs, "rule": rule, "num_generations": G} if variant.skip else None,
                oracle_threshold=oracle_threshold(G) if oracle else None,
                probe=probe if variant.probe else 0,
                carry=Carry(max_staleness=args.carry_max_staleness),
            )
    return results, rates


def run_skip_section(args: argparse.Namespace, planner_kwargs: dict) -> dict[tuple[str, str], RunResult]:
    print(
        f"Pre-rollout skipping and probing: {args.epochs:g} epochs of a sampler without skipping, "
        f"drift={args.skip_drift:g} (logit gain over the run, times each prompt's Exponential(1) learnability), "
        f"G={args.num_generations}, probe={default_probe(args.num_generations) if args.probe is None else args.probe}, "
        f"carried groups wait up to {args.carry_max_staleness:g} steps\n"
    )
    results, rates = run_skip_variants(POPULATIONS, args, planner_kwargs, drift=args.skip_drift)
    print(format_skip_results(results, rates) + "\n")
    print(format_skip_targets(results) + "\n")
    return results


def run_held_out_section(args: argparse.Namespace, planner_kwargs: dict) -> dict[tuple[str, str], RunResult]:
    held = argparse.Namespace(
        **{
            **vars(args),
            "epochs": args.held_out_epochs,
            "num_generations": args.held_out_num_generations,
            "seed": args.held_out_seed,
        }
    )
    exact = population_informative_rate(HELD_OUT, held.num_generations)
    print(
        f"Held-out task: {HELD_OUT.describe}, G={held.num_generations} (p = {exact:.3f}), {held.epochs:g} passes, "
        f"pass rates fixed, seed {held.seed}, probe="
        f"{default_probe(held.num_generations) if args.probe is None else args.probe}\n"
    )
    results, rates = run_skip_variants([HELD_OUT], held, planner_kwargs, drift=0.0)
    print(format_skip_results(results, rates, [HELD_OUT]) + "\n")
    return results


def run_rounds_section(args: argparse.Namespace, planner_kwargs: dict) -> dict[tuple[str, str], RunResult]:
    print(
        f"Dynamic sampling: target={args.target} groups/batch, G={args.num_generations}, steps={args.steps}, "
        f"max_rounds={args.max_rounds}, prompts={args.num_prompts}, drift={args.drift:g}, processes={args.processes}, "
        f"seed={args.seed}, planner overrides={planner_kwargs or 'none'}\n"
    )
    print(format_populations(args) + "\n")
    results: dict[tuple[str, str], RunResult] = {}
    p_start: dict[str, float] = {}
    for pop in POPULATIONS:
        p_start[pop.name] = population_rate(
            pop, num_generations=args.num_generations, num_prompts=args.num_prompts, seed=args.seed
        )[0]
        for strat in STRATEGIES:
            results[pop.name, strat.name] = simulate(
                pop,
                strat,
                target=args.target,
                steps=args.steps,
                num_generations=args.num_generations,
                max_rounds=args.max_rounds,
                num_prompts=args.num_prompts,
                drift=args.drift,
                processes=args.processes,
                seed=args.seed,
                planner_kwargs=planner_kwargs,
            )
    print(format_results(results, p_start) + "\n")
    print(format_targets(results) + "\n")
    return results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="Few steps, small batches: about half a minute.")
    parser.add_argument(
        "--section",
        choices=("all", "rounds", "skip", "heldout"),
        default="all",
        help="'rounds': round-sizing strategies on static populations; 'skip': pre-rollout skipping and probing over "
        "epochs; 'heldout': the same on the held-out task of persistent easy, hard and mixed prompts.",
    )
    parser.add_argument("--target", type=int, default=32, help="Informative groups per generation batch.")
    parser.add_argument("--steps", type=int, default=300, help="Generation batches (optimizer batches) simulated.")
    parser.add_argument("--num-generations", type=int, default=16, help="Group size G.")
    parser.add_argument("--max-rounds", type=int, default=10, help="dynamic_sampling_max_rounds.")
    parser.add_argument("--num-prompts", type=int, default=16384, help="Training prompts in the simulated dataset.")
    parser.add_argument("--drift", type=float, default=0.0, help="Logit gain of every pass rate over the run.")
    parser.add_argument("--processes", type=int, default=1, help="Processes (sets the round-size granularity).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the simulation.")
    parser.add_argument("--z", type=float, default=None, help="RoundPlanner z (adaptive margin); default: its own.")
    parser.add_argument("--decay", type=float, default=None, help="RoundPlanner decay; default: its own.")
    parser.add_argument(
        "--max-round-prompts",
        type=int,
        default=None,
        help="RoundPlanner max_round_prompts; default: its own (4x target).",
    )
    skipping = parser.add_argument_group("pre-rollout skipping (--section skip)")
    skipping.add_argument(
        "--epochs",
        type=float,
        default=3.0,
        help="Run length, in passes over the dataset of a sampler without skipping.",
    )
    skipping.add_argument(
        "--skip-drift",
        type=float,
        default=2.0,
        help="Logit gain over the run of a prompt of average learnability (learnability ~ Exponential(1) per prompt).",
    )
    skipping.add_argument("--skip-target", type=float, default=None, help="SkipPolicy target; default: its own.")
    skipping.add_argument("--max-skip", type=float, default=None, help="SkipPolicy max_skip; default: its own.")
    skipping.add_argument(
        "--skip-half-life", type=float, default=None, help="SkipPolicy half_life (posterior rule); default: its own."
    )
    skipping.add_argument(
        "--skip-draws", type=int, default=None, help="SkipPolicy draws (posterior rule); default: its own."
    )
    skipping.add_argument(
        "--probe", type=int, default=None, help="Probe size of the +probe rows; default: default_probe(G)."
    )
    skipping.add_argument(
        "--carry-max-staleness",
        type=float,
        default=2.0,
        help="Steps a carried group may wait before it is trained or dropped (1: carry-over before waiting groups).",
    )
    held_out = parser.add_argument_group("held-out task (--section heldout)")
    held_out.add_argument("--held-out-epochs", type=float, default=5.0, help="Passes over the held-out task.")
    held_out.add_argument("--held-out-num-generations", type=int, default=4, help="Group size G of the held-out task.")
    held_out.add_argument("--held-out-seed", type=int, default=1, help="Seed of the held-out task.")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = min(args.steps, 60)
        args.num_prompts = min(args.num_prompts, 4096)
        args.epochs = min(args.epochs, 3.0)
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, dict[tuple[str, str], RunResult]]:
    """
    Runs the chosen sections; returns their results by section (`"rounds"`, `"skip"`, `"heldout"`), population and
    strategy.
    """
    args = parse_args(argv)
    torch.set_num_threads(1)
    overrides = (("z", args.z), ("decay", args.decay), ("max_round_prompts", args.max_round_prompts))
    planner_kwargs = {k: v for k, v in overrides if v is not None}
    start_time = time.perf_counter()
    results: dict[str, dict[tuple[str, str], RunResult]] = {}
    if args.section in ("all", "rounds"):
        results["rounds"] = run_rounds_section(args, planner_kwargs)
    if args.section in ("all", "skip"):
        results["skip"] = run_skip_section(args, planner_kwargs)
    if args.section in ("all", "heldout"):
        results["heldout"] = run_held_out_section(args, planner_kwargs)
        print(format_skip_targets(results.get("skip", {}), results["heldout"]) + "\n")
    print(f"({time.perf_counter() - start_time:.1f} s)")
    return results


if __name__ == "__main__":
    main()
