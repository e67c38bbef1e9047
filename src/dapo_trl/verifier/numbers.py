r"""
Exact values of plain numbers, without SymPy: integers of any length, decimals, fractions, mixed numbers, repeating
decimals, scientific notation, small powers and number words. Each reader returns a `Fraction` or `None`.

Why exact: a float cannot tell 9007199254740993 from 9007199254740992, and `0.333` must never equal 1/3 by rounding.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from .guards import MAX_RESULT_DIGITS

_INT = re.compile(r"^-?\d+$")
_DEC = re.compile(r"^-?(?:\d+\.\d*|\.\d+)$")
_SCI = re.compile(r"^(-?\d+(?:\.\d+)?)(?:\\times|\\cdot|\*|x)10\^\{?([+-]?\d{1,4})\}?$")
_SCI_E = re.compile(r"^(-?\d+(?:\.\d+)?)[eE]([+-]?\d{1,4})$")
_FRAC = re.compile(r"^(-?)\\frac\{(-?\d+(?:\.\d+)?)\}\{(-?\d+(?:\.\d+)?)\}$")
_SLASH = re.compile(r"^(-?\d+)/(\d+)$")
_POW = re.compile(r"^(-?)(\d+)\^\{?(-?\d{1,6})\}?$")
# 3 1/2 and 3\frac{1}{2} are mixed numbers (7/2); written without the space, 31/2 is thirty-one halves.
_MIXED = re.compile(r"^(-?)(\d+)(?:\s+(\d+)\s*/\s*(\d+)|\s*\\frac\{(\d+)\}\{(\d+)\})$")
# 0.\overline{3} (or 0.\bar{3}, 0.\dot{3}) is 1/3, 1.8\overline{3} is 11/6.
_REPEATING = re.compile(r"^(-?)(\d*)\.(\d*)\\(?:(?:overline|bar)\{(\d+)\}|dot\{?(\d)\}?)$")


def _mixed(s: str) -> Fraction | None:
    m = _MIXED.match(s)
    if not m:
        return None
    whole, num, den = int(m.group(2)), int(m.group(3) or m.group(5)), int(m.group(4) or m.group(6))
    if den == 0 or num >= den:  # 3 4/2 is not how anyone writes a mixed number
        return None
    value = whole + Fraction(num, den)
    return -value if m.group(1) else value


def _repeating(s: str) -> Fraction | None:
    m = _REPEATING.match(s)
    if not m:
        return None
    whole, fixed, period = m.group(2) or "0", m.group(3), m.group(4) or m.group(5)
    value = Fraction(int(whole)) + Fraction(int(fixed or "0"), 10 ** len(fixed))
    value += Fraction(int(period), 10 ** len(fixed) * (10 ** len(period) - 1))
    return -value if m.group(1) else value


def exact_number(text: str) -> Fraction | None:
    """The exact rational value of a plain number (integer, decimal, fraction, 3\\times10^{5}, 2^{10}) or `None`."""
    mixed = _mixed(text.strip())
    if mixed is not None:
        return mixed
    s = text.replace(" ", "")
    while s.startswith("{") and s.endswith("}") and _balanced(s[1:-1]):
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
        return _repeating(s)
    except (ValueError, ZeroDivisionError):
        return None


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


MIN_FLOAT_DIGITS = 10


def decimal_renders(decimal: str, value: Fraction) -> bool:
    """
    Whether `decimal` is `value` printed to floating-point precision: at least 10 significant digits, equal to `value`
    rounded or truncated at its last digit (`0.0833333333333333` for 1/12). Shorter decimals (`0.333` for 1/3) are
    approximations, and a decimal never stands for an irrational value (that is not a `Fraction`).
    """
    m = re.fullmatch(r"-?(\d*)\.(\d+)", decimal.strip())
    if not m or len((m.group(1) + m.group(2)).lstrip("0")) < MIN_FLOAT_DIGITS:
        return False
    places = len(m.group(2))
    written = Fraction(decimal.strip())
    scale = 10**places
    truncated = Fraction(math.trunc(value * scale), scale)
    rounded = Fraction(round(value * scale), scale)
    return written in (truncated, rounded)


def decimal_comma(text: str) -> Fraction | None:
    """`1000,99` or `0,111` read with a decimal comma (only where no thousands grouping fits); else `None`."""
    m = re.fullmatch(r"(-?)(\d+),(\d+)", text.strip())  # "2, 3" (with a space) is a list
    if not m or (m.group(2)[0] != "0" and len(m.group(2)) <= 3 and len(m.group(3)) == 3):
        return None  # 1,500 is fifteen hundred
    value = Fraction(f"{m.group(2)}.{m.group(3)}")
    return -value if m.group(1) else value


# ------------------------------------------------------------------------------------------------------ words
_UNITS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen"
).split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_WORD_VALUES = {w: i for i, w in enumerate(_UNITS)} | {w: 10 * (i + 2) for i, w in enumerate(_TENS)}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}


def number_words(text: str) -> int | None:
    """`twelve` is 12, `negative twelve` -12, `one hundred and five` 105, `twenty-one` 21; `None` if not a number."""
    words = text.lower().replace("-", " ").split()
    sign = 1
    if words and words[0] in ("negative", "minus"):
        sign, words = -1, words[1:]
    words = [w for w in words if w != "and"]
    if not words or len(words) > 12:
        return None
    total = current = 0
    previous = None  # value of the previous word when it was a unit, teen or tens word
    for word in words:
        if word in _WORD_VALUES:
            value = _WORD_VALUES[word]
            if previous is not None and (previous < 20 or value >= 10):  # "five six", "nineteen eighty"
                return None
            current += value
            previous = value
        elif word == "hundred" and 0 < current < 10:
            current *= 100
            previous = None
        elif word in _SCALES and word != "hundred" and current:
            total += current * _SCALES[word]
            current, previous = 0, None
        else:
            return None
    return sign * (total + current)
