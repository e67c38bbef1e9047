"""Dynamic sampling (DAPO §3.2, Algorithm 1) inside the trainer: the rounds of one generation batch.

[`DAPOTrainer`] inherits this mixin. A generation batch is built in named steps:

    draw a round of prompts -> generate and score them through TRL -> select the informative groups
    (repeat until the batch is full or the rounds run out) -> assemble the batch -> log it once

With `dynamic_sampling_probe = k`, "generate and score" is two TRL calls: a probe of `k` completions per prompt, then
the rest of the groups the probe rule completes (`probing.py`); the round then holds whole groups of `G` as before.

Decisions (which groups are informative, how big a round is, what is trained, carried or discarded) are made by the
pure functions of `sampling` and the trainer's extension points, on values gathered from every process, so every
process runs the same rounds; each round is scored in one TRL call (one call per reward function) and generated in
chunks of at most one generation batch; the rows of a process are all-gathered before the batch is cut into equal
per-process slices.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict, deque
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from . import batch as _batch
from .advantages import compute_advantages, nanstd
from .metrics import merge_completion_metrics, merge_metric
from .probing import pad_completions
from .row_exchange import exchange_rows, mask_padding, plan_exchange
from .sampling import GroupClassification, SelectionPlan, classify_groups, round_up
from .underfill import UnderfillFacts, group_spreads, single_value, underfill_cause, underfill_kind

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
    # Probed rounds: the probe's classification, the groups completed after it and the rows generated (n G,) (a
    # dropped group's rest never was: NaN rewards, no local rows).
    probe: GroupClassification | None = None
    completed: np.ndarray | None = None
    generated: torch.Tensor | None = None


class RowChunkedModel(nn.Module):
    """`model`'s forward over at most `rows` rows at a time; TRL reads only `.logits` of a reward model's output."""

    def __init__(self, model: nn.Module, rows: int) -> None:
        super().__init__()
        self.model, self.rows = model, max(rows, 1)

    def forward(self, **inputs):
        total = next((v.size(0) for v in inputs.values() if isinstance(v, torch.Tensor)), 0)
        if total <= self.rows:
            return self.model(**inputs)
        logits = [
            self.model(
                **{k: v[start : start + self.rows] if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
            ).logits
            for start in range(0, total, self.rows)
        ]
        return SimpleNamespace(logits=torch.cat(logits))


@dataclass
class _Call:
    """One TRL generation call of a round: this process's rows, per generation-batch chunk, and their round positions."""

    chunks: list[list[dict]]
    positions: torch.Tensor  # (rows,) position of each local row in the round


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
    real_rows: list[torch.Tensor] = field(default_factory=list)  # per round (n G,): the rows generated
    rows_per_call: list[int] = field(default_factory=list)
    table: dict[int, list[dict]] = field(default_factory=dict)  # fresh informative group id -> table rows
    trained_table: dict[int, list[dict]] = field(default_factory=dict)  # trained group id -> table rows
    num_fresh: int = 0
    rounds: int = 0
    generated: int = 0
    all_correct: int = 0
    all_wrong: int = 0
    mixed: int = 0
    ended_constant: bool = False  # the refill stopped because the filter reward gave every completion one value
    template: dict | None = None


# One value (or one per reward) per row: gathered from every process to decide, log and compute advantages.
_SMALL_KEYS = ("_group", "_value", "_rewards", "_penalty", "_sampled_at")


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
            if step.rounds and self._no_informative.established:
                break  # recent rounds found nothing informative: one round per step until one does
            indices, rows = self._draw_round(step.needed - step.num_fresh)
            if not indices:
                break
            if self._probe_rule is not None:
                scored = self._probe_and_complete_round(indices, rows)
            else:
                scored = self._generate_and_score_round(indices, rows)
            self._select_round(step, scored, environments=[row.get("environment") for row in rows])
            if torch.isnan(scored.rewards).all():
                break  # no reward could score anything: more rounds would cost as much and find nothing
            if step.ended_constant:
                break  # the filter reward gives every completion one value: more rounds cannot change that
        scored = None  # the last round's rows: the kept ones are in `step`; freed before assembly copies those
        self._no_informative.end_step(rounds=step.rounds, max_rounds=args.dynamic_sampling_max_rounds)
        batch, facts, plan, missing = self._assemble_batch(step)
        # The policy version that sampled each carried group, in the order the next batch numbers them.
        self._carry_sampled_at = [
            self._carry_sampled_at[g] if g < step.num_carried else self._policy_updates for g in sorted(plan.carry)
        ]
        self._log_step(step, facts, plan, missing, local=batch)
        return self._local_rows(batch)

    def _filter_looks_constant(self) -> bool:
        """
        Whether the filter reward gives every completion one value, so that refill rounds cannot find an informative
        group. Not for a reward that declares its correct value (`correct_reward`, e.g. a verifier): it scores the
        completion, and its single value means prompts all solved or all failed, which more rounds may change.
        """
        return self._correct_value is None and self._constant_watch.established

    def _skip_rule(self):
        """`skip_prompt`, composed with the pre-rollout skip policy when it is on (the user's rule is asked first)."""
        policy = self._skip_policy
        if policy is None:
            return self.skip_prompt
        return lambda index: self.skip_prompt(index) or policy.should_skip(index)

    def _draw_round(self, needed: int) -> tuple[list[int], list[dict]]:
        """
        The prompts of the next round: as many as the planner asks for, a multiple of its granularity; only the missing
        number while the filter reward gives every completion one value, or while recent rounds found no informative
        group at all (oversampling cannot help then).
        """
        if self._filter_looks_constant() or self._no_informative.established:
            size = round_up(needed, self._planner.granularity)
        else:
            size = self._planner.next_round_size(needed)
        indices, rows = self._prompts.take(size, skip=self._skip_rule())
        keep = len(indices) - len(indices) % self._planner.granularity
        return indices[:keep], rows[:keep]

    def _generate_and_score_round(
        self, indices: list[int], rows: list[dict], generations: int | None = None
    ) -> _Round:
        """
        Generate and score `G` completions for each prompt (`generations` for a probe or its rest), through TRL.
        Generation runs in chunks of at most one generation batch (so a large round never generates more at once than a
        plain TRL step), but the whole round is scored in one TRL call, so each reward function is called once per round
        (see [`_round_calls`]). Every process makes the same calls with the same number of rows, so every model forward
        runs equally often on every process (ZeRO-3 and FSDP need it).
        """
        G = generations or self.num_generations
        outs, rewards, penalty, lengths, truncated, rows_per_call, table = [], [], [], [], [], [], []
        for call in self._round_calls(rows, G):
            self._generation_chunks = [len(chunk) for chunk in call.chunks] if len(call.chunks) > 1 else None
            # The call's table rows go to an unbounded log of their own: TRL's columns keep one generation batch of
            # rows, fewer than a large round has.
            kept, self._logs = self._logs, _unbounded_logs()
            whole, self.num_generations = self.num_generations, G  # TRL generates and groups rows by it
            try:
                out = super()._generate_and_score_completions([row for chunk in call.chunks for row in chunk])
            finally:
                self._generation_chunks = None
                self.num_generations = whole
                call_logs, self._logs = self._logs, kept
            _batch.check_supported(out)
            out.pop("num_items_in_batch", None)
            out["_row"] = call.positions.to(self.accelerator.device)
            if self._needs_sampling_logps(out):
                out["_carry_logps"] = self._sampling_logps(out)  # every local row, so forward counts match
            outs.append(out)
            # TRL gathers in process order; put the call's rows back in round order (groups of G contiguous).
            order = self.accelerator.gather(out["_row"])
            order = order - order.min()
            rewards.append(_in_round_order(self._last_rewards_per_func, order))
            penalty.append(_in_round_order(self._last_penalty, order))
            lengths.append(_in_round_order(self._last_lengths, order))
            truncated.append(_in_round_order(self._last_truncated, order))
            rows_per_call.append(order.numel())
            if self.log_completions:
                popped = self._pop_table_rows(order.numel(), call_logs)
                if len(popped) == order.numel():
                    popped = [popped[i] for i in torch.argsort(order).tolist()]
                table.extend(popped)
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

    def _round_calls(self, rows: list[dict], generations: int | None = None) -> list[_Call]:
        """
        The TRL calls of a round (`generations` completions per prompt, default `G`) and this process's rows in each,
        cut in chunks of at most one generation batch (each chunk split evenly over the processes, as in a plain TRL
        step). One call holds every chunk, so a reward with a fixed cost per call (a remote judge, a sandbox start) pays
        it once per round. With tools, environments or a `rollout_func`, whose generation this trainer cannot cut in
        chunks, each chunk is its own call.
        """
        G = generations or self.num_generations
        processes, rank = self.accelerator.num_processes, self.accelerator.process_index
        per_chunk = self._ds_target  # prompts whose rows fill one generation batch
        if G != self.num_generations:  # a probe or its rest: as many prompts as fill one, split evenly
            even = processes // math.gcd(G, processes)
            per_chunk = max(self._ds_target * self.num_generations // G // even * even, even)
        chunks, positions = [], []
        for start in range(0, len(rows), per_chunk):
            expanded = [dict(row) for row in rows[start : start + per_chunk] for _ in range(G)]  # TRL edits rows
            per_process = len(expanded) // processes
            chunks.append(expanded[rank * per_process : (rank + 1) * per_process])
            offset = start * G + rank * per_process
            positions.append(torch.arange(offset, offset + per_process))
        if self.tools or self.rollout_func is not None or self.environment_factories is not None:
            return [_Call([chunk], position) for chunk, position in zip(chunks, positions, strict=True)]
        return [_Call(chunks, torch.cat(positions))] if chunks else []

    def _probe_and_complete_round(self, indices: list[int], rows: list[dict]) -> _Round:
        """
        A round that probes before completing (`dynamic_sampling_probe = k`, see `trainer/probing.py`): `k`
        completions of every prompt in one TRL call, then the other `G - k` of the groups [`ProbeRule`] picks in a
        second call with the same sampling settings. The round holds whole groups of `G`, the probe's completions
        first; the rest of a dropped group is never generated. The choice is made on gathered values (the same on every
        process) and padded so that the second call's rows split evenly over the processes.
        """
        G, k = self.num_generations, self._probe_rule.probe
        probe = self._generate_and_score_round(indices, rows, generations=k)
        self._round_penalty = probe.penalty
        values = self.filter_values(probe.rewards)  # (n k,)
        self._round_penalty = None
        probed = classify_groups(
            values, k, tolerance=self.args.dynamic_sampling_tolerance, correct_value=self._correct_value
        )
        processes = self.accelerator.num_processes
        completed = self._probe_rule.complete(indices, probed)
        completed = pad_completions(completed, processes // math.gcd(G - k, processes))
        chosen = np.flatnonzero(completed).tolist()
        rest = None
        if chosen:
            rest = self._generate_and_score_round([indices[j] for j in chosen], [rows[j] for j in chosen], G - k)
        return _completed_round(probe, rest, completed, probed, G, pad_token_id=self._tokenizer.pad_token_id)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, *args, **kwargs):
        """TRL's generation, in the chunks [`_round_calls`] planned (once: a tool loop's later turns are not cut)."""
        sizes, self._generation_chunks = getattr(self, "_generation_chunks", None), None
        if not sizes:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, *args, **kwargs
            )
        completion_ids, logprobs, start = [], [], 0
        for size in sizes:
            part = slice(start, start + size)
            ids, lps = super()._generate_single_turn(
                prompt_ids[part], images[part] if images is not None else None, multimodal_fields, num_generations,
                *args, **kwargs,
            )  # fmt: skip
            completion_ids.extend(ids)
            logprobs = None if lps is None else [*(logprobs or []), *lps]
            start += size
        return completion_ids, logprobs

    def _bounded_reward_model(self, model: nn.Module) -> nn.Module:
        """
        A reward model as TRL calls it, run over at most one generation batch of rows per forward when a dynamic
        sampling round is scored in one call (TRL gives all of a call's rows to one forward).
        """
        if not (self.model.training and self._ds_active):
            return model
        return RowChunkedModel(model, self.args.generation_batch_size // self.accelerator.num_processes)

    def _needs_sampling_logps(self, out: dict) -> bool:
        # Carried rows are trained a step later, against the policy that sampled them. TRL's aligned case (no
        # `old_per_token_logps`) never computes those log-probabilities, so compute them while that policy is current.
        return self.args.dynamic_sampling_carry_over and "old_per_token_logps" not in out

    def _select_round(self, step: _Step, scored: _Round, environments: list | None = None) -> None:
        """Decide which groups of the round are informative and keep this process's rows of those groups."""
        G, args = self.num_generations, self.args
        self._round_penalty = scored.penalty
        values = self.filter_values(scored.rewards).view(-1, G)  # (n, G)
        self._round_penalty = None
        informative = self.select_informative_groups(values).to(self.accelerator.device)  # (n,)
        if scored.completed is not None:  # a group dropped after its probe has no rest to train
            informative &= torch.from_numpy(scored.completed).to(informative.device)
        classes = classify_groups(
            values.flatten(), G, tolerance=args.dynamic_sampling_tolerance, correct_value=self._correct_value
        )
        self.on_groups_scored(scored.indices, values, informative, classes)
        if self._skip_policy is not None:
            self._skip_policy.record(scored.indices, classes, step=self.state.global_step, informative=informative)
        if scored.probe is not None:
            self._probe_rule.record(scored.indices, scored.probe, scored.completed, informative, classes)
        self._planner.update(len(scored.indices), int(informative.sum()))
        self._no_informative.update(len(scored.indices), int(informative.sum()))
        # every round, so that its state is the same after a resume
        self._constant_watch.update(values, found_informative=bool(informative.any()), environments=environments)
        step.ended_constant = self._filter_looks_constant() and not bool(informative.any())

        # Number informative groups in generation order, continuing the count of earlier rounds.
        group_ids = torch.cumsum(informative.long(), 0) - 1 + step.num_carried + step.num_fresh  # (n,)
        local = scored.local
        row = local["_row"]
        local["_group"] = group_ids[row // G]
        local["_value"] = values.flatten()[row]
        local["_rewards"] = scored.rewards[row]
        local["_penalty"] = scored.penalty[row]
        local["_sampled_at"] = torch.full_like(row, self._policy_updates)  # policy version that sampled the row
        step.pieces.append(_batch.select_rows(local, informative[row // G]))
        if scored.table is not None:
            for g in informative.nonzero().flatten().tolist():
                step.table[int(group_ids[g])] = scored.table[g]
        if step.template is None:  # one row is enough (shapes, padding rows), and keeps no whole round alive
            step.template = _batch.select_rows(local, torch.zeros(1, dtype=torch.long))
        step.rewards.append(scored.rewards)
        step.penalty.append(scored.penalty)
        step.lengths.append(scored.lengths)
        step.truncated.append(scored.truncated)
        step.values.append(values)
        real = scored.generated if scored.generated is not None else torch.ones(values.numel(), dtype=torch.bool)
        step.real_rows.append(real.to(scored.rewards.device))
        step.rows_per_call.extend(scored.rows_per_call)
        step.num_fresh += int(informative.sum())
        step.rounds += 1
        step.generated += len(scored.indices)
        step.all_correct += int(classes.all_correct.sum())
        step.all_wrong += int(classes.all_wrong.sum())
        step.mixed += int(classes.mixed.sum())

    def _assemble_batch(self, step: _Step) -> tuple[dict, dict, SelectionPlan, int]:
        """
        This process's slice of the generation batch (carried and fresh groups chosen by the plan, padded to full size)
        and the small per-row facts of the whole batch (`_group`, `_rewards`, ..., `advantages`) for logging.

        Every process keeps the rows it generated and the carried rows it holds; it receives only the rows it trains
        (see `trainer/row_exchange.py`), so no process ever holds the whole batch.
        """
        device, pad = self.accelerator.device, self._tokenizer.pad_token_id
        rank, processes = self.accelerator.process_index, self.accelerator.num_processes
        num_carried = step.num_carried
        plan, missing = self.plan_batch(num_carried=num_carried, num_fresh=step.num_fresh, target=self._ds_target)
        template = step.template if step.template is not None else (self._carry or self._empty_rows())
        fresh = _batch.concat_rows(step.pieces, pad_token_id=pad)
        step.pieces.clear()
        if fresh:
            fresh = _batch.keep_rows(fresh, torch.isin(fresh["_group"], _ids(plan.train + plan.carry, device)))
        pool = _batch.concat_rows([b for b in (self._carry, fresh) if b], pad_token_id=pad)
        del fresh
        pool = pool or _batch.select_rows(template, torch.zeros(0, dtype=torch.long))
        pool = self._agreed_widths(self._agreed_layout(pool))
        meta = self._gather_small(pool)  # per process: this process's rows' small facts
        exchange = plan_exchange([m["_group"] for m in meta], plan.train, self._ds_target * self.num_generations)
        if exchange.filler is None:  # no process holds a row: pad with this process's own template row
            per_process = len(exchange.sources[rank])
            filler = _batch.select_rows(template, torch.zeros(1, dtype=torch.long))
            train = _batch.pad_rows({}, per_process, template=filler, pad_token_id=pad)
            rows = _batch.pad_rows({}, per_process * processes, template=filler, pad_token_id=pad)
            facts = {k: v for k, v in rows.items() if k in _SMALL_KEYS or k == "advantages"}
        else:
            train = mask_padding(exchange_rows(pool, exchange, rank=rank, processes=processes), exchange.padding[rank])
            sources, padding = torch.cat(exchange.sources), torch.cat(exchange.padding)
            offsets = torch.tensor([0] + [len(m["_group"]) for m in meta]).cumsum(0)
            index = (offsets[sources[:, 0]] + sources[:, 1]).to(device)
            facts = {key: torch.cat([m[key] for m in meta])[index] for key in _SMALL_KEYS}
            facts["advantages"] = torch.zeros(len(sources), device=device)
            facts = mask_padding(facts, padding)
        facts["advantages"] = self._batch_advantages(facts)
        per_process = len(exchange.sources[rank])
        train["advantages"] = facts["advantages"][rank * per_process : (rank + 1) * per_process].to(device)
        is_carried = (facts["_group"] >= 0) & (facts["_group"] < num_carried)
        self._mark_carried_rows(train, num_carried, anywhere=bool(is_carried.any()))
        table = {**self._carry_table, **step.table}
        step.trained_table = {g: table[g] for g in plan.train if g in table}
        if plan.carry:  # renumber carried groups 0..k-1 for the next step; each process keeps the ones it holds
            carry = _batch.keep_rows(pool, torch.isin(pool["_group"], _ids(plan.carry, device)))
            carry["_group"] = torch.searchsorted(_ids(plan.carry, device), carry["_group"])
            self._carry = carry if carry["_group"].numel() else None
            self._carry_groups = len(plan.carry)
            self._carry_table = {i: table[g] for i, g in enumerate(sorted(plan.carry)) if g in table}
        else:
            self._carry, self._carry_groups, self._carry_table = None, 0, {}
        return train, facts, plan, missing

    def _agreed_layout(self, rows: dict) -> dict:
        """
        `rows` with the keys, dtypes and trailing shapes of the processes that hold rows (a collective).

        Every later collective of the assembly (`_agreed_widths`, `_gather_small`, `exchange_rows`) runs once per key,
        so every process must hold the same keys, whatever it holds locally. A process without rows (no round this
        step, and no carried group of its own; or a resume on another process count) builds its empty pool from a
        template whose keys can differ from the rows the others carry (`_row`, `_carry_logps`): it takes their layout,
        with zero rows.
        """
        if self.accelerator.num_processes == 1:
            return rows
        from accelerate.utils import gather_object

        count = next(iter(rows.values())).size(0)
        layout = {
            key: (str(value.dtype).removeprefix("torch."), tuple(value.shape[1:])) for key, value in rows.items()
        }
        layouts = gather_object([(count, layout)])  # one entry per process
        held = [theirs for n, theirs in layouts if n > 0]
        agreed = held[0] if held else layouts[0][1]
        if any(theirs.keys() != agreed.keys() for theirs in held):
            raise RuntimeError(f"Processes hold rows with different keys: {[sorted(theirs) for theirs in held]}.")
        if count > 0 or rows.keys() == agreed.keys():
            return rows
        device = self.accelerator.device
        return {
            key: torch.empty((0, *shape), dtype=getattr(torch, dtype), device=device)
            for key, (dtype, shape) in agreed.items()
        }

    def _agreed_widths(self, rows: dict) -> dict:
        """`rows` with every per-token tensor padded to the widest of any process (a collective)."""
        widths = _batch.widths(rows)
        if self.accelerator.num_processes > 1:
            device = self.accelerator.device
            widths = {
                key: int(self.accelerator.gather(torch.tensor([w], device=device)).max())
                for key, w in sorted(widths.items())
            }
        return _batch.pad_to(rows, widths, 0, pad_token_id=self._tokenizer.pad_token_id)

    def _gather_small(self, rows: dict) -> list[dict]:
        """The small per-row facts (`_SMALL_KEYS`) of every process's rows, one dict per process (a collective)."""
        small = {key: rows[key] for key in _SMALL_KEYS}
        processes = self.accelerator.num_processes
        if processes == 1:
            return [small]
        device = self.accelerator.device
        counts = self.accelerator.gather(torch.tensor([rows["_group"].size(0)], device=device)).tolist()
        most = max(max(counts), 1)  # one padding row at least: a split of size 0 is not allowed
        padded = _batch.pad_to(small, {}, most, pad_token_id=self._tokenizer.pad_token_id)
        gathered = {key: self.accelerator.gather(padded[key]).split(most) for key in _SMALL_KEYS}
        return [{key: gathered[key][p][:n] for key in _SMALL_KEYS} for p, n in enumerate(counts)]

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

    def _mark_carried_rows(self, batch: dict, num_carried: int, *, anywhere: bool | None = None) -> None:
        """
        Give carried rows the log-probabilities of the policy that sampled them. Fresh rows keep TRL's exact on-policy
        ratio: in TRL's aligned case their `old_per_token_logps` are filled from the loss forward itself (see
        `_get_per_token_logps_and_entropies`), so their ratio is exactly 1 at the first update, as in GRPOTrainer.
        """
        carried = batch.pop("_carry_logps", None)
        if carried is None or "old_per_token_logps" in batch:
            return
        is_carried = (batch["_group"] >= 0) & (batch["_group"] < num_carried)
        if not (is_carried.any() if anywhere is None else anywhere):  # every process decides alike
            return
        batch["old_per_token_logps"] = torch.where(is_carried.unsqueeze(1), carried, torch.zeros_like(carried))
        batch[_batch.ON_POLICY_KEY] = ~is_carried

    def _local_rows(self, batch: dict) -> dict:
        """This process's rows in TRL's format, with the exact token count of the whole batch."""
        local = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor) and not k.startswith("_")}
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
            "_sampled_at": -torch.ones(1, dtype=torch.long, device=device),
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

    # ------------------------------------------------------------------ dynamic sampling: logging

    def _metric_marks(self) -> dict[str, int]:
        return {key: len(values) for key, values in self._metrics["train"].items()}

    def _log_step(self, step: _Step, batch: dict, plan: SelectionPlan, missing: int, *, local: dict) -> None:
        """
        Every metric of the generation batch, once, over a stated population (see docs/metrics.md). `batch` holds the
        small per-row facts of the whole batch, `local` this process's rows.
        """
        self._merge_call_metrics(step)
        if step.rewards:
            real = torch.cat(step.real_rows)  # the rest of a group dropped after its probe was never generated
            rewards, lengths = torch.cat(step.rewards)[real], torch.cat(step.lengths)[real]
            scorable = ~torch.isnan(rewards).all(dim=1)
            self._log_overlong(lengths, torch.cat(step.truncated)[real], torch.cat(step.penalty)[real], scorable)
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
            "underfilled_steps": self._underfilled_steps,  # so far: the warning is printed once per cause
            "prompts_consumed": self._prompts.consumed,
            "reward_before_filter": self._mean_total_reward(torch.cat(step.rewards)) if step.rewards else math.nan,
            "reward_after_filter": self._mean_total_reward(batch["_rewards"][trained]),
        }
        carried = trained & (batch["_group"] < step.num_carried) & (batch["_sampled_at"] >= 0)
        if carried.any():
            # Optimizer updates between the policy that sampled the carried rows and the one of this batch's first
            # update: steps_per_generation * num_iterations / gradient_accumulation_steps per generation batch waited.
            stats["carried_staleness"] = (self._policy_updates - batch["_sampled_at"][carried]).float().mean().item()
        if self._correct_value is not None:
            values = torch.cat([v.flatten() for v in step.values]) if step.values else torch.zeros(0)
            stats["accuracy_before_filter"] = self._accuracy(values)
            stats["accuracy_after_filter"] = self._accuracy(batch["_value"][trained])
        if self._skip_policy is not None:
            stats.update(self._skip_policy.metrics())
        if self._probe_rule is not None:
            stats.update(self._probe_rule.metrics())
        self.log_dynamic_sampling(stats)
        self._log_importance_sampling(local)
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
        completion_keys = {
            k: v for k, v in per_call.items() if k.startswith(("completions/", "tools/")) and len(v) == len(rows)
        }
        merged = merge_completion_metrics(completion_keys, rows) if rows else {}
        recomputed = {f"rewards/{name}/{stat}" for name in self.reward_func_names for stat in ("mean", "std")}
        for key, values in per_call.items():
            if key in merged or key in _REWARD_METRICS or key in recomputed:
                continue  # a reward's own metrics (TRL's `log_metric`) are merged like the rest
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
            facts = self._underfill_facts(step)
            kind, cause = underfill_kind(facts), underfill_cause(facts)
        message = (
            f"Dynamic sampling found {target - missing} of the {target} informative groups a batch needs. {cause}"
        )
        if args.dynamic_sampling_on_exhausted == "raise":
            raise RuntimeError(message)
        # the same cause tends to recur every step: warn once per cause, then count (dynamic_sampling/underfilled_steps)
        self._underfilled_steps += 1
        if missing == target:
            self._skipped_batches += 1
            kind, message = (
                f"{kind}, skipped",
                (
                    f"{message} With no group to train on, the optimizer update is skipped: weights, optimizer moments and "
                    "learning-rate schedule stay as they are, global_step still advances (counted in "
                    f"dynamic_sampling/skipped_updates; {self._skipped_batches} such batch(es) in this run)."
                ),
            )
        else:
            message += " Training on the groups collected; the rest of the batch is masked."
        if kind not in self._underfill_causes_warned:
            self._underfill_causes_warned.add(kind)
            logger.warning(
                message + " Later underfilled steps with this cause are not warned about again: "
                "dynamic_sampling/underfilled_steps counts them."
            )
        else:
            logger.debug(message)

    def _underfill_facts(self, step: _Step) -> UnderfillFacts:
        """What the rounds of this batch saw, for [`underfill_cause`] (gathered values: the same on every process)."""
        G, args = self.num_generations, self.args
        values = torch.cat(step.values)  # (n, G)
        rewards = torch.cat(step.rewards)  # (n G, F)
        spreads = group_spreads(values)
        mixed = spreads[(spreads > 0) & (spreads <= args.dynamic_sampling_tolerance)]
        names = self.reward_func_names
        varying = tuple(
            name
            for i, name in enumerate(names)
            if self._filter_index not in (None, i) and bool((group_spreads(rewards[:, i].view(-1, G)) > 0).any())
        )
        if self._filter_index is None:
            label = "the weighted total reward plus the overlong penalty (dynamic_sampling_reward='total')"
        elif args.dynamic_sampling_reward is None:
            label = f"the first reward function, {names[0]!r} (dynamic_sampling_reward is not set)"
        else:
            label = f"reward function {names[self._filter_index]!r} (dynamic_sampling_reward)"
        return UnderfillFacts(
            rounds=step.rounds,
            needed=step.needed,
            groups=step.generated,
            informative=step.num_fresh,
            all_correct=step.all_correct,
            all_wrong=step.all_wrong,
            mixed=step.mixed,
            widest_spread=mixed.max().item() if mixed.numel() else 0.0,
            constant_value=single_value(values),
            truncated_frac=torch.cat(step.truncated)[torch.cat(step.real_rows)].float().mean().item(),
            filter_label=label,
            varying=varying,
            ended_early=step.ended_constant,
            max_rounds=args.dynamic_sampling_max_rounds,
            tolerance=args.dynamic_sampling_tolerance,
            max_completion_length=args.max_completion_length,
            has_correct_value=self._correct_value is not None,
            quiet_groups=self._no_informative.groups if self._no_informative.established else 0,
        )

    # ------------------------------------------------------------------ completions table

    def _pop_table_rows(self, rows: int, logs: dict) -> list[dict]:
        """Take the last `rows` rows TRL added to the completions-table log `logs` (one call's rows) out of it."""
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
        rows_extra = (k for rows in step.trained_table.values() for row in rows for k in row if k.startswith("extra/"))
        extra = sorted({k[len("extra/") :] for k in rows_extra}.union(logs["extra"]))
        for group, rows in sorted(step.trained_table.items()):
            advantages = batch["advantages"][batch["_group"] == group].tolist()  # the group's rows, in table order
            for row, advantage in zip(rows, advantages):
                logs["prompt"].append(row.get("prompt"))
                logs["completion"].append(row.get("completion"))
                logs["advantages"].append(advantage)
                for name in list(logs["rewards"]):
                    logs["rewards"][name].append(row.get(f"rewards/{name}"))
                for name in extra:  # every column a reward logged in any round; None for rows without it
                    logs["extra"][name].append(row.get(f"extra/{name}"))


def _unbounded_logs() -> dict:
    """An empty completions-table log in TRL's layout (`GRPOTrainer._logs`), without its length cap."""
    return {
        "images": deque(),
        "prompt": deque(),
        "completion": deque(),
        "rewards": defaultdict(deque),
        "advantages": deque(),
        "extra": defaultdict(deque),
    }


def _completed_round(
    probe: _Round,
    rest: _Round | None,
    completed: np.ndarray,
    probed: GroupClassification,
    G: int,
    *,
    pad_token_id: int,
) -> _Round:
    """
    A probed round as whole groups of `G`: group `j` holds the probe's `k` rows, then the `G - k` rows of the rest
    where it was completed (`rest` holds the completed groups in round order). Rows never generated get NaN rewards.
    """
    n = len(probe.indices)
    k = probe.rewards.size(0) // n
    slot = torch.arange(n * k)
    parts = [(probe, (slot // k) * G + slot % k)]  # round position of each probe row, (n k,)
    if rest is not None:
        chosen = torch.from_numpy(np.flatnonzero(completed))  # (m,)
        slot = torch.arange(chosen.numel() * (G - k))
        parts.append((rest, chosen[slot // (G - k)] * G + k + slot % (G - k)))  # (m (G - k),)

    def placed(name: str, fill: float | bool) -> torch.Tensor:
        first = getattr(probe, name)
        out = torch.full((n * G, *first.shape[1:]), fill, dtype=first.dtype, device=first.device)
        for part, where in parts:
            out[where.to(out.device)] = getattr(part, name)
        return out

    locals_, generated = [], torch.zeros(n * G, dtype=torch.bool)
    for part, where in parts:
        generated[where] = True
        local = dict(part.local)
        local["_row"] = where.to(local["_row"].device)[local["_row"]]
        locals_.append(local)
    table = None
    if probe.table is not None:
        rest_tables = iter(rest.table if rest is not None else [])
        table = [rows + (next(rest_tables) if done else []) for rows, done in zip(probe.table, completed, strict=True)]
    return _Round(
        indices=probe.indices,
        local=_batch.concat_rows(locals_, pad_token_id=pad_token_id),
        rewards=placed("rewards", torch.nan),
        penalty=placed("penalty", 0.0),
        lengths=placed("lengths", 0.0),
        truncated=placed("truncated", False),
        rows_per_call=probe.rows_per_call + (rest.rows_per_call if rest is not None else []),
        table=table,
        probe=probed,
        completed=completed,
        generated=generated,
    )


def _in_round_order(values: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Rows gathered in process order, put at their round positions `order` (a permutation of `0 .. N-1`)."""
    out = torch.empty_like(values)
    out[order.to(values.device)] = values
    return out


def _ids(groups: list[int], device) -> torch.Tensor:
    return torch.tensor(sorted(groups), dtype=torch.long, device=device)
