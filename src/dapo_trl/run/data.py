r"""
Math datasets in one shape: a `prompt` column (plain text or a chat-message list) and an `answer` column (string).

[`load_math_dataset`] reads a Hub dataset or a local file and adapts it:

| source                                   | format       | prompt                          | answer                               |
|------------------------------------------|--------------|---------------------------------|--------------------------------------|
| `BytedTsinghua-SIA/DAPO-Math-17k`        | `dapo_math`  | `prompt` (chat list, templated) | `reward_model["ground_truth"]`       |
| `HuggingFaceH4/aime_2024`, MATH-500, ... | `problem`    | `problem` + DAPO template       | `answer`                             |
| `openai/gsm8k` (config `main`)           | `gsm8k`      | `question` + DAPO template      | text after `####` in `answer`        |
| `question` / `answer` columns, plain     | `question`   | `question` + DAPO template      | `answer`                             |
| MATH (`solution` with `\boxed{}`)        | `math`       | `problem` + DAPO template       | answer of `solution` (see below)     |
| TRL's math sets (`prompt` + `solution`)  | `columns`    | `prompt`                        | answer of `solution` (see below)     |
| any file or dataset                      | `columns`    | `prompt_column`                 | `answer_column`                      |

"DAPO template" is [`DAPO_PROMPT_TEMPLATE`], the instruction DAPO-Math-17k's prompts carry; `problem`, `question`,
`gsm8k` and `math` wrap the problem in it (`apply_template=False` turns it off), `dapo_math` and `columns` take the
prompt as it is. Automatic detection reads the columns (first match: `prompt` + `reward_model`, `question` +
`answer`, `problem` + `answer`, `problem` + `solution`, `prompt` + `answer`); `question` + `answer` is `gsm8k` only
when the answers are GSM8K solutions (`... #### 42`), `question` when they are plain answers, so no row a plain
reading would keep is dropped. Columns that match none of these are read as `columns` when a prompt column (`prompt`,
`problem`, `question`) and an answer column (`answer`, `solution`) are found, or named (`answer_column="solution"`
alone picks the prompt column).

A `solution` column holds a worked solution (MATH, open-r1) or a bare answer (TRL's math sets): its answer is
[`solution_answer`], the last `\boxed{}` of a worked solution, its `Answer:` line, or the value itself when it is a
plain math answer; a worked solution without a final answer is dropped (counted in the log), never kept whole.

The published DAPO-Math-17k file repeats each of its ~17k prompts about 100 times; [`load_math_dataset`] drops the
repeats by default (`dedupe=True`) and logs how many went.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

# DAPO's prompt template (the one DAPO-Math-17k's prompts already carry)
DAPO_PROMPT_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)

DATASET_FORMATS = ("auto", "dapo_math", "problem", "question", "gsm8k", "math", "columns")

# Hub ids whose format is known without looking at the columns
_KNOWN_HUB_FORMATS = {
    "BytedTsinghua-SIA/DAPO-Math-17k": "dapo_math",
    "open-r1/DAPO-Math-17k-Processed": "problem",
    "HuggingFaceH4/aime_2024": "problem",
    "AI-MO/aimo-validation-aime": "problem",
    "HuggingFaceH4/MATH-500": "problem",
    "openai/gsm8k": "gsm8k",
    "EleutherAI/hendrycks_math": "math",
}
_DEFAULT_CONFIGS = {"openai/gsm8k": "main"}

_LOCAL_BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
}


def load_math_dataset(
    name_or_path: str,
    *,
    split: str = "train",
    config_name: str | None = None,
    dataset_format: str = "auto",
    prompt_column: str | None = None,
    answer_column: str | None = None,
    apply_template: bool | None = None,
    template: str = DAPO_PROMPT_TEMPLATE,
    conversational: bool = False,
    system_prompt: str | None = None,
    dedupe: bool = True,
    max_samples: int | None = None,
    keep_columns: list[str] | None = None,
) -> Any:
    """
    Load a math dataset from the Hub or a local file and return it with `prompt` and `answer` columns.

    Args:
        name_or_path (`str`):
            A Hub dataset id, a local data file (`.jsonl`, `.json`, `.parquet`, `.csv`, `.arrow`), a folder of such
            files, or a folder written by `Dataset.save_to_disk`.
        split (`str`, *optional*, defaults to `"train"`):
            Split to load; slicing (`"train[:100]"`) works. A single local file is read as this split.
        config_name (`str`, *optional*):
            Hub configuration (`"main"` is used for `openai/gsm8k` when not given).
        dataset_format (`str`, *optional*, defaults to `"auto"`):
            Where the prompt and the answer come from, and whether the prompt is wrapped in `template`:

            - `"dapo_math"`: `prompt` as it is (DAPO-Math-17k's prompts carry the template), `reward_model.ground_truth`.
            - `"problem"`: `problem` + template, `answer` (AIME, MATH-500).
            - `"question"`: `question` + template, `answer` as written.
            - `"gsm8k"`: `question` + template, the text after `####` of `answer` (rows without one are dropped).
            - `"math"`: `problem` + template, the last `\\boxed{}` of `solution`.
            - `"columns"`: `prompt_column` and `answer_column` (defaults `prompt`, `answer`), no template.
            - `"auto"`: known Hub ids map to their format, otherwise the columns decide (see the module docstring);
              giving `prompt_column` and `answer_column` without a format means `"columns"`.
        prompt_column (`str`, *optional*):
            Column holding the problem or prompt; overrides the format's default.
        answer_column (`str`, *optional*):
            Column holding the answer; overrides the format's default. A dotted path reads inside a dict column
            (`"reward_model.ground_truth"`).
        apply_template (`bool`, *optional*):
            Wrap the problem in `template`. Defaults to `True` for raw problems (`problem`, `question`, `gsm8k`, `math`) and
            `False` for `dapo_math` and `columns`, whose prompts are taken as they are.
        template (`str`, *optional*, defaults to [`DAPO_PROMPT_TEMPLATE`]):
            Must contain `{problem}`, which is replaced by the problem text (other braces are left alone).
        conversational (`bool`, *optional*, defaults to `False`):
            Return prompts as chat-message lists (`[{"role": "user", "content": ...}]`) instead of plain strings.
        system_prompt (`str`, *optional*):
            System message prepended to conversational prompts.
        dedupe (`bool`, *optional*, defaults to `True`):
            Drop rows whose prompt text repeats an earlier row's (the first one is kept).
        max_samples (`int`, *optional*):
            Keep only the first `max_samples` rows (after deduplication).
        keep_columns (`list[str]`, *optional*):
            Source columns to carry through next to `prompt` and `answer`.

    Returns:
        `datasets.Dataset` with columns `prompt` and `answer` (plus `keep_columns`).
    """
    from ..trainer.dataset_checks import prompt_text  # the trainer's reading of a prompt (imports torch)

    if dataset_format not in DATASET_FORMATS:
        raise ValueError(f"Unknown dataset_format {dataset_format!r}; choose one of {list(DATASET_FORMATS)}.")
    if "{problem}" not in template:
        raise ValueError("template must contain the placeholder '{problem}'.")
    raw = _load_raw(name_or_path, split=split, config_name=config_name)
    if dataset_format == "auto":
        if prompt_column and answer_column:
            dataset_format = "columns"
        elif name_or_path in _KNOWN_HUB_FORMATS:
            dataset_format = _KNOWN_HUB_FORMATS[name_or_path]
        else:
            found = _guess_columns(raw.column_names, prompt_column, answer_column)
            try:
                dataset_format = detect_format(raw.column_names)
            except ValueError:
                if found is None:
                    raise
                prompt_column, answer_column = found
                dataset_format = "columns"
                logger.info("%s: prompt column %r, answer column %r.", name_or_path, prompt_column, answer_column)
            dataset_format = _refine_detected(dataset_format, raw, name_or_path)
    logger.info("Loading %s (%d rows) as format %r.", name_or_path, len(raw), dataset_format)

    prompt_col, answer_col, answer_fn = _format_spec(dataset_format)
    prompt_col = prompt_column or prompt_col
    answer_col = answer_column or answer_col
    if answer_fn is _plain_answer and answer_col.split(".")[-1] == "solution":
        answer_fn = solution_answer
    _require_column(raw, prompt_col, "prompt", name_or_path)
    _require_column(raw, answer_col.split(".")[0], "answer", name_or_path)
    if apply_template is None:
        apply_template = dataset_format in ("problem", "question", "gsm8k", "math")
    keep_columns = list(keep_columns or [])
    for column in keep_columns:
        _require_column(raw, column, "kept", name_or_path)

    if dedupe:
        # on the source prompts, before any conversion: the published DAPO-Math-17k file has ~1.8M rows
        texts = [prompt_text(p) for p in raw[prompt_col]]
        first: dict[str, int] = {}
        for index, text in enumerate(texts):
            first.setdefault(text, index)
        if len(first) != len(texts):
            logger.info(
                "Dropped %d duplicate prompts of %d rows (%d unique).", len(texts) - len(first), len(texts), len(first)
            )
            raw = raw.select(sorted(first.values()))

    def convert(row: dict[str, Any]) -> dict[str, Any]:
        text = prompt_text(row[prompt_col])
        if apply_template:
            text = template.replace("{problem}", text.strip())  # not str.format: templates may hold LaTeX braces
        answer = answer_fn(_lookup(row, answer_col))
        out = {"prompt": _as_prompt(text, conversational, system_prompt), "answer": answer}
        out.update({c: row[c] for c in keep_columns})
        return out

    rows = [convert(row) for row in raw]
    missing = sum(r["answer"] is None for r in rows)
    if missing:
        logger.warning(
            "Dropped %d of %d rows of %s whose answer column %r holds no usable answer (None, empty, a list of several "
            "values or another container, or a solution without a final answer).",
            missing,
            len(rows),
            name_or_path,
            answer_col,
        )
        rows = [r for r in rows if r["answer"] is not None]
    if max_samples is not None:
        rows = rows[:max_samples]
    if not rows:
        others = [c for c in raw.column_names if c not in (answer_col.split(".")[0], prompt_col)]
        where = f"one of its other columns {others}" if others else "another column (the data has no other)"
        raise ValueError(
            f"{name_or_path} ({split}) has no usable rows: read as format {dataset_format!r}, its answer column "
            f"{answer_col!r} holds no usable answer. Pick {where} with answer_column= (--answer_column), or another "
            f"format with dataset_format= (--dataset_format; one of {list(DATASET_FORMATS[1:])})."
        )
    from datasets import Dataset

    return Dataset.from_list(rows)


def detect_format(columns: list[str]) -> str:
    """
    Guess a dataset's format from its column names.

    Example:
    ```python
    >>> detect_format(["data_source", "prompt", "ability", "reward_model", "extra_info"])
    'dapo_math'
    >>> detect_format(["question", "answer"])
    'gsm8k'
    >>> detect_format(["problem", "level", "type", "solution"])
    'math'

    ```
    """
    names = set(columns)
    if {"prompt", "reward_model"} <= names:
        return "dapo_math"
    if {"question", "answer"} <= names:
        return "gsm8k"
    if {"problem", "answer"} <= names:
        return "problem"
    if {"problem", "solution"} <= names:
        return "math"
    if {"prompt", "answer"} <= names:
        return "columns"
    raise ValueError(
        f"Cannot tell the format of a dataset with columns {sorted(names)}. Pass prompt_column= and answer_column= "
        f"(and dataset_format='columns'), or one of the formats {list(DATASET_FORMATS[1:])}."
    )


def _refine_detected(dataset_format: str, raw: Any, source: str) -> str:
    """
    A format detected from column names, checked against the answers: `question` + `answer` columns are GSM8K only
    when the answers are GSM8K solutions; read as GSM8K, plain answers (`"42"`) would all be dropped.
    """
    if dataset_format != "gsm8k":
        return dataset_format
    answers = raw["answer"]
    solutions = sum(isinstance(a, str) and "####" in a for a in answers)
    plain = sum(_plain_answer(a) is not None for a in answers if not (isinstance(a, str) and "####" in a))
    if solutions and plain:
        raise ValueError(
            f"{source}: {solutions} answers are GSM8K solutions (ending in '#### <answer>') and {plain} are plain "
            "answers. Pass dataset_format='gsm8k' (--dataset_format gsm8k) to keep the text after '####' and drop the "
            "plain ones, or dataset_format='question' to take every answer as written."
        )
    if solutions:
        return "gsm8k"
    logger.info("%s: question/answer columns with plain answers (no '####'): format 'question'.", source)
    return "question"


def _format_spec(dataset_format: str) -> tuple[str, str, Callable[[Any], str | None]]:
    if dataset_format == "dapo_math":
        return "prompt", "reward_model.ground_truth", _plain_answer
    if dataset_format == "problem":
        return "problem", "answer", _plain_answer
    if dataset_format == "question":
        return "question", "answer", _plain_answer
    if dataset_format == "gsm8k":
        return "question", "answer", gsm8k_answer
    if dataset_format == "math":
        return "problem", "solution", solution_answer
    return "prompt", "answer", _plain_answer  # "columns": overridden by prompt_column / answer_column


_PROMPT_COLUMNS = ("prompt", "problem", "question")
_ANSWER_COLUMNS = ("answer", "solution")
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")  # a word, not a LaTeX command: 3 of them make a sentence


def _guess_columns(columns: list[str], prompt_column: str | None, answer_column: str | None) -> tuple[str, str] | None:
    """The prompt and answer columns of a dataset no format matches: the given ones, else the first known name found."""
    prompt = prompt_column or next((c for c in _PROMPT_COLUMNS if c in columns), None)
    answer = answer_column or next((c for c in _ANSWER_COLUMNS if c in columns), None)
    return (prompt, answer) if prompt and answer else None


def solution_answer(solution: Any) -> str | None:
    r"""
    The final answer of a `solution` value: the last `\boxed{}` of a worked solution (MATH, open-r1), its `Answer:`
    line, or the value itself when it is a plain math answer (TRL's math sets); `None` for a worked solution without
    a final answer, which would otherwise become a paragraph-long "gold answer" that nothing matches.

    Example:
    ```python
    >>> solution_answer(r"Add them: $3 + 4 = 7$, so the sum is $\boxed{7}$.")
    '7'
    >>> solution_answer(r"\frac{1}{2}"), solution_answer(42), solution_answer("We add 3 and 4.\nAnswer: 7")
    ('\\frac{1}{2}', '42', '7')
    >>> solution_answer("We add the two numbers, then we are done with it.") is None
    True

    ```
    """
    from ..verifier.extraction import extract, extract_gold

    text = _plain_answer(solution)
    if text is None:
        return None
    committed = boxed_answer(text) or extract(text)  # a boxed answer, an `Answer:` line, "the answer is ..."
    if committed is not None or len(_PROSE_WORD.findall(text)) >= 3:
        return committed
    return extract_gold(text)


def gsm8k_answer(solution: Any) -> str | None:
    """
    GSM8K's final answer: the text after `####`, thousands separators removed.

    Example:
    ```python
    >>> gsm8k_answer("She pays 2 * 600 = 1200 dollars.\\n#### 1,200")
    '1200'

    ```
    """
    if not isinstance(solution, str) or "####" not in solution:
        return None
    answer = solution.rsplit("####", 1)[1].strip()
    if re.fullmatch(r"[+-]?[\d,]+(\.\d+)?", answer):
        answer = answer.replace(",", "")
    return answer or None


def boxed_answer(solution: Any) -> str | None:
    r"""
    The content of the last `\boxed{...}` (or `\fbox{...}`) of a worked solution, as MATH writes its answers.

    Example:
    ```python
    >>> boxed_answer(r"So $x = \boxed{\frac{1}{2}}$ and we are done.")
    '\\frac{1}{2}'

    ```
    """
    if not isinstance(solution, str):
        return None
    start = max(solution.rfind("\\boxed"), solution.rfind("\\fbox"))
    if start < 0:
        return None
    brace = solution.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for i in range(brace, len(solution)):
        if solution[i] == "{":
            depth += 1
        elif solution[i] == "}":
            depth -= 1
            if depth == 0:
                return solution[brace + 1 : i].strip() or None
    return None  # unbalanced


def _plain_answer(value: Any) -> str | None:
    """
    An answer value as text: one-element lists are unwrapped (`["1"]` is `"1"`), numbers written out; a container
    with several values (or none) is unusable (`None`), never stringified into `"['1', '2']"`.

    Example:
    ```python
    >>> _plain_answer(["1"]), _plain_answer(3.0), _plain_answer(["1", "2"]), _plain_answer(" ")
    ('1', '3', None, None)

    ```
    """
    while isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if value is None or isinstance(value, (list, tuple, dict, set, bool, bytes)):
        return None
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        if value.is_integer():
            value = int(value)
    text = str(value).strip()
    return text or None


def _as_prompt(text: str, conversational: bool, system_prompt: str | None) -> str | list[dict[str, str]]:
    if not conversational:
        return text if system_prompt is None else f"{system_prompt}\n\n{text}"
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": text}]


def _lookup(row: dict[str, Any], path: str) -> Any:
    value: Any = row
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _require_column(dataset: Any, column: str, role: str, source: str) -> None:
    if column not in dataset.column_names:
        raise ValueError(
            f"{source} has no {role} column {column!r}; its columns are {dataset.column_names}. "
            f"Pass {role}_column= to pick another one."
            if role in ("prompt", "answer")
            else f"{source} has no column {column!r} to keep; its columns are {dataset.column_names}."
        )


def _load_raw(name_or_path: str, *, split: str, config_name: str | None) -> Any:
    import datasets

    if os.path.isdir(name_or_path):
        if os.path.exists(os.path.join(name_or_path, "dataset_info.json")) or os.path.exists(
            os.path.join(name_or_path, "state.json")
        ):
            loaded = datasets.load_from_disk(name_or_path)
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise ValueError(f"{name_or_path} has splits {list(loaded)}, not {split!r} (no slicing here).")
                return loaded[split]
            return loaded
        return datasets.load_dataset(name_or_path, config_name, split=split)
    if os.path.isfile(name_or_path):
        extension = _extension(name_or_path)
        builder = _LOCAL_BUILDERS.get(extension)
        if builder is None:
            raise ValueError(
                f"Unsupported file type {extension or '(none)'!r} for {name_or_path}; use one of "
                f"{sorted(_LOCAL_BUILDERS)}."
            )
        return _load_local_file(name_or_path, builder, split)
    if name_or_path.startswith((".", "/", "~")) or _extension(name_or_path) in _LOCAL_BUILDERS:
        raise FileNotFoundError(f"No such dataset file or folder: {name_or_path}")
    config_name = config_name or _DEFAULT_CONFIGS.get(name_or_path)
    return datasets.load_dataset(name_or_path, config_name, split=split)


def _load_local_file(path: str, builder: str, split: str) -> Any:
    """One local data file as `split`; a file without rows is named instead of failing deep inside `datasets`."""
    import datasets

    if _is_blank_file(path) or (builder == "parquet" and _parquet_rows(path) == 0):
        raise ValueError(_no_rows_message(path))
    try:
        raw = datasets.load_dataset(builder, data_files={_split_base(split): path}, split=split)
    except ValueError as error:
        # a header-only CSV, a JSON `[]` or an Arrow stream without batches: `datasets` reports an empty split
        if "corresponds to no data" in str(error):
            raise ValueError(_no_rows_message(path)) from error
        raise
    if len(raw) == 0:
        raise ValueError(_no_rows_message(path))
    return raw


def _no_rows_message(path: str) -> str:
    return f"{path} has no rows: the file is empty, or holds only a header or an empty list. Point to a file with training rows."


def _is_blank_file(path: str, chunk: int = 1 << 16) -> bool:
    """Whether `path` holds no bytes, or (for text formats, gzipped or not) nothing but whitespace."""
    if os.path.getsize(path) == 0:
        return True
    if _extension(path) not in (".jsonl", ".json", ".csv"):
        return False
    opener = gzip.open if path.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            while block := handle.read(chunk):
                if block.strip():
                    return False
    except OSError:  # not really gzip, say: let `datasets` report it
        return False
    return True


def _parquet_rows(path: str) -> int | None:
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(path).num_rows
    except Exception:  # not a readable Parquet file: let `datasets` report it
        return None


def _split_base(split: str) -> str:
    return re.split(r"[\[+]", split, maxsplit=1)[0].strip()


def _extension(path: str) -> str:
    name = path.lower()
    for suffix in (".jsonl.gz", ".json.gz"):
        if name.endswith(suffix):
            return suffix[: -len(".gz")]
    return os.path.splitext(name)[1]


def count_duplicate_prompts(dataset: Any, *, column: str = "prompt") -> int:
    """
    Number of rows whose prompt text repeats an earlier row's (0 when all prompts are distinct).

    DAPO forms a group of `num_generations` samples per prompt; a prompt that appears many times in the data is
    drawn many times per epoch, which skews training towards it (DAPO-Math-17k's published file repeats each prompt
    ~100 times).

    Example:
    ```python
    >>> from datasets import Dataset
    >>> count_duplicate_prompts(Dataset.from_dict({"prompt": ["a", "b", "a", "a"]}))
    2

    ```
    """
    if column not in dataset.column_names:
        raise ValueError(f"No column {column!r}; the dataset has {dataset.column_names}.")
    from ..trainer.dataset_checks import prompt_text

    prompts = dataset[column]
    return len(prompts) - len({prompt_text(p) for p in prompts})
