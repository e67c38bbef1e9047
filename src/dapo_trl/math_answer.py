r"""
Rule-based verification of a model's final math answer: the correctness signal behind DAPO's reward (DAPO §2.4, Eq. 7).

The public API is small: [`extract_answer`] finds the final answer in a completion, [`extract_gold_answer`] does the
same for a reference (a bare answer or a worked solution), [`verify`] decides whether two extracted answers are
equivalent, [`verify_batch`] does it for a training batch, and [`score_completion`] chains them.

Extraction. The last *committed* answer counts, whichever of these comes last in the completion:
    1. the last `\boxed{...}` / `\boxed {...}` / `\fbox{...}` (nested braces allowed); several boxes separated only by
       `,`, `and`, `or` or math delimiters at the very end are one multi-part answer (`\boxed{2}, \boxed{3}`);
    2. the last answer line: `Answer: ...` (DAPO's format), `**Answer:** ...`, `Final Answer: ...`,
       `The (final) answer is ...` (the Minerva format, `... I hope it is correct.` is dropped) and GSM8K's `#### ...`.
       If the line holds `$...$`, `\(...\)` or `\[...\]`, only the math counts.
   A completion with an unclosed `<think>`, one that ends inside an unclosed `\boxed{`, and one with no anchor at all
   has no answer (`None`): it was cut off before answering, and numbers in the reasoning are not answers. After a
   `</think>` only the text after it is searched.

Comparison strategy (`verify(gold, predicted)`), in order; any step that decides returns:
    1. Guards. Answers longer than 1,000 characters, bracket nesting deeper than 12, more than 64 elements, and values
       too large to compute exactly are wrong: numbers beyond 2,000 digits (`9^{9^{9^9}}`, `2^{10^6}`), exponents
       above 10^5 or nested more than three deep, factorials above 800!, large binomials/Gamma, factorials of
       factorials.
    2. Choice letters. A gold of `A`..`J` (also `(B)`, `\text{(B)}`) is a multiple-choice key: the prediction must name
       the same letter (`B`, `(B)`, `B)`, `(B) 12`, `\textbf{(B)}`; lower case only in parentheses).
    3. Decoration is removed from both sides: `$`, `\(`, `\[`, `\left`/`\right`, spacing commands, `\dfrac`/`\tfrac`
       (read as `\frac`, and `\frac12` as `\frac{1}{2}`), degree signs, currency signs and words, thousands separators
       (`1,000`, `1{,}000`, `1\,000`; only when the whole answer is one number, so `(100,200)` stays a point),
       trailing units (`5 \text{ cm}^2`, `12 apples`), a leading `+`, a trailing period, unicode minus and symbols.
    4. Labels go: `x = 3`, `k = 5`, `f(x) = 2x+1`, `x \in [0, 1]`; in a chain `x = 6/2 = 3` the last value counts.
       `x \approx 3.14` keeps the approximation and `\pi \approx 3.14` the exact value.
    5. Structure. Top-level commas or semicolons make an unordered list of answers (`2, 3` = `3, 2`), as do
       `and`/`or` and `\pm` (`2 \pm \sqrt 3`). `\{...\}` is a set (unordered; `\{5\}` = `5`); `(...)` and `[...]`
       with commas are ordered tuples or intervals whose bracket types must match, so `(1, 2]` != `(1, 2)`; `\cup`
       joins an unordered union; `\begin{pmatrix}` (any matrix environment) compares shape and entries, and a column or
       row vector equals the tuple of its entries. A point written without parentheses (`1, 2`) equals `(1, 2)`.
       When every element on both sides carries a label, labels pair the elements (`x=2, y=3` = `y=3, x=2`).
    6. Exact numbers, without SymPy: integers of any length compare exactly (no float rounding), decimals as exact
       fractions (`0.5` = `1/2` = `\frac{1}{2}`, but `0.333` != `1/3`), scientific notation (`3\times10^{5}`, `3e5`),
       small powers (`2^{10}` = `1024`). A percent sign is decoration or a factor 1/100: `25\%` = `25` = `0.25`.
    7. Words (`\text{Monday}`, `no solution`) compare case-insensitively as words, never as products of symbols.
    8. Symbolic, in a worker process with a hard deadline: both sides are parsed by latex2sympy2_extended with
       decimals made exact, then equal if SymPy says so structurally, if constants agree to 35 significant digits (so
       `\sqrt{8}` = `2\sqrt2` but `1.414` != `\sqrt2`: a decimal approximation of an irrational value is wrong), if
       expressions in up to 8 variables agree at four random rational points with alternating signs (`(x+1)^2` =
       `x^2+2x+1`, `|x|` != `x`), or else if `simplify(a - b) == 0`. Equations are equal up to a non-zero factor
       (`2x+2y=2` = `x+y=1`), inequalities up to a positive one (`x > 3` = `3 < x`). A mixed number `2\frac12` is 5/2.
    9. Anything else, and any timeout, is wrong.

Deliberately not equal (a careful grader would want the form the question asked for, or the reading is ambiguous):
an inequality and the interval it describes (`x > 3` vs `(3, \infty)`), degrees and radians (`30^\circ` vs
`\frac{\pi}{6}`), `i` as the imaginary unit (`e^{i\pi}` vs `-1`; `i` is a symbol, so `3+2i` = `2i+3` still holds),
`0.333` vs `\frac13`, and a hedged answer (`2, 3` or `\pm 2` when the gold is `2`).

Bounded time and no code execution: nothing calls `eval`, `sympify` or `parse_expr` on model text; LaTeX is parsed by
latex2sympy2_extended's grammar. Steps 1-7 are linear-time string work in the calling thread (the common case: all
DAPO-Math-17k gold answers are integers). Step 8 runs in a small persistent pool of worker processes
(`dapo_trl._verify_pool`); a worker that misses the deadline is killed and replaced, so the bound holds from the main
thread, from worker threads and from worker processes alike. The first symbolic comparison in a process also waits,
once, for the pool to start (about 2 s; [`warm_up`] does it ahead of time).
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

from . import _verify_pool
from .math_compare import compare, fast_scalar_equal
from .math_normalize import MAX_ANSWER_CHARS, clean, parse_answer, sanitize, strip_trailing_punctuation

DEFAULT_TIMEOUT_S = 3.0
DEFAULT_NUM_WORKERS = max(1, min(4, os.cpu_count() or 1))
MAX_COMPLETION_CHARS = 200_000  # the final answer is at the end; a 20k-token completion is ~80k characters

_ANCHOR = re.compile(
    r"(?:^[ \t>#*_]*|\b(?:the|my|our)\s+)(?:final\s+)?answer\s*(?:\*\*|__)?\s*(?:is\b\s*:?|:)[ \t]*(?:\*\*|__)?"
    r"|^####[ \t]",
    re.IGNORECASE | re.MULTILINE,
)
_BRACE = re.compile(r"[{}]")
_BOX = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_BOX_SEPARATOR = re.compile(r"^(?:[\s$,;.]|\\\]|\\\[|\\\)|\\\(|\band\b|\bor\b|\\text\{\s*(?:and|or)\s*\}|\\quad)*$")
_MATH_SPAN = re.compile(r"(?<!\\)\$\$(.+?)(?<!\\)\$\$|(?<!\\)\$(.+?)(?<!\\)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_SPAN_JOINER = re.compile(r"^\s*(?:,|;|and|or|\\text\{\s*(?:and|or)\s*\})?\s*$")
_SENTENCE_END = re.compile(r"\.\s+(?=[A-Z])")
_TEXT_WRAPPER = re.compile(r"\\text\{([^{}]*)\}")
_LEADING_CHOICE = re.compile(r"^(?:\*\*)?\(?[A-J]\)(?:\*\*)?(?:\s|$)")
_PLAIN_NUMBER = re.compile(r"\s*[-+]?(?:\d{1,300}(?:\.\d{0,300})?|\.\d{1,300})\s*")
_GOLD_CHOICE = re.compile(r"^\(?([A-J])\)?$")
_PRED_CHOICE = re.compile(r"^(?:\(([A-Ja-j])\)|([A-J])(?:\)|[.:]|\s|$))")


def _match_brace(text: str, open_index: int, stop: int) -> int | None:
    depth = 0
    for m in _BRACE.finditer(text, open_index, stop):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return m.start()
    return None


def _box_at(text: str, start: int, stop: int) -> tuple[str, int] | None:
    """Content and end index of the box whose command starts at `start` and closes before `stop`, else `None`."""
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        end = _match_brace(text, i, stop)
        return None if end is None else (text[i + 1 : end].strip(), end + 1)
    m = re.match(r"[^\s$]+", text[i : min(i + 100, stop)])  # "\boxed 5"
    return (m.group(), i + m.end()) if m else None


def _last_boxed(text: str, start: int) -> str | None:
    box = _box_at(text, start, len(text))
    if box is None or not box[0]:
        return None
    parts, end = [box[0]], start
    for _ in range(8):  # earlier boxes that are part of the same multi-part answer
        prev = max(text.rfind("\\boxed", 0, end), text.rfind("\\fbox", 0, end))
        found = _box_at(text, prev, end) if prev >= 0 else None
        gap = text[found[1] : end] if found is not None else ""
        if found is None or len(gap) > 40 or not _BOX_SEPARATOR.match(gap):
            break
        if found[0] != parts[0]:
            parts.insert(0, found[0])
        end = prev
    return ", ".join(parts)


def _anchored(text: str, start: int) -> str | None:
    rest = text[start : start + 4 * MAX_ANSWER_CHARS].lstrip(" \t")
    if rest.startswith("\n"):  # "**Final Answer**:\n\n$5$"
        rest = rest.lstrip()
    if rest.startswith(("$$", "\\[")):  # display math may span lines
        m = _MATH_SPAN.match(rest)
        if m:
            return next(g for g in m.groups() if g is not None).strip()
    line = rest.split("\n", 1)[0]
    if _LEADING_CHOICE.match(line):  # "(B) $12$": the letter is the answer to a multiple-choice question
        return strip_trailing_punctuation(line.replace("**", "").strip())
    # "$x = 2$ or $x = 3$" is one two-part answer; in "the smallest such $n$ is $n = 11$" only the last span counts.
    spans, end = [], None
    for m in _MATH_SPAN.finditer(line):
        if end is not None and not _SPAN_JOINER.match(line[end : m.start()]):
            spans = []
        spans.append(next(g for g in m.groups() if g is not None).strip())
        end = m.end()
    if spans:
        return ", ".join(s for s in spans if s) or None
    line = _SENTENCE_END.split(line, maxsplit=1)[0].replace("**", "").strip(" *_")
    return strip_trailing_punctuation(line) or None


def _last_anchor(text: str, start: int) -> re.Match | None:
    # A literal search for "answer" first, the full pattern only around each hit (from the end): scanning a 40k-character
    # completion with the pattern itself costs milliseconds, this costs microseconds.
    lowered, end, best = text.lower(), len(text), None
    hashes = text.rfind("####", start)
    if hashes >= 0:
        best = _ANCHOR.match(text, hashes) if hashes == 0 or text[hashes - 1] == "\n" else None
    for _ in range(64):
        end = lowered.rfind("answer", start, end)
        if end < 0 or (best is not None and end < best.start()):
            break
        found = deque(_ANCHOR.finditer(text, max(start, end - 40), min(len(text), end + 80)), maxlen=1)
        if found:
            return found[0] if best is None or found[0].start() > best.start() else best
    return best


def extract_answer(text: str) -> str | None:
    r"""
    Extracts the final answer from a completion, or `None` when it committed to none (see the module docstring).

    Args:
        text (`str`):
            The completion text.

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

    ```
    """
    if not isinstance(text, str):
        return None
    text = text[-MAX_COMPLETION_CHARS:]
    think_end = text.rfind("</think>")
    if think_end >= 0:
        text = text[think_end + len("</think>") :]
    elif "<think>" in text:
        return None  # still reasoning when it was cut off
    box_start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if box_start >= 0 and not _BOX.match(text, box_start):
        box_start = -1
    anchor = _last_anchor(text, max(0, box_start))
    if anchor is not None and anchor.start() > box_start:
        answer = _anchored(text, anchor.end())
    elif box_start >= 0:
        answer = _last_boxed(text, box_start)
    else:
        return None
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return None
    return sanitize(answer) or None  # control characters and lone surrogates only matter in the answer itself


def extract_gold_answer(gold: object) -> str | None:
    r"""
    The reference answer from a dataset column: a bare answer (`"34"`, `"\frac{1}{2}"`) or a worked solution whose
    answer is boxed or on an answer line (MATH, GSM8K). `None` when it has no parseable answer.

    Example:
    ```python
    >>> extract_gold_answer(r"The sum is $2 + 3 = 5$, so the answer is $\boxed{5}$.")
    '5'
    >>> extract_gold_answer(34)
    '34'

    ```
    """
    if isinstance(gold, (int, float)) and not isinstance(gold, bool):
        gold = str(gold)
    if not isinstance(gold, str):
        return None
    text = sanitize(gold).strip()
    if _PLAIN_NUMBER.fullmatch(text):
        return text
    if "\\boxed" in text or "\\fbox" in text or _ANCHOR.search(text):
        answer = extract_answer(text)
    else:
        answer = text if len(text) <= MAX_ANSWER_CHARS else None
    return answer if answer and parse_answer(answer) is not None else None


def _choice(text: str, pattern: re.Pattern[str]) -> str | None:
    s = _TEXT_WRAPPER.sub(r"\1", clean(text)).replace("**", "").strip()
    m = pattern.match(s)
    return next((g for g in m.groups() if g), None).upper() if m else None


def _fast_verdict(gold: str, predicted: str) -> bool | None:
    if not isinstance(gold, str) or not isinstance(predicted, str):
        return False
    if _PLAIN_NUMBER.fullmatch(gold) and _PLAIN_NUMBER.fullmatch(predicted):  # DAPO-Math-17k's case, in microseconds
        return Fraction(gold.strip().rstrip(".")) == Fraction(predicted.strip().rstrip("."))
    if len(gold) > MAX_ANSWER_CHARS or len(predicted) > MAX_ANSWER_CHARS:
        return False
    letter = _choice(gold, _GOLD_CHOICE)
    if letter is not None:
        return _choice(predicted, _PRED_CHOICE) == letter
    g, p = parse_answer(gold), parse_answer(predicted)
    if g is None or p is None:
        return False
    return compare(g, p, fast_scalar_equal)


def verify(gold: str, predicted: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    r"""
    Whether two extracted answers are mathematically equivalent (see the comparison strategy above).

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
    verdict = _fast_verdict(gold, predicted)
    if verdict is not None:
        return verdict
    return _verify_pool.get_pool().compare(gold, predicted, timeout_s) is True


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
    if len(golds) != len(predictions):
        raise ValueError(f"Got {len(golds)} gold answers but {len(predictions)} predictions.")
    verdicts = [_fast_verdict(g, p) for g, p in zip(golds, predictions)]
    pending = sorted({(g, p) for g, p, v in zip(golds, predictions, verdicts) if v is None})
    if not pending:
        return [bool(v) for v in verdicts]
    num_workers = num_workers or DEFAULT_NUM_WORKERS
    pool = _verify_pool.get_pool(num_workers)
    with ThreadPoolExecutor(max_workers=min(num_workers, len(pending))) as executor:
        results = dict(zip(pending, executor.map(lambda pair: pool.compare(*pair, timeout_s) is True, pending)))
    return [bool(v) if v is not None else results[(g, p)] for g, p, v in zip(golds, predictions, verdicts)]


def score_completion(completion_text: str, gold: object, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool | None:
    r"""
    Whether a completion's final answer matches the gold: `None` when the gold itself has no parseable answer (the
    example should be skipped, not scored), `False` when the completion gave no final answer.

    Example:
    ```python
    >>> score_completion("2x = 8, so x = 4.\n\nAnswer: x = 4", "4")
    True

    ```
    """
    gold_answer = extract_gold_answer(gold)
    if gold_answer is None:
        return None
    predicted = extract_answer(completion_text)
    return False if predicted is None else verify(gold_answer, predicted, timeout_s=timeout_s)


def warm_up(num_workers: int | None = None) -> None:
    """Starts the symbolic worker processes now rather than on the first answer that needs them (~1-2 s each)."""
    _verify_pool.get_pool(num_workers or DEFAULT_NUM_WORKERS).warm_up(num_workers or DEFAULT_NUM_WORKERS)


def shutdown_workers() -> None:
    """Stops the symbolic worker processes (they also stop at interpreter exit, and restart lazily when needed)."""
    _verify_pool.shutdown()
