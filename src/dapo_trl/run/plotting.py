"""Training curves from a Trainer's `log_history` (needs the `plot` extra: matplotlib)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

# (panel title, [(metric key, legend label), ...])
PANELS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (
        "reward",
        (
            ("dynamic_sampling/reward_before_filter", "before filtering"),
            ("dynamic_sampling/reward_after_filter", "after filtering"),
            ("reward", "rollout reward"),
        ),
    ),
    (
        "accuracy",
        (
            ("dynamic_sampling/accuracy_before_filter", "before filtering"),
            ("dynamic_sampling/accuracy_after_filter", "after filtering"),
            ("accuracy", "rollout accuracy"),
            ("eval_accuracy", "held-out accuracy (eval)"),
        ),
    ),
    ("entropy", (("entropy", "token entropy"),)),
    (
        "response length",
        (
            ("completions/mean_length", "mean"),
            ("completions/correct_mean_length", "correct"),
            ("completions/incorrect_mean_length", "incorrect"),
        ),
    ),
    (
        "clip and truncation fractions",
        (
            ("clip_ratio/low_mean", "low clip"),
            ("clip_ratio/high_mean", "high clip"),
            ("completions/clipped_ratio", "truncated"),
        ),
    ),
    (
        "dynamic sampling",
        (
            ("dynamic_sampling/informative_frac", "informative fraction"),
            ("dynamic_sampling/rounds", "rounds per step"),
        ),
    ),
)

# With dynamic sampling, TRL's `reward` and `accuracy` are merged over every row generated for the step
# (`DynamicSamplingMixin._merge_call_metrics`): the same values as the "before filtering" ones, drawn once.
SAME_AS: dict[str, str] = {
    "reward": "dynamic_sampling/reward_before_filter",
    "accuracy": "dynamic_sampling/accuracy_before_filter",
}
STYLES: dict[str, dict] = {"eval_accuracy": {"marker": "D", "linewidth": 2, "zorder": 4}}
# Held-out accuracy is measured at a few steps (before and after RL): points, no line between them.
HELDOUT_STYLE = {"marker": "D", "markersize": 7, "linestyle": "none", "color": "black", "zorder": 5}

# The panel on which each diagnosis (`diagnostics/<name>`) is marked; others go on the first panel.
DIAGNOSIS_PANELS: dict[str, str] = {
    "entropy_collapse": "entropy",
    "vanishing_signal": "dynamic sampling",
    "length_explosion": "response length",
    "length_collapse": "response length",
    "truncation_growth": "clip and truncation fractions",
    "reward_hacking": "reward",
}


def series(log_history: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of one metric (entries without it, or with `None`/NaN, are skipped)."""
    steps, values = [], []
    for entry in log_history:
        value = entry.get(key)
        if value is None or "step" not in entry or (isinstance(value, float) and math.isnan(value)):
            continue
        steps.append(int(entry["step"]))
        values.append(float(value))
    return steps, values


def heldout_points(summary: dict, last_step: int) -> list[tuple[int, float]]:
    """
    The run's held-out result as (step, accuracy) points: `summary["heldout"]`'s "before" (step 0, when measured)
    and "after" (the last step), else the final evaluation's avg@k at the last step.

    Example:
    ```python
    >>> heldout_points({"heldout": {"before": 0.45, "after": 0.54}}, 300)
    [(0, 0.45), (300, 0.54)]
    >>> heldout_points({"eval": {"avg@4": 0.25, "pass@4": 0.5, "k": 4}}, 20)
    [(20, 0.25)]

    ```
    """
    heldout = summary.get("heldout") or {}
    if heldout.get("after") is not None:
        before = [(0, float(heldout["before"]))] if heldout.get("before") is not None else []
        return [*before, (last_step, float(heldout["after"]))]
    evaluation = summary.get("eval") or {}
    avg = evaluation.get(f"avg@{evaluation.get('k')}")
    return [(last_step, float(avg))] if isinstance(avg, int | float) else []


def plot_training_curves(
    log_history: Sequence[dict],
    path: str | Path,
    *,
    title: str | None = None,
    heldout: Sequence[tuple[int, float]] = (),
) -> Path:
    """
    Write a PNG of [`training_curves_figure`]: one panel per group of [`PANELS`], held-out accuracy (`heldout`, see
    [`heldout_points`]) on the accuracy panel.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = training_curves_figure(log_history, title=title, heldout=heldout)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def training_curves_figure(
    log_history: Sequence[dict], *, title: str | None = None, heldout: Sequence[tuple[int, float]] = ()
):
    """
    The figure of the training curves, one panel per group of [`PANELS`]: reward and accuracy before/after filtering
    (TRL's rollout values only without dynamic sampling, where they are the only ones; with it they equal the "before
    filtering" ones, [`SAME_AS`]), held-out accuracy (`eval_accuracy` when the run evaluated, and the `heldout`
    measurements as points: (step, accuracy)), entropy, response length, clip and truncation fractions, informative
    fraction and rounds per step, on whole-number step ticks. Metrics that
    were never logged are left out. Each diagnosis that fired (`diagnostics/<name>` of [`DiagnosticsCallback`]) is
    marked by a dashed red line at its first step on the matching panel ([`DIAGNOSIS_PANELS`]) and listed under the
    figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (panel, keys) in zip(axes.flat, PANELS, strict=True):
        drawn = False
        for key, label in keys:
            steps, values = series(log_history, key)
            if key in SAME_AS and series(log_history, SAME_AS[key])[0]:
                continue
            if steps:
                style = {"marker": "." if len(steps) < 30 else None, **STYLES.get(key, {})}
                ax.plot(steps, values, label=label, **style)
                drawn = True
        if panel == "accuracy" and heldout:
            ax.plot(*zip(*heldout), label="held-out accuracy", **HELDOUT_STYLE)
            drawn = True
        ax.set_title(panel)
        ax.set_xlabel("optimizer step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    fired = _mark_diagnoses(log_history, dict(zip((panel for panel, _ in PANELS), axes.flat, strict=True)))
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.04 if fired else 0, 1, 1))
    if fired:
        listed = ", ".join(f"{name} (step {step})" for name, step in fired.items())
        fig.text(0.01, 0.01, f"diagnoses: {listed}", color="tab:red", fontsize=9)
    return fig


def _mark_diagnoses(log_history: Sequence[dict], axes: dict) -> dict[str, int]:
    from ..trainer.diagnostics import fired_from_history

    fired = fired_from_history(log_history)
    for name, step in fired.items():
        ax = axes.get(DIAGNOSIS_PANELS.get(name, ""), next(iter(axes.values())))
        ax.axvline(step, color="tab:red", linestyle="--", linewidth=1)
        ax.annotate(
            name,
            (step, 1),
            xycoords=("data", "axes fraction"),
            xytext=(2, -2),
            textcoords="offset points",
            rotation=90,
            va="top",
            fontsize=7,
            color="tab:red",
        )
    return fired


def save_log_history(log_history: Sequence[dict], path: str | Path) -> Path:
    """Write the metrics log as JSON lines (one logged step per line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for entry in log_history:
            f.write(json.dumps(entry) + "\n")
    return path
