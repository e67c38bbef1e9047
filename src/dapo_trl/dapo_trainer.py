"""[`DAPOTrainer`]: TRL's `GRPOTrainer` with the DAPO recipe (arXiv 2503.14476).

Glue only. Every decision lives in a pure module (`loss`, `overlong`, `sampling`, `_batch`); this class connects them
to TRL at a few documented override points and never copies a TRL private method:

| override                                | why                                                                        |
|-----------------------------------------|----------------------------------------------------------------------------|
| `_calculate_rewards`                    | keep the gathered per-function rewards (dynamic sampling filters on them)  |
| `_generate_and_score_completions`       | run generation rounds until the batch holds only informative groups        |
| `_prepare_inputs`                       | replace TRL's approximate token normaliser by the exact per-step count     |
| `_get_per_token_logps_and_entropies`    | keep the loss forward's log-probabilities for the paper's monitors         |
| `_compute_loss`                         | log those monitors (the loss itself is TRL's)                              |
| `_save_checkpoint` / `_load_optimizer_and_scheduler` | save and restore the sampler state                            |

`tests/test_trl_compat.py` pins the signatures of these TRL methods, so a TRL release that changes one fails loudly.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import textwrap
from collections import Counter
from typing import Any

import torch
from datasets import IterableDataset
from trl import GRPOConfig, GRPOTrainer

from . import _batch
from .dapo_config import DAPOConfig
from .diagnostics import add_diagnostics
from .loss import trl_num_items_for_exact_normalizer, window_token_counts
from .overlong import OverlongPenalty
from .sampling import GroupClassification, PromptStream, RoundPlanner, SelectionPlan, classify_groups, plan_selection

logger = logging.getLogger(__name__)

SAMPLER_STATE_NAME = "dapo_sampler_state.pt"


class DAPOTrainer(GRPOTrainer):
    """
    Trainer for DAPO: Decoupled Clip and Dynamic sAmpling Policy Optimization.

    A drop-in replacement for [`~trl.GRPOTrainer`] (same constructor arguments) configured by [`DAPOConfig`]. On top
    of TRL it adds:

    - **Dynamic sampling** (§3.2): prompt groups whose filter reward is constant are dropped and new prompts are
      generated until the generation batch holds `generation_batch_size // num_generations` informative groups.
      Rounds are sized from the informative rate seen so far, surplus groups can be carried to the next step, the
      prompts come from a resumable shuffled stream over the training set, and every process runs the same rounds.
    - **Exact token-level loss** (§3.3): TRL's `loss_type="dapo"` surrogate divided by the exact number of completion
      tokens of the optimizer step (all accumulation micro-batches, all processes).
    - **Overlong reward shaping** (§3.4): the soft length penalty of Eq. 13, added to the correctness reward as an extra
      reward column (`rewards/overlong_penalty/mean`).
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
        self._user_reward_count = len(self.reward_funcs)
        self._last_rewards_per_func: torch.Tensor | None = None
        self._window_tokens: list[float] | None = None
        self._loss_logps: torch.Tensor | None = None
        self._setup_overlong()
        self._setup_dynamic_sampling()
        if self.args.diagnostics:
            add_diagnostics(self)

    # ------------------------------------------------------------------ set-up

    def _setup_overlong(self) -> None:
        penalty = self.build_overlong_penalty()
        if penalty is None:
            return
        # Appended the way TRL appends environment rewards, so TRL sums it into the reward before advantages.
        self.reward_funcs.append(penalty)
        self.reward_func_names.append(getattr(penalty, "__name__", type(penalty).__name__))
        self.reward_processing_classes.append(None)
        self.reward_weights = torch.cat([self.reward_weights, torch.ones(1)])

    def _setup_dynamic_sampling(self) -> None:
        args = self.args
        names = self.reward_func_names
        name = args.dynamic_sampling_reward
        if name is None:
            self._filter_index: int | None = 0
        elif name == "total":
            self._filter_index = None
        elif name in names:
            self._filter_index = names.index(name)
        else:
            raise ValueError(
                f"dynamic_sampling_reward={name!r} is not a reward function of this trainer. Choose one of {names} "
                "or 'total'."
            )
        filter_func = self.reward_funcs[self._filter_index] if self._filter_index is not None else None
        correct = getattr(filter_func, "correct_reward", None)
        self._correct_value: float | None = float(correct) if correct is not None else None

        self._ds_target = args.generation_batch_size // self.num_generations
        if not args.dynamic_sampling:
            return
        if self.train_dataset is None:
            return  # evaluation-only trainer
        if isinstance(self.train_dataset, IterableDataset):
            raise ValueError(
                "dynamic_sampling needs a map-style training dataset (it draws refill prompts by index); got an "
                "IterableDataset. Load the dataset without streaming, or set dynamic_sampling=False."
            )
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
        self._stream = PromptStream(len(self.train_dataset), seed=args.seed, shuffle=self.shuffle_dataset)
        self._carry: dict | None = None  # rows of carried groups, replicated on every process, group order
        self._carry_groups = 0
        _warn_duplicates(self.train_dataset)

    def build_overlong_penalty(self):
        """
        Extension point: the reward function added for overlong shaping, or `None` for none.

        Called once at construction. The returned callable must follow TRL's reward signature (it receives
        `completion_ids` and `log_metric` among the keyword arguments) and return one float per completion; it is
        summed with weight 1 into the reward before advantages (DAPO Eq. 13) and logged under its `__name__`.
        Default: [`OverlongPenalty`] from `overlong_buffer_len` and `overlong_penalty_factor`.
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
                for each of the `F` reward functions, `NaN` where a function returned `None`. The overlong penalty,
                when enabled, is the last column.

        Returns:
            `torch.Tensor` of shape `(N,)`. Default: the `dynamic_sampling_reward` column (the first reward function,
            i.e. correctness before overlong shaping), or the weighted total for `"total"`. Must be computed from the
            arguments only, so every process reaches the same decision.
        """
        if self._filter_index is not None:
            return rewards_per_func[:, self._filter_index]
        weights = self.reward_weights.to(rewards_per_func.device)
        return (rewards_per_func * weights).nansum(dim=1)

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
        own sampler picks prompts and this is not called. Must give the same answer on every process. If a whole epoch
        of prompts is skipped, the batch comes out underfilled (see `dynamic_sampling_on_exhausted`). Default: never.
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
            "stream": self._stream.state_dict(),
            "planner": self._planner.state_dict(),
            "carry": {k: v.cpu() for k, v in self._carry.items()} if self._carry else None,
            "carry_groups": self._carry_groups,
        }

    def load_sampler_state_dict(self, state: dict) -> None:
        """Extension point: restore what [`sampler_state_dict`] saved (call `super()` first in subclasses)."""
        self._stream.load_state_dict(state["stream"])
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
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # (N, F)
        self._last_rewards_per_func = rewards_per_func
        self._log_length_by_correctness(rewards_per_func, completion_ids_list)
        return rewards_per_func

    def _log_length_by_correctness(self, rewards_per_func: torch.Tensor, completion_ids_list) -> None:
        if self._correct_value is None:
            return
        device = rewards_per_func.device
        lengths = torch.tensor([len(ids) for ids in completion_ids_list], device=device, dtype=torch.float32)
        lengths = self.accelerator.gather(lengths)  # (N,)
        correct = self.filter_values(rewards_per_func) >= self._correct_value
        self.log_metric("accuracy", correct.float().mean().item())
        for name, rows in (("correct", correct), ("incorrect", ~correct)):
            if rows.any():
                self.log_metric(f"completions/{name}_mean_length", lengths[rows].mean().item())
                self.log_metric(f"completions/{name}_max_length", lengths[rows].max().item())

    # ------------------------------------------------------------------ dynamic sampling

    def _generate_and_score_completions(self, inputs):
        if not self.model.training or not self.args.dynamic_sampling:
            return super()._generate_and_score_completions(inputs)
        # The dataloader's batch only paces the steps: prompts come from the resumable stream, so that refills never
        # repeat a prompt within an epoch and every process draws the same ones.
        return self._dynamic_sampling_batch()

    def _dynamic_sampling_batch(self) -> dict:
        args = self.args
        device = self.accelerator.device
        rank, processes = self.accelerator.process_index, self.accelerator.num_processes
        G, target = self.num_generations, self._ds_target
        num_carried = self._carry_groups
        needed = max(target - num_carried, 0)

        pieces: list[dict] = []  # this process's rows of informative groups, per round
        num_fresh = rounds = generated = all_correct = all_wrong = 0
        reward_sum = correct_sum = 0.0
        template = None
        while num_fresh < needed and rounds < args.dynamic_sampling_max_rounds:
            size = self._planner.next_round_size(needed - num_fresh)
            indices = self._stream.take(size, skip=self.skip_prompt)
            indices = indices[: len(indices) - len(indices) % self._planner.granularity]
            if not indices:
                break
            rounds += 1
            rows = [dict(row) for row in self._dataset_rows(indices) for _ in range(G)]  # copies: TRL may edit rows
            per_process = len(rows) // processes
            local = rows[rank * per_process : (rank + 1) * per_process]
            out = super()._generate_and_score_completions(local)
            _batch.check_supported(out)
            template = out
            rewards_per_func = self._last_rewards_per_func  # (n G, F), gathered
            values = self.filter_values(rewards_per_func).view(-1, G)  # (n, G)
            informative = self.select_informative_groups(values).to(device)  # (n,)
            classes = classify_groups(
                values.flatten(), G, tolerance=args.dynamic_sampling_tolerance, correct_value=self._correct_value
            )
            self.on_groups_scored(indices, values, informative, classes)
            self._planner.update(len(indices), int(informative.sum()))
            generated += len(indices)
            all_correct += int(classes.all_correct.sum())
            all_wrong += int(classes.all_wrong.sum())
            total = (rewards_per_func * self.reward_weights.to(device)).nansum(dim=1)  # (n G,)
            reward_sum += total.sum().item()
            if self._correct_value is not None:
                correct_sum += (values >= self._correct_value).sum().item()

            # Number informative groups in generation order, continuing the count of earlier rounds.
            group_ids = torch.cumsum(informative.long(), 0) - 1 + num_carried + num_fresh  # (n,)
            local_groups = torch.arange(rank * per_process, (rank + 1) * per_process, device=device) // G
            keep = informative[local_groups]
            out["_group"] = group_ids[local_groups]
            out["_value"] = values.flatten()[rank * per_process : (rank + 1) * per_process]
            out["_reward"] = total[rank * per_process : (rank + 1) * per_process]
            piece = _batch.select_rows(out, keep)
            if args.dynamic_sampling_carry_over and "old_per_token_logps" not in out:
                # Carried rows must keep the sampling policy's log-probabilities (their ratio is taken against it), so
                # compute them now, before the policy moves, for the kept rows only.
                piece["old_per_token_logps"] = self._sampling_logps(piece)
                out["old_per_token_logps"] = torch.zeros_like(out["completion_mask"], dtype=torch.float32)  # shapes
            pieces.append(piece)
            num_fresh += int(informative.sum())

        if template is None and self._carry is None:
            raise RuntimeError("Dynamic sampling could not draw any prompt from the training dataset.")
        plan, missing = self.plan_batch(num_carried=num_carried, num_fresh=num_fresh, target=target)
        wanted = _ids(plan.train + plan.carry, device)
        fresh = _batch.concat_rows(pieces, pad_token_id=self._tokenizer.pad_token_id)
        if fresh:
            fresh = _batch.select_rows(fresh, torch.isin(fresh["_group"], wanted))
        fresh = self._all_gather_rows(fresh, template if template is not None else self._carry)
        candidates = [b for b in (self._carry, fresh) if b]
        if (
            candidates
            and "old_per_token_logps" in candidates[0]
            and any("old_per_token_logps" not in b for b in candidates)
        ):
            raise RuntimeError("Internal error: carried and fresh rows disagree on old_per_token_logps.")
        pool = _batch.concat_rows(candidates, pad_token_id=self._tokenizer.pad_token_id)
        train = carry = {}
        if pool:
            pool = _batch.select_rows(pool, torch.argsort(pool["_group"], stable=True))
            train = _batch.select_rows(pool, torch.isin(pool["_group"], _ids(plan.train, device)))
            carry = _batch.select_rows(pool, torch.isin(pool["_group"], _ids(plan.carry, device)))
        if plan.carry:
            # Renumber carried groups 0..k-1 for the next step.
            carry["_group"] = torch.searchsorted(_ids(plan.carry, device), carry["_group"])
            self._carry, self._carry_groups = carry, len(plan.carry)
        else:
            self._carry, self._carry_groups = None, 0

        if missing:
            message = (
                f"Dynamic sampling found {target - missing} informative groups of the {target} a generation batch "
                f"needs after {rounds} rounds (dynamic_sampling_max_rounds={args.dynamic_sampling_max_rounds}); "
                f"{generated} prompt groups were generated. Most prompts are too easy or too hard for the model: "
                "raise dynamic_sampling_max_rounds, use a more suitable dataset, or lower num_generations' "
                "difficulty spread."
            )
            if args.dynamic_sampling_on_exhausted == "raise":
                raise RuntimeError(message)
            logger.warning(message + " Training on the groups collected; the rest of the batch is masked.")
        total_rows = target * G
        filler = next(b for b in (train, pool, template) if b and b["completion_ids"].size(0))
        train = _batch.pad_rows(train, total_rows, template=filler, pad_token_id=self._tokenizer.pad_token_id)
        trained_rows = train["_group"] >= 0
        per_group = 1 / generated if generated else math.nan  # NaN (skipped by TRL's log) when only carried groups
        stats = {
            "rounds": rounds,
            "groups_generated": generated,
            "informative_frac": num_fresh * per_group,
            "all_correct_frac": all_correct * per_group,
            "all_wrong_frac": all_wrong * per_group,
            "groups_carried": min(num_carried, target),
            "groups_discarded": len(plan.discard),
            "groups_trained": len(plan.train),
            "underfilled": float(missing > 0),
            "prompts_consumed": self._stream.consumed,
            "reward_before_filter": reward_sum * per_group / G,
            "reward_after_filter": train["_reward"][trained_rows].mean().item() if trained_rows.any() else math.nan,
        }
        if self._correct_value is not None:
            stats["accuracy_before_filter"] = correct_sum * per_group / G
            after = (train["_value"][trained_rows] >= self._correct_value).float()
            stats["accuracy_after_filter"] = after.mean().item() if after.numel() else math.nan
        self.log_dynamic_sampling(stats)

        per_process = total_rows // processes
        local = _batch.select_rows(train, torch.arange(rank * per_process, (rank + 1) * per_process, device=device))
        local = {k: v for k, v in local.items() if not k.startswith("_")}
        local["num_items_in_batch"] = self.accelerator.gather(_batch.loss_mask(local).sum()).sum()
        return local

    def _dataset_rows(self, indices: list[int]) -> list[dict[str, Any]]:
        columns = self.train_dataset[indices]
        return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]

    @torch.no_grad()
    def _sampling_logps(self, batch: dict) -> torch.Tensor:
        if batch["completion_ids"].size(0) == 0:
            return torch.zeros_like(batch["completion_ids"], dtype=torch.float32)
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
        if "_group" not in shape_source:
            shape_source = {**shape_source, "_group": torch.zeros(0, dtype=torch.long, device=device)}
            shape_source["_value"] = torch.zeros(0, device=device)
            shape_source["_reward"] = torch.zeros(0, device=device)
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

    # ------------------------------------------------------------------ monitors

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        if kwargs.get("compute_entropy"):  # the loss forward (generation-time calls do not ask for entropies)
            self._loss_logps = logps.detach()
        return logps, entropies, aux

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        if self._loss_logps is not None:
            self._log_token_probs(inputs, self._loss_logps)
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

    # ------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if not self.args.dynamic_sampling or not hasattr(self, "_stream") or not self.args.should_save:
            return
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        torch.save(self.sampler_state_dict(), os.path.join(folder, SAMPLER_STATE_NAME))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None or not self.args.dynamic_sampling or not hasattr(self, "_stream"):
            return
        path = os.path.join(checkpoint, SAMPLER_STATE_NAME)
        if not os.path.exists(path):
            logger.warning(f"{path} not found: dynamic sampling restarts its prompt stream from the beginning.")
            return
        self.load_sampler_state_dict(torch.load(path, weights_only=True))


def _ids(groups: list[int], device) -> torch.Tensor:
    return torch.tensor(sorted(groups), dtype=torch.long, device=device)


def _to_dapo_config(args: GRPOConfig) -> DAPOConfig:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(GRPOConfig) if f.init}
    values["generation_batch_size"] = None  # derived again from steps_per_generation
    logger.warning(
        "DAPOTrainer got a GRPOConfig: converted to DAPOConfig keeping its values; the DAPO-only settings "
        "(dynamic_sampling, overlong_shaping, ...) take their defaults."
    )
    return DAPOConfig(**values)


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
