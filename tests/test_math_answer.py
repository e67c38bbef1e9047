"""Extraction, normalisation and equivalence rules of the math verifier, and its accuracy on the labelled suite."""

import doctest
import json
import time
from collections import Counter
from pathlib import Path

import pytest

from dapo_trl.verifier import (
    api,
    extract_answer,
    extract_gold_answer,
    score_completion,
    verify,
    verify_batch,
)
from dapo_trl.verifier import pool as _verify_pool

CASES = Path(__file__).parent / "data" / "verifier_cases.jsonl"


@pytest.fixture(scope="module", autouse=True)
def _stop_workers():
    yield
    api.shutdown_workers()


def test_doctests():
    assert doctest.testmod(api).failed == 0


# ------------------------------------------------------------------------------------------------------ extraction
@pytest.mark.parametrize(
    "text, expected",
    [
        ("We find 3 + 4 = 7 apples, then double.\n\nAnswer: 14", "14"),
        ("Reasoning.\nAnswer: $\\frac{3}{4}$", "\\frac{3}{4}"),
        ("So \\boxed{5}.", "5"),
        ("So \\boxed {5}.", "5"),
        ("So $\\fbox{5}$.", "5"),
        (
            "Thus \\boxed{\\frac{\\sqrt{2}}{\\left(1+\\frac{1}{2}\\right)}}",
            "\\frac{\\sqrt{2}}{\\left(1+\\frac{1}{2}\\right)}",
        ),
        ("Final Answer: The final answer is $x = 3$. I hope it is correct.", "x = 3"),
        ("**Answer:** 42", "42"),
        ("**Final Answer:** $7$", "7"),
        ("**Final Answer**\n\n\\[\n\\boxed{2\\sqrt{2}}\n\\]", "2\\sqrt{2}"),
        ("The final answer is \\(\\frac{1}{6}\\).", "\\frac{1}{6}"),
        ("Hence the answer is \\[ 9 \\]", "9"),
        ("The answer is 42.", "42"),
        ("#### 1,000", "1,000"),
        ("The roots are $\\boxed{2}$ and $\\boxed{-3}$.", "2, -3"),
        ("Answer: $x = 2$ or $x = -3$", "x = 2 or x = -3"),
        ("Answer: The smallest such $n$ is $n = 11$.", "n = 11"),
        ("Answer: \\$4.50", "\\$4.50"),
        ("Answer: (B) $12$", "(B) $12$"),
        ("<think>\nmaybe \\boxed{3}\n</think>\nThe answer is $\\boxed{4}$.", "4"),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        # The last committed answer counts, whichever form it takes.
        ("I first thought \\boxed{15}, but I double counted.\nAnswer: 10", "10"),
        ("Answer: 15 is tempting, but it double counts. Correcting: \\boxed{10}", "10"),
        ("\\boxed{8} ... re-check ... \\boxed{9}", "9"),
        # A sentence that merely mentions an answer is not an answer line.
        ("This answer is consistent with \\boxed{9}.", "9"),
    ],
)
def test_last_committed_answer_wins(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Let me compute: 17 * 3 = 51, then add the remaining terms, which gives 58, and then",
        "We get $x = 7$ from the first equation and substituting into the second we obtain",
        "<think>\nThe answer should be \\boxed{12}, let me double check by",
        "So the hypotenuse is $\\boxed{5",
        "Therefore, the final answer is",
        "",
    ],
)
def test_cut_off_completion_has_no_answer(text):
    assert extract_answer(text) is None


def test_extract_rejects_non_strings_and_oversized_answers():
    with pytest.raises(TypeError, match="`text` must be a str, got NoneType"):
        extract_answer(None)
    assert extract_answer("Answer: " + "1" * 5000) is None


@pytest.mark.parametrize(
    "gold, expected",
    [
        ("34", "34"),
        (34, "34"),
        ("\\frac{1}{2}", "\\frac{1}{2}"),
        ("The sum is $2+3=5$, so the answer is $\\boxed{5}$.", "5"),
        ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),
        ("", None),
        (None, None),
        ("A long worked solution without any marked answer. " * 40, None),
        ("\\boxed{", None),
        ("((((1", None),
    ],
)
def test_extract_gold_answer(gold, expected):
    assert extract_gold_answer(gold) == expected


# ------------------------------------------------------------------------------------------------------ comparison
EQUIVALENT = {
    "form": [
        ("0.5", "\\dfrac12"), ("\\frac{1}{2}", "1/2"), ("\\frac{6}{8}", "\\frac34"), ("\\sqrt{8}", "2\\sqrt{2}"),
        ("(x+1)^2", "x^2+2x+1"), ("x^2-1", "(x-1)(x+1)"), ("2\\frac{1}{2}", "2.5"), ("\\log_2 8", "3"),
        ("\\binom{5}{2}", "10"), ("5!", "120"), ("3+2i", "2i+3"), ("34", "34.0"),
    ],
    "decoration": [
        ("12", "12 \\text{ cm}"), ("45", "45^\\circ"), ("1000000", "1,000,000"), ("1500", "1{,}500"),
        ("25", "\\$25"), ("7", "+7"), ("18", "18."), ("-3", "\u22123"), ("60", "60 \\text{ minutes}"),
        ("12", "12 \\text{ cm}^2"), ("5", "k = 5"), ("3", "x = 3"), ("x=3", "3"), ("2x+3", "y = 2x + 3"),
        ("3", "x = \\frac{6}{2} = 3"),
    ],
    "structure": [
        ("\\{1, 2\\}", "\\{2, 1\\}"), ("2, 3", "3, 2"), ("1, -4", "x = -4 \\text{ or } x = 1"), ("\\pm 2", "2, -2"),
        ("\\{5\\}", "5"), ("x=2, y=3", "y=3, x=2"), ("(1, 2)", "(1,2)"), ("(2, 5)", "2, 5"), ("[1, 3)", "[1,3)"),
        ("(-\\infty, 0) \\cup (1, \\infty)", "(1, \\infty) \\cup (-\\infty, 0)"), ("x \\in [2, 5]", "[2, 5]"),
        ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}"),
        ("\\begin{pmatrix} 3 \\\\ 4 \\end{pmatrix}", "(3, 4)"), ("\\emptyset", "\\varnothing"),
    ],
    "special": [
        ("B", "(B)"), ("C", "\\text{(C)}"), ("D", "\\textbf{(D)}"), ("A", "(A) 12"), ("25\\%", "25"),
        ("0.25", "25\\%"), ("3 \\times 10^{5}", "300000"), ("1.2 \\times 10^{-3}", "0.0012"), ("5\\times10^4", "5e4"),
        ("2^{100}", "1267650600228229401496703205376"), ("\\text{Monday}", "monday"),
        ("x > 3", "3 < x"), ("y = 2x+3", "y = 3+2x"), ("x^2+y^2=1", "2x^2+2y^2=2"),
    ],
}  # fmt: skip
DIFFERENT = {
    "form": [
        ("\\frac{1}{2}", "\\frac{1}{3}"), ("2\\sqrt{3}", "3\\sqrt{2}"), ("(x+1)^2", "x^2+1"), ("\\log_2 8", "4"),
        ("|x|", "x"), ("3+4i", "3-4i"), ("34", "35"), ("34", "-34"),
    ],
    "approximation": [
        ("\\sqrt{2}", "1.414"), ("\\pi", "3.14"), ("\\frac{1}{3}", "0.333"), ("\\frac{2}{3}", "0.67"),
        ("e", "2.718"), ("\\frac{\\pi}{4}", "0.785"),
    ],
    "structure": [
        ("\\{1, 2\\}", "\\{1, 2, 3\\}"), ("2, 3", "2"), ("5", "5, -5"), ("\\pm 2", "2"), ("(1, 2)", "(2, 1)"),
        ("[1, 3)", "[1, 3]"), ("(0, \\infty)", "[0, \\infty)"), ("x=2, y=3", "x=3, y=2"), ("(1,2)", "\\{1, 2\\}"),
        ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{pmatrix} 1 & 3 \\\\ 2 & 4 \\end{pmatrix}"),
        ("(100,200)", "100200"),
    ],
    "special": [
        ("B", "C"), ("D", "d"), ("B", "Both"), ("25\\%", "2.5"), ("3 \\times 10^{5}", "3 \\times 10^{6}"),
        ("2^{100}", "1267650600228229401496703205377"), ("9007199254740993", "9007199254740992"),
        ("\\text{yes}", "\\text{no}"), ("x > 3", "x \\geq 3"), ("x > 3", "x < 3"), ("x", "X"),
    ],
}  # fmt: skip


def _flatten(table):
    return [pytest.param(g, p, id=f"{kind}:{g}|{p}") for kind, pairs in table.items() for g, p in pairs]


@pytest.mark.parametrize("gold, predicted", _flatten(EQUIVALENT))
def test_equivalent(gold, predicted):
    assert verify(gold, predicted) is True


@pytest.mark.parametrize("gold, predicted", _flatten(DIFFERENT))
def test_different(gold, predicted):
    assert verify(gold, predicted) is False


def test_verify_batch_matches_verify():
    pairs = [pair for table in (EQUIVALENT, DIFFERENT) for pairs in table.values() for pair in pairs]
    golds, predictions = zip(*pairs)
    assert verify_batch(golds, predictions, num_workers=2) == [verify(g, p) for g, p in pairs]
    with pytest.raises(ValueError, match="gold answers"):
        verify_batch(["1"], [])


def test_score_completion():
    assert score_completion("2x = 8, so x = 4.\n\nAnswer: x = 4", "4") is True
    assert score_completion("2x = 8, so x = 4.\n\nAnswer: x = 5", "4") is False
    assert score_completion("2x = 8, so x = 4 and then", "4") is False  # no final answer
    assert score_completion("Answer: 4", "no boxed answer in this long solution " * 40) is None


def test_integer_fast_path_needs_no_worker_and_is_fast():
    api.shutdown_workers()
    golds = [str(n) for n in range(5_000)]
    predictions = [str(n + n % 2) for n in range(5_000)]
    start = time.perf_counter()
    verdicts = verify_batch(golds, predictions)
    elapsed = time.perf_counter() - start
    assert verdicts == [n % 2 == 0 for n in range(5_000)]
    assert _verify_pool._POOL is None  # no worker process was started
    assert elapsed < 1.0, f"5,000 integer comparisons took {elapsed:.2f} s"


# -------------------------------------------------------------------------------------------------- labelled suite
def test_labelled_suite_accuracy_and_no_false_positives():
    """The shipped suite: accuracy >= 0.95 overall and zero false positives (a wrong answer scored correct)."""
    rows = [json.loads(line) for line in CASES.read_text().splitlines()]
    assert len(rows) >= 300
    per_category = Counter((row["category"], row["label"]) for row in rows)
    assert all(per_category[(c, True)] and per_category[(c, False)] for c, _ in per_category)

    golds = [extract_gold_answer(row["gold"]) for row in rows]
    assert None not in golds
    predictions = [extract_answer(row["completion"]) for row in rows]
    scored = [i for i, p in enumerate(predictions) if p is not None]
    verdicts = dict(zip(scored, verify_batch([golds[i] for i in scored], [predictions[i] for i in scored])))
    results = [verdicts.get(i, False) for i in range(len(rows))]

    false_positives = [row for row, r in zip(rows, results) if r and not row["label"]]
    errors = [row for row, r in zip(rows, results) if r != row["label"]]
    assert not false_positives, false_positives
    assert 1 - len(errors) / len(rows) >= 0.95, errors
    # Lenient extraction only adds answers where strict finds none; on this suite it must not add a false positive.
    lenient = [extract_answer(row["completion"], extraction="lenient") for row in rows]
    added = [i for i, (p, q) in enumerate(zip(predictions, lenient)) if p is None and q is not None]
    assert all(p == q for p, q in zip(predictions, lenient) if p is not None)
    assert not [rows[i] for i in added if verify(golds[i], lenient[i]) and not rows[i]["label"]]
