"""
Comparison of parsed answers without SymPy: the exact-number fast path and structural matching.

Comparisons are three-valued: `True`/`False` when the string level can decide, `None` when only the symbolic
comparator (`dapo_trl.math_symbolic`, run in a worker process) can. [`compare`] takes the scalar comparator as an
argument, so the same structural rules serve both levels.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction

from .math_normalize import _WORDS, MAX_RESULT_DIGITS, Group, Node, Scalar, max_depth

ScalarEq = Callable[[Scalar, Scalar], bool | None]

# -------------------------------------------------------------------------------------------- exact-number fast path
_INT = re.compile(r"^-?\d+$")
_DEC = re.compile(r"^-?(?:\d+\.\d*|\.\d+)$")
_SCI = re.compile(r"^(-?\d+(?:\.\d+)?)(?:\\times|\\cdot|\*|x)10\^\{?([+-]?\d{1,4})\}?$")
_SCI_E = re.compile(r"^(-?\d+(?:\.\d+)?)[eE]([+-]?\d{1,4})$")
_FRAC = re.compile(r"^(-?)\\frac\{(-?\d+(?:\.\d+)?)\}\{(-?\d+(?:\.\d+)?)\}$")
_SLASH = re.compile(r"^(-?\d+)/(\d+)$")
_POW = re.compile(r"^(-?)(\d+)\^\{?(-?\d{1,6})\}?$")


def exact_number(text: str) -> Fraction | None:
    """The exact rational value of a plain number (integer, decimal, fraction, 3\\times10^{5}, 2^{10}) or `None`."""
    s = text.replace(" ", "")
    while s.startswith("{") and s.endswith("}") and max_depth(s[1:-1]) >= 0:
        s = s[1:-1]
    if len(s) > MAX_RESULT_DIGITS:
        return None
    try:
        if _INT.match(s) or _DEC.match(s):
            return Fraction(s)
        if m := _FRAC.match(s) or _SLASH.match(s):
            sign, num, den = m.groups() if len(m.groups()) == 3 else ("", *m.groups())
            value = Fraction(num) / Fraction(den)
            return -value if sign else value
        if m := _SCI.match(s) or _SCI_E.match(s):
            return Fraction(m.group(1)) * Fraction(10) ** int(m.group(2))
        if m := _POW.match(s):
            base, exponent = int(m.group(2)), int(m.group(3))
            if base > 1 and abs(exponent) * math.log10(base) > MAX_RESULT_DIGITS:
                return None
            value = Fraction(base) ** exponent
            return -value if m.group(1) else value
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _values(x: Scalar, v: Fraction) -> tuple[Fraction, ...]:
    # A percent sign is decoration or a factor of 1/100, and graders accept either reading (25% = 25 = 0.25).
    return (v, v / 100) if x.percent else (v,)


_SINGLE_TOKEN_GROUP = re.compile(r"([\^_])\{(\w|\\[a-zA-Z]+)\}")


def fast_scalar_equal(gold: Scalar, pred: Scalar) -> bool | None:
    """Decides equality when strings or exact rationals suffice; `None` when it needs SymPy."""
    if gold.textual or pred.textual:
        return gold.text.lower() == pred.text.lower()
    gk, pk = gold.text.replace(" ", ""), pred.text.replace(" ", "")
    if gk == pk or _SINGLE_TOKEN_GROUP.sub(r"\1\2", gk) == _SINGLE_TOKEN_GROUP.sub(r"\1\2", pk):  # e^{2} is e^2
        return True
    gv, pv = exact_number(gk), exact_number(pk)
    if gv is not None and pv is not None:
        return any(a == b for a in _values(gold, gv) for b in _values(pred, pv))
    if _WORDS.match(gk) and _WORDS.match(pk):  # bare symbols: "x" vs "y" needs no algebra
        return False
    return None


# ------------------------------------------------------------------------------------------------------ comparison
def _unordered(gold: tuple[Node, ...], pred: tuple[Node, ...], eq: ScalarEq) -> bool | None:
    if len(gold) != len(pred):
        return False
    # Equivalence is transitive, so greedily pairing each gold item with its first match is a perfect matching.
    unused, undecided = list(range(len(pred))), False
    for g in gold:
        verdicts = [(j, compare(g, pred[j], eq)) for j in unused]
        hit = next((j for j, v in verdicts if v is True), None)
        if hit is not None:
            unused.remove(hit)
        elif any(v is None for _, v in verdicts):
            undecided = True
        else:
            return False
    return None if undecided else True


def _ordered(gold: tuple[Node, ...], pred: tuple[Node, ...], eq: ScalarEq) -> bool | None:
    if len(gold) != len(pred):
        return False
    verdicts = [compare(g, p, eq) for g, p in zip(gold, pred)]
    if False in verdicts:
        return False
    return True if all(verdicts) else None


def _by_label(gold: Group, pred: Group, eq: ScalarEq) -> bool | None | str:
    items = gold.items + pred.items
    if not all(isinstance(x, Scalar) and x.label for x in items):
        return "n/a"
    g, p = sorted(gold.items, key=lambda x: x.label), sorted(pred.items, key=lambda x: x.label)
    if [x.label for x in g] != [x.label for x in p]:
        return "n/a"
    return _ordered(tuple(g), tuple(p), eq)


def compare(gold: Node, pred: Node, eq: ScalarEq) -> bool | None:
    """Structural equivalence of two parsed answers, with `eq` deciding scalar pairs (three-valued)."""
    if isinstance(gold, Scalar) and isinstance(pred, Scalar):
        return eq(gold, pred)
    # A one-element set or list is its element: "\{5\}" and "5" are the same answer.
    if isinstance(gold, Scalar):
        return compare(gold, pred.items[0], eq) if pred.kind in ("set", "list") and len(pred.items) == 1 else False
    if isinstance(pred, Scalar):
        return compare(gold.items[0], pred, eq) if gold.kind in ("set", "list") and len(gold.items) == 1 else False
    kinds = {gold.kind, pred.kind}
    if gold.kind == "list" and pred.kind == "list":
        by_label = _by_label(gold, pred, eq)
        if by_label != "n/a":
            return by_label
    if kinds <= {"set", "list"} or kinds == {"union"}:
        return _unordered(gold.items, pred.items, eq)
    if kinds == {"tuple"}:
        return _ordered(gold.items, pred.items, eq) if (gold.left, gold.right) == (pred.left, pred.right) else False
    if kinds == {"matrix"}:
        return _ordered(gold.items, pred.items, eq)
    # A point written without parentheses, or a column/row vector against a tuple, is still the ordered answer.
    flat = [_flat_vector(x) for x in (gold, pred)]
    if None not in flat:
        return _ordered(flat[0], flat[1], eq)
    return False


def _flat_vector(x: Group) -> tuple[Node, ...] | None:
    if x.kind == "list" or (x.kind == "tuple" and x.left == "(" and x.right == ")"):
        return x.items
    if x.kind == "matrix" and (len(x.items) == 1 or all(len(r.items) == 1 for r in x.items)):
        return tuple(i for r in x.items for i in r.items)
    return None
