"""
The equality policy (`dapo_trl.verifier.compare`), kind by kind and in both directions: the forms a careful teacher
accepts, and the near misses that must stay wrong. Each kind is a class of answers that a held-out set or another
library's tests showed, not a list of single cases; the near misses guard against making the kind too loose.
"""

import pytest

from dapo_trl import score_completion, verify
from dapo_trl.verifier import api

KINDS = {
    "labelled answers": (
        [
            ("(3,2)", "(p,q)=(3,2)"), ("(p,q)=(3,2)", "(3,2)"), ("(3,2,7)", "(p,q,r)=(3,2,7)"), ("1", "|AB|=1"),
            ("|AB|=1", "1"), ("1", "A:B=1"), ("11:21", "V_{1}:V_{2}=11:21"), ("V_1:V_2=11:21", "11:21"),
            ("7:32", "S_{MBCN}:S=7:32"), ("-2", r"\det A = -2"), (r"\frac{1}{\sqrt{6}}", r"\frac{NO}{BO}=\frac{1}{\sqrt{6}}"),
            (r"120^\circ", r"\angle ABC = 120^\circ"), ("120", r"m\angle ABC = 120"), ("3", "3 = x"), ("x = 3", "3 = x"),
            ("4, 5", "AB=4,CD=5"), ("(5,2), (7,2)", "p=5,q=2;p=7,q=2"), ("1", "f(x)=1"),
        ],
        [
            ("(3,2)", "(p,q)=(2,3)"), ("1", "|AB|=2"), ("11:21", "V_1:V_2=21:11"), ("-2", r"\det A = 2"),
            (r"120^\circ", r"\angle ABC = 60^\circ"), ("(1,2,3)", "(x,y,z)=(1,2)"), ("1", "x+y=1"), ("0", "a+3z=0"),
            ("(5,2), (7,2)", "p=5,q=2;p=7,q=3"),
        ],
    ),
    "sets written with bare braces": (
        [(r"\{1,2,3\}", "{3,1,2}"), ("1, 2, 3", "{1,2,3}"), ("(1,3)", "{1,3}"), (r"\pm 2021", "{-2021, 2021}")],
        [(r"\{1,2,3\}", "{1,2}"), ("(3,1)", "{1,3}"), (r"\pm 2021", "{2021}"), (r"\{1,2\}", r"\langle 1,2\rangle")],
    ),
    "list joiners and repeated elements": (
        [
            ("19, 46, 82", r"19, 46, \text{ and } 82"), ("19, 46, and 82", "19, 46, 82"), ("(7,11), (11,7)", "(11,7)or(7,11)"),
            ("1, 2, 3", "1 and 2 and 3"), ("21, 16, 11", "21,16 or 11"), ("(1,2), (3,4)", "(1,2), (3,4), (1, 2)"),
        ],
        [
            ("19, 46, 82", r"19, 46, \text{ and } 83"), ("(7,11), (11,7)", "(11,7)or(7,12)"), ("19, 46, 82", "19, 46"),
            ("(1,2), (3,4)", "(1,2), (1,2)"), ("2", "2, 2, 3"),
        ],
    ),
    "thousands separators and decimal commas": (
        [
            ("11111", r"11,\!111"), ("14916", "14{,}916"), ("14916", "14 {, }916"), ("11111111100", r"11,\! 111,\! 111,\! 100"),
            ("7425000", "7,425,000"), ("1000", "1 000"), ("1000.99", "1000,99"), ("0.111", "0,111"), ("1,22", "1.22"),
        ],
        [("32349", "32, 349"), ("1.5", "1,500"), ("1000.99", "1000,98"), ("0.111", "0,1111"), ("2.3", "2, 3")],
    ),
    "equations in another form": (
        [
            ("2x+4y-3=0", r"y=-\frac{1}{2}x+\frac{3}{4}"), (r"y=-\frac12x+\frac34", "2x+4y-3=0"), ("y = 2x+1", "y-1=2x"),
            ("y = 2x+1", "2x - y + 1 = 0"), (r"y = -\frac{1}{2}x + 3", "x + 2y = 6"), ("x^2/4 + y^2/3 = 1", "x^2/16 + y^2/12 = 1/4"),
        ],
        [
            ("y = 2x+1", "y - 1 = -2x"), ("y = 2x+1", "2x + y + 1 = 0"), (r"y = -\frac{1}{2}x + 3", "x + 2y = 5"),
            ("2x+1", "y - 1 = 2x"), ("2x+4y-3=0", "y=-2x+3"),
        ],
    ),
    "inequalities against intervals": (
        [
            ("[1, 5)", r"1 \le x < 5"), (r"1 \le x < 5", "[1, 5)"), (r"(0, \infty)", "x > 0"), (r"(0, \infty)", "0 < x"),
            (r"(-\infty, 4]", r"x \leq 4"), (r"(-\infty,-2)\cup(2,\infty)", r"x < -2 \text{ or } x > 2"),
            (r"(-\infty,-2)\cup(2,\infty)", "x < -2 or x > 2"), (r"x \in [-2, 7]", r"-2 \le x \le 7"), ("(0,1)", "0<f(x)<1"),
            ("(-793, 10)", "-793 < a < 10"), (r"[-\frac{3}{2}, -1] \cup [1, \frac{3}{2}]", r"1 \le |z| \le \frac{3}{2}"),
            (r"(1, \infty)", "-x < -1"),
            (r"[2, \infty)", r"x \geq 2"),
            (r"(-\infty,-1]\cup[1,\infty)", r"x\le-1 or x\ge1"),
            (r"(-\infty,2)\cup(2,\infty)", r"x \neq 2"),
        ],
        [
            ("[1, 5)", "1 < x < 5"), ("[1,5)", r"1 \le x \le 5"), (r"(0,\infty)", r"x \ge 0"), (r"(0, \infty)", "x < 0"),
            (r"(-\infty,-2)\cup(2,\infty)", r"x < -2 \text{ or } x \ge 2"), (r"(-\infty,-2)\cup(2,\infty)", "x < -2 and x > 2"),
            ("(0,1)", "0 < 2x < 1"), (r"[-\frac{3}{2}, -1] \cup [1, \frac{3}{2}]", r"1 < |z| \le \frac{3}{2}"),
            (r"[2, \infty)", "x > 2"), (r"(-\infty,2)\cup(2,\infty)", r"x \neq 3"),
        ],
    ),
    "matrices": (
        [
            (r"\begin{pmatrix}1 & 2 \\ 3 & 4\end{pmatrix}", r"\left[\begin{array}{cc}1 & 2 \\ 3 & 4\end{array}\right]"),
            (r"\begin{pmatrix}1 & 2 \\ 3 & 4\end{pmatrix}", "[[1, 2], [3, 4]]"),
            (r"(\begin{pmatrix}\frac{1}{3}\\ \frac{1}{5} \end{pmatrix})", r"\begin{pmatrix}\frac13\\0.2\end{pmatrix}"),
            (
                r"\begin{pmatrix}\frac{1}{2} & -\frac{\sqrt{3}}{2} \\ \frac{\sqrt{3}}{2} & \frac{1}{2}\end{pmatrix}",
                r"\begin{pmatrix}\cos 60^\circ & -\sin 60^\circ \\ \sin 60^\circ & \cos 60^\circ\end{pmatrix}",
            ),
            (r"\begin{pmatrix}6 & 8 \\ 10 & 12\end{pmatrix}", r"\begin{pmatrix}1 & 2 \\ 3 & 4\end{pmatrix} + \begin{pmatrix}5 & 6 \\ 7 & 8\end{pmatrix}"),
        ],
        [
            (r"\begin{pmatrix}1 & 2 \\ 3 & 4\end{pmatrix}", r"\left[\begin{array}{cc}1 & 2 \\ 3 & 5\end{array}\right]"),
            (r"\begin{pmatrix}1 & 2 \\ 3 & 4\end{pmatrix}", "[[1, 3], [2, 4]]"),
            (r"\begin{pmatrix}1 & 2 \\ 3 & 4\end{pmatrix}", "[[1, 2, 3], [4]]"),
            (r"\begin{pmatrix}\frac{1}{2} & 0\end{pmatrix}", r"\begin{pmatrix}\cos 60 & 0\end{pmatrix}"),
            (r"\begin{pmatrix}6 & 8 \\ 10 & 12\end{pmatrix}", r"\begin{pmatrix}1 & 2 \\ 3 & 4\end{pmatrix} \begin{pmatrix}5 & 6 \\ 7 & 8\end{pmatrix}"),
        ],
    ),
    "tuples and vectors": (
        [
            ("(1,2,3)", r"\langle 1,2,3\rangle"), (r"\langle 1,2,3\rangle", r"\begin{pmatrix}1\\2\\3\end{pmatrix}"),
            ("(1,2,3)", "(x,y,z)=(1,2,3)"), (r"\left\langle 1, 2 \right\rangle", "(1, 2)"),
        ],
        [(r"\langle 1,2\rangle", r"\{1,2\}"), ("(1,2,3)", r"\langle 1,3,2\rangle"), ("(1,2,3)", r"\langle 1,2\rangle")],
    ),
    "number words": (
        [("12", "twelve"), ("-12", "negative twelve"), ("0", "zero"), ("21", "twenty-one"), ("105", "one hundred and five"),
         ("12", r"\text{twelve}"), ("3000", "three thousand")],
        [("12", "thirteen"), ("-12", "twelve"), ("12", "twelve hundred"), ("95", "nineteen eighty"), ("5", "five six")],
    ),
    "repeating decimals": (
        [(r"\frac{1}{3}", r"0.\overline{3}"), (r"\frac{11}{6}", r"1.8\overline{3}"), (r"0.\overline{3}", r"\frac13"),
         (r"\frac{1}{7}", r"0.\overline{142857}"), (r"\frac{1}{3}", r"0.\dot{3}"), (r"\frac{1}{3}", r"0.\bar{3}")],
        [(r"\frac{1}{3}", "0.3"), (r"\frac{1}{3}", "0.333"), (r"\frac{11}{6}", r"1.\overline{83}"), (r"0.\overline{3}", "0.33")],
    ),
    "mixed numbers": (
        [(r"\frac{7}{2}", "3 1/2"), ("3.5", r"3\ 1/2"), (r"3\frac{1}{2}", "3 1/2"), ("-3.5", "-3 1/2")],
        [("3 1/2", "31/2"), (r"\frac{7}{2}", "31/2"), ("3 1/2", "3.2"), ("3 1/2", "1.5")],
    ),
    "long decimals printing a rational": (
        [(r"\frac{1}{12}", "0.0833333333333333"), (r"\frac{2}{3}", "0.6666666667"), ("0.0833333333333333", r"\frac{1}{12}")],
        [(r"\frac{1}{12}", "0.083"), (r"\frac{2}{3}", "0.6666666668"), (r"\sqrt{2}", "1.4142135623730951"), (r"\pi", "3.14159265358979")],
    ),
    "logarithms, minus signs, answer phrases": (
        [(r"\ln 2", r"\log_e 2"), (r"\ln 2", r"\log_{e} 2"), ("-5", r"\minus 5"), ("12", r"\text{The answer is } 12"), ("12", r"\text{Answer: } 12")],
        [(r"\ln 2", r"\log_{10} 2"), (r"\ln 2", r"\log_e 3"), ("5", r"\minus 5"), ("12", r"\text{The answer is } 13")],
    ),
    "choice letters": (
        [("(B)", "b"), ("(B)", "B"), ("B", "(b)"), (r"\text{(C)}", "c"), ("C", r"\textbf{(C)}")],
        [("(B)", "c"), ("D", "d"), ("B", "Both"), ("(B)", "bb")],
    ),
    "units and currency": (
        [("1000.99", "1,000.99€"), ("1000.99", r"1,000.99 \text{ m}^2"), ("125", r"125\textnormal{ miles}"), ("28\\%", "28 pct")],
        [("1000.99", "1,000.98€"), ("125", r"126\textnormal{ miles}"), ("0.28", "28")],
    ),
    "ratios and times": (
        [("11:21", "11:21"), ("12:00", "12:00"), ("7:32", r"S:T=7:32")],
        [("12:00", "1:00"), ("2:4", "1:2"), ("11:21", "21:11"), ("7:32", r"\frac{7}{32}")],
    ),
}  # fmt: skip


def _cases(direction: int):
    return [
        pytest.param(gold, pred, id=f"{kind}:{gold}|{pred}")
        for kind, pairs in KINDS.items()
        for gold, pred in pairs[direction]
    ]


@pytest.fixture(scope="module", autouse=True)
def _pool():
    api.warm_up(2)
    yield
    api.shutdown_workers()


@pytest.mark.parametrize("gold, pred", _cases(0))
def test_equal(gold, pred):
    assert verify(gold, pred) is True


@pytest.mark.parametrize("gold, pred", _cases(1))
def test_near_miss(gold, pred):
    assert verify(gold, pred) is False


def test_every_kind_has_both_directions():
    assert all(len(true) >= 3 and len(false) >= 3 for true, false in KINDS.values())


# ------------------------------------------------------------------------------------------ extraction, both modes
STRICT = [
    # An answer line that runs on ends with its sentence; the value after the anchor or the copula counts.
    ("Final Answer: The largest $n$ is 34.", "34", "35"),
    ("Final Answer: The volume of $ABCDEFGH$ is 120. I hope it is correct.", "120", "8"),
    (
        "So the answer is $12$ hours since $t$ grows and $n$ stays fixed, which we check by plugging in $n = 3$",
        "12",
        "3",
    ),
    ("Thus the final answer is 5 apples, and we check that $5 \\cdot 2 = 10$ matches $n$", "5", "10"),
    ("Answer: The smallest such $n$ is $n = 11$.", "11", "n"),
    ("Final Answer: Jane started growing Sphere 3 hours ago. I hope it is correct.", "3", "8"),
    # "Final Answer:" in the middle of a line.
    ("We check both cases and we are done. Final Answer: $7$", "7", "8"),
    # Several boxes joined by a short phrase are one answer; a retraction or a sentence end separates them.
    (r"$\boxed{(3, 3)} \text{ for part (a) and } \boxed{(1, 1)}$", "(3, 3), (1, 1)", "(1, 1)"),
    (r"\boxed{1} papers and \boxed{2} bins", "1, 2", "2"),
    (
        r"\($y_1 = \boxed{-2(x - 1)^2 + 5} \) and \( y_2 = \boxed{3(x + 2)^2 - 2} \)",
        "-2x^2+4x+3, 3x^2+12x+10",
        "3x^2+12x+10",
    ),
    (r"\boxed{1} no no no no no \boxed{2}", "2", "1, 2"),
    (r"I wrote \boxed{1}. But that is wrong, and \boxed{2} is right", "2", "1, 2"),
    # Text after a chat-turn marker is not the answer.
    ("Answer: 5<|im_end|>\n<|im_start|>user\nAnswer: 6", "5", "6"),
    (r"The answer is \boxed{\text{The answer is } 12}", "12", "13"),
    # Math spans joined by "or" on an answer line are one answer: here a union of intervals.
    ("Answer: $x<1$ or $x>3$", r"(-\infty,1)\cup(3,\infty)", r"(-\infty,1]\cup(3,\infty)"),
]


@pytest.mark.parametrize("completion, right, wrong", STRICT)
def test_strict_extraction_reads_the_committed_answer(completion, right, wrong):
    assert score_completion(completion, right) is True
    assert score_completion(completion, wrong) is False


@pytest.mark.parametrize("completion", ["Answer: between 3 and 5", "Answer: 12, or maybe 13", "Answer: 12 or 13"])
@pytest.mark.parametrize("gold", ["3", "5", "12", "13"])
def test_prose_with_several_numbers_commits_to_none(completion, gold):
    assert score_completion(completion, gold) is False


LENIENT = [
    ("Therefore $x \\geq 5$ is the solution.", r"x \ge 5", "x > 5"),
    ("the number is not 10 which is 1,000.99€", "1000.99", "10"),
    ("so the number is 10 which is 1,000.99m²", "1000.99", "10"),
    ("Soucis : 2,74 $ a..", "2.74", "274"),
    ("28 pct", r"28\%", "0.28"),
    (
        "The identity matrix is $ \\begin{pmatrix}1 & 0 \\\\ 0 & 1\\end{pmatrix} $.",
        r"\begin{pmatrix}1&0\\0&1\end{pmatrix}",
        "1",
    ),
    (
        "So P(A) = 2/3. Therefore, the probability that Alice wins is 2/3. I hope it is correct. <|im_start|>user",
        "2/3",
        "3",
    ),
    ("There are 12 distinct sequences that meet the three conditions. I hope it is correct.", "12", "3"),
    ("Answer \\[ 9 \\]", "9", "10"),
    ("$${1,2,3}$$", "1, 2, 3", "1, 2"),
    ("We get $$\\Delta p \\Delta x \\geq \\frac{h}{4\\pi}.$$ Therefore the error increases by 100%.", r"100\%", "4"),
]


@pytest.mark.parametrize("completion, right, wrong", LENIENT)
def test_lenient_extraction_reads_the_final_sentence(completion, right, wrong):
    assert score_completion(completion, right, extraction="lenient") is True
    assert score_completion(completion, wrong, extraction="lenient") is False
    assert score_completion(completion, right) is False  # strict: nothing was committed


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("We get $x = 7$ from the first equation and substituting into the second equation we obtain", "7"),
        ("Answer $ \n 9 \n $", "9"),  # inline math does not span lines: two dollar signs
        ("Answer \\( \n 9 \n \\)", "9"),
        ("AZYUK2A", "2"),  # a digit inside a word is not a number
        ("We will now use the lemma. Let me think about the next step.", "3"),
        ("<think>\nThe answer should be 12, let me double check", "12"),
        ("So the hypotenuse is $\\boxed{5", "5"),
    ],
)
def test_lenient_extraction_finds_nothing_in_an_unfinished_or_wordy_ending(completion, gold):
    assert score_completion(completion, gold, extraction="lenient") is False


@pytest.mark.parametrize(
    "text", ["Answer: 12", "So the answer is $\\boxed{12}$.", "It is 13. Finally we have twelve."]
)
def test_lenient_only_adds_to_strict(text):
    strict = api.extract_answer(text)
    if strict is not None:
        assert api.extract_answer(text, extraction="lenient") == strict
