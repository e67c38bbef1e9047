r"""
Finding the final answer in a completion ([`extract_answer`]) or in a dataset's reference ([`extract_gold_answer`]).

Extraction policy. Two modes (`extraction=`):

- `"strict"` (the training default): only a *committed* answer counts, whichever of these comes last:
    1. the last `\boxed{...}` / `\boxed {...}` / `\fbox{...}` (nested braces allowed). Several boxes are one
       multi-part answer when only separators lie between them (`\boxed{2}, \boxed{3}`), or a short phrase with a
       joining word and no retraction (`\boxed{(3,3)} \text{ for (a) and } \boxed{(1,1)}`, `\boxed{1} papers and
       \boxed{2} bins`; not `\boxed{1} no no \boxed{2}`, not across a sentence end);
    2. the last answer line: `Answer: ...` (DAPO's format), `**Answer:** ...`, `Final Answer: ...` (also in the middle
       of a line), `The (final) answer is ...` (Minerva's format; `... I hope it is correct.` is dropped) and GSM8K's
       `#### ...`. Only the line's first sentence counts, so an answer line that runs on in a one-paragraph completion
       ends where its sentence does. In that sentence the math right after the anchor counts, else the value after the
       last copula (`The largest $n$ is 34.` gives `34`, not `n`); math spans (`$...$`, `\(...\)`, `\[...\]`) are
       preferred to prose; a sentence of prose gives its number if it has exactly one (`Final Answer: Jane started 3
       hours ago.` gives `3`; `between 3 and 5` gives nothing).
  A completion with an unclosed `<think>`, one that ends inside an unclosed `\boxed{`, and one with no anchor at all
  has no answer (`None`): it was cut off before answering, and numbers in the reasoning are not answers. DAPO's
  format reward argues for this in training: a policy must not be paid for a number it never committed to.
- `"lenient"` (for evaluating models never trained on an answer format): when strict finds nothing, the last math
  expression of the final sentence counts: its last math span, else the sentence itself if it is a bare expression
  (`28 pct`, `\frac{10}{9}`), else its last number. Closing formulae (`I hope it is correct.`) are skipped; a final
  sentence with no math has no answer, and inline math never spans lines (`$ \n 9 \n $` is two dollar signs).

In both modes, text after the first chat-turn marker (`<|im_start|>`, `<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`,
`</s>`) is not the model's answer, and after a `</think>` only the text after it is searched.
"""

from __future__ import annotations

import re
from collections import deque
from numbers import Integral, Real

from .normalize import MAX_ANSWER_CHARS, parse_answer, sanitize, strip_trailing_punctuation

EXTRACTION_MODES = ("strict", "lenient")
MAX_COMPLETION_CHARS = 200_000  # the final answer is at the end; a 20k-token completion is ~80k characters

_ANCHOR = re.compile(
    r"(?:^[ \t>#*_]*|\b(?:the|my|our)\s+|\b(?=final\s+answer\s*(?:\*\*|__)?\s*:))(?:final\s+)?answer\s*(?:\*\*|__)?"
    r"\s*(?:is\b\s*:?|:)[ \t]*(?:\*\*|__)?"
    r"|^####[ \t]",
    re.IGNORECASE | re.MULTILINE,
)
_TURN_MARKER = re.compile(r"<\|(?:im_start|im_end|endoftext|eot_id|end_of_text|start_header_id)\|>|</s>")
_BRACE = re.compile(r"[{}]")
_BOX = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_BOX_SEPARATOR = re.compile(r"^(?:[\s$,;.&]|\\\]|\\\[|\\\)|\\\(|\band\b|\bor\b|\\text\{\s*(?:and|or)\s*\}|\\quad)*$")
_JOINING_WORD = re.compile(r"\b(?:and|or)\b|[,;&]")
_RETRACTION = re.compile(
    r"\b(?:but|not|no|wrong|incorrect|instead|actually|wait|however|rather|mistake|maybe|perhaps)\b", re.IGNORECASE
)
_MATH_SPAN = re.compile(r"(?<!\\)\$\$(.+?)(?<!\\)\$\$|(?<!\\)\$(.+?)(?<!\\)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
# Lenient mode: display math may span lines, inline math may not.
_LENIENT_SPAN = re.compile(
    r"(?<!\\)\$\$(.+?)(?<!\\)\$\$|\\\[(.+?)\\\]|(?<!\\)\$((?:\\\$|[^$\n])+?)(?<!\\)\$|\\\(([^\n]+?)\\\)", re.DOTALL
)
_SPAN_JOINER = re.compile(r"^\s*(?:,|;|and|or|\\text\{\s*(?:and|or)\s*\})?\s*$")
_SENTENCE_END = re.compile(r"[.!?](?=\s+[A-Z(\\$]|\s*$)|\n")
_COPULA = re.compile(r"\s(?:is|are|was|were|equals|equal to|be)\s", re.IGNORECASE)
_PROSE_WORD = re.compile(r"\b(?:[A-Za-z]{3,}|is|it|of|to|so|be|we|by|an|as|at|in|on|if|no|do|my|up)\b")
_JOINERS = re.compile(r"\b(?:and|or)\b")
_LATEX_WORDS = re.compile(r"\\(?:begin|end|text|operatorname)\s*\{[^{}]*\}|\\[A-Za-z]+")
_NUMBER_TOKEN = re.compile(  # a number glued to letters before it ("AZYUK2A") is part of a word; units may follow
    r"-?\\[dt]?frac\{[^{}]+\}\{[^{}]+\}|(?<![A-Za-z0-9_.])-?\d+(?:,\d{3})*(?:[.,]\d+)?(?:\s*/\s*\d+)?(?:\s*\\?%)?"
)
_CLOSING = re.compile(
    r"^\W*(?:I hope|Hope|Let me know|Thanks?\b|Thank you|Please|Feel free|Good luck|I apologi[sz]e|Note\b)",
    re.IGNORECASE,
)
_PLACEHOLDER = "\ue000"
_LEADING_CHOICE = re.compile(r"^(?:\*\*)?\(?[A-J]\)(?:\*\*)?(?:\s|$)")
PLAIN_NUMBER = re.compile(r"\s*[-+]?(?:\d{1,300}(?:\.\d{0,300})?|\.\d{1,300})\s*")
_SIMPLE_LINE = re.compile(r"[ \t]*\$?[ \t]*-?\d{1,300}[ \t]*\$?[ \t]*")


# ------------------------------------------------------------------------------------------------------- boxes
def _match_brace(text: str, open_index: int, stop: int) -> int | None:
    depth = 0
    for m in _BRACE.finditer(text, open_index, stop):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return m.start()
    return None


def _box_at(text: str, start: int, stop: int) -> tuple[str, int] | None:
    """Content and end index of the box whose command starts at `start` and closes before `stop`, else `None`."""
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        end = _match_brace(text, i, stop)
        return None if end is None else (text[i + 1 : end].strip(), end + 1)
    m = re.match(r"[^\s$]+", text[i : min(i + 100, stop)])  # "\boxed 5"
    return (m.group(), i + m.end()) if m else None


def _joins(gap: str) -> bool:
    """Whether the text between two boxes makes them one multi-part answer (see the module docstring)."""
    if len(gap) <= 40 and _BOX_SEPARATOR.match(gap):
        return True
    return (
        len(gap) <= 60
        and "\n\n" not in gap
        and not re.search(r"[.!?]\s", gap)
        and _JOINING_WORD.search(gap) is not None
        and _RETRACTION.search(gap) is None
    )


def _last_boxed(text: str, start: int) -> str | None:
    box = _box_at(text, start, len(text))
    if box is None or not box[0]:
        return None
    parts, end = [box[0]], start
    for _ in range(8):  # earlier boxes that are part of the same multi-part answer
        prev = max(text.rfind("\\boxed", 0, end), text.rfind("\\fbox", 0, end))
        found = _box_at(text, prev, end) if prev >= 0 else None
        if found is None or not _joins(text[found[1] : end]):
            break
        if found[0] != parts[0]:
            parts.insert(0, found[0])
        end = prev
    return ", ".join(parts)


# ------------------------------------------------------------------------------------------------ answer lines
def _span_runs(text: str) -> list[tuple[int, list[str]]]:
    """Runs of math spans joined only by separators (`$x = 2$ or $x = 3$` is one run), with where each run starts."""
    runs: list[tuple[int, list[str]]] = []
    end = None
    for m in _MATH_SPAN.finditer(text):
        content = next(g for g in m.groups() if g is not None).strip()
        gap = text[end : m.start()] if end is not None else ""
        if end is None or not _SPAN_JOINER.match(gap):
            runs.append((m.start(), []))
        elif runs[-1][1] and content and re.search(r"\bor\b", gap):
            content = "or " + content  # "$x<1$ or $x>3$" is a union, "$2$, $3$" a list
        if content:
            runs[-1][1].append(content)
        end = m.end()
    return [(start, spans) for start, spans in runs if spans]


def _joined(spans: list[str]) -> str:
    return "".join((" " if s.startswith("or ") else ", ") + s if i else s for i, s in enumerate(spans))


def _first_sentence(line: str) -> str:
    masked = _MATH_SPAN.sub(lambda m: _PLACEHOLDER * len(m.group()), line)  # no sentence ends inside math
    m = re.search(r"\.\s+(?=[A-Z])", masked)
    return line[: m.start()] if m else line


def _is_bare(text: str) -> bool:
    """A value with no prose around it: `34`, `\\frac{10}{9}`, `2 and 3`, `28 %` (not `28 pct`, `is it`, `5 apples`)."""
    return _PROSE_WORD.search(_JOINERS.sub(" ", _LATEX_WORDS.sub(" ", text))) is None


def _value_of(sentence: str) -> str | None:
    """The value an answer line's first sentence states (see the module docstring)."""
    sentence = strip_trailing_punctuation(sentence.replace("**", "").strip(" *_"))
    runs = _span_runs(sentence)
    if not runs and _is_bare(sentence):
        return sentence or None
    if runs and runs[0][0] == 0:  # "$12$ hours since $t$ grows": the math right after the anchor
        return _joined(runs[0][1])
    masked = _MATH_SPAN.sub(lambda m: _PLACEHOLDER * len(m.group()), sentence)
    copulas = list(_COPULA.finditer(masked))
    if copulas:  # "The largest $n$ is 34", "the smallest such $n$ is $n = 11$"
        tail = sentence[copulas[-1].end() :].strip()
        tail_runs = _span_runs(tail)
        if tail_runs:
            return _joined(tail_runs[0][1])
        if _is_bare(tail) and tail:
            return tail
        number = _NUMBER_TOKEN.match(tail)
        if number:
            return number.group().strip()
    number = _NUMBER_TOKEN.match(sentence)
    if number and len(_NUMBER_TOKEN.findall(masked)) == 1:  # "5 apples, and we check that $5 \\cdot 2 = 10$"
        return number.group().strip()  # (but "12, or maybe 13" is a hedge)
    if runs:  # "Since $x > 0$, we get $x = 5$"
        return _joined(runs[-1][1])
    numbers = _NUMBER_TOKEN.findall(sentence)
    if len(numbers) > 1:
        return None  # "between 3 and 5", "12, or maybe 13": prose with several numbers commits to none of them
    return numbers[0].strip() if numbers else sentence or None  # "Jane started 3 hours ago"; "no solution"


def _anchored(text: str, start: int) -> str | None:
    rest = text[start : start + 4 * MAX_ANSWER_CHARS].lstrip(" \t")
    if rest.startswith("\n"):  # "**Final Answer**:\n\n$5$"
        rest = rest.lstrip()
    if rest.startswith(("$$", "\\[")):  # display math may span lines
        m = _MATH_SPAN.match(rest)
        if m:
            return next(g for g in m.groups() if g is not None).strip()
    line = rest.split("\n", 1)[0]
    if _SIMPLE_LINE.fullmatch(line):  # "Answer: 34", "Answer: $34$": the common case, decided in a microsecond
        return line.strip().strip("$").strip()
    if _LEADING_CHOICE.match(line):  # "(B) $12$": the letter is the answer to a multiple-choice question
        return strip_trailing_punctuation(line.replace("**", "").strip())
    return _value_of(_first_sentence(line))


def _last_anchor(text: str, start: int) -> re.Match | None:
    # A literal search for "answer" first, the full pattern only around each hit (from the end): scanning a 40k-character
    # completion with the pattern itself costs milliseconds, this costs microseconds.
    lowered, end, best = text.lower(), len(text), None
    hashes = text.rfind("####", start)
    if hashes >= 0:
        best = _ANCHOR.match(text, hashes) if hashes == 0 or text[hashes - 1] == "\n" else None
    for _ in range(64):
        end = lowered.rfind("answer", start, end)
        if end < 0 or (best is not None and end < best.start()):
            break
        found = deque(_ANCHOR.finditer(text, max(start, end - 40), min(len(text), end + 80)), maxlen=1)
        if found:
            return found[0] if best is None or found[0].start() > best.start() else best
    return best


# ------------------------------------------------------------------------------------------------------ lenient
def _final_sentence(text: str) -> str | None:
    """The last sentence that is not a closing formula, with math spans intact; `None` if it states no math."""
    contents: list[str] = []

    def hide(m: re.Match) -> str:
        contents.append(m.group())
        display = m.group(1) is not None or m.group(2) is not None
        return f"\n{_PLACEHOLDER}\n" if display else _PLACEHOLDER  # display math stands as a sentence of its own

    masked = _LENIENT_SPAN.sub(hide, text[-4 * MAX_ANSWER_CHARS :])
    bounds = [0] + [m.end() for m in _SENTENCE_END.finditer(masked)] + [len(masked)]
    for lo, hi in reversed(list(zip(bounds, bounds[1:]))):
        sentence = masked[lo:hi].strip()
        if not sentence.strip(".!?)]* \t") or _CLOSING.match(sentence):
            continue
        if _PLACEHOLDER not in sentence and not re.search(r"\d", sentence):
            return None
        pieces = sentence.split(_PLACEHOLDER)
        hidden = contents[masked[:lo].count(_PLACEHOLDER) :]
        return "".join(p + (hidden[i] if i < len(pieces) - 1 else "") for i, p in enumerate(pieces))
    return None


def _cut_off(sentence: str, end: int) -> bool:
    """A sentence that stops without punctuation several words after its last math was cut off mid-thought."""
    if re.search(r"[.!?$)\]}]\s*$", sentence):
        return False
    return len(re.findall(r"[A-Za-z]{2,}", sentence[end:])) > 3


def _lenient(text: str) -> str | None:
    sentence = _final_sentence(text)
    if sentence is None:
        return None
    spans = [m for m in _LENIENT_SPAN.finditer(sentence) if any(g and g.strip() for g in m.groups())]
    numbers = list(_NUMBER_TOKEN.finditer(sentence))
    plain = strip_trailing_punctuation(sentence.replace("**", "").strip())
    if spans:
        answer, end = next(g for g in spans[-1].groups() if g is not None).strip(), spans[-1].end()
    elif _is_bare(plain):
        answer, end = plain, len(sentence)
    elif numbers:
        answer, end = numbers[-1].group().strip(), numbers[-1].end()
    else:
        return None
    return None if _cut_off(sentence, end) else answer


# ---------------------------------------------------------------------------------------------------------- API
def _answer_region(text: str) -> str | None:
    """The part of a completion an answer may come from; `None` when it was cut off while still reasoning."""
    text = text[-MAX_COMPLETION_CHARS:]
    if _PLACEHOLDER in text:
        text = text.replace(_PLACEHOLDER, "")
    marker = _TURN_MARKER.search(text) if "<" in text else None
    if marker:
        text = text[: marker.start()]
    think_end = text.rfind("</think>")
    if think_end >= 0:
        return text[think_end + len("</think>") :]
    return None if "<think>" in text else text


def extract(text: str, extraction: str = "strict") -> str | None:
    """[`dapo_trl.verifier.extract_answer`] without the argument checks."""
    region = _answer_region(text)
    if region is None:
        return None
    box_start = max(region.rfind("\\boxed"), region.rfind("\\fbox"))
    if box_start >= 0 and not _BOX.match(region, box_start):
        box_start = -1
    anchor = _last_anchor(region, max(0, box_start))
    if anchor is not None and box_start >= 0:
        box = _box_at(region, box_start, len(region))
        if box is not None and anchor.start() < box[1]:  # \boxed{\text{The answer is } 12}: inside the box
            anchor = None
    if anchor is not None and anchor.start() > box_start:
        answer = _anchored(region, anchor.end())
    elif box_start >= 0:
        answer = _last_boxed(region, box_start)
        if answer is None:
            return None  # it ends inside the box it was writing
    elif extraction == "lenient":
        answer = _lenient(region)
    else:
        return None
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return None
    return sanitize(answer) or None  # control characters and lone surrogates only matter in the answer itself


_FLOAT_INFINITY = re.compile(r"[+-]?inf(?:inity)?", re.IGNORECASE)


def unwrap_gold(gold: object) -> str | None:
    """A gold value as text: one-element lists are unwrapped, numbers written out; containers are never stringified."""
    if isinstance(gold, str):
        return gold
    for _ in range(8):
        if isinstance(gold, (list, tuple)) and len(gold) == 1:
            gold = gold[0]
        else:
            break
    if isinstance(gold, bool):
        return None
    if isinstance(gold, Integral):
        return str(int(gold))
    if isinstance(gold, Real):
        value = float(gold)
        if value != value or value in (float("inf"), float("-inf")):
            return None
        return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)
    return gold if isinstance(gold, str) else None


def extract_gold(gold: object) -> str | None:
    """[`dapo_trl.verifier.extract_gold_answer`]."""
    text = unwrap_gold(gold)
    if text is None:
        return None
    text = sanitize(text).strip()
    if PLAIN_NUMBER.fullmatch(text):
        return text
    if _FLOAT_INFINITY.fullmatch(text):
        return None  # a float infinity written out by a program, unusable like the float itself (see unwrap_gold)
    if "\\boxed" in text or "\\fbox" in text or _ANCHOR.search(text):
        answer = extract(text)
    else:
        answer = text if len(text) <= MAX_ANSWER_CHARS else None
    return answer if answer and parse_answer(answer) is not None else None
