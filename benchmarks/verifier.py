"""
Accuracy and speed of the math-answer verifier, side by side with math-verify.

Default run, on this project's material:
- the labelled suite `tests/data/verifier_cases.jsonl` (every answer category, realistic completions): accuracy, false
  positives (wrong answer scored correct) and false negatives per category, for dapo-trl's strict and lenient
  extraction and for math-verify called the way TRL's `accuracy_reward` calls it (`trl.rewards.accuracy_reward`:
  `parse` on the gold, `parse` with boxed-first LaTeX extraction on the completion, then `verify`);
- speed: per-case latency p50/p99 and batch throughput on that suite, and on a DAPO-Math-17k-shaped batch (integer
  gold answers, `Answer:` lines, B x G completions);
- the two reward rules (`rule="equivalence"`, the default, and `rule="dapo"`, the paper's): how often they disagree on
  the suite and in which direction.

`--peer-suite math-verify`: math-verify's own unit tests, downloaded at run time (its source distribution from PyPI,
the version installed here; `--peer-sdist` takes one already downloaded). Their test files are read with `ast`, never
imported or copied: every `(gold, pred, expected)` case whose comparison runs with default flags (float rounding 6,
strict, no set-relation comparison) is run through dapo-trl (`score_completion`, strict and lenient) and through
math-verify itself (as its tests call it), and the table gives pass rate, false positives and false negatives by kind
(the kind is the test that holds the case).

Caches are cleared (and the worker pool restarted) before each timed pass, so repeated answers are not free.

Reading the numbers: the project suite was written alongside the verifier's comparison policy, so our accuracy on it
is in-sample; math-verify's suite was not. math-verify on our suite is scored exactly as TRL calls it, with LaTeX-only
extraction: a plain `Answer: 34` line (DAPO's format) is not extracted, which accounts for many of its false
negatives; others are policy differences (choice letters, percentages, `x = 3` vs `3`).

Usage:
    python benchmarks/verifier.py                 # project suite: accuracy, speed, reward rules
    python benchmarks/verifier.py --dapo-batch 1024 --workers 2
    python benchmarks/verifier.py --peer-suite math-verify [--show-failures]
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from importlib import metadata
from pathlib import Path

from dapo_trl.rewards.math import MathVerifierReward
from dapo_trl.verifier import api, normalize

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


def reset_caches(num_workers: int) -> None:
    normalize.clean.cache_clear()
    normalize.parse_answer.cache_clear()
    api.shutdown_workers()
    api.warm_up(num_workers)  # the pool's one-time start is not part of any measurement


def ours(extraction_mode: str = "strict"):
    def score(case: dict) -> bool:
        return api.score_completion(case["completion"], case["gold"], extraction=extraction_mode) is True

    return score


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


def report(kinds: list[str], labels: list[bool], results: dict[str, list[bool]], title: str = "category") -> None:
    """Accuracy, false positives and false negatives per kind and overall, one column group per verifier."""
    names = list(results)
    by_kind: dict[str, list[int]] = defaultdict(list)
    for i, kind in enumerate(kinds):
        by_kind[kind].append(i)
    width = max(len(title), *(len(k) for k in kinds)) + 2
    header = f"{title:<{width}}{'n':>5}" + "".join(f"{name + ' acc':>22}{'FP':>5}{'FN':>5}" for name in names)
    print(header)
    print("-" * len(header))
    for kind, idx in sorted(by_kind.items()) + [("ALL", list(range(len(kinds))))]:
        row = f"{kind:<{width}}{len(idx):>5}"
        for name in names:
            r = results[name]
            fp = sum(r[i] and not labels[i] for i in idx)
            fn = sum(not r[i] and labels[i] for i in idx)
            row += f"{1 - (fp + fn) / len(idx):>22.3f}{fp:>5}{fn:>5}"
        print(row)


# ----------------------------------------------------------------------------------------------- the project suite
def run_suite(cases: list[dict], args) -> None:
    methods = {"ours strict": ours("strict"), "ours lenient": ours("lenient")}
    if not args.no_math_verify:
        methods["math-verify"] = math_verify_single
    print(f"Labelled suite: {len(cases)} cases from {CASES.name}; {args.workers} worker processes for ours.\n")
    results, times = {}, {}
    for name, fn in methods.items():
        reset_caches(args.workers)
        fn(cases[0])  # imports and lazy initialisation are not per-case costs
        results[name], times[name] = latencies(fn, cases)
    report([c["category"] for c in cases], [c["label"] for c in cases], results)
    run_speed(cases, times, args)
    run_rules(cases)


def run_speed(cases: list[dict], times: dict[str, list[float]], args) -> None:
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
    for name, fn in (("ours", ours("strict")), ("math-verify", math_verify_single)):
        if name == "math-verify" and args.no_math_verify:
            continue
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
        t, d = [1000 * x for x in times["ours strict" if name == "ours" else name]], [1000 * x for x in dapo_times]
        row = [percentile(t, 50), percentile(t, 99), percentile(d, 50), percentile(d, 99)]
        print(f"{name:<14}" + "".join(f"{x:>12.2f}" for x in row) + f"{suite:>12.0f}{dapo:>12.0f}")
    if "math-verify" in speed:
        (s_ours, d_ours), (s_mv, d_mv) = speed["ours"], speed["math-verify"]
        print(f"\nThroughput ratio ours / math-verify: suite {s_ours / s_mv:.1f}x, DAPO batch {d_ours / d_mv:.1f}x")
    pairs = [(api.extract_gold_answer(c["gold"]), api.extract_answer(c["completion"])) for c in cases]
    symbolic = sum(api.fast_verdict(g, p) is None for g, p in pairs if g is not None and p is not None)
    print(f"Suite answers needing SymPy (worker process): {symbolic} of {len(cases)}.")


def run_rules(cases: list[dict]) -> None:
    """How often `rule="equivalence"` and `rule="dapo"` disagree on the suite, and which one the label agrees with."""
    both = defaultdict(int)
    for case in cases:
        eq = api.score_completion(case["completion"], case["gold"]) is True
        dapo = api.score_completion(case["completion"], case["gold"], rule="dapo") is True
        both[(eq, dapo, case["label"])] += 1
    n = len(cases)
    print(f"\nReward rules on the suite ({n} cases): equivalence (default) vs dapo (the paper's rule)")
    print("| | label: correct | label: wrong | all |")
    print("|---|---:|---:|---:|")
    for text, (eq, dapo) in (
        ("both score correct", (True, True)),
        ("both score wrong", (False, False)),
        ("only equivalence scores correct", (True, False)),
        ("only dapo scores correct", (False, True)),
    ):
        right, wrong = both[(eq, dapo, True)], both[(eq, dapo, False)]
        print(f"| {text} | {right} | {wrong} | {right + wrong} ({(right + wrong) / n:.1%}) |")
    for rule, index in (("equivalence", 0), ("dapo", 1)):
        fp = sum(v for k, v in both.items() if k[index] and not k[2])
        fn = sum(v for k, v in both.items() if not k[index] and k[2])
        print(f"{rule}: accuracy {1 - (fp + fn) / n:.3f}, false positives {fp}, false negatives {fn}")


# --------------------------------------------------------------------------------------------------- the peer suite
DEFAULT_FLAGS = {"precision": 6, "strict": True, "allow_set_relation_comp": False}


def fetch_math_verify_sdist(target: Path, sdist: str | None) -> Path:
    """math-verify's source distribution (the installed version) from PyPI, unpacked under `target`; its tests dir."""
    if sdist is None:
        version = metadata.version("math-verify")
        command = [sys.executable, "-m", "pip", "download", f"math-verify=={version}", "--no-deps", "--no-binary"]
        subprocess.run([*command, ":all:", "--quiet", "-d", str(target)], check=True)
        sdist = str(next(target.glob("math_verify-*.tar.gz")))
    with tarfile.open(sdist) as archive:
        archive.extractall(target, filter="data")
    return next(target.glob("math_verify-*/tests"))


def peer_cases(tests_dir: Path) -> list[dict]:
    """Every parametrised `(gold, pred, expected)` case of math-verify's tests that runs with default flags."""
    cases = []
    for path in sorted(tests_dir.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
            calls = [
                n
                for n in ast.walk(fn)
                if isinstance(n, ast.Call) and ast.unparse(n.func) in ("compare_strings", "verify")
            ]
            for decorator in fn.decorator_list:
                if not (isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("parametrize")):
                    continue
                names = [n.strip() for n in ast.literal_eval(decorator.args[0]).split(",")]
                if not calls or not {"gold", "pred"} <= set(names):
                    continue
                call = calls[0]
                keywords = {k.arg: k.value for k in call.keywords}
                for element in decorator.args[1].elts:
                    try:
                        values = dict(zip(names, ast.literal_eval(element)))
                    except ValueError:  # built at run time (an f-string): not a plain case
                        continue
                    flags = {
                        k: values[v.id] if isinstance(v, ast.Name) else ast.literal_eval(v)
                        for k, v in keywords.items()
                        if k != "match_types"
                    }
                    flags.update({k: values[k] for k in names if k in DEFAULT_FLAGS})
                    if any(flags[k] != DEFAULT_FLAGS.get(k) for k in flags):
                        continue
                    expected = values.get("expected", values.get("result"))
                    kind = "yujianll" if path.name == "test_yujianll.py" else fn.name.removeprefix("test_")
                    match_types = ast.literal_eval(keywords["match_types"]) if "match_types" in keywords else None
                    cases.append(
                        {
                            "kind": kind,
                            "gold": values["gold"],
                            "pred": values["pred"],
                            "label": bool(expected),
                            "match_types": match_types,
                        }  # fmt: skip
                    )
    return cases


def math_verify_reference(case: dict) -> bool:
    """math-verify on a case, called as its own tests call it."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    if case["match_types"] is None:
        return bool(verify(parse(case["gold"]), parse(case["pred"])))
    targets = [
        LatexExtractionConfig(boxed_match_priority=0) if m == "latex" else ExprExtractionConfig()
        for m in case["match_types"]
    ]
    gold, pred = parse(case["gold"], targets), parse(case["pred"], targets)
    return bool(verify(gold, pred, float_rounding=6, strict=True, allow_set_relation_comp=False))


def run_peer_suite(args) -> dict[str, list[bool]]:
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory() as tmp:
        tests_dir = fetch_math_verify_sdist(Path(tmp), args.peer_sdist)
        cases = peer_cases(tests_dir)
    version = metadata.version("math-verify")
    print(f"math-verify {version}'s own tests: {len(cases)} boolean comparison cases with default flags.\n")
    results = {
        "dapo-trl strict": [api.score_completion(c["pred"], c["gold"]) is True for c in cases],
        "dapo-trl lenient": [api.score_completion(c["pred"], c["gold"], extraction="lenient") is True for c in cases],
        "math-verify": [math_verify_reference(c) for c in cases],
    }
    report([c["kind"] for c in cases], [c["label"] for c in cases], results, title="kind")
    if args.show_failures:
        for name in ("dapo-trl lenient", "dapo-trl strict"):
            print(f"\n{name} disagrees with the expectation on:")
            for case, verdict in zip(cases, results[name]):
                if verdict != case["label"]:
                    print(
                        f"  [{case['kind']}] expected {case['label']}: gold {case['gold'][:80]!r} pred {case['pred'][-80:]!r}"
                    )
    api.shutdown_workers()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=api.DEFAULT_NUM_WORKERS, help="verifier worker processes")
    parser.add_argument("--dapo-batch", type=int, default=8192, help="B x G completions in the DAPO-shaped batch")
    parser.add_argument("--latency-sample", type=int, default=1000, help="DAPO completions timed one at a time")
    parser.add_argument("--no-math-verify", action="store_true", help="skip the math-verify comparison")
    parser.add_argument("--peer-suite", choices=("math-verify",), help="run a peer library's own test suite instead")
    parser.add_argument("--peer-sdist", default=None, help="an already downloaded math-verify sdist (.tar.gz)")
    parser.add_argument("--show-failures", action="store_true", help="list the peer-suite cases dapo-trl misses")
    args = parser.parse_args(argv)
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    if args.peer_suite:
        run_peer_suite(args)
    else:
        run_suite(load_cases(), args)
    api.shutdown_workers()


if __name__ == "__main__":
    main()
