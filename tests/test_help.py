"""`--help`: each DAPO setting's text generated from one source (DAPOConfig's docstring) and checked against the
defaults, and the settings grouped with DAPO's first."""

import dataclasses
import re

import pytest

from dapo_trl._help import help_source_problems, parameter_docs
from dapo_trl.dapo_config import DAPOConfig


def test_the_docstring_is_the_one_source_of_every_dapo_settings_help():
    assert help_source_problems(DAPOConfig) == []


def test_a_stated_default_that_is_not_the_fields_is_found():
    @dataclasses.dataclass
    class Config:
        """
        Parameters:
            > Group

            size (`int`, *optional*, defaults to `16`):
                Rows per step.
            name (`str`, *optional*, defaults to `"a"`):
                A name.
        """

        size: int = 64
        name: str = dataclasses.field(default="a", metadata={"help": "A name, written twice."})
        extra: bool = False

    assert help_source_problems(Config) == [
        "size: the field writes its own help; write it in the class docstring",
        "size: the docstring says defaults to 16, the field 64",
        "name: the field writes its own help; write it in the class docstring",
        "extra: no entry in the class docstring",
    ]


def help_of(name: str) -> str:
    return next(f for f in dataclasses.fields(DAPOConfig) if f.name == name).metadata["help"]


def test_the_texts_that_were_wrong_say_what_the_settings_do():
    assert help_of("per_device_train_batch_size") == "Rows (completions) per device and micro-step."
    assert "max_completion_length // 5" in help_of("overlong_buffer_len") and "max_length" not in re.sub(
        r"max_completion_length", "", help_of("overlong_buffer_len")
    )
    assert "exit with code 75 (130 after Ctrl-C)" in help_of("preemption_handling")


@pytest.fixture(scope="module")
def help_text():
    from test_train_math import train_math

    return train_math.build_parser().format_help()


def test_help_groups_the_dapo_settings_first_under_the_docstrings_headings(help_text):
    titles = [line[:-1] for line in help_text.splitlines() if re.match(r"^\S.*:$", line)]
    headings = [f"DAPO: {doc.heading}" for doc in parameter_docs(DAPOConfig.__doc__).values()]
    dapo = list(dict.fromkeys(h.replace("`", "") for h in headings))
    assert titles[: len(dapo) + 1] == ["other options", *dapo]
    assert titles[len(dapo) + 1 :] == [
        "MathScriptArguments: the script's settings",
        "TRL GRPOConfig",
        "transformers TrainingArguments",
        "TRL ModelConfig",
    ]
    section = help_text.split("DAPO: Dynamic sampling (DAPO §3.2, Algorithm 1):")[1].split("\nDAPO: ")[0]
    assert "--dynamic_sampling_max_rounds" in section and "--learning_rate" not in section


def test_a_no_flag_says_it_turns_its_setting_off(help_text):
    negative = help_text.split("--no_dynamic_sampling, --no-dynamic-sampling")[1].split("\n  --")[0]
    assert " ".join(negative.split()) == "Turn off --dynamic_sampling."


def test_help_says_where_the_defaults_it_shows_come_from(help_text):
    assert "configs/cpu_demo.yaml when no --config, model or dataset is given" in " ".join(help_text.split())


def test_doctests():
    import doctest

    from dapo_trl import _help

    assert doctest.testmod(_help).failed == 0
