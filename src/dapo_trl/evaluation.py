"""Evaluation of math policies: avg@k, pass@k and maj@k (DAPO §4.1 reports avg@32 on AIME 2024).

The metric functions are pure and take lists; [`evaluate`] samples `k` completions per prompt and feeds them through
a scorer `(completion, answer) -> bool`.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

Scorer = Callable[[str, str], bool]

_ANSWER_LINE = re.compile(r"Answer\s*:\s*(.+)")


def extract_answer_line(completion: str) -> str | None:
    """
    Return the text after the last `Answer:` in a completion (DAPO's answer format), stripped, or `None`.

    Example:
    ```python
    >>> extract_answer_line("12+30=42\\nAnswer: 42")
    '42'
    >>> extract_answer_line("no answer here") is None
    True

    ```
    """
    matches = _ANSWER_LINE.findall(completion)
    if not matches:
        return None
    answer = matches[-1].strip()
    # "$42$" or "42." are common decorations of a plain answer
    answer = answer.strip("$ ").rstrip(".")
    return answer or None


def _normalize(answer: str) -> str:
    return re.sub(r"\s+", "", answer).strip("$").rstrip(".")


def exact_match_scorer(completion: str, answer: str) -> bool:
    """
    Whitespace-insensitive exact match of the last `Answer:` line against the reference; integers compare by value.

    A deliberately simple scorer: pass `dapo_trl`'s math verifier for real benchmarks.

    Example:
    ```python
    >>> exact_match_scorer("Answer: 007", "7")
    True
    >>> exact_match_scorer("Answer: 1/2", "\\\\frac{1}{2}")
    False

    ```
    """
    predicted = extract_answer_line(completion)
    if predicted is None:
        return False
    predicted, reference = _normalize(predicted), _normalize(str(answer))
    if re.fullmatch(r"[+-]?\d+", predicted) and re.fullmatch(r"[+-]?\d+", reference):
        return int(predicted) == int(reference)
    return predicted == reference


# ---------------------------------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------------------------------


def avg_at_k(correct: Sequence[Sequence[bool]]) -> float:
    """
    Mean accuracy over all `k` samples of all prompts (avg@k), the metric DAPO reports (avg@32).

    Args:
        correct (`Sequence[Sequence[bool]]`):
            `correct[i][j]` is whether sample `j` of prompt `i` is right. Prompts may have different sample counts;
            each prompt weighs the same.

    Example:
    ```python
    >>> avg_at_k([[True, False], [True, True]])
    0.75

    ```
    """
    if len(correct) == 0:
        raise ValueError("avg_at_k needs at least one prompt.")
    per_prompt = []
    for samples in correct:
        if len(samples) == 0:
            raise ValueError("Every prompt needs at least one sample.")
        per_prompt.append(sum(bool(c) for c in samples) / len(samples))
    return sum(per_prompt) / len(per_prompt)


def pass_at_k(n: int, c: int, k: int) -> float:
    r"""
    Unbiased pass@k estimator of Chen et al. (2021), for one prompt with `n` samples of which `c` are correct.

    $$
    \text{pass@}k = 1 - \binom{n - c}{k} \Big/ \binom{n}{k}
    $$

    computed with exact integer binomials (Python divides big integers with correct rounding).

    Example:
    ```python
    >>> pass_at_k(5, 2, 1)
    0.4
    >>> pass_at_k(5, 0, 3)
    0.0
    >>> pass_at_k(5, 3, 3)
    1.0

    ```
    """
    if not 0 <= c <= n:
        raise ValueError(f"Need 0 <= c <= n, got n={n}, c={c}.")
    if not 1 <= k <= n:
        raise ValueError(f"Need 1 <= k <= n, got n={n}, k={k}.")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
    """Mean of [`pass_at_k`] over prompts, with `n` = the number of samples of each prompt."""
    if len(correct) == 0:
        raise ValueError("mean_pass_at_k needs at least one prompt.")
    return sum(pass_at_k(len(s), sum(bool(x) for x in s), k) for s in correct) / len(correct)


def majority_vote(answers: Sequence[str | None]) -> int | None:
    """
    Index of the first sample carrying the most frequent extracted answer; `None` answers do not vote.

    Ties go to the answer that appears first among the samples, so the result is deterministic.

    Example:
    ```python
    >>> majority_vote(["3", "4", "4", "3"])  # tie 2-2: "3" came first
    0
    >>> majority_vote([None, "5", "6", "6"])
    2
    >>> majority_vote([None, None]) is None
    True

    ```
    """
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    for index, answer in enumerate(answers):
        if answer is not None and counts[answer] == best:
            return index
    return None  # unreachable


def maj_at_k(answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]]) -> float:
    """
    Majority-vote accuracy (maj@k): for each prompt, the sample holding the most frequent answer decides.

    Args:
        answers (`Sequence[Sequence[str | None]]`):
            Normalised extracted answer of each sample (`None` when none was found). Equivalent answers must already
            be spelled the same (e.g. normalised by the verifier).
        correct (`Sequence[Sequence[bool]]`):
            Whether each sample is right; same shape as `answers`.

    Example:
    ```python
    >>> maj_at_k([["3", "4", "4"], ["1", None, "2"]], [[False, True, True], [True, False, False]])
    1.0

    ```
    """
    if len(answers) != len(correct):
        raise ValueError(f"answers and correct differ in length: {len(answers)} != {len(correct)}.")
    if len(answers) == 0:
        raise ValueError("maj_at_k needs at least one prompt.")
    hits = 0
    for prompt_answers, prompt_correct in zip(answers, correct, strict=True):
        if len(prompt_answers) != len(prompt_correct):
            raise ValueError("answers and correct must have the same number of samples per prompt.")
        winner = majority_vote(prompt_answers)
        hits += winner is not None and bool(prompt_correct[winner])
    return hits / len(answers)


# ---------------------------------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------------------------------


def sample_completions(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str | list[dict[str, str]]],
    *,
    k: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    do_sample: bool = True,
    batch_size: int = 32,
    seed: int | None = 0,
    progress: bool = False,
) -> list[list[str]]:
    """
    Sample `k` completions per prompt with transformers `generate` (left padding, special tokens skipped).

    Chat-message prompts go through the tokenizer's chat template with a generation prompt. `batch_size` counts
    prompts; each batch holds `batch_size * k` sequences.

    Returns:
        `list[list[str]]`: `k` decoded completions for each prompt, in order.
    """
    import torch
    from tqdm.auto import tqdm

    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}.")
    if not do_sample and k > 1:
        logger.warning("Greedy decoding with k=%d yields %d identical completions per prompt.", k, k)
    texts = [_render_prompt(tokenizer, p) for p in prompts]
    # a chat template already writes the special tokens; plain prompts get the tokenizer's usual ones (e.g. BOS)
    add_special_tokens = all(isinstance(p, str) for p in prompts)
    if seed is not None:
        torch.manual_seed(seed)
    previous_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    gen_kwargs: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "do_sample": do_sample,
        "num_return_sequences": k,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    if do_sample:
        # top_k=0 disables transformers' default top-k=50 so that temperature/top-p alone shape the distribution
        gen_kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
    else:
        gen_kwargs.update(temperature=None, top_p=None, top_k=None)
    out: list[list[str]] = []
    try:
        batches = range(0, len(texts), batch_size)
        for start in tqdm(batches, desc="sampling", disable=not progress, unit="batch"):
            chunk = texts[start : start + batch_size]
            enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens).to(device)
            with torch.no_grad():
                generated = model.generate(**enc, **gen_kwargs)  # (len(chunk) * k, P + C)
            decoded = tokenizer.batch_decode(generated[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            out.extend(decoded[i * k : (i + 1) * k] for i in range(len(chunk)))
    finally:
        tokenizer.padding_side = previous_side
        model.train(was_training)
    return out


def _render_prompt(tokenizer: Any, prompt: str | list[dict[str, str]]) -> str:
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
