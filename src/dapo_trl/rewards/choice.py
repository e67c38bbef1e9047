r"""
Multiple-choice questions: the row format, prompts, answer extraction and a rule-based reward.

A domain beyond math (medical, legal or exam multiple-choice QA) trains with the same DAPO recipe once the reward can
read a letter. The pieces:

- [`extract_choice`]: the option a completion committed to, or `None`.
- [`MultipleChoiceReward`]: TRL reward function, `correct_reward` / `incorrect_reward` per completion. Compose it with
  TRL's `trl.rewards.think_format_reward` for a `<think>...</think>` block before the answer; put this reward first (or
  name it in `dynamic_sampling_reward`) so that dynamic sampling filters on correctness, not on the format.
- [`format_choice_prompt`] / [`load_choice_dataset`]: prompts from rows of the format below.

Row format (one JSON object per line of a `.jsonl` file, or any `datasets` table with these columns):

| column        | type                           | meaning                                                              |
|---------------|--------------------------------|----------------------------------------------------------------------|
| `question`    | `str`                          | the question                                                         |
| `options`     | `list[str]` (2-5) or `dict`    | option texts in letter order (A, B, ...), or `{"A": "...", ...}`     |
| `answer`      | `str`                          | the correct letter (`"B"`, `"(B)"`) or the correct option's text     |
| `explanation` | `str`, *optional*              | reasoning, used only by warm-ups that write it inside `<think>`      |

```json
{"question": "What does Dovux treat?", "options": ["acne", "flu", "ulcer", "gout"], "answer": "D"}
```

Extraction, in order (the same ideas as `dapo_trl.extract_answer`: the last *committed* answer counts):
    1. Text inside `<think>...</think>` is reasoning, not an answer: only the text after the last `</think>` is read,
       and a completion with an unclosed `<think>` has no answer.
    2. The candidate is the text after the last answer anchor (`Answer:`, `**Answer:**`, `Final answer:`, `The answer
       is`), or the content of the last `\boxed{}`, whichever comes last; with neither, the last non-empty line.
    3. The candidate names a letter when it is one, decorated or not: `B`, `(B)`, `B)`, `B.`, `**B**`, `\text{B}`,
       lower case too (`Answer: b`), optionally followed by the option's text (`(B) fever`). Without an anchor a bare
       line must be only the letter, so that prose like "A patient ..." never reads as option A.
    4. Otherwise the candidate is compared with the option texts (case, spacing, markdown and final punctuation
       ignored): `Answer: fever` names the option whose text is `fever`.
    5. Letters beyond the last option, and anything else, are no answer.
"""

from __future__ import annotations

import logging
import os
import re
import string
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)

LETTERS = "ABCDE"
MAX_COMPLETION_CHARS = 200_000
Options = Sequence[str] | Mapping[str, str]

_ANCHOR = re.compile(
    r"(?:(?:^[ \t>#*_]*|\b(?:the|my|our)\s+)(?:final\s+|correct\s+)?(?:answer|choice|option)\s*(?:\*\*|__)?\s*"
    r"(?:is\b\s*:?|:)|\b(?:final\s+)?answer\s*(?:\*\*|__)?\s*:)[ \t]*",
    re.IGNORECASE | re.MULTILINE,
)
_DECORATION = re.compile(r"\*\*|__|`|\$|\\text\{|\\textbf\{|\\mathrm\{|[{}]")
_LETTER_ALONE = re.compile(r"^\(?([A-Za-z])\)?[.:]?$")
_LETTER_FIRST = re.compile(r"^(?:\(([A-Za-z])\)|([A-Z])(?:[).:]|\s+[-\u2013\u2014]))(?:\s|$)")
_PUNCTUATION = str.maketrans("", "", string.punctuation.replace("-", "").replace("+", ""))


def option_map(options: Options, *, letters: str = LETTERS) -> dict[str, str]:
    """
    `{letter: text}` from a list of option texts (in letter order) or a dict keyed by letters (`"A"`, `"(a)"`, ...).

    Example:
    ```python
    >>> option_map(["fever", "cough"])
    {'A': 'fever', 'B': 'cough'}

    ```
    """
    if isinstance(options, Mapping):
        mapped = {}
        for key, text in options.items():
            letter = _letter_of(str(key))
            if letter is None or letter not in letters:
                raise ValueError(f"Option key {key!r} is not one of the letters {letters}.")
            mapped[letter] = str(text)
        return dict(sorted(mapped.items()))
    if isinstance(options, str) or not isinstance(options, Sequence):
        raise ValueError(f"options must be a list of option texts or a dict keyed by letters, got {options!r}.")
    if not 2 <= len(options) <= len(letters):
        raise ValueError(f"A question needs 2 to {len(letters)} options ({letters}), got {len(options)}.")
    return {letter: str(text) for letter, text in zip(letters, options)}


def _letter_of(text: str) -> str | None:
    m = _LETTER_ALONE.match(text.strip())
    return m.group(1).upper() if m else None


def _clean(text: str) -> str:
    return _DECORATION.sub("", text).strip().rstrip(".,;!").strip()


def _normalize_option(text: str) -> str:
    return " ".join(text.translate(_PUNCTUATION).casefold().split())


def _last(matches: Iterator[re.Match]) -> re.Match | None:
    last = deque(matches, maxlen=1)
    return last[0] if last else None


def _last_box(text: str) -> tuple[int, str] | None:
    """Start and content of the last closed `\\boxed{...}` (nested braces allowed)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + 6, min(len(text), start + 6 + 1000)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return start, text[start + 7 : i]
    return None


def _candidate(text: str) -> tuple[str, bool] | None:
    """The text of the last committed answer and whether an anchor or a box introduced it."""
    anchor = _last(_ANCHOR.finditer(text))
    box = _last_box(text)
    if box is not None and (anchor is None or box[0] > anchor.start()):
        return box[1], True
    if anchor is not None:
        rest = text[anchor.end() :].lstrip(" \t")
        if rest.startswith("\n"):  # "**Answer:**\n\n(B)"
            rest = rest.lstrip()
        return rest.split("\n", 1)[0], True
    lines = [line for line in text.splitlines() if line.strip()]
    return (lines[-1], False) if lines else None


def extract_choice(text: str, options: Options | None = None, *, letters: str = LETTERS) -> str | None:
    r"""
    The letter of the option a completion committed to, or `None` (see the module docstring for the rules).

    Args:
        text (`str`):
            The completion text.
        options (`list[str]` or `dict[str, str]`, *optional*):
            The question's options; they bound the valid letters and let an answer given as an option's text count.
        letters (`str`, *optional*, defaults to `"ABCDE"`):
            The option letters, in order.

    Example:
    ```python
    >>> extract_choice("<think>Dovux treats gout.</think>\nAnswer: (D)")
    'D'
    >>> extract_choice("I would say\n**B**")
    'B'
    >>> extract_choice("The answer is fever.", ["cough", "fever"])
    'B'
    >>> extract_choice("<think>It could be A) or B)") is None  # still reasoning
    True
    >>> extract_choice("A patient with a cough should rest.") is None  # prose, not a committed letter
    True

    ```
    """
    if not isinstance(text, str):
        return None
    text = text[-MAX_COMPLETION_CHARS:]
    think_end = text.rfind("</think>")
    if think_end >= 0:
        text = text[think_end + len("</think>") :]
    elif "<think>" in text:
        return None
    found = _candidate(text)
    if found is None:
        return None
    candidate, anchored = found
    mapped = option_map(options, letters=letters) if options is not None else None
    valid = "".join(mapped) if mapped is not None else letters
    cleaned = _clean(candidate)
    letter = _letter_of(cleaned)
    if letter is None and anchored:
        m = _LETTER_FIRST.match(cleaned)
        letter = (m.group(1) or m.group(2)).upper() if m else None
    if letter is not None:
        return letter if letter in valid else None
    if mapped:
        wanted = _normalize_option(cleaned)
        matches = [key for key, value in mapped.items() if _normalize_option(value) == wanted]
        if len(matches) == 1:
            return matches[0]
    return None


def gold_choice(answer: Any, options: Options | None = None, *, letters: str = LETTERS) -> str | None:
    """
    The correct letter from a dataset's `answer` value: a letter (`"B"`, `"(b)"`) or the text of one of `options`.
    `None` when it is neither.
    """
    if not isinstance(answer, str):
        return None
    mapped = option_map(options, letters=letters) if options is not None else None
    letter = _letter_of(_clean(answer))
    if letter is not None:
        return letter if letter in ("".join(mapped) if mapped else letters) else None
    if mapped:
        wanted = _normalize_option(answer)
        matches = [key for key, value in mapped.items() if _normalize_option(value) == wanted]
        return matches[0] if len(matches) == 1 else None
    return None


def format_choice_prompt(question: str, options: Options, *, instruction: str | None = None) -> str:
    """
    The question followed by one `X) text` line per option, after an optional instruction paragraph.

    Example:
    ```python
    >>> print(format_choice_prompt("What does Dovux treat?", ["acne", "gout"]))
    What does Dovux treat?
    A) acne
    B) gout
    <BLANKLINE>

    ```
    """
    lines = [instruction.strip(), ""] if instruction else []
    lines.append(question.strip())
    lines.extend(f"{letter}) {text}" for letter, text in option_map(options).items())
    return "\n".join(lines) + "\n"


def load_choice_dataset(
    path: str,
    *,
    split: str = "train",
    instruction: str | None = None,
    system_prompt: str | None = None,
    conversational: bool = True,
    max_samples: int | None = None,
):
    """
    A multiple-choice file or Hub dataset (rows as in the module docstring), with a `prompt` column added.

    Args:
        path (`str`):
            A local `.jsonl`/`.json`/`.csv`/`.parquet` file, or a Hub dataset id.
        split (`str`, *optional*, defaults to `"train"`):
        instruction (`str`, *optional*):
            Paragraph put before each question (e.g. how to format the answer).
        system_prompt (`str`, *optional*):
            A system message, for conversational prompts.
        conversational (`bool`, *optional*, defaults to `True`):
            Prompts as chat messages (`[{"role": "user", "content": ...}]`), which TRL renders with the tokenizer's
            chat template and which `trl.rewards.think_format_reward` expects; `False` gives plain strings.
        max_samples (`int`, *optional*):
            Keep the first rows only.

    Raises:
        `ValueError`: naming the file, the row and the column, when a row lacks a column or its answer is not one of
        its options.
    """
    dataset = _load_rows(path, split)
    missing = [c for c in ("question", "options", "answer") if c not in dataset.column_names]
    if missing:
        raise ValueError(
            f"{path}: multiple-choice rows need the columns 'question', 'options' and 'answer'; missing {missing} "
            f"(found {dataset.column_names})."
        )
    if max_samples is not None:
        dataset = dataset.select(range(min(max_samples, len(dataset))))

    def build(row, index):
        try:
            gold = gold_choice(row["answer"], row["options"])
        except ValueError as error:
            raise ValueError(f"{path}, row {index}: {error}") from None
        if gold is None:
            raise ValueError(
                f"{path}, row {index}: answer {row['answer']!r} is neither a letter of its {len(row['options'])} "
                "options nor one of their texts."
            )
        text = format_choice_prompt(row["question"], row["options"], instruction=instruction)
        if not conversational:
            return {"prompt": (system_prompt + "\n\n" if system_prompt else "") + text}
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return {"prompt": [*messages, {"role": "user", "content": text}]}

    return dataset.map(build, with_indices=True)


_FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def _load_rows(path: str, split: str):
    import datasets

    suffix = os.path.splitext(path)[1].lower()
    if os.path.isfile(path):
        if suffix not in _FILE_BUILDERS:
            raise ValueError(
                f"Unsupported file type {suffix or '(none)'!r} for {path}; use one of {sorted(_FILE_BUILDERS)}."
            )
        return datasets.load_dataset(_FILE_BUILDERS[suffix], data_files={"train": path}, split="train")
    if suffix in _FILE_BUILDERS or path.startswith((".", "/", "~")):
        raise FileNotFoundError(f"No such dataset file: {path}")
    return datasets.load_dataset(path, split=split)


class MultipleChoiceReward:
    r"""
    Rule-based reward for multiple-choice answers (the DAPO §2.4 reward with a letter instead of a number):

    $$
    R(\hat{y}, y) = \begin{cases} \text{correct\_reward}, & \texttt{extract\_choice}(\hat{y}) = y \\
    \text{incorrect\_reward}, & \text{otherwise (wrong, none, or a letter beyond the options)} \end{cases}
    $$

    A row whose gold answer is neither a letter nor one of its options' texts gets `None` (TRL skips it) and a warning.
    The extracted letters are logged to TRL's completions table as `extracted_choice`. Picklable; its name is pinned
    to `multiple_choice`, so the trainer logs `rewards/multiple_choice/mean`.

    Args:
        correct_reward (`float`, *optional*, defaults to `1.0`):
        incorrect_reward (`float`, *optional*, defaults to `-1.0`):
        answer_column (`str`, *optional*, defaults to `"answer"`):
            Column of the correct letter or option text.
        options_column (`str`, *optional*, defaults to `"options"`):
            Column of the options (list in letter order, or dict by letter). If the batch has no such column, only
            letters are understood.
        letters (`str`, *optional*, defaults to `"ABCDE"`):

    Example:
    ```python
    >>> from trl.rewards import think_format_reward

    >>> reward = MultipleChoiceReward()
    >>> completions = [
    ...     [{"role": "assistant", "content": "<think>Dovux treats gout.</think>\nAnswer: D"}],
    ...     [{"role": "assistant", "content": "<think>Maybe acne.</think>\nAnswer: acne"}],
    ...     [{"role": "assistant", "content": "Answer: **d**"}],
    ... ]
    >>> options = [["acne", "flu", "ulcer", "gout"]] * 3
    >>> reward(completions, answer=["D"] * 3, options=options)
    [1.0, -1.0, 1.0]
    >>> think_format_reward(completions)
    [1.0, 1.0, 0.0]

    ```
    """

    __name__ = "multiple_choice"

    def __init__(
        self,
        *,
        correct_reward: float = 1.0,
        incorrect_reward: float = -1.0,
        answer_column: str = "answer",
        options_column: str = "options",
        letters: str = LETTERS,
    ):
        if not letters or len(set(letters)) != len(letters) or not letters.isupper():
            raise ValueError(f"letters must be distinct upper-case letters, got {letters!r}.")
        self.correct_reward = correct_reward
        self.incorrect_reward = incorrect_reward
        self.answer_column = answer_column
        self.options_column = options_column
        self.letters = letters

    def __call__(
        self,
        completions: Sequence[str] | Sequence[Sequence[dict[str, Any]]],
        log_extra: Callable[[str, list], None] | None = None,
        **columns,
    ) -> list[float | None]:
        from .math import completion_text

        if self.answer_column not in columns:
            seen = sorted(k for k in columns if k not in ("trainer_state", "log_extra", "log_metric", "environments"))
            raise ValueError(
                f"MultipleChoiceReward found no column {self.answer_column!r} in the batch; it received {seen}. Pass "
                "answer_column= with the column holding the correct letter."
            )
        answers = columns[self.answer_column]
        options = columns.get(self.options_column) or [None] * len(completions)
        if len(answers) != len(completions) or len(options) != len(completions):
            raise ValueError(
                f"Got {len(completions)} completions but {len(answers)} answers / {len(options)} options."
            )
        rewards: list[float | None] = []
        extracted: list[str] = []
        for completion, answer, row_options in zip(completions, answers, options):
            gold = gold_choice(answer, row_options, letters=self.letters)
            predicted = extract_choice(completion_text(completion), row_options, letters=self.letters)
            extracted.append(predicted or "[no answer]")
            if gold is None:
                logger.warning(f"Gold answer {answer!r} is not a letter of its options {row_options!r}: row skipped.")
                rewards.append(None)
            else:
                rewards.append(self.correct_reward if predicted == gold else self.incorrect_reward)
        if log_extra is not None:
            log_extra("extracted_choice", extracted)
        return rewards

    def __repr__(self) -> str:
        return (
            f"MultipleChoiceReward(correct_reward={self.correct_reward}, incorrect_reward={self.incorrect_reward}, "
            f"answer_column={self.answer_column!r}, options_column={self.options_column!r}, letters={self.letters!r})"
        )
