"""
String-level normalisation of math answers, with no SymPy: decoration stripping, answer structure (lists, sets,
tuples, intervals, matrices) and the guards against values too large to compute.

Everything here is plain Python on short strings (answers are capped at [`MAX_ANSWER_CHARS`]), so it runs in
microseconds and cannot hang. Comparison lives in `dapo_trl.math_compare`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

MAX_ANSWER_CHARS = 1_000
MAX_DEPTH = 12  # bracket nesting; real answers stay under 5, 5,000 nested parentheses is an attack
MAX_ITEMS = 64  # elements in a list, set, tuple or matrix
MAX_RESULT_DIGITS = 2_000  # largest number (in digits) a power tower or factorial may produce before we refuse it


@dataclass(frozen=True)
class Scalar:
    text: str
    percent: bool = False
    label: str | None = None
    textual: bool = False  # a word answer (`\text{Monday}`), compared as words, never symbolically


@dataclass(frozen=True)
class Group:
    kind: str  # "list" (bare, unordered), "set", "union", "tuple" (ordered, bracket types matter), "matrix"
    items: tuple[Scalar | Group, ...]
    left: str = ""
    right: str = ""


Node = Scalar | Group

# ---------------------------------------------------------------------------------------------------------- cleaning
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_UNICODE = str.maketrans(
    {
        "\u2212": "-", "\u2013": "-", "\u2014": "-", "\u00d7": r"\times ", "\u22c5": r"\cdot ", "\u00b7": r"\cdot ",
        "\u00f7": r"\div ", "\u03c0": r"\pi ", "\u221e": r"\infty ", "\u221a": r"\sqrt", "\u2264": r"\le ",
        "\u2265": r"\ge ", "\u2260": r"\ne ", "\u00b0": "", "\u00b2": "^2", "\u00b3": "^3", "\uff0c": ",",
        "\u00a0": " ", "\u2009": " ", "\u202f": " ", "\u2248": r"\approx ", "\u222a": r"\cup ", "\u2205": r"\emptyset ",
    }
)  # fmt: skip
_SUBS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p), r)
    for p, r in [
        (r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)\s*\.", ""),
        (r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)(?![a-zA-Z])", ""),
        (r"\\\$", ""),
        (r"\$", ""),
        (r"\\[()\[\]]", ""),  # \( \) \[ \] math delimiters
        (r"\\(?:displaystyle|textstyle|scriptstyle|limits)(?![a-zA-Z])", ""),
        (r"(\d)\\[,!]\s*(?=\d{3}(?!\d))", r"\1"),  # 1\,000 thousands separator
        (r"\{,\}", ""),  # 1{,}000
        (r"(?<!\\)\\[!,;:>]|(?<!\\)\\ |~|\\q?quad(?![a-zA-Z])|\\hspace\*?\{[^{}]*\}", " "),
        (r"\\[dtc]frac(?![a-zA-Z])", r"\\frac"),
        (r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}"),  # LaTeX reads \frac12 as \frac{1}{2}
        (r"\\frac\s*(\{[^{}]*\})\s*(\d)", r"\\frac\1{\2}"),
        (r"\\frac\s*(\d)\s*(?=\{)", r"\\frac{\1}"),
        (r"\\sqrt\s*(\d)", r"\\sqrt{\1}"),
        (
            r"\\(?:textbf|textit|textrm|textsf|texttt|textnormal|mathrm|mathbf|mathit|mathsf|mbox|hbox)\s*\{",
            r"\\text{",
        ),
        (r"\\text\s*\{\s*\\?%\s*\}", "%"),
        (r"\\text\s*\{\s*(?:and|or)\s*\}", ","),
        (r"(?<=[\d})\]])\s*(?:and|or)\s+(?=[-\\\d(\[{a-zA-Z])", ", "),
        (r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree", ""),
        (r"\\(?:euro|pounds|yen)(?![a-zA-Z])|[\u20ac\u00a3\u00a5\u20b9]", ""),
        (r"\\(?:le|leq|leqslant)(?![a-zA-Z])", r"\\le "),
        (r"\\(?:ge|geq|geqslant)(?![a-zA-Z])", r"\\ge "),
        (r"\\(?:ne|neq)(?![a-zA-Z])", r"\\ne "),
        (r"\\(?:varnothing)(?![a-zA-Z])", r"\\emptyset"),
        (r"\s+", " "),
    ]
]
_THOUSANDS = re.compile(r"^\s*-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,])")


def sanitize(text: str) -> str:
    """Drops control characters and lone surrogates, which no answer contains and which break encoders downstream."""
    text = _CONTROL.sub("", text)
    if _SURROGATE.search(text):
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


@lru_cache(maxsize=16_384)
def clean(text: str) -> str:
    """Strips presentation-only LaTeX (delimiters, spacing, `\\left`, `\\dfrac`, degree and currency signs)."""
    text = sanitize(text).translate(_UNICODE)
    for pattern, repl in _SUBS:
        text = pattern.sub(repl, text)
    # Thousands separators only when the whole answer is one number: "(100,200)" is a point, not 100200.
    m = _THOUSANDS.match(text)
    if m and "," not in text[m.end() :]:
        text = m.group().replace(",", "") + text[m.end() :]
    return strip_trailing_punctuation(text)


def strip_trailing_punctuation(text: str) -> str:
    """Drops a sentence's trailing period or comma (but not a factorial's `!` or an escaped `\\.`)."""
    text = text.rstrip()
    while text and text[-1] in ".,;:" and not text.endswith(("\\.", "\\,", "\\;", "\\:")):
        text = text[:-1].rstrip()
    return text


# --------------------------------------------------------------------------------------------------------- structure
_OPEN, _CLOSE = "([{", ")]}"


def max_depth(s: str) -> int:
    depth = best = 0
    for ch in s:
        if ch in _OPEN:
            depth += 1
            best = max(best, depth)
        elif ch in _CLOSE:
            depth -= 1
            if depth < 0:
                return -1
    return best if depth == 0 else -1


def _split_top(s: str, seps: tuple[str, ...]) -> list[str]:
    parts, start, depth, i = [], 0, 0, 0
    while i < len(s):
        ch = s[i]
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif depth == 0:
            sep = next((x for x in seps if s.startswith(x, i)), None)
            if sep is not None:
                parts.append(s[start:i])
                i += len(sep)
                start = i
                continue
        i += 1
    parts.append(s[start:])
    return [p.strip() for p in parts]


def _wrapped(s: str, left: str, right: str) -> str | None:
    """Inner text if `s` is exactly `left ... right` with the outer pair matching each other."""
    if not (s.startswith(left) and s.endswith(right)) or len(s) < len(left) + len(right):
        return None
    depth = 0
    for i, ch in enumerate(s):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
            if depth == 0 and i < len(s) - 1:
                return None
    return s[len(left) : len(s) - len(right)]


_MATRIX = re.compile(r"^\\begin\{([pbBvV]?matrix|array)\}(?:\{[^{}]*\})?(.*)\\end\{\1\}$", re.S)
_LABEL = re.compile(
    r"^(?P<label>[A-Za-z]{1,3}(?:_\{?\w+\}?)?(?:\([a-z]\))?|\\text\{[^{}]*\}"
    r"|\\(?:alpha|beta|gamma|delta|theta|lambda|mu|sigma|phi|omega|varphi|vartheta)(?:_\{?\w+\}?)?)"
    r"\s*(?P<op>=|\\in|\\approx)\s*(?=\S)"
)
_PERCENT = re.compile(r"\s*(?:\\?%|\\text\{\s*percent\s*\}|\s+percent|\s+pct)$")
_UNIT_TEXT = re.compile(r"(?<=[\d}).\s])\s*\\text\{[^{}]*\}(?:\s*\^\s*\{?[23]\}?)?$")
_UNIT_WORDS = re.compile(r"(?<=[\d}).])\s+[A-Za-z][A-Za-z.]+(?:\s+[A-Za-z][A-Za-z.]*)*(?:\s*\^\s*\{?[23]\}?)?$")
_CURRENCY_WORDS = re.compile(r"^(?:USD|Rs\.?|INR|EUR|GBP)(?![A-Za-z])\s*|\s+(?:USD|EUR|GBP|dollars?)$")
_WORDS = re.compile(r"^[A-Za-z][A-Za-z' -]*$")
_TEXT_ONLY = re.compile(r"^\\text\{([^{}]*)\}$")


def _scalar(s: str) -> Scalar:
    s = s.strip().lstrip("+").strip()
    percent = False
    for _ in range(2):  # "50 \text{ percent}", "$50\%$ off": percent and units in either order
        s = _CURRENCY_WORDS.sub("", s).strip()
        stripped = _PERCENT.sub("", s)
        if stripped != s and stripped:
            percent, s = True, stripped.strip()
        for unit in (_UNIT_TEXT, _UNIT_WORDS):
            stripped = unit.sub("", s).strip()
            if stripped:
                s = stripped
    s = strip_trailing_punctuation(s)
    m = _TEXT_ONLY.match(s)
    if m:
        return Scalar(" ".join(m.group(1).split()).lower(), textual=True)
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s).strip()
    if len(s) > 3 and _WORDS.match(s):
        return Scalar(" ".join(s.split()).lower(), textual=True)
    return Scalar(s, percent=percent)


def _node(s: str, label: str | None = None) -> Node:
    s = s.strip()
    parts = _split_top(s, (r"\cup",))
    if len(parts) > 1:
        return Group("union", tuple(_node(p) for p in parts))
    parts = [p for p in _split_top(s, (",", ";")) if p]
    if len(parts) > 1:
        if len(parts) > MAX_ITEMS:
            raise ValueError("too many items")
        return Group("list", tuple(_node(p) for p in parts))
    m = _LABEL.match(s)
    if m and label is None:
        rhs = _split_top(s[m.end() :], ("=",))[-1]  # "x = 6/2 = 3": the value the chain ends on
        if m.group("op") == r"\approx" and not m.group("label").startswith("\\text"):
            rhs = s[m.end() :]
        node = _node(rhs, label=m.group("label").replace(" ", ""))
        return (
            node if not isinstance(node, Scalar) else Scalar(node.text, node.percent, m.group("label"), node.textual)
        )
    if r"\approx" in s:  # "\pi \approx 3.14": the exact value was given first
        s = _split_top(s, (r"\approx",))[0]
    if s in (r"\emptyset", r"\{\}", "{}"):
        return Group("set", ())
    m = _MATRIX.match(s)
    if m:
        rows = [r for r in _split_top(m.group(2), ("\\\\",)) if r]
        cells = [tuple(_node(c) for c in _split_top(r, ("&",))) for r in rows]
        if not rows or len(rows) * len(cells[0]) > MAX_ITEMS:
            raise ValueError("bad matrix")
        return Group("matrix", tuple(Group("tuple", c, "(", ")") for c in cells))
    for left, right, kind in ((r"\{", r"\}", "set"), (r"\langle", r"\rangle", "tuple")):
        inner = _wrapped(s, left, right)
        if inner is not None:
            items = [p for p in _split_top(inner, (",", ";")) if p]
            if len(items) > MAX_ITEMS:
                raise ValueError("too many items")
            return Group(
                kind, tuple(_node(p) for p in items), "(" if kind == "tuple" else "", ")" if kind == "tuple" else ""
            )
    if s[:1] in "([" and s[-1:] in ")]" and _wrapped(s, s[0], s[-1]) is not None:
        items = _split_top(s[1:-1], (",",))
        if len(items) == 1 and s[0] == "(":
            return _node(items[0], label)  # "(5)" is grouping, not a 1-tuple
        if len(items) > MAX_ITEMS:
            raise ValueError("too many items")
        return Group("tuple", tuple(_node(p) for p in items), s[0], s[-1])
    pm = _split_top(s, (r"\pm", r"\mp"))
    if len(pm) == 2:  # "2 \pm \sqrt{3}" is the two answers 2 + \sqrt{3} and 2 - \sqrt{3}
        a, b = pm
        neg = f"({b})" if re.search(r"[-+]", b) else b
        return Group("list", (_scalar(f"{a}+{b}" if a else b), _scalar(f"{a}-{neg}")))
    return _scalar(s)


@lru_cache(maxsize=16_384)  # a gold answer is parsed once per group of G completions; nodes are immutable
def parse_answer(text: str) -> Node | None:
    """Cleans an extracted answer and parses its structure; `None` if it is empty, malformed or pathological."""
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_ANSWER_CHARS:
        return None
    s = clean(text)
    if not s or not 0 <= max_depth(s) <= MAX_DEPTH or is_pathological(s):
        return None
    try:
        return _node(s)
    except (ValueError, IndexError, RecursionError):
        return None


# ----------------------------------------------------------------------------------------------------------- guards
_NUMBER_TOWER = re.compile(r"\d+(?:\s*\^\s*\{?\s*\(?\s*\d+)*")  # 12, 2^{10}, 9^9^9, 9^{9^{9}}
_FACTORIAL = re.compile(r"(\d+)\s*\)?\s*!")
_FACTORIAL_OF_FACTORIAL = re.compile(r"!\s*[)}\]]+\s*!")
_COMBINATORIAL = re.compile(r"!|\\[dt]?binom|\\choose|\\Gamma")
MAX_EXPONENT_DEPTH = 3  # e^{x^{2}} is two levels; e^{e^{e^{e^{10}}}} is an attack


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
