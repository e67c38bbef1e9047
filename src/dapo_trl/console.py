"""A readable console for training runs: the progress bar carries a few numbers instead of a metrics dict per log."""

from __future__ import annotations

from typing import Any

from transformers.trainer_callback import ProgressCallback

# (logged metric, short label on the bar)
BAR_METRICS: tuple[tuple[str, str], ...] = (
    ("reward", "reward"),
    ("accuracy", "acc"),
    ("dynamic_sampling/informative_frac", "informative"),
    ("entropy", "entropy"),
    ("completions/mean_length", "len"),
)


class ConciseProgressCallback(ProgressCallback):
    """
    transformers' progress bar, with the latest values of [`BAR_METRICS`] as its postfix instead of a printed dict of
    every metric at each logging step. Nothing is lost: the trainer's `state.log_history` (written to
    `metrics.jsonl` by `examples/train_math.py`) holds every metric.

    Replace the default bar with it: `trainer.remove_callback(ProgressCallback)`,
    `trainer.add_callback(ConciseProgressCallback())`.
    """

    def __init__(self, metrics: tuple[tuple[str, str], ...] = BAR_METRICS) -> None:
        super().__init__()
        self.metrics = metrics
        self.latest: dict[str, str] = {}

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or self.training_bar is None or not logs:
            return
        for key, label in self.metrics:
            value = logs.get(key)
            if isinstance(value, int | float):
                self.latest[label] = f"{value:.3g}"
        if self.latest:
            self.training_bar.set_postfix(self.latest, refresh=False)
