"""A readable console for training runs: a progress bar carrying a few numbers instead of a metrics dict per log, and a
one-screen end-of-run summary."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from transformers.trainer_callback import ProgressCallback, TrainerCallback

logger = logging.getLogger(__name__)

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


# (logged metric, label) of the summary's "last logged" line
SUMMARY_METRICS: tuple[tuple[str, str], ...] = (
    ("dynamic_sampling/informative_frac", "informative groups"),
    ("dynamic_sampling/rounds", "rounds per step"),
    ("entropy", "entropy"),
    ("clip_ratio/high_mean", "high-clipped"),
    ("completions/mean_length", "mean length"),
)


def format_summary(title: str, rows: list[tuple[str, str]], log_history: list[dict[str, Any]], width: int = 72) -> str:
    """
    The end-of-run summary: `title`, the `(name, value)` rows, then the last logged value of each of
    [`SUMMARY_METRICS`] found in `log_history` (a Trainer's `state.log_history`). Values start in one column, at least
    two spaces after the longest name.

    Example:
    ```python
    >>> print(format_summary("run", [("optimizer steps", "2"), ("mean_completion_chars", "21.0")], [], width=30))
    <BLANKLINE>
    ==============================
    run
    ------------------------------
    optimizer steps        2
    mean_completion_chars  21.0
    ==============================

    ```
    """
    last = {key: value for entry in log_history for key, value in entry.items() if value is not None}
    logged = [f"{label} {last[key]:.3g}" for key, label in SUMMARY_METRICS if isinstance(last.get(key), int | float)]
    if logged:
        rows = [*rows, ("last logged", " | ".join(logged))]
    underfilled = max((e.get("dynamic_sampling/underfilled_steps") or 0 for e in log_history), default=0)
    if underfilled:
        rows = [*rows, ("underfilled steps", f"{underfilled:.0f} (warned once; dynamic_sampling/underfilled_steps)")]
    column = max([20, *(len(name) + 2 for name, _ in rows)])
    lines = ["", "=" * width, title, "-" * width, *(f"{name:<{column}}{value}" for name, value in rows), "=" * width]
    return "\n".join(lines)


class DefaultsNoticeCallback(TrainerCallback):
    """
    When training starts, logs once on the main process which DAPOConfig defaults that differ from GRPOConfig's the
    run is using ([`~dapo_trl.dapo_config.defaults_notice`]): after `from dapo_trl import DAPOConfig as GRPOConfig`
    a script's batch, warm-up and clipping change without a line of it changing.
    """

    def __init__(self) -> None:
        self.shown = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from ..dapo_config import defaults_notice

        if self.shown or not state.is_world_process_zero:
            return
        self.shown = True
        notice = defaults_notice(args)
        if notice:
            logger.warning(notice)


def training_signal(log_history: list[dict[str, Any]]) -> str:
    """
    One line saying whether training moved the model: how many logged steps had informative groups (some reward
    spread within a group: `dynamic_sampling/informative_frac`, else TRL's `frac_reward_zero_std`) and the largest
    gradient norm. With no informative group, a zero gradient or a learning rate of 0 at every logged step the policy
    never changed, whatever else the run printed.

    Example:
    ```python
    >>> training_signal([{"dynamic_sampling/informative_frac": 0.25, "grad_norm": 1.5}, {"grad_norm": 0.5}])
    'training signal: informative groups in 1 of 1 generation steps, max grad norm 1.5: training works'

    ```
    """
    steps = informative = 0
    for entry in log_history:
        frac = entry.get("dynamic_sampling/informative_frac")
        if frac is None and entry.get("frac_reward_zero_std") is not None:
            frac = 1 - entry["frac_reward_zero_std"]
        if isinstance(frac, int | float) and frac == frac:  # NaN: a step trained on carried groups only
            steps += 1
            informative += frac > 0
    norms = [e["grad_norm"] for e in log_history if isinstance(e.get("grad_norm"), int | float)]
    norm = max(norms, default=0.0)
    rates = [e["learning_rate"] for e in log_history if isinstance(e.get("learning_rate"), int | float)]
    counted = f"informative groups in {informative} of {steps} generation steps, max grad norm {norm:.3g}"
    if rates and max(rates) == 0:  # a gradient times a zero step size moves nothing
        return (
            f"training signal: {counted}, learning rate 0 at all {len(rates)} logged steps: NOTHING WAS LEARNED (the "
            "optimizer never moved the weights); set learning_rate above 0, and check lr_scheduler_type and "
            "warmup_steps against max_steps"
        )
    if informative and norm > 0:
        return f"training signal: {counted}: training works"
    return (
        f"training signal: {counted}: NOTHING WAS LEARNED (every group's samples were all right or all wrong, so "
        "every advantage was 0); use data closer to the model's level, or warm the model up first"
    )


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """
    Only errors from transformers and dapo_trl inside the block (a benchmark whose runs warn by design, e.g. underfilled
    batches of an untrained model), with both levels restored after it, so that a caller in the same process keeps its
    warnings.
    """
    from transformers.utils import logging as hf_logging

    ours = logging.getLogger("dapo_trl")
    hf_level, our_level = hf_logging.get_verbosity(), ours.level
    hf_logging.set_verbosity_error()
    ours.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hf_logging.set_verbosity(hf_level)
        ours.setLevel(our_level)
