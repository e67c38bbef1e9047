"""A real model's path to RL on CPU: train only the top layers, a supervised format warm-up, a paired held-out check.

Used by `examples/train_math.py` (`--sft_steps`, `--train_top_layers`, `--eval_before_rl`; `configs/smollm2_cpu.yaml`).
A pretrained instruct model asked for `Answer: <n>` is almost never right at first (it rambles and copies the
instruction), so every group is all-wrong and RL has no signal; a few dozen supervised steps on worked answers put it
in the mixed-correctness regime where it has (docs/real_model.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import torch


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
) -> dict:
    """
    Supervised warm-up: `steps` AdamW steps of `batch_size` examples drawn at random, loss on the completion
    (`target` + end of turn) only, linear warm-up over the first tenth then cosine decay. Returns the losses and time.
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
        progress=False,
    )
    return {"steps": steps, "loss_first": losses[0], "loss_last": losses[-1], "seconds": time.perf_counter() - started}


def heldout_accuracy(
    model: Any, tokenizer: Any, prompts: Sequence, answers: Sequence[str], *, max_new_tokens: int
) -> dict:
    """
    Greedy completion of every held-out prompt at the training length cap, scored by the verifier (strict
    extraction): accuracy, its binomial standard error, and each problem's 0/1 result (for a paired comparison).
    """
    from dapo_trl.run.evaluation import sample_completions
    from dapo_trl.verifier import extract_answer, score_completion

    started = time.perf_counter()
    state = torch.get_rng_state()  # evaluating must not move the training run's random stream
    was_training = model.training
    try:
        groups = sample_completions(
            model, tokenizer, list(prompts), k=1, max_new_tokens=max_new_tokens, do_sample=False, batch_size=50, seed=0
        )
    finally:
        torch.set_rng_state(state)
        model.train(was_training)
    completions = [group[0] for group in groups]
    correct = [
        float(bool(score_completion(c, a, extraction="strict"))) for c, a in zip(completions, answers, strict=True)
    ]
    formatted = [extract_answer(c, extraction="strict") is not None for c in completions]
    accuracy, se = mean_se(correct)
    return {
        "n": len(correct),
        "accuracy": accuracy,
        "accuracy_se": se,
        "format_rate": sum(formatted) / len(formatted),
        "correct": correct,
        "examples": completions[:3],
        "seconds": time.perf_counter() - started,
    }


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
