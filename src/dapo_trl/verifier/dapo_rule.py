r"""
The DAPO paper's reward rule (`rule="dapo"`), for reproducing the paper: the rule of verl's DAPO recipe, rebuilt from
its description.

1. Only the last 300 characters of the completion are read.
2. The answer is the rest of the line after the last `Answer:` in them (case-insensitive, spaces allowed around the
   colon); with no such line the answer is the placeholder `[INVALID]`, which matches nothing real.
3. The answer and the gold are normalised the same way (Minerva's normalisation, as in the paper's code):
   keep what follows the last `=`; apply the fixed substitutions (drop `an `, `a `, `\$`, `\ ` and every space,
   `mbox` -> `text`, `\text{and}` -> `,`, ...), then delete the fixed list of unit and filler words (`square`, `ways`,
   `dollars`, `cm`, `^\circ`, `{,}`, ... as plain substrings, so `cm` also goes from inside other words); keep only the
   first `$...$` span; unwrap `\text{}`, `\textbf{}`, `\overline{}` and `\boxed{}`; expand `\fracab` to
   `\frac{a}{b}` and `\sqrta` to `\sqrt{a}`; drop `$`; drop the commas of a number that is digits and commas only.
4. Correct if and only if the two normalised strings are identical.

So `Answer: 1/2` does not match a gold of `\frac{1}{2}`, a boxed answer without an `Answer:` line scores as wrong, and
an `Answer:` line more than 300 characters before the end is not seen. That is the rule, not a defect: use it to
reproduce the paper's numbers and training signal, and `rule="equivalence"` (the default) otherwise.
"""

from __future__ import annotations

import re

WINDOW_CHARS = 300
INVALID = "[INVALID]"

_ANSWER_LINE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
# The rule's fixed tables, in the order they are applied.
_SUBSTITUTIONS = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)  # fmt: skip
_DELETIONS = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue", "points",
    "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
    "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}",
    "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)  # fmt: skip
_FIRST_DOLLAR_SPAN = re.compile(r"(.*?)\$(.*?)\$(.*)")
_UNWRAP_LAZY = [re.compile(rf"\\{name}\{{(.*?)\}}") for name in ("text", "textbf", "overline")]
_UNWRAP_BOXED = re.compile(r"\\boxed\{(.*)\}")
_SHORT_FRAC = re.compile(r"frac([^{])(.)")
_SHORT_SQRT = re.compile(r"sqrt([^{])")


def normalize(answer: str) -> str:
    """Step 3 of the rule (see the module docstring)."""
    answer = answer.split("=")[-1]
    for old, new in _SUBSTITUTIONS:
        answer = answer.replace(old, new)
    for word in _DELETIONS:
        answer = answer.replace(word, "")
    answer = _FIRST_DOLLAR_SPAN.sub(r"$\2$", answer)
    for pattern in _UNWRAP_LAZY:
        answer = pattern.sub(r"\1", answer)
    answer = _UNWRAP_BOXED.sub(r"\1", answer)
    answer = _SHORT_FRAC.sub(r"frac{\1}{\2}", answer)
    answer = _SHORT_SQRT.sub(r"sqrt{\1}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def extract(completion: str) -> str:
    """Steps 1-3 for a completion: its normalised answer, or the normalised placeholder when it has no answer line."""
    found = _ANSWER_LINE.findall(completion[-WINDOW_CHARS:])
    return normalize(found[-1] if found else INVALID)


def gold_text(gold: str) -> str:
    """The gold as the rule reads it: as given, or the last `\\boxed{}` of a worked solution (MATH's `solution`)."""
    start = gold.rfind("\\boxed{")
    if start < 0:
        return gold
    depth = 0
    for i in range(start + len("\\boxed"), len(gold)):
        depth += {"{": 1, "}": -1}.get(gold[i], 0)
        if depth == 0:
            return gold[start + len("\\boxed{") : i]
    return gold


def is_correct(completion: str, gold: str) -> bool:
    """The whole rule: the completion's normalised answer equals the normalised gold, character for character."""
    return extract(completion) == normalize(gold_text(gold))
