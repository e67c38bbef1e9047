r"""
The verifier's entry points: [`extract_answer`], [`extract_gold_answer`], [`verify`], [`verify_batch`] and
[`score_completion`], with their arguments checked at the call (a wrong type or an impossible deadline is an error that
names the argument, never a silent `False`).

Comparison strategy (`verify(gold, predicted)`), in order; any step that decides returns:
    1. Guards. Answers longer than 1,000 characters, bracket nesting deeper than 12, more than 64 elements, values too
       large to compute exactly (`9^{9^{9^9}}`, `2^{10^6}`, `1000000!`), malformed text (`???`, `\sqrt`, `2+`) and
       undefined values (`\frac{1}{0}`) are wrong (as a gold answer: unusable).
    2. Choice letters. A gold of `A`..`J` (also `(B)`, `\text{(B)}`) is a multiple-choice key: the prediction must name
       the same letter (`B`, `(B)`, `B)`, `(B) 12`, `\textbf{(B)}`, `b`).
    3. Decoration is removed and the structure read (`dapo_trl.verifier.normalize`): lists, sets, tuples, intervals,
       unions, ratios, matrices, labels (`x = 3`, `(p,q) = (3,2)`).
    4. Exact numbers, without SymPy (`dapo_trl.verifier.numbers`), then the structural rules of the equality policy
       (`dapo_trl.verifier.compare`, where the policy table is: what counts as equal, kind by kind, and why).
    5. Symbolic, in a worker process with a hard deadline (`dapo_trl.verifier.symbolic`): latex2sympy2_extended's
       grammar with decimals made exact, then structural equality, 35-digit agreement of constants, agreement of
       expressions at random rational points, `simplify(a - b) == 0`; equations up to a non-zero factor,
       inequalities up to a positive one or as the set they solve to.
    6. Anything else, and any timeout, is wrong.

Bounded time and no code execution: nothing calls `eval`, `sympify` or `parse_expr` on model text. Steps 1-4 are
linear-time string work in the calling thread (the common case: all DAPO-Math-17k gold answers are integers). Step 5
runs in a small persistent pool of worker processes (`dapo_trl.verifier.pool`); a worker that misses the deadline is
killed and replaced, so the bound holds from the main thread, from worker threads and from worker processes alike.
The first symbolic comparison in a process also waits, once, for the pool to start (about 2 s; [`warm_up`] does it
ahead of time).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from numbers import Real

from . import dapo_rule, pool
from .compare import compare, fast_scalar_equal
from .extraction import EXTRACTION_MODES, PLAIN_NUMBER, extract, extract_gold, unwrap_gold
from .normalize import MAX_ANSWER_CHARS, clean, parse_answer

DEFAULT_TIMEOUT_S = 3.0
DEFAULT_NUM_WORKERS = max(1, min(4, os.cpu_count() or 1))
REWARD_RULES = ("equivalence", "dapo")

_TEXT_WRAPPER = re.compile(r"\\text\{([^{}]*)\}")
_GOLD_CHOICE = re.compile(r"^\(?([A-J])\)?$")
_PRED_CHOICE = re.compile(r"^(?:\(([A-Ja-j])\)|([A-J])(?:\)|[.:]|\s|$))")
_PRED_LOWER_CHOICE = re.compile(r"^([a-j])$")  # "b" for a gold written "(B)": see the policy table


# ------------------------------------------------------------------------------------------------ argument checks
def check_text(value: object, name: str, where: str) -> str:
    """`value` if it is a `str`; otherwise a `TypeError` naming the argument and what to pass instead."""
    if isinstance(value, str):
        return value
    hint = ""
    if isinstance(value, (bytes, bytearray)):
        hint = " Decode it first, e.g. `value.decode('utf-8')`."
    elif isinstance(value, dict):
        hint = " It looks like a chat message: pass its 'content'."
    elif isinstance(value, (list, tuple)):
        hint = (
            " A conversation (a list of message dicts) is read by MathVerifierReward, which takes the last assistant "
            "message; here pass the text itself."
        )
    raise TypeError(f"{where}: `{name}` must be a str, got {type(value).__name__}.{hint}")


def check_timeout(timeout_s: object, where: str) -> float:
    """`timeout_s` as a float if it is a finite positive number of seconds; otherwise an error naming it."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, Real):
        raise TypeError(f"{where}: `timeout_s` must be a number of seconds, got {timeout_s!r}.")
    if not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ValueError(f"{where}: `timeout_s` must be a finite number of seconds above 0, got {timeout_s!r}.")
    return float(timeout_s)


def check_num_workers(num_workers: object, where: str) -> int | None:
    if num_workers is None:
        return None
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"{where}: `num_workers` must be an int of at least 1 (or None), got {num_workers!r}.")
    return num_workers


def check_choice(value: object, choices: tuple[str, ...], name: str, where: str) -> str:
    if value not in choices:
        raise ValueError(f"{where}: `{name}` must be one of {list(choices)}, got {value!r}.")
    return value


# ------------------------------------------------------------------------------------------------------ extraction
def extract_answer(text: str, *, extraction: str = "strict") -> str | None:
    r"""
    Extracts the final answer from a completion, or `None` when it committed to none (the extraction policy is in
    `dapo_trl.verifier.extraction`).

    Args:
        text (`str`):
            The completion text.
        extraction (`str`, *optional*, defaults to `"strict"`):
            `"strict"`: a boxed answer or an answer line only. `"lenient"`: when there is neither, the last math
            expression of the final sentence.

    Returns:
        `str | None`: The answer as written (LaTeX), without the box or answer prefix.

    Example:
    ```python
    >>> extract_answer("We get 12 apples, then 3 more.\nAnswer: $15$")
    '15'
    >>> extract_answer(r"So \boxed{\frac{1}{2}} is wrong; in fact the answer is \boxed{\frac{1}{3}}.")
    '\\frac{1}{3}'
    >>> extract_answer("Let me compute 3 + 4 = 7. Next, we") is None
    True
    >>> extract_answer("Adding them, the total comes to $42$.", extraction="lenient")
    '42'

    ```
    """
    check_text(text, "text", "extract_answer")
    check_choice(extraction, EXTRACTION_MODES, "extraction", "extract_answer")
    return extract(text, extraction)


def extract_gold_answer(gold: object) -> str | None:
    r"""
    The reference answer from a dataset column: a bare answer (`"34"`, `"\frac{1}{2}"`, `34`, `["34"]`) or a worked
    solution whose answer is boxed or on an answer line (MATH, GSM8K). `None` when it cannot be scored: `None`, an
    empty string, a list of several values, a container, or text that is not a math answer (`???`, `\sqrt`,
    `\frac{1}{0}`). One-element lists are unwrapped, never turned into the string `"['1']"`.

    Example:
    ```python
    >>> extract_gold_answer(r"The sum is $2 + 3 = 5$, so the answer is $\boxed{5}$.")
    '5'
    >>> extract_gold_answer(34), extract_gold_answer(["34"]), extract_gold_answer("???")
    ('34', '34', None)

    ```
    """
    return extract_gold(gold)


# ------------------------------------------------------------------------------------------------------ comparison
def _choice(text: str, pattern: re.Pattern[str]) -> str | None:
    s = _TEXT_WRAPPER.sub(r"\1", clean(text)).replace("**", "").strip()
    m = pattern.match(s)
    return next((g for g in m.groups() if g), None).upper() if m else None


def fast_verdict(gold: str, predicted: str) -> bool | None:
    """Steps 1-4 of the comparison strategy: `True`/`False` when they decide, `None` when SymPy must."""
    if PLAIN_NUMBER.fullmatch(gold) and PLAIN_NUMBER.fullmatch(predicted):  # DAPO-Math-17k's case, in microseconds
        return Fraction(gold.strip().rstrip(".")) == Fraction(predicted.strip().rstrip("."))
    if len(gold) > MAX_ANSWER_CHARS or len(predicted) > MAX_ANSWER_CHARS:
        return False
    letter = _choice(gold, _GOLD_CHOICE)
    if letter is not None:
        keyed = "(" in gold  # written as a choice key, so a lone lower-case letter can only mean that choice
        return letter in (_choice(predicted, _PRED_CHOICE), keyed and _choice(predicted, _PRED_LOWER_CHOICE))
    g, p = parse_answer(gold), parse_answer(predicted)
    if g is None or p is None:
        return False
    return compare(g, p, fast_scalar_equal)


def verify(gold: str, predicted: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    r"""
    Whether two extracted answers are mathematically equivalent (see the comparison strategy above and the equality
    policy in `dapo_trl.verifier.compare`).

    Args:
        gold (`str`):
            The reference answer, as extracted by [`extract_gold_answer`].
        predicted (`str`):
            The model's answer, as extracted by [`extract_answer`].
        timeout_s (`float`, *optional*, defaults to `3.0`):
            Deadline for the symbolic comparison; a comparison that misses it counts as wrong.

    Example:
    ```python
    >>> verify("0.5", r"\dfrac12"), verify("1000000", "1,000,000"), verify(r"\sqrt{2}", "1.414")
    (True, True, False)

    ```
    """
    check_text(gold, "gold", "verify")
    check_text(predicted, "predicted", "verify")
    timeout_s = check_timeout(timeout_s, "verify")
    verdict = fast_verdict(gold, predicted)
    if verdict is not None:
        return verdict
    return pool.get_pool().compare(gold, predicted, timeout_s) is True


def verify_batch(
    golds: Sequence[str],
    predictions: Sequence[str],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    num_workers: int | None = None,
) -> list[bool]:
    """
    [`verify`] over a batch: the string-level steps run here, the symbolic ones on `num_workers` worker processes in
    parallel, each identical (gold, prediction) pair once. Each symbolic comparison has its own `timeout_s`.
    """
    timeout_s = check_timeout(timeout_s, "verify_batch")
    num_workers = check_num_workers(num_workers, "verify_batch") or DEFAULT_NUM_WORKERS
    if isinstance(golds, str) or isinstance(predictions, str):
        raise TypeError("verify_batch: `golds` and `predictions` must be sequences of str, not a single str.")
    if len(golds) != len(predictions):
        raise ValueError(f"verify_batch: got {len(golds)} gold answers but {len(predictions)} predictions.")
    for i, (g, p) in enumerate(zip(golds, predictions)):
        check_text(g, f"golds[{i}]", "verify_batch")
        check_text(p, f"predictions[{i}]", "verify_batch")
    verdicts = [fast_verdict(g, p) for g, p in zip(golds, predictions)]
    pending = sorted({(g, p) for g, p, v in zip(golds, predictions, verdicts) if v is None})
    if not pending:
        return [bool(v) for v in verdicts]
    workers = pool.get_pool(num_workers)
    with ThreadPoolExecutor(max_workers=min(num_workers, len(pending))) as executor:
        results = dict(zip(pending, executor.map(lambda pair: workers.compare(*pair, timeout_s) is True, pending)))
    return [bool(v) if v is not None else results[(g, p)] for g, p, v in zip(golds, predictions, verdicts)]


def score_completion(
    completion_text: str,
    gold: object,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    extraction: str = "strict",
    rule: str = "equivalence",
) -> bool | None:
    r"""
    Whether a completion's final answer matches the gold: `None` when the gold cannot be scored (the example should
    be skipped, not scored; see [`extract_gold_answer`]), `False` when the completion gave no final answer.

    Args:
        completion_text (`str`):
            The completion.
        gold (`str`, `int`, `float` or a one-element list of one):
            The reference answer or worked solution.
        timeout_s (`float`, *optional*, defaults to `3.0`):
            Deadline for the symbolic comparison.
        extraction (`str`, *optional*, defaults to `"strict"`):
            `"strict"` or `"lenient"` (see [`extract_answer`]); ignored by `rule="dapo"`.
        rule (`str`, *optional*, defaults to `"equivalence"`):
            `"equivalence"`: this verifier. `"dapo"`: the DAPO paper's rule (last 300 characters, last `Answer:`
            line, normalised exact match; see `dapo_trl.verifier.dapo_rule`).

    Example:
    ```python
    >>> score_completion("2x = 8, so x = 4.\n\nAnswer: x = 4", "4")
    True
    >>> score_completion("2x = 8, so x = 4.\n\nAnswer: x = 4", "4", rule="dapo")
    True
    >>> score_completion("Answer: 1/2", r"\frac{1}{2}"), score_completion("Answer: 1/2", r"\frac{1}{2}", rule="dapo")
    (True, False)

    ```
    """
    check_text(completion_text, "completion_text", "score_completion")
    timeout_s = check_timeout(timeout_s, "score_completion")
    check_choice(extraction, EXTRACTION_MODES, "extraction", "score_completion")
    check_choice(rule, REWARD_RULES, "rule", "score_completion")
    gold_answer = extract_gold(gold)
    if gold_answer is None:
        return None
    if rule == "dapo":
        return dapo_rule.is_correct(completion_text, unwrap_gold(gold))
    predicted = extract(completion_text, extraction)
    return False if predicted is None else verify(gold_answer, predicted, timeout_s=timeout_s)


def warm_up(num_workers: int | None = None) -> None:
    """Starts the symbolic worker processes now rather than on the first answer that needs them (~1-2 s each)."""
    num_workers = check_num_workers(num_workers, "warm_up") or DEFAULT_NUM_WORKERS
    pool.get_pool(num_workers).warm_up(num_workers)


def shutdown_workers() -> None:
    """Stops the symbolic worker processes (they also stop at interpreter exit, and restart lazily when needed)."""
    pool.shutdown()
