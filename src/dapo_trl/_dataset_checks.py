"""Checks of the training set at construction, and the placeholder dataset that paces dynamic sampling's steps."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import torch
from datasets import IterableDataset

logger = logging.getLogger(__name__)


class PacingDataset(torch.utils.data.Dataset):
    """Placeholder rows for the dataloader when dynamic sampling draws the prompts itself."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        return {"prompt": ""}


def check_train_dataset(dataset: Any, args: Any, has_environment: bool) -> None:
    """Refuse a training set that cannot train, naming the column or the rows, before TRL fails on it at step 1."""
    if dataset is None:
        return
    if isinstance(dataset, IterableDataset):
        if args.max_steps is None or args.max_steps <= 0:
            raise ValueError(
                "A streamed (IterableDataset) training set has no length, so the number of steps must be given: set "
                "max_steps."
            )
        return
    columns = getattr(dataset, "column_names", None)
    if columns is not None and "prompt" not in columns and not has_environment:
        raise ValueError(
            f"The training dataset has no 'prompt' column (its columns are {columns}). Rename the column holding the "
            "prompts to 'prompt' (e.g. dataset.rename_column('question', 'prompt')), or build it with "
            "dapo_trl.data.load_math_dataset."
        )
    if len(dataset) == 0:
        raise ValueError("The training dataset is empty.")
    if columns is not None and "prompt" in columns:
        empty = [i for i, prompt in enumerate(dataset["prompt"]) if not prompt]
        if empty:
            raise ValueError(
                f"The training dataset has {len(empty)} empty prompts (rows {empty[:10]}{' ...' if len(empty) > 10 else ''}). "
                "Remove them (e.g. dataset.filter(lambda row: row['prompt'])): a model cannot generate from nothing."
            )
    prompts_per_batch = args.generation_batch_size // args.num_generations
    if not args.dynamic_sampling and len(dataset) < prompts_per_batch:
        raise ValueError(
            f"The training dataset has {len(dataset)} prompts but one generation batch needs {prompts_per_batch} "
            f"(generation_batch_size {args.generation_batch_size} / num_generations {args.num_generations}); with "
            "dynamic_sampling=False, TRL's sampler would yield no batch and train 0 steps. Use more prompts, a smaller "
            "batch, or dynamic_sampling=True (which cycles the prompts)."
        )


def warn_duplicates(dataset) -> None:
    if "prompt" not in dataset.column_names:
        return
    counts = Counter(repr(p) for p in dataset["prompt"])
    duplicates = len(dataset) - len(counts)
    if duplicates:
        logger.warning(
            f"The training dataset holds {duplicates} duplicated prompts ({len(counts)} unique of {len(dataset)}). "
            "Dynamic sampling never repeats a row within an epoch, but duplicated rows are still drawn once each; "
            "deduplicate the dataset (DAPO-Math-17k repeats each prompt ~100x) unless the repetition is intended."
        )
