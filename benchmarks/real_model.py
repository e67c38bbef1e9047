r"""DAPO against naive GRPO on a real pretrained model (SmolLM2-135M-Instruct), on CPU, on the same token budget.

The toy ablation (`benchmarks/ablation.py`) trains a 0.34M-parameter character model whose completions give DAPO's
mechanisms little to act on. This benchmark trains a real pretrained instruct model (BPE tokenizer, chat template,
`<|im_end|>` end of turn) on grade-school arithmetic word problems the script generates, and reports what each
algorithm buys for the same number of generated tokens.

Protocol:

- Problems: one- and two-step word problems (add, subtract, multiply, share equally; [`make_problem`]), seeded, with
  integer gold answers. The split is a function of the question text ([`split_of`]), so the training and held-out
  splits are disjoint. Prompts are chat messages ending with the instruction to finish on a line `Answer: <n>`.
- Warm-up (cold start): a short supervised pass ([`dapo_trl.run.toy.warmup_sft`]) on training problems whose target is one
  worked line then `Answer: <n>` (loss on the completion only, AdamW). It is saved once under `--cache-dir` and both
  arms start from it.
- Two arms from the same warmed-up weights, same learning rate, batch, group size, sampling and length cap:
  - DAPO: `DAPOTrainer` with `DAPOConfig`'s defaults (clip-higher `epsilon_high=0.28`, dynamic sampling, token-level
    loss, soft overlong punishment, Eq. 13) and `overlong_buffer_len` set so that the penalty zone starts just past
    the longest well-formed answer: real completions reach it.
  - naive GRPO: TRL's `GRPOTrainer` with `GRPOConfig`'s defaults for the loss (TRL 1.16: `loss_type="dapo"`,
    `epsilon=0.2` on both sides), no dynamic sampling, no overlong shaping.
  - `steps_per_generation` > `gradient_accumulation_steps` (several optimizer steps per rollout), so the probability
    ratio leaves 1 and clipping acts.
- Budget: generated completion tokens, counting every token generated for training (dynamic sampling's discarded
  groups and extra rounds included). An arm stops at the first rollout boundary past the budget (or past
  `--max-minutes`, which the table then says).
- Held-out evaluation: greedy decoding, one completion per held-out problem, at the training length cap, scored with
  the project's math verifier with strict extraction (only an `Answer:` line or a boxed answer counts). Accuracy is
  reported with its binomial standard error, and each arm's change against the warmed-up model with the standard
  error of the paired per-problem difference. Evaluations run on the warmed-up model and at fixed fractions of the
  budget (`--eval-fractions`), so "tokens to reach the best" is read on that grid.

Settings (the defaults): 2,000 training and 200 held-out problems (60% two-step); the top 10 of the 30 decoder layers
trained (embeddings and the lower 20 layers frozen, in the warm-up and both arms: backward stops there, which about
halves a step on CPU); warm-up 40 steps x 8 examples, AdamW lr 5e-5 (linear warm-up, cosine decay); RL lr 2e-5
constant, G=8, 2 prompt groups per optimizer step, 2 optimizer steps per rollout (`steps_per_generation=2`,
`gradient_accumulation_steps=1`), T=1, `max_completion_length=40` with `overlong_buffer_len=8` (the longest well-formed
answer is 31 tokens, so the penalty zone starts just past it), `dynamic_sampling_max_rounds=4`, budget 8,000 generated
tokens per arm, evaluations at half and all of it.

Result (`benchmarks/results/real_model_2arm.md`; one seed; 2 shared cores, load average 4-12 from other jobs):

| model | gen. tokens | optimizer steps | held-out accuracy (SE) | change (paired SE) | 1-step | 2-step | mean length |
|---|---:|---:|---|---|---:|---:|---:|
| warmed-up | 0 | 0 | 0.330 (0.033) | - | 0.356 | 0.315 | 23.6 |
| DAPO | 8,443 | 6 | 0.340 (0.034) | +0.010 (0.030) | 0.493 | 0.252 | 21.8 |
| naive GRPO | 8,394 | 24 | 0.295 (0.032) | -0.035 (0.036) | 0.644 | 0.094 | 17.1 |

- The goal (DAPO above the warmed-up model by more than two standard errors) is not met: neither arm's overall change
  is distinguishable from zero. Both moved accuracy between the problem kinds instead: the warmed-up model often adds
  a spurious second step to one-step problems; GRPO learned to stop after one step (one-step 0.36 -> 0.64, two-step
  0.31 -> 0.09, mean length 23.6 -> 17.1 tokens), DAPO moved the same way, less (0.49 / 0.25).
- On the same tokens DAPO took 6 optimizer steps to GRPO's 24: its adaptive first round drew 14 groups to fill 4
  (56% informative), and the surplus is discarded without carry-over, so 96 of its 344 completions were trained on.
- The mechanisms acted: on the second update of each rollout 0.2% of tokens were clipped high and 0.5% low (means over
  all steps, the first update of a rollout clips nothing by construction); 3.6-5.8% of training completions hit the
  40-token cap and the overlong penalty averaged -0.06 to -0.08 per completion; GRPO's 0.0% / 0.17%.
- Wall time: warm-up 14.3 min, warmed-up evaluation 4.4 min, then the two arms concurrently (DAPO 25.2 min, GRPO
  30.1 min, held-out evaluations included): ~50 min in all.

Launch:
```
python scripts/get_smollm2.py --output models/SmolLM2-135M-Instruct
OMP_NUM_THREADS=1 python benchmarks/real_model.py --model models/SmolLM2-135M-Instruct   # warm-up, then both arms
OMP_NUM_THREADS=1 python benchmarks/real_model.py --quick              # CI smoke: tiny local model, seconds
OMP_NUM_THREADS=1 python benchmarks/real_model.py --quick --model models/SmolLM2-135M-Instruct   # 1 rollout per arm
python benchmarks/real_model.py --phase report --model models/SmolLM2-135M-Instruct   # table from what was written
```
The two arms run concurrently in two processes (one thread each). Each arm writes its record after every evaluation
(`--cache-dir`), so `--phase report` renders the table from a run that was stopped early. Results go to
`benchmarks/results/real_model_2arm.{md,json,png}` (`--quick`: `real_model_quick.*`).

`--phase unit` runs one arm per RL seed (`run_units`) and appends it to `benchmarks/results/real_model.json`; after
units, `--phase report` (same settings) writes the table over seeds (`real_model_units.md`) and the figures
`real_model_{accuracy,entropy,length,informative}.png` (`report_units`). The settings of a results JSON's units are
recorded under `settings`, and a unit with other settings is refused (`check_unit_settings`).

`--vllm` (with `.venv-vllm/bin/python`, docs/vllm.md) generates every rollout through colocated vLLM; naive GRPO then
runs as `DAPOTrainer` with GRPOConfig's loss and clipping (`naive_grpo_for_vllm`). The main experiment
(docs/real_model.md) ran that way at 10,000 generated tokens per unit; the 3,600-token one is in
`benchmarks/results/real_model_3600/`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

logger = logging.getLogger("real_model")
RESULTS_DIR = Path(__file__).resolve().parent / "results"
MODEL_ENV = "DAPO_TRL_SMOLLM2"
# vLLM's CPU backend on a 2-core machine (docs/vllm.md): bind both cores, a 1 GiB KV cache, eager start.
VLLM_CPU_ENV = {
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_CI_ENV": "1",
}
ARMS = ("dapo", "grpo")
ARM_NAMES = {"dapo": "DAPO", "grpo": "naive GRPO"}
# `--phase unit` arms (one seed each, appended to the results JSON): DAPOConfig's changes from its defaults.
UNIT_ARMS = {
    "grpo": None,  # TRL's GRPOTrainer and GRPOConfig
    "dapo": {},  # DAPOConfig's defaults, as the paper runs it
    "dapo_savings": {"dynamic_sampling_carry_over": True, "dynamic_sampling_skip": True},
    "dapo_eps02": {"epsilon_high": 0.2},  # without clip-higher
    "dapo_no_ds": {"dynamic_sampling": False},  # without dynamic sampling
}
ARM_NAMES.update(
    dapo_savings="DAPO + carry-over + skipping",
    dapo_eps02="DAPO, epsilon_high=0.2",
    dapo_no_ds="DAPO, no dyn. sampling",
)

# ---------------------------------------------------------------------------------------------------------------------
# Word problems
# ---------------------------------------------------------------------------------------------------------------------

NAMES = ("Ava", "Ben", "Cara", "Dan", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jo", "Kim", "Leo", "Mia", "Noah", "Omar")
ITEMS = ("apples", "marbles", "stickers", "books", "coins", "pencils", "cards", "shells", "eggs", "stamps")
SYSTEM_PROMPT = "Solve the math problem."
INSTRUCTION = "End with a line `Answer: <n>`."


@dataclasses.dataclass(frozen=True)
class Problem:
    question: str
    answer: int
    work: str  # one worked line, e.g. "12 + 7 = 19, 19 - 5 = 14."
    steps: int


def make_problem(rng: random.Random, steps: int) -> Problem:
    """One word problem of `steps` (1 or 2) arithmetic operations, with its integer answer and a worked line."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    r = rng.randint
    if steps == 1:
        kind = rng.choice(("add", "sub", "mul", "div"))
        if kind == "add":
            a, b = r(5, 60), r(2, 40)
            q = f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?"
            return Problem(q, a + b, f"{a} + {b} = {a + b}.", 1)
        if kind == "sub":
            a = r(12, 90)
            b = r(2, a - 1)
            q = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
            return Problem(q, a - b, f"{a} - {b} = {a - b}.", 1)
        if kind == "mul":
            a, b = r(2, 9), r(2, 12)
            q = f"{name} buys {a} bags with {b} {item} in each bag. How many {item} does {name} buy?"
            return Problem(q, a * b, f"{a} * {b} = {a * b}.", 1)
        k, each = r(2, 9), r(2, 12)
        q = f"{name} shares {k * each} {item} equally among {k} friends. How many {item} does each friend get?"
        return Problem(q, each, f"{k * each} / {k} = {each}.", 1)
    if steps != 2:
        raise ValueError(f"steps must be 1 or 2, got {steps}.")
    kind = rng.choice(("add_sub", "mul_sub", "mul_add", "add_div"))
    if kind == "add_sub":
        a, b = r(5, 60), r(2, 40)
        c = r(1, a + b - 1)
        s = a + b
        q = f"{name} has {a} {item}, gets {b} more, then gives away {c}. How many {item} does {name} have now?"
        return Problem(q, s - c, f"{a} + {b} = {s}, {s} - {c} = {s - c}.", 2)
    if kind == "mul_sub":
        a, b = r(2, 9), r(2, 12)
        p = a * b
        c = r(1, p - 1)
        q = f"{name} buys {a} bags with {b} {item} in each bag, then gives away {c}. How many {item} are left?"
        return Problem(q, p - c, f"{a} * {b} = {p}, {p} - {c} = {p - c}.", 2)
    if kind == "mul_add":
        a, b, c = r(2, 9), r(2, 12), r(2, 30)
        p = a * b
        q = f"{name} has {c} {item} and buys {a} bags with {b} {item} in each bag. How many {item} does {name} have?"
        return Problem(q, p + c, f"{a} * {b} = {p}, {p} + {c} = {p + c}.", 2)
    k, each = r(2, 6), r(2, 12)
    total = k * each
    a = r(1, total - 1)
    b = total - a
    q = (
        f"{name} has {a} {item} and finds {b} more, then shares them equally among {k} friends. "
        f"How many {item} does each friend get?"
    )
    return Problem(q, each, f"{a} + {b} = {total}, {total} / {k} = {each}.", 2)


def split_of(question: str) -> str:
    """`"test"` for about one question in five (by a hash of its text), else `"train"`: the splits are disjoint."""
    return "test" if int(hashlib.sha1(question.encode()).hexdigest(), 16) % 5 == 0 else "train"


def chat_prompt(question: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"{question}\n{INSTRUCTION}"},
    ]


def make_word_problems(n: int, *, seed: int, split: str, two_step_frac: float = 0.6) -> Any:
    """
    `n` distinct word problems of `split` (`"train"` or `"test"`) as a `datasets.Dataset` with columns `prompt` (chat
    messages), `answer` (the integer as a string), `target` (the warm-up's completion: worked line, then `Answer: <n>`)
    and `steps` (1 or 2). A share `two_step_frac` of the problems have two steps.
    """
    from datasets import Dataset

    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
    rng = random.Random(f"{seed}-{split}")
    rows: dict[str, list] = {"prompt": [], "answer": [], "target": [], "steps": []}
    seen: set[str] = set()
    attempts = 0
    while len(seen) < n:
        attempts += 1
        if attempts > 200 * n:
            raise RuntimeError(f"could not draw {n} distinct {split} problems")
        problem = make_problem(rng, 2 if rng.random() < two_step_frac else 1)
        if problem.question in seen or split_of(problem.question) != split:
            continue
        seen.add(problem.question)
        rows["prompt"].append(chat_prompt(problem.question))
        rows["answer"].append(str(problem.answer))
        rows["target"].append(f"{problem.work}\nAnswer: {problem.answer}")
        rows["steps"].append(problem.steps)
    return Dataset.from_dict(rows)


# ---------------------------------------------------------------------------------------------------------------------
# Held-out evaluation
# ---------------------------------------------------------------------------------------------------------------------


def score(completions: Sequence[str], answers: Sequence[str]) -> tuple[list[bool], list[bool]]:
    """Per completion: correct (the verifier, strict extraction) and formatted (a final answer could be extracted)."""
    from dapo_trl.verifier import extract_answer, score_completion

    correct = [bool(score_completion(c, a, extraction="strict")) for c, a in zip(completions, answers, strict=True)]
    formatted = [extract_answer(c, extraction="strict") is not None for c in completions]
    return correct, formatted


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (sample standard deviation / sqrt(n)); for 0/1 values, the binomial SE."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / max(1, n - 1)
    return mean, math.sqrt(var / n)


def paired_difference(after: Sequence[float], before: Sequence[float]) -> tuple[float, float]:
    """Mean per-problem change in accuracy and its standard error (the same problems scored twice)."""
    return mean_se([float(a) - float(b) for a, b in zip(after, before, strict=True)])


def evaluate_model(
    model: Any, tokenizer: Any, dataset: Any, *, max_new_tokens: int, batch_size: int, num_samples: int = 0
) -> dict:
    """
    Held-out evaluation at the training length cap: the greedy completion of every prompt (`num_samples=0`), or
    `num_samples` completions sampled at T=1 (avg@k, fixed seed). `correct` holds each problem's accuracy; the standard
    error is that of their mean. Lengths are in tokens (the completion re-encoded); a completion of `max_new_tokens`
    tokens or more ran into the cap without an end of turn.
    """
    from dapo_trl.run.evaluation import sample_completions

    started = time.perf_counter()
    k = max(1, num_samples)
    state = torch.get_rng_state()  # evaluating must not move a training run's random stream
    try:
        groups = sample_completions(
            model,
            tokenizer,
            dataset["prompt"],
            k=k,
            max_new_tokens=max_new_tokens,
            do_sample=num_samples > 0,
            batch_size=max(1, batch_size // k),
            seed=1234,
        )
    finally:
        torch.set_rng_state(state)
    completions = [c for group in groups for c in group]
    return eval_report(
        completions, dataset, tokenizer, k=k, num_samples=num_samples, max_new_tokens=max_new_tokens, started=started
    )


def eval_report(
    completions: Sequence[str],
    dataset: Any,
    tokenizer: Any,
    *,
    k: int,
    num_samples: int,
    max_new_tokens: int,
    started: float,
) -> dict:
    """Score `k` completions per held-out problem (problem-major) and summarise them as [`evaluate_model`] does."""
    answers = [a for a in dataset["answer"] for _ in range(k)]
    correct, formatted = score(completions, answers)
    groups = [completions[i * k : (i + 1) * k] for i in range(len(dataset))]
    per_problem = [sum(correct[i * k : (i + 1) * k]) / k for i in range(len(groups))]
    lengths = [len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in completions]
    accuracy, se = mean_se(per_problem)
    by_steps = {}
    for steps in sorted(set(dataset["steps"])):
        picked = [c for c, s in zip(per_problem, dataset["steps"], strict=True) if s == steps]
        by_steps[f"accuracy/{steps}_step"] = sum(picked) / len(picked)
    return {
        "n": len(groups),
        "samples": num_samples,
        "accuracy": accuracy,
        "accuracy_se": se,
        **by_steps,
        "format_rate": sum(formatted) / len(completions),
        "mean_length": sum(lengths) / len(lengths),
        "truncated_frac": sum(length >= max_new_tokens for length in lengths) / len(lengths),
        "correct": per_problem,
        "examples": completions[:4],
        "seconds": time.perf_counter() - started,
    }


def evaluate_with_vllm(trainer: Any, tokenizer: Any, dataset: Any, *, max_new_tokens: int) -> dict:
    """
    Greedy held-out evaluation through the trainer's colocated vLLM engine (`--vllm`): the engine first takes the
    trainer's current weights (the sync each rollout does), then decodes every prompt at temperature 0, encoded as
    training encodes it. The torch random state is kept, so an evaluation does not move the run's random stream.
    """
    from vllm import SamplingParams

    from dapo_trl.run.evaluation import encode_prompts

    started = time.perf_counter()
    state = torch.get_rng_state()
    try:
        generation = trainer.vllm_generation
        generation.sync_weights()
        texts, special = encode_prompts(tokenizer, dataset["prompt"])
        ids = tokenizer(texts, add_special_tokens=special)["input_ids"]
        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
        outputs = generation.llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
    finally:
        torch.set_rng_state(state)
    completions = [output.outputs[0].text for output in outputs]
    return eval_report(
        completions, dataset, tokenizer, k=1, num_samples=0, max_new_tokens=max_new_tokens, started=started
    )


def outcomes(correct: Sequence[float]) -> str:
    """Per-problem greedy outcomes as a string of `0`/`1` (compact in the results JSON; see [`read_outcomes`])."""
    return "".join("1" if c >= 0.5 else "0" for c in correct)


def read_outcomes(text: str) -> list[int]:
    return [int(c) for c in text]


# ---------------------------------------------------------------------------------------------------------------------
# Model, tokenizer, warm-up
# ---------------------------------------------------------------------------------------------------------------------

TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tiny(folder: Path) -> str:
    """A tiny random model with a character tokenizer and a chat template, for `--quick` without a real model."""
    from dapo_trl.run.toy import build_char_tokenizer, build_tiny_model

    if not (folder / "config.json").exists():
        tokenizer = build_char_tokenizer(model_max_length=512)
        tokenizer.chat_template = TINY_CHAT_TEMPLATE
        model = build_tiny_model(tokenizer, max_position_embeddings=512, seed=0)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return str(folder)


def load(folder: str, *, train_layers: int | None = None) -> tuple[Any, Any]:
    """Model and tokenizer of `folder`; with `train_layers`, only the top `train_layers` decoder layers and the final
    norm stay trainable (`dapo_trl.run.warmup.freeze_below`, as the CPU recipe trains)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_trl.run.warmup import freeze_below

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if train_layers is not None:
        freeze_below(model, train_layers)
    return model, tokenizer


def warmup_two_step(args: argparse.Namespace) -> float:
    """The warm-up's share of two-step problems (`--warmup-two-step`, default: `--two-step`, RL's share)."""
    share = getattr(args, "warmup_two_step", None)
    return args.two_step if share is None else share


def warmup_key(args: argparse.Namespace) -> str:
    """The warm-up's cache key: its settings, with a local model folder by its resolved path (so that the same folder
    named through a relative path or a symlink finds the same warm-up)."""
    model = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model
    fields = (
        model,
        args.seed,
        args.train_size,
        args.sft_steps,
        args.sft_batch_size,
        args.sft_lr,
        warmup_two_step(args),
        args.train_layers,
    )
    return hashlib.sha1(repr(fields).encode()).hexdigest()[:10]


def warm_up(args: argparse.Namespace) -> tuple[str, dict]:
    """The warmed-up model's folder (trained once per settings and cached) and its record."""
    from dapo_trl.run.evaluation import encode_prompts
    from dapo_trl.run.toy import warmup_sft

    folder = Path(args.cache_dir) / f"warmup-{warmup_key(args)}"
    record = folder / "warmup.json"
    if record.exists():
        return str(folder), json.loads(record.read_text())
    torch.manual_seed(args.seed)
    model, tokenizer = load(args.model, train_layers=args.train_layers)
    train_set = make_word_problems(args.train_size, seed=args.seed, split="train", two_step_frac=warmup_two_step(args))
    texts, _ = encode_prompts(tokenizer, train_set["prompt"])
    started = time.perf_counter()
    losses = warmup_sft(
        model,
        tokenizer,
        train_set.remove_columns("prompt").add_column("prompt", texts),  # the chat template rendered, as TRL does
        steps=args.sft_steps,
        batch_size=args.sft_batch_size,
        lr=args.sft_lr,
        seed=args.seed,
        warmup_steps=max(1, args.sft_steps // 10),
        stop_accuracy=None,
        progress=False,
    )
    seconds = time.perf_counter() - started
    logger.info(f"warm-up: {args.sft_steps} steps in {seconds:.0f} s, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    result = {"seconds": seconds, "losses": losses}
    record.write_text(json.dumps(result))
    return str(folder), result


def eval_key(args: argparse.Namespace) -> str:
    fields = (args.test_size, args.eval_samples, args.max_completion_length, args.two_step)
    return hashlib.sha1(repr(fields).encode()).hexdigest()[:8]


def warmed_up_eval(args: argparse.Namespace, warm_dir: str) -> dict:
    """The warmed-up model's held-out evaluation, computed once per evaluation settings."""
    path = Path(warm_dir) / f"eval-{eval_key(args)}.json"
    if path.exists():
        return json.loads(path.read_text())
    model, tokenizer = load(warm_dir)
    report = evaluate_model(
        model,
        tokenizer,
        held_out(args),
        max_new_tokens=args.max_completion_length,
        batch_size=args.eval_batch_size,
        num_samples=args.eval_samples,
    )
    logger.info(f"warmed-up model: held-out accuracy {report['accuracy']:.3f} in {report['seconds']:.0f} s")
    path.write_text(json.dumps(report))
    return report


def held_out(args: argparse.Namespace) -> Any:
    return make_word_problems(args.test_size, seed=args.seed, split="test", two_step_frac=args.two_step)


# ---------------------------------------------------------------------------------------------------------------------
# One RL arm
# ---------------------------------------------------------------------------------------------------------------------


def arm_config(args: argparse.Namespace, arm: str, output_dir: str) -> Any:
    """DAPOConfig's defaults (DAPO) or GRPOConfig's (naive GRPO), on the same batch, sampling and length cap."""
    from trl import GRPOConfig

    from dapo_trl import DAPOConfig

    shared = {
        "output_dir": output_dir,
        "use_cpu": True,
        "bf16": False,
        "gradient_checkpointing": False,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "logging_steps": 1,
        "seed": rl_seed(args),
        "max_steps": 100_000,  # the token budget stops training (see `BudgetCallback`)
        "learning_rate": args.lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "num_generations": args.num_generations,
        "per_device_train_batch_size": args.prompts_per_step * args.num_generations,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": args.updates_per_rollout,
        "num_iterations": 1,
        "max_completion_length": args.max_completion_length,
        "temperature": 1.0,
        "top_p": 1.0,
        "beta": 0.0,
        "log_completions": False,
        # --shared-order: the harness shuffles the training set by the RL seed and both arms read it in that order.
        "shuffle_dataset": not getattr(args, "shared_order", False),
    }
    if getattr(args, "vllm", False):
        # Colocated vLLM on CPU (vllm-cpu): rollouts through TRL's generation path, the weight sync of DAPOTrainer.
        shared.update(use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=False)
    if arm.startswith("dapo"):
        # `None` (0 on the command line) keeps DAPOConfig's default for the buffer and the rounds.
        dapo = {"overlong_buffer_len": args.overlong_buffer_len or None}
        if args.max_rounds:
            dapo["dynamic_sampling_max_rounds"] = args.max_rounds
        return DAPOConfig(
            **shared,
            **dapo,
            diagnostics=False,
            vllm_dtype=getattr(args, "vllm_dtype", "auto"),
            **(UNIT_ARMS[arm] or {}),
        )
    if getattr(args, "vllm", False):
        return naive_grpo_for_vllm(shared, args)
    return GRPOConfig(**shared)


def naive_grpo_for_vllm(shared: dict, args: argparse.Namespace) -> Any:
    """
    Naive GRPO through colocated vLLM on CPU: `DAPOTrainer` with GRPOConfig's loss and clipping (`loss_type`,
    `epsilon` and `epsilon_high` as GRPOConfig sets them), no dynamic sampling and no overlong shaping. TRL's own
    `GRPOTrainer` cannot sync weights into vLLM's CPU backend (docs/vllm.md). With these settings `DAPOTrainer` computes
    GRPOTrainer's advantages (tests/test_advantages.py compares them) and TRL's surrogate loss with the same clipping;
    under GRPOConfig's default `loss_type="dapo"` its token mean is taken over each optimizer step exactly rather than
    per generation batch (docs/differences.md, row 2). The rest that differs, such as the order in which
    prompts come, is listed in docs/differences.md. All arms then generate with the same engine and weight sync.
    """
    from trl import GRPOConfig

    from dapo_trl import DAPOConfig

    grpo = GRPOConfig(output_dir=shared["output_dir"], use_cpu=True, report_to="none")
    return DAPOConfig(
        **shared,
        loss_type=grpo.loss_type,
        epsilon=grpo.epsilon,
        epsilon_high=grpo.epsilon if grpo.epsilon_high is None else grpo.epsilon_high,  # None: symmetric
        mask_truncated_completions=grpo.mask_truncated_completions,
        dynamic_sampling=False,
        overlong_shaping=False,
        diagnostics=False,
        vllm_dtype=getattr(args, "vllm_dtype", "auto"),
    )


def rl_seed(args: argparse.Namespace) -> int:
    """The RL seed (`--rl-seed`); the data, the warm-up and the held-out set keep `--seed`."""
    return args.seed if getattr(args, "rl_seed", None) is None else args.rl_seed


# What the mechanisms did, per optimizer step (TRL's and DAPOTrainer's metric names).
LOGGED = (
    "reward",
    "entropy",
    "clip_ratio/high_mean",
    "clip_ratio/low_mean",
    "clip_ratio/region_mean",
    "completions/mean_length",
    "completions/clipped_ratio",
    "frac_reward_zero_std",
    "overlong/penalty_mean",
    "overlong/penalised_ratio",
    "overlong/truncated_ratio",
    "dynamic_sampling/informative_frac",
    "dynamic_sampling/rounds",
    "vllm/weight_syncs",
    "sampling/sampling_logp_difference/max",
)


def counting(trainer_cls: type, *, zone_start: int | None = None) -> type:
    class Counting(trainer_cls):
        """
        Counts every training completion and token generated (all dynamic-sampling rounds included), and the
        completions longer than `zone_start` tokens (in DAPO's overlong zone, whether or not the arm penalises it).
        """

        generated_completions = 0
        generated_tokens = 0
        in_overlong_zone = 0

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            if self.model.training:
                self.generated_completions += len(completion_ids_list)
                self.generated_tokens += sum(len(ids) for ids in completion_ids_list)
                if zone_start is not None:
                    self.in_overlong_zone += sum(len(ids) > zone_start for ids in completion_ids_list)
            return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    Counting.__name__ = f"Counting{trainer_cls.__name__}"
    return Counting


def run_arm(args: argparse.Namespace, arm: str, warm_dir: str, *, model_dir: str | None = None) -> dict:
    """Train `arm` from the warmed-up weights until the token budget is spent; evaluate on the grid; return the record."""
    import tempfile

    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOTrainer

    from dapo_trl import DAPOTrainer, MathVerifierReward

    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("dapo_trl").setLevel(logging.ERROR)
    torch.manual_seed(rl_seed(args))
    model, tokenizer = load(warm_dir, train_layers=args.train_layers)
    train_set = make_word_problems(args.train_size, seed=args.seed, split="train", two_step_frac=args.two_step)
    if getattr(args, "shared_order", False):
        train_set = train_set.shuffle(seed=rl_seed(args))  # the pair's prompt order (both arms: shuffle_dataset=False)
    test_set = held_out(args)
    budget = args.budget_tokens
    marks = sorted(f * budget for f in args.eval_fractions if f < 1)
    path = arm_path(args, arm)
    record: dict = {"arm": arm, "name": ARM_NAMES[arm], "budget_tokens": budget, "curve": [], "stopped_by": None}
    step_tokens: dict[int, int] = {}  # generated tokens when each optimizer step ended
    step_counts: dict[int, tuple[int, int]] = {}  # (completions, of them in the overlong zone) when each step ended
    started = time.perf_counter()
    vllm = getattr(args, "vllm", False)

    def history() -> list[dict]:
        return [
            {
                **{k: v for k, v in entry.items() if k in LOGGED or k == "step"},
                "tokens": step_tokens.get(entry.get("step")),
                "completions_so_far": step_counts.get(entry.get("step"), (None, None))[0],
                "overlong_zone_so_far": step_counts.get(entry.get("step"), (None, None))[1],
            }
            for entry in trainer.state.log_history
            if "loss" in entry or "reward" in entry
        ]

    def checkpoint(step: int) -> None:
        if vllm:  # greedy through the trainer's engine: seconds instead of minutes for a large held-out set
            report = evaluate_with_vllm(trainer, tokenizer, test_set, max_new_tokens=args.max_completion_length)
        else:
            report = evaluate_model(
                trainer.model,
                tokenizer,
                test_set,
                max_new_tokens=args.max_completion_length,
                batch_size=args.eval_batch_size,
                num_samples=args.eval_samples,
            )
        trainer.model.train()
        record["curve"].append(
            {
                "step": step,
                "tokens": trainer.generated_tokens,
                "completions": trainer.generated_completions,
                "train_seconds": time.perf_counter() - started,
                **report,
            }
        )
        record.update(
            steps=step,
            tokens=trainer.generated_tokens,
            completions=trainer.generated_completions,
            seconds=time.perf_counter() - started,
            history=history(),
        )
        path.write_text(json.dumps(record))
        logger.info(
            f"{ARM_NAMES[arm]}: step {step}, {trainer.generated_tokens} tokens, held-out accuracy "
            f"{report['accuracy']:.3f} ({report['seconds']:.0f} s to evaluate)"
        )

    class BudgetCallback(TrainerCallback):
        """
        Evaluate when the tokens pass each mark; stop at a rollout boundary (see [`stop_at_boundary`]) or past the
        time limit. With `--eval-at-start`, evaluate the starting model through the same path first.
        """

        last_boundary = 0

        def on_train_begin(self, train_args, state, control, **kwargs):
            if getattr(args, "eval_at_start", False) and state.global_step == 0:
                checkpoint(0)

        def on_step_end(self, train_args, state, control, **kwargs):
            boundary = state.global_step % train_args.steps_per_generation == 0
            step_tokens[state.global_step] = trainer.generated_tokens
            step_counts[state.global_step] = (trainer.generated_completions, trainer.in_overlong_zone)
            logger.info(
                f"{ARM_NAMES[arm]}: step {state.global_step} done, {trainer.generated_tokens} tokens, "
                f"{time.perf_counter() - started:.0f} s"
            )
            if not boundary:
                return
            rollout = trainer.generated_tokens - self.last_boundary
            self.last_boundary = trainer.generated_tokens
            over_time = args.max_minutes is not None and time.perf_counter() - started > 60 * args.max_minutes
            rule = getattr(args, "stop_rule", "past")
            if stop_at_boundary(trainer.generated_tokens, budget, rollout, rule=rule) or over_time:
                record["stopped_by"] = "time" if over_time and trainer.generated_tokens < budget else "budget"
                control.should_training_stop = True
                checkpoint(state.global_step)
            elif marks and trainer.generated_tokens >= marks[0]:
                while marks and trainer.generated_tokens >= marks[0]:
                    marks.pop(0)
                checkpoint(state.global_step)

    # DAPO's overlong zone (Eq. 13): longer than L_max - L_cache, with DAPOConfig's default L_cache when none is set.
    zone = args.max_completion_length - (args.overlong_buffer_len or args.max_completion_length // 5)
    trainer_cls = counting(DAPOTrainer if arm.startswith("dapo") or vllm else GRPOTrainer, zone_start=zone)
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = trainer_cls(
            model=model,
            reward_funcs=MathVerifierReward(answer_column="answer", num_workers=1),
            args=arm_config(args, arm, output_dir),
            train_dataset=train_set,
            processing_class=tokenizer,
            callbacks=[BudgetCallback()],
        )
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    record["history"] = history()  # the last step is logged after the callback that evaluated it
    path.write_text(json.dumps(record))
    if model_dir is not None:  # a plain transformers folder, to be scored again
        trainer.model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
    return record


def stop_at_boundary(tokens: int, budget: int, last_rollout: int, *, rule: str = "past") -> bool:
    """
    Whether a unit stops at this rollout boundary, with `tokens` generated so far and `last_rollout` of them in the
    rollout just trained. `"past"`: once the budget is reached (a unit ends up to one rollout past it). `"nearest"`:
    also when the budget is nearer now than after one more rollout of the same size, so a unit ends within half a
    rollout of the budget on either side.

    Example:
    ```python
    >>> stop_at_boundary(9_500, 10_000, 1_200, rule="past"), stop_at_boundary(9_500, 10_000, 1_200, rule="nearest")
    (False, True)
    >>> stop_at_boundary(8_700, 10_000, 1_200, rule="nearest")
    False

    ```
    """
    if rule not in ("past", "nearest"):
        raise ValueError(f"stop rule must be 'past' or 'nearest', got {rule!r}.")
    remaining = budget - tokens
    return remaining <= 0 or (rule == "nearest" and remaining < last_rollout / 2)


def arm_path(args: argparse.Namespace, arm: str) -> Path:
    seed = "" if getattr(args, "rl_seed", None) is None else f"-rl{args.rl_seed}"
    key = eval_key(args)
    if getattr(
        args, "shared_order", False
    ):  # the paired experiment: every setting that shapes a unit names its record
        key = hashlib.sha1(json.dumps(unit_settings(args), sort_keys=True).encode()).hexdigest()[:10]
    return Path(args.cache_dir) / f"arm-{arm}{seed}-{warmup_key(args)}-{key}.json"


# The settings that shape a unit's result: every unit in one results JSON must share them (see `check_unit_settings`).
UNIT_SETTINGS = (
    "seed",
    "train_size",
    "test_size",
    "two_step",
    "warmup_two_step",
    "sft_steps",
    "sft_batch_size",
    "sft_lr",
    "train_layers",
    "lr",
    "num_generations",
    "prompts_per_step",
    "updates_per_rollout",
    "max_completion_length",
    "overlong_buffer_len",
    "max_rounds",
    "budget_tokens",
    "eval_fractions",
    "eval_samples",
    "vllm",
    "vllm_dtype",
    "shared_order",
    "stop_rule",
    "eval_at_start",
    "code",
)


def code_version() -> str | None:
    """The commit of the checkout this script runs from (`+dirty` when tracked files differ), `None` outside git."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "src", "benchmarks/real_model.py"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if dirty else "")


def unit_settings(args: argparse.Namespace) -> dict:
    """The settings a unit ran with (the model by folder name, so that the JSON reads the same on another machine)."""
    return {"model": Path(args.model).name, **{key: getattr(args, key, None) for key in UNIT_SETTINGS}}


def units_path(args: argparse.Namespace) -> Path:
    """The results JSON that `--phase unit` appends to and `--phase report` reads."""
    return Path(args.results_dir) / ("real_model_quick.json" if args.quick else "real_model.json")


def check_unit_settings(args: argparse.Namespace) -> None:
    """Refuse to append a unit to a results JSON whose units ran with other settings (their seeds would be paired)."""
    path = units_path(args)
    recorded = json.loads(path.read_text()).get("settings") if path.exists() else None
    if recorded is None:
        return
    ours = json.loads(json.dumps(unit_settings(args)))  # as the JSON holds them (tuples as lists)
    differ = {key: (recorded.get(key), ours.get(key)) for key in ours.keys() | recorded.keys()}
    differ = {key: pair for key, pair in differ.items() if pair[0] != pair[1]}
    if differ:
        listed = ", ".join(f"{key}: {a!r} there, {b!r} here" for key, (a, b) in sorted(differ.items()))
        raise SystemExit(
            f"{path} holds units run with other settings ({listed}). Pass the same settings to add seeds to it, or "
            "--results-dir DIR to start another experiment."
        )


def run_units(args: argparse.Namespace, warm_dir: str, warmup: dict) -> dict:
    """
    `--phase unit`: train each of `--arms` once at `--rl-seed` (from the shared warm-up, same data and held-out set),
    and append `{"seed", "generated_tokens", "heldout_accuracy", "heldout_n", "model_dir"}` to the arm's `seeds` in
    the results JSON, with the paired comparisons over seeds recomputed. An (arm, seed) already there is skipped, so
    a unit interrupted or not yet run is simply run again by the same command. Seed 0's final model is kept at
    `--model-root/ARM-seed0` (a plain transformers folder).
    """
    path = units_path(args)
    seed = rl_seed(args)

    def read() -> dict:
        return json.loads(path.read_text()) if path.exists() else {}

    for arm in args.arms:
        if any(s["seed"] == seed for s in read().get("arms", {}).get(arm, {}).get("seeds", [])):
            logger.info(f"{ARM_NAMES[arm]}, seed {seed}: already in {path}, skipped")
            continue
        keep = seed == 0 and not getattr(args, "shared_order", False)  # the paired experiment keeps outcomes instead
        model_dir = str(Path(args.model_root) / f"{arm}-seed{seed}") if keep else None
        record = run_arm(args, arm, warm_dir, model_dir=model_dir)
        final = record["curve"][-1]
        data = read()  # again: another unit may have written meanwhile
        entry = {
            "seed": seed,
            "generated_tokens": record["tokens"],
            "heldout_accuracy": final["accuracy"],
            "heldout_n": final["n"],
            "model_dir": model_dir,
            "optimizer_steps": record["steps"],
            "stopped_by": record["stopped_by"],
            "seconds": record["seconds"],
            "rollouts": "vllm" if getattr(args, "vllm", False) else "generate",
        }
        if getattr(args, "shared_order", False):
            entry.update(
                heldout_correct=outcomes(final["correct"]),
                curve=[
                    {
                        "step": c["step"],
                        "tokens": c["tokens"],
                        "accuracy": c["accuracy"],
                        "mean_length": c["mean_length"],
                        "format_rate": c["format_rate"],
                        "correct": outcomes(c["correct"]),
                    }
                    for c in record["curve"]
                ],
                history=record["history"],
            )
        data.setdefault("arms", {}).setdefault(arm, {"seeds": []})["seeds"].append(entry)
        start = record["curve"][0] if getattr(args, "eval_at_start", False) else warmup["eval"]
        data.setdefault("warmup", {}).update(heldout_accuracy=start["accuracy"], model_dir=warm_dir)
        if getattr(args, "eval_at_start", False):
            data["warmup"]["heldout_correct"] = outcomes(start["correct"])
        data["settings"] = unit_settings(args)
        data["comparisons"] = compare_seeds(data["arms"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))
        logger.info(f"{ARM_NAMES[arm]}, seed {seed}: held-out accuracy {final['accuracy']:.3f}, written to {path}")
    return read()


def compare_seeds(arms: dict[str, dict]) -> list[dict]:
    """Every pair of arms on their common seeds: the mean difference in held-out accuracy and its paired standard
    error over seeds (None with fewer than 2 common seeds)."""
    out = []
    names = [arm for arm in UNIT_ARMS if arm in arms]
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            acc_a = {s["seed"]: s["heldout_accuracy"] for s in arms[a]["seeds"]}
            acc_b = {s["seed"]: s["heldout_accuracy"] for s in arms[b]["seeds"]}
            common = sorted(set(acc_a) & set(acc_b))
            if not common:
                continue
            diff, se = mean_se([acc_a[s] - acc_b[s] for s in common])
            out.append(
                {"a": a, "b": b, "mean_diff": diff, "paired_se": se if len(common) > 1 else None, "seeds": common}
            )
    return out


def _run_arm_job(job: tuple) -> dict:
    args, arm, warm_dir = job
    return run_arm(args, arm, warm_dir)


# ---------------------------------------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------------------------------------


def mean_of(history: Sequence[dict], key: str) -> float | None:
    values = [h[key] for h in history if key in h and h[key] is not None and not math.isnan(h[key])]
    return sum(values) / len(values) if values else None


def thirds(history: Sequence[dict], key: str) -> list[float | None]:
    """Mean of `key` over the first, middle and last third of the optimizer steps."""
    n = len(history)
    cuts = [0, n // 3, 2 * n // 3, n]
    return [mean_of(history[cuts[i] : cuts[i + 1]], key) for i in range(3)]


def summarize(warmup: dict, arms: dict[str, dict]) -> dict:
    """Per arm: the final and best checkpoints, the change against the warmed-up model, and the mechanisms' metrics."""
    base = warmup["eval"]
    out: dict = {}
    for arm, record in arms.items():
        curve = record.get("curve") or []
        if not curve:
            continue
        final = curve[-1]
        best = max(curve, key=lambda c: (c["accuracy"], -c["tokens"]))
        diff, diff_se = paired_difference(final["correct"], base["correct"])
        history = record.get("history", [])
        informative = (
            mean_of(history, "dynamic_sampling/informative_frac")
            if arm == "dapo"
            else (1 - z if (z := mean_of(history, "frac_reward_zero_std")) is not None else None)
        )
        out[arm] = {
            "name": record["name"],
            "steps": record["steps"],
            "tokens": record["tokens"],
            "completions": record["completions"],
            "seconds": record["seconds"],
            "stopped_by": record["stopped_by"],
            "final": {k: v for k, v in final.items() if k not in ("correct", "examples")},
            "best_accuracy": best["accuracy"],
            "best_tokens": best["tokens"],
            "gain": diff,
            "gain_se": diff_se,
            "clip_high": mean_of(history, "clip_ratio/high_mean"),
            "clip_low": mean_of(history, "clip_ratio/low_mean"),
            "overlong_penalty_thirds": thirds(history, "overlong/penalty_mean"),
            "truncated_thirds": thirds(history, "completions/clipped_ratio"),
            "informative": informative,
            "rounds": mean_of(history, "dynamic_sampling/rounds"),
            "entropy_thirds": thirds(history, "entropy"),
        }
    return out


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def format_table(args: argparse.Namespace, warmup: dict, summary: dict) -> str:
    base = warmup["eval"]
    sampling = f"avg@{base['samples']} sampled at T=1" if base["samples"] else "greedy"
    lines = [
        f"# DAPO vs naive GRPO on {Path(args.model).name} (CPU)",
        "",
        f"Held-out: {base['n']} word problems, {sampling}, cap {args.max_completion_length} tokens, strict `Answer:` "
        f"extraction. Budget: {args.budget_tokens:,} generated tokens per arm. Warm-up: {args.sft_steps} steps x "
        f"{args.sft_batch_size} examples ({warmup['seconds'] / 60:.1f} min).",
        "",
        "| model | gen. tokens | steps | accuracy (SE) | change vs warm-up (paired SE) | 1-step | 2-step | format | "
        "mean length | truncated | best accuracy @ tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        f"| warmed-up | 0 | 0 | {base['accuracy']:.3f} ({base['accuracy_se']:.3f}) | - | "
        f"{_fmt(base.get('accuracy/1_step'))} | {_fmt(base.get('accuracy/2_step'))} | {base['format_rate']:.3f} | "
        f"{base['mean_length']:.1f} | {base['truncated_frac']:.3f} | - |",
    ]
    for arm in ARMS:
        if arm not in summary:
            continue
        s, f = summary[arm], summary[arm]["final"]
        stop = "" if s["stopped_by"] == "budget" else f" (stopped: {s['stopped_by'] or 'unfinished'})"
        lines.append(
            f"| {s['name']}{stop} | {s['tokens']:,} | {s['steps']} | {f['accuracy']:.3f} ({f['accuracy_se']:.3f}) | "
            f"{s['gain']:+.3f} ({s['gain_se']:.3f}) | {_fmt(f.get('accuracy/1_step'))} | "
            f"{_fmt(f.get('accuracy/2_step'))} | {f['format_rate']:.3f} | {f['mean_length']:.1f} | "
            f"{f['truncated_frac']:.3f} | {s['best_accuracy']:.3f} @ {s['best_tokens']:,} |"
        )
    lines += [
        "",
        "What the mechanisms did (means over the optimizer steps; thirds = first / middle / last third of the steps):",
        "",
        "| arm | clipped high | clipped low | informative groups | rounds per step | overlong penalty (thirds) | "
        "truncated in training (thirds) | entropy (thirds) | wall time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in ARMS:
        if arm not in summary:
            continue
        s = summary[arm]
        lines.append(
            f"| {s['name']} | {_fmt(s['clip_high'], '.4%')} | {_fmt(s['clip_low'], '.4%')} | "
            f"{_fmt(s['informative'])} | {_fmt(s['rounds'], '.2f')} | "
            f"{' / '.join(_fmt(v) for v in s['overlong_penalty_thirds'])} | "
            f"{' / '.join(_fmt(v) for v in s['truncated_thirds'])} | "
            f"{' / '.join(_fmt(v) for v in s['entropy_thirds'])} | {s['seconds'] / 60:.1f} min |"
        )
    return "\n".join(lines) + "\n"


def plot(warmup: dict, arms: dict[str, dict], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    base = warmup["eval"]
    for arm, record in arms.items():
        curve = record.get("curve") or []
        xs = [0] + [c["tokens"] for c in curve]
        ys = [base["accuracy"]] + [c["accuracy"] for c in curve]
        errors = [base["accuracy_se"]] + [c["accuracy_se"] for c in curve]
        ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=ARM_NAMES[arm])
    ax.set_xlabel("generated tokens")
    ax.set_ylabel("held-out accuracy (+- 1 SE)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def report(args: argparse.Namespace, warmup: dict, arms: dict[str, dict]) -> dict:
    summary = summarize(warmup, arms)
    stem = "real_model_quick" if args.quick else "real_model_2arm"  # the per-seed units write real_model.json
    out_dir = Path(args.results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = format_table(args, warmup, summary)
    (out_dir / f"{stem}.md").write_text(table)
    settings = {k: v for k, v in vars(args).items() if k not in ("cache_dir", "results_dir", "phase", "sequential")}
    warm_eval = {k: v for k, v in warmup["eval"].items() if k != "correct"}
    curves = {
        arm: [{k: v for k, v in c.items() if k != "correct"} for c in record.get("curve", [])]
        for arm, record in arms.items()
    }
    payload = {
        "settings": settings,
        "warmup": {"seconds": warmup["seconds"], "eval": warm_eval},
        "summary": summary,
        "curves": curves,
    }
    previous = out_dir / f"{stem}.json"
    if previous.exists():  # the `--phase unit` results live in the same file
        old = json.loads(previous.read_text())
        payload.update({k: old[k] for k in ("arms", "comparisons") if k in old})
        payload["warmup"].update(
            {k: v for k, v in old.get("warmup", {}).items() if k in ("heldout_accuracy", "model_dir")}
        )
    (out_dir / f"{stem}.json").write_text(json.dumps(payload, indent=1))
    if not args.quick:
        plot(warmup, arms, out_dir / f"{stem}.png")
    print(table)
    return payload


# ---------------------------------------------------------------------------------------------------------------------
# Report over seeds (`--phase unit` results)
# ---------------------------------------------------------------------------------------------------------------------

# Per optimizer step: what each figure draws (TRL's and DAPOTrainer's metric names).
STEP_FIGURES = {
    "entropy": [("entropy", "policy entropy (training tokens)")],
    "length": [
        ("completions/mean_length", "mean completion length (tokens)"),
        ("completions/clipped_ratio", "truncated share (hit the cap)"),
    ],
    "informative": [("informative", "informative-group share of the groups generated")],
}


def unit_records(args: argparse.Namespace, arms: dict[str, dict]) -> dict[str, list[dict]]:
    """Each arm's per-seed training records (curve and per-step history) kept in `--cache-dir` by its units."""
    out: dict[str, list[dict]] = {}
    for arm in (a for a in UNIT_ARMS if a in arms):
        for entry in sorted(arms[arm]["seeds"], key=lambda s: s["seed"]):
            path = arm_path(argparse.Namespace(**{**vars(args), "rl_seed": entry["seed"]}), arm)
            if path.exists():
                out.setdefault(arm, []).append({"seed": entry["seed"], **json.loads(path.read_text())})
    return out


def step_series(record: dict, key: str) -> dict[int, float]:
    """`key` per optimizer step of one seed; `informative` is dynamic sampling's informative share of the groups
    generated, or, without dynamic sampling, 1 - the share of groups whose rewards are all equal."""
    out = {}
    for entry in record.get("history", []):
        if key == "informative":
            if "dynamic_sampling/informative_frac" in entry:
                value = entry["dynamic_sampling/informative_frac"]
            else:
                zero = entry.get("frac_reward_zero_std")
                value = None if zero is None else 1 - zero
        else:
            value = entry.get(key)
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            out[entry["step"]] = value
    return out


def over_seeds(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and standard error over seeds (None with one seed)."""
    mean, se = mean_se(values)
    return mean, se if len(values) > 1 else None


def summarize_units(data: dict, records: dict[str, list[dict]], warm_correct: Sequence[float] | None = None) -> dict:
    """Per arm: held-out accuracy, tokens, steps and time as mean and SE over seeds, the change against the warmed-up
    model (with `warm_correct`, the warmed-up model's per-problem results, also its paired SE over the held-out
    problems, each problem's result averaged over seeds), the paired difference from naive GRPO over common seeds,
    and the mechanisms' per-step means."""
    warm = data["warmup"]["heldout_accuracy"]
    grpo = {s["seed"]: s["heldout_accuracy"] for s in data["arms"].get("grpo", {}).get("seeds", [])}
    grpo_records = records.get("grpo", [])
    grpo_mids = {r["seed"]: r["curve"][0] for r in grpo_records if len(r.get("curve", [])) > 1}
    grpo_finals = {r["seed"]: r["curve"][-1]["correct"] for r in grpo_records if r.get("curve")}
    out = {}
    for arm in (a for a in UNIT_ARMS if a in data["arms"]):
        seeds = sorted(data["arms"][arm]["seeds"], key=lambda s: s["seed"])
        accuracy = [s["heldout_accuracy"] for s in seeds]
        row: dict[str, Any] = {
            "seeds": [s["seed"] for s in seeds],
            "accuracy_by_seed": accuracy,
            "accuracy": over_seeds(accuracy),
            "change_vs_warmup": over_seeds([a - warm for a in accuracy]),
            "generated_tokens": over_seeds([s["generated_tokens"] for s in seeds])[0],
            "optimizer_steps": over_seeds([s.get("optimizer_steps", 0) for s in seeds])[0],
            "minutes": over_seeds([s.get("seconds", 0) / 60 for s in seeds])[0],
        }
        common = [s["seed"] for s in seeds if s["seed"] in grpo]
        if arm != "grpo" and common:
            by_seed = dict(zip(row["seeds"], accuracy, strict=True))
            row["vs_grpo"] = over_seeds([by_seed[s] - grpo[s] for s in common])
        for key in ("entropy", "completions/mean_length", "completions/clipped_ratio", "informative"):
            row[key] = mean_of([{"v": v} for r in records.get(arm, []) for v in step_series(r, key).values()], "v")
        for key in ("clip_ratio/high_mean", "clip_ratio/low_mean"):
            row[key] = mean_of([h for r in records.get(arm, []) for h in r.get("history", [])], key)
        mids = {r["seed"]: r["curve"][0] for r in records.get(arm, []) if len(r.get("curve", [])) > 1}
        if mids:  # the first evaluation (at --eval-fractions[0] of the budget): before any arm overshoots it
            row["mid_tokens"] = over_seeds([m["tokens"] for m in mids.values()])[0]
            row["mid_accuracy"] = over_seeds([m["accuracy"] for m in mids.values()])
            common = sorted(set(mids) & set(grpo_mids))
            if arm != "grpo" and common:
                row["mid_vs_grpo"] = over_seeds([mids[s]["accuracy"] - grpo_mids[s]["accuracy"] for s in common])
        finals = [r["curve"][-1] for r in records.get(arm, []) if r.get("curve")]
        row["heldout_mean_length"] = mean_of(finals, "mean_length")
        own = {r["seed"]: r["curve"][-1]["correct"] for r in records.get(arm, []) if r.get("curve")}
        common = sorted(set(own) & set(grpo_finals))
        if arm != "grpo" and common:  # each problem's result averaged over the common seeds, then paired by problem
            row["vs_grpo_problems"] = paired_difference(
                [sum(c) / len(common) for c in zip(*(own[s] for s in common), strict=True)],
                [sum(c) / len(common) for c in zip(*(grpo_finals[s] for s in common), strict=True)],
            )
        if warm_correct is not None and finals:
            per_problem = [sum(column) / len(finals) for column in zip(*(f["correct"] for f in finals), strict=True)]
            row["change_vs_warmup_problems"] = paired_difference(per_problem, warm_correct)
        out[arm] = row
    return out


def _pm(pair: tuple[float, float | None] | None, spec: str = ".3f", signed: bool = False) -> str:
    if pair is None:
        return "-"
    mean, se = pair
    text = format(mean, ("+" if signed else "") + spec)
    return text if se is None else f"{text} ({format(se, spec)})"


def format_units_table(args: argparse.Namespace, data: dict, summary: dict) -> str:
    warm = data["warmup"]["heldout_accuracy"]
    n = next(iter(data["arms"].values()))["seeds"][0]["heldout_n"]
    lines = [
        f"# DAPO's mechanisms against naive GRPO on {Path(args.model).name} (CPU), over RL seeds",
        "",
        f"Held-out: {n} problems ({args.two_step:.0%} two-step), greedy, cap {args.max_completion_length} tokens. "
        f"Budget: {args.budget_tokens:,} generated tokens per unit (every token generated for training). Warmed-up "
        f"model: {warm:.3f}. Mean (SE over seeds); vs GRPO is the paired difference over common seeds. Rollouts: "
        + (
            f"colocated vLLM (vllm-cpu, engine dtype {engine_dtype(args)})." if args.vllm else "transformers generate."
        ),
        "",
        "| arm | seeds | held-out accuracy | per seed | change vs warm-up | paired SE over problems | vs naive GRPO | "
        "vs GRPO: paired SE over problems | gen. tokens | opt. steps | minutes per unit |",
        "|---|---|---|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for arm, row in summary.items():
        lines.append(
            f"| {ARM_NAMES[arm]} | {len(row['seeds'])} | {_pm(row['accuracy'])} | "
            f"{' / '.join(f'{a:.3f}' for a in row['accuracy_by_seed'])} | {_pm(row['change_vs_warmup'], signed=True)} | "
            f"{_fmt((row.get('change_vs_warmup_problems') or (None, None))[1])} | "
            f"{_pm(row.get('vs_grpo'), signed=True)} | {_fmt((row.get('vs_grpo_problems') or (None, None))[1])} | "
            f"{row['generated_tokens']:,.0f} | {row['optimizer_steps']:.1f} | "
            f"{row['minutes']:.1f} |"
        )
    if any("mid_accuracy" in row for row in summary.values()):
        lines += [
            "",
            f"At the first evaluation ({args.eval_fractions[0]:.0%} of the budget; each arm stops at the first rollout "
            "boundary past it, so the tokens there are closer than at the end):",
            "",
            "| arm | gen. tokens | held-out accuracy | vs naive GRPO |",
            "|---|---:|---|---|",
        ]
        for arm, row in summary.items():
            if "mid_accuracy" in row:
                lines.append(
                    f"| {ARM_NAMES[arm]} | {row['mid_tokens']:,.0f} | {_pm(row['mid_accuracy'])} | "
                    f"{_pm(row.get('mid_vs_grpo'), signed=True)} |"
                )
    lines += [
        "",
        "Per optimizer step, means over steps and seeds:",
        "",
        "| arm | entropy | clipped high | clipped low | informative groups | mean length | truncated | "
        "held-out mean length |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, row in summary.items():
        lines.append(
            f"| {ARM_NAMES[arm]} | {_fmt(row['entropy'])} | {_fmt(row['clip_ratio/high_mean'], '.2%')} | "
            f"{_fmt(row['clip_ratio/low_mean'], '.2%')} | {_fmt(row['informative'])} | "
            f"{_fmt(row['completions/mean_length'], '.1f')} | {_fmt(row['completions/clipped_ratio'], '.1%')} | "
            f"{_fmt(row['heldout_mean_length'], '.1f')} |"
        )
    return "\n".join(lines) + "\n"


def engine_dtype(args: argparse.Namespace) -> str:
    """The vLLM engine's dtype: `--vllm-dtype`, where `auto` is the trainer's (float32: the harness trains in it)."""
    return "float32" if args.vllm_dtype == "auto" else args.vllm_dtype


def plot_units(data: dict, records: dict[str, list[dict]], out_dir: Path) -> list[Path]:
    """The paper's figures at this scale, one PNG each: held-out accuracy against generated tokens, entropy, mean
    length and truncated share, informative-group share (mean and SE over seeds)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    warm = data["warmup"]["heldout_accuracy"]
    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm, seeds in records.items():
        points = min(len(r.get("curve", [])) for r in seeds)
        xs, ys, errors = [0.0], [warm], [0.0]
        for k in range(points):
            xs.append(over_seeds([r["curve"][k]["tokens"] for r in seeds])[0])
            mean, se = over_seeds([r["curve"][k]["accuracy"] for r in seeds])
            ys.append(mean)
            errors.append(se or 0.0)
        ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=f"{ARM_NAMES[arm]} ({len(seeds)} seeds)")
    ax.axhline(warm, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("generated tokens")
    ax.set_ylabel("held-out accuracy (mean +- SE over seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out_dir / "real_model_accuracy.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    for name, panels in STEP_FIGURES.items():
        fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
        for ax, (key, label) in zip(axes[0], panels, strict=True):
            for arm, seeds in records.items():
                series = [step_series(r, key) for r in seeds]
                steps = sorted(set().union(*series))
                xs, ys, errors = [], [], []
                for step in steps:
                    values = [s[step] for s in series if step in s]
                    mean, se = over_seeds(values)
                    xs.append(step)
                    ys.append(mean)
                    errors.append(se or 0.0)
                line = ax.plot(xs, ys, marker=".", label=ARM_NAMES[arm])[0]
                ax.fill_between(
                    xs,
                    [y - e for y, e in zip(ys, errors)],
                    [y + e for y, e in zip(ys, errors)],
                    alpha=0.2,
                    color=line.get_color(),
                )
            ax.set_xlabel("optimizer step")
            ax.set_ylabel(label)
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        paths.append(out_dir / f"real_model_{name}.png")
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths


def report_units(args: argparse.Namespace) -> dict:
    """`--phase report` after `--phase unit`: the table over seeds (`real_model_units.md`, its rows also under
    `summary_over_seeds` in the JSON) and the figures, from the results JSON and the records in `--cache-dir`."""
    out_dir = Path(args.results_dir)
    path = units_path(args)
    data = json.loads(path.read_text())
    records = unit_records(args, data["arms"])
    warm_eval = Path(data["warmup"]["model_dir"]) / f"eval-{eval_key(args)}.json"
    warm_correct = json.loads(warm_eval.read_text())["correct"] if warm_eval.exists() else None
    summary = summarize_units(data, records, warm_correct)
    table = format_units_table(args, data, summary)
    stem = "real_model_quick" if args.quick else "real_model"
    (out_dir / f"{stem}_units.md").write_text(table)
    data["summary_over_seeds"] = summary
    path.write_text(json.dumps(data, indent=1))
    if not args.quick:
        plot_units(data, records, out_dir)
    print(table)
    return data


def paired_analysis() -> Any:
    """`benchmarks/real_model_paired.py`, the pre-registered analysis, beside this script."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import real_model_paired

    return real_model_paired


def report_paired(args: argparse.Namespace) -> dict:
    """
    `--phase report` on `--shared-order` units: the pre-registered analysis (`real_model_paired.format_report`) in
    `real_model.md` and `real_model_pairs.png`, and for a pilot (one pair evaluated along the way) the budget and
    pair-count decisions in `pilot.md`. The numbers go under `analysis` in the JSON.
    """
    paired = paired_analysis()
    out_dir = Path(args.results_dir)
    path = units_path(args)
    data = json.loads(path.read_text())
    text, numbers = paired.format_report(data)
    stem = "real_model_quick" if args.quick else "real_model"
    (out_dir / f"{stem}.md").write_text(text)
    units = [unit for arm in paired.PRIMARY for unit in paired.seeds_of(data, arm).values()]
    if len(units) == 2 and all(len(unit.get("curve", [])) > 3 for unit in units):
        pilot_text, numbers["pilot"] = paired.pilot_report(data)
        (out_dir / "pilot.md").write_text(pilot_text)
        text += "\n" + pilot_text
    if not args.quick:
        paired.plot_pairs(data, out_dir / f"{stem}_pairs.png")
    data["analysis"] = json.loads(json.dumps(numbers, default=list))
    path.write_text(json.dumps(data, indent=1))
    print(text)
    return data


# Command-line flags that take no value (`store_true`) among the recorded unit settings.
_SWITCHES = ("vllm", "shared_order", "eval_at_start")


def unit_command(settings: dict, *, model: str, arm: str, seed: int, cache_dir: str, results_dir: str) -> list[str]:
    """The `--phase unit` arguments that run `arm` at `seed` with the recorded `settings` (the inverse of
    [`unit_settings`]; the model folder is given, since the JSON names it only by its folder name)."""
    argv = ["--model", model, "--phase", "unit", "--arms", arm, "--rl-seed", str(seed)]
    argv += ["--cache-dir", cache_dir, "--results-dir", results_dir]
    for key in UNIT_SETTINGS:
        value = settings.get(key)
        if key in ("code", "rl_seed") or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if key in _SWITCHES:
            argv += [flag] if value else []
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


def rebuild_unit(args: argparse.Namespace) -> int:
    """
    `--phase rebuild --arms ARM --rl-seed S`: run one recorded unit again from the settings recorded in the results
    JSON (into a scratch results folder) and compare its generated tokens, optimizer steps and per-problem held-out
    outcomes with the recorded ones. Returns 0 when they all match. When the unit ran from another commit than this
    checkout's, the unit runs in a temporary git worktree of that commit (its code, its library), so the rebuild is
    the recorded unit whatever has changed since; a unit recorded from uncommitted code is rebuilt here, with a warning.
    """
    import subprocess
    import tempfile

    recorded = json.loads(units_path(args).read_text())
    settings = recorded["settings"]
    if len(args.arms) != 1 or args.rl_seed is None:
        raise SystemExit("--phase rebuild takes one arm (--arms ARM) and its seed (--rl-seed S).")
    arm, seed = args.arms[0], args.rl_seed
    target = next((s for s in recorded["arms"].get(arm, {}).get("seeds", []) if s["seed"] == seed), None)
    if target is None:
        raise SystemExit(f"{units_path(args)} holds no unit {arm} seed {seed}.")
    recorded_code, here = settings.get("code"), code_version()
    root = Path(__file__).resolve().parents[1]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        if recorded_code and not recorded_code.endswith("+dirty") and recorded_code != here:
            tree = Path(scratch) / "tree"
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), recorded_code], cwd=root, check=True)
            try:
                argv = unit_command(
                    settings,
                    model=str(Path(args.model).resolve()),
                    arm=arm,
                    seed=seed,
                    cache_dir=str(Path(args.cache_dir).resolve()),
                    results_dir=scratch,
                )
                argv = ["--quick", *argv] if args.quick else argv
                env = {**os.environ, "PYTHONPATH": str(tree / "src")}
                subprocess.run(
                    [sys.executable, str(tree / "benchmarks" / "real_model.py"), *argv], env=env, check=True
                )
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=root, check=False)
            stem = "real_model_quick.json" if args.quick else "real_model.json"
            rebuilt_data = json.loads((Path(scratch) / stem).read_text())
        else:
            if recorded_code and recorded_code != here:
                logger.warning(f"The unit ran from uncommitted code ({recorded_code}); rebuilding with this checkout.")
            for key in UNIT_SETTINGS:
                if key != "code" and key in settings:
                    setattr(args, key, settings[key])
            warm_dir, warmup = warm_up(args)
            warmup["eval"] = None if args.eval_at_start else warmed_up_eval(args, warm_dir)
            args.results_dir, args.code = scratch, recorded_code
            rebuilt_data = run_units(args, warm_dir, warmup)
        rebuilt = next(s for s in rebuilt_data["arms"][arm]["seeds"] if s["seed"] == seed)
    checks = {
        "generated tokens": (target["generated_tokens"], rebuilt["generated_tokens"]),
        "optimizer steps": (target["optimizer_steps"], rebuilt["optimizer_steps"]),
        "held-out accuracy": (target["heldout_accuracy"], rebuilt["heldout_accuracy"]),
    }
    same = all(a == b for a, b in checks.values())
    if "heldout_correct" in target:
        differ = sum(a != b for a, b in zip(target["heldout_correct"], rebuilt["heldout_correct"], strict=True))
        checks["problems scored differently"] = (0, differ)
        same = same and differ == 0
    for name, (want, got) in checks.items():
        print(f"{name}: recorded {want}, rebuilt {got}")
    minutes = (time.perf_counter() - started) / 60
    print(f"rebuilt {arm} seed {seed} in {minutes:.1f} min: {'identical' if same else 'DIFFERENT'}")
    return 0 if same else 1


# ---------------------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------------------

QUICK = {
    "train_size": 64,
    "test_size": 8,
    "sft_steps": 2,
    "sft_batch_size": 4,
    "num_generations": 4,
    "prompts_per_step": 1,
    "budget_tokens": 1,
    "eval_fractions": [1.0],
    "max_completion_length": 16,
    "overlong_buffer_len": 4,
    "eval_batch_size": 8,
    "train_layers": 1,
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.environ.get(MODEL_ENV), help=f"converted model folder (or ${MODEL_ENV})")
    p.add_argument("--quick", action="store_true", help="CI smoke: tiny sizes (a tiny random model without --model)")
    p.add_argument(
        "--phase",
        choices=("all", "warmup", "report", "unit", "rebuild"),
        default="all",
        help="warmup: warm up and evaluate only; report: report the arms saved in the cache; all: also train the arms; "
        "unit: train --arms at --rl-seed, one after the other, appending each to the results JSON (see run_units); "
        "rebuild: run one recorded unit again from the settings in the results JSON and compare (see rebuild_unit)",
    )
    p.add_argument("--arms", nargs="+", choices=list(UNIT_ARMS), default=list(ARMS), help="arms to train")
    p.add_argument("--rl-seed", type=int, default=None, help="RL seed (default: --seed); data and warm-up keep --seed")
    p.add_argument("--model-root", default=None, help="unit: where seed 0's final models go (default: CACHE/models)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data, the warm-up and the arms")
    p.add_argument("--train-size", type=int, default=2000, help="training problems")
    p.add_argument("--test-size", type=int, default=200, help="held-out problems")
    p.add_argument("--two-step", type=float, default=0.6, help="share of two-step problems (RL and held-out)")
    p.add_argument(
        "--warmup-two-step",
        type=float,
        default=None,
        help="the warm-up's share of two-step problems (default: --two-step)",
    )
    p.add_argument("--sft-steps", type=int, default=40, help="supervised warm-up steps")
    p.add_argument("--sft-batch-size", type=int, default=8, help="warm-up batch size")
    p.add_argument("--sft-lr", type=float, default=5e-5, help="warm-up learning rate")
    p.add_argument(
        "--train-layers", type=int, default=10, help="train only the top N decoder layers (both phases, both arms)"
    )
    p.add_argument("--lr", type=float, default=2e-5, help="RL learning rate (constant), both arms")
    p.add_argument("--num-generations", type=int, default=8, help="completions per prompt (G)")
    p.add_argument("--prompts-per-step", type=int, default=2, help="prompt groups per optimizer step")
    p.add_argument("--updates-per-rollout", type=int, default=2, help="steps_per_generation (GA is 1)")
    p.add_argument("--max-completion-length", type=int, default=40, help="completion token cap")
    p.add_argument(
        "--overlong-buffer-len", type=int, default=8, help="DAPO's overlong buffer (L_cache); 0: DAPOConfig's default"
    )
    p.add_argument("--max-rounds", type=int, default=4, help="dynamic_sampling_max_rounds; 0: DAPOConfig's default")
    p.add_argument("--budget-tokens", type=int, default=8000, help="generated completion tokens per arm")
    p.add_argument(
        "--eval-fractions",
        type=float,
        nargs="+",
        default=[0.5, 1.0],
        help="fractions of the token budget at which to evaluate",
    )
    p.add_argument("--max-minutes", type=float, default=45, help="also stop an arm after this much wall time")
    p.add_argument("--eval-samples", type=int, default=0, help="0: greedy; k: avg@k sampled at T=1")
    p.add_argument("--eval-batch-size", type=int, default=50, help="sequences per generate call")
    p.add_argument("--sequential", action="store_true", help="run the arms one after the other in this process")
    p.add_argument(
        "--vllm",
        action="store_true",
        help="rollouts through colocated vLLM (vllm-cpu: run with .venv-vllm's python; see docs/vllm.md). Naive GRPO "
        "then runs as DAPOTrainer with GRPOConfig's loss and clipping (see naive_grpo_for_vllm)",
    )
    p.add_argument(
        "--vllm-dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="the engine's dtype (DAPOConfig.vllm_dtype; auto: the trainer's, float32 here)",
    )
    p.add_argument(
        "--cache-dir",
        default=str(Path.home() / ".cache" / "dapo_trl_real_model"),
        help="where the warmed-up model is kept",
    )
    p.add_argument("--results-dir", default=str(RESULTS_DIR), help="where the table, json and plot go")
    p.add_argument(
        "--shared-order",
        action="store_true",
        help="paired units: the training set shuffled by the RL seed and read in that order by every arm; per-problem "
        "held-out outcomes recorded instead of model folders (docs/real_model.md, the pre-registered experiment)",
    )
    p.add_argument(
        "--stop-rule",
        choices=("past", "nearest"),
        default="past",
        help="past: stop at the first rollout boundary past the budget; nearest: at the boundary nearest to it",
    )
    p.add_argument("--eval-at-start", action="store_true", help="also evaluate the starting model, in each unit")
    args = p.parse_args(argv)
    args.code = code_version() if args.shared_order else None
    if args.quick:
        given = {
            a.lstrip("-").split("=")[0].replace("-", "_")
            for a in (sys.argv[1:] if argv is None else argv)
            if a.startswith("--")
        }
        for key, value in QUICK.items():
            if key not in given:
                setattr(args, key, value)
        args.sequential = True
        if args.model is None:
            args.model = build_tiny(Path(args.cache_dir) / "tiny-chat-model")
    if args.model is None:
        p.error(f"--model (or ${MODEL_ENV}): a folder written by scripts/get_smollm2.py")
    if args.phase != "unit" and set(args.arms) - set(ARMS):
        p.error(
            f"--arms {sorted(set(args.arms) - set(ARMS))}: only with --phase unit (the two-arm run has {list(ARMS)})."
        )
    args.model_root = args.model_root or str(Path(args.cache_dir) / "models")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(1)
    args = parse_args(argv)
    if args.vllm:
        for key, value in VLLM_CPU_ENV.items():
            os.environ.setdefault(key, value)
    Path(args.cache_dir).mkdir(parents=True, exist_ok=True)
    results = units_path(args)
    if args.phase == "rebuild":
        raise SystemExit(rebuild_unit(args))
    if args.phase == "report" and results.exists() and "arms" in json.loads(results.read_text()):
        if json.loads(results.read_text()).get("settings", {}).get("shared_order"):
            return report_paired(args)
        return report_units(args)
    if args.phase == "unit":
        check_unit_settings(args)
    warm_dir, warmup = warm_up(args)
    if args.phase == "unit" and args.eval_at_start:
        warmup["eval"] = None  # each unit scores the starting model through its own engine (see run_arm)
    else:
        warmup["eval"] = warmed_up_eval(args, warm_dir)
    if args.phase == "warmup":
        return warmup
    if args.phase == "unit":
        return run_units(args, warm_dir, warmup)
    if args.phase == "all":
        jobs = [(args, arm, warm_dir) for arm in args.arms]
        if args.sequential:
            for job in jobs:
                _run_arm_job(job)
        else:
            with ProcessPoolExecutor(max_workers=len(jobs), mp_context=get_context("spawn")) as pool:
                list(pool.map(_run_arm_job, jobs))
    arms = {}
    for arm in ARMS:
        path = arm_path(args, arm)
        if path.exists():
            arms[arm] = json.loads(path.read_text())
    return report(args, warmup, arms)


if __name__ == "__main__":
    main()
