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

What is measured, from the allocation and free events of PyTorch's profiler (`profile_memory=True`) during the second
optimizer step (the first allocates the optimizer's states), as CPU memory held by tensors:
- whole step: the peak over the step (generation, scoring, assembly, loss, backward, optimizer), above the level at
  the step's start;
- batch preparation: the same peak, while the batch is prepared (the training call of
  `_generate_and_score_completions`: generation, scoring and, with dynamic sampling, the rounds and the assembly);
- assembly peak: the same peak from the end of the step's last generation call to the end of batch preparation (TRL
  turns the generated tokens into the batch; dynamic sampling also selects, pads and moves the rows of its rounds),
  plus the carried rows held when the step began (they are freed during it, so the level at the start counts them);
- rows held: the bytes of the batch each process keeps once it is assembled: GRPOTrainer's returned batch; for
  dynamic sampling, what `_assemble_batch` returns (the batch and its per-row facts) and the carried rows.
The last two are the batch memory that grew with the process count when every process gathered the whole batch.
Model weights, optimizer states and Python objects are left out; what remains is what grows with the batch.

With `--before REV` (e.g. `--before 90ece8f`, the last commit where the assembled batch was gathered onto every
process), DAPOTrainer is measured a second time, as of that commit: its `src/` is exported with `git archive` into a
temporary folder and the same measurement runs in a fresh process (or processes) with that folder first on
`PYTHONPATH` (the module each process loaded is checked). Its ratios are against the same GRPOTrainer figures.

Launch:
```
OMP_NUM_THREADS=1 python benchmarks/memory.py            # batches of 16-128 completions of 256 tokens
OMP_NUM_THREADS=1 python benchmarks/memory.py --quick    # one batch of 8 completions of 16 tokens
OMP_NUM_THREADS=1 python benchmarks/memory.py --processes 1 2 4 --rows 32 --max-completion-length 128 \
    --informative-every 1 --before 90ece8f
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
GENERATION = "memory_benchmark/generation"


class StepMemory(TrainerCallback):
    """
    Profiles the tensor memory of optimizer step `step` (1-based): its peak above the level at the step's start, over
    the whole step, while the batch is prepared (the training call of `_generate_and_score_completions`, marked by
    [`mark_preparation`]) and while it is assembled (from the end of the last generation call of the preparation to
    its end, plus the carried rows `trainer` held when the step began).
    """

    def __init__(self, step: int) -> None:
        self.step = step
        self.trainer = None  # set once the trainer exists: its carried rows are read when the step begins
        self.peak_bytes: int | None = None
        self.preparation_peak_bytes: int | None = None
        self.assembly_peak_bytes: int | None = None
        self._carried_at_start = 0
        self._profiler = None

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            self._carried_at_start = tensor_bytes(getattr(self.trainer, "_carry", None))
            self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._profiler.start()

    def on_step_end(self, args, state, control, **kwargs):
        if self._profiler is not None and state.global_step == self.step:
            self._profiler.stop()
            # The raw events: building the profiler's event tree (`events()`) takes minutes for a generation step.
            raw = self._profiler.profiler.kineto_results.events()
            changes = [(e.start_ns(), e.nbytes()) for e in raw if e.name() == "[memory]"]
            windows = [(e.start_ns(), e.start_ns() + e.duration_ns()) for e in raw if e.name() == PREPARATION]
            generations = [e.start_ns() + e.duration_ns() for e in raw if e.name() == GENERATION]
            self.peak_bytes = peak_allocated(changes)
            self.preparation_peak_bytes = max((peak_allocated(changes, window) for window in windows), default=0)
            assembly = [after_last(generations, window) for window in windows]
            self.assembly_peak_bytes = self._carried_at_start + max(
                (peak_allocated(changes, window) for window in assembly), default=0
            )
            self._profiler = None


def after_last(ends: list[int], window: tuple[int, int]) -> tuple[int, int]:
    """
    The part of `window` (`(start, end)`) after the last of `ends` inside it (all of it when none is inside).

    Example:
    ```python
    >>> after_last([5, 12, 30], (10, 20)), after_last([30], (10, 20))
    ((12, 20), (10, 20))

    ```
    """
    return max((end for end in ends if window[0] <= end <= window[1]), default=window[0]), window[1]


def tensor_bytes(*values) -> int:
    """Bytes of the tensors in `values` (dicts, tuples and lists searched), each storage counted once."""
    storages: dict[int, int] = {}

    def visit(value) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, (tuple, list)):
            for item in value:
                visit(item)

    for value in values:
        visit(value)
    return sum(storages.values())


def mark_preparation(trainer, memory: StepMemory) -> None:
    """
    Label each training call of the trainer's `_generate_and_score_completions` and each generation call in the
    profile, and count the rows the trainer holds once the batch is assembled (`trainer.rows_held`, in bytes).
    """
    memory.trainer = trainer
    prepare, generate = trainer._generate_and_score_completions, trainer._generate
    assemble = getattr(trainer, "_assemble_batch", None)  # dynamic sampling's assembly (DAPOTrainer)

    def marked_generate(*args, **kwargs):
        with record_function(GENERATION):
            return generate(*args, **kwargs)

    def marked_assemble(*args, **kwargs):
        out = assemble(*args, **kwargs)
        trainer.rows_held = tensor_bytes(out, trainer._carry)  # the batch, its per-row facts, the carried rows
        return out

    def marked(inputs):
        with record_function(PREPARATION):
            out = prepare(inputs)
        if assemble is None:
            trainer.rows_held = tensor_bytes(out)  # GRPOTrainer keeps the batch it returns, nothing else
        return out

    trainer._generate_and_score_completions, trainer._generate = marked, marked_generate
    if assemble is not None:
        trainer._assemble_batch = marked_assemble


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
    """Peak step memory (bytes) of `kind` ("GRPO" or "DAPO"), the rows it holds and, for DAPO, the rows generated."""
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
        mark_preparation(trainer, memory)
        trainer.train()
    logged = [h for h in trainer.state.log_history if h.get("step") == MEASURED_STEP and "loss" in h]
    generated = logged[0].get("dynamic_sampling/groups_generated") if logged else None
    return {
        "peak": memory.peak_bytes,
        "preparation": memory.preparation_peak_bytes,
        "assembly": memory.assembly_peak_bytes,
        "rows": trainer.rows_held,
        "generated_rows": None if generated is None else generated * args.num_generations,
    }


KINDS = ("GRPO", "DAPO")
PER_PROCESS = ("peak", "preparation", "assembly", "rows")  # the figures taken as the largest of any process


def run_here(args: argparse.Namespace) -> list[dict]:
    results = []
    for rows in args.rows:
        grpo = measure("GRPO", rows, 1, args) if "GRPO" in args.kinds else None
        for every in args.informative_every:
            dapo = measure("DAPO", rows, every, args) if "DAPO" in args.kinds else None
            results.append({"rows": rows, "every": every, "grpo": grpo, "dapo": dapo})
    return results


def run_on(processes: int, args: argparse.Namespace, *, source: str | None = None, kinds=KINDS) -> list[dict]:
    """
    `run_here` for `kinds` on `processes` processes (torchrun, or one plain process), with `source` first on the
    Python path when given; each figure is the largest of any process.
    """
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable]
        if processes > 1:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            cmd += ["-m", "torch.distributed.run", f"--nproc_per_node={processes}", f"--master_port={port}"]
        cmd += [os.path.abspath(__file__), "--worker-out", out, "--rows", *map(str, args.rows)]
        cmd += ["--informative-every", *map(str, args.informative_every), "--kinds", *kinds]
        cmd += ["--num-generations", str(args.num_generations)]
        cmd += ["--max-completion-length", str(args.max_completion_length)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if source is not None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
        subprocess.run(cmd, check=True, env=env)
        ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(processes)]
    for rank in ranks:
        if source is not None and not rank["module"].startswith(source):
            raise RuntimeError(f"A process loaded dapo_trl from {rank['module']}, not from {source}.")
    results = ranks[0]["results"]
    for i, result in enumerate(results):
        for kind in ("grpo", "dapo"):
            if result[kind] is not None:
                for key in PER_PROCESS:
                    result[kind][key] = max(rank["results"][i][kind][key] for rank in ranks)
    return results


def export_source(revision: str, into: str) -> str:
    """The `src/` folder of the project as of `revision` (`git archive`), written under `into`; its path."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    archive = subprocess.run(["git", "-C", root, "archive", revision, "src"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return os.path.join(into, "src")


def run(args: argparse.Namespace) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory() as before:
        source = export_source(args.before, before) if args.before else None
        for processes in args.processes:
            measured = run_here(args) if processes == 1 else run_on(processes, args)
            earlier = run_on(processes, args, source=source, kinds=("DAPO",)) if source else [{}] * len(measured)
            for result, old in zip(measured, earlier, strict=True):
                results.append({**result, "processes": processes, "dapo_before": old.get("dapo")})
    return results


def _mb(value: int) -> str:
    return f"{value / 2**20:.3f}"


def format_table(results: list[dict], args: argparse.Namespace) -> str:
    before = f" | DAPO at {args.before}: rows held | ratio | assembly peak | ratio" if args.before else ""
    lines = [
        f"Tensor memory (MB) of one optimizer step, completions of {args.max_completion_length} tokens, "
        f"num_generations={args.num_generations}, largest of any process:",
        "",
        "| processes | batch per process (completions) | informative every | rows generated (DAPO, all processes) | "
        "rows held: GRPO | DAPO | ratio | assembly peak: GRPO | DAPO | ratio | "
        f"batch preparation: GRPO | DAPO | ratio | whole step: GRPO | DAPO | ratio{before} |",
        "|" + "---:|" * (16 + 4 * bool(args.before)),
    ]
    for r in results:
        grpo, dapo, old = r["grpo"], r["dapo"], r.get("dapo_before")
        generated = "-" if dapo["generated_rows"] is None else f"{dapo['generated_rows']:.0f}"
        cells = [str(r.get("processes", 1)), str(r["rows"]), str(r["every"]), generated]
        for key in ("rows", "assembly", "preparation", "peak"):
            cells += [_mb(grpo[key]), _mb(dapo[key]), f"{dapo[key] / grpo[key]:.2f}"]
        if args.before:
            cells += [_mb(old["rows"]), f"{old['rows'] / grpo['rows']:.2f}"]
            cells += [_mb(old["assembly"]), f"{old['assembly'] / grpo['assembly']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    equal = [r for r in results if r["every"] == 1]
    if equal:
        worst = max(max(r["dapo"][k] / r["grpo"][k] for k in ("rows", "assembly", "peak")) for r in equal)
        verdict = "within" if worst <= LIMIT_RATIO else "ABOVE"
        lines += [
            "",
            f"Largest DAPO/GRPO ratio at equal rows (rows held, assembly peak, whole step): {worst:.2f} "
            f"({verdict} the {LIMIT_RATIO}x bound).",
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
    parser.add_argument(
        "--before", metavar="REV", help="Also measure DAPOTrainer as of this commit (e.g. 90ece8f: batch gathered)."
    )
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)  # set by `run_on` for the processes it starts
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.informative_every, args.max_completion_length = [8], [1, 3], 16
    return args


def main(argv: Sequence[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    torch.manual_seed(0)
    if args.worker_out:  # one of the processes `run_on` started
        import dapo_trl

        with quiet_logs():
            results = run_here(args)
        rank = int(os.environ.get("RANK", 0))
        with open(os.path.join(args.worker_out, f"rank{rank}.json"), "w") as f:
            json.dump({"module": os.path.abspath(dapo_trl.__file__), "results": results}, f)
        return results
    with quiet_logs():  # warnings by design; levels restored after (tests run this in-process)
        results = run(args)
    print(format_table(results, args))
    return results


if __name__ == "__main__":
    main()
