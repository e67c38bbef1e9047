"""
The batch plan of a run: what a rollout step and an optimizer update hold, on a given number of processes.

TRL's batch settings are per process, so the same YAML trains a different batch on every cluster size: the DAPO
paper's 512 prompts x 16 samples per rollout step with 16 updates of 512 completions (§4.1) come out of
`configs/dapo_qwen2.5_32b.yaml` only on exactly 128 processes. These pure functions turn the settings and a process
count into the effective plan, compare it with the paper's and with the plan a recipe states, and find the settings
that restore a recipe's plan on another process count. `examples/train_math.py --print_plan` prints them.

With P processes, `per_device_train_batch_size` b, `gradient_accumulation_steps` A, `steps_per_generation` S,
`num_iterations` mu and G samples per prompt (TRL's `GRPOTrainer`):

- completions per rollout step (TRL's generation batch) = b * S * P, i.e. b * S * P / G prompts;
- completions per optimizer update = b * A * P;
- optimizer updates per rollout step = S * mu / A;
- with dynamic sampling, the rollout step is filled with (b * S * P) / G informative groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# DAPO §4.1: "prompt batch size 512, 16 responses per prompt; mini-batch 512, i.e. 16 gradient updates per rollout
# step; linear warm-up over 20 rollout steps; at most 20,480 generated tokens (16,384 + 4,096 soft punishment cache)".
PAPER = {
    "prompts_per_rollout": 512,
    "num_generations": 16,
    "completions_per_update": 512,
    "updates_per_rollout": 16,
    "warmup_rollout_steps": 20,
    "max_completion_length": 20480,
}


@dataclass(frozen=True)
class BatchPlan:
    """The effective batch of a run on `num_processes` processes (see the module docstring for the arithmetic)."""

    num_processes: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    steps_per_generation: int
    num_iterations: int
    num_generations: int
    warmup_optimizer_steps: int
    max_completion_length: int
    max_prompt_length: int | None
    dynamic_sampling: bool

    @property
    def completions_per_rollout(self) -> int:
        return self.per_device_train_batch_size * self.steps_per_generation * self.num_processes

    @property
    def prompts_per_rollout(self) -> float:
        return self.completions_per_rollout / self.num_generations

    @property
    def completions_per_update(self) -> int:
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * self.num_processes

    @property
    def updates_per_rollout(self) -> float:
        return self.steps_per_generation * self.num_iterations / self.gradient_accumulation_steps

    @property
    def warmup_rollout_steps(self) -> float:
        return self.warmup_optimizer_steps / self.updates_per_rollout

    @property
    def dynamic_sampling_groups(self) -> int | None:
        return self.completions_per_rollout // self.num_generations if self.dynamic_sampling else None

    def problems(self) -> list[str]:
        """What TRL or DAPOConfig would refuse at this process count."""
        out = []
        if self.completions_per_rollout % self.num_generations:
            out.append(
                f"{self.completions_per_rollout} completions per rollout step is not a multiple of num_generations "
                f"({self.num_generations}): TRL refuses it"
            )
        return out


def batch_plan(args: Any, num_processes: int) -> BatchPlan:
    """
    The plan of a `DAPOConfig` / `GRPOConfig` on `num_processes` processes.

    `args` may be a built config or the unchecked values of one (`--print_plan` plans for a process count other than
    this machine's, on which the config would not build): `steps_per_generation` defaults, as TRL resolves it, to
    `generation_batch_size / (per_device_train_batch_size * num_processes)` when that is set, else to
    `gradient_accumulation_steps`; a warm-up given as a ratio (`warmup_steps < 1`) is converted with `max_steps`.
    """
    if num_processes < 1:
        raise ValueError(f"num_processes must be at least 1, got {num_processes}.")
    steps_per_generation = args.steps_per_generation
    generation_batch_size = getattr(args, "generation_batch_size", None)
    if not steps_per_generation and generation_batch_size:
        steps_per_generation = max(1, generation_batch_size // (args.per_device_train_batch_size * num_processes))
    steps_per_generation = steps_per_generation or args.gradient_accumulation_steps
    warmup = args.warmup_steps or 0
    if 0 < warmup < 1:
        warmup = math.ceil(warmup * max(args.max_steps, 0))
    return BatchPlan(
        num_processes=num_processes,
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        steps_per_generation=steps_per_generation,
        num_iterations=args.num_iterations,
        num_generations=args.num_generations,
        warmup_optimizer_steps=int(warmup),
        max_completion_length=args.max_completion_length,
        max_prompt_length=getattr(args, "max_prompt_length", None),
        dynamic_sampling=bool(getattr(args, "dynamic_sampling", False)),
    )


def paper_differences(plan: BatchPlan) -> list[str]:
    """Each value of `plan` that differs from DAPO §4.1's, as `"name: value (paper: value)"`."""
    ours = {
        "prompts_per_rollout": plan.prompts_per_rollout,
        "num_generations": plan.num_generations,
        "completions_per_update": plan.completions_per_update,
        "updates_per_rollout": plan.updates_per_rollout,
        "warmup_rollout_steps": plan.warmup_rollout_steps,
        "max_completion_length": plan.max_completion_length,
    }
    return [
        f"{name.replace('_', ' ')}: {_num(value)} (paper: {_num(PAPER[name])})"
        for name, value in ours.items()
        if not math.isclose(value, PAPER[name])
    ]


def recipe_differences(
    plan: BatchPlan, *, prompts_per_rollout: int | None, completions_per_update: int | None
) -> list[str]:
    """Each value of `plan` that differs from the plan a recipe states (`None`: not stated)."""
    out = []
    if prompts_per_rollout is not None and not math.isclose(plan.prompts_per_rollout, prompts_per_rollout):
        out.append(f"prompts per rollout step: {_num(plan.prompts_per_rollout)} (recipe: {prompts_per_rollout})")
    if completions_per_update is not None and plan.completions_per_update != completions_per_update:
        out.append(f"completions per update: {plan.completions_per_update} (recipe: {completions_per_update})")
    return out


def settings_for(plan: BatchPlan, *, prompts_per_rollout: int, completions_per_update: int) -> dict[str, int] | None:
    """
    Batch settings that give `prompts_per_rollout` prompts per rollout step and `completions_per_update` completions
    per optimizer update on `plan.num_processes` processes, changing as little as possible: the same
    `per_device_train_batch_size` when it divides, else the largest one that does. `None` when no integer setting
    reaches that plan on this many processes.

    Example:
    ```python
    >>> from types import SimpleNamespace
    >>> args = SimpleNamespace(per_device_train_batch_size=1, gradient_accumulation_steps=4, steps_per_generation=64,
    ...                        num_iterations=1, num_generations=16, warmup_steps=320, max_steps=16000,
    ...                        max_completion_length=20480)
    >>> settings_for(batch_plan(args, 64), prompts_per_rollout=512, completions_per_update=512)
    {'gradient_accumulation_steps': 8, 'steps_per_generation': 128}

    ```
    """
    rollout = prompts_per_rollout * plan.num_generations
    processes = plan.num_processes
    for per_device in range(plan.per_device_train_batch_size, 0, -1):
        step = per_device * processes
        if completions_per_update % step or rollout % step:
            continue
        accumulation, steps = completions_per_update // step, rollout // step
        if (steps * plan.num_iterations) % accumulation:
            continue
        out = {"gradient_accumulation_steps": accumulation, "steps_per_generation": steps}
        if per_device != plan.per_device_train_batch_size:
            out = {"per_device_train_batch_size": per_device, **out}
        return out
    return None


def format_plan(plan: BatchPlan, *, recipe: dict[str, int | None] | None = None) -> str:
    """
    The plan as the lines `train_math.py --print_plan` prints; `recipe` holds the plan a recipe states, as the
    keyword arguments of [`recipe_advice`].
    """
    g = plan.num_generations
    prompt_limit = (
        f"prompts up to {plan.max_prompt_length} tokens"
        if plan.max_prompt_length
        else "prompts uncut (no max_prompt_length)"
    )
    rows = [
        ("processes", f"{plan.num_processes}"),
        (
            "settings per process",
            f"per_device_train_batch_size {plan.per_device_train_batch_size}, gradient_accumulation_steps "
            f"{plan.gradient_accumulation_steps}, steps_per_generation {plan.steps_per_generation}, num_iterations "
            f"{plan.num_iterations}",
        ),
        (
            "rollout step",
            f"{_num(plan.prompts_per_rollout)} prompts x {g} samples = {plan.completions_per_rollout} completions",
        ),
        (
            "optimizer update",
            f"{plan.completions_per_update} completions ({_num(plan.completions_per_update / g)} prompts x {g})",
        ),
        ("updates per rollout step", _num(plan.updates_per_rollout)),
        (
            "warm-up",
            f"{plan.warmup_optimizer_steps} optimizer steps = {_num(plan.warmup_rollout_steps)} rollout steps",
        ),
        (
            "dynamic sampling target",
            f"{plan.dynamic_sampling_groups} informative groups per rollout step" if plan.dynamic_sampling else "off",
        ),
        ("max sequence length", f"{prompt_limit} + {plan.max_completion_length} completion tokens"),
    ]
    lines = [f"{name:<26}{value}" for name, value in rows]
    differences = paper_differences(plan)
    lines.append(f"{'differs from DAPO §4.1':<26}{'; '.join(differences) if differences else 'nothing'}")
    lines.extend(f"{'cannot run':<26}{problem}" for problem in plan.problems())
    if recipe and any(value is not None for value in recipe.values()):
        advice = recipe_advice(plan, **recipe)
        lines.append(f"{'recipe plan':<26}{advice or 'reached'}")
    else:
        lines.append(f"{'recipe plan':<26}not stated (recipe_prompts_per_rollout, recipe_completions_per_update)")
    return "\n".join(lines)


def recipe_advice(
    plan: BatchPlan,
    *,
    prompts_per_rollout: int | None,
    completions_per_update: int | None,
    num_processes: int | None = None,
) -> str | None:
    """`None` when `plan` is the recipe's plan (or the recipe states none), else what differs and what to set."""
    differences = recipe_differences(
        plan, prompts_per_rollout=prompts_per_rollout, completions_per_update=completions_per_update
    )
    if not differences:
        return None
    written_for = f", written for {_processes(num_processes)}" if num_processes else ""
    text = f"this run's plan differs from its recipe's{written_for}: {'; '.join(differences)}. "
    fix = None
    if prompts_per_rollout is not None and completions_per_update is not None:
        fix = settings_for(
            plan, prompts_per_rollout=prompts_per_rollout, completions_per_update=completions_per_update
        )
    if fix:
        flags = " ".join(f"--{name} {value}" for name, value in fix.items())
        return text + f"To keep the recipe's plan on {_processes(plan.num_processes)}, set {flags}."
    return text + f"No integer batch settings reach the recipe's plan on {_processes(plan.num_processes)}."


def _processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3g}"
