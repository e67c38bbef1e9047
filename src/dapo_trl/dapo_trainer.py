"""[`DAPOTrainer`]: TRL's `GRPOTrainer` with the DAPO recipe (arXiv 2503.14476).

Glue only. Every decision lives in a pure module (`advantages`, `loss`, `overlong`, `sampling`, `metrics`,
`reward_checks`, `_batch`); this class connects them to TRL at a few documented override points and never copies a
TRL private method:

| override                                | why                                                                        |
|-----------------------------------------|----------------------------------------------------------------------------|
| `_calculate_rewards`                    | check each reward's output, keep the gathered rewards, add the overlong penalty |
| `_generate_and_score_completions`       | run generation rounds until the batch holds only informative groups; advantages with the penalty |
| `get_train_dataloader`                  | with dynamic sampling, the dataloader only paces the steps                 |
| `_prepare_inputs`                       | replace TRL's approximate token normaliser by the exact per-step count     |
| `_get_per_token_logps_and_entropies`    | keep the loss forward's log-probabilities (monitors, carried rows' ratio)  |
| `_compute_loss`                         | log those monitors (the loss itself is TRL's)                              |
| `_save_checkpoint` / `_load_optimizer_and_scheduler` | save and restore the sampler state and a half-used generation batch |

`tests/test_trl_compat.py` pins the signatures of these TRL methods, so a TRL release that changes one fails loudly.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from datasets import IterableDataset
from torch import nn
from trl import GRPOConfig, GRPOTrainer

from . import _batch
from .advantages import compute_advantages, nanstd
from .dapo_config import DAPOConfig
from .loss import trl_num_items_for_exact_normalizer, window_token_counts
from .metrics import merge_completion_metrics, merge_metric
from .overlong import OverlongPenalty, is_truncated
from .prompt_source import DatasetPrompts, StreamPrompts
from .reward_checks import check_reward_funcs, check_reward_output, checked_reward
from .sampling import GroupClassification, RoundPlanner, SelectionPlan, classify_groups, plan_selection

logger = logging.getLogger(__name__)

SAMPLER_STATE_NAME = "dapo_sampler_state.pt"
BUFFER_STATE_NAME = "dapo_generation_buffer_rank{rank}.pt"
# TRL's metrics that DAPOTrainer recomputes over all rows a generation batch generated (see `_merge_call_metrics`).
_REWARD_METRICS = ("reward", "reward_std", "frac_reward_zero_std")


@dataclass
class _Round:
    """One generation round of dynamic sampling, scored: this process's rows and the gathered statistics."""

    indices: list[int]  # prompt index of each group
    local: dict  # this process's rows; `_row` is each row's position in the round (groups of G contiguous)
    rewards: torch.Tensor  # (n G, F) gathered, NaN where a reward returned None
    penalty: torch.Tensor  # (n G,) overlong penalty, 0 without shaping
    lengths: torch.Tensor  # (n G,) completion lengths
    truncated: torch.Tensor  # (n G,) bool
    rows_per_call: list[int]  # rows of each TRL generation call the round was split into
    table: list[list[dict]] | None  # completion-table rows, per group (None when completions are not logged)


@dataclass
class _Step:
    """What the rounds of one generation batch have collected so far."""

    needed: int  # fresh informative groups wanted
    metric_marks: dict[str, int]  # length of each metric list before the first round
    pieces: list[dict] = field(default_factory=list)  # this process's rows of informative groups, per round
    rewards: list[torch.Tensor] = field(default_factory=list)  # per round, gathered (n G, F)
    penalty: list[torch.Tensor] = field(default_factory=list)
    lengths: list[torch.Tensor] = field(default_factory=list)
    truncated: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)  # filter values, per round (n, G)
    rows_per_call: list[int] = field(default_factory=list)
    table: dict[int, list[dict]] = field(default_factory=dict)  # fresh informative group id -> table rows
    num_fresh: int = 0
    rounds: int = 0
    generated: int = 0
    all_correct: int = 0
    all_wrong: int = 0
    template: dict | None = None


class DAPOTrainer(GRPOTrainer):
    """
    Trainer for DAPO: Decoupled Clip and Dynamic sAmpling Policy Optimization.

    A drop-in replacement for [`~trl.GRPOTrainer`] (same constructor arguments) configured by [`DAPOConfig`]. On top
    of TRL it adds:

    - **Dynamic sampling** (§3.2): prompt groups whose filter reward is constant are dropped and new prompts are
      generated until the generation batch holds `generation_batch_size // num_generations` informative groups.
      Rounds are sized from the informative rate seen so far, surplus groups can be carried to the next step, the
      prompts come from a resumable shuffled stream over the training set (map-style or streamed), and every process
      runs the same rounds.
    - **Exact token-level loss** (§3.3): TRL's `loss_type="dapo"` surrogate divided by the exact number of completion
      tokens of the optimizer step (all accumulation micro-batches, all processes).
    - **Overlong reward shaping** (§3.4): the soft length penalty of Eq. 13, added to the aggregated reward of every
      scorable completion before advantages are computed ([`~dapo_trl.advantages.compute_advantages`]), logged under
      `overlong/*`. The reward lists (`reward_funcs`, `reward_func_names`, `reward_weights`,
      `reward_processing_classes`) and the logged `reward` stay exactly what the user passed, as in GRPOTrainer.
    - The paper's monitors: `token_prob/mean`, `token_prob/high_clipped_mean`, response length split by correct and
      incorrect answers, `dynamic_sampling/*`, `overlong/*`.

    Subclasses can change behaviour through these extension points, each documented below: [`filter_values`],
    [`select_informative_groups`], [`skip_prompt`], [`on_groups_scored`], [`plan_batch`], [`build_overlong_penalty`],
    [`log_dynamic_sampling`] and [`sampler_state_dict`] / [`load_sampler_state_dict`]; [`correct_value`] and
    [`log_metric`] help them.

    Args:
        Same as [`~trl.GRPOTrainer`]. `args` may be a [`DAPOConfig`] or a plain [`~trl.GRPOConfig`]; the latter is
        converted, keeping its values, with the DAPO-only settings at their defaults.
    """

    _tag_names = ["trl", "dapo"]
    _name = "DAPO"
    _paper = {
        "title": "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
        "id": "2503.14476",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{yu2025dapo,
                title        = {{DAPO: An Open-Source LLM Reinforcement Learning System at Scale}},
                author       = {Qiying Yu and others},
                year         = 2025,
                eprint       = {arXiv:2503.14476},
            }"""),
    }

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: DAPOConfig | GRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools=None,
        rollout_func=None,
        environment_factory=None,
    ):
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = DAPOConfig(f"{str(name).split('/')[-1] or 'model'}-DAPO")
        elif not isinstance(args, DAPOConfig):
            args = _to_dapo_config(args)
        if reward_funcs is not None:
            check_reward_funcs(reward_funcs)
        _check_train_dataset(train_dataset, args, environment_factory is not None)
        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
            optimizers=optimizers,
            quantization_config=quantization_config,
            peft_config=peft_config,
            tools=tools,
            rollout_func=rollout_func,
            environment_factory=environment_factory,
        )
        self._last_rewards_per_func: torch.Tensor | None = None
        self._last_penalty: torch.Tensor | None = None
        self._last_lengths: torch.Tensor | None = None
        self._window_tokens: list[float] | None = None
        self._loss_logps: torch.Tensor | None = None
        self._loss_inputs: dict | None = None
        self._reward_warnings: set[tuple[str, str]] = set()
        self._weight_syncs = 0
        self._overlong = self.build_overlong_penalty()
        self._setup_dynamic_sampling()
        self._count_weight_syncs()

    # ------------------------------------------------------------------ set-up

    def _setup_dynamic_sampling(self) -> None:
        args = self.args
        names = self.reward_func_names
        name = args.dynamic_sampling_reward
        if name is None:
            self._filter_index: int | None = 0
        elif name == "total":
            self._filter_index = None
        elif names.count(name) == 1:
            self._filter_index = names.index(name)
        else:
            problem = "names several reward functions" if name in names else "is not a reward function of this trainer"
            raise ValueError(
                f"dynamic_sampling_reward={name!r} {problem}. Choose one of {sorted(set(names))} (reward function "
                "names must be distinct) or 'total'."
            )
        filter_func = self.reward_funcs[self._filter_index] if self._filter_index is not None else None
        correct = getattr(filter_func, "correct_reward", None)
        self._correct_value: float | None = float(correct) if correct is not None else None

        self._ds_target = args.generation_batch_size // self.num_generations
        self._round_penalty: torch.Tensor | None = None
        self._carry: dict | None = None  # rows of carried groups, replicated on every process, group order
        self._carry_groups = 0
        self._carry_table: dict[int, list[dict]] = {}
        self._ds_active = bool(args.dynamic_sampling and self.train_dataset is not None)
        if not self._ds_active:
            return
        if self._is_vlm:
            raise ValueError(
                "dynamic_sampling does not support vision-language models yet (multimodal rows cannot be moved between "
                "generation rounds). Set dynamic_sampling=False."
            )
        processes = self.accelerator.num_processes
        granularity = processes // math.gcd(self.num_generations, processes)  # prompts per round split evenly
        self._planner = RoundPlanner(
            self._ds_target,
            strategy=args.dynamic_sampling_round_sizing,
            granularity=granularity,
            max_round_prompts=args.dynamic_sampling_max_round_prompts,
            z=args.dynamic_sampling_margin,
        )
        if isinstance(self.train_dataset, IterableDataset):
            self._prompts = StreamPrompts(self.train_dataset, seed=args.seed, shuffle=self.shuffle_dataset)
        else:
            self._prompts = DatasetPrompts(self.train_dataset, seed=args.seed, shuffle=self.shuffle_dataset)
            _warn_duplicates(self.train_dataset)

    def _count_weight_syncs(self) -> None:
        """Count TRL's weight pushes to vLLM: with sleep mode every generation call re-pushes all weights."""
        generation = getattr(self, "vllm_generation", None) if self.use_vllm else None
        if generation is None or not hasattr(generation, "sync_weights"):
            return
        sync = generation.sync_weights

        def counted_sync(*args, **kwargs):
            self._weight_syncs += 1
            return sync(*args, **kwargs)

        generation.sync_weights = counted_sync

    def build_overlong_penalty(self):
        """
        Extension point: the overlong penalty, or `None` for none.

        Called once at construction. The returned callable receives TRL's reward keyword arguments (`prompts`,
        `completions`, `completion_ids`, `trainer_state`) and returns one float per completion (`<= 0`); the trainer
        adds it to the aggregated reward of each scorable completion before advantages (DAPO Eq. 13, see
        [`~dapo_trl.advantages.compute_advantages`]). It is not a reward function: the reward lists and the logged
        `reward` do not include it, and it is logged under `overlong/*`. Default: [`OverlongPenalty`] from
        `overlong_buffer_len` and `overlong_penalty_factor`.
        """
        if not self.args.overlong_shaping:
            return None
        return OverlongPenalty(
            max_length=self.args.max_completion_length,
            buffer_len=self.args.overlong_buffer_len,
            penalty_factor=self.args.overlong_penalty_factor,
            eos_token_ids=self.eos_token_ids,
        )

    # ------------------------------------------------------------------ extension points

    def filter_values(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """
        Extension point: the value per completion that decides whether a group is informative.

        Args:
            rewards_per_func (`torch.Tensor` of shape `(N, F)`):
                Rewards of all `N` completions of the round (gathered from every process, groups of `G` contiguous)
                for each of the `F` reward functions, `NaN` where a function returned `None`. The overlong penalty of
                the same rows is [`round_overlong_penalty`].

        Returns:
            `torch.Tensor` of shape `(N,)`. Default: the `dynamic_sampling_reward` column (the first reward function,
            i.e. correctness before overlong shaping), or the weighted total plus the overlong penalty for `"total"`.
            Must be computed from gathered values only, so every process reaches the same decision.
        """
        if self._filter_index is not None:
            return rewards_per_func[:, self._filter_index]
        weights = self.reward_weights.to(rewards_per_func.device)
        total = (rewards_per_func * weights).nansum(dim=1)
        if self._round_penalty is not None:
            total = total + self._round_penalty.to(total)
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        return torch.where(unscorable, torch.full_like(total, torch.nan), total)

    @property
    def round_overlong_penalty(self) -> torch.Tensor | None:
        """The overlong penalty `(N,)` of the rows [`filter_values`] is called on (0 for unscorable rows), or `None`."""
        return self._round_penalty

    def select_informative_groups(self, values: torch.Tensor) -> torch.Tensor:
        """
        Extension point: which groups are informative.

        Args:
            values (`torch.Tensor` of shape `(num_groups, G)`): [`filter_values`] per group.

        Returns:
            Bool `torch.Tensor` of shape `(num_groups,)`. Default: the group's values are not constant (spread above
            `dynamic_sampling_tolerance`, unscorable `NaN` ignored). Identical on every process (same inputs).
        """
        return classify_groups(
            values.flatten(),
            values.size(1),
            tolerance=self.args.dynamic_sampling_tolerance,
            correct_value=self._correct_value,
        ).informative

    def skip_prompt(self, index: int) -> bool:
        """
        Extension point: return `True` to pass over training prompt `index` when the prompt stream draws it (e.g. a
        curriculum retiring prompts that are always solved).

        Applies to every prompt dynamic sampling draws (first rounds and refills); with `dynamic_sampling=False`, TRL's
        own sampler picks prompts and this is not called. For a streamed training set `index` is the prompt's position
        in the current epoch of the stream. Must give the same answer on every process. If a whole epoch of prompts is
        skipped, the batch comes out underfilled (see `dynamic_sampling_on_exhausted`). Default: never.
        """
        return False

    def on_groups_scored(
        self,
        prompt_indices: list[int],
        values: torch.Tensor,
        informative: torch.Tensor,
        classification: GroupClassification,
    ) -> None:
        """
        Extension point called after each training round of dynamic sampling is scored, on every process with identical
        arguments (not called with `dynamic_sampling=False`, nor in evaluation).

        Args:
            prompt_indices (`list[int]`):
                Dataset index of each group's prompt, in round order. An index can appear twice in one round when the
                round crosses an epoch boundary.
            values (`torch.Tensor` of shape `(num_groups, G)`): [`filter_values`] per group.
            informative (`torch.Tensor` of shape `(num_groups,)`): [`select_informative_groups`]'s verdict.
            classification ([`GroupClassification`]):
                All-correct / all-wrong / informative split of the groups by [`classify_groups`] (all-correct means
                every value reached [`correct_value`]).
        """

    @property
    def correct_value(self) -> float | None:
        """
        Reward of a correct answer under the filter reward (its `correct_reward` attribute, e.g. 1.0 for
        [`MathVerifierReward`]), or `None` when unknown. Decides all-correct groups and the accuracy metrics.
        """
        return self._correct_value

    def log_metric(self, name: str, value: float) -> None:
        """Record a scalar under `name`, averaged over the logging interval like TRL's metrics (train or eval)."""
        self._metrics["train" if self.model.training else "eval"][name].append(float(value))

    def sampler_state_dict(self) -> dict:
        """
        Extension point: the dynamic-sampling state saved with each checkpoint (in `dapo_sampler_state.pt`, loaded back
        by [`load_sampler_state_dict`]). Subclasses add their own entries: `{**super().sampler_state_dict(), ...}`;
        values must be tensors, numbers, strings or containers of them (it is read with `weights_only=True`).
        """
        return {
            "stream": self._prompts.state_dict(),
            "planner": self._planner.state_dict(),
            "carry": {k: v.cpu() for k, v in self._carry.items()} if self._carry else None,
            "carry_groups": self._carry_groups,
            "num_generations": self.num_generations,
        }

    def load_sampler_state_dict(self, state: dict) -> None:
        """Extension point: restore what [`sampler_state_dict`] saved (call `super()` first in subclasses)."""
        saved_g = state.get("num_generations", self.num_generations)
        if state.get("carry") and saved_g != self.num_generations:
            raise ValueError(
                f"The checkpoint carries groups of {saved_g} completions but this run uses num_generations="
                f"{self.num_generations}. Resume with num_generations={saved_g}, or delete dapo_sampler_state.pt from "
                "the checkpoint folder to resume without the sampler state (the prompt stream then restarts)."
            )
        self._prompts.load_state_dict(state["stream"])
        self._planner.load_state_dict(state["planner"])
        device = self.accelerator.device
        self._carry = {k: v.to(device) for k, v in state["carry"].items()} if state["carry"] else None
        self._carry_groups = int(state["carry_groups"])

    def plan_batch(self, *, num_carried: int, num_fresh: int, target: int) -> tuple[SelectionPlan, int]:
        """
        Extension point: which candidate groups are trained, carried or discarded.

        Candidates are numbered carried groups first (`0 .. num_carried - 1`), then this step's informative groups in
        generation order. Must return `(plan, missing)` with `len(plan.train) == target - missing`, every id in at most
        one list, and the same result on every process. Default: [`plan_selection`] with `dynamic_sampling_carry_over`.
        """
        return plan_selection(
            num_carried=num_carried,
            num_fresh=num_fresh,
            target=target,
            carry_over=self.args.dynamic_sampling_carry_over,
        )

    def log_dynamic_sampling(self, stats: dict[str, float]) -> None:
        """
        Extension point: record one generation batch's dynamic-sampling statistics. Default: TRL metrics under
        `dynamic_sampling/<name>`, averaged over the logging interval like every TRL metric.
        """
        for key, value in stats.items():
            self.log_metric(f"dynamic_sampling/{key}", value)

    # ------------------------------------------------------------------ rewards

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # Check every reward's output while TRL calls it; the public lists are swapped back right after.
        problems: list[str] = []
        user_funcs = self.reward_funcs
        self.reward_funcs = [
            func if isinstance(func, nn.Module) else checked_reward(func, name, problems)
            for func, name in zip(user_funcs, self.reward_func_names, strict=True)
        ]
        try:
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # (N, F)
        finally:
            self.reward_funcs = user_funcs
        penalty = self._overlong_penalty(prompts, completions, completion_ids_list, problems)
        self._raise_reward_problems(problems)
        device = rewards_per_func.device
        lengths = torch.tensor([len(ids) for ids in completion_ids_list], device=device, dtype=torch.float32)
        self._last_lengths = self.accelerator.gather(lengths)  # (N,)
        scorable = ~torch.isnan(rewards_per_func).all(dim=1)
        penalty = torch.where(scorable, penalty, torch.zeros_like(penalty))
        self._last_rewards_per_func, self._last_penalty = rewards_per_func, penalty
        self._last_truncated = self._truncation_flags(completion_ids_list)
        if not (self.model.training and self._ds_active):  # dynamic sampling logs these once per batch
            self._log_overlong(self._last_lengths, self._last_truncated, penalty, scorable)
            self._log_correctness(rewards_per_func, self._last_lengths)
            self._warn_about_rewards(rewards_per_func)
        return rewards_per_func

    def _overlong_penalty(self, prompts, completions, completion_ids_list, problems: list[str]) -> torch.Tensor:
        """The overlong penalty of every row, gathered `(N,)`; zeros without shaping."""
        device = self.accelerator.device
        if self._overlong is None:
            local = torch.zeros(len(completion_ids_list), device=device)
        else:
            output = self._overlong(
                prompts=prompts, completions=completions, completion_ids=completion_ids_list, trainer_state=self.state
            )
            values, problem = check_reward_output("overlong penalty", output, len(completion_ids_list))
            if problem:
                problems.append(problem + " (returned by build_overlong_penalty()'s callable)")
            local = torch.tensor([v if v is not None else 0.0 for v in values], device=device, dtype=torch.float32)
        return self.accelerator.gather(local)

    def _raise_reward_problems(self, problems: list[str]) -> None:
        """Raise on every process if a reward broke its contract on any process (after TRL's collective gather)."""
        if self.accelerator.num_processes > 1:
            count = self.accelerator.reduce(torch.tensor([len(problems)], device=self.accelerator.device), "sum")
            if int(count.item()) == 0:
                return
            from accelerate.utils import gather_object

            problems = gather_object(problems)
        if problems:
            unique = list(dict.fromkeys(problems))
            raise ValueError("A reward function broke the reward contract:\n- " + "\n- ".join(unique))

    def _truncation_flags(self, completion_ids_list) -> torch.Tensor:
        """Whether each completion was cut off at `max_completion_length`, gathered `(N,)`."""
        max_length = self.args.max_completion_length
        flags = [
            is_truncated(ids, eos_token_ids=self.eos_token_ids, max_length=max_length) for ids in completion_ids_list
        ]
        return self.accelerator.gather(torch.tensor(flags, dtype=torch.bool, device=self.accelerator.device))

    def _log_overlong(
        self, lengths: torch.Tensor, truncated: torch.Tensor, penalty: torch.Tensor, scorable: torch.Tensor
    ) -> None:
        """
        `overlong/*` over the given rows: `ratio` (share inside the buffer zone), `truncated_ratio`, and over scorable
        rows (the only ones penalised) `penalty_mean` and `penalised_ratio`.
        """
        if self._overlong is None or lengths.numel() == 0:
            return
        max_length = self.args.max_completion_length
        start = max_length - (self.args.overlong_buffer_len or 0)
        self.log_metric("overlong/ratio", ((lengths > start) & (lengths <= max_length)).float().mean().item())
        self.log_metric("overlong/truncated_ratio", truncated.float().mean().item())
        if scorable.any():
            self.log_metric("overlong/penalty_mean", penalty[scorable].mean().item())
            self.log_metric("overlong/penalised_ratio", (penalty[scorable] < 0).float().mean().item())

    def _log_correctness(self, rewards_per_func: torch.Tensor, lengths: torch.Tensor) -> None:
        """`accuracy` and response length by correctness, over the scorable rows given."""
        if self._correct_value is None:
            return
        values = self.filter_values(rewards_per_func)
        scored = ~torch.isnan(values)
        if not scored.any():
            return
        correct = (values >= self._correct_value) & scored
        self.log_metric("accuracy", correct[scored].float().mean().item())
        for name, rows in (("correct", correct), ("incorrect", scored & ~correct)):
            if rows.any():
                self.log_metric(f"completions/{name}_mean_length", lengths[rows].mean().item())
                self.log_metric(f"completions/{name}_max_length", lengths[rows].max().item())

    def _warn_about_rewards(self, rewards_per_func: torch.Tensor) -> None:
        """Name a reward function that scored nothing, or gave one value to every completion (once per function)."""
        rows = rewards_per_func.size(0)
        for i, name in enumerate(self.reward_func_names):
            column = rewards_per_func[:, i]
            scored = column[~torch.isnan(column)]
            if scored.numel() == 0:
                kind, detail = "none", f"returned None for all {rows} completions: none of them could be scored"
            elif rows > self.num_generations and scored.numel() == rows and bool((scored == scored[0]).all()):
                kind, detail = "constant", f"returned the same value {scored[0].item():g} for all {rows} completions"
            else:
                continue
            if (name, kind) in self._reward_warnings:
                continue
            self._reward_warnings.add((name, kind))
            advice = (
                "Check the dataset column it reads (e.g. MathVerifierReward's answer_column) and that its gold "
                "answers parse; rows no reward can score get no advantage and are never trained on."
                if kind == "none"
                else "Either every completion is scored alike (the prompts are far too easy or too hard for the model) "
                "or the function does not look at the completion; check it."
            )
            logger.warning(f"Reward function {name!r} {detail} of this batch. {advice}")

    # ------------------------------------------------------------------ generation

    def _generate_and_score_completions(self, inputs):
        syncs_before = self._weight_syncs
        if self.model.training and self._ds_active:
            # The dataloader's batch only paces the steps: prompts come from the resumable stream, so that refills never
            # repeat a prompt within an epoch and every process draws the same ones.
            out = self._dynamic_sampling_batch()
        else:
            out = super()._generate_and_score_completions(inputs)
            self._apply_overlong_to_advantages(out)
            self._log_importance_sampling(out)
        if self.use_vllm:
            self.log_metric("vllm/weight_syncs", self._weight_syncs - syncs_before)
        return out

    def _apply_overlong_to_advantages(self, out: dict) -> None:
        """With dynamic sampling off: recompute TRL's advantages of this call with the overlong penalty added."""
        if self._overlong is None:
            return
        G = self.num_generations if self.model.training else self.num_generations_eval
        advantages = compute_advantages(
            self._last_rewards_per_func,
            self.reward_weights,
            num_generations=G,
            scale_rewards=self.scale_rewards,
            aggregation=self.multi_objective_aggregation,
            penalty=self._last_penalty,
        ).advantages
        rows = out["advantages"].size(0)
        start = self.accelerator.process_index * rows
        out["advantages"] = advantages[start : start + rows].to(out["advantages"])
        logged = self._logs["advantages"]
        for _ in range(min(len(advantages), len(logged))):
            logged.pop()
        logged.extend(advantages.tolist())

    def _log_importance_sampling(self, batch: dict, *, replicated: bool = False) -> None:
        """
        How many sequences/tokens TRL's vLLM importance-sampling correction removed from the loss (weight 0), summed
        over the batch of every process (`replicated`: the batch is already the same whole batch on every process).
        """
        ratio = batch.get("importance_sampling_ratio")
        if ratio is None:
            return
        mask = _batch.loss_mask(batch).float()  # (B, T)
        weight = ratio.expand_as(mask) if ratio.size(1) == 1 else ratio  # (B, T)
        removed = (weight == 0).float() * mask
        real = mask.sum(dim=1) > 0
        sequences = (removed.sum(dim=1) == mask.sum(dim=1)) & real
        totals = torch.stack([sequences.sum().float(), real.sum().float(), removed.sum(), mask.sum()])
        if not replicated:
            totals = self.accelerator.reduce(totals, reduction="sum")
        self.log_metric("sampling/is_removed_sequences", totals[0].item())
        self.log_metric("sampling/is_removed_sequence_frac", (totals[0] / totals[1].clamp(min=1)).item())
        self.log_metric("sampling/is_removed_tokens", totals[2].item())
        self.log_metric("sampling/is_removed_token_frac", (totals[2] / totals[3].clamp(min=1)).item())

    # ------------------------------------------------------------------ dynamic sampling

    def _dynamic_sampling_batch(self) -> dict:
        """One generation batch of informative groups: draw -> generate and score -> select, until full; assemble."""
        args = self.args
        step = _Step(needed=max(self._ds_target - self._carry_groups, 0), metric_marks=self._metric_marks())
        while step.num_fresh < step.needed and step.rounds < args.dynamic_sampling_max_rounds:
            indices, rows = self._draw_round(step.needed - step.num_fresh)
            if not indices:
                break
            scored = self._generate_and_score_round(indices, rows)
            self._select_round(step, scored)
            if torch.isnan(scored.rewards).all():
                break  # no reward could score anything: more rounds would cost as much and find nothing
        batch, plan, missing = self._assemble_batch(step)
        self._log_step(step, batch, plan, missing)
        return self._local_rows(batch)

    def _draw_round(self, needed: int) -> tuple[list[int], list[dict]]:
        """The prompts of the next round: as many as the planner asks for, a multiple of its granularity."""
        size = self._planner.next_round_size(needed)
        indices, rows = self._prompts.take(size, skip=self.skip_prompt)
        keep = len(indices) - len(indices) % self._planner.granularity
        return indices[:keep], rows[:keep]

    def _generate_and_score_round(self, indices: list[int], rows: list[dict]) -> _Round:
        """
        Generate and score `G` completions for each prompt, through TRL, in calls of at most one generation batch (so a
        large round never holds more in memory than a plain TRL step). Every process makes the same calls with the
        same number of rows, so every model forward runs equally often on every process (ZeRO-3 and FSDP need it).
        """
        G, processes, rank = self.num_generations, self.accelerator.num_processes, self.accelerator.process_index
        outs, rewards, penalty, lengths, truncated, rows_per_call, table = [], [], [], [], [], [], []
        for start in range(0, len(rows), self._ds_target):
            expanded = [dict(row) for row in rows[start : start + self._ds_target] for _ in range(G)]  # TRL edits rows
            per_process = len(expanded) // processes
            out = super()._generate_and_score_completions(expanded[rank * per_process : (rank + 1) * per_process])
            _batch.check_supported(out)
            out.pop("num_items_in_batch", None)
            offset = start * G + rank * per_process
            out["_row"] = torch.arange(offset, offset + per_process, device=self.accelerator.device)
            if self._needs_sampling_logps(out):
                out["_carry_logps"] = self._sampling_logps(out)  # every local row, so forward counts match
            outs.append(out)
            rewards.append(self._last_rewards_per_func)
            penalty.append(self._last_penalty)
            lengths.append(self._last_lengths)
            truncated.append(self._last_truncated)
            rows_per_call.append(len(expanded))
            if self.log_completions:
                table.extend(self._pop_table_rows(len(expanded)))
        return _Round(
            indices=indices,
            local=_batch.concat_rows(outs, pad_token_id=self._tokenizer.pad_token_id),
            rewards=torch.cat(rewards),
            penalty=torch.cat(penalty),
            lengths=torch.cat(lengths),
            truncated=torch.cat(truncated),
            rows_per_call=rows_per_call,
            table=[table[i : i + G] for i in range(0, len(table), G)] if self.log_completions else None,
        )

    def _needs_sampling_logps(self, out: dict) -> bool:
        # Carried rows are trained a step later, against the policy that sampled them. TRL's aligned case (no
        # `old_per_token_logps`) never computes those log-probabilities, so compute them while that policy is current.
        return self.args.dynamic_sampling_carry_over and "old_per_token_logps" not in out

    def _select_round(self, step: _Step, scored: _Round) -> None:
        """Decide which groups of the round are informative and keep this process's rows of those groups."""
        G, args = self.num_generations, self.args
        self._round_penalty = scored.penalty
        values = self.filter_values(scored.rewards).view(-1, G)  # (n, G)
        self._round_penalty = None
        informative = self.select_informative_groups(values).to(self.accelerator.device)  # (n,)
        classes = classify_groups(
            values.flatten(), G, tolerance=args.dynamic_sampling_tolerance, correct_value=self._correct_value
        )
        self.on_groups_scored(scored.indices, values, informative, classes)
        self._planner.update(len(scored.indices), int(informative.sum()))

        # Number informative groups in generation order, continuing the count of earlier rounds.
        group_ids = torch.cumsum(informative.long(), 0) - 1 + self._carry_groups + step.num_fresh  # (n,)
        local = scored.local
        row = local["_row"]
        local["_group"] = group_ids[row // G]
        local["_value"] = values.flatten()[row]
        local["_rewards"] = scored.rewards[row]
        local["_penalty"] = scored.penalty[row]
        step.pieces.append(_batch.select_rows(local, informative[row // G]))
        if scored.table is not None:
            for g in informative.nonzero().flatten().tolist():
                step.table[int(group_ids[g])] = scored.table[g]
        if step.template is None:
            step.template = local
        step.rewards.append(scored.rewards)
        step.penalty.append(scored.penalty)
        step.lengths.append(scored.lengths)
        step.truncated.append(scored.truncated)
        step.values.append(values)
        step.rows_per_call.extend(scored.rows_per_call)
        step.num_fresh += int(informative.sum())
        step.rounds += 1
        step.generated += len(scored.indices)
        step.all_correct += int(classes.all_correct.sum())
        step.all_wrong += int(classes.all_wrong.sum())

    def _assemble_batch(self, step: _Step) -> tuple[dict, SelectionPlan, int]:
        """The generation batch: carried and fresh groups chosen by the plan, on every process, padded to full size."""
        device, pad = self.accelerator.device, self._tokenizer.pad_token_id
        num_carried = self._batch_carried_groups = self._carry_groups
        plan, missing = self.plan_batch(num_carried=num_carried, num_fresh=step.num_fresh, target=self._ds_target)
        template = step.template if step.template is not None else (self._carry or self._empty_rows())
        fresh = _batch.concat_rows(step.pieces, pad_token_id=pad)
        if fresh:
            fresh = _batch.select_rows(fresh, torch.isin(fresh["_group"], _ids(plan.train + plan.carry, device)))
        fresh = self._all_gather_rows(fresh, template)
        pool = _batch.concat_rows([b for b in (self._carry, fresh) if b], pad_token_id=pad)
        train = carry = {}
        if pool:
            pool = _batch.select_rows(pool, torch.argsort(pool["_group"], stable=True))
            train = _batch.select_rows(pool, torch.isin(pool["_group"], _ids(plan.train, device)))
            carry = _batch.select_rows(pool, torch.isin(pool["_group"], _ids(plan.carry, device)))
        table = {**self._carry_table, **step.table}
        self._table_rows = [row for g in sorted(plan.train) for row in table.get(g, [])]
        if plan.carry:  # renumber carried groups 0..k-1 for the next step
            carry["_group"] = torch.searchsorted(_ids(plan.carry, device), carry["_group"])
            self._carry, self._carry_groups = carry, len(plan.carry)
            self._carry_table = {i: table[g] for i, g in enumerate(sorted(plan.carry)) if g in table}
        else:
            self._carry, self._carry_groups, self._carry_table = None, 0, {}
        filler = next(b for b in (train, pool, template) if b and b["completion_ids"].size(0))
        train = _batch.pad_rows(train, self._ds_target * self.num_generations, template=filler, pad_token_id=pad)
        train["advantages"] = self._batch_advantages(train)
        self._trained_advantages = train["advantages"][train["_group"] >= 0].tolist()
        self._mark_carried_rows(train, num_carried)
        return train, plan, missing

    def _batch_advantages(self, batch: dict) -> torch.Tensor:
        """Advantages over the trained rows (groups complete and contiguous; padding rows get 0)."""
        real = batch["_group"] >= 0  # (B,)
        advantages = torch.zeros_like(batch["advantages"])
        if real.any():
            advantages[real] = compute_advantages(
                batch["_rewards"][real],
                self.reward_weights,
                num_generations=self.num_generations,
                scale_rewards=self.scale_rewards,
                aggregation=self.multi_objective_aggregation,
                penalty=batch["_penalty"][real],
            ).advantages.to(advantages)
        return advantages

    def _mark_carried_rows(self, batch: dict, num_carried: int) -> None:
        """
        Give carried rows the log-probabilities of the policy that sampled them. Fresh rows keep TRL's exact on-policy
        ratio: in TRL's aligned case their `old_per_token_logps` are filled from the loss forward itself (see
        `_get_per_token_logps_and_entropies`), so their ratio is exactly 1 at the first update, as in GRPOTrainer.
        """
        carried = batch.pop("_carry_logps", None)
        if carried is None or "old_per_token_logps" in batch:
            return
        is_carried = (batch["_group"] >= 0) & (batch["_group"] < num_carried)
        if not is_carried.any():
            return
        batch["old_per_token_logps"] = torch.where(is_carried.unsqueeze(1), carried, torch.zeros_like(carried))
        batch[_batch.ON_POLICY_KEY] = ~is_carried

    def _local_rows(self, batch: dict) -> dict:
        """This process's equal slice of the assembled batch, with the exact token count of the whole batch."""
        rank, processes = self.accelerator.process_index, self.accelerator.num_processes
        per_process = batch["completion_ids"].size(0) // processes
        index = torch.arange(rank * per_process, (rank + 1) * per_process, device=self.accelerator.device)
        local = {k: v for k, v in _batch.select_rows(batch, index).items() if not k.startswith("_")}
        local["num_items_in_batch"] = self.accelerator.gather(_batch.loss_mask(local).sum()).sum()
        return local

    def _empty_rows(self) -> dict:
        """A one-row, fully masked batch in TRL's format, to pad with when no prompt could be drawn at all."""
        device, pad = self.accelerator.device, self._tokenizer.pad_token_id
        one = torch.ones(1, 1, dtype=torch.long, device=device)
        rows = {
            "prompt_ids": one * pad,
            "prompt_mask": one.clone(),  # attend to the pad token itself, so the forward stays finite
            "completion_ids": one * pad,
            "completion_mask": one * 0,
            "advantages": torch.zeros(1, device=device),
            "_group": -torch.ones(1, dtype=torch.long, device=device),
            "_value": torch.zeros(1, device=device),
            "_rewards": torch.zeros(1, len(self.reward_funcs), device=device),
            "_penalty": torch.zeros(1, device=device),
        }
        generate_every = self.args.steps_per_generation * self.num_iterations
        vllm_is = self.use_vllm and self.vllm_importance_sampling_correction
        if self.args.gradient_accumulation_steps % generate_every != 0 or vllm_is:
            rows["old_per_token_logps"] = torch.zeros(1, 1, device=device)
        if self.beta != 0.0:
            rows["ref_per_token_logps"] = torch.zeros(1, 1, device=device)
        if vllm_is:
            rows["importance_sampling_ratio"] = torch.ones(1, 1, device=device)
        if self.use_vllm:
            rows["sampling_per_token_logps"] = torch.zeros(1, 1, device=device)
        return rows

    @torch.no_grad()
    def _sampling_logps(self, batch: dict) -> torch.Tensor:
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        logps, _, _ = self._get_per_token_logps_and_entropies(
            self.model,
            input_ids,
            attention_mask,
            batch["completion_ids"].size(1),
            batch_size=self.args.per_device_train_batch_size,
        )
        return logps

    def _all_gather_rows(self, batch: dict, template: dict) -> dict:
        """Every process's rows, in process order, on every process (a collective: all processes must call it)."""
        processes = self.accelerator.num_processes
        if processes == 1:
            return batch
        device = self.accelerator.device
        shape_source = batch or _batch.select_rows(template, torch.zeros(0, dtype=torch.long))
        local_rows = shape_source["_group"].size(0)
        rows = self.accelerator.gather(torch.tensor([local_rows], device=device))  # (P,)
        key_widths = {
            key: int(self.accelerator.gather(torch.tensor([w], device=device)).max())
            for key, w in sorted(_batch.widths(shape_source).items())
        }
        padded = _batch.pad_to(shape_source, key_widths, int(rows.max()), pad_token_id=self._tokenizer.pad_token_id)
        gathered = {key: self.accelerator.gather(padded[key]) for key in sorted(padded)}
        valid = torch.cat([torch.arange(int(rows.max()), device=device) < n for n in rows.tolist()])
        return _batch.select_rows(gathered, valid) if valid.any() else {}

    # ------------------------------------------------------------------ dynamic sampling: logging

    def _metric_marks(self) -> dict[str, int]:
        return {key: len(values) for key, values in self._metrics["train"].items()}

    def _log_step(self, step: _Step, batch: dict, plan: SelectionPlan, missing: int) -> None:
        """Every metric of the generation batch, once, over a stated population (see the README's metric list)."""
        self._merge_call_metrics(step)
        if step.rewards:
            rewards, lengths = torch.cat(step.rewards), torch.cat(step.lengths)
            scorable = ~torch.isnan(rewards).all(dim=1)
            self._log_overlong(lengths, torch.cat(step.truncated), torch.cat(step.penalty), scorable)
            self._log_correctness(rewards, lengths)
            self._warn_about_rewards(rewards)
        if missing:
            self._warn_underfilled(step, missing)
        trained = batch["_group"] >= 0
        per_group = 1 / step.generated if step.generated else math.nan  # NaN (skipped by TRL's log): carried only
        stats = {
            "rounds": step.rounds,
            "groups_generated": step.generated,
            "informative_frac": step.num_fresh * per_group,
            "all_correct_frac": step.all_correct * per_group,
            "all_wrong_frac": step.all_wrong * per_group,
            "groups_carried": min(self._batch_carried_groups, self._ds_target),
            "groups_discarded": len(plan.discard),
            "groups_trained": len(plan.train),
            "underfilled": float(missing > 0),
            "prompts_consumed": self._prompts.consumed,
            "reward_before_filter": self._mean_reward(step) if step.rewards else math.nan,
            "reward_after_filter": self._trained_reward(batch, trained),
        }
        if self._correct_value is not None:
            values = torch.cat([v.flatten() for v in step.values]) if step.values else torch.zeros(0)
            scored = values[~torch.isnan(values)]
            stats["accuracy_before_filter"] = (
                (scored >= self._correct_value).float().mean().item() if scored.numel() else math.nan
            )
            after = batch["_value"][trained]
            after = after[~torch.isnan(after)]
            stats["accuracy_after_filter"] = (
                (after >= self._correct_value).float().mean().item() if after.numel() else math.nan
            )
        self.log_dynamic_sampling(stats)
        self._log_importance_sampling(batch, replicated=True)
        self._replace_table()

    def _mean_reward(self, step: _Step) -> float:
        rewards = torch.cat(step.rewards)
        total = (rewards * self.reward_weights.to(rewards.device)).nansum(dim=1)
        scorable = ~torch.isnan(rewards).all(dim=1)
        return total[scorable].mean().item() if scorable.any() else math.nan

    def _trained_reward(self, batch: dict, trained: torch.Tensor) -> float:
        rewards = batch["_rewards"][trained]
        if rewards.numel() == 0:
            return math.nan
        total = (rewards * self.reward_weights.to(rewards.device)).nansum(dim=1)
        scorable = ~torch.isnan(rewards).all(dim=1)
        return total[scorable].mean().item() if scorable.any() else math.nan

    def _merge_call_metrics(self, step: _Step) -> None:
        """
        Replace the values TRL appended once per generation call during this batch by one value over all generated
        rows: reward statistics recomputed from the rows, completion lengths merged exactly, the rest weighted by rows.
        """
        metrics = self._metrics["train"]
        per_call: dict[str, list[float]] = {}
        for key, values in metrics.items():
            start = step.metric_marks.get(key, 0)
            if len(values) > start and key != "num_tokens":
                per_call[key] = values[start:]
                del values[start:]
        rows = step.rows_per_call
        completion_keys = {k: v for k, v in per_call.items() if k.startswith("completions/") and len(v) == len(rows)}
        merged = merge_completion_metrics(completion_keys, rows) if rows else {}
        for key, values in per_call.items():
            if key in merged or key in _REWARD_METRICS or key.startswith("rewards/"):
                continue
            weights = rows if len(values) == len(rows) else [1] * len(values)
            merged[key] = merge_metric(key, values, weights)
        if step.rewards:
            merged.update(self._reward_metrics(torch.cat(step.rewards)))
        for key, value in merged.items():
            metrics[key].append(value)

    def _reward_metrics(self, rewards_per_func: torch.Tensor) -> dict[str, float]:
        """TRL's reward metrics over the given rows (user rewards only, unscorable rows left out)."""
        out = {}
        for i, name in enumerate(self.reward_func_names):
            out[f"rewards/{name}/mean"] = torch.nanmean(rewards_per_func[:, i]).item()
            out[f"rewards/{name}/std"] = nanstd(rewards_per_func[:, i]).item()
        total = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)
        total[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        out["reward"] = torch.nanmean(total).item()
        out["reward_std"] = nanstd(total).item()
        zero_std = compute_advantages(
            rewards_per_func,
            self.reward_weights,
            num_generations=self.num_generations,
            scale_rewards=self.scale_rewards,
            aggregation=self.multi_objective_aggregation,
        ).is_std_zero
        out["frac_reward_zero_std"] = zero_std.float().mean().item()
        return out

    def _warn_underfilled(self, step: _Step, missing: int) -> None:
        args = self.args
        target = self._ds_target
        if step.rewards and torch.isnan(torch.cat(step.rewards)).all():
            cause = (
                "No completion of this batch could be scored (every reward function returned None), so no refill "
                "round was run; see the reward warning above."
            )
        elif step.generated == 0:
            cause = "No prompt could be drawn from the training set (skip_prompt passed over a whole epoch)."
        else:
            cause = (
                f"Of the {step.generated} prompt groups generated in {step.rounds} rounds, "
                f"{step.all_correct / step.generated:.0%} were all-correct and {step.all_wrong / step.generated:.0%} "
                f"all-wrong (dynamic_sampling_max_rounds={args.dynamic_sampling_max_rounds}): most prompts are too "
                "easy or too hard for the model. Raise dynamic_sampling_max_rounds, or use a dataset closer to the "
                "model's level."
            )
        message = (
            f"Dynamic sampling found {target - missing} of the {target} informative groups a batch needs. {cause}"
        )
        if args.dynamic_sampling_on_exhausted == "raise":
            raise RuntimeError(message)
        logger.warning(message + " Training on the groups collected; the rest of the batch is masked.")

    # ------------------------------------------------------------------ completions table

    def _pop_table_rows(self, rows: int) -> list[dict]:
        """Take the last `rows` rows TRL added to its completions table (one call's rows) out of it."""
        logs = self._logs
        take = min(rows, len(logs["prompt"]))
        out = [{} for _ in range(take)]
        columns = [("prompt", logs["prompt"]), ("completion", logs["completion"]), ("advantage", logs["advantages"])]
        columns += [(f"rewards/{k}", v) for k, v in logs["rewards"].items()]
        columns += [(f"extra/{k}", v) for k, v in logs["extra"].items()]
        for name, column in columns:
            values = [column.pop() for _ in range(min(take, len(column)))][::-1]
            for row, value in zip(out[take - len(values) :], values, strict=True):
                row[name] = value
        return out

    def _replace_table(self) -> None:
        """The completions table shows the rows trained in this batch, with the advantages they were trained with."""
        if not self.log_completions:
            return
        rows = getattr(self, "_table_rows", [])
        logs = self._logs
        advantages = self._trained_advantages
        for i, row in enumerate(rows):
            logs["prompt"].append(row.get("prompt"))
            logs["completion"].append(row.get("completion"))
            logs["advantages"].append(advantages[i] if i < len(advantages) else row.get("advantage"))
            for name in list(logs["rewards"]):
                logs["rewards"][name].append(row.get(f"rewards/{name}"))
            for name in list(logs["extra"]):
                logs["extra"][name].append(row.get(f"extra/{name}"))

    # ------------------------------------------------------------------ training data

    def get_train_dataloader(self):
        """With dynamic sampling the prompts come from `self._prompts`; the dataloader only paces the steps."""
        if not self._ds_active:
            return super().get_train_dataloader()
        real = self.train_dataset
        if isinstance(real, IterableDataset):
            # One pacing epoch long enough for the whole run (capped: the sampler materialises its indices), so that
            # no epoch boundary (which reseeds the dataloader from the global RNG) falls where a map-style run has none.
            size = min(self.args.max_steps * self._ds_target, 2**20)
        else:
            size = len(real)
        self.train_dataset = _PacingDataset(max(size, self._ds_target))
        try:
            return super().get_train_dataloader()
        finally:
            self.train_dataset = real

    # ------------------------------------------------------------------ exact token-level normaliser

    def _prepare_inputs(self, generation_batch):
        if not self.model.training or self.loss_type != "dapo":
            return super()._prepare_inputs(generation_batch)
        before = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if self._buffered_inputs is not before or self._window_tokens is None:
            # New generation cycle: count each micro-batch's loss tokens over all processes (collective, and every
            # process regenerates at the same step).
            local = torch.stack([_batch.loss_mask(b).sum() for b in self._buffered_inputs]).float()
            counts = self.accelerator.reduce(local, reduction="sum").tolist()
            self._window_tokens = window_token_counts(
                counts,
                steps_per_generation=self.args.steps_per_generation,
                num_iterations=self.num_iterations,
                gradient_accumulation_steps=self.args.gradient_accumulation_steps,
            )
        window = self._window_tokens[self._step % len(self._window_tokens)]
        num_items = trl_num_items_for_exact_normalizer(
            window,
            steps_per_generation=self.args.steps_per_generation,
            gradient_accumulation_steps=self.current_gradient_accumulation_steps,
        )
        return {**inputs, "num_items_in_batch": torch.tensor(num_items, device=self.accelerator.device)}

    # ------------------------------------------------------------------ loss forward and monitors

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        if kwargs.get("compute_entropy"):  # the loss forward (generation-time calls do not ask for entropies)
            self._loss_logps = logps.detach()
            inputs = self._loss_inputs
            if inputs is not None and _batch.ON_POLICY_KEY in inputs:
                # Fresh rows next to carried ones: their "old" log-probabilities are the current ones (TRL's aligned
                # case), read by TRL's loss after this forward returns.
                on_policy = inputs[_batch.ON_POLICY_KEY].unsqueeze(1)
                inputs["old_per_token_logps"] = torch.where(on_policy, self._loss_logps, inputs["old_per_token_logps"])
        return logps, entropies, aux

    def _compute_loss(self, model, inputs):
        self._loss_inputs = inputs
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._loss_inputs = None
        if self._loss_logps is not None:
            self._log_token_probs(inputs, self._loss_logps)
            if self.importance_sampling_level == "sequence":
                self._fix_sequence_clip_metrics(inputs, self._loss_logps)
            self._loss_logps = None
        return loss

    def _log_token_probs(self, inputs: dict, logps: torch.Tensor) -> None:
        """The paper's monitors (§3.1): mean probability of sampled tokens and of tokens cut by the upper clip."""
        mask = _batch.loss_mask(inputs).float()  # (B, T)
        old = inputs.get("old_per_token_logps")
        old = logps if old is None else old  # (B, T)
        advantages = inputs["advantages"]
        advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
        high = ((torch.exp(logps - old) > 1 + self.epsilon_high) & (advantages > 0)).float() * mask
        old_probs = torch.exp(old)
        sums = torch.stack([(torch.exp(logps) * mask).sum(), mask.sum(), (old_probs * high).sum(), high.sum()])
        sums = self.accelerator.reduce(sums, reduction="sum")
        self.log_metric("token_prob/mean", (sums[0] / sums[1].clamp(min=1)).item())
        if sums[3] > 0:
            self.log_metric("token_prob/high_clipped_mean", (sums[2] / sums[3]).item())

    def _fix_sequence_clip_metrics(self, inputs: dict, logps: torch.Tensor) -> None:
        """
        With `importance_sampling_level="sequence"` TRL averages `clip_ratio/*` over rows, so the fully masked rows that
        pad an underfilled batch would dilute them: recompute them over rows with at least one loss token.
        """
        if self.loss_type not in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
            return
        mask = _batch.loss_mask(inputs).float()  # (B, T)
        old = inputs.get("old_per_token_logps")
        old = logps if old is None else old
        log_ratio = ((logps - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)
        ratio = torch.exp(log_ratio)
        advantages = inputs["advantages"] if inputs["advantages"].dim() == 1 else inputs["advantages"][:, 0]
        real = (mask.sum(-1) > 0).float()
        low = ((ratio < 1 - self.epsilon_low) & (advantages < 0)).float() * real
        high = ((ratio > 1 + self.epsilon_high) & (advantages > 0)).float() * real
        sums = self.accelerator.reduce(
            torch.stack([low.sum(), high.sum(), ((low + high) > 0).float().sum(), real.sum()]), "sum"
        )
        metrics = self._metrics["train" if self.model.training else "eval"]
        count = sums[3].clamp(min=1)
        for key, value in (("low_mean", sums[0]), ("high_mean", sums[1]), ("region_mean", sums[2])):
            if metrics.get(f"clip_ratio/{key}"):
                metrics[f"clip_ratio/{key}"][-1] = (value / count).item()
        gathered_low = self.accelerator.gather(torch.where(real > 0, low, torch.full_like(low, torch.nan)))
        gathered_high = self.accelerator.gather(torch.where(real > 0, high, torch.full_like(high, torch.nan)))
        if metrics.get("clip_ratio/low_min") and not torch.isnan(gathered_low).all():
            metrics["clip_ratio/low_min"][-1] = gathered_low[~torch.isnan(gathered_low)].min().item()
        if metrics.get("clip_ratio/high_max") and not torch.isnan(gathered_high).all():
            metrics["clip_ratio/high_max"][-1] = gathered_high[~torch.isnan(gathered_high)].max().item()

    # ------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        self._save_generation_buffer(folder)
        if not self._ds_active or not self.args.should_save:
            return
        torch.save(self.sampler_state_dict(), os.path.join(folder, SAMPLER_STATE_NAME))

    def _save_generation_buffer(self, folder: str) -> None:
        """
        A checkpoint taken in the middle of a generation batch (`steps_per_generation > gradient_accumulation_steps`)
        keeps the batch's unused micro-batches, one file per process, so a resumed run trains on exactly them.
        """
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._buffered_inputs is None or self._step % generate_every == 0:
            return
        os.makedirs(folder, exist_ok=True)
        buffer = [
            {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in self._buffered_inputs
        ]
        state = {"step": self._step, "processes": self.accelerator.num_processes, "buffer": buffer}
        torch.save(state, os.path.join(folder, BUFFER_STATE_NAME.format(rank=self.accelerator.process_index)))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        self._load_generation_buffer(checkpoint)
        if not self._ds_active:
            return
        path = os.path.join(checkpoint, SAMPLER_STATE_NAME)
        if not os.path.exists(path):
            logger.warning(f"{path} not found: dynamic sampling restarts its prompt stream from the beginning.")
            return
        self.load_sampler_state_dict(_load_state_file(path))

    def _load_generation_buffer(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, BUFFER_STATE_NAME.format(rank=self.accelerator.process_index))
        if not os.path.exists(path):
            return
        state = _load_state_file(path)
        if state["processes"] != self.accelerator.num_processes:
            logger.warning(
                f"{checkpoint} was saved in the middle of a generation batch by {state['processes']} processes; this "
                f"run has {self.accelerator.num_processes}, so the rest of that batch is generated again."
            )
            return
        device = self.accelerator.device
        self._buffered_inputs = [
            {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in state["buffer"]
        ]
        self._step = int(state["step"])
        self._window_tokens = None


class _PacingDataset(torch.utils.data.Dataset):
    """Placeholder rows for the dataloader when dynamic sampling draws the prompts itself."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        return {"prompt": ""}


def _ids(groups: list[int], device) -> torch.Tensor:
    return torch.tensor(sorted(groups), dtype=torch.long, device=device)


def _load_state_file(path: str) -> dict:
    """`torch.load` of a dapo-trl state file, with an error that names the file when it is not one."""
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as error:  # truncated, foreign or garbage files fail in many ways inside torch
        raise ValueError(
            f"{path} is not a readable dapo-trl state file ({type(error).__name__}: {str(error).splitlines()[0]}). "
            "It may be truncated or come from another program. Delete it to resume without it (the prompt stream "
            "then restarts; a half-used generation batch is generated again)."
        ) from error
    if not isinstance(state, dict):
        raise ValueError(
            f"{path} holds a {type(state).__name__}, not a dapo-trl state dict. Delete it to resume without it."
        )
    return state


def _to_dapo_config(args: GRPOConfig) -> DAPOConfig:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(GRPOConfig) if f.init}
    values["generation_batch_size"] = None  # derived again from steps_per_generation
    logger.warning(
        "DAPOTrainer got a GRPOConfig: converted to DAPOConfig keeping its values; the DAPO-only settings "
        "(dynamic_sampling, overlong_shaping, ...) take their defaults."
    )
    return DAPOConfig(**values)


def _check_train_dataset(dataset: Any, args: DAPOConfig, has_environment: bool) -> None:
    """Refuse a training set that cannot train, naming the column or the rows, before TRL fails on it at step 1."""
    if dataset is None:
        return
    if isinstance(dataset, IterableDataset):
        if args.max_steps is None or args.max_steps <= 0:
            raise ValueError(
                "A streamed (IterableDataset) training set has no length, so the number of steps must be given: set "
                "max_steps."
            )
        return
    columns = getattr(dataset, "column_names", None)
    if columns is not None and "prompt" not in columns and not has_environment:
        raise ValueError(
            f"The training dataset has no 'prompt' column (its columns are {columns}). Rename the column holding the "
            "prompts to 'prompt' (e.g. dataset.rename_column('question', 'prompt')), or build it with "
            "dapo_trl.data.load_math_dataset."
        )
    if len(dataset) == 0:
        raise ValueError("The training dataset is empty.")
    if columns is not None and "prompt" in columns:
        empty = [i for i, prompt in enumerate(dataset["prompt"]) if not prompt]
        if empty:
            raise ValueError(
                f"The training dataset has {len(empty)} empty prompts (rows {empty[:10]}{' ...' if len(empty) > 10 else ''}). "
                "Remove them (e.g. dataset.filter(lambda row: row['prompt'])): a model cannot generate from nothing."
            )
    prompts_per_batch = args.generation_batch_size // args.num_generations
    if not args.dynamic_sampling and len(dataset) < prompts_per_batch:
        raise ValueError(
            f"The training dataset has {len(dataset)} prompts but one generation batch needs {prompts_per_batch} "
            f"(generation_batch_size {args.generation_batch_size} / num_generations {args.num_generations}); with "
            "dynamic_sampling=False, TRL's sampler would yield no batch and train 0 steps. Use more prompts, a smaller "
            "batch, or dynamic_sampling=True (which cycles the prompts)."
        )


def _warn_duplicates(dataset) -> None:
    if "prompt" not in dataset.column_names:
        return
    counts = Counter(repr(p) for p in dataset["prompt"])
    duplicates = len(dataset) - len(counts)
    if duplicates:
        logger.warning(
            f"The training dataset holds {duplicates} duplicated prompts ({len(counts)} unique of {len(dataset)}). "
            "Dynamic sampling never repeats a row within an epoch, but duplicated rows are still drawn once each; "
            "deduplicate the dataset (DAPO-Math-17k repeats each prompt ~100x) unless the repetition is intended."
        )
