"""Merging per-call metrics of several generation calls into one value per optimizer batch, weighted by rows.

TRL appends one value per `_generate_and_score_completions` call to most of its metrics, and averages the list with
equal weights when it logs. With dynamic sampling one generation batch takes several calls (refill rounds, and rounds
split into calls of at most one generation batch), so a small refill round would weigh as much as the big first one.
DAPOTrainer replaces the values a batch's calls appended by one value computed over all the rows those calls generated:

- statistics it can compute exactly from the rows (the rewards, their spread, accuracy) are recomputed from them;
- TRL's `completions/*` and `tools/*` statistics are merged exactly from per-call values with
  [`merge_completion_metrics`] (what one call over all the rows would log);
- every other metric is merged by [`merge_metric`]: minimum for names whose last part starts with `min_` or ends in
  `min`, maximum likewise for `max`, otherwise the mean weighted by each call's number of rows (exact for any per-row
  mean).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _finite(values: Sequence[float], weights: Sequence[float]) -> list[tuple[float, float]]:
    return [(v, w) for v, w in zip(values, weights, strict=True) if v is not None and not math.isnan(v)]


def _extremum(name: str):
    """`min` or `max` for a metric that is one (`clip_ratio/low_min`, `completions/max_length`), else `None`."""
    leaf = name.rsplit("/", 1)[-1]
    for word, reduce in (("min", min), ("max", max)):
        if leaf == word or leaf.endswith(f"_{word}") or leaf.startswith(f"{word}_"):
            return reduce
    return None


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
    reduce = _extremum(name)
    if reduce is not None:
        return reduce(v for v, _ in pairs)
    total = sum(w for _, w in pairs)
    if total <= 0:
        return sum(v for v, _ in pairs) / len(pairs)
    return sum(v * w for v, w in pairs) / total


def merge_completion_metrics(per_call: dict[str, Sequence[float]], rows: Sequence[int]) -> dict[str, float]:
    """
    TRL's `completions/*` and `tools/*` metrics over the union of several calls, exactly.

    Each call logged its statistics over its own rows; the union's value is:

    - `min_*` / `max_*`: the minimum / maximum over calls;
    - terminated-length statistics: over the calls with terminated rows only (a call without any logs 0), means
      weighted by each call's number of terminated rows `rows * (1 - clipped_ratio)`; 0 when no call has one, as TRL;
    - `tools/failure_frequency` (failures per tool call): weighted by each call's number of tool calls,
      `rows * tools/call_frequency`; 0 when no call made one, as TRL;
    - every other key (means and ratios per row): weighted by each call's number of rows.

    Example:
    ```python
    >>> merge_completion_metrics({"completions/min_length": [3.0, 10.0], "completions/mean_length": [4.0, 10.0]}, [2, 6])
    {'completions/min_length': 3.0, 'completions/mean_length': 8.5}

    ```
    """
    out: dict[str, float] = {}
    clipped = per_call.get("completions/clipped_ratio")
    terminated = [r * (1 - c) for r, c in zip(rows, clipped, strict=True)] if clipped is not None else None
    frequency = per_call.get("tools/call_frequency")
    tool_calls = [r * f for r, f in zip(rows, frequency, strict=True)] if frequency is not None else None
    for name, values in per_call.items():
        if "terminated" in name and terminated is not None:
            weights = terminated
        elif name == "tools/failure_frequency" and tool_calls is not None:
            weights = tool_calls
        else:
            out[name] = merge_metric(name, values, rows)
            continue
        # Calls with no terminated row (no tool call) logged a placeholder 0, not a statistic: leave them out.
        kept = [(v, w) for v, w in zip(values, weights, strict=True) if w > 0.5]
        out[name] = merge_metric(name, [v for v, _ in kept], [w for _, w in kept]) if kept else 0.0
    return out
