r"""Where the groups that `dynamic_sampling_skip=True` generates go, on the held-out task of `dynamic_sampling.py`.

Runs [`dynamic_sampling.simulate`] for the skip variants (the defaults, `adaptive+carry+skip+probe`, and the seen-once
oracle) and follows every generated group, so that groups generated per trained group split into:

- `trained`: the informative groups trained (1 per trained group, by definition);
- `surplus`: informative groups generated and never trained (carried groups that expired, or still carried at the
  end of the run);
- `first pass`: zero-variance groups of prompts generated for the first time (a group dropped after its probe counts
  `k / G`), the cost no rule that must see a prompt before judging it can avoid, only a probe can shrink;
- `re-tests, uniform` / `re-tests, mixed`: zero-variance groups of prompts generated again, split by the component
  of the mixture the prompt was drawn from: the first (easy) and second (hard) ones, whose prompts are almost never
  informative, or the others (mixed prompts that came out uniform this time);
- of those, `dropped probes`: what the probes of groups not completed cost;
- `lost / trained` (not a cost): informative groups that skipped prompts and dropped probes would have given.

Groups generated per trained group over the floor `1 / p` is `x floor`; each part is also given in those units.

Launch:
```
python benchmarks/skip_decomposition.py                     # the held-out task, G = 4, seed 1, 5 passes
python benchmarks/skip_decomposition.py --num-generations 8 --seed 2
python benchmarks/skip_decomposition.py --mixture 0.25,30,0.5 0.25,0.5,30 0.5,2,2
```
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dynamic_sampling as ds  # noqa: E402

from dapo_trl.trainer.probing import default_probe  # noqa: E402
from dapo_trl.trainer.prompt_history import UNSEEN, SkipPolicy  # noqa: E402
from dapo_trl.trainer.sampling import GroupClassification  # noqa: E402

PARTS = ("trained", "surplus", "first pass", "re-tests, uniform", "re-tests, mixed")


@dataclass
class Ledger:
    """Costs in groups, by part; filled by [`book`]."""

    chance: torch.Tensor  # (num_prompts,) true chance of an informative group
    uniform: np.ndarray  # (num_prompts,) bool: drawn from the easy or the hard component
    probe: int
    num_generations: int
    cost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS[1:], 0.0))
    informative: float = 0.0
    dropped_cost: float = 0.0
    regenerated_uniform: int = 0


def book(ledger: Ledger, policy: SkipPolicy, indices: list[int], classification: GroupClassification) -> None:
    """Books one scored round in `ledger`, before `policy` learns from it (the `observe` of `ds.simulate`)."""
    idx = np.asarray(indices, dtype=np.int64)
    first = policy.history.last_outcome[idx] == UNSEEN
    verdict = classification.informative.numpy().astype(bool)
    scored = classification.scored.numpy()
    G, k = ledger.num_generations, ledger.probe
    cost = np.where(scored >= G, 1.0, k / G) if k else np.ones(idx.size)
    extreme = ledger.uniform[idx]
    ledger.informative += cost[verdict].sum()
    waste = ~verdict
    ledger.cost["first pass"] += cost[waste & first].sum()
    ledger.cost["re-tests, uniform"] += cost[waste & ~first & extreme].sum()
    ledger.cost["re-tests, mixed"] += cost[waste & ~first & ~extreme].sum()
    ledger.dropped_cost += cost[scored < G].sum()
    ledger.regenerated_uniform += int((~first & extreme).sum())


def decompose(
    population: ds.Population,
    *,
    num_generations: int,
    seed: int,
    passes: float,
    variant: str,
    num_prompts: int,
    target: int = 32,
    skip_kwargs: dict | None = None,
    probe: int | None = None,
    rule_kwargs: dict | None = None,
) -> tuple[ds.RunResult, Ledger, float]:
    """One run of `variant` (a name of `ds.SKIP_VARIANTS`) with every group booked; returns the run, its ledger, p."""
    G = num_generations
    spec = next(v for v in ds.SKIP_VARIANTS if v.name == variant)
    args = argparse.Namespace(
        epochs=passes, num_prompts=num_prompts, seed=seed, skip_drift=0.0, num_generations=G, target=target
    )
    steps = ds.skip_run_steps(population, args)
    rates, kind = ds.sample_population(population, num_prompts=num_prompts, seed=seed)
    chance = ds.informative_prob(rates, G)
    k = (default_probe(G) if probe is None else probe) if spec.probe else 0
    # the easy and hard components of a mixture (its first two); a population of one component has neither
    uniform = (kind < 2).numpy() if population.components else np.zeros(num_prompts, dtype=bool)
    ledger = Ledger(chance=chance, uniform=uniform, probe=k, num_generations=G)
    oracle = spec.rule == "oracle"
    result = ds.simulate(
        population,
        ds.Strategy(spec.name, "adaptive", spec.carry_over),
        target=target,
        steps=steps,
        num_generations=G,
        max_rounds=10,
        num_prompts=num_prompts,
        seed=seed,
        skip_kwargs={**(skip_kwargs or {}), "rule": "posterior" if oracle else spec.rule, "num_generations": G},
        oracle_threshold=ds.oracle_threshold(G) if oracle else None,
        probe=k,
        carry=ds.Carry(max_staleness=2.0),
        rule_kwargs=rule_kwargs,
        observe=functools.partial(book, ledger),
    )
    ledger.cost["surplus"] = ledger.informative - result.trained
    return result, ledger, chance.mean().item()


def format_rows(rows: Sequence[tuple[str, ds.RunResult, Ledger, float]]) -> str:
    lines = [
        "| run | x floor | gen/trained | "
        + " | ".join(PARTS)
        + " | of which dropped probes | re-generations per easy "
        "or hard prompt | lost / trained |",
        "|---|---:|---:|" + "---:|" * (len(PARTS) + 3),
    ]
    for name, r, ledger, p in rows:
        T = r.trained
        parts = [1.0] + [ledger.cost[part] / T for part in PARTS[1:]]
        extreme = int(ledger.uniform.sum())
        cells = " | ".join(f"{v:.3f} ({v * p:.3f}x)" for v in parts)
        lines.append(
            f"| {name} | {r.floor_ratio:.3f} | {r.gen_per_trained:.3f} | {cells} | {ledger.dropped_cost / T:.3f} "
            f"| {ledger.regenerated_uniform / max(extreme, 1):.2f} | {r.lost_share:.2f} |"
        )
    return "\n".join(lines)


def parse_mixture(specs: Sequence[str]) -> ds.Population:
    components = tuple(tuple(float(x) for x in s.split(",")) for s in specs)
    return ds.Population("mixture", 0.0, 0.0, components=components)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-generations", type=int, default=4, help="Group size G.")
    parser.add_argument("--seed", type=int, default=1, help="Seed of the pass rates and of the run.")
    parser.add_argument("--passes", type=float, default=5.0, help="Length of the run, in passes over the prompts.")
    parser.add_argument("--num-prompts", type=int, default=16384, help="Prompts in the simulated dataset.")
    parser.add_argument("--mixture", nargs="+", default=None, help="weight,a,b per component (default: HELD_OUT)")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=[ds.DEFAULT_SKIP_VARIANT, "adaptive+carry+oracle"],
        help="Skip variants to follow (names of dynamic_sampling.SKIP_VARIANTS).",
    )
    parser.add_argument("--max-skip", type=float, default=None, help="SkipPolicy max_skip; default: its own.")
    parser.add_argument(
        "--probe-min-efficiency", type=float, default=None, help="ProbeRule min_efficiency; default: its own."
    )
    args = parser.parse_args(argv)
    skip_kwargs = {} if args.max_skip is None else {"max_skip": args.max_skip}
    rule_kwargs = {} if args.probe_min_efficiency is None else {"min_efficiency": args.probe_min_efficiency}
    torch.set_num_threads(1)
    population = ds.HELD_OUT if args.mixture is None else parse_mixture(args.mixture)
    start = time.perf_counter()
    rows = []
    for variant in args.variants:
        r, ledger, p = decompose(
            population,
            num_generations=args.num_generations,
            seed=args.seed,
            passes=args.passes,
            variant=variant,
            num_prompts=args.num_prompts,
            skip_kwargs=skip_kwargs,
            rule_kwargs=rule_kwargs,
        )
        rows.append((variant, r, ledger, p))
    print(
        f"{population.describe}, G={args.num_generations}, seed {args.seed}, {args.passes:g} passes, SkipPolicy "
        f"{skip_kwargs or 'defaults'}, ProbeRule {rule_kwargs or 'defaults'}: groups generated per trained group, by "
        "part (in brackets: the same over the floor 1/p)\n"
    )
    print(format_rows(rows))
    print(f"\n({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
