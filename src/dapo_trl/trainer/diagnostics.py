r"""
Diagnosis of GRPO's failure modes from the metrics a run logs.

DAPO (arXiv 2503.14476, §3) exists because GRPO at scale fails in recognisable ways, each with its remedy:

| detector             | symptom in the logged metrics                                                | remedy (setting)                                 |
|----------------------|------------------------------------------------------------------------------|--------------------------------------------------|
| `entropy_collapse`   | `entropy` falls fast while `token_prob/mean` nears 1; the upper clip binding (`clip_ratio/high_mean`) names the cause | Clip-Higher: raise `epsilon_high` (§3.1); else slower updates |
| `vanishing_signal`   | few informative groups (`dynamic_sampling/informative_frac`), underfilled batches or many refill rounds; without dynamic sampling, `frac_reward_zero_std` high | `dynamic_sampling` (§3.2), its `max_rounds`, or data of matching difficulty |
| `length_explosion`   | `completions/mean_length` grows fast (correct vs incorrect lengths quoted)   | `loss_type="dapo"` (§3.3), overlong shaping (§3.4) |
| `length_collapse`    | `completions/mean_length` shrinks fast                                        | `loss_type="dapo"` (§3.3), a gentler overlong buffer |
| `truncation_growth`  | `overlong/truncated_ratio` (or TRL's `completions/clipped_ratio`) rising      | `overlong_shaping` (§3.4), `max_completion_length` |
| `reward_hacking`     | training `reward` rising while held-out accuracy (`eval_accuracy`), when evaluated, does not | check the reward; evaluate more often |

Each detector is a pure function `detector(history, thresholds, settings=None) -> Diagnosis | None` over a metric
history: the list of dicts a `Trainer` keeps in `state.log_history` (one dict per logging step, with a `step` key;
entries lacking a metric are skipped, so generation metrics logged only every few steps work). A detector looks at
the last `thresholds.window` logged values of each metric it reads and gives no verdict with fewer than
`thresholds.min_points`. A *trend* compares the mean of the first third of that window with the mean of its last third,
so one noisy point does not decide. The thresholds, all in [`DiagnosticThresholds`]:

| threshold               | default | fires when (over the window)                                                            |
|-------------------------|---------|-----------------------------------------------------------------------------------------|
| `window`, `min_points`  | 10, 4   | last 10 logged values per metric, at least 4 (with `logging_steps=10`: 100 steps)       |
| `entropy_drop`          | 0.3     | entropy fell by 30% or more of its value at the start of the window, and                |
| `token_prob_min`        | 0.9     | the latest `token_prob/mean` is at least 0.9; without `token_prob/mean` (plain GRPO):   |
| `clip_high_min`         | 0.001   | the upper clip cut at least 0.1% of tokens on average. Clip-Higher is advised only when it did |
| `informative_frac_max`  | 0.2     | at most 20% of prompt groups informative, or                                            |
| `underfilled_min`       | 0.25    | at least 25% of batches underfilled, or                                                 |
| `rounds_min`            | 3.0     | at least 3 generation rounds per batch on average; without dynamic-sampling metrics:    |
| `zero_std_frac_min`     | 0.8     | at least 80% of groups with zero reward spread (`frac_reward_zero_std`)                 |
| `length_growth`         | 0.5     | mean length grew by 50% or more (`length_explosion`)                                    |
| `length_shrink`         | 0.4     | mean length shrank by 40% or more (`length_collapse`)                                   |
| `min_length_change`     | 2.0     | ... and by at least 2 tokens either way                                                 |
| `truncation_min`        | 0.05    | at least 5% of completions truncated at the end of the window, and                      |
| `truncation_rise`       | 0.05    | that share rose by at least 5 points                                                    |
| `reward_rise_std`       | 0.5     | `reward` rose by half a batch reward std (`reward_std`) or more between the first and last of the recent evaluations, while |
| `heldout_min_gain`      | 0.0     | held-out accuracy (`heldout_keys`, default `eval_accuracy`) gained no more than this   |

[`DiagnosticsCallback`] runs the detectors at every log, writes `diagnostics/<name>` (1 while the symptom is present
in the window, else 0) into the logs, and warns once per detector with the symptom, the numbers and the setting to
change. [`DAPOTrainer`] registers it unless `diagnostics=False`; [`add_diagnostics`] adds it to any `Trainer`, e.g. a
plain `GRPOTrainer`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

History = Sequence[Mapping[str, Any]]
TRUNCATION_KEYS = ("overlong/truncated_ratio", "completions/clipped_ratio")


@dataclass(frozen=True)
class DiagnosticThresholds:
    """
    Thresholds of the detectors (see the table in `dapo_trl.trainer.diagnostics`). All windows count *logged values* of a
    metric, so they scale with `logging_steps`.

    Args:
        window (`int`, *optional*, defaults to `10`):
            Logged values of each metric a detector looks at.
        min_points (`int`, *optional*, defaults to `4`):
            Fewer values than this: no verdict. Held-out accuracy needs only 2 evaluations.
        entropy_drop (`float`, *optional*, defaults to `0.3`):
            Relative fall of `entropy` across the window that counts as a collapse.
        clip_high_min (`float`, *optional*, defaults to `0.001`):
            Mean `clip_ratio/high_mean` at which the upper clip is said to bind.
        token_prob_min (`float`, *optional*, defaults to `0.9`):
            Latest `token_prob/mean` at which sampled tokens are said to be near-certain.
        informative_frac_max (`float`, *optional*, defaults to `0.2`):
            Mean `dynamic_sampling/informative_frac` at or below which the signal is scarce.
        underfilled_min (`float`, *optional*, defaults to `0.25`):
            Mean `dynamic_sampling/underfilled` (share of underfilled batches) at or above which the signal is scarce.
        rounds_min (`float`, *optional*, defaults to `3.0`):
            Mean `dynamic_sampling/rounds` at or above which refilling is too costly.
        zero_std_frac_min (`float`, *optional*, defaults to `0.8`):
            Mean `frac_reward_zero_std` at or above which the signal is scarce (used without dynamic-sampling metrics).
        length_growth (`float`, *optional*, defaults to `0.5`):
            Relative growth of `completions/mean_length` across the window that counts as an explosion.
        length_shrink (`float`, *optional*, defaults to `0.4`):
            Relative shrinkage of `completions/mean_length` across the window that counts as a collapse.
        min_length_change (`float`, *optional*, defaults to `2.0`):
            Smallest change of the mean length, in tokens, for either length detector.
        truncation_min (`float`, *optional*, defaults to `0.05`):
            Share of truncated completions at the end of the window below which truncation is not a problem.
        truncation_rise (`float`, *optional*, defaults to `0.05`):
            Rise of that share across the window that counts as growth.
        reward_rise_std (`float`, *optional*, defaults to `0.5`):
            Rise of the training `reward` between evaluations, in units of the mean `reward_std`, that counts as a
            rising reward.
        heldout_min_gain (`float`, *optional*, defaults to `0.0`):
            Held-out accuracy gain at or below which the accuracy is said not to follow the reward.
        heldout_keys (`tuple[str, ...]`, *optional*, defaults to `("eval_accuracy",)`):
            Logged held-out accuracy metrics, the first present one is used (`DAPOTrainer` logs `eval_accuracy` when it
            evaluates and its first reward function has a `correct_reward`).
    """

    window: int = 10
    min_points: int = 4
    entropy_drop: float = 0.3
    clip_high_min: float = 0.001
    token_prob_min: float = 0.9
    informative_frac_max: float = 0.2
    underfilled_min: float = 0.25
    rounds_min: float = 3.0
    zero_std_frac_min: float = 0.8
    length_growth: float = 0.5
    length_shrink: float = 0.4
    min_length_change: float = 2.0
    truncation_min: float = 0.05
    truncation_rise: float = 0.05
    reward_rise_std: float = 0.5
    heldout_min_gain: float = 0.0
    heldout_keys: tuple[str, ...] = ("eval_accuracy",)

    def __post_init__(self):
        if self.window < 2 or not 2 <= self.min_points <= self.window:
            raise ValueError(
                f"DiagnosticThresholds needs window >= 2 and 2 <= min_points <= window, got window={self.window}, "
                f"min_points={self.min_points}."
            )
        for name in ("entropy_drop", "length_shrink"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(
                    f"DiagnosticThresholds.{name} is a relative fall in (0, 1), got {getattr(self, name)}."
                )


@dataclass(frozen=True)
class Diagnosis:
    """
    One detector's finding.

    Args:
        name (`str`): The detector, as in the `diagnostics/<name>` metric.
        step (`int`): Optimizer step of the latest logged value the finding rests on.
        symptom (`str`): What is wrong, with the numbers.
        advice (`str`): The settings to change.
        evidence (`dict[str, float]`): The numbers, by name.
    """

    name: str
    step: int
    symptom: str
    advice: str
    evidence: dict[str, float] = field(default_factory=dict)

    def message(self) -> str:
        """The warning: `'<name> at step <step>: <symptom>. <advice>'`."""
        return f"{self.name} at step {self.step}: {self.symptom}. {self.advice}".rstrip(". ") + "."

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "step": self.step,
            "symptom": self.symptom,
            "advice": self.advice,
            "evidence": dict(self.evidence),
        }


Detector = Callable[[History, DiagnosticThresholds, Any], Diagnosis | None]


# --------------------------------------------------------------------------------------------------------- history


def _number(entry: Mapping[str, Any], key: str) -> float | None:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or "step" not in entry:
        return None
    return float(value)


def metric_series(history: History, key: str) -> tuple[list[int], list[float]]:
    """Steps and values of one metric in a log history (entries without it, or with `None`/NaN, are skipped)."""
    pairs = [(int(e["step"]), v) for e in history if (v := _number(e, key)) is not None]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _recent(history: History, key: str, *, since: int) -> list[float]:
    """
    Values of a metric logged at step `since` or later, oldest first. Scans from the end (log histories are in step
    order), so a detector's cost does not grow with the length of the run.
    """
    values = []
    for entry in reversed(history):
        if entry.get("step", since) < since:
            break
        value = _number(entry, key)
        if value is not None:
            values.append(value)
    return values[::-1]


def _window(history: History, key: str, t: DiagnosticThresholds) -> tuple[list[int], list[float]]:
    """Steps and values of the last `t.window` logged values of a metric."""
    pairs = []
    for entry in reversed(history):
        value = _number(entry, key)
        if value is not None:
            pairs.append((int(entry["step"]), value))
            if len(pairs) == t.window:
                break
    pairs.reverse()
    return [s for s, _ in pairs], [v for _, v in pairs]


def _ends(values: Sequence[float]) -> tuple[float, float]:
    """Mean of the first third and of the last third of a window (at least one value each)."""
    k = max(1, len(values) // 3)
    return sum(values[:k]) / k, sum(values[-k:]) / k


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _value(settings: Any, name: str) -> Any:
    return settings.get(name) if isinstance(settings, Mapping) else getattr(settings, name, None)


def _setting(settings: Any, name: str) -> str:
    """`name`, with its current value when the run's settings are known."""
    value = _value(settings, name)
    return f"{name} (now {value})" if value is not None else name


# --------------------------------------------------------------------------------------------------------- detectors


def detect_entropy_collapse(history: History, t: DiagnosticThresholds, settings: Any = None) -> Diagnosis | None:
    """
    Entropy collapse (DAPO §3.1): `entropy` fell by `entropy_drop` or more across the window while sampled tokens became
    near-certain (latest `token_prob/mean` >= `token_prob_min`). Without `token_prob/mean` (a plain GRPOTrainer), the
    upper clip binding (mean `clip_ratio/high_mean` >= `clip_high_min`) corroborates the fall instead. Whether the
    upper clip binds decides the advice: Clip-Higher when it does, otherwise slower updates (the clip is not the cause).
    """
    steps, entropy = _window(history, "entropy", t)
    if len(entropy) < t.min_points:
        return None
    start, end = _ends(entropy)
    if start <= 0 or (start - end) / start < t.entropy_drop:
        return None
    evidence = {"entropy_start": start, "entropy_end": end}
    clip = _recent(history, "clip_ratio/high_mean", since=steps[0])
    prob = _recent(history, "token_prob/mean", since=steps[0])
    binds = bool(clip) and _mean(clip) >= t.clip_high_min
    if clip:
        evidence["clip_ratio_high"] = _mean(clip)
    if prob:
        evidence["token_prob"] = prob[-1]
    if (prob and prob[-1] < t.token_prob_min) or (not prob and not binds):
        return None
    symptom = (
        f"token entropy fell {start:.3g} -> {end:.3g} ({(end - start) / start:+.0%}) over steps {steps[0]}-{steps[-1]}"
    )
    if prob:
        symptom += f"; sampled tokens have mean probability {prob[-1]:.3f} (token_prob/mean)"
    if clip:
        symptom += f"; the upper clip cut {_mean(clip):.2%} of tokens (clip_ratio/high_mean)"
    if binds:
        advice = (
            f"Raise {_setting(settings, 'epsilon_high')} (Clip-Higher, DAPO §3.1: epsilon=0.2, epsilon_high=0.28) so "
            "that unlikely tokens can still gain probability; fewer updates per rollout (steps_per_generation, "
            "num_iterations) or a lower learning_rate also slow the collapse"
        )
    else:
        advice = (
            "The upper clip barely binds, so Clip-Higher alone will not stop it: lower "
            f"{_setting(settings, 'learning_rate')}, make fewer updates per rollout (steps_per_generation, "
            "num_iterations), add an entropy bonus (entropy_coef), or check the reward for a degenerate optimum"
        )
    return Diagnosis("entropy_collapse", steps[-1], symptom, advice, evidence)


def detect_vanishing_signal(history: History, t: DiagnosticThresholds, settings: Any = None) -> Diagnosis | None:
    """
    Vanishing gradient signal (DAPO §3.2): most prompt groups have a constant reward, so zero advantage. With
    dynamic-sampling metrics: mean `informative_frac` <= `informative_frac_max`, mean `underfilled` >=
    `underfilled_min` or mean `rounds` >= `rounds_min`. Without them (plain GRPO): mean `frac_reward_zero_std` >=
    `zero_std_frac_min`.
    """
    steps, informative = _window(history, "dynamic_sampling/informative_frac", t)
    if len(informative) >= t.min_points:
        means = {"informative_frac": _mean(informative)}
        for name in ("underfilled", "rounds", "all_correct_frac", "all_wrong_frac"):
            values = _recent(history, f"dynamic_sampling/{name}", since=steps[0])
            if values:
                means[name] = _mean(values)
        scarce = means["informative_frac"] <= t.informative_frac_max
        underfilled = means.get("underfilled", 0.0) >= t.underfilled_min
        costly = means.get("rounds", 0.0) >= t.rounds_min
        if not (scarce or underfilled or costly):
            return None
        symptom = (
            f"only {means['informative_frac']:.0%} of prompt groups carried a learning signal over steps "
            f"{steps[0]}-{steps[-1]} ({means.get('rounds', math.nan):.2g} generation rounds per batch, "
            f"{means.get('underfilled', 0.0):.0%} of batches underfilled)"
        )
        advice = _data_advice(means, settings)
        if underfilled and means["informative_frac"] > 0:  # with none informative, more rounds find none either
            advice += f"; or raise {_setting(settings, 'dynamic_sampling_max_rounds')} to fill the batches"
        return Diagnosis("vanishing_signal", steps[-1], symptom, advice, means)

    steps, zero_std = _window(history, "frac_reward_zero_std", t)
    if len(zero_std) < t.min_points or _mean(zero_std) < t.zero_std_frac_min:
        return None
    symptom = (
        f"{_mean(zero_std):.0%} of prompt groups had the same reward for every completion over steps "
        f"{steps[0]}-{steps[-1]} (frac_reward_zero_std): their advantage is zero and they carry no gradient"
    )
    advice = (
        "Turn on dynamic_sampling (DAPO §3.2, DAPOTrainer) to train only on informative groups, or match the data's "
        "difficulty to the model"
    )
    return Diagnosis("vanishing_signal", steps[-1], symptom, advice, {"frac_reward_zero_std": _mean(zero_std)})


def _data_advice(means: Mapping[str, float], settings: Any) -> str:
    correct, wrong = means.get("all_correct_frac"), means.get("all_wrong_frac")
    steps = []
    if correct is not None and wrong is not None and correct != wrong:
        which = "all correct (too easy)" if correct > wrong else "all wrong (too hard)"
        steps.append(f"{max(correct, wrong):.0%} of the groups were {which}")
    if not _value(settings, "dynamic_sampling_skip"):
        steps.append(
            "turn on dynamic_sampling_skip to pass over prompts whose recent groups were all correct or all wrong"
        )
    steps.append("match the data's difficulty to the model, or raise num_generations")
    text = "; ".join(steps)
    return text[0].upper() + text[1:]


def _length_trend(history: History, t: DiagnosticThresholds) -> dict[str, Any] | None:
    steps, lengths = _window(history, "completions/mean_length", t)
    if len(lengths) < t.min_points:
        return None
    start, end = _ends(lengths)
    trend = {"steps": steps, "length_start": start, "length_end": end}
    for outcome in ("correct", "incorrect"):
        values = _recent(history, f"completions/{outcome}_mean_length", since=steps[0])
        if len(values) >= 2:
            trend[f"{outcome}_start"], trend[f"{outcome}_end"] = _ends(values)
    return trend


def _length_symptom(trend: Mapping[str, Any]) -> str:
    start, end, steps = trend["length_start"], trend["length_end"], trend["steps"]
    text = f"mean completion length went {start:.3g} -> {end:.3g} tokens ({(end - start) / start:+.0%}) over steps "
    text += f"{steps[0]}-{steps[-1]}"
    parts = [
        f"{outcome} {trend[f'{outcome}_start']:.3g} -> {trend[f'{outcome}_end']:.3g}"
        for outcome in ("correct", "incorrect")
        if f"{outcome}_start" in trend
    ]
    return text + (f" ({', '.join(parts)})" if parts else "")


def _evidence(trend: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in trend.items() if k != "steps"}


def _length_advice(settings: Any, *, explosion: bool) -> str:
    steps = []
    if _value(settings, "loss_type") != "dapo":
        why = (
            "long degenerate completions are then penalised per token"
            if explosion
            else "a per-sequence loss favours short answers"
        )
        steps.append(f"use the token-level loss, loss_type='dapo' (DAPO §3.3: {why})")
    if explosion:
        if _value(settings, "overlong_shaping") is False:
            steps.append("turn on overlong_shaping (DAPO §3.4)")
        else:
            steps.append(f"penalise length earlier: widen {_setting(settings, 'overlong_buffer_len')} (DAPO §3.4)")
        steps.append("check the reward for a bias towards long completions")
    else:
        if _value(settings, "overlong_shaping"):
            steps.append(
                f"make the length penalty gentler ({_setting(settings, 'overlong_buffer_len')}, "
                f"{_setting(settings, 'overlong_penalty_factor')})"
            )
        steps.append(f"lower {_setting(settings, 'learning_rate')}")
        steps.append("check the reward for a bias towards short completions")
    text = "; ".join(steps)
    return text[0].upper() + text[1:]


def detect_length_explosion(history: History, t: DiagnosticThresholds, settings: Any = None) -> Diagnosis | None:
    """
    Length explosion (DAPO §3.3-3.4): `completions/mean_length` grew by `length_growth` or more (and at least
    `min_length_change` tokens) across the window. Correct and incorrect lengths are quoted when logged.
    """
    trend = _length_trend(history, t)
    if trend is None:
        return None
    start, end = trend["length_start"], trend["length_end"]
    if start <= 0 or end - start < max(t.min_length_change, t.length_growth * start):
        return None
    advice = _length_advice(settings, explosion=True)
    return Diagnosis("length_explosion", trend["steps"][-1], _length_symptom(trend), advice, _evidence(trend))


def detect_length_collapse(history: History, t: DiagnosticThresholds, settings: Any = None) -> Diagnosis | None:
    """
    Length collapse: `completions/mean_length` shrank by `length_shrink` or more (and at least `min_length_change`
    tokens) across the window, e.g. long reasoning suppressed by a sample-level loss or a harsh length penalty.
    """
    trend = _length_trend(history, t)
    if trend is None:
        return None
    start, end = trend["length_start"], trend["length_end"]
    if start <= 0 or start - end < max(t.min_length_change, t.length_shrink * start):
        return None
    advice = _length_advice(settings, explosion=False)
    return Diagnosis("length_collapse", trend["steps"][-1], _length_symptom(trend), advice, _evidence(trend))


def detect_truncation_growth(history: History, t: DiagnosticThresholds, settings: Any = None) -> Diagnosis | None:
    """
    Truncation growth (DAPO §3.4): the share of completions cut off at `max_completion_length`
    (`overlong/truncated_ratio`, else TRL's `completions/clipped_ratio`) reached `truncation_min` and rose by
    `truncation_rise` or more across the window.
    """
    for key in TRUNCATION_KEYS:
        steps, ratio = _window(history, key, t)
        if len(ratio) >= t.min_points:
            break
    else:
        return None
    start, end = _ends(ratio)
    if end < t.truncation_min or end - start < t.truncation_rise:
        return None
    symptom = f"truncated completions rose {start:.1%} -> {end:.1%} over steps {steps[0]}-{steps[-1]} ({key})"
    first = (
        "turn on overlong_shaping"
        if _value(settings, "overlong_shaping") is False
        else f"widen {_setting(settings, 'overlong_buffer_len')}"
    )
    advice = (
        f"Penalise length before the cut: {first} (DAPO §3.4); raise {_setting(settings, 'max_completion_length')} "
        "if answers need the room; or mask truncated completions out of the loss (mask_truncated_completions=True)"
    )
    return Diagnosis("truncation_growth", steps[-1], symptom, advice, {"truncated_start": start, "truncated_end": end})


def detect_reward_hacking(history: History, t: DiagnosticThresholds, settings: Any = None) -> Diagnosis | None:
    """
    Reward hacking hint: between the first and the last of the recent held-out evaluations (the last `window` values of
    the first present `heldout_keys` metric, at least 2), the training `reward` rose by `reward_rise_std` mean
    `reward_std` or more while held-out accuracy gained `heldout_min_gain` or less. Silent without evaluations.
    """
    for key in t.heldout_keys:
        eval_steps, accuracy = _window(history, key, t)
        if len(accuracy) >= 2:
            break
    else:
        return None
    first, last = eval_steps[0], eval_steps[-1]
    rewards = list(zip(*metric_series(history, "reward")))
    before = [(s, v) for s, v in rewards if s <= first][-3:]
    after = [v for s, v in rewards if first < s <= last][-3:]
    if not before or not after:
        return None
    gain = _mean(after) - _mean([v for _, v in before])
    spread = [v for s, v in zip(*metric_series(history, "reward_std")) if before[0][0] <= s <= last]
    scale = _mean(spread) if spread and _mean(spread) > 0 else 1.0
    heldout_gain = accuracy[-1] - accuracy[0]
    if gain < t.reward_rise_std * scale or heldout_gain > t.heldout_min_gain:
        return None
    symptom = (
        f"training reward rose {gain:+.3g} (to {_mean(after):.3g}) between steps {first} and {last} while "
        f"held-out accuracy went {accuracy[0]:.3g} -> {accuracy[-1]:.3g} ({key})"
    )
    advice = (
        "Read some completions (log_completions=True): the policy may be exploiting the reward (format, length, an "
        "answer-extraction loophole) rather than solving the task; tighten the reward or weight it "
        "(reward_weights) towards correctness"
    )
    evidence = {
        "reward_gain": gain,
        "reward_end": _mean(after),
        "heldout_start": accuracy[0],
        "heldout_end": accuracy[-1],
    }
    return Diagnosis("reward_hacking", last, symptom, advice, evidence)


DETECTORS: dict[str, Detector] = {
    "entropy_collapse": detect_entropy_collapse,
    "vanishing_signal": detect_vanishing_signal,
    "length_explosion": detect_length_explosion,
    "length_collapse": detect_length_collapse,
    "truncation_growth": detect_truncation_growth,
    "reward_hacking": detect_reward_hacking,
}


def diagnose(
    history: History,
    thresholds: DiagnosticThresholds | None = None,
    settings: Any = None,
    *,
    detectors: Mapping[str, Detector] | None = None,
) -> dict[str, Diagnosis | None]:
    """
    Run every detector on a log history.

    Args:
        history (`Sequence[Mapping[str, Any]]`):
            Logged metrics, e.g. `trainer.state.log_history` or the lines of a run's `metrics.jsonl`.
        thresholds ([`DiagnosticThresholds`], *optional*):
            Defaults to `DiagnosticThresholds()`.
        settings (`Any`, *optional*):
            The run's config (a `GRPOConfig` or a mapping), read only to quote current values in the advice.
        detectors (`Mapping[str, Callable]`, *optional*):
            Defaults to [`DETECTORS`].

    Returns:
        `dict[str, Diagnosis | None]`: each detector's finding, `None` when it did not fire.

    Example:
    ```python
    >>> history = [{"step": s, "completions/mean_length": 10.0 + 4 * s} for s in range(1, 11)]
    >>> found = diagnose(history)
    >>> found["length_explosion"].symptom
    'mean completion length went 18 -> 46 tokens (+156%) over steps 1-10'
    >>> found["entropy_collapse"] is None
    True

    ```
    """
    thresholds = thresholds or DiagnosticThresholds()
    return {name: detect(history, thresholds, settings) for name, detect in (detectors or DETECTORS).items()}


# --------------------------------------------------------------------------------------------------------- callback


class DiagnosticsCallback(TrainerCallback):
    """
    Watches the logged metrics of a run and diagnoses GRPO's failure modes while it trains.

    At every log it runs the detectors on the recent log history, adds `diagnostics/<name>` to the logged values
    (1 while the detector's symptom is present, else 0) and, the first time a detector fires, logs a warning naming
    the symptom, the numbers and the setting to change. Works with any `Trainer` whose metrics carry the names in
    `dapo_trl.trainer.diagnostics` (GRPOTrainer, DAPOTrainer). Register it with [`add_diagnostics`] so that it runs before the
    reporting integrations (Weights & Biases, TensorBoard, ...) and they receive the `diagnostics/*` values too; passed
    in `callbacks=[...]` it runs after them, and the values reach `state.log_history` and the console only.

    Args:
        thresholds ([`DiagnosticThresholds`], *optional*):
            Defaults to `DiagnosticThresholds()`.
        detectors (`Mapping[str, Callable]`, *optional*):
            Name -> detector (see [`diagnose`]). Defaults to all of [`DETECTORS`].
        history_limit (`int`, *optional*, defaults to `2000`):
            Most recent log entries handed to the detectors, which bounds the cost of a log on long runs.

    Attributes:
        diagnoses (`dict[str, Diagnosis]`): The first finding of each detector that fired, by name.
    """

    def __init__(
        self,
        thresholds: DiagnosticThresholds | None = None,
        *,
        detectors: Mapping[str, Detector] | None = None,
        history_limit: int = 2000,
    ):
        if history_limit < 1:
            raise ValueError(f"history_limit must be positive, got {history_limit}.")
        self.thresholds = thresholds or DiagnosticThresholds()
        self.detectors = dict(detectors or DETECTORS)
        self.history_limit = history_limit
        self.diagnoses: dict[str, Diagnosis] = {}

    def on_train_begin(self, args, state, control, **kwargs):
        # A resumed run: what fired before the checkpoint is not announced again.
        for name, step in fired_from_history(state.log_history).items():
            if name in self.detectors and name not in self.diagnoses:
                self.diagnoses[name] = Diagnosis(name, step, "fired before the run was resumed", "")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "train_runtime" in logs:  # the end-of-training summary entry
            return
        found = diagnose(state.log_history[-self.history_limit :], self.thresholds, args, detectors=self.detectors)
        flags = {f"diagnostics/{name}": float(d is not None) for name, d in found.items()}
        for name, diagnosis in found.items():
            if diagnosis is not None and name not in self.diagnoses:
                self.diagnoses[name] = diagnosis
                if state.is_world_process_zero:
                    logger.warning(f"Diagnosis: {diagnosis.message()}")
        logs.update(flags)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(flags)  # Trainer.log appended this entry just before calling on_log


def add_diagnostics(trainer, callback: DiagnosticsCallback | None = None) -> DiagnosticsCallback:
    """
    Register a [`DiagnosticsCallback`] on `trainer` (any `transformers.Trainer`, e.g. a `GRPOTrainer`) ahead of its
    other callbacks, so that reporting integrations log `diagnostics/*` too. If the trainer already holds one, it is
    moved first and returned instead of adding a second.

    Example:
    ```python
    trainer = GRPOTrainer(model=..., reward_funcs=..., args=..., train_dataset=...)
    add_diagnostics(trainer)
    trainer.train()
    ```
    """
    callbacks = trainer.callback_handler.callbacks
    existing = next((c for c in callbacks if isinstance(c, DiagnosticsCallback)), None)
    callback = existing or callback or DiagnosticsCallback()
    if callback in callbacks:
        callbacks.remove(callback)
    callbacks.insert(0, callback)
    return callback


def fired_from_history(history: History) -> dict[str, int]:
    """First step at which each `diagnostics/<name>` metric of a log history was 1, by name (in firing order)."""
    first: dict[str, int] = {}
    for entry in history:
        for key, value in entry.items():
            if key.startswith("diagnostics/") and value == 1 and key[12:] not in first and "step" in entry:
                first[key[12:]] = int(entry["step"])
    return dict(sorted(first.items(), key=lambda item: item[1]))


def fired_diagnoses(trainer) -> list[Diagnosis]:
    """
    What fired during a trainer's run, in step order: the findings of its [`DiagnosticsCallback`] when it has one,
    else the `diagnostics/*` flags of its log history (name and step only).
    """
    callback = next((c for c in trainer.callback_handler.callbacks if isinstance(c, DiagnosticsCallback)), None)
    if callback is not None:
        return sorted(callback.diagnoses.values(), key=lambda d: d.step)
    return [Diagnosis(name, step, "", "") for name, step in fired_from_history(trainer.state.log_history).items()]
