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

Pre-rollout skipping (`--section skip`): the same loop with a [`SkipPolicy`] passing over prompts whose recent groups
were all zero-variance, over several epochs of a dataset whose prompts change as training improves: every prompt's
pass-rate logit rises linearly over the run by `--skip-drift` times its learnability `k ~ Exponential(1)` (most
prompts move a little, a few a lot), so some unsolved prompts become solvable and solved ones stay solved. The run
lasts `--epochs` passes over the dataset of a sampler without skipping (the same number of steps for every variant;
with skipping the stream passes faster). Variants: adaptive sizing with carry-over off and on, each without and with
skipping (streak and posterior rules), and `adaptive+carry+oracle`, a reference that skips seen prompts on their true
pass rates ([`OracleSkipPolicy`]). Extra columns: `epochs` (passes the stream made), `x floor after epoch 1` (steps once
a history exists), `skipped / drawn` (prompts passed over, per prompt the stream drew), `missed / trained` (groups the
skipped prompts would have made informative, from their true pass rates, per trained group) and `miss rate` (share of
the prompts generated after being skipped that were informative, the policy's own measure).

Launch:
```
python benchmarks/dynamic_sampling.py                 # both sections: target 32 groups, 300 steps / 3 epochs
python benchmarks/dynamic_sampling.py --section rounds --target 512    # the paper's 512 prompts per batch
python benchmarks/dynamic_sampling.py --section rounds --drift 2       # pass rates improve over training
python benchmarks/dynamic_sampling.py --section rounds --max-round-prompts 256   # round cap at 8x the target
python benchmarks/dynamic_sampling.py --section skip --epochs 5        # skipping over 5 epochs
python benchmarks/dynamic_sampling.py --quick         # a few seconds
```
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dapo_trl.trainer.prompt_history import UNSEEN, SkipPolicy
from dapo_trl.trainer.sampling import GroupClassification, PromptStream, RoundPlanner, classify_groups, plan_selection

# Adaptive+carry targets this benchmark reports against.
TARGET_FLOOR_RATIO = 1.05
TARGET_ROUNDS = 1.3
# Pre-rollout skipping targets, over several epochs.
TARGET_SKIP_FLOOR_RATIO = 0.6  # the streak rule (`+skip` rows)
TARGET_POSTERIOR_FLOOR_RATIO = 0.45  # the posterior rule (`+posterior` rows)
# The `+oracle` reference row skips a prompt already generated when its true informative chance is below this.
ORACLE_THRESHOLD = 0.9
SKIP_TARGET_POPULATIONS = ("mostly unsolved", "polarised")


@dataclass(frozen=True)
class Population:
    """Prompts whose pass rates follow `Beta(a, b)`."""

    name: str
    a: float
    b: float


POPULATIONS: tuple[Population, ...] = (
    Population("mostly unsolved", 0.05, 0.2),
    Population("polarised", 0.15, 0.15),
    Population("mostly solved", 2.0, 0.3),
    Population("U-shaped", 0.5, 0.5),
    Population("uniform", 1.0, 1.0),
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
    generated: int  # prompt groups generated this batch
    fresh: int  # informative groups among them
    trained: int
    carried_in: int  # trained groups that came from the previous batch
    carried_out: int
    discarded: int
    missing: int
    round_sizes: tuple[int, ...]


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
) -> BatchOutcome:
    """
    One generation batch, decided exactly as `DAPOTrainer._dynamic_sampling_batch` decides it.

    The same statements in the same order (carried groups count first, rounds until enough informative groups or
    `max_rounds`, round sizes rounded down to the planner's granularity, the planner updated after every round, then
    [`plan_selection`]); only generation and scoring are replaced by `score(prompt_indices)`, which returns the
    informative verdicts `(n,)` or, when a skip `policy` is given, the round's [`GroupClassification`].
    `tests/test_benchmarks.py` runs the real trainer with the same verdicts and checks the two agree step by step.

    With a `policy` ([`SkipPolicy`]), the stream passes over a prompt when `skip` (the trainer's `skip_prompt`) or
    the policy says so, the user's rule first, and the policy learns from every scored round at training step `step`.
    """
    if policy is not None:
        user_skip = skip
        skip = policy.should_skip if user_skip is None else (lambda i: user_skip(i) or policy.should_skip(i))
    needed = max(target - num_carried, 0)
    num_fresh = rounds = generated = 0
    sizes: list[int] = []
    while num_fresh < needed and rounds < max_rounds:
        size = planner.next_round_size(needed - num_fresh)
        indices = stream.take(size, skip=skip)
        indices = indices[: len(indices) - len(indices) % planner.granularity]
        if not indices:
            break
        rounds += 1
        sizes.append(len(indices))
        scored = score(indices)
        informative = scored.informative if isinstance(scored, GroupClassification) else scored  # (n,)
        if policy is not None:
            if not isinstance(scored, GroupClassification):
                raise TypeError("With a skip policy, score must return the round's GroupClassification.")
            policy.record(indices, scored, step=step)
        planner.update(len(indices), int(informative.sum()))
        generated += len(indices)
        num_fresh += int(informative.sum())
    plan, missing = plan_selection(num_carried=num_carried, num_fresh=num_fresh, target=target, carry_over=carry_over)
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
    )


@dataclass(frozen=True)
class RunResult:
    generated: int
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
    later_generated: int = 0
    later_trained: int = 0
    later_floor_generated: float = 0.0

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
    def miss_rate(self) -> float:
        return self.redrawn_informative / self.redrawn if self.redrawn else math.nan


def sample_pass_rates(population: Population, *, num_prompts: int, seed: int) -> torch.Tensor:
    """Pass rate of every simulated prompt at the start of training, `(num_prompts,)` float64."""
    base = torch.distributions.Beta(
        torch.tensor(population.a, dtype=torch.float64), torch.tensor(population.b, dtype=torch.float64)
    )
    # Beta's sampler draws through torch's global generator: fork it so the population only depends on `seed`.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return base.sample((num_prompts,)).clamp(1e-12, 1 - 1e-12)


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
) -> RunResult:
    """
    Run `steps` generation batches of one strategy on one population.

    `drift` raises every prompt's pass-rate logit linearly over the run, by `drift` times the prompt's learnability
    (1 for every prompt, or `Exponential(1)` per prompt with `learnability=True`). `skip_kwargs` (a dict, possibly
    empty) turns on pre-rollout skipping with a [`SkipPolicy`] built from it, or with `oracle_threshold` an
    [`OracleSkipPolicy`] (the same keywords, its own decisions).
    """
    G = num_generations
    population_gen = torch.Generator().manual_seed(seed)
    pass_rates = sample_pass_rates(population, num_prompts=num_prompts, seed=seed)
    base_logits = torch.logit(pass_rates)
    speed = sample_learnability(num_prompts, seed=seed) if learnability else None
    granularity = processes // math.gcd(G, processes)  # as DAPOTrainer sizes rounds for multi-process runs
    planner = RoundPlanner(target, strategy=strategy.round_sizing, granularity=granularity, **(planner_kwargs or {}))
    stream = PromptStream(num_prompts, seed=seed)
    policy = None
    if skip_kwargs is not None and oracle_threshold is not None:
        policy = OracleSkipPolicy(num_prompts, seed=seed, oracle_threshold=oracle_threshold, **skip_kwargs)
    elif skip_kwargs is not None:
        policy = MeasuredSkipPolicy(num_prompts, seed=seed, **skip_kwargs)
    rates = pass_rates

    def score(indices: list[int]) -> GroupClassification:
        q = rates[torch.tensor(indices)]  # (n,)
        correct = torch.rand((len(indices), G), generator=population_gen, dtype=torch.float64) < q[:, None]  # (n, G)
        rewards = torch.where(correct, 1.0, -1.0).flatten()  # (n G,)
        return classify_groups(rewards, G, correct_value=1.0)

    carried = generated = trained = underfilled = stale = 0
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
        )
        carried = out.carried_out
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
    rule: str = "posterior"


SKIP_VARIANTS: tuple[SkipVariant, ...] = (
    SkipVariant("adaptive", False, False),
    SkipVariant("adaptive+skip", False, True, "streak"),
    SkipVariant("adaptive+posterior", False, True),
    SkipVariant("adaptive+carry", True, False),
    SkipVariant("adaptive+carry+skip", True, True, "streak"),
    SkipVariant("adaptive+carry+posterior", True, True),
    SkipVariant("adaptive+carry+oracle", True, True, "oracle"),  # a reference: OracleSkipPolicy
)


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


def format_skip_results(results: dict[tuple[str, str], RunResult], rates: dict[str, tuple[float, float]]) -> str:
    lines = [
        "| population | p (start -> end) | variant | steps | epochs | gen/trained | x floor (1/p) "
        "| x floor after epoch 1 | rounds/step | max rounds | underfilled | skipped / drawn | missed / trained "
        "| miss rate |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for pop in POPULATIONS:
        start, end = rates[pop.name]
        for variant in SKIP_VARIANTS:
            r = results[pop.name, variant.name]
            draws = r.skipped + r.generated
            lines.append(
                f"| {pop.name} | {start:.3f} -> {end:.3f} | {variant.name} | {r.steps} | {r.epochs:.2f} "
                f"| {r.gen_per_trained:.3f} | {r.floor_ratio:.3f} | {r.later_floor_ratio:.3f} | {r.mean_rounds:.2f} "
                f"| {max(r.rounds)} | {r.underfilled / r.steps:.1%} | {r.skipped / draws:.1%} "
                f"| {r.missed_share:.1%} | {_percent(r.miss_rate)} |"
            )
    return "\n".join(lines)


def _percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1%}"


def format_skip_targets(results: dict[tuple[str, str], RunResult]) -> str:
    lines = [
        f"Targets with skipping: x floor <= {TARGET_SKIP_FLOOR_RATIO} (streak rule, +skip) and "
        f"<= {TARGET_POSTERIOR_FLOOR_RATIO} (posterior rule) on {', '.join(SKIP_TARGET_POPULATIONS)}, "
        f"rounds/step <= {TARGET_ROUNDS}, with carry-over on and off",
        "",
        "| population | variant | x floor | saving vs no skip | rounds/step | meets targets |",
        "|---|---|---:|---:|---:|---|",
    ]
    for pop in SKIP_TARGET_POPULATIONS:
        pairs = (
            ("adaptive+skip", "adaptive"),
            ("adaptive+posterior", "adaptive"),
            ("adaptive+carry+skip", "adaptive+carry"),
            ("adaptive+carry+posterior", "adaptive+carry"),
            ("adaptive+carry+oracle", "adaptive+carry"),
        )
        for variant, baseline in pairs:
            r, b = results[pop, variant], results[pop, baseline]
            if variant.endswith("oracle"):  # a reference, held to no target
                verdict = f"reference: true pass rates, threshold {ORACLE_THRESHOLD:g}"
            else:
                goal = TARGET_POSTERIOR_FLOOR_RATIO if variant.endswith("posterior") else TARGET_SKIP_FLOOR_RATIO
                verdict = "yes" if r.floor_ratio <= goal and r.mean_rounds <= TARGET_ROUNDS else "NO"
            lines.append(
                f"| {pop} | {variant} | {r.floor_ratio:.3f} | {r.gen_per_trained / b.gen_per_trained:.2f}x "
                f"| {r.mean_rounds:.2f} | {verdict} |"
            )
    return "\n".join(lines)


def run_skip_section(args: argparse.Namespace, planner_kwargs: dict) -> dict[tuple[str, str], RunResult]:
    overrides = (
        ("target", args.skip_target),
        ("max_skip", args.max_skip),
        ("half_life", args.skip_half_life),
        ("draws", args.skip_draws),
    )
    skip_kwargs = {k: v for k, v in overrides if v is not None}
    print(
        f"Pre-rollout skipping: {args.epochs:g} epochs of a sampler without skipping, drift={args.skip_drift:g} "
        f"(logit gain over the run, times each prompt's Exponential(1) learnability), policy overrides="
        f"{skip_kwargs or 'none'}\n"
    )
    results: dict[tuple[str, str], RunResult] = {}
    rates: dict[str, tuple[float, float]] = {}
    for pop in POPULATIONS:
        rates[pop.name] = population_rate(
            pop,
            num_generations=args.num_generations,
            num_prompts=args.num_prompts,
            seed=args.seed,
            drift=args.skip_drift,
            learnability=True,
        )
        steps = skip_run_steps(pop, args)
        for variant in SKIP_VARIANTS:
            oracle = variant.rule == "oracle"  # OracleSkipPolicy on a posterior-rule base (its decisions are its own)
            rule = "posterior" if oracle else variant.rule
            results[pop.name, variant.name] = simulate(
                pop,
                Strategy(variant.name, "adaptive", variant.carry_over),
                target=args.target,
                steps=steps,
                num_generations=args.num_generations,
                max_rounds=args.max_rounds,
                num_prompts=args.num_prompts,
                drift=args.skip_drift,
                learnability=True,
                processes=args.processes,
                seed=args.seed,
                planner_kwargs=planner_kwargs,
                skip_kwargs={**skip_kwargs, "rule": rule, "num_generations": args.num_generations}
                if variant.skip
                else None,
                oracle_threshold=ORACLE_THRESHOLD if oracle else None,
            )
    print(format_skip_results(results, rates) + "\n")
    print(format_skip_targets(results) + "\n")
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
    parser.add_argument("--quick", action="store_true", help="Few steps, small batches: runs in a few seconds.")
    parser.add_argument(
        "--section",
        choices=("all", "rounds", "skip"),
        default="all",
        help="'rounds': round-sizing strategies on static populations; 'skip': pre-rollout skipping over epochs.",
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
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = min(args.steps, 60)
        args.num_prompts = min(args.num_prompts, 4096)
        args.epochs = min(args.epochs, 3.0)
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, dict[tuple[str, str], RunResult]]:
    """Runs the chosen sections; returns their results by section (`"rounds"`, `"skip"`), population and strategy."""
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
    print(f"({time.perf_counter() - start_time:.1f} s)")
    return results


if __name__ == "__main__":
    main()
