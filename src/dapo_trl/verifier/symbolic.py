r"""
Symbolic equivalence of two answers with latex2sympy2_extended and SymPy.

This module only ever runs inside a verifier worker process (see `dapo_trl.verifier.pool`), because SymPy work on
untrusted expressions can take unbounded time and only a process can be stopped from outside. It never evaluates
text as code: LaTeX goes through latex2sympy2_extended's grammar, and the only SymPy inputs are the objects it builds.

Undefined values never compare equal: an expression that evaluates to complex infinity (`zoo`) or `nan` equals
nothing, itself included, and infinity (`oo`) equals only itself as a bare value (`\infty + 1` is not an answer).
"""

from __future__ import annotations

import random
import re
from fractions import Fraction
from functools import lru_cache

from .compare import compare, fast_mixed, fast_scalar_equal, is_interval
from .normalize import Group, Scalar, is_inequality, parse_answer

_DECIMAL = re.compile(r"(?<![\d.])(\d+)\.(\d+)(?![\d.])")
_DIGITS = 50
_TOLERANCE = 1e-35  # relative; inputs are exact (decimals become fractions), so only true equality gets this close
_POINTS = 6
_AGREEMENTS = 4  # points that must agree (all evaluated ones, until this many) to call two expressions equal


def _exact_decimals(latex: str) -> str:
    # latex2sympy turns 1.414 into a binary Float; as an exact fraction it can never equal sqrt(2) by accident.
    return _DECIMAL.sub(lambda m: rf"(\frac{{{m.group(1)}{m.group(2)}}}{{1{'0' * len(m.group(2))}}})", latex)


@lru_cache(maxsize=1)
def _converters() -> tuple:
    import sympy
    from antlr4 import Token
    from antlr4.atn.PredictionMode import PredictionMode
    from latex2sympy2_extended.latex2sympy2 import ConversionConfig, _Latex2Sympy

    class _Converter(_Latex2Sympy):
        def parse_number(self, text):
            # The parser's own path is sympy.Number(str), i.e. sympify: slow (~4 ms) and a string evaluator. The
            # lexer only lets digits, commas, points and exponents through, which Fraction reads exactly.
            try:
                value = Fraction(text.replace(",", ""))
            except (ValueError, ZeroDivisionError):
                raise ValueError(f"not a number: {text[:20]!r}") from None
            return sympy.Rational(value.numerator, value.denominator)

    class _FastConverter(_Converter):
        # ANTLR's two-stage strategy: the SLL prediction mode is ~7x faster than full LL and, when it parses at all,
        # builds the same tree; on a syntax error we retry with full LL (the default), as ANTLR's docs recommend.
        def create_parser(self, latex_str):
            parser = super().create_parser(latex_str)
            parser._interp.predictionMode = PredictionMode.SLL
            return parser

        def parse_relation(self, latex_str):
            # The grammar's top rule chooses between sets, tuples and relations by looking at the whole input, so its
            # prediction tables never generalise from one answer to the next. Our scalars are never sets (the
            # structure was split off before), so we enter at `relation`, whose decisions look a token or two ahead.
            parser = self.create_parser(latex_str)
            tree = parser.relation(0)
            if parser.getCurrentToken().type != Token.EOF:
                raise ValueError("trailing input")
            return self.convert_relation(tree)

    config = ConversionConfig(interpret_as_mixed_fractions=True, lowercase_symbols=False)
    return (_FastConverter, _Converter), config


@lru_cache(maxsize=4096)
def _parse(latex: str):
    from latex2sympy2_extended import NormalizationConfig, normalize_latex

    text = normalize_latex(
        _exact_decimals(latex), NormalizationConfig(basic_latex=True, malformed_operators=True, boxed="none")
    )
    try:
        (fast, full), config = _converters()
    except (ImportError, AttributeError):  # latex2sympy2_extended internals moved: its public entry point still works
        from latex2sympy2_extended import latex2sympy

        try:
            return latex2sympy(_exact_decimals(latex))
        except Exception:
            return None
    # SLL mispredicts a bare letter under a superscript (`x^2`) as the start of a subscript; `{x}^2` is the same
    # LaTeX and keeps the fast path. Converters are created per parse: they remember `x \approx 3` bindings.
    braced = _BRACE_BASE.sub(_brace_base, text)
    attempts = (
        lambda: fast(config=config).parse_relation(braced),
        lambda: fast(config=config).parse(braced),
        lambda: full(config=config).parse(text),
    )
    for attempt in attempts:
        try:
            return attempt()
        except Exception:  # the parser signals every syntax problem with a bare Exception
            continue
    return None


_BRACE_BASE = re.compile(r"(\\[a-zA-Z]+)|([a-df-zA-Z])(?=\s*\^)")  # commands are skipped; `e^x` stays exp(x)


def _brace_base(m: re.Match) -> str:
    return m.group(1) or "{" + m.group(2) + "}"


def _variants(x: Scalar) -> tuple[str, ...]:
    return (x.text, rf"\frac{{{x.text}}}{{100}}") if x.percent else (x.text,)


_RELATION = re.compile(r"=|<|>|\\le|\\ge|\\ne")
_VARIABLE = re.compile(r"[A-Za-z](?:_\{?\w+\}?)?|\\(?:alpha|beta|gamma|theta|lambda|mu|phi|omega|rho|tau)")


def _as_equation(x: Scalar, other: Scalar) -> Scalar:
    # "y = 2x + 1" was read as the value 2x + 1 labelled y; against an equation ("y - 1 = 2x") it is the equation.
    if x.label and _VARIABLE.fullmatch(x.label) and _RELATION.search(other.text) and not _RELATION.search(x.text):
        return Scalar(f"{x.label} = {x.text}", x.percent)
    return x


def symbolic_scalar_equal(gold: Scalar, pred: Scalar) -> bool:
    fast = fast_scalar_equal(gold, pred)
    if fast is not None:
        return fast
    gold, pred = _as_equation(gold, pred), _as_equation(pred, gold)
    for g in _variants(gold):
        for p in _variants(pred):
            a, b = _parse(g), _parse(p)
            if a is not None and b is not None and _sympy_equal(a, b):
                return True
    return False


def _undefined(x) -> bool:
    import sympy

    has = getattr(x, "has", None)
    return has is not None and bool(has(sympy.zoo, sympy.nan))


def _sympy_equal(a, b) -> bool:
    import sympy

    if _undefined(a) or _undefined(b):
        return False  # 1/0 and 2/0 are both zoo: equal as objects, but neither is a value
    if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr) and (a.has(sympy.oo) or b.has(sympy.oo)):
        return a == b and a in (sympy.oo, -sympy.oo)
    if a == b:  # the parser does not evaluate: 1/(1 - 1) is only seen to be zoo once computed
        return not _undefined(_evaluated(a))
    if _has_operator(a) or _has_operator(b):
        # Under a sum the parser's unordered products stay apart (F_k F_j and F_j F_k), and sampling points cannot
        # tell: rebuilding with SymPy's automatic ordering can.
        ra, rb = _rebuilt(a), _rebuilt(b)
        if ra == rb and not isinstance(ra, sympy.logic.boolalg.BooleanAtom):  # x+1 = x+2 rebuilds to False
            return not _undefined(_evaluated(ra))
    if isinstance(a, sympy.MatrixExpr) or isinstance(b, sympy.MatrixExpr):
        a, b = _explicit(a), _explicit(b)
    if isinstance(a, sympy.MatrixBase) or isinstance(b, sympy.MatrixBase):
        return (
            isinstance(a, sympy.MatrixBase)
            and isinstance(b, sympy.MatrixBase)
            and a.shape == b.shape
            and all(_sympy_equal(x, y) for x, y in zip(a, b))
        )
    if isinstance(a, sympy.Rel) or isinstance(b, sympy.Rel):
        return _relational_equal(a, b)
    if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr):
        return _expr_equal(a, b)
    if isinstance(a, sympy.Set) and isinstance(b, sympy.Set):
        return a.symmetric_difference(b) is sympy.S.EmptySet
    return False


def _has_operator(x) -> bool:
    import sympy

    has = getattr(x, "has", None)
    return has is not None and bool(has(sympy.Sum, sympy.Product, sympy.Integral, sympy.Limit))


def _rebuilt(x, depth: int = 0):
    """`x` rebuilt bottom-up with SymPy's automatic simplification (canonical order), computing nothing else."""
    args = getattr(x, "args", ())
    if not args or depth > 50:
        return x
    try:
        return x.func(*[_rebuilt(arg, depth + 1) for arg in args])
    except Exception:  # some objects cannot be rebuilt from their args; they compare as they are
        return x


def _evaluated(x):
    import sympy

    try:
        return x.doit()
    except Exception:  # SymPy raises many types on odd input; an expression it cannot compute is not a value
        return sympy.nan


def _explicit(x):
    import sympy

    if isinstance(x, sympy.MatrixExpr) and not isinstance(x, sympy.MatrixBase):
        done = x.doit()  # A + B, A B written with explicit matrices: compute the matrix
        return done.as_explicit() if isinstance(done, sympy.MatrixExpr) and hasattr(done, "as_explicit") else done
    return x


# ------------------------------------------------------------------------------------- a value against a structure
def _relation_set(text: str):
    """The set of reals an inequality in one variable describes (`1 \\le |z| \\le 3/2`), or `None`."""
    import sympy

    rel = _parse(text)
    relations = list(rel.args) if isinstance(rel, sympy.And) else [rel]
    if not relations or not all(isinstance(r, sympy.Rel) for r in relations):
        return None
    symbols = set().union(*(r.free_symbols for r in relations))
    if len(symbols) != 1:
        return None
    (x,) = symbols
    result = sympy.S.Reals
    for r in relations:
        result = result.intersect(sympy.solveset(r, x, sympy.S.Reals))
    return result


def _group_set(group: Group):
    """An interval or a union of intervals as a SymPy set, or `None`."""
    import sympy

    if group.kind == "union":
        parts = [_group_set(g) if isinstance(g, Group) else _relation_set(g.text) for g in group.items]
        return None if any(p is None for p in parts) else sympy.Union(*parts)
    if not is_interval(group) or not all(isinstance(x, Scalar) for x in group.items):
        return None
    low, high = (_parse(x.text) for x in group.items)
    if low is None or high is None:
        return None
    return sympy.Interval(low, high, group.left == "(", group.right == ")")


def symbolic_mixed(scalar: Scalar, group: Group, scalar_is_gold: bool) -> bool:
    import sympy

    fast = fast_mixed(scalar, group, scalar_is_gold)
    if fast is not None:
        return fast
    if is_inequality(scalar.text):
        a, b = _relation_set(scalar.text), _group_set(group)
        return a is not None and b is not None and a.symmetric_difference(b) is sympy.S.EmptySet
    if group.kind == "matrix":
        a, b = _parse(group.source), _parse(scalar.text)
        return a is not None and b is not None and _sympy_equal(a, b)
    return False


def _relational_equal(a, b) -> bool:
    import sympy

    if not (isinstance(a, sympy.Rel) and isinstance(b, sympy.Rel)):
        return False
    da, db = _as_zero_form(a), _as_zero_form(b)
    if da[1] != db[1]:
        return False
    # "2x + 2y = 2" and "x + y = 1" describe the same equation; an inequality only survives a positive factor.
    return _proportional(da[0], db[0], positive=da[1] != "==")


def _as_zero_form(rel) -> tuple[object, str]:
    import sympy

    diff = rel.lhs - rel.rhs
    if isinstance(rel, sympy.Eq):
        return diff, "=="
    if isinstance(rel, sympy.Ne):
        return diff, "!="
    if isinstance(rel, (sympy.Gt, sympy.Ge)):
        return -diff, "<" if isinstance(rel, sympy.Gt) else "<="
    return diff, "<" if isinstance(rel, sympy.Lt) else "<="


def _points(symbols: list) -> list[dict]:
    import sympy

    # Seeded so a verdict never changes between runs. Magnitudes are random non-integers away from 0 (no removable
    # singularities, no overflow); signs alternate between consecutive points, so `|x|` and `x` always disagree early.
    rng = random.Random(0)
    return [
        {
            s: (-1) ** (k + j) * sympy.Rational(rng.randint(1, 270), rng.choice((7, 11, 13, 17)))
            for j, s in enumerate(symbols)
        }
        for k in range(_POINTS)
    ]


def _numeric(expr) -> complex | None:
    try:
        value = complex(expr.evalf(_DIGITS))
    except (TypeError, ValueError, OverflowError, ZeroDivisionError, AttributeError):
        return None
    return value if value == value and abs(value) != float("inf") else None


def _same_value(a, b, point: dict | None = None) -> bool | None:
    """Whether `a` and `b` agree at `point` to 35 significant digits; `None` where either is not a number there."""
    diff = (a - b) if point is None else (a - b).xreplace(point)
    scale = _numeric(a if point is None else a.xreplace(point))
    value = _numeric(diff)
    if value is None or scale is None:
        return None
    return abs(value) <= _TOLERANCE * max(1.0, abs(scale))


def _expr_equal(a, b) -> bool:
    import sympy

    if a.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) or b.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan):
        return False  # see `_sympy_equal`: oo - oo is nan, so no arithmetic from here
    if a - b == 0:
        return True
    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    if not symbols:
        verdict = _same_value(a, b)
        if verdict is not None:
            return verdict
    elif len(symbols) <= 8:
        # Polynomial identity testing: distinct expressions agree at a few random rationals with probability ~0.
        agree = 0
        for point in _points(symbols):
            verdict = _same_value(a, b, point)
            if verdict is False:
                return False
            agree += verdict is True
            if agree == _AGREEMENTS:
                return True
    return sympy.simplify(a - b) == 0


def _proportional(x, y, *, positive: bool) -> bool:
    if _expr_equal(x, y) or (not positive and _expr_equal(x, -y)):
        return True
    ratios = []
    for point in _points(sorted(x.free_symbols | y.free_symbols, key=str)):
        vx, vy = _numeric(x.xreplace(point)), _numeric(y.xreplace(point))
        if vx is not None and vy is not None and abs(vy) > 1e-12:
            ratios.append(vx / vy)
    if len(ratios) < 3 or abs(ratios[0]) < 1e-12:
        return False
    if not all(abs(r - ratios[0]) <= 1e-12 * abs(ratios[0]) for r in ratios):
        return False
    return not positive or (abs(ratios[0].imag) < 1e-12 and ratios[0].real > 0)


def symbolic_equivalent(gold: str, pred: str) -> bool:
    """Full comparison of two extracted answers, using SymPy where the string level cannot decide."""
    g, p = parse_answer(gold), parse_answer(pred)
    if g is None or p is None:
        return False
    return compare(g, p, symbolic_scalar_equal, symbolic_mixed) is True


# Common answer shapes (token patterns, not values: the parser's caches key on token types).
_WARM_UP = [
    (r"\frac{1}{2}", r"\sqrt{t^2}"),
    (r"(p+1)^2", r"p^2+2p+1"),
    (r"3m^2-12", r"3(m-2)(m+2)"),
    (r"\frac{k(k+1)}{2}", r"\frac{k^2+k}{2}"),
    (r"\frac{\sqrt{6}-\sqrt{2}}{4}", r"2\sqrt{3}+\pi"),
    (r"\log_2 8", r"\ln(x) - \sin^2 x \cdot \cos(2x)"),
    (r"\ln e^2", r"2\log 5 - \log 25"),
    (r"\ln t", r"\sin^2 t + \cos^2 t"),
    (r"|t|", r"\sqrt{(t-1)^2}"),
    (r"\frac{\pi}{3}", r"\frac{2}{3}\pi"),
    (r"f(t) = 2t - 1", r"(2t+3)(t-1)"),
    (r"\sqrt{9}", r"3^{-2}"),
    (r"\sin\frac{\pi}{4}", r"\cos(\frac{\pi}{3}) + \tan^2\theta"),
    (r"a^{b^c}", r"e^{-3x} \tan\theta"),
    (r"y = 2x + 3", r"x^2 + y^2 \le 1"),
    (r"5!", r"\binom{5}{2} - |x - 1|"),
    (r"2\frac{1}{3}", r"\frac{3}{4}\pi r^3"),
    (r"\sqrt[3]{2} \cdot 10^{-3}", r"\dfrac{-b + \sqrt{b^2 - 4ac}}{2a}"),
    (r"(u+v)^3", r"u^3+3u^2v+3uv^2+v^3"),
    (r"u^2+v^2=4", r"3u^2+3v^2=12"),
    (r"|w|", r"\sqrt{w^2}"),
    (r"[-2, -1] \cup [1, 2]", r"1 \le |w| \le 2"),
    (r"\begin{pmatrix}1 & 2\end{pmatrix}", r"\begin{pmatrix}0 & 1\end{pmatrix} + \begin{pmatrix}1 & 1\end{pmatrix}"),
]


def warm_up() -> None:
    """Imports SymPy and fills the parser's caches, so that no answer pays for them against its deadline."""
    # ANTLR builds its prediction tables lazily: a first parse of each shape costs ~100 ms, a later one ~2 ms.
    for gold, pred in _WARM_UP:
        symbolic_equivalent(gold, pred)
    # SymPy infers a symbol's assumptions (real? positive?) the first time an expression needs them, 20-40 ms per new
    # symbol; symbols are cached by name, and answers mostly use single lower-case letters: pay for all of them here.
    import string

    import sympy

    for letter in string.ascii_lowercase:
        sympy.sqrt(sympy.Symbol(letter) ** 2)
