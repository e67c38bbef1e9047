r"""Sample efficiency of dynamic sampling's round sizing (DAPO §3.2), on simulated prompt populations.

Drives the real [`RoundPlanner`], [`plan_selection`], [`PromptStream`] and [`classify_groups`] through a loop that
mirrors `DAPOTrainer._dynamic_sampling_batch` ([`sample_generation_batch`]), with the model replaced by a population
of prompts whose pass rates follow a Beta distribution. A group of `G` completions of a prompt with pass rate `q`
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
before holding `target` groups), `stale` (share of trained groups that were carried, one policy version old).
Exact-deficit refill wastes nothing either, so it sits on the floor too; what it pays is rounds (each one a full,
sequential generation pass) and underfilled batches.

`--drift D` lets the policy improve during training: every prompt's pass-rate logit grows linearly by `D` over the
run, so the informative rate (and the floor, computed step by step) moves.

Launch:
```
python benchmarks/dynamic_sampling.py                 # target 32 groups, 300 steps
python benchmarks/dynamic_sampling.py --target 512    # the paper's 512 prompts per batch
python benchmarks/dynamic_sampling.py --drift 2       # pass rates improve over training
python benchmarks/dynamic_sampling.py --max-round-prompts 256   # round cap at 8x the target (default 4x)
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

from dapo_trl.sampling import PromptStream, RoundPlanner, classify_groups, plan_selection

# Adaptive+carry targets this benchmark reports against.
TARGET_FLOOR_RATIO = 1.05
TARGET_ROUNDS = 1.3


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


def drifted(base_logits: torch.Tensor, drift: float, progress: float) -> torch.Tensor:
    """Pass rates after the policy improved by `drift * progress` in logit."""
    return torch.sigmoid(base_logits + drift * progress)


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
    score: Callable[[list[int]], torch.Tensor],
    *,
    target: int,
    num_carried: int,
    max_rounds: int,
    carry_over: bool,
    skip: Callable[[int], bool] | None = None,
) -> BatchOutcome:
    """
    One generation batch, decided exactly as `DAPOTrainer._dynamic_sampling_batch` decides it.

    The same statements in the same order (carried groups count first, rounds until enough informative groups or
    `max_rounds`, round sizes rounded down to the planner's granularity, the planner updated after every round, then
    [`plan_selection`]); only generation and scoring are replaced by `score(prompt_indices) -> informative (n,)`.
    `tests/test_benchmarks.py` runs the real trainer with the same verdicts and checks the two agree step by step.
    """
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
        informative = score(indices)  # (n,)
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
    def mean_rounds(self) -> float:
        return statistics.fmean(self.rounds)


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
    processes: int = 1,
    seed: int = 0,
    planner_kwargs: dict | None = None,
) -> RunResult:
    """Run `steps` generation batches of one strategy on one population."""
    G = num_generations
    population_gen = torch.Generator().manual_seed(seed)
    base = torch.distributions.Beta(
        torch.tensor(population.a, dtype=torch.float64), torch.tensor(population.b, dtype=torch.float64)
    )
    # Beta's sampler draws through torch's global generator: fork it so the population only depends on `seed`.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pass_rates = base.sample((num_prompts,)).clamp(1e-12, 1 - 1e-12)
    base_logits = torch.logit(pass_rates)
    granularity = processes // math.gcd(G, processes)  # as DAPOTrainer sizes rounds for multi-process runs
    planner = RoundPlanner(target, strategy=strategy.round_sizing, granularity=granularity, **(planner_kwargs or {}))
    stream = PromptStream(num_prompts, seed=seed)
    rates = pass_rates

    def score(indices: list[int]) -> torch.Tensor:
        q = rates[torch.tensor(indices)]  # (n,)
        correct = torch.rand((len(indices), G), generator=population_gen, dtype=torch.float64) < q[:, None]  # (n, G)
        rewards = torch.where(correct, 1.0, -1.0).flatten()  # (n G,)
        return classify_groups(rewards, G, correct_value=1.0).informative

    carried = generated = trained = underfilled = stale = 0
    floor_generated = 0.0
    rounds: list[int] = []
    for step in range(steps):
        if drift:
            rates = drifted(base_logits, drift, step / max(steps - 1, 1))
        p_now = informative_prob(rates, G).mean().item()
        out = sample_generation_batch(
            planner,
            stream,
            score,
            target=target,
            num_carried=carried,
            max_rounds=max_rounds,
            carry_over=strategy.carry_over,
        )
        carried = out.carried_out
        generated += out.generated
        trained += out.trained
        floor_generated += out.trained / p_now
        underfilled += out.missing > 0
        stale += out.carried_in
        rounds.append(out.rounds)
    return RunResult(
        generated=generated,
        trained=trained,
        floor_generated=floor_generated,
        rounds=rounds,
        underfilled=underfilled,
        stale=stale,
        steps=steps,
    )


def population_rate(population: Population, *, num_generations: int, num_prompts: int, seed: int, drift: float = 0.0):
    """Informative rate of the simulated population (finite sample) at the start and end of training."""
    base = torch.distributions.Beta(
        torch.tensor(population.a, dtype=torch.float64), torch.tensor(population.b, dtype=torch.float64)
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pass_rates = base.sample((num_prompts,)).clamp(1e-12, 1 - 1e-12)
    start = informative_prob(pass_rates, num_generations).mean().item()
    end = informative_prob(drifted(torch.logit(pass_rates), drift, 1.0), num_generations).mean().item()
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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="Few steps, small batches: runs in a few seconds.")
    parser.add_argument("--target", type=int, default=32, help="Informative groups per generation batch.")
    parser.add_argument("--steps", type=int, default=300, help="Generation batches (optimizer batches) simulated.")
    parser.add_argument("--num-generations", type=int, default=16, help="Group size G.")
    parser.add_argument("--max-rounds", type=int, default=10, help="dynamic_sampling_max_rounds.")
    parser.add_argument("--num-prompts", type=int, default=16384, help="Training prompts in the simulated dataset.")
    parser.add_argument("--drift", type=float, default=0.0, help="Logit gain of every pass rate over the run.")
    parser.add_argument("--processes", type=int, default=1, help="Processes (sets the round-size granularity).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--z", type=float, default=None, help="RoundPlanner z (adaptive margin); default: its own.")
    parser.add_argument("--decay", type=float, default=None, help="RoundPlanner decay; default: its own.")
    parser.add_argument(
        "--max-round-prompts",
        type=int,
        default=None,
        help="RoundPlanner max_round_prompts; default: its own (4x target).",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = min(args.steps, 60)
        args.num_prompts = min(args.num_prompts, 4096)
    return args


def main(argv: Sequence[str] | None = None) -> dict[tuple[str, str], RunResult]:
    args = parse_args(argv)
    torch.set_num_threads(1)
    overrides = (("z", args.z), ("decay", args.decay), ("max_round_prompts", args.max_round_prompts))
    planner_kwargs = {k: v for k, v in overrides if v is not None}
    start_time = time.perf_counter()
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
    print(f"({time.perf_counter() - start_time:.1f} s)")
    return results


if __name__ == "__main__":
    main()
