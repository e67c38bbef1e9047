"""Dynamic sampling (DAPO §3.2, Algorithm 1) inside the trainer: the rounds of one generation batch.

[`DAPOTrainer`] inherits this mixin. A generation batch is built in named steps:

    draw a round of prompts -> generate and score them through TRL -> select the informative groups
    (repeat until the batch is full or the rounds run out) -> assemble the batch -> log it once

Decisions (which groups are informative, how big a round is, what is trained, carried or discarded) are made by the
pure functions of `sampling.py` and the trainer's extension points, on values gathered from every process, so every
process runs the same rounds; generation calls hold at most one generation batch each; the rows of a process are
all-gathered before the batch is cut into equal per-process slices.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch

from . import _batch
from .advantages import compute_advantages, nanstd
from .metrics import merge_completion_metrics, merge_metric
from .sampling import SelectionPlan, classify_groups

logger = logging.getLogger(__name__)

# TRL's metrics that are recomputed over all rows a generation batch generated (see `_merge_call_metrics`).
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
    num_carried: int  # groups carried in from the previous batch (candidate ids 0 .. num_carried - 1)
    metric_marks: dict[str, int]  # length of each metric list before the first round
    pieces: list[dict] = field(default_factory=list)  # this process's rows of informative groups, per round
    rewards: list[torch.Tensor] = field(default_factory=list)  # per round, gathered (n G, F)
    penalty: list[torch.Tensor] = field(default_factory=list)
    lengths: list[torch.Tensor] = field(default_factory=list)
    truncated: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)  # filter values, per round (n, G)
    rows_per_call: list[int] = field(default_factory=list)
    table: dict[int, list[dict]] = field(default_factory=dict)  # fresh informative group id -> table rows
    trained_table: dict[int, list[dict]] = field(default_factory=dict)  # trained group id -> table rows
    num_fresh: int = 0
    rounds: int = 0
    generated: int = 0
    all_correct: int = 0
    all_wrong: int = 0
    template: dict | None = None


class DynamicSamplingMixin:
    """The dynamic-sampling steps of [`DAPOTrainer`] (kept apart so each step reads on its own)."""

    def _dynamic_sampling_batch(self) -> dict:
        """One generation batch of informative groups: draw -> generate and score -> select, until full; assemble."""
        args = self.args
        step = _Step(
            needed=max(self._ds_target - self._carry_groups, 0),
            num_carried=self._carry_groups,
            metric_marks=self._metric_marks(),
        )
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

    def _skip_rule(self):
        """`skip_prompt`, composed with the pre-rollout skip policy when it is on (the user's rule is asked first)."""
        policy = self._skip_policy
        if policy is None:
            return self.skip_prompt
        return lambda index: self.skip_prompt(index) or policy.should_skip(index)

    def _draw_round(self, needed: int) -> tuple[list[int], list[dict]]:
        """The prompts of the next round: as many as the planner asks for, a multiple of its granularity."""
        size = self._planner.next_round_size(needed)
        indices, rows = self._prompts.take(size, skip=self._skip_rule())
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
        if self._skip_policy is not None:
            self._skip_policy.record(scored.indices, classes, step=self.state.global_step, informative=informative)
        self._planner.update(len(scored.indices), int(informative.sum()))

        # Number informative groups in generation order, continuing the count of earlier rounds.
        group_ids = torch.cumsum(informative.long(), 0) - 1 + step.num_carried + step.num_fresh  # (n,)
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
        num_carried = step.num_carried
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
        step.trained_table = {g: table[g] for g in plan.train if g in table}
        if plan.carry:  # renumber carried groups 0..k-1 for the next step
            carry["_group"] = torch.searchsorted(_ids(plan.carry, device), carry["_group"])
            self._carry, self._carry_groups = carry, len(plan.carry)
            self._carry_table = {i: table[g] for i, g in enumerate(sorted(plan.carry)) if g in table}
        else:
            self._carry, self._carry_groups, self._carry_table = None, 0, {}
        filler = next(b for b in (train, pool, template) if b and b["completion_ids"].size(0))
        train = _batch.pad_rows(train, self._ds_target * self.num_generations, template=filler, pad_token_id=pad)
        train["advantages"] = self._batch_advantages(train)
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
            "groups_carried": min(step.num_carried, self._ds_target),
            "groups_discarded": len(plan.discard),
            "groups_trained": len(plan.train),
            "underfilled": float(missing > 0),
            "underfilled_steps": getattr(self, "_underfilled_steps", 0),  # so far: the warning is printed once
            "prompts_consumed": self._prompts.consumed,
            "reward_before_filter": self._mean_total_reward(torch.cat(step.rewards)) if step.rewards else math.nan,
            "reward_after_filter": self._mean_total_reward(batch["_rewards"][trained]),
        }
        if self._correct_value is not None:
            values = torch.cat([v.flatten() for v in step.values]) if step.values else torch.zeros(0)
            stats["accuracy_before_filter"] = self._accuracy(values)
            stats["accuracy_after_filter"] = self._accuracy(batch["_value"][trained])
        if self._skip_policy is not None:
            stats.update(self._skip_policy.metrics())
        self.log_dynamic_sampling(stats)
        self._log_importance_sampling(batch, replicated=True)
        self._replace_table(step, batch)

    def _total_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """Weighted sum of the user's rewards per row (`(N,)`), NaN where no reward scored the row, as TRL logs it."""
        total = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)
        return torch.where(torch.isnan(rewards_per_func).all(dim=1), torch.full_like(total, torch.nan), total)

    def _mean_total_reward(self, rewards_per_func: torch.Tensor) -> float:
        """Mean of [`_total_rewards`] over the scorable rows (NaN when there are none)."""
        total = self._total_rewards(rewards_per_func)
        return torch.nanmean(total).item() if total.numel() else math.nan

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
        total = self._total_rewards(rewards_per_func)
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
            kind = "unscorable"
            cause = (
                "No completion of this batch could be scored (every reward function returned None), so no refill "
                "round was run; see the reward warning above."
            )
        elif step.generated == 0:
            kind = "no_prompt"
            cause = "No prompt could be drawn from the training set (skip_prompt passed over a whole epoch)."
        else:
            kind = "no_informative_group"
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
        # the same cause tends to recur every step: warn once per cause, then count (dynamic_sampling/underfilled_steps)
        self._underfilled_steps = getattr(self, "_underfilled_steps", 0) + 1
        warned = self.__dict__.setdefault("_underfill_causes_warned", set())
        if kind not in warned:
            warned.add(kind)
            logger.warning(
                message + " Training on the groups collected; the rest of the batch is masked. Later underfilled "
                "steps with this cause are not warned about again: dynamic_sampling/underfilled_steps counts them."
            )
        else:
            logger.debug(message)

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

    def _replace_table(self, step: _Step, batch: dict) -> None:
        """The completions table shows the rows trained in this batch, with the advantages they were trained with."""
        if not self.log_completions:
            return
        logs = self._logs
        for group, rows in sorted(step.trained_table.items()):
            advantages = batch["advantages"][batch["_group"] == group].tolist()  # the group's rows, in table order
            for row, advantage in zip(rows, advantages):
                logs["prompt"].append(row.get("prompt"))
                logs["completion"].append(row.get("completion"))
                logs["advantages"].append(advantage)
                for name in list(logs["rewards"]):
                    logs["rewards"][name].append(row.get(f"rewards/{name}"))
                for name in list(logs["extra"]):
                    logs["extra"][name].append(row.get(f"extra/{name}"))


def _ids(groups: list[int], device) -> torch.Tensor:
    return torch.tensor(sorted(groups), dtype=torch.long, device=device)
