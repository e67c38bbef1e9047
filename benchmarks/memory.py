"""Peak host memory of one dynamic-sampling step against `GRPOTrainer`'s, as the batch grows (tiny model, CPU).

Dynamic sampling holds more than a plain TRL step: the rows of every round until the batch is assembled, the
informative rows it keeps, the carried groups, and the copies assembly makes while it selects, sorts and pads rows.
This script measures what that costs. Both trainers get the same tiny model, data, seed and every `GRPOConfig`
setting, with long-ish completions (no end-of-sequence token: every completion runs to `max_completion_length`, so
the per-token tensors are as wide as they get). With `--processes P` (P > 1) the same run is started on P processes
(`torchrun`, gloo on CPU), each with the same per-process batch, and the table shows the largest peak of any process:
GRPOTrainer's does not grow with P, and neither should dynamic sampling's (each process receives only the rows it
trains).

The reward alternates +1/-1 along the rows of every group, so with `informative every 1` every group is informative
and dynamic sampling needs one round of exactly the generation batch: the comparison is at equal rows generated and
trained. With `informative every k`, only one group in `k` is, and dynamic sampling generates about `k` times the
rows (in one or more rounds) to train the same batch: the comparison is at equal batch trained.

What is measured: the peak of the CPU memory held by tensors during the second optimizer step (generation, scoring,
assembly, loss, backward, optimizer), above what was held when the step began, from the allocation and free events
of PyTorch's profiler (`profile_memory=True`). The first step is not measured (it allocates the optimizer's states).
Model weights, optimizer states and Python objects are left out; what remains is what grows with the batch.

Launch:
```
OMP_NUM_THREADS=1 python benchmarks/memory.py            # batches of 16-128 completions of 256 tokens
OMP_NUM_THREADS=1 python benchmarks/memory.py --quick    # one batch of 8 completions of 16 tokens
OMP_NUM_THREADS=1 python benchmarks/memory.py --processes 1 2 4 --rows 128 --informative-every 1 3
```
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from dapo_trl.dapo_config import DAPOConfig  # noqa: E402
from dapo_trl.dapo_trainer import DAPOTrainer  # noqa: E402
from dapo_trl.run.console import quiet_logs  # noqa: E402
from dapo_trl.run.toy import build_char_tokenizer, build_tiny_model  # noqa: E402

LIMIT_RATIO = 1.5  # issue 21: bound the growth if dynamic sampling exceeds 1.5x GRPOTrainer's peak at equal batch
MEASURED_STEP = 2


class AlternatingReward:
    """+1/-1 along each group's rows for one group in `every` (informative), 0 for the others (uninformative)."""

    __name__ = "alternating"

    def __init__(self, num_generations: int, every: int) -> None:
        self.num_generations, self.every = num_generations, every

    def __call__(self, completions, index, **kwargs):
        out = []
        for row, prompt_index in enumerate(index):
            informative = prompt_index % self.every == 0
            out.append((1.0 if row % 2 == 0 else -1.0) if informative else 0.0)
        return out


PREPARATION = "memory_benchmark/batch_preparation"


class StepMemory(TrainerCallback):
    """
    Profiles the tensor memory of optimizer step `step` (1-based): its peak above the level at the step's start, over
    the whole step and while the batch is prepared (generation, scoring and, with dynamic sampling, the rounds and the
    assembly: the training call of `_generate_and_score_completions`, marked by [`mark_preparation`]).
    """

    def __init__(self, step: int) -> None:
        self.step = step
        self.peak_bytes: int | None = None
        self.preparation_peak_bytes: int | None = None
        self._profiler = None

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._profiler.start()

    def on_step_end(self, args, state, control, **kwargs):
        if self._profiler is not None and state.global_step == self.step:
            self._profiler.stop()
            # The raw events: building the profiler's event tree (`events()`) takes minutes for a generation step.
            raw = self._profiler.profiler.kineto_results.events()
            changes = [(e.start_ns(), e.nbytes()) for e in raw if e.name() == "[memory]"]
            windows = [(e.start_ns(), e.start_ns() + e.duration_ns()) for e in raw if e.name() == PREPARATION]
            self.peak_bytes = peak_allocated(changes)
            self.preparation_peak_bytes = max((peak_allocated(changes, window) for window in windows), default=0)
            self._profiler = None


def mark_preparation(trainer) -> None:
    """Label each training call of the trainer's `_generate_and_score_completions` in the profile."""
    prepare = trainer._generate_and_score_completions

    def marked(inputs):
        with record_function(PREPARATION):
            out = prepare(inputs)
        carry = getattr(trainer, "_carry", None) or {}
        held = [v for v in (*out.values(), *carry.values()) if isinstance(v, torch.Tensor)]
        trainer.rows_held = sum(v.numel() * v.element_size() for v in held)  # the batch this process keeps
        return out

    trainer._generate_and_score_completions = marked


def peak_allocated(changes, window: tuple[int, int] | None = None) -> int:
    """
    Peak of the running sum of `(time, bytes)` memory events (allocations positive, frees negative), in time order,
    taken over the events inside `window` (`(start, end)`, the running sum still starting from the first event).

    Example:
    ```python
    >>> peak_allocated([(0, 4), (1, 4), (2, -4), (3, 8), (4, -12)])
    12
    >>> peak_allocated([(0, 4), (1, 4), (2, -4), (3, 8), (4, -12)], window=(1, 2))
    8

    ```
    """
    current = peak = 0
    for time, change in sorted(changes):
        current += change
        if window is None or window[0] <= time <= window[1]:
            peak = max(peak, current)
    return peak


def settings(rows: int, args: argparse.Namespace, output_dir: str) -> dict:
    """Every setting both trainers get: one generation batch of `rows` completions per optimizer step."""
    return dict(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
        max_steps=MEASURED_STEP,
        learning_rate=1e-4,
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=rows,
        gradient_accumulation_steps=1,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        loss_type="dapo",
        beta=0.0,
        ddp_find_unused_parameters=False,
    )


def measure(kind: str, rows: int, every: int, args: argparse.Namespace) -> dict:
    """Peak step memory (bytes) of `kind` ("GRPO" or "DAPO") and, for DAPO, the rows it generated."""
    tokenizer = build_char_tokenizer()
    num_prompts = 4 * rows  # never an epoch boundary inside the measured steps
    dataset = Dataset.from_dict(
        {"prompt": [f"{i}+{i}=" for i in range(num_prompts)], "index": list(range(num_prompts))}
    )
    with tempfile.TemporaryDirectory() as output_dir:
        values = settings(rows, args, output_dir)
        values["generation_kwargs"] = {"suppress_tokens": [tokenizer.eos_token_id]}  # completions run to the cap
        if kind == "GRPO":
            config = GRPOConfig(**values)
        else:
            config = DAPOConfig(**values, overlong_shaping=False, dynamic_sampling=True, dynamic_sampling_max_rounds=8)
        memory = StepMemory(MEASURED_STEP)
        trainer = (GRPOTrainer if kind == "GRPO" else DAPOTrainer)(
            model=build_tiny_model(
                tokenizer, hidden_size=32, num_heads=2, max_position_embeddings=args.max_completion_length + 32
            ),
            reward_funcs=[AlternatingReward(args.num_generations, every)],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[memory],
        )
        trainer.remove_callback(PrinterCallback)
        mark_preparation(trainer)
        trainer.train()
    logged = [h for h in trainer.state.log_history if h.get("step") == MEASURED_STEP and "loss" in h]
    generated = logged[0].get("dynamic_sampling/groups_generated") if logged else None
    return {
        "peak": memory.peak_bytes,
        "preparation": memory.preparation_peak_bytes,
        "rows": trainer.rows_held,
        "generated_rows": None if generated is None else generated * args.num_generations,
    }


def run_here(args: argparse.Namespace) -> list[dict]:
    results = []
    for rows in args.rows:
        grpo = measure("GRPO", rows, 1, args)
        for every in args.informative_every:
            dapo = measure("DAPO", rows, every, args)
            results.append({"rows": rows, "every": every, "grpo": grpo, "dapo": dapo})
    return results


def run_on(processes: int, args: argparse.Namespace) -> list[dict]:
    """`run_here` on `processes` processes under torchrun; each figure is the largest of any process."""
    with tempfile.TemporaryDirectory() as out, socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}", f"--master_port={port}"]
        cmd += [os.path.abspath(__file__), "--worker-out", out, "--rows", *map(str, args.rows)]
        cmd += ["--informative-every", *map(str, args.informative_every)]
        cmd += ["--num-generations", str(args.num_generations)]
        cmd += ["--max-completion-length", str(args.max_completion_length)]
        subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(processes)]
    results = ranks[0]
    for i, result in enumerate(results):
        for kind in ("grpo", "dapo"):
            for key in ("peak", "preparation", "rows"):
                result[kind][key] = max(rank[i][kind][key] for rank in ranks)
    return results


def run(args: argparse.Namespace) -> list[dict]:
    results = []
    for processes in args.processes:
        for result in run_here(args) if processes == 1 else run_on(processes, args):
            results.append({**result, "processes": processes})
    return results


def format_table(results: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"Peak tensor memory (MB) of one optimizer step, completions of {args.max_completion_length} tokens, "
        f"num_generations={args.num_generations}, largest of any process:",
        "",
        "| processes | batch per process (completions) | informative every | rows generated (DAPO) | batch preparation: GRPO | DAPO | ratio | "
        "whole step: GRPO | DAPO | ratio | batch rows kept: GRPO | DAPO | ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        grpo, dapo = r["grpo"], r["dapo"]
        generated = "-" if dapo["generated_rows"] is None else f"{dapo['generated_rows']:.0f}"
        lines.append(
            f"| {r.get('processes', 1)} | {r['rows']} | {r['every']} | {generated} | {grpo['preparation'] / 2**20:.2f} | "
            f"{dapo['preparation'] / 2**20:.2f} | {dapo['preparation'] / grpo['preparation']:.2f} | "
            f"{grpo['peak'] / 2**20:.2f} | {dapo['peak'] / 2**20:.2f} | {dapo['peak'] / grpo['peak']:.2f} | "
            f"{grpo['rows'] / 2**20:.3f} | {dapo['rows'] / 2**20:.3f} | {dapo['rows'] / grpo['rows']:.2f} |"
        )
    equal = [r["dapo"]["peak"] / r["grpo"]["peak"] for r in results if r["every"] == 1]
    if equal:
        verdict = "within" if max(equal) <= LIMIT_RATIO else "ABOVE"
        lines += [
            "",
            f"Largest whole-step ratio at equal rows: {max(equal):.2f} ({verdict} the {LIMIT_RATIO}x bound).",
        ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="One small batch of short completions (CI smoke test).")
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64, 128], help="Completions per batch.")
    parser.add_argument("--informative-every", type=int, nargs="+", default=[1, 3], help="One informative group in k.")
    parser.add_argument("--num-generations", type=int, default=4, help="Completions per prompt (G).")
    parser.add_argument("--max-completion-length", type=int, default=256, help="Completion length in tokens.")
    parser.add_argument("--processes", type=int, nargs="+", default=[1], help="Process counts to measure on.")
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)  # set by `run_on` for the processes it starts
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.informative_every, args.max_completion_length = [8], [1, 3], 16
    return args


def main(argv: Sequence[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    torch.manual_seed(0)
    if args.worker_out:  # one of the processes `run_on` started
        with quiet_logs():
            results = run_here(args)
        rank = int(os.environ.get("RANK", 0))
        with open(os.path.join(args.worker_out, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        return results
    with quiet_logs():  # warnings by design; levels restored after (tests run this in-process)
        results = run(args)
    print(format_table(results, args))
    return results


if __name__ == "__main__":
    main()
