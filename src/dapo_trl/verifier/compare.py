r"""
The equality policy, and the comparison of parsed answers without SymPy (the fast path and structural matching).

Comparisons are three-valued: `True`/`False` when the string level can decide, `None` when only the symbolic comparator
(`dapo_trl.verifier.symbolic`, run in a worker process) can. [`compare`] takes the scalar comparator and the
mixed-structure comparator as arguments, so the same structural rules serve both levels.

Equality policy: what counts as the same answer, kind by kind, and why. The rule of thumb is a careful teacher's: a
different *notation* for the same mathematical object is correct, a different object, an approximation or a hedge is
not. Each kind is tested in both directions in `tests/test_verifier_policy.py`.

| kind | equal | not equal | why |
|---|---|---|---|
| numbers | `0.5` = `1/2` = `\frac12`; `34` = `34.0`; `2^{10}` = `1024`; `3\times10^5` = `3e5` | `0.333` vs `1/3`; `34` vs `-34` | exact rationals, no rounding |
| long decimals | `0.0833333333333333` = `\frac{1}{12}` (>= 10 significant digits, rounded or truncated) | `0.083` vs `\frac1{12}`; `1.414213562` vs `\sqrt2` | a float printout of a rational is that rational; an irrational has no exact decimal |
| repeating decimals | `0.\overline{3}` = `\frac13`; `1.8\overline{3}` = `\frac{11}{6}` | `0.\overline{3}` vs `0.3` | exact notation |
| mixed numbers | `3 1/2` = `3\frac12` = `7/2` | `3 1/2` vs `31/2` | the space is the notation |
| number words | `twelve` = `12`; `negative twelve` = `-12`; `zero` = `0` | `twelve` vs `13` | words spell numbers |
| separators | `1,000,000` = `1\,000\,000` = `11,\!111`-style = `14{,}916`; `1000,99` = `1000.99` where the other side is a decimal | `32, 349` vs `32349`; `1,500` vs `1.5` | a decimal comma is read only where no thousands grouping fits |
| decoration | units (`12 \text{ cm}`, `1000.99€`), degrees (`45^\circ`), currency, `+7`, `\left(`, `\dfrac`, trailing period | | presentation only |
| percent | `25\%` = `25` = `0.25` | `25\%` vs `2.5` | graders accept either reading |
| labels | `x = 3` = `3`; `3 = x`; `(p,q) = (3,2)` = `(3,2)`; `\|AB\| = 1`, `A:B = 1`, `\det A = -2`, `\angle ABC = 120^\circ`, `\frac{NO}{BO} = ...`: the value counts; `x = 6/2 = 3` ends on `3` | | the name of the answer is not the answer |
| equations | `2x+2y=2` = `x+y=1`; `y = -\frac12 x + \frac34` = `2x+4y-3=0`; `y-1=2x` = `y=2x+1` (a labelled value is the equation `label = value` when the other side is an equation) | `y=2x+1` vs `y=-2x+1` | same solution set, up to a non-zero factor |
| inequalities | `x > 3` = `3 < x` = `(3, \infty)`; `1 \le x < 5` = `[1, 5)`; `x < -2 or x > 2` = `(-\infty,-2) \cup (2,\infty)`; `1 \le \|z\| \le \frac32` = the union it solves to | `x \ge 3` vs `(3, \infty)`; `x > 3` vs `x < 3` | an inequality in one variable describes its solution set; strictness is the bracket |
| lists | `2, 3` = `3, 2`; `19, 46, and 82` = `19, 46, 82`; `(11,7)or(7,11)`; `\pm 2` = `2, -2`; a repeated element counts once | `2, 3` vs `2`; `\pm 2` vs `2` | a list of answers is a set; a partial or hedged answer is wrong |
| sets | `\{1,2\}` = `\{2,1\}`; `{1,2,3}` (bare braces only group) = `1,2,3`; `\{5\}` = `5` | `\{1,2\}` vs `(1,2)`; `\langle 1,2\rangle` vs `\{1,2\}` | braces without a backslash are invisible in LaTeX |
| tuples, vectors | `(1,2)` = `1, 2` = `\langle 1,2\rangle` = a column or row `pmatrix` | `(1,2)` vs `(2,1)`; `(1,2)` vs `[1,2)` | ordered; bracket types make intervals |
| matrices | any matrix environment, `\left[\begin{array}...\right]`, `[[1,2],[3,4]]`, entries compared as answers (`\cos 60^\circ` = `\frac12`); `A + B` is computed | other shape or entry | |
| ratios | `11:21` = `11:21`, term by term | `12:00` vs `1:00`; `2:4` vs `1:2` | a ratio or a time is never divided |
| choices | `B` = `(B)` = `\text{(B)}` = `\textbf{(B)}` = `(B) 12` = `b` | `B` vs `C`; `B` vs `Both` | a lone letter names the choice |
| words | `\text{Monday}` = `monday` | `\text{yes}` vs `\text{no}` | words compare as words, never as products of symbols |
| expressions | `(x+1)^2` = `x^2+2x+1`; `\sqrt8` = `2\sqrt2`; `\log_e 2` = `\ln 2`; `\sin 30^\circ` = `\frac12` | `\|x\|` vs `x`; `1.414` vs `\sqrt2` | SymPy, exact decimals, identity testing at random points |
| undefined | never equal to anything, itself included: `\frac10` vs `\frac20`, `0/0`, `\infty - \infty`, `\log 0`, `\frac{1}{1-1}`; a gold like this is unusable | | undefined is not a value (zoo, nan); `\infty` = `\infty` only as a bare value or interval end |
| junk | a gold `???`, `\sqrt`, `2+` is unusable (reward `None`), never matched, even against the same junk | | |

Deliberately not equal: degrees and radians (`30^\circ` vs `\frac{\pi}{6}` outside a trigonometric function), `i` as
the imaginary unit (`e^{i\pi}` vs `-1`; `i` is a symbol, so `3+2i` = `2i+3` still holds), and an expression against
an equation it does not name (`2x+1` vs `y - 1 = 2x`: which variable the answer is for is not written).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

from .guards import may_be_undefined
from .normalize import LABEL_NAME, WORDS, Group, Node, Scalar, has_letters, is_inequality
from .numbers import decimal_comma, decimal_renders, exact_number

ScalarEq = Callable[[Scalar, Scalar], bool | None]
MixedEq = Callable[[Scalar, Group, bool], bool | None]  # (scalar, group, scalar_is_gold)

_SINGLE_TOKEN_GROUP = re.compile(r"([\^_])\{(\w|\\[a-zA-Z]+)\}")
_SPACES = re.compile(r"(?<!\d) +| +(?!\d)")


def _values(x: Scalar, v: Fraction) -> tuple[Fraction, ...]:
    # A percent sign is decoration or a factor of 1/100, and graders accept either reading (25% = 25 = 0.25).
    return (v, v / 100) if x.percent else (v,)


def _numbers_equal(gold: Scalar, gk: str, gv: Fraction, pred: Scalar, pk: str, pv: Fraction) -> bool:
    for a in _values(gold, gv):
        for b in _values(pred, pv):
            if a == b or decimal_renders(pk, a) or decimal_renders(gk, b):
                return True
    return False


def _squash(text: str) -> str:
    return _SPACES.sub("", text)  # but "3 1/2" (a mixed number) is not "31/2"


def fast_scalar_equal(gold: Scalar, pred: Scalar) -> bool | None:
    """Decides equality when strings or exact rationals suffice; `None` when it needs SymPy."""
    if gold.textual or pred.textual:
        return gold.text.lower() == pred.text.lower()
    gk, pk = _squash(gold.text), _squash(pred.text)
    same = gk == pk or _SINGLE_TOKEN_GROUP.sub(r"\1\2", gk) == _SINGLE_TOKEN_GROUP.sub(r"\1\2", pk)  # e^{2} is e^2
    if same and not may_be_undefined(gk):
        return True
    gv, pv = exact_number(gold.text), exact_number(pred.text)
    if gv is not None and pv is not None:
        return _numbers_equal(gold, gk, gv, pred, pk, pv)
    if WORDS.match(gk) and WORDS.match(pk):  # bare symbols: "x" vs "y" needs no algebra
        return False
    return None


# ------------------------------------------------------------------------------------------- inequality -> interval
_VALUE = r"[^<>]+?"
_OPS = r"<|>|\\le |\\ge "
_ONE_SIDED = re.compile(rf"^(?P<a>{_VALUE})\s*(?P<op>{_OPS})\s*(?P<b>{_VALUE})$")
_CHAIN = re.compile(rf"^(?P<a>{_VALUE})\s*(?P<op1>{_OPS})\s*(?P<x>{_VALUE})\s*(?P<op2>{_OPS})\s*(?P<b>{_VALUE})$")


def _constant(s: str) -> bool:
    return bool(s) and not has_letters(s)


def interval_of(text: str) -> Group | None:
    """`x > 3` as `(3, \\infty)`, `1 \\le x < 5` as `[1, 5)`: one variable against constants; `None` otherwise."""
    if "\\\\" in text:  # a line break, not a relation
        return None
    s = text.replace("\\le", "\\le ").replace("\\ge", "\\ge ").replace("  ", " ").strip()
    m = _CHAIN.match(s)
    if m:
        a, x, b = m.group("a").strip(), m.group("x").strip(), m.group("b").strip()
        ops = (m.group("op1").strip(), m.group("op2").strip())
        if not (LABEL_NAME.fullmatch(x) and _constant(a) and _constant(b)):
            return None
        if all(op in ("<", "\\le") for op in ops):
            low, high, closed_low, closed_high = a, b, ops[0] == "\\le", ops[1] == "\\le"
        elif all(op in (">", "\\ge") for op in ops):
            low, high, closed_low, closed_high = b, a, ops[1] == "\\ge", ops[0] == "\\ge"
        else:
            return None
        return _interval(low, high, closed_low, closed_high)
    m = _ONE_SIDED.match(s)
    if not m:
        return None
    a, b, op = m.group("a").strip(), m.group("b").strip(), m.group("op").strip()
    if LABEL_NAME.fullmatch(b) and _constant(a):  # "3 < x" is "x > 3"
        a, b, op = b, a, {"<": ">", ">": "<", "\\le": "\\ge", "\\ge": "\\le"}[op]
    if not (LABEL_NAME.fullmatch(a) and _constant(b)):
        return None
    if op in (">", "\\ge"):
        return _interval(b, "\\infty", op == "\\ge", False)
    return _interval("-\\infty", b, False, op == "\\le")


def _interval(low: str, high: str, closed_low: bool, closed_high: bool) -> Group:
    return Group("tuple", (Scalar(low), Scalar(high)), "[" if closed_low else "(", "]" if closed_high else ")")


def is_interval(group: Group) -> bool:
    return group.kind == "tuple" and len(group.items) == 2 and group.left in "([" and group.right in ")]"


def fast_mixed(scalar: Scalar, group: Group, scalar_is_gold: bool) -> bool | None:
    """A single value against a structure: the readings that can make them equal at the string level."""
    comma = decimal_comma(group.source) if group.kind == "list" and len(group.items) == 2 else None
    value = exact_number(scalar.text)
    if comma is not None and value is not None and "." in scalar.text:  # 1000,99 against 1000.99
        return any(v == comma for v in _values(scalar, value))
    if is_inequality(scalar.text) and (is_interval(group) or group.kind == "union"):
        interval = interval_of(scalar.text) if is_interval(group) else None
        if interval is None:
            return None  # |z| <= 1, -x > -1: SymPy solves it
        return (
            compare(interval, group, fast_scalar_equal, fast_mixed)
            if scalar_is_gold
            else (compare(group, interval, fast_scalar_equal, fast_mixed))
        )
    if group.kind == "matrix" and "\\begin" in scalar.text:
        return None  # matrix algebra: "A + B" against the sum
    return False


# ------------------------------------------------------------------------------------------------------ structure
def _distinct(items: tuple[Node, ...]) -> list[Node]:
    # Repeats are found at the string level only: cheap, and a repeat SymPy alone could spot is rare.
    kept: list[Node] = []
    for item in items:
        if not any(compare(k, item, fast_scalar_equal) is True for k in kept):
            kept.append(item)
    return kept


def _unordered(gold: tuple[Node, ...], pred: tuple[Node, ...], eq: ScalarEq, mixed: MixedEq) -> bool | None:
    gold, pred = _distinct(gold), _distinct(pred)  # a list of answers is a set
    if len(gold) != len(pred):
        return False
    # Equivalence is transitive, so greedily pairing each gold item with its first match is a perfect matching.
    unused, undecided = list(range(len(pred))), False
    for g in gold:
        verdicts = [(j, compare(g, pred[j], eq, mixed)) for j in unused]
        hit = next((j for j, v in verdicts if v is True), None)
        if hit is not None:
            unused.remove(hit)
        elif any(v is None for _, v in verdicts):
            undecided = True
        else:
            return False
    return None if undecided else True


def _ordered(gold: tuple[Node, ...], pred: tuple[Node, ...], eq: ScalarEq, mixed: MixedEq) -> bool | None:
    if len(gold) != len(pred):
        return False
    verdicts = [compare(g, p, eq, mixed) for g, p in zip(gold, pred)]
    if False in verdicts:
        return False
    return True if all(verdicts) else None


def _by_label(gold: Group, pred: Group, eq: ScalarEq, mixed: MixedEq) -> bool | None | str:
    items = gold.items + pred.items
    if not all(isinstance(x, Scalar) and x.label for x in items):
        return "n/a"
    g, p = sorted(gold.items, key=lambda x: x.label), sorted(pred.items, key=lambda x: x.label)
    if [x.label for x in g] != [x.label for x in p]:
        return "n/a"
    return _ordered(tuple(g), tuple(p), eq, mixed)


def compare(gold: Node, pred: Node, eq: ScalarEq, mixed: MixedEq = fast_mixed) -> bool | None:
    """Structural equivalence of two parsed answers, with `eq` deciding scalar pairs (three-valued)."""
    if isinstance(gold, Scalar) and isinstance(pred, Scalar):
        return eq(gold, pred)
    # A one-element set or list is its element: "\{5\}" and "5" are the same answer.
    if isinstance(gold, Scalar):
        if pred.kind in ("set", "list") and len(pred.items) == 1:
            return compare(gold, pred.items[0], eq, mixed)
        return mixed(gold, pred, True)
    if isinstance(pred, Scalar):
        if gold.kind in ("set", "list") and len(gold.items) == 1:
            return compare(gold.items[0], pred, eq, mixed)
        return mixed(pred, gold, False)
    kinds = {gold.kind, pred.kind}
    if gold.kind == "list" and pred.kind == "list":
        by_label = _by_label(gold, pred, eq, mixed)
        if by_label != "n/a":
            return by_label
    if kinds <= {"set", "list"} or kinds == {"union"}:
        return _unordered(gold.items, pred.items, eq, mixed)
    if kinds == {"tuple"}:
        same_brackets = (gold.left, gold.right) == (pred.left, pred.right)
        return _ordered(gold.items, pred.items, eq, mixed) if same_brackets else False
    if kinds in ({"matrix"}, {"ratio"}):
        return _ordered(gold.items, pred.items, eq, mixed)
    # A point written without parentheses, or a column/row vector against a tuple, is still the ordered answer.
    flat = [_flat_vector(x) for x in (gold, pred)]
    if None not in flat:
        return _ordered(flat[0], flat[1], eq, mixed)
    return False


def _flat_vector(x: Group) -> tuple[Node, ...] | None:
    if x.kind == "list" or (x.kind == "tuple" and x.left == "(" and x.right == ")"):
        return x.items
    if x.kind == "matrix" and (len(x.items) == 1 or all(len(r.items) == 1 for r in x.items)):
        return tuple(i for r in x.items for i in r.items)
    return None
