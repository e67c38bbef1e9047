"""Reward functions with TRL's signature (`completions, **columns -> list[float | None]`), built on the pure modules."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from numbers import Real
from typing import Any

from ..verifier import DEFAULT_TIMEOUT_S, EXTRACTION_MODES, REWARD_RULES, dapo_rule
from ..verifier.api import check_choice, check_num_workers, check_timeout, verify_batch
from ..verifier.extraction import extract, extract_gold, unwrap_gold

logger = logging.getLogger(__name__)

# Gold-answer columns tried in order when `answer_column` is not given: GSM8K/most sets, MATH, DAPO-Math-17k.
_AUTO_COLUMNS = ("answer", "solution", "reward_model.ground_truth")
_NOT_COLUMNS = ("trainer_state", "log_extra", "log_metric", "environments")


def completion_text(completion: str | Sequence[dict[str, Any]], index: int | None = None) -> str:
    """
    The text of a completion: a plain string, or the content of the last assistant message of a conversation (a list
    of message dicts). Anything else is a `TypeError` that says what was passed (`completions[index]` when given).
    """
    where = "completion" if index is None else f"completions[{index}]"
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (bytes, bytearray)):
        raise TypeError(f"MathVerifierReward: {where} is bytes; decode it to str first.")
    if isinstance(completion, dict):
        raise TypeError(
            f"MathVerifierReward: {where} is a single message dict; a conversational completion is a list of "
            "messages, e.g. [{'role': 'assistant', 'content': ...}]."
        )
    if not isinstance(completion, (list, tuple)) or not all(isinstance(m, dict) for m in completion):
        kinds = sorted({type(m).__name__ for m in completion}) if isinstance(completion, (list, tuple)) else None
        got = f"a list of {', '.join(kinds)}" if kinds else type(completion).__name__
        raise TypeError(
            f"MathVerifierReward: {where} is {got}; each completion must be a str or a list of message dicts "
            "({'role': ..., 'content': ...})."
        )
    assistant = [m for m in completion if m.get("role", "assistant") == "assistant"]
    message = (assistant or list(completion) or [{}])[-1]
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


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip()) or value == []


class MathVerifierReward:
    r"""
    Rule-based correctness reward for math answers (DAPO §2.4, Eq. 7):

    $$
    R(\hat{y}, y) = \begin{cases} 1, & \texttt{is\_equivalent}(\hat{y}, y) \\ -1, & \text{otherwise} \end{cases}
    $$

    The final answer is extracted from each completion (the last `\boxed{}` or `Answer:` line) and compared with the
    gold answer as described in `dapo_trl.verifier` (the equality policy is in `dapo_trl.verifier.compare`). A
    completion without a final answer gets `incorrect_reward`; a row whose gold answer cannot be scored (`None`, empty,
    a list of several values, junk such as `???`) gets `None`, which TRL leaves out of the reward and its mean. Such
    rows are counted: a warning the first time (naming the column), and the metric
    `math_verifier/unusable_gold_ratio` in the trainer's logs. The extracted answers are logged to TRL's completions
    table as the `extracted_answer` column.

    The instance is picklable and its name is pinned to `math_verifier`, so the trainer logs it as
    `rewards/math_verifier/mean`.

    Args:
        correct_reward (`float`, *optional*, defaults to `1.0`):
            Reward of a correct answer (DAPO §2.4, Eq. 7: 1).
        incorrect_reward (`float`, *optional*, defaults to `-1.0`):
            Reward of a wrong or missing answer (DAPO §2.4, Eq. 7: -1).
        answer_column (`str`, *optional*):
            Dataset column holding the gold answer. A dotted path reads inside dict columns
            (`"reward_model.ground_truth"` for DAPO-Math-17k). If `None`, the first of `answer`, `solution` and
            `reward_model.ground_truth` that is present and not blank in the batch is used. A worked solution (MATH's
            `solution`) is reduced to its boxed answer.
        timeout_s (`float`, *optional*, defaults to `3.0`):
            Deadline of each symbolic comparison; one that misses it counts as wrong.
        num_workers (`int`, *optional*):
            Worker processes for symbolic comparisons. Defaults to `min(4, os.cpu_count())`.
        rule (`str`, *optional*, defaults to `"equivalence"`):
            `"equivalence"`: this verifier (boxed answers and answer lines, symbolic equivalence, units, ...).
            `"dapo"`: the DAPO paper's rule (§2.4), to reproduce the paper: the last `Answer:` line of the last 300
            characters, normalised, must match the normalised gold exactly (`dapo_trl.verifier.dapo_rule`). The two
            disagree on some completions (see docs/verifier.md), which changes which groups dynamic
            sampling keeps.
        extraction (`str`, *optional*, defaults to `"strict"`):
            `"strict"`: only a boxed answer or an answer line counts (DAPO's format reward: a policy is not paid for
            a number it never committed to). `"lenient"`: without either, the last math expression of the final
            sentence counts (for models never trained on an answer format). Ignored by `rule="dapo"`.

    Example:
    ```python
    >>> from dapo_trl.rewards.math import MathVerifierReward

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
    >>> MathVerifierReward(rule="dapo")([r"So $x = \boxed{\dfrac{1}{2}}$."], answer=["0.5"])
    [-1.0]

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
        rule: str = "equivalence",
        extraction: str = "strict",
    ):
        for name, value in (("correct_reward", correct_reward), ("incorrect_reward", incorrect_reward)):
            if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
                raise ValueError(f"MathVerifierReward: `{name}` must be a finite number, got {value!r}.")
        if answer_column is not None and (not isinstance(answer_column, str) or not answer_column.strip()):
            raise ValueError(
                f"MathVerifierReward: `answer_column` must be a column name or None, got {answer_column!r}."
            )
        self.correct_reward = float(correct_reward)
        self.incorrect_reward = float(incorrect_reward)
        self.answer_column = answer_column
        self.timeout_s = check_timeout(timeout_s, "MathVerifierReward")
        self.num_workers = check_num_workers(num_workers, "MathVerifierReward")
        self.rule = check_choice(rule, REWARD_RULES, "rule", "MathVerifierReward")
        self.extraction = check_choice(extraction, EXTRACTION_MODES, "extraction", "MathVerifierReward")
        self._warned_unusable = False

    def gold_answers(self, num_rows: int, columns: dict[str, Any]) -> list[Any]:
        """The raw gold value of each row, read from the configured or auto-detected column."""
        return self._gold_column(columns)[1]

    def _gold_column(self, columns: dict[str, Any]) -> tuple[str, list[Any]]:
        """The column used and its raw values (see `answer_column` for the order in which columns are tried)."""
        candidates = [self.answer_column] if self.answer_column else list(_AUTO_COLUMNS)
        found: tuple[str, list[Any]] | None = None
        for name in candidates:
            top, *path = name.split(".")
            values = columns.get(top)
            if values is None:
                continue
            if path and not any(isinstance(v, dict) and _lookup(v, path) is not None for v in values):
                continue
            values = [_lookup(v, path) for v in values] if path else list(values)
            if found is None:
                found = (name, values)
            if not all(_blank(v) for v in values):  # an empty `answer` column next to a good `solution` one
                return name, values
        if found is not None:
            return found
        seen = sorted(k for k in columns if k not in _NOT_COLUMNS)
        wanted = (
            f"column {self.answer_column!r}" if self.answer_column else f"any of the columns {list(_AUTO_COLUMNS)}"
        )
        raise ValueError(
            f"MathVerifierReward could not find {wanted} in the batch; it received the columns {seen}. Pass "
            "`answer_column=` with the dataset column holding the gold answer (a dotted path like "
            "'reward_model.ground_truth' reads inside dict columns)."
        )

    def _score(self, texts: list[str], golds: list[str | None], raw: list[Any]) -> tuple[list, list[str | None]]:
        """A verdict per row (`None` for unusable golds, `False` without an answer) and the answer each one read."""
        if self.rule == "dapo":
            verdicts = [
                None if g is None else dapo_rule.is_correct(t, unwrap_gold(r)) for t, g, r in zip(texts, golds, raw)
            ]
            return verdicts, [dapo_rule.extract(t) for t in texts]
        answers = [extract(t, self.extraction) for t in texts]
        scored = [i for i, (g, p) in enumerate(zip(golds, answers)) if g is not None and p is not None]
        verdicts = verify_batch(
            [golds[i] for i in scored],
            [answers[i] for i in scored],
            timeout_s=self.timeout_s,
            num_workers=self.num_workers,
        )
        correct = dict(zip(scored, verdicts))
        return [None if g is None else correct.get(i, False) for i, g in enumerate(golds)], answers

    def _report_unusable(self, column: str, golds: list[str | None], log_metric: Callable | None) -> None:
        unusable = golds.count(None)
        if log_metric is not None and golds:
            log_metric("math_verifier/unusable_gold_ratio", unusable / len(golds))
        if unusable and not self._warned_unusable:
            self._warned_unusable = True
            logger.warning(
                "MathVerifierReward: %d of %d rows in this batch have a gold answer in column %r that cannot be scored "
                "(None, empty, a list of several values, or not a math answer such as '???'); they get reward None "
                "and are left out of the reward mean. The share is logged as math_verifier/unusable_gold_ratio.",
                unusable,
                len(golds),
                column,
            )

    def __call__(
        self,
        completions: Sequence[str] | Sequence[Sequence[dict[str, Any]]],
        log_extra: Callable[[str, list], None] | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        **kwargs,
    ) -> list[float | None]:
        if isinstance(completions, (str, bytes)) or not isinstance(completions, Sequence):
            raise TypeError(
                f"MathVerifierReward: `completions` must be a list of completions, got {type(completions).__name__}."
            )
        texts = [completion_text(c, i) for i, c in enumerate(completions)]
        column, raw = self._gold_column(kwargs)
        if len(raw) != len(completions):
            raise ValueError(f"MathVerifierReward: got {len(completions)} completions but {len(raw)} gold answers.")
        golds = [extract_gold(g) for g in raw]
        verdicts, answers = self._score(texts, golds, raw)
        self._report_unusable(column, golds, log_metric)
        if log_extra is not None:
            log_extra("extracted_answer", [p if p is not None else "[no answer]" for p in answers])
        return [None if v is None else (self.correct_reward if v else self.incorrect_reward) for v in verdicts]

    def __repr__(self) -> str:
        return (
            f"MathVerifierReward(correct_reward={self.correct_reward}, incorrect_reward={self.incorrect_reward}, "
            f"answer_column={self.answer_column!r}, timeout_s={self.timeout_s}, num_workers={self.num_workers}, "
            f"rule={self.rule!r}, extraction={self.extraction!r})"
        )
