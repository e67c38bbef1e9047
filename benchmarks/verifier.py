"""
Accuracy and speed of the math-answer verifier, side by side with math-verify used the way TRL's `accuracy_reward` uses
it (`trl.rewards.accuracy_reward`: `parse` on the gold, `parse` with boxed-first LaTeX extraction on the completion,
then `verify`).

Two workloads:
- the labelled suite `tests/data/verifier_cases.jsonl` (every answer category, realistic completions): accuracy, false
  positives (wrong answer scored correct), false negatives per category, per-case latency p50/p99, and batch
  throughput;
- a DAPO-Math-17k-shaped batch (integer gold answers, `Answer:` lines, B x G completions): batch throughput.

Caches are cleared (and the worker pool restarted) before each timed pass, so repeated answers are not free.

Reading the numbers: the suite was written alongside the verifier's comparison policy, so our accuracy on it is
in-sample. math-verify is scored exactly as TRL calls it, with LaTeX-only extraction: a plain `Answer: 34` line (DAPO's
format) is not extracted, which accounts for many of its false negatives; others are policy differences (choice letters,
percentages, `x = 3` vs `3`).

Usage:
    python benchmarks/verifier.py                 # full run
    python benchmarks/verifier.py --dapo-batch 1024 --workers 2
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import time
from collections import defaultdict
from pathlib import Path

from dapo_trl import math_answer, math_normalize
from dapo_trl.rewards import MathVerifierReward

CASES = Path(__file__).resolve().parent.parent / "tests" / "data" / "verifier_cases.jsonl"


def load_cases() -> list[dict]:
    return [json.loads(line) for line in CASES.read_text().splitlines() if line.strip()]


def dapo_batch(size: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Completions shaped like a DAPO rollout on DAPO-Math-17k: integer golds, reasoning with numbers, `Answer:`."""
    rng = random.Random(seed)
    completions, golds = [], []
    for i in range(size):
        gold = rng.randint(1, 10_000)
        pred = gold if rng.random() < 0.4 else gold + rng.choice([-3, -1, 1, 2, 7, gold])
        steps = " ".join(f"Step {k}: {rng.randint(1, 999)} + {rng.randint(1, 999)}." for k in range(40))
        tail = rng.choice([f"Answer: {pred}", f"Answer: ${pred}$", f"The final answer is $\\boxed{{{pred}}}$."])
        completions.append(f"Let me think about problem {i}. {steps}\n\n{tail}")
        golds.append(str(gold))
    return completions, golds


def _extracted(cases: list[dict]) -> list[tuple[str, str]]:
    pairs = [(math_answer.extract_gold_answer(c["gold"]), math_answer.extract_answer(c["completion"])) for c in cases]
    return [(g, p) for g, p in pairs if g is not None and p is not None]


def reset_caches(num_workers: int) -> None:
    math_normalize.clean.cache_clear()
    math_normalize.parse_answer.cache_clear()
    math_answer.shutdown_workers()
    math_answer.warm_up(num_workers)  # the pool's one-time start is not part of any measurement


def ours_single(case: dict) -> bool:
    return math_answer.score_completion(case["completion"], case["gold"]) is True


def math_verify_single(case: dict) -> bool:
    from trl.rewards import accuracy_reward

    return accuracy_reward([[{"role": "assistant", "content": case["completion"]}]], [case["gold"]])[0] == 1.0


def latencies(fn, cases: list[dict]) -> tuple[list[bool], list[float]]:
    results, times = [], []
    for case in cases:
        start = time.perf_counter()
        results.append(fn(case))
        times.append(time.perf_counter() - start)
    return results, times


def throughput_ours(completions: list[str], golds: list[str], num_workers: int) -> float:
    reward = MathVerifierReward(answer_column="gold", num_workers=num_workers)
    start = time.perf_counter()
    reward(completions, gold=golds)
    return len(completions) / (time.perf_counter() - start)


def throughput_math_verify(completions: list[str], golds: list[str]) -> float:
    from trl.rewards import accuracy_reward

    start = time.perf_counter()
    accuracy_reward([[{"role": "assistant", "content": c}] for c in completions], golds)
    return len(completions) / (time.perf_counter() - start)


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1] if len(values) > 1 else values[0]


def report(cases: list[dict], results: dict[str, list[bool]]) -> None:
    names = list(results)
    by_category: dict[str, list[int]] = defaultdict(list)
    for i, case in enumerate(cases):
        by_category[case["category"]].append(i)
    header = f"{'category':<18}{'n':>5}" + "".join(f"{name + ' acc':>17}{'FP':>5}{'FN':>5}" for name in names)
    print(header)
    print("-" * len(header))
    for category, idx in sorted(by_category.items()) + [("ALL", list(range(len(cases))))]:
        row = f"{category:<18}{len(idx):>5}"
        for name in names:
            r = results[name]
            fp = sum(r[i] and not cases[i]["label"] for i in idx)
            fn = sum(not r[i] and cases[i]["label"] for i in idx)
            row += f"{1 - (fp + fn) / len(idx):>17.3f}{fp:>5}{fn:>5}"
        print(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=math_answer.DEFAULT_NUM_WORKERS)
    parser.add_argument("--dapo-batch", type=int, default=8192, help="B x G completions in the DAPO-shaped batch")
    parser.add_argument("--latency-sample", type=int, default=1000, help="DAPO completions timed one at a time")
    parser.add_argument("--no-math-verify", action="store_true", help="skip the math-verify comparison")
    args = parser.parse_args()
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    cases = load_cases()
    methods = {"ours": ours_single}
    if not args.no_math_verify:
        methods["math-verify"] = math_verify_single
    print(f"Labelled suite: {len(cases)} cases from {CASES.name}; {args.workers} worker processes for ours.\n")

    results, times = {}, {}
    for name, fn in methods.items():
        reset_caches(args.workers)
        fn(cases[0])  # imports and lazy initialisation are not per-case costs
        results[name], times[name] = latencies(fn, cases)
    report(cases, results)

    print(
        "\nSpeed. Latency: one completion scored at a time, in a fresh process (no parse seen before).\n"
        f"Throughput: the whole set scored as one batch ({args.workers} worker processes for ours)."
    )
    completions, golds = [c["completion"] for c in cases], [c["gold"] for c in cases]
    dapo_completions, dapo_golds = dapo_batch(args.dapo_batch)
    dapo_cases = [{"completion": c, "gold": g} for c, g in zip(dapo_completions, dapo_golds)][: args.latency_sample]
    columns = ["suite p50", "suite p99", "DAPO p50", "DAPO p99", "suite/s", "DAPO/s"]
    print(f"{'':<14}" + "".join(f"{c:>12}" for c in columns) + "   (latencies in ms, throughput in cases/s)")
    speed = {}
    for name, fn in methods.items():
        reset_caches(args.workers)
        fn(dapo_cases[0])
        _, dapo_times = latencies(fn, dapo_cases[1:])
        reset_caches(args.workers)
        if name == "ours":
            suite = throughput_ours(completions, golds, args.workers)
            reset_caches(args.workers)
            dapo = throughput_ours(dapo_completions, dapo_golds, args.workers)
        else:
            suite = throughput_math_verify(completions, golds)
            dapo = throughput_math_verify(dapo_completions, dapo_golds)
        speed[name] = (suite, dapo)
        t, d = [1000 * x for x in times[name]], [1000 * x for x in dapo_times]
        row = [percentile(t, 50), percentile(t, 99), percentile(d, 50), percentile(d, 99)]
        print(f"{name:<14}" + "".join(f"{x:>12.2f}" for x in row) + f"{suite:>12.0f}{dapo:>12.0f}")
    if "math-verify" in speed:
        (s_ours, d_ours), (s_mv, d_mv) = speed["ours"], speed["math-verify"]
        print(f"\nThroughput ratio ours / math-verify: suite {s_ours / s_mv:.1f}x, DAPO batch {d_ours / d_mv:.1f}x")
    symbolic = sum(math_answer._fast_verdict(g, p) is None for g, p in _extracted(cases))
    print(f"Suite answers needing SymPy (worker process): {symbolic} of {len(cases)}.")
    math_answer.shutdown_workers()


if __name__ == "__main__":
    main()
