"""Training steps on one GPU: DAPOTrainer with dynamic sampling against TRL's GRPOTrainer, at Qwen2.5-0.5B's shape.

What it measures: steps/s, completion tokens generated per second, peak GPU memory and the dynamic-sampling metrics of
`GRPOTrainer` (`loss_type="dapo"`) and `DAPOTrainer` (dynamic sampling on, the other DAPO defaults) given the same
model weights, data, seed and every `GRPOConfig` setting (checked field by field), one after the other in one process.
Generation uses transformers (`use_vllm=False`); vLLM is reached only through TRL's own code and is not exercised here.

The model is a randomly initialised `Qwen2ForCausalLM` built from a `Qwen2Config` with Qwen2.5-0.5B's dimensions
(24 layers, hidden 896, MLP 4,864, 14 heads, 2 KV heads, vocabulary 151,936, tied embeddings: 494M parameters), in
bf16 with `bf16=True` (weights and optimizer states in bf16, as a model loaded with `dtype=torch.bfloat16`). Nothing is
downloaded: the tokenizer is built locally, character-level like `dapo_trl.run.toy`'s, with filler tokens up to the
model's vocabulary size, so that the LM head, the sampling and the log-softmax run over the real 151,936 entries and
every id the model samples decodes. A random model's text means nothing, so the reward is scripted from the prompt:
`easy` prompts score +1 for every completion, `hard` ones -1, `mixed` ones +1 or -1 from a hash of the completion's
text. With kinds easy / hard / mixed / mixed, about half the groups are constant, so dynamic sampling discards them and
refills. A random model almost never samples EOS, so every completion runs to `max_completion_length` (tokens/s is then
the full batch; the overlong penalty is the same for every row and changes no advantage).

Timing: a step is everything between consecutive `on_step_end` callbacks (generation, scoring, loss, backward,
optimizer), after `torch.cuda.synchronize()`; the first `--warmup` steps are dropped. Completion tokens are counted by
the reward function over every generated row, discarded groups included, so tokens/s is generation throughput; the
useful rate is "informative groups trained/s": groups with a nonzero advantage (all of DAPO's trained groups, the
non-constant ones of GRPO's). Peak GPU memory is `torch.cuda.max_memory_allocated()` from building the model to the
end of training, reset between the two trainers.

Real-model mode (`--real-model DIR`, a folder written by scripts/get_smollm2.py): the same two trainers on
SmolLM2-135M-Instruct (pretrained, BPE tokenizer, chat template, `<|im_end|>` as end of turn), on arithmetic word
problems the script generates, in chat format, scored by the project's verifier (`MathVerifierReward`); the overlong
penalty and dynamic sampling (at most `--max-rounds` rounds) act on its real completions. It adds the held-out accuracy
(avg@k over problems disjoint from the training ones) before training and after each trainer.

Launch (see docs/real_model.md, "A GPU run", for an offline machine and its carry plan):
```
python benchmarks/gpu_step.py                  # one CUDA GPU; ~3-5 minutes with the defaults
python benchmarks/gpu_step.py --cpu --tiny     # CI smoke: a 2-layer model on CPU, a few seconds
python benchmarks/gpu_step.py --real-model models/SmolLM2-135M-Instruct          # one CUDA GPU
python benchmarks/gpu_step.py --real-model models/SmolLM2-135M-Instruct --cpu --tiny   # ~2-4 minutes on 1 core
```
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import logging
import math
import os
import random
import statistics
import string
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from dapo_trl import DAPOConfig, MathVerifierReward  # noqa: E402

# benchmarks/overhead.py's side-by-side settings and training loop, loaded from its path (not by `import overhead`)
# so that this file imports both as a script and when a test loads it from its path
_spec = importlib.util.spec_from_file_location("overhead", Path(__file__).with_name("overhead.py"))
overhead = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(overhead)

KINDS = ("GRPO", "DAPO")
LABELS = {"GRPO": 'GRPOTrainer (loss_type="dapo")', "DAPO": "DAPOTrainer + dynamic sampling"}
PROMPT_KINDS = ("easy", "hard", "mixed", "mixed")  # half the groups constant
SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>")
CHARS = string.digits + string.ascii_letters + " \n#+-*/=?:.,()"

# Qwen2.5-0.5B's config.json dimensions
QWEN25_05B = dict(
    vocab_size=151_936,
    hidden_size=896,
    intermediate_size=4_864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32_768,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    tie_word_embeddings=True,
)
TINY = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)


def build_tokenizer(vocab_size: int):
    """Character-level tokenizer (one token per character of `CHARS`) padded with filler tokens to `vocab_size`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *CHARS))}
    if vocab_size < len(vocab):
        raise ValueError(f"vocab_size ({vocab_size}) must hold the {len(vocab)} characters and special tokens.")
    vocab.update({f"<f{i}>": i for i in range(len(vocab), vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    backend.decoder = decoders.Fuse()
    pad, eos, bos, unk = SPECIAL_TOKENS
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=pad, eos_token=eos, bos_token=bos, unk_token=unk, padding_side="left"
    )


def build_model(dims: dict, tokenizer, *, dtype: torch.dtype, device: str, seed: int):
    """A randomly initialised `Qwen2ForCausalLM` with the given dimensions, built directly on `device`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        **dims,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def make_dataset(n: int, prompt_length: int) -> Dataset:
    """`n` prompts of exactly `prompt_length` characters (= tokens), kinds cycling through `PROMPT_KINDS`."""
    prompts, kinds = [], []
    for i in range(n):
        kind = PROMPT_KINDS[i % len(PROMPT_KINDS)]
        head = f"#{i} {kind}: "
        body = "".join(str((i * 7 + j * 3) % 10) for j in range(max(0, prompt_length - len(head) - 1)))
        prompts.append((head + body)[: prompt_length - 1] + "\n")
        kinds.append(kind)
    return Dataset.from_dict({"prompt": prompts, "kind": kinds})


class ScriptedReward:
    """
    +1 for every completion of an `easy` prompt, -1 for `hard`, and for `mixed` +1 or -1 from the parity of a hash of
    the completion text (so a group of G different completions is constant with probability 2^(1-G)). Counts the
    completion tokens it scores.
    """

    __name__ = "scripted_correctness"
    correct_reward = 1.0

    def __init__(self) -> None:
        self.completion_tokens = 0

    def __call__(self, completions, completion_ids, kind, **kwargs) -> list[float]:
        self.completion_tokens += sum(len(ids) for ids in completion_ids)
        return [score_row(k, text) for k, text in zip(kind, completions, strict=True)]


def score_row(kind: str, text) -> float:
    if kind == "easy":
        return 1.0
    if kind == "hard":
        return -1.0
    return 1.0 if zlib.crc32(str(text).encode()) % 2 else -1.0


# ------------------------------------------------------------------------------------------------ real-model mode

WORD_PROBLEMS = (
    ("{name} has {a} apples and buys {b} more. How many apples does {name} have now?", lambda a, b: a + b),
    ("A box holds {a} pens. {name} takes {b} of them. How many pens are left in the box?", lambda a, b: a - b),
    ("{name} reads {a} pages a day for {b} days. How many pages does {name} read in total?", lambda a, b: a * b),
    ("There are {a} birds on a tree and {b} more land on it. How many birds are on the tree?", lambda a, b: a + b),
    ("{name} had {a} stickers and gave {b} away. How many stickers does {name} have left?", lambda a, b: a - b),
    ("A farmer plants {a} rows of {b} trees. How many trees does the farmer plant?", lambda a, b: a * b),
)
NAMES = ("Tom", "Anna", "Sam", "Lily", "Ben", "Mia")
INSTRUCTION = "Think briefly, then give the result on the last line as: Answer: <number>"


def make_word_problems(n: int, *, seed: int, split: str) -> Dataset:
    """
    `n` distinct one-step word problems in chat format (`prompt`, `answer`). The `train` and `test` splits never share
    a problem: a problem belongs to `test` when its (template, a, b) hash is 0 modulo 5.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng, seen, prompts, answers = random.Random(f"{seed}-{split}"), set(), [], []
    while len(prompts) < n:
        t, name = rng.randrange(len(WORD_PROBLEMS)), rng.choice(NAMES)
        a, b = rng.randint(2, 30), rng.randint(2, 12)
        a = max(a, b + 1) if t in (1, 4) else a  # never below zero
        template, answer = WORD_PROBLEMS[t]
        text = template.format(name=name, a=a, b=b) + "\n" + INSTRUCTION
        if (zlib.crc32(f"{t}-{a}-{b}".encode()) % 5 == 0) != (split == "test") or text in seen:
            continue
        seen.add(text)
        prompts.append([{"role": "user", "content": text}])
        answers.append(str(answer(a, b)))
    return Dataset.from_dict({"prompt": prompts, "answer": answers})


class CountingVerifier(MathVerifierReward):
    """The project's verifier (`math_verifier`), counting the completion tokens it scores."""

    def __init__(self) -> None:
        super().__init__(answer_column="answer")
        self.completion_tokens = 0

    def __call__(self, completions, completion_ids=None, **columns) -> list[float | None]:
        self.completion_tokens += sum(len(ids) for ids in completion_ids or [])
        return super().__call__(completions=completions, completion_ids=completion_ids, **columns)


def load_real_model(folder: str, *, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device)


def heldout_accuracy(model, tokenizer, heldout: Dataset, args: argparse.Namespace) -> float:
    """avg@k on the held-out problems, sampled as in training (temperature 1, chat template, same length cap)."""
    from dapo_trl.run.evaluation import evaluate

    was_training = model.training
    model.eval()
    metrics = evaluate(
        model,
        heldout,
        k=args.eval_k,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=args.max_completion_length,
        tokenizer=tokenizer,
        use_chat_template=True,
        batch_size=64,
        seed=args.seed,
        progress=False,
    )
    model.train(was_training)
    return metrics[f"avg@{args.eval_k}"]


class StepMeter(TrainerCallback):
    """Wall time and completion tokens of each optimizer step."""

    def __init__(self, reward: ScriptedReward, cuda: bool) -> None:
        self.reward, self.cuda = reward, cuda
        self.times: list[float] = []
        self.tokens: list[int] = []

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self._last, self._last_tokens = self._now(), self.reward.completion_tokens

    def on_step_end(self, args, state, control, **kwargs):
        now = self._now()
        self.times.append(now - self._last)
        self.tokens.append(self.reward.completion_tokens - self._last_tokens)
        self._last, self._last_tokens = now, self.reward.completion_tokens


def shared_settings(args: argparse.Namespace, output_dir: str) -> dict:
    """Every setting both trainers get: `benchmarks/overhead.py`'s, on this run's device and learning rate."""
    return overhead.shared_settings(
        args,
        output_dir,
        use_cpu=args.cpu,
        bf16=not args.cpu,
        activation_checkpointing=not args.no_checkpointing,
        learning_rate=args.learning_rate,
    )


def build_config(kind: str, args: argparse.Namespace, output_dir: str) -> GRPOConfig:
    settings = shared_settings(args, output_dir)
    if kind == "GRPO":
        return GRPOConfig(**settings)
    if args.real_model:  # DAPO's overlong shaping acts on the real model's rambling completions
        return DAPOConfig(
            **settings,
            dynamic_sampling=True,
            dynamic_sampling_max_rounds=args.max_rounds,
            overlong_buffer_len=max(1, args.max_completion_length // 4),
        )
    return DAPOConfig(**settings, dynamic_sampling=True)


def run_once(
    kind: str, args: argparse.Namespace, dims: dict, tokenizer, dataset, device: str, dtype, heldout=None
) -> dict:
    cuda = device == "cuda"
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    if args.real_model:
        model, reward = load_real_model(args.real_model, dtype=dtype, device=device), CountingVerifier()
    else:
        model, reward = build_model(dims, tokenizer, dtype=dtype, device=device, seed=args.seed), ScriptedReward()
    meter = StepMeter(reward, cuda)
    with tempfile.TemporaryDirectory() as output_dir:
        config = build_config(kind, args, output_dir)
        trainer = overhead.train(
            kind, config, model=model, reward=reward, dataset=dataset, tokenizer=tokenizer, meter=meter
        )
    peak = torch.cuda.max_memory_allocated() if cuda else None
    accuracy = None if heldout is None else heldout_accuracy(trainer.model, tokenizer, heldout, args)
    measured = [h for h in trainer.state.log_history if h.get("step", 0) > args.warmup and "loss" in h]
    metrics = {  # a metric logged as None (nothing to average over in that step) is left out
        key: statistics.fmean(h[key] for h in measured if h.get(key) is not None)
        for key in sorted({k for h in measured for k, v in h.items() if v is not None})
        if key.startswith(("dynamic_sampling/", "overlong/")) or key == "frac_reward_zero_std"
    }
    del trainer, model
    time_s = sum(meter.times[args.warmup :])
    steps = len(meter.times[args.warmup :])
    if "dynamic_sampling/groups_trained" in metrics:  # every trained group is informative
        generated, trained = metrics["dynamic_sampling/groups_generated"], metrics["dynamic_sampling/groups_trained"]
        informative = trained
    else:  # GRPO trains every group; the constant ones have zero advantage
        generated = trained = float(args.prompts)
        informative = args.prompts * (1.0 - metrics["frac_reward_zero_std"])
    return {
        "steps_per_s": steps / time_s,
        "tokens_per_s": sum(meter.tokens[args.warmup :]) / time_s,
        "informative_groups_per_s": informative * steps / time_s,
        "groups_generated": generated,
        "groups_trained": trained,
        "peak_memory_gib": None if peak is None else peak / 2**30,
        "heldout_accuracy": accuracy,
        "metrics": metrics,
    }


def ratio(a: float, b: float) -> str:
    """`a / b` to 3 decimals, or `n/a` when `b` is 0 (a pretrained model may have no informative group at all)."""
    return f"{a / b:.3f}" if b else "n/a"


def format_report(results: dict[str, dict], before: float | None = None) -> str:
    lines = [
        "| trainer | steps/s | completion tokens/s | informative groups trained/s | groups generated/step "
        "| groups trained/step | peak GPU memory (GiB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind in KINDS:
        r = results[kind]
        peak = "n/a" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.2f}"
        lines.append(
            f"| {LABELS[kind]} | {r['steps_per_s']:.4f} | {r['tokens_per_s']:.1f} | "
            f"{r['informative_groups_per_s']:.3f} | "
            f"{r['groups_generated']:.2f} | {r['groups_trained']:.2f} | {peak} |"
        )
    grpo, dapo = results["GRPO"], results["DAPO"]
    lines.append("")
    lines.append(
        f"DAPO / GRPO ratio: steps/s {dapo['steps_per_s'] / grpo['steps_per_s']:.3f}, completion tokens/s "
        f"{dapo['tokens_per_s'] / grpo['tokens_per_s']:.3f}, informative groups trained/s "
        f"{ratio(dapo['informative_groups_per_s'], grpo['informative_groups_per_s'])}"
        + (
            ""
            if grpo["peak_memory_gib"] is None
            else f", peak GPU memory {dapo['peak_memory_gib'] / grpo['peak_memory_gib']:.3f}"
        )
    )
    if before is not None:
        lines.append("")
        lines.append(
            f"Held-out accuracy (avg@k): before training {before:.4f}, after GRPOTrainer "
            f"{results['GRPO']['heldout_accuracy']:.4f}, after DAPOTrainer {results['DAPO']['heldout_accuracy']:.4f}"
        )
    lines.append("")
    lines.append("Dynamic-sampling metrics (mean over the measured steps):")
    for key, value in results["DAPO"]["metrics"].items():
        lines.append(f"  {key}: {value:.4f}")
    lines.append(
        f"GRPOTrainer frac_reward_zero_std: {results['GRPO']['metrics'].get('frac_reward_zero_std', math.nan):.4f}"
    )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="Run on CPU (fp32) instead of one CUDA GPU (bf16).")
    parser.add_argument("--tiny", action="store_true", help="A 2-layer model and a small batch, for CI.")
    parser.add_argument("--steps", type=int, default=5, help="Measured optimizer steps per trainer.")
    parser.add_argument("--warmup", type=int, default=1, help="Optimizer steps dropped at the start of each run.")
    parser.add_argument("--prompts", type=int, default=16, help="Prompts (groups) per optimizer step.")
    parser.add_argument("--num-generations", type=int, default=8, help="Group size G.")
    parser.add_argument("--prompt-length", type=int, default=128, help="Prompt length in tokens.")
    parser.add_argument(
        "--max-completion-length", type=int, default=None, help="Default 256 (random model), 128 (real model)."
    )
    parser.add_argument("--no-checkpointing", action="store_true", help="Turn activation checkpointing off.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the model and data.")
    real = parser.add_argument_group("real-model mode")
    real.add_argument(
        "--real-model",
        default=None,
        metavar="DIR",
        help="Train this converted SmolLM2-135M-Instruct folder (scripts/get_smollm2.py) on word problems.",
    )
    real.add_argument("--heldout", type=int, default=64, help="Held-out problems for the accuracy (real model).")
    real.add_argument("--eval-k", type=int, default=4, help="Samples per held-out problem (real model).")
    real.add_argument("--max-rounds", type=int, default=3, help="DAPO's dynamic_sampling_max_rounds (real model).")
    real.add_argument("--learning-rate", type=float, default=None, help="Default 1e-6 (random model), 2e-6 (real).")
    args = parser.parse_args(argv)
    if args.learning_rate is None:
        args.learning_rate = 2e-6 if args.real_model else 1e-6
    if args.max_completion_length is None:  # the base model rambles past 128 tokens on about half its completions
        args.max_completion_length = 128 if args.real_model else 256
    if args.tiny and args.real_model:
        args.steps, args.warmup, args.prompts, args.num_generations = 1, 0, 2, 4
        args.max_completion_length, args.heldout, args.eval_k, args.max_rounds = 16, 4, 2, 2
    elif args.tiny:
        args.steps, args.warmup, args.prompts, args.num_generations = 2, 1, 4, 4
        args.prompt_length, args.max_completion_length = 12, 8
    if args.cpu:
        args.no_checkpointing = True
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, dict]:
    args = parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("No CUDA device found: run with --cpu (and --tiny for a small model).")
    device = "cpu" if args.cpu else "cuda"
    dtype = torch.float32 if args.cpu else torch.bfloat16
    if args.cpu:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    start = time.perf_counter()

    dims = TINY if args.tiny else QWEN25_05B
    # enough prompts that no step of either trainer (DAPO draws up to max_rounds x prompts) sees one twice
    size = max(512, 8 * args.prompts * (args.warmup + args.steps))
    with tempfile.TemporaryDirectory() as output_dir:
        overhead.check_same_settings(build_config("GRPO", args, output_dir), build_config("DAPO", args, output_dir))
    before, heldout = None, None
    if args.real_model:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.real_model)
        dataset = make_word_problems(size, seed=args.seed, split="train")
        heldout = make_word_problems(args.heldout, seed=args.seed, split="test")
        base = load_real_model(args.real_model, dtype=dtype, device=device)
        num_params = sum(p.numel() for p in base.parameters())
        before = heldout_accuracy(base, tokenizer, heldout, args)
        del base
        shape = "SmolLM2-135M-Instruct (pretrained)"
    else:
        tokenizer = build_tokenizer(dims["vocab_size"])
        dataset = make_dataset(size, args.prompt_length)
        probe = build_model(dims, tokenizer, dtype=dtype, device="meta", seed=args.seed)
        num_params = sum(p.numel() for p in probe.parameters())
        del probe
        shape = ("tiny Qwen2" if args.tiny else "Qwen2.5-0.5B shape") + ", random weights"

    results = {kind: run_once(kind, args, dims, tokenizer, dataset, device, dtype, heldout) for kind in KINDS}

    where = "CPU" if args.cpu else f"{torch.cuda.get_device_name()} (CUDA)"
    prompts = "chat-format word problems" if args.real_model else f"prompts of {args.prompt_length} tokens"
    print(
        f"GPU step check: {shape} ({num_params:,} parameters), {str(dtype).split('.')[-1]}, "
        f"{where}; {args.prompts} prompts x G={args.num_generations} per step, {prompts}, "
        f"up to {args.max_completion_length} completion tokens; {args.warmup} warm-up + {args.steps} measured steps; "
        f"transformers generation; torch {torch.__version__}\n"
    )
    print(format_report(results, before))
    print(f"({time.perf_counter() - start:.0f} s)")
    return results


if __name__ == "__main__":
    hf_logging.set_verbosity_error()
    logging.basicConfig(level=logging.WARNING)
    main()
