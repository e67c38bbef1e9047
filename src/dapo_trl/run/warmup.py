"""A real model's path to RL on CPU: train only the top layers, a supervised format warm-up, a paired held-out change.

Used by `examples/train_math.py` (`--sft_steps`, `--train_top_layers`; `configs/smollm2_cpu.yaml`); the held-out
result before and after RL is `dapo_trl.run.heldout`'s.
A pretrained instruct model asked for `Answer: <n>` is almost never right at first (it rambles and copies the
instruction), so every group is all-wrong and RL has no signal; a few dozen supervised steps on worked answers put it
in the mixed-correctness regime where it has (docs/real_model.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any


def freeze_below(model: Any, train_layers: int) -> int:
    """
    Freeze the embeddings (tied to the output head) and every decoder layer but the top `train_layers`; return the
    number of trainable parameters. Backward then stops at the lowest trainable layer, which makes a CPU step cheaper.
    """
    layers = model.model.layers
    if not 0 < train_layers <= len(layers):
        raise ValueError(f"train_top_layers must be in 1..{len(layers)} for this model, got {train_layers}.")
    for param in model.parameters():
        param.requires_grad_(False)
    for layer in layers[len(layers) - train_layers :]:
        layer.requires_grad_(True)
    model.model.norm.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def render_prompts(tokenizer: Any, prompts: Sequence) -> list[str]:
    """Chat prompts rendered with the tokenizer's template (generation prompt added), as TRL renders them."""
    from dapo_trl.run.evaluation import encode_prompts

    texts, _ = encode_prompts(tokenizer, list(prompts))
    return texts


def sft_warm_up(
    model: Any,
    tokenizer: Any,
    prompts: Sequence,
    targets: Sequence[str],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    progress: bool = False,
) -> dict:
    """
    Supervised warm-up: `steps` AdamW steps of `batch_size` examples drawn at random, loss on the completion
    (`target` + end of turn) only, linear warm-up over the first tenth then cosine decay, with a progress bar when
    `progress` (a real model's steps take seconds each on CPU). Returns the losses and time.
    """
    from datasets import Dataset

    from dapo_trl.run.toy import warmup_sft

    started = time.perf_counter()
    dataset = Dataset.from_dict({"prompt": render_prompts(tokenizer, prompts), "target": list(targets)})
    losses = warmup_sft(
        model,
        tokenizer,
        dataset,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        warmup_steps=max(1, steps // 10),
        stop_accuracy=None,
        progress=progress,
    )
    return {"steps": steps, "loss_first": losses[0], "loss_last": losses[-1], "seconds": time.perf_counter() - started}


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (sample standard deviation / sqrt(n))."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / max(1, n - 1)
    return mean, math.sqrt(var / n)


def paired_change(before: dict, after: dict) -> dict:
    """The change in held-out accuracy on the same problems, with the standard error of the per-problem difference."""
    change, se = mean_se([a - b for a, b in zip(after["correct"], before["correct"], strict=True)])
    return {
        "before": before["accuracy"],
        "after": after["accuracy"],
        "change": change,
        "paired_se": se,
        "n": before["n"],
        "above_2_se": change > 2 * se,
    }
