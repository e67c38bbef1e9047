"""Reward functions with TRL's signature (`completions, **columns -> list[float | None]`).

- [`MathVerifierReward`] (`rewards.math`): the rule-based math verifier reward (DAPO §2.4).
- [`MultipleChoiceReward`] (`rewards.choice`): multiple-choice questions, a domain beyond math.
"""

from .choice import MultipleChoiceReward, extract_choice, load_choice_dataset
from .math import MathVerifierReward, completion_text

__all__ = ["MathVerifierReward", "MultipleChoiceReward", "completion_text", "extract_choice", "load_choice_dataset"]
