"""The analysis of the pre-registered DAPO-against-GRPO comparison (docs/dapo_vs_grpo.md), as pure functions.

`benchmarks/real_model.py --phase report` calls these on the results JSON of `--phase unit --shared-order` units:

- [`paired_summary`]: the primary analysis, a paired t-test over seed pairs with its 95% confidence interval;
- [`pairs_needed`] and [`predicted_sd`]: the power rule that sets 8 or 16 pairs;
- [`pilot_budget`]: the pilot's rule for the token budget;
- [`at_equal_tokens`]: per-step metrics averaged over the same token ranges in every arm.

The t distribution is computed here (no SciPy): its CDF through the regularized incomplete beta function.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

# The pre-registered constants (docs/dapo_vs_grpo.md).
EFFECT = 0.02  # the difference the power calculation is for
POWER = 0.80
FIRST_SD, FIRST_HELDOUT = 0.036, 150  # the first comparison's SD of paired differences, and its held-out size
PLATEAU = 0.015  # an arm has plateaued by t when it gains less than this from t to the pilot's end
B_MAX = 16_000
PILOT_ROLLOUTS = 5  # B_min: the DAPO pilot unit's tokens after this many rollouts
BUDGET_TOLERANCE = 0.05  # a unit further than this share from B is reported as off the budget (and kept)


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """Lentz's continued fraction for the regularized incomplete beta function (converges for x < (a+1)/(a+b+2))."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    out = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            out *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return out


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function `I_x(a, b)`."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: int) -> float:
    """
    CDF of Student's t distribution with `df` degrees of freedom.

    Example:
    ```python
    >>> round(t_cdf(2.365, 7), 3), round(t_cdf(0.0, 3), 3)
    (0.975, 0.5)

    ```
    """
    tail = 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(q: float, df: int) -> float:
    """
    The `q` quantile of Student's t with `df` degrees of freedom (bisection on [`t_cdf`]).

    Example:
    ```python
    >>> round(t_quantile(0.975, 7), 3), round(t_quantile(0.975, 15), 3), round(t_quantile(0.8, 15), 3)
    (2.365, 2.131, 0.866)

    ```
    """
    low, high = -1000.0, 1000.0
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < q else (low, mid)
    return (low + high) / 2


def paired_summary(treatment: Sequence[float], control: Sequence[float]) -> dict:
    """
    The primary analysis: mean of the per-pair differences `treatment - control`, its standard error, the two-sided
    95% confidence interval `mean +- t(0.975, n-1) x SE`, the paired t-test's p-value, and the correlation of the two
    arms over pairs (how much the pairing shared).

    Example:
    ```python
    >>> s = paired_summary([0.62, 0.60, 0.64], [0.60, 0.59, 0.61])
    >>> round(s["mean"], 3), round(s["se"], 4), s["n"]
    (0.02, 0.0058, 3)

    ```
    """
    if len(treatment) != len(control) or len(treatment) < 2:
        raise ValueError(f"need at least 2 pairs of equal length, got {len(treatment)} and {len(control)}.")
    n = len(treatment)
    diffs = [a - b for a, b in zip(treatment, control, strict=True)]
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    se = sd / math.sqrt(n)
    half = t_quantile(0.975, n - 1) * se
    t = mean / se if se > 0 else math.copysign(math.inf, mean) if mean else 0.0
    p = 2 * (1 - t_cdf(abs(t), n - 1)) if math.isfinite(t) else 0.0
    return {
        "n": n,
        "mean": mean,
        "sd": sd,
        "se": se,
        "ci95": (mean - half, mean + half),
        "t": t,
        "p": p,
        "correlation": correlation(treatment, control),
        "diffs": diffs,
    }


def correlation(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Pearson's correlation, `None` when either side is constant."""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def largest_sd(pairs: int, effect: float = EFFECT, power: float = POWER) -> float:
    """The largest SD of paired differences at which `pairs` pairs reach `power` for `effect` (two-sided 0.05)."""
    df = pairs - 1
    return effect * math.sqrt(pairs) / (t_quantile(0.975, df) + t_quantile(power, df))


def predicted_sd(disagreement: float, heldout: int = 1000) -> float:
    """
    The pre-registered prediction of the SD of paired differences: held-out noise `D / N` at the new held-out size,
    plus the training noise left in the first comparison's SD once its held-out noise `D / 150` is taken out.
    """
    training = max(0.0, FIRST_SD**2 - disagreement / FIRST_HELDOUT)
    return math.sqrt(training + disagreement / heldout)


def pairs_needed(sd: float) -> int:
    """8 pairs when they have the power for +0.02 at this SD, else 16 (the pre-registered rule)."""
    return 8 if sd <= largest_sd(8) else 16


def disagreement(a: str, b: str) -> float:
    """Share of problems on which two per-problem outcome strings (`0`/`1`) differ."""
    if len(a) != len(b) or not a:
        raise ValueError("outcome strings must be non-empty and of one length")
    return sum(x != y for x, y in zip(a, b, strict=True)) / len(a)


def plateaued_by(curve: Sequence[tuple[float, float]], threshold: float = PLATEAU) -> dict[float, bool]:
    """For each `(tokens, accuracy)` of a curve: whether the accuracy at its end exceeds it by less than `threshold`."""
    final = curve[-1][1]
    return {tokens: final - accuracy < threshold for tokens, accuracy in curve}


def pilot_budget(
    curves: dict[str, Sequence[tuple[float, float]]],
    dapo_min_tokens: float,
    *,
    grid: float = 2_500,
    b_max: float = B_MAX,
) -> dict:
    """
    The pilot's budget rule. `curves[arm]` holds `(grid point, accuracy)` (each evaluation placed at the grid point
    it was taken for), `dapo_min_tokens` the DAPO unit's tokens after its 5th rollout. B is the largest grid point
    in `[B_min, b_max]` at which neither arm has plateaued, else B_min.
    """
    b_min = math.ceil(dapo_min_tokens / grid) * grid
    flags = {arm: plateaued_by(curve) for arm, curve in curves.items()}
    points = sorted(set.intersection(*(set(f) for f in flags.values())))
    open_points = [t for t in points if b_min <= t <= b_max and not any(f[t] for f in flags.values())]
    budget = max(open_points) if open_points else b_min
    return {"b_min": b_min, "b_max": b_max, "budget": budget, "plateaued_by": flags, "fallback": not open_points}


def at_equal_tokens(history: Sequence[dict], key: str, edges: Sequence[float]) -> list[float | None]:
    """
    Mean of `key` over the optimizer steps whose generated tokens (at the step's end) fall in each range
    `[edges[i], edges[i + 1])`: the same token ranges for every arm, whatever its number of steps.
    """
    out: list[float | None] = []
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        values = [
            h[key]
            for h in history
            if h.get("tokens") is not None
            and low <= h["tokens"] < high
            and h.get(key) is not None
            and not math.isnan(h[key])
        ]
        out.append(sum(values) / len(values) if values else None)
    return out


def zone_share(history: Sequence[dict], edges: Sequence[float]) -> list[float | None]:
    """Share of the completions generated in each token range that were longer than the overlong zone's start."""
    points = [(0, 0, 0)] + [
        (h["tokens"], h["completions_so_far"], h["overlong_zone_so_far"])
        for h in history
        if h.get("tokens") is not None and h.get("completions_so_far") is not None
    ]
    out: list[float | None] = []
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        inside = [p for p in points if low <= p[0] < high]
        before = [p for p in points if p[0] < low]
        if not inside:
            out.append(None)
            continue
        start, end = (before[-1] if before else points[0]), inside[-1]
        completions = end[1] - start[1]
        out.append((end[2] - start[2]) / completions if completions else None)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------------------

PRIMARY = ("dapo", "grpo")  # treatment, control
MECHANISMS = (
    ("clip_ratio/high_mean", "clip-higher active (share of tokens)", ".3%"),
    ("clip_ratio/low_mean", "clip-low active", ".3%"),
    ("informative", "informative share of generated groups", ".3f"),
    ("entropy", "policy entropy", ".3f"),
    ("completions/mean_length", "mean training completion length", ".1f"),
)


def informative(entry: dict) -> float | None:
    """A step's informative share: DAPO logs it; for GRPO it is `1 - frac_reward_zero_std`."""
    if entry.get("dynamic_sampling/informative_frac") is not None:
        return entry["dynamic_sampling/informative_frac"]
    zero = entry.get("frac_reward_zero_std")
    return None if zero is None else 1.0 - zero


def is_off_budget(unit: dict, budget: float) -> bool:
    """Whether a unit ended more than `BUDGET_TOLERANCE` of the budget away from it."""
    return abs(unit["generated_tokens"] - budget) > BUDGET_TOLERANCE * budget


def seeds_of(data: dict, arm: str) -> dict[int, dict]:
    return {s["seed"]: s for s in data.get("arms", {}).get(arm, {}).get("seeds", [])}


def mean_se(values: Sequence[float]) -> tuple[float | None, float | None]:
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _pm(pair: tuple[float | None, float | None], spec: str = ".3f") -> str:
    mean, se = pair
    return "-" if mean is None else f"{mean:{spec}}" + ("" if se is None else f" ({se:{spec}})")


def half_budget_entry(curve: Sequence[dict], budget: float) -> dict | None:
    """The evaluation taken for half the budget: the first one at or past B/2 (the start excluded)."""
    later = [c for c in curve if c["tokens"] >= budget / 2 and c["tokens"] > 0]
    return later[0] if later else None


def mechanisms(data: dict, arm: str, edges: Sequence[float]) -> dict[str, list[tuple[float | None, float | None]]]:
    """Per metric, per token range: mean and SE over the arm's seeds of its per-seed means at equal tokens."""
    out: dict[str, list] = {}
    units = seeds_of(data, arm).values()
    for key, _, _ in MECHANISMS:
        per_seed = []
        for unit in units:
            history = unit.get("history", [])
            if key == "informative":
                history = [{**h, "informative": informative(h)} for h in history]
            per_seed.append(at_equal_tokens(history, key, edges))
        out[key] = [mean_se([s[i] for s in per_seed]) for i in range(len(edges) - 1)]
    zones = [zone_share(unit.get("history", []), edges) for unit in units]
    out["overlong_zone"] = [mean_se([z[i] for z in zones]) for i in range(len(edges) - 1)]
    return out


def format_report(data: dict) -> tuple[str, dict]:
    """The markdown report of a `--shared-order` results JSON and the numbers behind it."""
    settings = data["settings"]
    budget = settings["budget_tokens"]
    treatment, control = seeds_of(data, PRIMARY[0]), seeds_of(data, PRIMARY[1])
    common = sorted(set(treatment) & set(control))
    lines = [
        f"# DAPO against GRPO on {settings['model']}: {len(common)} seed pair(s) at {budget:,} generated tokens",
        "",
        f"Settings: {json.dumps(settings)}",
        "",
        f"Starting model (warm-up), greedy held-out accuracy: {_fmt(data.get('warmup', {}).get('heldout_accuracy'))}"
        f" (n = {len(data.get('warmup', {}).get('heldout_correct', ''))}).",
        "",
        "| seed | GRPO accuracy | DAPO accuracy | DAPO - GRPO | GRPO tokens | DAPO tokens | GRPO steps | DAPO steps |"
        " minutes (GRPO / DAPO) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for seed in common:
        a, b = treatment[seed], control[seed]
        lines.append(
            f"| {seed} | {b['heldout_accuracy']:.3f} | {a['heldout_accuracy']:.3f} | "
            f"{a['heldout_accuracy'] - b['heldout_accuracy']:+.3f} | {b['generated_tokens']:,} | "
            f"{a['generated_tokens']:,} | {b['optimizer_steps']} | {a['optimizer_steps']} | "
            f"{b['seconds'] / 60:.1f} / {a['seconds'] / 60:.1f} |"
        )
    numbers: dict = {"pairs": common, "budget": budget}
    off_budget = [
        (arm, seed, unit["generated_tokens"])
        for arm, units in ((PRIMARY[0], treatment), (PRIMARY[1], control))
        for seed, unit in units.items()
        if is_off_budget(unit, budget)
    ]
    numbers["off_budget"] = off_budget
    per_unit = {  # secondary 4 and the arms' accuracies: name -> (value of a unit, format)
        "heldout_accuracy": (lambda unit: unit["heldout_accuracy"], ".3f"),
        "generated_tokens": (lambda unit: unit["generated_tokens"], ",.0f"),
        "optimizer_steps": (lambda unit: unit["optimizer_steps"], ".1f"),
        "minutes": (lambda unit: unit["seconds"] / 60, ".1f"),
    }
    means = numbers["means"] = {
        arm: {name: mean_se([value(units[s]) for s in common]) for name, (value, _) in per_unit.items()}
        for arm, units in ((PRIMARY[1], control), (PRIMARY[0], treatment))
    }
    cells = {name: [_pm(means[arm][name], spec) for arm in PRIMARY[::-1]] for name, (_, spec) in per_unit.items()}
    lines.append(
        f"| mean (SE) | {' | '.join(cells['heldout_accuracy'])} | | {' | '.join(cells['generated_tokens'])} | "
        f"{' | '.join(cells['optimizer_steps'])} | {' / '.join(cells['minutes'])} |"
    )
    lines += ["", f"Units more than {BUDGET_TOLERANCE:.0%} from the budget: {off_budget or 'none'}.", ""]
    if len(common) >= 2:
        primary = paired_summary(
            [treatment[s]["heldout_accuracy"] for s in common], [control[s]["heldout_accuracy"] for s in common]
        )
        numbers["primary"] = primary
        low, high = primary["ci95"]
        verdict = "DAPO above GRPO" if low > 0 else "GRPO above DAPO" if high < 0 else "no difference detected"
        corr = primary["correlation"]
        lines += [
            f"**Primary: DAPO - GRPO = {primary['mean']:+.4f}, SE {primary['se']:.4f}, 95% CI [{low:+.4f}, "
            f"{high:+.4f}], t = {primary['t']:.2f} on {primary['n'] - 1} df, p = {primary['p']:.3f}: {verdict}.** "
            f"SD of the paired differences {primary['sd']:.4f} (8 pairs have 80% power for +0.02 up to "
            f"{largest_sd(8):.4f}, 16 up to {largest_sd(16):.4f}); correlation of the arms over pairs "
            f"{_fmt(corr, '.2f')}.",
            "",
        ]
        halves = [
            (
                half_budget_entry(treatment[s].get("curve", []), budget),
                half_budget_entry(control[s].get("curve", []), budget),
            )
            for s in common
        ]
        if all(a and b for a, b in halves):
            half = paired_summary([a["accuracy"] for a, _ in halves], [b["accuracy"] for _, b in halves])
            numbers["half_budget"] = half
            lines += [
                f"Secondary 1, at half the budget: DAPO - GRPO = {half['mean']:+.4f}, SE {half['se']:.4f}, 95% CI "
                f"[{half['ci95'][0]:+.4f}, {half['ci95'][1]:+.4f}] (tokens: GRPO "
                f"{sum(b['tokens'] for _, b in halves) / len(halves):,.0f}, DAPO "
                f"{sum(a['tokens'] for a, _ in halves) / len(halves):,.0f} on average).",
                "",
            ]
        flagged = {seed for _, seed, _ in off_budget}
        within = [s for s in common if s not in flagged]
        if flagged and len(within) >= 2:
            near = paired_summary(
                [treatment[s]["heldout_accuracy"] for s in within], [control[s]["heldout_accuracy"] for s in within]
            )
            numbers["within_budget"] = near
            lines += [
                f"Sensitivity (not pre-registered; describes only): over the {near['n']} pairs with both units within "
                f"{BUDGET_TOLERANCE:.0%} of the budget, DAPO - GRPO = {near['mean']:+.4f}, SE {near['se']:.4f}, 95% CI "
                f"[{near['ci95'][0]:+.4f}, {near['ci95'][1]:+.4f}].",
                "",
            ]
        per_problem = _by_problem(treatment, control, common)
        if per_problem is not None:
            numbers["by_problem"] = per_problem
            lines += [
                f"Secondary 2, paired by problem (outcomes averaged over seeds): DAPO - GRPO = "
                f"{per_problem[0]:+.4f}, SE {per_problem[1]:.4f} (leaves out training noise: descriptive only).",
                "",
            ]
    edges = [0, budget / 4, budget / 2, 3 * budget / 4, budget * 1.2]
    lines += [
        "Secondary 3, mechanisms at equal tokens (steps grouped by the tokens generated when they ended; mean (SE) "
        "over seeds):",
        "",
        "| metric | arm | " + " | ".join(f"{edges[i]:,.0f}-{edges[i + 1]:,.0f}" for i in range(4)) + " |",
        "|---|---|---|---|---|---|",
    ]
    numbers["mechanisms"] = {}
    for arm in PRIMARY[::-1]:
        numbers["mechanisms"][arm] = mechanisms(data, arm, edges)
    for key, label, spec in (*MECHANISMS, ("overlong_zone", "completions in the overlong zone", ".3f")):
        for arm in PRIMARY[::-1]:
            cells = numbers["mechanisms"][arm][key]
            lines.append(f"| {label} | {arm} | " + " | ".join(_pm(c, spec) for c in cells) + " |")
    return "\n".join(lines) + "\n", numbers


def _by_problem(treatment: dict, control: dict, seeds: Sequence[int]) -> tuple[float, float] | None:
    if not all("heldout_correct" in treatment[s] and "heldout_correct" in control[s] for s in seeds):
        return None
    n = len(treatment[seeds[0]]["heldout_correct"])
    diffs = []
    for i in range(n):
        a = sum(int(treatment[s]["heldout_correct"][i]) for s in seeds) / len(seeds)
        b = sum(int(control[s]["heldout_correct"][i]) for s in seeds) / len(seeds)
        diffs.append(a - b)
    mean, se = mean_se(diffs)
    return mean, se


def pilot_report(data: dict) -> tuple[str, dict]:
    """The pilot's budget decision and power prediction (docs/dapo_vs_grpo.md), from a one-pair results JSON."""
    settings = data["settings"]
    grid = settings["budget_tokens"] * 0.1
    units = {arm: next(iter(seeds_of(data, arm).values())) for arm in PRIMARY}
    curves = {}
    for arm, unit in units.items():
        points = [(0.0, unit["curve"][0]["accuracy"])]
        for c in unit["curve"][1:]:
            points.append((min(math.floor(c["tokens"] / grid) * grid, settings["budget_tokens"]), c["accuracy"]))
        curves[arm] = points
    boundaries = [h for h in units["dapo"]["history"] if h["step"] % settings["updates_per_rollout"] == 0]
    fifth = boundaries[PILOT_ROLLOUTS - 1]["tokens"] if len(boundaries) >= PILOT_ROLLOUTS else math.inf
    decision = pilot_budget(curves, fifth, grid=grid)
    budget = decision["budget"]
    nearest = {arm: min(unit["curve"][1:], key=lambda c: abs(c["tokens"] - budget)) for arm, unit in units.items()}
    d = disagreement(nearest["dapo"]["correct"], nearest["grpo"]["correct"])
    sd = predicted_sd(d, len(nearest["dapo"]["correct"]))
    numbers = {**decision, "fifth_rollout_tokens": fifth, "disagreement": d, "predicted_sd": sd}
    numbers["pairs"] = pairs_needed(sd)
    lines = [
        f"# Pilot: one pair (seed {units['dapo']['seed']}) to {settings['budget_tokens']:,} generated tokens",
        "",
        "| tokens (grid) | " + " | ".join(f"{arm} accuracy | plateaued" for arm in PRIMARY[::-1]) + " |",
        "|---|---|---|---|---|",
    ]
    for t, _ in curves["grpo"]:
        row = [f"{t:,.0f}"]
        for arm in PRIMARY[::-1]:
            match = [a for x, a in curves[arm] if x == t]
            row += [_fmt(match[0]) if match else "-", str(decision["plateaued_by"][arm].get(t, "-"))]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        f"DAPO's 5th rollout ended at {fifth:,} tokens: B_min = {decision['b_min']:,.0f}; B_max = "
        f"{decision['b_max']:,.0f}. **B = {budget:,.0f}**"
        + (" (no grid point in range where neither arm had plateaued: B_min)." if decision["fallback"] else "."),
        f"Disagreement of the two arms' models nearest B: D = {d:.3f}; predicted SD of paired differences "
        f"{sd:.4f} (8 pairs suffice up to {largest_sd(8):.4f}): **{numbers['pairs']} pairs**.",
    ]
    return "\n".join(lines) + "\n", numbers


def plot_pairs(data: dict, path) -> bool:
    """Each seed's accuracy in both arms (lines join a pair) and the paired differences with their 95% CI (open
    markers: pairs holding a unit more than `BUDGET_TOLERANCE` from the budget)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    treatment, control = seeds_of(data, PRIMARY[0]), seeds_of(data, PRIMARY[1])
    common = sorted(set(treatment) & set(control))
    if len(common) < 2:
        return False
    a = [treatment[s]["heldout_accuracy"] for s in common]
    b = [control[s]["heldout_accuracy"] for s in common]
    summary = paired_summary(a, b)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
    for x, y in zip(b, a, strict=True):
        left.plot([0, 1], [x, y], color="0.6", marker="o")
    left.set_xticks([0, 1], ["GRPO (GRPOConfig)", "DAPO (DAPOConfig)"])
    left.set_ylabel("held-out accuracy (greedy, n = 1,000)")
    left.set_title("each seed pair")
    budget = data["settings"]["budget_tokens"]
    far = [is_off_budget(treatment[s], budget) or is_off_budget(control[s], budget) for s in common]
    within, beyond = f"units within {BUDGET_TOLERANCE:.0%} of B", f"a unit more than {BUDGET_TOLERANCE:.0%} from B"
    for flagged, label in ((False, within), (True, beyond)):
        xs = [i for i, f in enumerate(far) if f == flagged]
        if xs:
            face = "none" if flagged else "C0"
            diffs = [summary["diffs"][i] for i in xs]
            right.scatter(xs, diffs, facecolors=face, edgecolors="C0", label=label)
    right.axhline(0, color="0.3", linewidth=0.8)
    right.axhline(summary["mean"], color="C1", label=f"mean {summary['mean']:+.3f}")
    right.axhspan(*summary["ci95"], color="C1", alpha=0.2, label="95% CI")
    right.set_xticks(range(len(common)), [str(s) for s in common], rotation=90 if len(common) > 8 else 0)
    right.set_xlabel("seed")
    right.set_ylabel("DAPO - GRPO")
    right.set_title(f"paired differences, {len(common)} pairs")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
