"""Probability ratio of carried groups against fresh ones, with several updates per rollout (tiny model, CPU).

With `dynamic_sampling_carry_over=True`, surplus informative groups of one generation batch are trained in the next
one, against the log-probabilities of the policy that sampled them. Every generation batch makes
`steps_per_generation * num_iterations / gradient_accumulation_steps` optimizer updates (16 in the paper's recipe), so a
carried row is that many updates stale at its first micro-step, while a fresh row starts at ratio 1. This script trains
a tiny model with carry-over and records, for every loss token, the ratio `pi_theta / pi_old` and the staleness of its
row (`dynamic_sampling/carried_staleness` is the logged mean), then prints the spread of the ratio by kind of row and
micro-step of the generation batch.

The reward is a stand-in that makes most groups informative from random weights (+1 for an even completion length,
-1 otherwise); the learning rate is high so that a few updates move the tiny policy as much as many updates move a
large one. Columns: `staleness` (updates since the sampling policy), `tokens`, `mean`, `std`, `p1` / `p99` of the ratio,
`clipped` (share of tokens outside `[1 - epsilon, 1 + epsilon_high]`, where the clip cuts the gradient of half of them).

Launch:
```
OMP_NUM_THREADS=1 python benchmarks/staleness.py              # steps_per_generation 4, 24 steps
OMP_NUM_THREADS=1 python benchmarks/staleness.py --quick      # a few seconds
OMP_NUM_THREADS=1 python benchmarks/staleness.py --steps-per-generation 8 --learning-rate 3e-3
```
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections import defaultdict
from collections.abc import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402

from dapo_trl.dapo_config import DAPOConfig  # noqa: E402
from dapo_trl.dapo_trainer import DAPOTrainer  # noqa: E402
from dapo_trl.run.console import quiet_logs  # noqa: E402
from dapo_trl.run.toy import build_char_tokenizer, build_tiny_model, make_math_dataset  # noqa: E402

STALENESS_KEY = "staleness_probe"  # per-row staleness travelling with the micro-batches (-1: fresh or padding)


def even_length_reward(completions: list, **kwargs) -> list[float]:
    return [1.0 if len(c) % 2 == 0 else -1.0 for c in completions]


class StalenessProbe(DAPOTrainer):
    """Records, for each loss token, its probability ratio and the staleness of its row."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records: dict[tuple[str, int, int], list[torch.Tensor]] = defaultdict(list)
        self._probe_logps: torch.Tensor | None = None

    def _local_rows(self, batch: dict) -> dict:
        local = super()._local_rows(batch)  # `batch`: this process's rows
        carried = (batch["_group"] >= 0) & (batch["_group"] < self._carry_groups_before)
        staleness = torch.where(carried, self._policy_updates - batch["_sampled_at"], -1)
        local[STALENESS_KEY] = staleness
        return local

    def _assemble_batch(self, step):
        self._carry_groups_before = step.num_carried
        return super()._assemble_batch(step)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if kwargs.get("compute_entropy") and self.model.training:
            self._probe_logps = out[0].detach()
        return out

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        old = inputs.get("old_per_token_logps")
        if old is not None and self._probe_logps is not None:
            micro_step = self._step % (self.args.steps_per_generation * self.num_iterations)
            ratio = torch.exp(self._probe_logps - old)
            mask = inputs["completion_mask"].bool()
            for row, staleness in enumerate(inputs[STALENESS_KEY].tolist()):
                kind = "carried" if staleness >= 0 else "fresh"
                self.records[kind, micro_step, max(staleness, 0) + micro_step].append(ratio[row][mask[row]])
        return loss


def run(args: argparse.Namespace) -> StalenessProbe:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=64, seed=args.seed)
    dataset = make_math_dataset(512, seed=args.seed)
    with tempfile.TemporaryDirectory() as output_dir:
        config = DAPOConfig(
            output_dir=output_dir,
            use_cpu=True,
            bf16=False,
            activation_checkpointing=False,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            seed=args.seed,
            max_steps=args.steps,
            learning_rate=args.learning_rate,
            lr_scheduler_type="constant",
            warmup_steps=0,
            per_device_train_batch_size=args.groups * 8 // args.steps_per_generation,
            steps_per_generation=args.steps_per_generation,
            gradient_accumulation_steps=1,
            num_generations=8,
            max_completion_length=16,
            overlong_shaping=False,
            dynamic_sampling_carry_over=True,
            dynamic_sampling_round_sizing="fixed",  # 3x the batch per round: surplus groups to carry
        )
        trainer = StalenessProbe(
            model=model,
            reward_funcs=[even_length_reward],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
        )
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    return trainer


def format_table(trainer: StalenessProbe, epsilon: float = 0.2, epsilon_high: float = 0.28) -> str:
    lines = [
        "| rows | micro-step | staleness | tokens | mean | std | p1 | p99 | clipped |",
        "|------|-----------:|----------:|-------:|-----:|----:|---:|----:|--------:|",
    ]
    for (kind, micro_step, staleness), parts in sorted(trainer.records.items()):
        ratio = torch.cat(parts).double()
        if ratio.numel() == 0:
            continue
        clipped = ((ratio < 1 - epsilon) | (ratio > 1 + epsilon_high)).double().mean().item()
        p1, p99 = torch.quantile(ratio, torch.tensor([0.01, 0.99], dtype=torch.float64)).tolist()
        lines.append(
            f"| {kind} | {micro_step} | {staleness} | {ratio.numel()} | {ratio.mean():.4f} | {ratio.std():.4f} | "
            f"{p1:.4f} | {p99:.4f} | {clipped:.1%} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="8 steps.")
    parser.add_argument("--steps", type=int, default=24, help="Optimizer steps.")
    parser.add_argument("--steps-per-generation", type=int, default=4, help="Updates per rollout (GA is 1).")
    parser.add_argument("--groups", type=int, default=4, help="Prompt groups of 8 completions per generation batch.")
    parser.add_argument("--learning-rate", type=float, default=1e-3, help="Learning rate.")
    parser.add_argument("--seed", type=int, default=0, help="Random seed.")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = 8
    return args


def main(argv: Sequence[str] | None = None) -> StalenessProbe:
    args = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with quiet_logs():  # warnings by design; levels restored after (tests run this in-process)
        trainer = run(args)
    staleness = [
        h["dynamic_sampling/carried_staleness"]
        for h in trainer.state.log_history
        if "dynamic_sampling/carried_staleness" in h
    ]
    print(
        f"steps_per_generation={args.steps_per_generation}, gradient_accumulation_steps=1, num_iterations=1, "
        f"lr={args.learning_rate:g}: logged dynamic_sampling/carried_staleness {sorted(set(staleness))}"
    )
    print(format_table(trainer))
    return trainer


if __name__ == "__main__":
    main()
