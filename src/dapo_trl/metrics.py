"""Merging per-call metrics of several generation calls into one value per optimizer batch, weighted by rows.

TRL appends one value per `_generate_and_score_completions` call to most of its metrics, and averages the list with
equal weights when it logs. With dynamic sampling one generation batch takes several calls (refill rounds, and rounds
split into calls of at most one generation batch), so a small refill round would weigh as much as the big first one.
DAPOTrainer replaces the values a batch's calls appended by one value computed over all the rows those calls generated:

- statistics it can compute exactly from the rows (the rewards, their spread, accuracy) are recomputed from them;
- TRL's completion-length statistics are merged exactly from per-call values with [`merge_completion_metrics`];
- every other metric is merged by [`merge_metric`]: minimum for names ending in `min`, maximum for names ending in
  `max`, otherwise the mean weighted by each call's number of rows (exact for any per-row mean).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _finite(values: Sequence[float], weights: Sequence[float]) -> list[tuple[float, float]]:
    return [(v, w) for v, w in zip(values, weights, strict=True) if v is not None and not math.isnan(v)]


def merge_metric(name: str, values: Sequence[float], weights: Sequence[float]) -> float:
    """
    One value for metric `name` from the values of several calls and each call's weight (its number of rows).

    Example:
    ```python
    >>> merge_metric("reward", [1.0, 0.0], [3, 1]), merge_metric("clip_ratio/low_min", [0.2, 0.1], [3, 1])
    (0.75, 0.1)

    ```
    """
    pairs = _finite(values, weights)
    if not pairs:
        return math.nan
    leaf = name.rsplit("/", 1)[-1]
    if leaf.endswith("min"):
        return min(v for v, _ in pairs)
    if leaf.endswith("max"):
        return max(v for v, _ in pairs)
    total = sum(w for _, w in pairs)
    if total <= 0:
        return sum(v for v, _ in pairs) / len(pairs)
    return sum(v * w for v, w in pairs) / total


def merge_completion_metrics(per_call: dict[str, Sequence[float]], rows: Sequence[int]) -> dict[str, float]:
    """
    TRL's `completions/*` length metrics over the union of several calls, exactly.

    Terminated-length statistics are weighted by each call's number of terminated rows,
    `rows * (1 - clipped_ratio)`, and calls without terminated rows (for which TRL logs 0) are left out; when no call
    has one, the value is 0 as in TRL.
    """
    out: dict[str, float] = {}
    clipped = per_call.get("completions/clipped_ratio")
    terminated = [r * (1 - c) for r, c in zip(rows, clipped, strict=True)] if clipped is not None else None
    for name, values in per_call.items():
        if "terminated" in name and terminated is not None:
            kept = [(v, w) for v, w in zip(values, terminated, strict=True) if w > 0.5]
            out[name] = merge_metric(name, [v for v, _ in kept], [w for _, w in kept]) if kept else 0.0
        else:
            out[name] = merge_metric(name, values, rows)
    return out
