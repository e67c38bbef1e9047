"""Step-time overhead of `DAPOTrainer` over TRL's `GRPOTrainer`, on a tiny local model (CPU).

With dynamic sampling and overlong shaping off, a DAPO step does what a GRPO step does with `loss_type="dapo"` plus the
trainer's glue: the exact per-step token normaliser, the kept per-function rewards, the length-by-correctness and
token-probability monitors. This script measures what that glue costs.

Both trainers get the same model weights, data, seed and every `GRPOConfig` setting (checked field by field), with
`loss_type="dapo"` and `epsilon_high=0.28`. Each repetition builds a fresh trainer of each kind and trains it for
`warmup + steps` optimizer steps; trainers run interleaved (GRPO, DAPO, DAPO+DS, GRPO, DAPO, ...) so that load from
other processes hits them alike. A step is everything between consecutive `on_step_end` callbacks (data, generation,
scoring, loss, backward, optimizer and logging), timed in wall-clock time and in this process's CPU time; the first
`warmup` steps of every run are dropped. The table gives the median over all kept steps and its ratio to GRPO; the
target for DAPO without dynamic sampling is <= 1.05. On shared cores the CPU-time ratio is the one to read: the wall
time also counts the time other processes held the core.

`DAPO + dynamic sampling` is informational: it generates extra rounds until every batch holds only informative groups,
so its step costs more generation by design; `rounds/step` and `groups generated/step` say how much more. A short
supervised warm-up (`--sft-steps`) brings the tiny model into the regime where some groups are informative; without
it every group is all-wrong and dynamic sampling runs out of rounds every step.

Launch:
```
OMP_NUM_THREADS=1 python benchmarks/overhead.py            # 300 warm-up SFT steps, 8 repetitions x 10 steps
OMP_NUM_THREADS=1 python benchmarks/overhead.py --quick    # no SFT, 2 repetitions x 3 steps
```
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from dapo_trl.dapo_config import DAPOConfig  # noqa: E402
from dapo_trl.dapo_trainer import DAPOTrainer  # noqa: E402
from dapo_trl.run.toy import (  # noqa: E402
    build_char_tokenizer,
    build_tiny_model,
    make_math_dataset,
    toy_reward,
    warmup_sft,
)

TARGET_RATIO = 1.05
KINDS = ("GRPO", "DAPO", "DAPO + dynamic sampling")
# Easy levels (1+1 and 2+1 digits): a few hundred SFT steps reach the mixed regime.
LEVEL_WEIGHTS = (0.5, 0.5, 0.0, 0.0, 0.0)


class StepTimer(TrainerCallback):
    """Wall and CPU time between consecutive optimizer steps (the first from the start of training)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.cpu_times: list[float] = []
        self._last = self._last_cpu = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self._last, self._last_cpu = time.perf_counter(), time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        now, now_cpu = time.perf_counter(), time.process_time()
        self.times.append(now - self._last)
        self.cpu_times.append(now_cpu - self._last_cpu)
        self._last, self._last_cpu = now, now_cpu


def shared_settings(args: argparse.Namespace, output_dir: str, **overrides: Any) -> dict:
    """Every setting both trainers get; `overrides` replace some of them (`benchmarks/gpu_step.py`: device, rate)."""
    settings = dict(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=args.seed,
        max_steps=args.warmup + args.steps,
        learning_rate=1e-4,
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=args.prompts * args.num_generations,
        gradient_accumulation_steps=1,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,
        temperature=1.0,
    )
    return settings | overrides


def build_config(kind: str, args: argparse.Namespace, output_dir: str) -> GRPOConfig:
    settings = shared_settings(args, output_dir)
    if kind == "GRPO":
        return GRPOConfig(**settings)
    return DAPOConfig(
        **settings,
        overlong_shaping=False,
        dynamic_sampling=kind != "DAPO",
        dynamic_sampling_max_rounds=args.ds_max_rounds,
    )


def check_same_settings(grpo: GRPOConfig, dapo: DAPOConfig) -> None:
    """Every `GRPOConfig` field must hold the same value in both configs."""
    differ = [
        f.name
        for f in dataclasses.fields(GRPOConfig)
        if getattr(grpo, f.name) != getattr(dapo, f.name) and f.name not in ("output_dir", "logging_dir")
    ]
    if differ:
        raise RuntimeError(f"GRPOConfig and DAPOConfig differ in {differ}: the comparison would not be like for like.")


def train(kind: str, config: GRPOConfig, *, model, reward, dataset, tokenizer, meter: TrainerCallback):
    """Train `kind`'s trainer (`GRPOTrainer` for "GRPO", else `DAPOTrainer`) on `config`, timed by `meter`."""
    trainer_class = GRPOTrainer if kind == "GRPO" else DAPOTrainer
    trainer = trainer_class(
        model=model,
        reward_funcs=[reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[meter],
    )
    trainer.remove_callback(PrinterCallback)  # disable_tqdm would print every log dict
    trainer.train()
    return trainer


def run_once(kind: str, args: argparse.Namespace, weights: dict, tokenizer, dataset) -> dict:
    with tempfile.TemporaryDirectory() as output_dir:
        config = build_config(kind, args, output_dir)
        model = build_tiny_model(tokenizer, seed=args.seed)
        model.load_state_dict(weights)
        timer = StepTimer()
        trainer = train(
            kind, config, model=model, reward=toy_reward, dataset=dataset, tokenizer=tokenizer, meter=timer
        )
    history = trainer.state.log_history[args.warmup : args.warmup + args.steps]

    def logged(key: str) -> list[float]:
        return [h[key] for h in history if key in h]

    return {
        "times": timer.times[args.warmup :],
        "cpu_times": timer.cpu_times[args.warmup :],
        "rounds": logged("dynamic_sampling/rounds"),
        "generated": logged("dynamic_sampling/groups_generated"),
        "underfilled": logged("dynamic_sampling/underfilled"),
    }


def mean_or_none(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(t for run in runs for t in run[key])


def format_table(runs: dict[str, list[dict]], args: argparse.Namespace) -> str:
    lines = [
        "| trainer | median step, wall (s) | ratio to GRPO | median step, CPU (s) | ratio to GRPO | "
        "CPU ratio per repetition | rounds/step | groups generated/step | underfilled |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for kind in KINDS:
        wall, cpu = _median(runs[kind], "times"), _median(runs[kind], "cpu_times")
        per_rep = [
            statistics.median(run["cpu_times"]) / statistics.median(ref["cpu_times"])
            for run, ref in zip(runs[kind], runs["GRPO"], strict=True)
        ]
        rounds = mean_or_none([r for run in runs[kind] for r in run["rounds"]])
        generated = mean_or_none([g for run in runs[kind] for g in run["generated"]])
        underfilled = mean_or_none([u for run in runs[kind] for u in run["underfilled"]])
        lines.append(
            f"| {kind} | {wall:.4f} | {wall / _median(runs['GRPO'], 'times'):.3f} | {cpu:.4f} | "
            f"{cpu / _median(runs['GRPO'], 'cpu_times'):.3f} | {', '.join(f'{r:.2f}' for r in per_rep)} | "
            f"{'1' if rounds is None else f'{rounds:.2f}'} | "
            f"{args.prompts if generated is None else f'{generated:.1f}'} | "
            f"{'-' if underfilled is None else f'{underfilled:.0%}'} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="No SFT warm-up, 2 repetitions of 3 steps, one round.")
    parser.add_argument("--repetitions", type=int, default=8, help="Interleaved runs of each trainer.")
    parser.add_argument("--steps", type=int, default=10, help="Measured optimizer steps per run.")
    parser.add_argument("--warmup", type=int, default=2, help="Optimizer steps dropped at the start of every run.")
    parser.add_argument("--prompts", type=int, default=8, help="Prompts (groups) per optimizer step.")
    parser.add_argument("--num-generations", type=int, default=8, help="Group size G.")
    parser.add_argument("--max-completion-length", type=int, default=16, help="Completion cap in tokens.")
    parser.add_argument("--sft-steps", type=int, default=300, help="Supervised warm-up steps before RL (0: none).")
    parser.add_argument("--ds-max-rounds", type=int, default=10, help="dynamic_sampling_max_rounds (DS run only).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the model and data.")
    args = parser.parse_args(argv)
    if args.quick:
        args.repetitions, args.steps, args.warmup, args.sft_steps, args.ds_max_rounds = 2, 3, 1, 0, 1
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, list[dict]]:
    args = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    start = time.perf_counter()

    tokenizer = build_char_tokenizer()
    dataset = make_math_dataset(512, seed=args.seed, level_weights=LEVEL_WEIGHTS)
    model = build_tiny_model(tokenizer, seed=args.seed)
    if args.sft_steps:
        sft_data = make_math_dataset(2000, seed=args.seed + 1, level_weights=LEVEL_WEIGHTS)
        warmup_sft(model, tokenizer, sft_data, steps=args.sft_steps, seed=args.seed, progress=False)
    weights = {k: v.clone() for k, v in model.state_dict().items()}

    with tempfile.TemporaryDirectory() as output_dir:
        configs = {kind: build_config(kind, args, output_dir) for kind in KINDS}
    check_same_settings(configs["GRPO"], configs["DAPO"])

    runs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for _ in range(args.repetitions):
        for kind in KINDS:
            runs[kind].append(run_once(kind, args, weights, tokenizer, dataset))

    print(
        f"Overhead: {args.prompts} prompts x G={args.num_generations} x {args.max_completion_length} tokens per "
        f"optimizer step, {args.repetitions} interleaved repetitions x {args.steps} steps (after {args.warmup} "
        f"warm-up), SFT warm-up {args.sft_steps} steps, torch threads {torch.get_num_threads()}, "
        f"dynamic_sampling_max_rounds={args.ds_max_rounds}\n"
    )
    print(format_table(runs, args) + "\n")
    for label, key in (("CPU", "cpu_times"), ("wall", "times")):
        ratio = _median(runs["DAPO"], key) / _median(runs["GRPO"], key)
        verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
        print(
            f"DAPO / GRPO step time ({label}), no dynamic sampling or overlong shaping: {ratio:.3f} ({verdict} <= "
            f"{TARGET_RATIO})"
        )
    print(f"({time.perf_counter() - start:.0f} s)")
    return runs


if __name__ == "__main__":
    hf_logging.set_verbosity_error()
    logging.getLogger("dapo_trl").setLevel(logging.ERROR)  # underfilled-batch warnings of an untrained model
    main()
