"""A tiny arithmetic task that runs DAPO end to end on a CPU in minutes, with nothing downloaded.

The pieces:

- [`build_char_tokenizer`] / [`build_tiny_model`]: a character-level tokenizer and a ~0.34M-parameter Qwen2 model
  built locally; saved together, they reload with `AutoTokenizer` / `AutoModelForCausalLM` as themselves.
  [`tiny_model_and_tokenizer`] (public as `dapo_trl.tiny_model_and_tokenizer`) builds (and saves) both at once.
- [`make_math_dataset`]: addition/subtraction problems in DAPO's answer format (the completion's last line is
  `Answer: N`), easy and hard mixed so that some groups are all-correct or all-wrong (dynamic sampling has something
  to filter), with an optional work line so that completion lengths vary (token-level loss and overlong shaping have
  something to act on). Train and test never share a problem.
- [`warmup_sft`]: a short supervised warm-up. From random weights every reward is the same and every group has zero
  advantage; the warm-up brings sampled accuracy into the mixed regime where RL can learn.
- [`sampled_accuracy`] / [`accuracy_report`]: before/after measurement.

The task:
```
prompt:      "What is 47+38?\n"
completion:  "Answer: 85"                  (short form)
             "Rev: 58\nAnswer: 85"         (with a work line: the answer's digits least-significant first)
```
Small transformers add far more reliably when they write the digits least-significant first, the order in which
carries flow (Lee et al., 2023, "Teaching Arithmetic to Small Transformers"), so the longer form is a small piece of
"reasoning" that RL can learn to prefer.

Tuning record (2 shared CPU cores, `OMP_NUM_THREADS=1`, torch 2.13 CPU, TRL 1.16):

- Default task: addition only, levels 1+1 / 2+1 / 2+2 digits with weights 0.2 / 0.4 / 0.4, work line in half of the
  warm-up targets. Model: hidden 128, 2 layers, 0.34M parameters.
- Warm-up: at most 1,200 steps, batch 32, AdamW 3e-3 (cosine to 3e-4) on 20,000 problems, ~70 s of CPU time;
  it stops early once sampled accuracy on 64 training problems reaches 0.6 (checked every 200 steps).
- RL: lr 1e-4 constant, `loss_type="dapo"`, `epsilon_high=0.28`, `beta=0`, 8 generations, 64 rows per update,
  `steps_per_generation=4` (4 updates per rollout of 32 prompts), `max_completion_length=28` (the longest
  well-formed completion is 21 tokens) with `overlong_buffer_len=7`, 300 steps, dynamic sampling on.
- Measured with `examples/train_math.py --config configs/cpu_demo.yaml --seed S` (DAPOTrainer, math verifier
  reward; held-out sampled accuracy at T=1, 8 samples x 256 problems; CPU time of the whole run = its wall time on
  an idle machine with `OMP_NUM_THREADS=1`):

  | seed | warm-up steps | after warm-up | after 300 DAPO steps | CPU time |
  |------|---------------|---------------|----------------------|----------|
  | 0    | 1,200         | 0.450         | 0.543                | 226-273 s |
  | 1    | 1,200         | 0.377         | 0.511                | 205 s    |
  | 2    | 1,200         | 0.506         | 0.607                | 240 s    |
  | 3    | 1,000 (early) | 0.675         | 0.966                | 294 s    |

  These runs scored with [`is_correct`] on all 256 drawn problems, repeats included; the demo now scores the
  distinct ones (228 at seed 0) with the math verifier, exactly as `python -m dapo_trl.evaluation` does on its
  run folder (docs/training.md has its current numbers).
  The 2 cores were shared with other jobs during these runs (load 3-5): wall times were 6-12 minutes. Seed 3 shows
  why the early stop exists: without it its warm-up reached 0.92 (`dapo_trl.run.toy` driven by hand), only 17-32% of
  the groups were informative, and the RL phase used 2.4x the CPU time.
  Stock `GRPOTrainer`, same settings, 400 steps from the seed-0 warm-up: 0.45 -> 0.53 in ~120 s of CPU.
- What RL learns: to commit to one answer style (seeds 0, 1 and 3 move to the work line, 50% -> 96-100% of
  completions, mean length 14 -> 18 characters; seed 2 mostly drops it, 50% -> 16%, 14 -> 11 characters) and to
  sharpen the 1- and 2-digit problems.
- What did not work: lr 3e-4 (0.45 -> 0.51 with GRPO; in another run 2+2-digit accuracy fell 0.07 -> 0.01), lr 5e-4
  (0.24 -> 0.12), `num_iterations=2` (0.45 -> 0.39), warm-ups without the work line (RL flat: 0.23 -> 0.23 at
  lr 3e-4, 0.69 -> 0.67 at 2e-4, 0.69 -> 0.71 at 5e-5), 3-digit levels in the default mix (0.11 instead of 0.25 after
  700 warm-up steps). RL on a 4,000-problem set partly memorises it (train-set accuracy 0.68 -> 0.77, held-out
  0.69 -> 0.71), so the demo draws from 20,000.
"""

from __future__ import annotations

import logging
import math
import random
import re
import string
import zlib
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN = "<pad>", "<eos>", "<bos>", "<unk>"
DEFAULT_CHARS = string.digits + string.ascii_letters + " \n+-*/=?:.,!()[]{}$^_\\'\"<>|&%#@;~`"

# (digits of the first operand, digits of the second operand), from easy to hard
LEVELS: tuple[tuple[int, int], ...] = ((1, 1), (2, 1), (2, 2), (3, 2), (3, 3))
DEFAULT_LEVEL_WEIGHTS: tuple[float, ...] = (0.2, 0.4, 0.4, 0.0, 0.0)
# One problem in HOLDOUT_MOD (by a stable hash of its prompt) is reserved for the test split, whatever the seed.
HOLDOUT_MOD = 5

Scorer = Callable[[str, str], bool]


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer and model
# ---------------------------------------------------------------------------------------------------------------------


def build_char_tokenizer(chars: str = DEFAULT_CHARS, *, model_max_length: int = 128) -> Any:
    """
    Character-level tokenizer: one token per character, plus `<pad>`, `<eos>`, `<bos>` and `<unk>`.

    It is a `Qwen2Tokenizer` (byte-level BPE) whose vocabulary holds single characters and no merges, so every
    character is one token. The class matters: transformers' `AutoTokenizer` loads every folder whose `config.json`
    says `qwen2` (as the tiny model's does) with `Qwen2Tokenizer`, whatever class the tokenizer was saved as, so a
    tokenizer of any other class comes back from a saved model folder as a different tokenizer (a generic character
    tokenizer came back dropping spaces and newlines). Built this way it reloads as itself, alone or next to the model.

    Args:
        chars (`str`, *optional*, defaults to digits, ASCII letters, space, newline and punctuation):
            Characters of the vocabulary, in id order after the four special tokens. Other characters are dropped
            when encoding (`Qwen2Tokenizer`'s BPE has no unknown token); `<unk>` is in the vocabulary but never
            produced.
        model_max_length (`int`, *optional*, defaults to `128`):
            Stored on the tokenizer.

    Returns:
        `transformers.Qwen2Tokenizer`, padding on the left.
    """
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import Qwen2Tokenizer

    specials = [PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN]
    byte_symbol = _byte_level_symbols()
    if set(byte_symbol.values()) != set(ByteLevel.alphabet()):  # the map below must be the one ByteLevel uses
        raise RuntimeError("tokenizers' ByteLevel alphabet is not the GPT-2 byte map this tokenizer assumes.")
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in dict.fromkeys(chars):  # keep order, drop repeats
        symbol = "".join(byte_symbol[b] for b in ch.encode())
        if symbol not in vocab:
            vocab[symbol] = len(vocab)
    return Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=BOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        model_max_length=model_max_length,
    )


def _byte_level_symbols() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which byte-level BPE vocabularies (Qwen2's included) are written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + shifted)
            shifted += 1
    return symbols


def build_tiny_model(
    tokenizer: Any,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 128,
    seed: int = 0,
) -> Any:
    """
    A small `Qwen2ForCausalLM` built from a config (random weights; nothing from the Hub).

    With the defaults (hidden 128, 2 layers, MLP 256, tied embeddings) it has ~0.34M parameters.

    Args:
        tokenizer (`PreTrainedTokenizerBase`):
            Sets the vocabulary size and the pad/bos/eos ids.
        hidden_size (`int`, *optional*, defaults to `128`):
        num_layers (`int`, *optional*, defaults to `2`):
        num_heads (`int`, *optional*, defaults to `4`):
        intermediate_size (`int`, *optional*):
            MLP width; defaults to `2 * hidden_size`.
        max_position_embeddings (`int`, *optional*, defaults to `128`):
        seed (`int`, *optional*, defaults to `0`):
            Seeds the weight initialisation.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def tiny_model_and_tokenizer(
    save_to: str | None = None, *, hidden_size: int = 64, num_heads: int = 2, seed: int = 0
) -> tuple[Any, Any]:
    """
    A tiny causal language model and its tokenizer, built on the spot with nothing downloaded: for a first script, a
    test or a bug report that must run offline in seconds. The tokenizer is [`build_char_tokenizer`] (one token per
    character, padding on the left), the model [`build_tiny_model`] (a 2-layer `Qwen2ForCausalLM`, ~0.1M parameters
    with the defaults, random weights). From random weights every completion of a verifier reward is wrong, so expect
    no learning signal; `dapo_trl.run.toy.warmup_sft` (what `configs/cpu_demo.yaml` runs) brings it to where RL learns.

    Args:
        save_to (`str`, *optional*):
            A folder to save both to (`save_pretrained`), so that the pair loads by path like a Hub model:
            `DAPOTrainer(model=save_to, ...)`, `--model_name_or_path save_to`, and a reference model (`beta > 0`),
            which TRL loads from the model's path.
        hidden_size (`int`, *optional*, defaults to `64`):
            Width of the model.
        num_heads (`int`, *optional*, defaults to `2`):
            Attention heads; must divide `hidden_size`.
        seed (`int`, *optional*, defaults to `0`):
            Seeds the weight initialisation.

    Returns:
        `tuple[transformers.Qwen2ForCausalLM, transformers.Qwen2Tokenizer]`: the model and its tokenizer.

    Example:
    ```python
    >>> from dapo_trl import tiny_model_and_tokenizer

    >>> model, tokenizer = tiny_model_and_tokenizer()
    >>> tokenizer.decode(tokenizer("What is 2+3?")["input_ids"])
    'What is 2+3?'
    >>> sum(p.numel() for p in model.parameters()) < 200_000
    True

    ```
    """
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=hidden_size, num_heads=num_heads, seed=seed)
    if save_to is not None:
        model.save_pretrained(save_to)
        tokenizer.save_pretrained(save_to)
    return model, tokenizer


# ---------------------------------------------------------------------------------------------------------------------
# Task
# ---------------------------------------------------------------------------------------------------------------------


def format_prompt(a: int, op: str, b: int) -> str:
    """The question, e.g. `"What is 47+38?\\n"`."""
    return f"What is {a}{op}{b}?\n"


def format_target(a: int, op: str, b: int, *, work: bool) -> str:
    """
    Reference completion (without EOS): `"Answer: 85"`, or with a work line `"Rev: 58\\nAnswer: 85"`.

    Example:
    ```python
    >>> format_target(47, "+", 38, work=True)
    'Rev: 58\\nAnswer: 85'

    ```
    """
    result = _apply(a, op, b)
    answer_line = f"Answer: {result}"
    if not work:
        return answer_line
    return f"Rev: {str(result)[::-1]}\n{answer_line}"


def _apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    raise ValueError(f"Unsupported operator {op!r}.")


def _operand(rng: random.Random, digits: int) -> int:
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


def is_test_problem(prompt: str) -> bool:
    """Whether a prompt belongs to the held-out split (a stable hash, independent of any seed)."""
    return zlib.crc32(prompt.encode()) % HOLDOUT_MOD == 0


def make_math_dataset(
    n: int,
    *,
    seed: int = 0,
    split: str = "train",
    level_weights: Sequence[float] = DEFAULT_LEVEL_WEIGHTS,
    ops: str = "+",
    work_prob: float = 0.5,
) -> Any:
    """
    `n` arithmetic problems in DAPO's prompt/answer format, as a `datasets.Dataset`.

    Columns: `prompt` (plain text), `answer` (the integer as a string), `target` (a reference completion, for the
    supervised warm-up), `difficulty` (index into [`LEVELS`]).

    Args:
        n (`int`):
            Number of rows. Rows are distinct problems unless the requested levels hold fewer than `n`.
        seed (`int`, *optional*, defaults to `0`):
            Same seed, same dataset.
        split (`str`, *optional*, defaults to `"train"`):
            `"train"` or `"test"`. The two draw from disjoint problem sets (see [`is_test_problem`]).
        level_weights (`Sequence[float]`, *optional*, defaults to `(0.2, 0.4, 0.4, 0.0, 0.0)`):
            Sampling weight of each entry of [`LEVELS`] (1+1 digits up to 3+3 digits). The default mixes 1+1 digit
            problems (mostly right after the warm-up) with 2+2 digit ones (mostly wrong); the 3-digit levels are
            opt-in because they slow the warm-up down several-fold.
        ops (`str`, *optional*, defaults to `"+"`):
            Operators to draw from (`"+"`, `"-"` or `"+-"`). Subtraction never goes below zero (operands are
            swapped).
        work_prob (`float`, *optional*, defaults to `0.5`):
            Probability that a row's `target` carries the work line.
    """
    from datasets import Dataset

    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
    if len(level_weights) != len(LEVELS) or sum(level_weights) <= 0:
        raise ValueError(f"level_weights needs {len(LEVELS)} non-negative weights with a positive sum.")
    if not ops or set(ops) - {"+", "-"}:
        raise ValueError(f"ops must be made of '+' and '-', got {ops!r}.")
    # split folded into the seed so that the two splits are not the same draw filtered differently
    rng = random.Random(f"{seed}-{split}")
    want_test = split == "test"
    seen: set[str] = set()
    rows: dict[str, list] = {"prompt": [], "answer": [], "target": [], "difficulty": []}
    levels = list(range(len(LEVELS)))
    while len(rows["prompt"]) < n:
        level = rng.choices(levels, weights=level_weights)[0]
        for attempt in range(200):
            a, b = (_operand(rng, d) for d in LEVELS[level])
            op = rng.choice(ops)
            if op == "-" and a < b:
                a, b = b, a
            prompt = format_prompt(a, op, b)
            if is_test_problem(prompt) != want_test:
                continue
            if prompt not in seen or attempt >= 100:  # small levels run out of distinct problems
                break
        seen.add(prompt)
        rows["prompt"].append(prompt)
        rows["answer"].append(str(_apply(a, op, b)))
        rows["target"].append(format_target(a, op, b, work=rng.random() < work_prob))
        rows["difficulty"].append(level)
    return Dataset.from_dict(rows)


_ANSWER_INT = re.compile(r"Answer:\s*([+-]?\d+)\s*$")


def extract_int_answer(completion: str) -> int | None:
    """
    The integer on the last non-empty line if that line reads `Answer: N`, else `None`.

    Example:
    ```python
    >>> extract_int_answer("Rev: 58\\nAnswer: 85")
    85
    >>> extract_int_answer("Answer: 85\\nmore text") is None
    True

    ```
    """
    lines = [line for line in completion.strip().splitlines() if line.strip()]
    if not lines:
        return None
    match = _ANSWER_INT.search(lines[-1].strip())
    return int(match.group(1)) if match else None


def is_correct(completion: str, answer: str) -> bool:
    """Exact-integer check of the completion's last `Answer:` line (the toy task's scorer)."""
    predicted = extract_int_answer(completion)
    return predicted is not None and predicted == int(answer)


def toy_reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """
    TRL-signature reward for the toy task: `1.0` if correct, `-1.0` otherwise (DAPO §2.4 rule-based reward).

    Example:
    ```python
    >>> toy_reward(["Answer: 5", "Answer: 4"], answer=["5", "5"])
    [1.0, -1.0]

    ```
    """
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [1.0 if is_correct(t, a) else -1.0 for t, a in zip(texts, answer, strict=True)]


# ---------------------------------------------------------------------------------------------------------------------
# Supervised warm-up
# ---------------------------------------------------------------------------------------------------------------------


def warmup_sft(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    *,
    steps: int = 1200,
    lr: float = 3e-3,
    batch_size: int = 32,
    seed: int = 0,
    warmup_steps: int = 50,
    min_lr_ratio: float = 0.1,
    weight_decay: float = 0.0,
    stop_accuracy: float | None = 0.6,
    check_every: int = 200,
    check_prompts: int = 64,
    check_samples: int = 4,
    progress: bool = True,
) -> list[float]:
    """
    Short supervised warm-up on `prompt` -> `target` + EOS, loss on the completion tokens only.

    Plain torch loop: AdamW, linear warm-up then cosine decay to `min_lr_ratio * lr`, batches drawn at random.
    Addition is learned in sudden jumps whose timing varies with the seed (after 1,200 steps, sampled accuracy was
    0.40-0.51 for three seeds and 0.92 for a fourth), so by default the warm-up also stops early once it has left the
    mixed regime: every `check_every` steps it samples `check_samples` completions for the first `check_prompts`
    problems of `dataset` and stops when their accuracy reaches `stop_accuracy`.
    Sequences are right-padded (true positions from 0); the RoPE attention only sees relative offsets, so the left
    padding used later at generation time does not change what was learned.

    Args:
        model (`PreTrainedModel`):
            Trained in place.
        tokenizer (`PreTrainedTokenizerBase`):
        dataset (`datasets.Dataset`):
            With `prompt` and `target` columns (see [`make_math_dataset`]).
        steps (`int`, *optional*, defaults to `1200`):
        lr (`float`, *optional*, defaults to `3e-3`):
        batch_size (`int`, *optional*, defaults to `32`):
        seed (`int`, *optional*, defaults to `0`):
        stop_accuracy (`float`, *optional*, defaults to `0.6`):
            Stop once sampled accuracy on the check problems reaches this; `None` always runs `steps` steps.
        check_every (`int`, *optional*, defaults to `200`):
        check_prompts (`int`, *optional*, defaults to `64`):
        check_samples (`int`, *optional*, defaults to `4`):
        progress (`bool`, *optional*, defaults to `True`):
            Show a tqdm bar with the running loss.

    Returns:
        `list[float]`: the loss of each step.
    """
    import torch
    from tqdm.auto import tqdm

    if "target" not in dataset.column_names:
        raise ValueError(f"warmup_sft needs a 'target' column, got {dataset.column_names}.")
    # pre-tokenise once: (prompt ids, completion ids + eos)
    examples = [
        (
            tokenizer(p, add_special_tokens=False)["input_ids"],
            tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id],
        )
        for p, t in zip(dataset["prompt"], dataset["target"], strict=True)
    ]
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress_frac = (step - warmup_steps) / max(1, steps - warmup_steps)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress_frac))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    check_set = dataset.select(range(min(check_prompts, len(dataset))))
    max_new_tokens = max(len(c) for _, c in examples) + 2
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model.train()
    losses: list[float] = []
    bar = tqdm(range(steps), desc="warm-up SFT", disable=not progress)
    for _ in bar:
        batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
        width = max(len(p) + len(c) for p, c in batch)
        input_ids = torch.full((batch_size, width), tokenizer.pad_token_id, dtype=torch.long)  # (B, T)
        attention_mask = torch.zeros((batch_size, width), dtype=torch.long)  # (B, T)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)  # (B, T)
        for row, (p, c) in enumerate(batch):
            seq = p + c
            input_ids[row, : len(seq)] = torch.tensor(seq)
            attention_mask[row, : len(seq)] = 1
            labels[row, len(p) : len(seq)] = torch.tensor(c)
        output = model(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), labels=labels.to(device)
        )
        optimizer.zero_grad(set_to_none=True)
        output.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(output.loss.item())
        if len(losses) % 50 == 0:
            bar.set_postfix(loss=f"{sum(losses[-50:]) / 50:.3f}")
        if stop_accuracy is not None and len(losses) % check_every == 0 and len(losses) < steps:
            accuracy = sampled_accuracy(
                model, tokenizer, check_set, num_samples=check_samples, max_new_tokens=max_new_tokens, seed=seed
            )
            model.train()
            if accuracy >= stop_accuracy:
                logger.info(
                    "Warm-up stopped after %d of %d steps: sampled accuracy %.2f >= %.2f.",
                    len(losses),
                    steps,
                    accuracy,
                    stop_accuracy,
                )
                break
    bar.close()
    model.eval()
    return losses


# ---------------------------------------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------------------------------------


def accuracy_report(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    *,
    num_samples: int = 8,
    temperature: float = 1.0,
    top_p: float = 1.0,
    do_sample: bool = True,
    max_new_tokens: int = 32,
    batch_size: int = 64,
    seed: int = 0,
    scorer: Scorer | None = None,
    progress: bool = False,
) -> dict[str, float]:
    """
    Sample `num_samples` completions per prompt and report accuracy, overall and per difficulty level.

    Returns:
        `dict[str, float]` with `accuracy`, `accuracy/level_<i>` (when the dataset has a `difficulty` column),
        `frac_all_correct` / `frac_all_wrong` (share of prompts whose samples are all right / all wrong: the groups
        dynamic sampling would drop), `work_line_frac` (share of completions with a `Rev:` line),
        `mean_completion_chars` and `truncated_frac` (completions with no final `Answer:` line).
    """
    from .evaluation import sample_completions

    scorer = scorer or is_correct
    completions = sample_completions(
        model,
        tokenizer,
        dataset["prompt"],
        k=num_samples,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        do_sample=do_sample,
        batch_size=batch_size,
        seed=seed,
        progress=progress,
    )
    correct = [[scorer(c, a) for c in group] for group, a in zip(completions, dataset["answer"], strict=True)]
    flat = [c for group in completions for c in group]
    report = {
        "accuracy": sum(map(sum, correct)) / len(flat),
        "frac_all_correct": sum(all(g) for g in correct) / len(correct),
        "frac_all_wrong": sum(not any(g) for g in correct) / len(correct),
        "work_line_frac": sum("Rev:" in c for c in flat) / len(flat),
        "mean_completion_chars": sum(len(c) for c in flat) / len(flat),
        "truncated_frac": sum("Answer:" not in c for c in flat) / len(flat),
    }
    if "difficulty" in dataset.column_names:
        for level in sorted(set(dataset["difficulty"])):
            groups = [g for g, d in zip(correct, dataset["difficulty"], strict=True) if d == level]
            report[f"accuracy/level_{level}"] = sum(map(sum, groups)) / (len(groups) * num_samples)
    return report


def sampled_accuracy(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    *,
    num_samples: int = 8,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 32,
    batch_size: int = 64,
    seed: int = 0,
    scorer: Scorer | None = None,
) -> float:
    """
    Mean accuracy of `num_samples` sampled completions per prompt (avg@k at `temperature`).

    Args:
        scorer (`Callable[[str, str], bool]`, *optional*):
            `(completion, answer) -> correct`; defaults to [`is_correct`], an exact-integer check of the last
            `Answer:` line.
    """
    return accuracy_report(
        model,
        tokenizer,
        dataset,
        num_samples=num_samples,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        seed=seed,
        scorer=scorer,
    )["accuracy"]


def greedy_accuracy(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    *,
    max_new_tokens: int = 32,
    batch_size: int = 64,
    scorer: Scorer | None = None,
) -> float:
    """Accuracy of the greedy completion of each prompt."""
    return accuracy_report(
        model,
        tokenizer,
        dataset,
        num_samples=1,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        scorer=scorer,
    )["accuracy"]
