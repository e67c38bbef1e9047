"""open-r1's `format` reward for both prompt formats: TRL's `think_format_reward` on plain-string completions too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def think_format_reward(completions: Sequence[str] | Sequence[Sequence[dict[str, Any]]], **kwargs) -> list[float]:
    r"""
    1.0 when a completion opens with one `<think>...</think>` block, else 0.0: TRL's
    `trl.rewards.think_format_reward` (the reward open-r1 calls `format`), for conversational completions (a list of
    messages) and for plain strings alike. TRL's function reads `completion[0]["content"]`, so on a dataset of string
    prompts (completions are strings) it fails inside the trainer; here a string is wrapped as one message first and
    TRL's rule decides.

    Args:
        completions (`list[str]` or `list[list[dict[str, str]]]`):
            The completions, as TRL passes them: strings for string prompts, lists of messages for conversations.
        **kwargs:
            The dataset columns and trainer state TRL passes to every reward; not used.

    Returns:
        `list[float]`: 1.0 or 0.0 per completion.

    Example:
    ```python
    >>> from dapo_trl.rewards.format import think_format_reward

    >>> think_format_reward(["<think>\n2 + 2 = 4\n</think>\nAnswer: 4", "Answer: 4"])
    [1.0, 0.0]
    >>> think_format_reward([[{"role": "assistant", "content": "<think>ok</think> 4"}]])
    [1.0]

    ```
    """
    from trl.rewards import think_format_reward as trl_think_format_reward

    if isinstance(completions, (str, bytes)) or not isinstance(completions, Sequence):
        raise TypeError(
            f"think_format_reward: `completions` must be a list of completions, got {type(completions).__name__}."
        )
    as_messages = [[{"role": "assistant", "content": c}] if isinstance(c, str) else c for c in completions]
    return trl_think_format_reward(as_messages, **kwargs)
