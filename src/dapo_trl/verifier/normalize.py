r"""
String-level normalisation of math answers, with no SymPy: decoration stripping ([`clean`]) and answer structure
([`parse_answer`]: lists, sets, tuples and intervals, unions, ratios, matrices, labels).

Everything here is plain Python on short strings (answers are capped at [`MAX_ANSWER_CHARS`]), so it runs in
microseconds and cannot hang. What counts as equal is decided in `dapo_trl.verifier.compare`, whose docstring holds the
equality policy; this module only decides how an answer is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from .guards import environments_balance, holds_nan, is_malformed, is_pathological, is_undefined
from .numbers import number_words

MAX_ANSWER_CHARS = 1_000
MAX_DEPTH = 12  # bracket nesting; real answers stay under 5, 5,000 nested parentheses is an attack
MAX_ITEMS = 64  # elements in a list, set, tuple or matrix

# Joining words are turned into these markers by `clean` and split on by `parse_answer`; `sanitize` removes them (and
# control characters) from any input first, so no answer can contain them.
AND, OR = "\ue001", "\ue002"


@dataclass(frozen=True)
class Scalar:
    text: str
    percent: bool = False
    label: str | None = None
    textual: bool = False  # a word answer (`\text{Monday}`), compared as words, never symbolically


@dataclass(frozen=True)
class Group:
    kind: str  # "list" (bare, unordered), "set", "union", "tuple" (ordered, bracket types matter), "matrix", "ratio"
    items: tuple[Scalar | Group, ...]
    left: str = ""
    right: str = ""
    source: str = ""  # the cleaned text it was read from, for the readings that need it (matrix algebra, 1000,99)


Node = Scalar | Group

# ---------------------------------------------------------------------------------------------------------- cleaning
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f\ue000-\ue00f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_UNICODE = str.maketrans(
    {
        "\u2212": "-", "\u2013": "-", "\u2014": "-", "\u00d7": r"\times ", "\u22c5": r"\cdot ", "\u00b7": r"\cdot ",
        "\u00f7": r"\div ", "\u03c0": r"\pi ", "\u221e": r"\infty ", "\u221a": r"\sqrt", "\u2264": r"\le ",
        "\u2265": r"\ge ", "\u2260": r"\ne ", "\u00b0": r"^\circ ", "\u00b2": "^2", "\u00b3": "^3", "\uff0c": ",",
        "\u00a0": " ", "\u2009": " ", "\u202f": " ", "\u2248": r"\approx ", "\u222a": r"\cup ", "\u2205": r"\emptyset ",
        "\u27e8": r"\langle ", "\u27e9": r"\rangle ",
    }
)  # fmt: skip
_TRIG = r"\\(?:sin|cos|tan|sec|csc|cot)"
_SUBS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p, flags), r)
    for p, r, flags in [
        (r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)\s*\.", "", 0),
        (r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)(?![a-zA-Z])", "", 0),
        (r"\\\$", "", 0),
        (r"\$", "", 0),
        (r"\\[()\[\]]", "", 0),  # \( \) \[ \] math delimiters
        (r"\\(?:displaystyle|textstyle|scriptstyle|limits)(?![a-zA-Z])", "", 0),
        # Thousands separators between digits: 1\,000, 1\!000, 11,\!111, 14{,}916, 14 {, }916.
        (r"(\d),?\\[,!]\s*(?=\d{3}(?!\d))", r"\1", 0),
        (r"(\d)\s*\{\s*,\s*\}\s*(?=\d{3}(?!\d))", r"\1", 0),
        (r"\{\s*,\s*\}", "", 0),
        (r"(?<!\\)\\[!,;:>]|(?<!\\)\\ |~|\\q?quad|\\hspace\*?\{[^{}]*\}", " ", 0),  # \quadx: a missing space
        (r"\\[dtc]frac(?![a-zA-Z])", r"\\frac", 0),
        (r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", 0),  # LaTeX reads \frac12 as \frac{1}{2}
        (r"\\frac\s*(\{[^{}]*\})\s*(\d)", r"\\frac\1{\2}", 0),
        (r"\\frac\s*(\d)\s*(?=\{)", r"\\frac{\1}", 0),
        (r"\\sqrt\s*(\d)", r"\\sqrt{\1}", 0),
        (
            r"\\(?:textbf|textit|textrm|textsf|texttt|textnormal|mathrm|mathbf|mathit|mathsf|mbox|hbox)\s*\{",
            r"\\text{",
            0,
        ),
        (r"\\text\s*\{\s*\\?%\s*\}", "%", 0),
        (
            r"^\s*(?:\\text\{\s*)?(?:the\s+)?(?:final\s+)?answer\s*(?:is\s*:?|:)\s*(?:\}\s*)?",
            "",
            re.I,
        ),  # \boxed{\text{The answer is } 12}
        (r"\\text\s*\{\s*and\s*\}", AND, 0),
        (r"\\text\s*\{\s*or\s*\}", OR, 0),
        # "2 and 3", "19, 46, and 82", "(11,7)or(7,11)": a joining word after a value.
        (r"(?<=[\d})\]])\s*,?\s*and\s*(?=[-\\\d(\[{A-Z])", AND, 0),
        (r"(?<=[\d})\]])\s*,?\s*or\s*(?=[-\\\d(\[{A-Z]|[a-z]\s*(?:[<>=]|\\[lgn]))", OR, 0),
        # Degrees inside a trigonometric function are an angle: \sin 30^\circ is sin(pi/6), not sin(30).
        (rf"({_TRIG})\s*\(?\s*(-?\d+(?:\.\d+)?)\s*\^\s*\{{?\s*\\circ\s*\}}?\s*\)?", r"\1(\\frac{\2\\pi}{180})", 0),
        (r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree", "", 0),
        (r"\\(?:euro|pounds|yen)(?![a-zA-Z])|[\u20ac\u00a3\u00a5\u20b9]", "", 0),
        (r"\\minus(?![a-zA-Z])", "-", 0),
        (r"\\lt(?![a-zA-Z])", "<", 0),
        (r"\\gt(?![a-zA-Z])", ">", 0),
        (r"<=", r"\\le ", 0),
        (r">=", r"\\ge ", 0),
        (r"(?<![\d)!])!=", r"\\ne ", 0),  # but 5!=120 is a factorial
        (r"(?<!\\)\\(?:le|leq|leqslant)(?![a-zA-Z])", r"\\le ", 0),  # not `\\le`, a line break then "le"
        (r"(?<!\\)\\(?:ge|geq|geqslant)(?![a-zA-Z])", r"\\ge ", 0),
        (r"(?<!\\)\\(?:ne|neq)(?![a-zA-Z])", r"\\ne ", 0),
        (r"\\(?:varnothing)(?![a-zA-Z])", r"\\emptyset", 0),
        (r"\\log_\s*\{?\s*e\s*\}?(?![a-zA-Z^])", r"\\ln ", 0),  # \log_e is \ln
        (r"\s+", " ", 0),
    ]
]
# Thousands separators only when the whole answer is one number: "(100,200)" is a point, not 100200; "0,111" is not
# grouped (a leading 0 is a decimal comma, read as such where the other side is a decimal: see `compare`).
_THOUSANDS = re.compile(r"^\s*-?[1-9]\d{0,2}(?:(?:,| )\d{3})+(?:\.\d+)?(?![\d,])")


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
    m = _THOUSANDS.match(text)
    if m and "," not in text[m.end() :]:
        text = re.sub("[, ]", "", m.group()) + text[m.end() :]
    return strip_trailing_punctuation(text.strip())


def strip_trailing_punctuation(text: str) -> str:
    """Drops a sentence's trailing period or comma (but not a factorial's `!` or an escaped `\\.`)."""
    text = text.rstrip()
    while text and text[-1] in ".,;:" and not text.endswith(("\\.", "\\,", "\\;", "\\:")):
        text = text[:-1].rstrip()
    return text


# --------------------------------------------------------------------------------------------------------- structure
_BRACKET = re.compile(r"[([{)\]}]|\\[lr]angle(?![a-zA-Z])")
_OPENING = {"(", "[", "{", "\\langle"}


def max_depth(s: str) -> int:
    """Deepest bracket nesting of `s` (`\\langle` counts), or -1 when the brackets do not balance."""
    depth = best = 0
    for m in _BRACKET.finditer(s):
        depth += 1 if m.group() in _OPENING else -1
        best = max(best, depth)
        if depth < 0:
            return -1
    return best if depth == 0 else -1


@lru_cache(maxsize=64)
def _splitter(seps: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join([_BRACKET.pattern, *(re.escape(sep) for sep in seps)]))


def split_top(s: str, seps: tuple[str, ...]) -> list[str]:
    """`s` split on any of `seps` outside brackets, braces and angle brackets, each part stripped."""
    if not any(sep in s for sep in seps):
        return [s.strip()]
    parts, start, depth = [], 0, 0
    for m in _splitter(seps).finditer(s):
        token = m.group()
        if _BRACKET.fullmatch(token):
            depth += 1 if token in _OPENING else -1
        elif depth == 0:
            parts.append(s[start : m.start()])
            start = m.end()
    parts.append(s[start:])
    return [p.strip() for p in parts]


def _wrapped(s: str, left: str, right: str) -> str | None:
    """Inner text if `s` is exactly `left ... right` with the outer pair matching each other."""
    if not (s.startswith(left) and s.endswith(right)) or len(s) < len(left) + len(right):
        return None
    depth = 0
    for m in _BRACKET.finditer(s):
        depth += 1 if m.group() in _OPENING else -1
        if depth == 0 and m.start() < len(s) - len(right):
            return None
    return s[len(left) : len(s) - len(right)]


_GREEK = r"\\(?:alpha|beta|gamma|delta|epsilon|theta|lambda|mu|sigma|phi|omega|varphi|vartheta|rho|tau|psi)"
_NAME = rf"(?:[A-Za-z]{{1,3}}|{_GREEK})(?:_\{{?\w+\}}?)?'*"  # x, AB, x_1, a_{37}, V_{1}, f', \theta
_FUNC = rf"{_NAME}\(\s*[A-Za-z](?:_\{{?\w+\}}?)?(?:\s*,\s*[A-Za-z](?:_\{{?\w+\}}?)?)*\s*\)"  # f(x), P(A), g(x,y)
_SIMPLE = rf"(?:{_FUNC}|{_NAME})"
# What may stand left of `=` as the name of an answer (policy: see `compare`).
LABEL_NAME = re.compile(
    rf"(?:{_SIMPLE}(?:\s*:\s*{_SIMPLE})+"  # a ratio of names: A:B, V_1:V_2
    rf"|\(\s*{_SIMPLE}(?:\s*[,;]\s*{_SIMPLE}){{1,7}}\s*\)"  # a tuple of names: (p, q), (x, y, z)
    rf"|\|\s*{_SIMPLE}\s*\||\\[lv]ert\s*{_SIMPLE}\s*\\[rv]ert"  # |AB|
    rf"|\\frac\{{\s*{_SIMPLE}\s*\}}\{{\s*{_SIMPLE}\s*\}}"  # \frac{NO}{BO}
    r"|(?:m\s*)?\\(?:angle|measuredangle)\s*\{?[A-Z]{1,3}\}?"  # \angle ABC, m\angle ABC
    rf"|\\(?:det|deg|operatorname\{{\w+\}})\s*\(?\s*{_SIMPLE}\s*\)?"  # \det A
    r"|\\(?:overline|vec|mathbf|overrightarrow|hat)\s*\{[A-Za-z]{1,3}\}"
    rf"|{_SIMPLE}|\\text\{{[^{{}}]*\}})"
)
_LABEL = re.compile(rf"^(?P<label>{LABEL_NAME.pattern})\s*(?P<op>=|\\in(?![a-zA-Z])|\\approx)\s*(?=\S)")
_PERCENT = re.compile(r"\s*(?:\\?%|\\text\{\s*percent(?:age)?\s*\}|\s+percent(?:age)?|\s+pct)$")
_UNIT_TEXT = re.compile(r"(?<=[\d}).\s])\s*\\text\{[^{}]*\}(?:\s*\^\s*\{?[23]\}?)?$")
_UNIT_WORDS = re.compile(r"(?<=[\d}).])\s+[A-Za-z][A-Za-z.]+(?:\s+[A-Za-z][A-Za-z.]*)*(?:\s*\^\s*\{?[23]\}?)?$")
_CURRENCY_WORDS = re.compile(r"^(?:USD|Rs\.?|INR|EUR|GBP)(?![A-Za-z])\s*|\s+(?:USD|EUR|GBP|dollars?)$")
WORDS = re.compile(r"^[A-Za-z][A-Za-z' -]*$")
_TEXT_ONLY = re.compile(r"^\\text\{([^{}]*)\}$")
_INEQUALITY = re.compile(r"<|>|(?<!\\)\\[lgn]e(?: |$)")


def has_letters(s: str) -> bool:
    """Whether `s` has a letter outside LaTeX commands (a variable), so `\\frac{\\sqrt{3}}{2}` has none."""
    return re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", s)) is not None


def is_inequality(s: str) -> bool:
    return _INEQUALITY.search(s) is not None


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
    words = " ".join((m.group(1) if m else s).split()).lower()
    if WORDS.match(words):
        value = number_words(words)
        if value is not None:  # "twelve", "negative twelve", "\text{zero}"
            return Scalar(str(value), percent=percent)
    if m:
        return Scalar(words, textual=True)
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s).strip()
    if len(s) > 3 and WORDS.match(s):
        return Scalar(" ".join(s.split()).lower(), textual=True)
    return Scalar(s, percent=percent)


def _items(parts: list[str]) -> tuple[Node, ...]:
    parts = [p for p in parts if p]
    if len(parts) > MAX_ITEMS:
        raise ValueError("too many items")
    return tuple(_node(p) for p in parts)


def _labelled(s: str, label: str | None) -> Node | None:
    """`x = 3`, `(p, q) = (3, 2)`, `3 = x`, `x = 6/2 = 3`: the value, labelled; `None` if `s` is not labelled."""
    m = _LABEL.match(s)
    if m and label is None:
        rest = s[m.end() :]
        rhs = split_top(rest, ("=",))[-1]  # "x = 6/2 = 3": the value the chain ends on
        if m.group("op") == r"\approx" and not m.group("label").startswith("\\text"):
            rhs = rest
        node = _node(rhs, label=m.group("label").replace(" ", ""))
        if isinstance(node, Scalar):
            return Scalar(node.text, node.percent, m.group("label").replace(" ", ""), node.textual)
        return node
    sides = split_top(s, ("=",))
    if len(sides) == 2 and all(sides) and LABEL_NAME.fullmatch(sides[1]) and not has_letters(sides[0]):
        node = _node(sides[0], label=sides[1])  # "3 = x" is "x = 3" read backwards
        return (
            Scalar(node.text, node.percent, sides[1].replace(" ", ""), node.textual)
            if isinstance(node, Scalar)
            else node
        )
    if len(sides) == 2 and all(sides) and not has_letters(sides[0]) and not has_letters(sides[1]):
        return _node(sides[1], label="")  # "\frac12 + \frac12 = 1": a computation ends on its value
    if len(sides) > 2 and all(sides):  # "1 = y = x = 0": a chain of equal things ends on its value
        return _node(sides[-1], label=sides[0] if LABEL_NAME.fullmatch(sides[0]) else "")
    return None


def _bracketed(s: str, label: str | None) -> Node | None:
    """Sets, tuples, intervals, vectors, matrices and bare-brace groups; `None` if `s` is not one."""
    if s in (r"\emptyset", r"\{\}", "{}"):
        return Group("set", ())
    m = _MATRIX.match(s)
    if m:
        rows = [r for r in split_top(m.group(2), ("\\\\",)) if r]
        cells = [tuple(_node(c) for c in split_top(r, ("&",))) for r in rows]
        if not rows or len(rows) * len(cells[0]) > MAX_ITEMS:
            raise ValueError("bad matrix")
        return Group("matrix", tuple(Group("tuple", c, "(", ")") for c in cells), source=s)
    for left, right, kind in ((r"\{", r"\}", "set"), (r"\langle", r"\rangle", "tuple")):
        inner = _wrapped(s, left, right)
        if inner is not None:
            items = _items(split_top(inner, (",", ";")))
            return Group(kind, items, "(" if kind == "tuple" else "", ")" if kind == "tuple" else "", source=s)
    inner = _wrapped(s, "{", "}")
    if inner is not None:  # bare braces only group: {1,2,3} is the list 1, 2, 3
        return _node(inner, label)
    if s[:1] in "([" and s[-1:] in ")]" and _wrapped(s, s[0], s[-1]) is not None:
        items = split_top(s[1:-1], (",",))
        if len(items) == 1 and (s[0] == "(" or _MATRIX.match(items[0])):
            return _node(items[0], label)  # "(5)" is grouping, not a 1-tuple; "[\begin{array}...]" is the matrix
        if s[0] == "[" and len(items) > 1 and all(i[:1] == "[" and _wrapped(i, "[", "]") for i in items):
            rows = [_items(split_top(i[1:-1], (",",))) for i in items]  # [[1, 2], [3, 4]] is a matrix
            if len({len(r) for r in rows}) == 1:
                return Group("matrix", tuple(Group("tuple", r, "(", ")") for r in rows), source=s)
        return Group("tuple", _items(items), s[0], s[-1], source=s)
    return None


_MATRIX = re.compile(
    r"^\\begin\{([pbBvV]?matrix|array)\}(?:\{[^{}]*\})?((?:(?!\\(?:begin|end)\{).)*)\\end\{\1\}$", re.S
)  # one environment: "A + B" with two matrices is an expression


def _node(s: str, label: str | None = None) -> Node:
    s = s.strip()
    parts = split_top(s, (r"\cup",))
    if len(parts) > 1:
        return Group("union", _items(parts), source=s)
    if ";" in s and len(split_top(s, (";",))) > 1 and all(len(split_top(p, (",",))) > 1 for p in split_top(s, (";",))):
        return Group("list", _items(split_top(s, (";",))), source=s)  # "p=5,q=2;p=7,q=2": two labelled pairs
    parts = [p for p in split_top(s, (",", ";", AND, OR)) if p]
    if len(parts) > 1:
        items = _items(parts)
        if OR in s and all(isinstance(i, Scalar) and is_inequality(i.text) for i in items):
            return Group("union", items, source=s)  # "x < -2 or x > 2" describes a union of intervals
        return Group("list", items, source=s)
    s = s.replace(AND, " ").replace(OR, " ").strip()
    labelled = _labelled(s, label)
    if labelled is not None:
        return labelled
    if r"\approx" in s:  # "\pi \approx 3.14": the exact value was given first
        s = split_top(s, (r"\approx",))[0]
    bracketed = _bracketed(s, label)
    if bracketed is not None:
        return bracketed
    pm = split_top(s, (r"\pm", r"\mp"))
    if len(pm) == 2:  # "2 \pm \sqrt{3}" is the two answers 2 + \sqrt{3} and 2 - \sqrt{3}
        a, b = pm
        neg = f"({b})" if re.search(r"[-+]", b) else b
        return Group("list", (_scalar(f"{a}+{b}" if a else b), _scalar(f"{a}-{neg}")), source=s)
    ratio = split_top(s, (":",))
    if len(ratio) > 1 and all(ratio) and not any(has_letters(p) for p in ratio):
        return Group("ratio", _items(ratio), source=s)  # 7:32, 12:00 (compared term by term, never divided)
    return _scalar(s)


def _scalars(node: Node):
    if isinstance(node, Scalar):
        yield node
    else:
        for item in node.items:
            yield from _scalars(item)


@lru_cache(maxsize=16_384)  # a gold answer is parsed once per group of G completions; nodes are immutable
def parse_answer(text: str) -> Node | None:
    """
    Cleans an extracted answer and parses its structure; `None` if it is empty, malformed (`???`, `\\sqrt`, `2+`, an
    environment never closed), undefined (`\\frac{1}{0}`, `NaN`) or pathological (too large to compute, too deeply
    nested).
    """
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_ANSWER_CHARS:
        return None
    s = clean(text)
    if not s or not 0 <= max_depth(s) <= MAX_DEPTH or is_pathological(s):
        return None
    if not environments_balance(s) or holds_nan(s):
        return None
    try:
        node = _node(s)
    except (ValueError, IndexError, RecursionError):
        return None
    for scalar in _scalars(node):
        if not scalar.textual and (is_malformed(scalar.text) or is_undefined(scalar.text)):
            return None
    return node
