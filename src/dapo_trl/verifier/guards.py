r"""
Guards on a cleaned answer string, before anything computes with it: values too large to compute ([`is_pathological`]),
text that is not a math answer at all ([`is_malformed`]: `???`, `\sqrt`, `2+`; [`environments_balance`]:
`\begin{pmatrix}1` never closed), and values that are undefined as written ([`is_undefined`]: `\frac{1}{0}`, `0/0`;
[`holds_nan`]: `NaN`).

A malformed or undefined gold answer makes its row unusable (the reward is `None`, not a match against identical junk
in a completion); a malformed or undefined prediction is wrong. Plain Python on short strings, linear time.
"""

from __future__ import annotations

import math
import re

MAX_RESULT_DIGITS = 2_000  # largest number (in digits) a power tower or factorial may produce before we refuse it
MAX_EXPONENT_DEPTH = 3  # e^{x^{2}} is two levels; e^{e^{e^{e^{10}}}} is an attack

# ---------------------------------------------------------------------------------------------------- too large
_NUMBER_TOWER = re.compile(r"\d+(?:\s*\^\s*\{?\s*\(?\s*\d+)*")  # 12, 2^{10}, 9^9^9, 9^{9^{9}}
_FACTORIAL = re.compile(r"(\d+)\s*\)?\s*!")
_FACTORIAL_OF_FACTORIAL = re.compile(r"!\s*[)}\]]+\s*!")
_COMBINATORIAL = re.compile(r"!|\\[dt]?binom|\\choose|\\Gamma")


def _log10_size(tower: str) -> float:
    """log10 of the value of a numeric power tower such as `9^{9^{9}}` (`inf` when even that is out of range)."""
    parts = re.findall(r"\d+", tower)
    if len(parts) > 6:
        return math.inf
    top = parts[-1].lstrip("0") or "0"
    digits = float(len(top)) if len(top) > 300 else math.log10(max(int(top), 1))
    for base in reversed(parts[:-1]):
        base = base.lstrip("0") or "0"
        if len(base) == 1 and int(base) <= 1:
            digits = 0.0
            continue
        if digits >= 300:
            return math.inf
        digits = 10.0**digits * (math.log10(int(base)) if len(base) <= 300 else len(base))
    return digits


def _max_size(s: str) -> float:
    return max((_log10_size(m.group()) for m in _NUMBER_TOWER.finditer(s)), default=0.0)


def _exponents(s: str) -> list[str]:
    """The contents of the top-level superscripts of `s` (`x^{a+1}` gives `a+1`, `2^10` gives `1`)."""
    found, i = [], 0
    while (i := s.find("^", i)) >= 0:
        i += 1
        while i < len(s) and s[i] == " ":
            i += 1
        if i < len(s) and s[i] == "{":
            depth, start = 0, i
            for j in range(i, len(s)):
                depth += {"{": 1, "}": -1}.get(s[j], 0)
                if depth == 0:
                    break
            found.append(s[start + 1 : j])
            i = j + 1
        else:
            found.append(s[i : i + 1])
    return found


def _exponent_depth(s: str, limit: int) -> int:
    if limit < 0:
        return 0
    return max((1 + _exponent_depth(e, limit - 1) for e in _exponents(s)), default=0)


def is_pathological(s: str) -> bool:
    """Refuses values too large to compute exactly (9^9^9^9, 1000000!, (10^9)!) before SymPy tries."""
    if _max_size(s) > MAX_RESULT_DIGITS or _exponent_depth(s, MAX_EXPONENT_DEPTH) > MAX_EXPONENT_DEPTH:
        return True
    # Exponents above 10^5 make exact arithmetic (and SymPy's evaluation at sample points) explode.
    if any(_max_size(e) > 5 for e in _exponents(s)):
        return True
    if _COMBINATORIAL.search(s) and (_max_size(s) > 4 or s.count("!") > 4 or _FACTORIAL_OF_FACTORIAL.search(s)):
        return True
    return any(len(m.group(1)) > 4 or int(m.group(1)) > 800 for m in _FACTORIAL.finditer(s))


# ------------------------------------------------------------------------------------------------------ junk
_COMMAND = re.compile(r"\\([A-Za-z]+)")
# Commands that are nothing without their arguments, and how many they take.
_ARGUMENTS = {
    "sqrt": 1, "frac": 2, "binom": 2, "dbinom": 2, "tbinom": 2, "overline": 1, "underline": 1, "text": 1, "hat": 1,
    "vec": 1, "bar": 1, "boxed": 1, "fbox": 1, "mathbb": 1, "mathcal": 1, "operatorname": 1, "dot": 1,
}  # fmt: skip
_OPERATOR_END = re.compile(r"(?:[+\-*/^_=<>]|\\(?:cdot|times|div|le|ge|ne|pm|mp|cup|cap|in))\s*$")
_OPERATOR_START = re.compile(r"^\s*(?:[*/^_=<>]|\\(?:cdot|times|div|cup|cap)(?![a-zA-Z]))")
_DOUBLE_OPERATOR = re.compile(r"[+\-*/]\s*[*/^=]|\^\s*[*/^=]")
_EMPTY_GROUP = re.compile(r"(?<!\\)\{\s*\}|\(\s*\)|\[\s*\]")


def _argument_end(s: str, i: int) -> int | None:
    """End index of the macro argument starting at `s[i]` (spaces skipped), or `None` if there is none."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s) or s[i] in "}])^_,=+*/&":
        return None
    if s[i] == "{":
        depth = 0
        for j in range(i, len(s)):
            depth += {"{": 1, "}": -1}.get(s[j], 0)
            if depth == 0:
                return j + 1 if s[i + 1 : j].strip() else None
        return None
    if s[i] == "\\":
        m = _COMMAND.match(s, i)
        return m.end() if m else None
    return i + 1


def is_malformed(s: str) -> bool:
    """
    Whether `s` cannot be a math answer: nothing but punctuation (`???`, `...`), a question mark, a command missing
    its argument (`\\sqrt`, `\\frac{1}`), an empty group (`x^{}`), or an operator with nothing on one side (`2+`).
    """
    if not re.search(r"[A-Za-z0-9]", s) or "?" in s:
        return True
    if _OPERATOR_END.search(s) or _OPERATOR_START.search(s) or _DOUBLE_OPERATOR.search(s) or _EMPTY_GROUP.search(s):
        return True
    for m in _COMMAND.finditer(s):
        needed = _ARGUMENTS.get(m.group(1), 0)
        i = m.end()
        if m.group(1) == "sqrt" and s[i : i + 1] == "[":  # \sqrt[3]{2}
            i = s.find("]", i) + 1 or len(s)
        for _ in range(needed):
            end = _argument_end(s, i)
            if end is None:
                return True
            i = end
    return False


# ------------------------------------------------------------------------------------------------- undefined
_ZERO = r"\s*[-+]?\s*0+(?:\.0*)?\s*"
_ZERO_DENOMINATOR = re.compile(
    rf"\\frac\s*(?:\{{[^{{}}]*\}}|\S)\s*\{{{_ZERO}\}}|\\frac\s*(?:\{{[^{{}}]*\}}|\d)\s*0(?![\d.])"
    rf"|/\s*\(?{_ZERO}\)?(?![\d.])|\\div{_ZERO}(?![\d.])"
)
_DENOMINATOR = re.compile(r"\\frac\s*\{[^{}]*\}\s*\{([^{}]*)\}|/\s*(\([^()]*\)|[^\s()+\-*/]+)")
_PLAIN_NONZERO = re.compile(r"^\(?\s*(?:[1-9]\d*(?:\.\d*)?|0?\.\d*[1-9]\d*|0*[1-9]\d*)\s*\)?$")
_PARTIAL_FUNCTION = re.compile(r"\\(?:log|ln|lg|tan|cot|sec|csc|arcsin|arccos|arcsec|arccsc)(?![a-zA-Z])|\^\s*\{?\s*-")


def is_undefined(s: str) -> bool:
    """Whether `s` divides by a literal zero (`\\frac{1}{0}`, `0/0`, `5 \\div 0`): undefined, never equal to anything."""
    return _ZERO_DENOMINATOR.search(s) is not None


_NOT_A_NUMBER = re.compile(r"(?<![A-Za-z\\])nan(?![A-Za-z])", re.IGNORECASE)


def holds_nan(s: str) -> bool:
    """Whether `s` holds a NaN (`NaN`, `nan`, `\\text{NaN}`: a float written out by a program), undefined as a value."""
    return _NOT_A_NUMBER.search(s) is not None


_ENVIRONMENT = re.compile(r"\\(begin|end)\s*\{\s*([A-Za-z*]+)\s*\}")


def environments_balance(s: str) -> bool:
    """Whether every `\\begin{name}` of `s` is closed by its `\\end{name}`, in order (`\\begin{pmatrix}1` is not)."""
    stack: list[str] = []
    for m in _ENVIRONMENT.finditer(s):
        if m.group(1) == "begin":
            stack.append(m.group(2))
        elif not stack or stack.pop() != m.group(2):
            return False
    return not stack


def may_be_undefined(s: str) -> bool:
    """
    Whether only computing can tell that `s` is defined: a constant denominator that is not a plain non-zero number
    (`\\frac{1}{1-1}`), a logarithm or a tangent (`\\log 0`, `\\tan\\frac{\\pi}{2}`), a negative power (`0^{-1}`). Two
    identical strings like these are compared by value (undefined values equal nothing), never as strings.
    """
    if _PARTIAL_FUNCTION.search(s) or ("\\infty" in s and s.strip().lstrip("+-").strip() != "\\infty"):
        return True  # oo - oo
    for m in _DENOMINATOR.finditer(s):
        denominator = (m.group(1) if m.group(1) is not None else m.group(2)).strip()
        letters = re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", denominator))
        if not letters and not _PLAIN_NONZERO.match(denominator):
            return True
    return False
