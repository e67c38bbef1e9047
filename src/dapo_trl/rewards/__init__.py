"""Reward functions with TRL's signature (`completions, **columns -> list[float | None]`).

- [`MathVerifierReward`] (`rewards.math`): the rule-based math verifier reward (DAPO §2.4).
- [`MultipleChoiceReward`] (`rewards.choice`): multiple-choice questions, a domain beyond math.
- [`think_format_reward`] (`rewards.format`): TRL's `<think>` format reward (open-r1's `format`), for string
  completions too.
"""

from .choice import MultipleChoiceReward, extract_choice, load_choice_dataset
from .format import think_format_reward
from .math import MathVerifierReward, completion_text

__all__ = [
    "MathVerifierReward",
    "MultipleChoiceReward",
    "completion_text",
    "extract_choice",
    "load_choice_dataset",
    "think_format_reward",
]
