"""DAPOConfig refuses non-finite or out-of-range floats and wrong Python types, naming the setting (issue 18, classes 1
and 8); YAML and command-line loading through TrlParser keeps working."""

from __future__ import annotations

import dataclasses
import math
import types
import typing

import numpy as np
import pytest
from trl import TrlParser

from dapo_trl.dapo_config import DAPOConfig

NAN, INF = float("nan"), float("inf")
SIMPLE = (bool, int, float, str, type(None))


def make(**kwargs) -> DAPOConfig:
    base = dict(output_dir="/tmp/dapo-validation-test", use_cpu=True, bf16=False, report_to="none")
    base.update(kwargs)
    return DAPOConfig(**base)


def simple_field_types() -> dict[str, tuple[type, ...]]:
    """Init fields of DAPOConfig annotated only with bool / int / float / str / None, read from the annotations."""
    hints = typing.get_type_hints(DAPOConfig)
    out = {}
    for field in dataclasses.fields(DAPOConfig):
        annotation = hints[field.name]
        is_union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        members = typing.get_args(annotation) if is_union else (annotation,)
        if field.init and all(m in SIMPLE for m in members):
            out[field.name] = members
    return out


FLOAT_FIELDS = sorted(name for name, members in simple_field_types().items() if float in members)


# ---------------------------------------------------------------------------------------------------- class 1: floats


@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(
    "name",
    [
        "epsilon",
        "epsilon_high",
        "delta",
        "beta",
        "temperature",
        "top_p",
        "learning_rate",
        "dynamic_sampling_tolerance",
        "dynamic_sampling_margin",
        "overlong_penalty_factor",
    ],
)
def test_non_finite_float_settings_are_refused_by_name(name, value):
    with pytest.raises(ValueError, match=rf"^{name} must be a finite number, got {value!r}"):
        make(**{name: value})


def test_every_float_setting_is_checked_finite():
    """Every float-annotated setting, TRL's and transformers' included (so new ones are covered when they appear)."""
    assert len(FLOAT_FIELDS) > 40  # the annotations were read, not an empty list
    unchecked = []
    for name in FLOAT_FIELDS:
        try:
            make(**{name: NAN})
        except ValueError as err:
            assert str(err).startswith(f"{name} must be a finite number"), (name, str(err))
        else:
            unchecked.append(name)
    assert not unchecked


@pytest.mark.parametrize(
    "name,value,words",
    [
        ("temperature", 0.0, "positive"),
        ("top_p", 0.0, "positive and at most 1"),
        ("top_p", 1.5, "positive and at most 1"),
        ("min_p", 2.0, "non-negative and at most 1"),
        ("beta", -0.1, "non-negative"),
        ("learning_rate", -1e-6, "non-negative"),
        ("weight_decay", -0.01, "non-negative"),
        ("adam_beta2", 1.0, "non-negative and below 1"),
        ("max_grad_norm", -1.0, "non-negative"),
        ("delta", 0.5, "> 1"),
        ("label_smoothing_factor", 1.5, "non-negative and at most 1"),
        ("vllm_gpu_memory_utilization", 0.0, "positive and at most 1"),
        ("repetition_penalty", 0.0, "positive"),
        ("top_entropy_quantile", 1.2, "non-negative and at most 1"),
        ("vllm_importance_sampling_clip_max", -3.0, "positive"),
    ],
)
def test_out_of_range_float_settings_are_refused_by_name(name, value, words):
    with pytest.raises(ValueError, match=rf"^{name} must be {words}\b.*got {value!r}"):
        make(**{name: value})


def test_reward_weights_must_be_finite_numbers():
    with pytest.raises(ValueError, match=r"^reward_weights\[1\] must be a finite number, got nan"):
        make(reward_weights=[1.0, NAN])
    with pytest.raises(TypeError, match=r"^reward_weights\[0\] must be a float, got the str '1'"):
        make(reward_weights=["1", 0.5])
    assert make(reward_weights=[1, 0.5]).reward_weights == [1, 0.5]


def test_edges_of_the_ranges_are_accepted():
    cfg = make(
        top_p=1.0,
        min_p=0.0,
        beta=0.0,
        learning_rate=0,
        epsilon=0.0,
        epsilon_high=None,
        delta=None,
        dynamic_sampling_tolerance=0.0,
        overlong_penalty_factor=0.0,
        max_grad_norm=0.0,
        temperature=1e-3,
    )
    assert cfg.top_p == 1.0 and cfg.delta is None and cfg.temperature == 1e-3


def test_non_finite_value_from_the_command_line_is_refused_by_name(tmp_path):
    parser = TrlParser((DAPOConfig,))
    with pytest.raises(ValueError, match=r"^epsilon must be a finite number, got nan"):
        parser.parse_args_and_config(
            ["--output_dir", str(tmp_path), "--use_cpu", "--bf16", "false", "--epsilon", "nan"]
        )


def test_interval_and_check_float_helpers():
    from dapo_trl._validate import Interval, check_float

    assert 0.0 in Interval(low=0) and 0.0 not in Interval(low=0, low_open=True)
    assert 1.0 in Interval(low=0, high=1) and 1.0 not in Interval(low=0, high=1, high_open=True)
    assert Interval().describe() == "any finite number"
    check_float("x", 3.0, Interval(low=1, high=3))  # inside: no error
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="^x must be a finite number"):
            check_float("x", bad, Interval(low=0))


# ----------------------------------------------------------------------------------------------- class 8: Python types


@pytest.mark.parametrize(
    "name,value,expected",
    [
        ("dynamic_sampling", "False", "a bool"),
        ("dynamic_sampling_carry_over", "yes", "a bool or None"),
        ("overlong_shaping", 1, "a bool"),
        ("mask_truncated_completions", "true", "a bool"),
        ("learning_rate", "1e-6", "a float"),
        ("epsilon", "0.2", "a float"),
        ("epsilon_high", True, "a float or None"),
        ("dynamic_sampling_max_rounds", 2.0, "an int"),
        ("max_steps", "10", "an int"),
        ("num_generations", True, "an int or None"),
        ("dynamic_sampling_reward", 1, "a str or None"),
        ("dynamic_sampling_round_sizing", None, "a str"),
    ],
)
def test_wrong_python_types_are_refused_by_name(name, value, expected):
    with pytest.raises(TypeError, match=rf"^{name} must be {expected}, got the {type(value).__name__} {value!r}"):
        make(**{name: value})


def test_a_string_for_a_bool_says_what_to_pass():
    with pytest.raises(TypeError, match=r"A non-empty string is true: pass False, not 'False'"):
        make(dynamic_sampling="False")
    with pytest.raises(TypeError, match=r"Pass the number 1e-06, not the string '1e-6'"):
        make(learning_rate="1e-6")


def test_every_typed_setting_refuses_a_wrong_type():
    fields = simple_field_types()
    assert len(fields) > 100
    unchecked = []
    for name, members in fields.items():
        value = "1" if str not in members else 1.5  # a str where none is allowed, else a float where only str is
        if float in members or int in members:
            value = b"1" if str in members else value  # fields that take a number and a str (pad_to_multiple_of)
        try:
            make(**{name: value})
        except TypeError as err:
            assert str(err).startswith(f"{name} must be "), (name, str(err))
        else:
            unchecked.append(name)
    assert not unchecked


def test_numbers_of_other_numeric_types_are_accepted():
    cfg = make(learning_rate=np.float32(1e-5), max_steps=np.int64(5), beta=1, scale_rewards=False)
    assert cfg.max_steps == 5 and cfg.beta == 1 and cfg.scale_rewards == "none"  # TRL maps False to "none"


def test_check_type_helper():
    from dapo_trl._validate import check_type

    check_type("x", 3, (float,))  # an int is a float here, as in Python's numeric tower
    with pytest.raises(TypeError, match=r"^x must be a float, got the bool True"):
        check_type("x", True, (float,))
    with pytest.raises(TypeError, match=r"^x must be an int or None, got the float 2.0"):
        check_type("x", 2.0, (int, type(None)))


def test_yaml_still_loads_through_trl_parser(tmp_path):
    # Written by hand, as users write YAML: `1e-6` without a dot is a *string* in YAML 1.1, `false` is a bool
    path = tmp_path / "cfg.yaml"
    path.write_text(
        f"output_dir: {tmp_path}\nuse_cpu: true\nbf16: false\nreport_to: none\nlearning_rate: 1e-6\n"
        "epsilon: 0.2\nepsilon_high: 0.28\nwarmup_steps: 0.05\nmax_steps: 10\nscale_rewards: false\n"
        "dynamic_sampling: false\ndynamic_sampling_tolerance: 0\ndynamic_sampling_reward: null\n"
        "reward_weights: [1.0, 0.5]\nmax_completion_length: 64\n"
    )
    (cfg,) = TrlParser((DAPOConfig,)).parse_args_and_config(["--config", str(path)])
    assert cfg.learning_rate == 1e-6 and isinstance(cfg.learning_rate, float)
    assert cfg.dynamic_sampling is False and cfg.scale_rewards == "none" and cfg.max_steps == 10
    assert cfg.reward_weights == [1.0, 0.5] and cfg.dynamic_sampling_reward is None


def test_command_line_still_parses_through_trl_parser(tmp_path):
    argv = ["--output_dir", str(tmp_path), "--use_cpu", "--bf16", "false", "--report_to", "none"]
    argv += ["--dynamic_sampling", "False", "--dynamic_sampling_carry_over", "true", "--learning_rate", "1e-6"]
    argv += ["--dynamic_sampling_max_rounds", "4", "--reward_weights", "1.0", "0.5", "--epsilon_high", "0.3"]
    (cfg,) = TrlParser((DAPOConfig,)).parse_args_and_config(argv)
    assert cfg.dynamic_sampling is False and cfg.dynamic_sampling_carry_over is True
    assert cfg.learning_rate == 1e-6 and cfg.dynamic_sampling_max_rounds == 4 and cfg.epsilon_high == 0.3
    assert cfg.reward_weights == [1.0, 0.5]
