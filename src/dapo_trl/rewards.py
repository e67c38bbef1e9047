"""Reward functions with TRL's signature (`completions, **columns -> list[float | None]`), built on the pure modules."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from .math_answer import DEFAULT_TIMEOUT_S, extract_answer, extract_gold_answer, verify_batch

logger = logging.getLogger(__name__)

# Gold-answer columns tried in order when `answer_column` is not given: GSM8K/most sets, MATH, DAPO-Math-17k.
_AUTO_COLUMNS = ("answer", "solution", "reward_model.ground_truth")


def completion_text(completion: str | Sequence[dict[str, Any]]) -> str:
    """The text of a completion: a plain string, or the content of the last assistant message of a conversation."""
    if isinstance(completion, str):
        return completion
    messages = [m for m in completion if isinstance(m, dict)]
    assistant = [m for m in messages if m.get("role", "assistant") == "assistant"]
    message = (assistant or messages or [{}])[-1]
    content = message.get("content", "")
    if isinstance(content, list):  # multimodal content parts: keep the text ones
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def _lookup(row: Any, path: list[str]) -> Any:
    for key in path:
        if not isinstance(row, dict) or key not in row:
            return None
        row = row[key]
    return row


class MathVerifierReward:
    r"""
    Rule-based correctness reward for math answers (DAPO §2.4, Eq. 7):

    $$
    R(\hat{y}, y) = \begin{cases} 1, & \texttt{is\_equivalent}(\hat{y}, y) \\ -1, & \text{otherwise} \end{cases}
    $$

    The final answer is extracted from each completion (the last `\boxed{}` or `Answer:` line) and compared with the
    gold answer as described in `dapo_trl.math_answer`. A completion without a final answer gets `incorrect_reward`;
    a row whose gold answer cannot be parsed gets `None`, which TRL skips. The extracted answers are logged to TRL's
    completions table as the `extracted_answer` column.

    The instance is picklable and its name is pinned to `math_verifier`, so the trainer logs it as
    `rewards/math_verifier/mean`.

    Args:
        correct_reward (`float`, *optional*, defaults to `1.0`):
            Reward of a correct answer.
        incorrect_reward (`float`, *optional*, defaults to `-1.0`):
            Reward of a wrong or missing answer.
        answer_column (`str`, *optional*):
            Dataset column holding the gold answer. A dotted path reads inside dict columns
            (`"reward_model.ground_truth"` for DAPO-Math-17k). If `None`, the first present of `answer`, `solution` and
            `reward_model.ground_truth` is used. A worked solution (MATH's `solution`) is reduced to its boxed answer.
        timeout_s (`float`, *optional*, defaults to `3.0`):
            Deadline of each symbolic comparison; one that misses it counts as wrong.
        num_workers (`int`, *optional*):
            Worker processes for symbolic comparisons. Defaults to `min(4, os.cpu_count())`.

    Example:
    ```python
    >>> from dapo_trl.rewards import MathVerifierReward

    >>> reward = MathVerifierReward()
    >>> completions = [
    ...     [{"role": "assistant", "content": "3 * 11 = 33, plus 1.\nAnswer: 34"}],
    ...     [{"role": "assistant", "content": "I think it is 33.\nAnswer: $33$"}],
    ...     [{"role": "assistant", "content": "Let me start by computing 3 * 11 = 33, then"}],
    ... ]
    >>> reward(completions, answer=["34", "34", "34"])
    [1.0, -1.0, -1.0]
    >>> reward([r"So $x = \boxed{\dfrac{1}{2}}$."], reward_model=[{"ground_truth": "0.5", "style": "rule"}])
    [1.0]

    ```
    """

    __name__ = "math_verifier"

    def __init__(
        self,
        *,
        correct_reward: float = 1.0,
        incorrect_reward: float = -1.0,
        answer_column: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        num_workers: int | None = None,
    ):
        if timeout_s <= 0:
            raise ValueError(f"`timeout_s` must be positive, got {timeout_s}.")
        if num_workers is not None and num_workers < 1:
            raise ValueError(f"`num_workers` must be at least 1 (or None for the default), got {num_workers}.")
        self.correct_reward = correct_reward
        self.incorrect_reward = incorrect_reward
        self.answer_column = answer_column
        self.timeout_s = timeout_s
        self.num_workers = num_workers

    def gold_answers(self, num_rows: int, columns: dict[str, Any]) -> list[Any]:
        """The raw gold value of each row, read from the configured or auto-detected column."""
        candidates = [self.answer_column] if self.answer_column else _AUTO_COLUMNS
        for name in candidates:
            top, *path = name.split(".")
            values = columns.get(top)
            if values is None:
                continue
            if not path:
                return list(values)
            if any(isinstance(v, dict) and _lookup(v, path) is not None for v in values):
                return [_lookup(v, path) for v in values]
        seen = sorted(k for k in columns if k not in ("trainer_state", "log_extra", "log_metric", "environments"))
        wanted = (
            f"column {self.answer_column!r}" if self.answer_column else f"any of the columns {list(_AUTO_COLUMNS)}"
        )
        raise ValueError(
            f"MathVerifierReward could not find {wanted} in the batch; it received the columns {seen}. Pass "
            "`answer_column=` with the dataset column holding the gold answer (a dotted path like "
            "'reward_model.ground_truth' reads inside dict columns)."
        )

    def __call__(
        self,
        completions: Sequence[str] | Sequence[Sequence[dict[str, Any]]],
        log_extra: Callable[[str, list], None] | None = None,
        **kwargs,
    ) -> list[float | None]:
        golds = [extract_gold_answer(g) for g in self.gold_answers(len(completions), kwargs)]
        if len(golds) != len(completions):
            raise ValueError(f"Got {len(completions)} completions but {len(golds)} gold answers.")
        predictions = [extract_answer(completion_text(c)) for c in completions]
        scored = [i for i, (g, p) in enumerate(zip(golds, predictions)) if g is not None and p is not None]
        verdicts = verify_batch(
            [golds[i] for i in scored],
            [predictions[i] for i in scored],
            timeout_s=self.timeout_s,
            num_workers=self.num_workers,
        )
        correct = dict(zip(scored, verdicts))
        rewards: list[float | None] = []
        for i, gold in enumerate(golds):
            if gold is None:
                rewards.append(None)
            else:
                rewards.append(self.correct_reward if correct.get(i, False) else self.incorrect_reward)
        if golds.count(None):
            logger.debug(
                "%d of %d rows have no parseable gold answer; they are skipped.", golds.count(None), len(golds)
            )
        if log_extra is not None:
            log_extra("extracted_answer", [p if p is not None else "[no answer]" for p in predictions])
        return rewards

    def __repr__(self) -> str:
        return (
            f"MathVerifierReward(correct_reward={self.correct_reward}, incorrect_reward={self.incorrect_reward}, "
            f"answer_column={self.answer_column!r}, timeout_s={self.timeout_s}, num_workers={self.num_workers})"
        )
