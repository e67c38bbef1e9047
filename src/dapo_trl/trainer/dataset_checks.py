"""Checks of the training set at construction, and the placeholder dataset that paces dynamic sampling's steps."""

from __future__ import annotations

import contextlib
import logging
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from datasets import IterableDataset

from ..dapo_config import default_notes

logger = logging.getLogger(__name__)


class PacingDataset(torch.utils.data.Dataset):
    """Placeholder rows for the dataloader when dynamic sampling draws the prompts itself."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        return {"prompt": ""}


def check_train_dataset(dataset: Any, args: Any, has_environment: bool) -> list | None:
    """
    Refuse a training set that cannot train, naming the column or the rows, before TRL fails on it at step 1.

    Returns the `prompt` column of a map-style set (read once here, for the other construction-time checks), else `None`.
    """
    if dataset is None:
        return None
    if isinstance(dataset, IterableDataset):
        if _dispatches_batches(args):
            return None  # TRL refuses this with its own error (dispatch_batches=False); let GRPOTrainer's come first
        if args.max_steps is None or args.max_steps <= 0:
            raise ValueError(
                "A streamed (IterableDataset) training set has no length, so the number of steps must be given: set "
                "max_steps."
            )
        return None
    columns = getattr(dataset, "column_names", None)
    if columns is not None and "prompt" not in columns and not has_environment:
        raise ValueError(
            f"The training dataset has no 'prompt' column (its columns are {columns}). Rename the column holding the "
            "prompts to 'prompt' (e.g. dataset.rename_column('question', 'prompt')), or build it with "
            "dapo_trl.run.data.load_math_dataset."
        )
    if len(dataset) == 0:
        raise ValueError("The training dataset is empty.")
    prompts = dataset["prompt"] if columns is not None and "prompt" in columns else None
    if prompts is not None:
        empty = [i for i, prompt in enumerate(prompts) if is_empty_prompt(prompt)]
        if empty:
            raise ValueError(
                f"The training dataset has {len(empty)} empty prompts (rows {empty[:10]}{' ...' if len(empty) > 10 else ''}). "
                "Remove them (e.g. dataset.filter(lambda row: row['prompt'])): a model cannot generate from nothing."
            )
    prompts_per_batch = args.generation_batch_size // args.num_generations
    if not args.dynamic_sampling and len(dataset) < prompts_per_batch:
        message = (
            f"The training dataset has {len(dataset)} prompts but one generation batch needs {prompts_per_batch} "
            f"(generation_batch_size {args.generation_batch_size} / num_generations {args.num_generations}); with "
            "dynamic_sampling=False, TRL's sampler would yield no batch and train 0 steps. Use more prompts, a smaller "
            "batch, or dynamic_sampling=True (which cycles the prompts)."
        )
        raise ValueError(message + default_notes(message, args))
    return prompts


def _dispatches_batches(args: Any) -> bool:
    config = getattr(args, "accelerator_config", None)
    return bool(getattr(config, "dispatch_batches", None))


def is_empty_prompt(prompt: Any) -> bool:
    """A prompt with no text: `None`, a blank string, or messages whose contents are all blank."""
    if prompt is None:
        return True
    if isinstance(prompt, str | list):
        return not prompt_text(prompt).strip()
    return False


_repeats_expected = [False]


@contextlib.contextmanager
def repeated_prompts_expected() -> Iterator[None]:
    """
    Inside the block, [`warn_duplicates`] says how often prompts repeat at INFO level, without the advice to
    deduplicate: for a training set that repeats prompts by design (the CPU demo's synthetic problems).
    """
    previous, _repeats_expected[0] = _repeats_expected[0], True
    try:
        yield
    finally:
        _repeats_expected[0] = previous


def warn_duplicates(prompts: list) -> None:
    """Warn when the training prompts repeat (DAPO-Math-17k's published file does, ~100x)."""
    counts = Counter(repr(p) for p in prompts)
    duplicates = len(prompts) - len(counts)
    if duplicates and _repeats_expected[0]:
        logger.info(f"The training dataset repeats prompts by design: {len(counts)} unique of {len(prompts)}.")
    elif duplicates:
        logger.warning(
            f"The training dataset holds {duplicates} duplicated prompts ({len(counts)} unique of {len(prompts)}). "
            "Dynamic sampling never repeats a row within an epoch, but duplicated rows are still drawn once each; "
            "deduplicate the dataset (DAPO-Math-17k repeats each prompt ~100x) unless the repetition is intended."
        )


def count_prompt_tokens(tokenizer: Any, prompt: Any) -> int:
    """Tokens of a prompt as generation sees it (chat template applied to conversations when the tokenizer has one)."""
    if not isinstance(prompt, str) and getattr(tokenizer, "chat_template", None):
        try:
            ids = tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True)
            return len(ids["input_ids"] if isinstance(ids, dict) else ids)
        except Exception:  # a template that cannot render this prompt: count its text instead
            pass
    return len(tokenizer(prompt_text(prompt))["input_ids"])


def check_prompt_lengths(
    prompts: list, tokenizer: Any, context: int, *, max_completion_length: int | None = None
) -> None:
    """
    Refuse a map-style training set holding prompts longer than the model's context (`context` tokens), naming the
    rows, the text every prompt shares when that is what makes them long (a template), and a `max_prompt_length` that
    leaves room for `max_completion_length` inside the context. Only prompts whose UTF-8 size exceeds the context are
    tokenised (a token covers at least one byte, so the others fit), which keeps the check instant on ordinary data.
    """
    slack = 64  # special and chat-template tokens
    suspects = [i for i, prompt in enumerate(prompts) if len(prompt_text(prompt).encode()) + slack > context]
    too_long = [(i, n) for i in suspects if (n := count_prompt_tokens(tokenizer, prompts[i])) > context]
    if too_long:
        shown = ", ".join(f"row {i}: {n} tokens" for i, n in too_long[:10])
        raise ValueError(
            f"{len(too_long)} training prompts are longer than the model's context of {context} tokens ({shown}"
            f"{', ...' if len(too_long) > 10 else ''}). "
            + shared_text_note(prompts, tokenizer)
            + prompt_length_advice(context, max_completion_length)
        )


def shared_text_note(prompts: list, tokenizer: Any, *, least: int = 16, sample: int = 1000) -> str:
    """
    A sentence naming the text every prompt starts and ends with, when it is at least `least` tokens: a template
    (DAPO's, say) or a long system prompt, which the user can leave out; else "".
    """
    texts = [prompt_text(p) for p in prompts[:sample]]
    if len(texts) < 2:
        return ""
    prefix = os.path.commonprefix(texts)
    suffix = os.path.commonprefix([t[len(prefix) :][::-1] for t in texts])[::-1]
    shared = sum(len(tokenizer(part, add_special_tokens=False)["input_ids"]) for part in (prefix, suffix) if part)
    if shared < least:
        return ""
    return (
        f"{shared} tokens of every prompt are the same text around its problem: a prompt template or system prompt. "
        "DAPO's template is one: `dapo_trl.run.data.load_math_dataset` wraps it around each problem for the formats "
        "problem, question, gsm8k and math; to train on the problems as they are, read the data with "
        "`--dataset_format columns --prompt_column <its column>` (`load_math_dataset(..., apply_template=False)`). "
    )


def prompt_length_advice(context: int, max_completion_length: int | None) -> str:
    """
    What to set so that prompts fit: a `max_prompt_length` that leaves `max_completion_length` tokens of the context
    for the completion (never one the context cannot hold), or a shorter `max_completion_length` first.

    Example:
    ```python
    >>> prompt_length_advice(128, 32)[:79]
    'Or set max_prompt_length to at most 96 (the context minus max_completion_length)'
    >>> prompt_length_advice(128, 128)[:61]
    'max_completion_length (128) alone fills the 128-token context'

    ```
    """
    room = context - (max_completion_length or 0)
    if room < 1:
        return (
            f"max_completion_length ({max_completion_length}) alone fills the {context}-token context: lower it, "
            "then set max_prompt_length to what is left, or use a model with a longer context."
        )
    verl = " (verl's DAPO recipe uses 2,048)" if room >= 2048 else ""
    return (
        f"Or set max_prompt_length to at most {room} (the context minus max_completion_length){verl} to cut long "
        "prompts (prompt_truncation_side='left' keeps their end), or remove those rows."
    )


def truncate_prompt_ids(prompt_ids: list, limit: int, side: str) -> tuple[list, int]:
    """
    Cut every prompt longer than `limit` tokens: `"left"` keeps its last `limit` tokens, `"right"` its first, and
    `"error"` raises. Returns the prompts and how many were cut.

    Example:
    ```python
    >>> truncate_prompt_ids([[1, 2, 3, 4], [5]], 2, "left")
    ([[3, 4], [5]], 1)

    ```
    """
    cut = 0
    out = []
    for ids in prompt_ids:
        if len(ids) <= limit:
            out.append(ids)
            continue
        if side == "error":
            raise ValueError(
                f"A prompt of {len(ids)} tokens is longer than max_prompt_length={limit} and "
                "prompt_truncation_side='error'. Raise max_prompt_length, or set prompt_truncation_side to 'left' or "
                "'right' to cut long prompts."
            )
        cut += 1
        out.append(ids[len(ids) - limit :] if side == "left" else ids[:limit])
    return out, cut


def prompt_text(prompt: Any) -> str:
    """
    The text of a prompt: the string itself, or the concatenated contents of a chat-message list.

    Example:
    ```python
    >>> prompt_text([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}])
    'Be brief.\\n1+1?'

    ```
    """
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict):
        content = prompt.get("content")
        if content is None:
            return ""
        if isinstance(content, list):  # multimodal content parts: their text
            return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
        return str(content)
    if isinstance(prompt, list | tuple):
        return "\n".join(prompt_text(m) for m in prompt)
    raise TypeError(f"Unsupported prompt of type {type(prompt).__name__}.")
