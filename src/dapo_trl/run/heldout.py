"""
A run's held-out result: one evaluation of the held-out problems before RL and one after, with the same prompts and
the same sampling (the run record's), so that the change between them is the effect of training and the "after" is
what `python -m dapo_trl.evaluation --model RUN_FOLDER` reproduces.

Used by `examples/train_math.py`: [`heldout_evaluation`] scores a model as [`~dapo_trl.run.evaluation.evaluate`] does,
with the prompt format, sampling settings and reward rule of the [`RunRecord`]; [`paired_result`] pairs the two
measurements problem by problem; [`evaluation_engine`] hands a vLLM run's colocated engine (synced with the model's
current weights) to the evaluation, so that a run that generated with vLLM is evaluated with it too.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from .run_record import RunRecord

logger = logging.getLogger(__name__)

BEFORE_FILE = "heldout_before.json"  # the "before" measurement, kept in the run folder for a resumed run


def heldout_evaluation(model: Any, tokenizer: Any, dataset: Any, record: RunRecord, *, engine: Any = None) -> dict:
    """
    Score `model` on the held-out `dataset` as `record` says the run evaluates: its prompt format, sampling settings
    ([`EvalSettings`]; `temperature=0` is greedy) and reward rule, with the verifier's strict extraction (the
    evaluation command line's default). The global random state is left as it was, so that evaluating before RL does
    not change the training run.

    Returns:
        `dict`: the metrics of [`~dapo_trl.run.evaluation.evaluate`] (without the samples), plus `accuracy` (avg@k), `n`,
        `correct` (each problem's share of right samples, for [`paired_result`]), `sampling` (how the completions
        were drawn, in words), `format_rate`, `examples` (the first three completions), `backend` and `seconds`.
    """
    import torch

    from .evaluation import _verifier_functions, evaluate

    settings, prompt_format = record.evaluation, record.prompt_format
    scorer, extractor, equivalent = _verifier_functions("strict", settings.reward_rule)
    state = torch.get_rng_state()
    started = time.perf_counter()
    try:
        metrics = evaluate(
            model,
            dataset,
            k=settings.k,
            temperature=settings.temperature,
            top_p=settings.top_p,
            max_new_tokens=settings.max_new_tokens,
            batch_size=settings.batch_size,
            seed=settings.seed,
            tokenizer=tokenizer,
            use_chat_template=prompt_format.conversational,
            chat_template_kwargs=prompt_format.chat_template_kwargs,
            max_prompt_length=prompt_format.max_prompt_length,
            prompt_truncation_side=prompt_format.prompt_truncation_side,
            scorer=scorer,
            answer_extractor=extractor,
            answer_equivalent=equivalent,
            progress=False,
            return_samples=True,
            backend="vllm" if engine is not None else "transformers",
            vllm_engine=engine,
        )
    finally:
        torch.set_rng_state(state)
    samples = metrics.pop("samples")
    metrics["accuracy"], metrics["n"] = metrics[f"avg@{settings.k}"], metrics["num_prompts"]
    metrics["format_rate"] = 1 - metrics["no_answer_frac"]  # completions with an answer the verifier can read
    metrics["correct"] = [sum(map(bool, s["correct"])) / len(s["correct"]) for s in samples]
    metrics["sampling"] = settings.describe()
    metrics["examples"] = [s["completions"][0] for s in samples[:3]]
    metrics["backend"] = "vllm" if engine is not None else "transformers"
    metrics["seconds"] = time.perf_counter() - started
    return metrics


def paired_result(before: dict, after: dict) -> dict:
    """
    The held-out change on the same problems: `before`, `after`, `change`, its paired standard error `paired_se`,
    `n`, `above_2_se`, and `sampling` (see [`~dapo_trl.run.warmup.paired_change`]).

    Example:
    ```python
    >>> result = paired_result(
    ...     {"accuracy": 0.25, "n": 4, "correct": [0, 0, 1, 0], "sampling": "greedy, k=1"},
    ...     {"accuracy": 0.75, "n": 4, "correct": [1, 1, 1, 0], "sampling": "greedy, k=1"},
    ... )
    >>> result["change"], result["n"], result["sampling"]
    (0.5, 4, 'greedy, k=1')

    ```
    """
    from .warmup import paired_change

    if before.get("sampling") != after.get("sampling"):
        raise ValueError(f"before ({before.get('sampling')}) and after ({after.get('sampling')}) were sampled apart.")
    return {**paired_change(before, after), "sampling": after["sampling"]}


def evaluation_engine(trainer: Any) -> Any:
    """
    The vLLM engine that generated a run's rollouts, synced with the model's current weights, or `None` to evaluate
    with transformers: without vLLM, in server mode (the server belongs to the trainer's rollouts) and with
    `vllm_enable_sleep_mode` (the engine sleeps between rollouts). Every process must call it (the sync is collective
    under ZeRO-3).
    """
    args = trainer.args
    generation = getattr(trainer, "vllm_generation", None) if args.use_vllm else None
    if generation is None:
        return None
    if args.vllm_mode != "colocate" or args.vllm_enable_sleep_mode:
        reason = "server mode" if args.vllm_mode != "colocate" else "vllm_enable_sleep_mode"
        logger.info(f"The held-out evaluation samples with transformers ({reason}: no colocated engine to use).")
        return None
    generation.sync_weights()
    return generation.llm


def save_before(output_dir: str, before: dict) -> None:
    """Keep the "before" measurement in the run folder: a resumed run reports it instead of measuring a checkpoint."""
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, BEFORE_FILE), "w") as f:
        json.dump(before, f, indent=2)


def load_before(output_dir: str) -> dict | None:
    """The "before" measurement a run saved in `output_dir` with [`save_before`], or `None`."""
    path = os.path.join(output_dir, BEFORE_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def describe_heldout(result: dict) -> str:
    """
    The summary's held-out line: before -> after (the paired change when measured), the number of problems and how
    the completions were drawn.

    Example:
    ```python
    >>> describe_heldout(
    ...     {"before": 0.333, "after": 0.647, "change": 0.314, "paired_se": 0.045, "n": 150, "sampling": "greedy, k=1"}
    ... )
    '0.333 -> 0.647  (change +0.314, paired SE 0.045; 150 problems, greedy, k=1)'
    >>> describe_heldout({"after": 0.6, "n": 20, "sampling": "temperature 1, k=4"})
    '0.600 after RL  (20 problems, temperature 1, k=4)'

    ```
    """
    where = f"{result['n']} problems, {result['sampling']}"
    if result.get("paired_se") is not None:
        where = f"change {result['change']:+.3f}, paired SE {result['paired_se']:.3f}; {where}"
    if result.get("before") is None:
        return f"{result['after']:.3f} after RL  ({where})"
    return f"{result['before']:.3f} -> {result['after']:.3f}  ({where})"
