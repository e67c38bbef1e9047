"""[`DAPOTrainer`]: TRL's `GRPOTrainer` with the DAPO recipe (arXiv 2503.14476).

Glue only. Every decision lives in a module of `dapo_trl.trainer`, most of them pure functions (`advantages`, `loss`,
`overlong`, `sampling`, `metrics`, `reward_checks`, `batch`; the rounds of dynamic sampling in `dynamic_sampling`,
preemption in `preemption`); rewards live in `dapo_trl.rewards`, the verifier in `dapo_trl.verifier`, and what surrounds
a run (data, evaluation, launch, plan, console) in `dapo_trl.run`. This class connects them to TRL at a few documented
override points and never copies a TRL private method:

| override                                | why                                                                        |
|-----------------------------------------|----------------------------------------------------------------------------|
| `_calculate_rewards`                    | check each reward's output, keep the gathered rewards, add the overlong penalty |
| `_generate_and_score_completions`       | run generation rounds until the batch holds only informative groups; advantages with the penalty |
| `_generate_single_turn`                 | generate a round scored in one call in chunks of one generation batch       |
| `get_train_dataloader`                  | with dynamic sampling, the dataloader only paces the steps                 |
| `_get_train_sampler`                    | each epoch's prompt order a function of seed and epoch (exact resume)      |
| `_prepare_inputs`                       | replace TRL's approximate token normaliser by the exact per-step count; skip the update of a step without a loss token |
| `_get_per_token_logps_and_entropies`    | keep the loss forward's log-probabilities (monitors, carried rows' ratio); with dynamic sampling, positions counted over attended tokens so re-padding leaves the ratio at 1 |
| `_compute_loss`                         | log those monitors (the loss itself is TRL's)                              |
| `_save_checkpoint` / `_load_optimizer_and_scheduler` | save and restore the sampler state and a half-used generation batch |
| `train`, `_get_output_dir`, `_push_from_checkpoint` (`PreemptionMixin`) | auto-resume, preemption handling, checkpoints published atomically (and pushed once published) |

`dapo_trl._compat.TRL_HOOKS` lists these methods with the parameters each override relies on; importing this module
checks them against the installed TRL and names the one that is missing (`tests/test_trl_compat.py` pins them too).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import math
import os
import textwrap

import torch
from datasets import IterableDataset
from torch import nn
from trl import GRPOConfig, GRPOTrainer

from ._compat import check_trl_hooks, trl_runtime_problem
from ._validate import gguf_problem
from .dapo_config import DAPOConfig
from .run.console import DefaultsNoticeCallback
from .trainer import batch as _batch
from .trainer.advantages import compute_advantages
from .trainer.dataset_checks import (
    PacingDataset,
    check_prompt_lengths,
    check_train_dataset,
    truncate_prompt_ids,
    warn_duplicates,
)
from .trainer.diagnostics import add_diagnostics
from .trainer.dynamic_sampling import DynamicSamplingMixin
from .trainer.loss import (
    exact_normalizer_applies,
    sequence_clip_flags,
    token_prob_sums,
    trl_num_items_for_exact_normalizer,
    window_token_counts,
)
from .trainer.overlong import OverlongPenalty, is_truncated
from .trainer.preemption import PreemptionMixin
from .trainer.probing import ProbeRule, probe_granularity
from .trainer.prompt_history import SkipPolicy
from .trainer.prompt_source import DatasetPrompts, EpochSampler, StreamPrompts
from .trainer.reward_checks import (
    check_reward_funcs,
    check_reward_output,
    checked_reward,
    constant_reward_advice,
    quiet_trl_unscored_warning,
    tolerance_problem,
    unscored_rows_message,
)
from .trainer.sampling import (
    ConstantRewardWatch,
    GroupClassification,
    NoInformativeWatch,
    RoundPlanner,
    SelectionPlan,
    carry_keeps,
    classify_groups,
    plan_selection,
)
from .trainer.vllm_colocate import finish_vllm_setup, prepare_vllm

logger = logging.getLogger(__name__)
check_trl_hooks(GRPOTrainer)  # every method overridden below exists and takes what the override passes (any TRL)

SAMPLER_STATE_NAME = "dapo_sampler_state.pt"
SAMPLER_STATE_KEYS = ("stream", "planner", "carry", "carry_groups")  # what `load_sampler_state_dict` cannot do without
BUFFER_STATE_KEYS = ("step", "processes", "buffer")
BUFFER_STATE_NAME = "dapo_generation_buffer_rank{rank}.pt"
CARRY_STATE_NAME = "dapo_carry_rank{rank}.pt"  # with several processes, each keeps the carried rows it holds


class DAPOTrainer(PreemptionMixin, DynamicSamplingMixin, GRPOTrainer):
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
      tokens of the optimizer step (all accumulation micro-batches, all processes). When an optimizer step spans
      several generation batches (`steps_per_generation * num_iterations` not a multiple of
      `gradient_accumulation_steps`), its count is not known before its first backward pass: TRL's normaliser (a token
      mean per generation batch) is kept, with a warning at construction.
    - **Overlong reward shaping** (§3.4): the soft length penalty of Eq. 13, added to the aggregated reward of every
      scorable completion before advantages are computed ([`~dapo_trl.trainer.advantages.compute_advantages`]), logged under
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
        if trl_runtime_problem():
            raise RuntimeError(trl_runtime_problem())
        problem = gguf_problem(model=model)
        if problem:
            raise ValueError(problem[0].upper() + problem[1:])
        if reward_funcs is not None:
            check_reward_funcs(reward_funcs)
        prompts = check_train_dataset(train_dataset, args, environment_factory is not None)
        prepare_vllm(args)  # vLLM installed and runnable here; the engine's dtype (trainer/vllm_colocate.py)
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
        # Each optimizer step inside one generation cycle: its loss tokens are known before its first micro-step.
        self._cycles_aligned = exact_normalizer_applies(
            steps_per_generation=self.args.steps_per_generation,
            num_iterations=self.args.num_iterations,
            gradient_accumulation_steps=self.args.gradient_accumulation_steps,
        )
        self._exact_normalizer = self._check_token_normalizer()
        self._loss_logps: torch.Tensor | None = None
        self._loss_inputs: dict | None = None
        self._reward_warnings: set[tuple[str, str]] = set()
        self._warned_unscored = False
        self._weight_syncs = 0
        self._skip_update = False
        self._skipped_batches = 0
        self._underfilled_steps = 0  # underfilled batches so far (the warning is printed once per cause)
        self._underfill_causes_warned: set[str] = set()
        self._policy_updates = 0  # optimizer updates made (skipped ones not counted); saved with the sampler state
        self._warned_deepspeed_skip = False
        self._overlong = self.build_overlong_penalty()
        self._setup_dynamic_sampling(prompts)
        finish_vllm_setup(self)  # vLLM on CPU: the weight sync that repacks its layers
        self._count_weight_syncs()
        self._check_prompt_lengths(prompts)
        if self.args.diagnostics:
            add_diagnostics(self)
        self.add_callback(DefaultsNoticeCallback())

    # ------------------------------------------------------------------ set-up

    def _setup_dynamic_sampling(self, prompts: list | None) -> None:
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
        self._carry: dict | None = None  # this process's rows of carried groups (see trainer/row_exchange.py)
        self._carry_groups = 0
        self._carry_table: dict[int, list[dict]] = {}
        self._carry_sampled_at: list[int] = []  # policy version that sampled each carried group (every process)
        self._skip_policy: SkipPolicy | None = None
        self._probe_rule: ProbeRule | None = None
        self._constant_watch = ConstantRewardWatch()
        self._no_informative = NoInformativeWatch()
        self._ds_active = bool(args.dynamic_sampling and self.train_dataset is not None)
        if not self._ds_active:
            return
        problem = tolerance_problem(args.dynamic_sampling_tolerance, filter_func, str(name or names[0]))
        if problem:
            raise ValueError(problem)
        if self._is_vlm:
            raise ValueError(
                "dynamic_sampling does not support vision-language models yet (multimodal rows cannot be moved between "
                "generation rounds). Set dynamic_sampling=False."
            )
        processes = self.accelerator.num_processes
        # prompts per round, so that every generation call's rows split evenly over the processes
        granularity = probe_granularity(processes, self.num_generations, args.dynamic_sampling_probe)
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
            if prompts is not None:
                warn_duplicates(prompts)
        if args.dynamic_sampling_skip:
            if self._prompts.streaming:
                raise ValueError(
                    "dynamic_sampling_skip keeps a history per dataset index, which a streamed training set does not "
                    "have. Load the dataset without streaming, or set dynamic_sampling_skip=False."
                )
            self._skip_policy = SkipPolicy(
                len(self.train_dataset),
                seed=args.seed,
                target=args.dynamic_sampling_skip_target,
                max_skip=args.dynamic_sampling_skip_max_prob,
                rule=args.dynamic_sampling_skip_rule,
                half_life=args.dynamic_sampling_skip_half_life,
                draws=args.dynamic_sampling_skip_draws,
                num_generations=self.num_generations,
            )
        if args.dynamic_sampling_probe:
            self._probe_rule = ProbeRule(
                self.num_generations,
                args.dynamic_sampling_probe,
                num_prompts=None if self._prompts.streaming else len(self.train_dataset),
                seed=args.seed,
            )

    def _check_token_normalizer(self) -> bool:
        """Whether the exact per-step token count applies; if not, say once that TRL's normaliser is used instead."""
        args = self.args
        if args.loss_type != "dapo":
            return False
        if not self._cycles_aligned:
            logger.warning(
                f"steps_per_generation * num_iterations ({args.steps_per_generation} * {args.num_iterations}) is not a "
                f"multiple of gradient_accumulation_steps ({args.gradient_accumulation_steps}): an optimizer step spans "
                "several generation batches, whose token count is not known before its first backward pass. The loss "
                "keeps TRL's normaliser: the token mean is taken per generation batch (each weighted by its share of "
                "the step's micro-batches), not over the whole optimizer step. For the paper's exact token-level mean, "
                "set steps_per_generation to a multiple of gradient_accumulation_steps."
            )
        return self._cycles_aligned

    def _model_context(self) -> int | None:
        config = getattr(self.accelerator.unwrap_model(self.model), "config", None)
        context = getattr(getattr(config, "get_text_config", lambda: config)(), "max_position_embeddings", None)
        return context if isinstance(context, int) and context > 0 else None

    def _check_prompt_lengths(self, prompts: list | None) -> None:
        """Without `max_prompt_length`, refuse training prompts the model cannot even read (map-style sets)."""
        context = self._model_context()
        if self.args.max_prompt_length is not None or context is None or self._is_vlm or prompts is None:
            return
        check_prompt_lengths(prompts, self._tokenizer, context, max_completion_length=self.args.max_completion_length)

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
        [`~dapo_trl.trainer.advantages.compute_advantages`]). It is not a reward function: the reward lists and the logged
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
            values (`torch.Tensor` of shape `(num_groups, G)`): [`filter_values`] per group (with
                `dynamic_sampling_probe`, `NaN` for the completions a group stopped after its probe never had; such
                a group is never trained, whatever the verdict).

        Returns:
            Bool `torch.Tensor` of shape `(num_groups,)`. Default: the group's values are not constant (spread above
            `dynamic_sampling_tolerance`, unscorable `NaN` ignored). Identical on every process (same inputs). The
            probe's own decision uses the default test.
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
            values (`torch.Tensor` of shape `(num_groups, G)`): [`filter_values`] per group (`NaN` where a group
                stopped after its probe has no completion).
            informative (`torch.Tensor` of shape `(num_groups,)`): [`select_informative_groups`]'s verdict (false
                for a group stopped after its probe).
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
            "carry": self._carry_state() if self.accelerator.num_processes == 1 else None,
            "carry_processes": self.accelerator.num_processes,  # > 1: the rows are in CARRY_STATE_NAME files
            "carry_groups": self._carry_groups,
            "carry_sampled_at": list(self._carry_sampled_at),
            "policy_updates": self._policy_updates,
            "skip": self._skip_policy.state_dict() if self._skip_policy is not None else None,
            "num_generations": self.num_generations,
            "constant": self._constant_watch.state_dict(),
            "no_informative": self._no_informative.state_dict(),
            "probe": self._probe_rule.state_dict() if self._probe_rule is not None else None,
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
        # Carried rows of the main file (one process, or an earlier version's copy on every process) stay on process 0.
        main = state["carry"] if self.accelerator.is_main_process else None
        self._carry = {k: v.to(device) for k, v in main.items()} if main else None
        self._carry_groups = int(state["carry_groups"])
        self._policy_updates = int(state.get("policy_updates", self.state.global_step))
        if self._carry is not None and "_sampled_at" not in self._carry:  # saved before carried rows were dated
            self._carry["_sampled_at"] = -torch.ones_like(self._carry["_group"])
        # Checkpoints of earlier versions carried groups for one batch: they were sampled one batch ago.
        per_batch, _ = self._carry_staleness()
        sampled_at = [round(self._policy_updates - per_batch)] * self._carry_groups
        self._carry_sampled_at = [int(at) for at in state.get("carry_sampled_at", sampled_at)]
        if state.get("constant") is not None:  # absent from checkpoints of earlier versions
            self._constant_watch.load_state_dict(state["constant"])
        if state.get("no_informative") is not None:
            self._no_informative.load_state_dict(state["no_informative"])
        if self._probe_rule is not None and state.get("probe") is not None:
            self._probe_rule.load_state_dict(state["probe"])
        if self._skip_policy is not None:
            if state.get("skip") is not None:
                self._skip_policy.load_state_dict(state["skip"])
            else:
                logger.warning(
                    "The checkpoint holds no prompt-skipping history (it was saved with dynamic_sampling_skip off): "
                    "the history starts empty."
                )

    def plan_batch(self, *, num_carried: int, num_fresh: int, target: int) -> tuple[SelectionPlan, int]:
        """
        Extension point: which candidate groups are trained, carried or discarded.

        Candidates are numbered carried groups first (`0 .. num_carried - 1`), then this step's informative groups in
        generation order. Must return `(plan, missing)` with `len(plan.train) == target - missing`, every id in at most
        one list, and the same result on every process. Default: [`plan_selection`] with `dynamic_sampling_carry_over`.
        """
        per_batch, most = self._carry_staleness()
        keep = None
        if len(self._carry_sampled_at) == num_carried:  # carried groups older than the bound wait no longer
            keep = carry_keeps(
                self._carry_sampled_at, now=self._policy_updates, updates_per_batch=per_batch, max_staleness=most
            )
        return plan_selection(
            num_carried=num_carried,
            num_fresh=num_fresh,
            target=target,
            carry_over=self.args.dynamic_sampling_carry_over,
            max_carry=max(int(most // per_batch), 1) * target,  # as many batches as a group may wait
            keep_carried=keep,
        )

    def _carry_staleness(self) -> tuple[float, float]:
        """
        Optimizer updates per generation batch (how much staler a carried group grows each batch it waits), and the
        most a carried group may be when trained (`dynamic_sampling_carry_max_staleness`, default two batches).
        """
        args = self.args
        per_batch = args.steps_per_generation * self.num_iterations / args.gradient_accumulation_steps
        most = args.dynamic_sampling_carry_max_staleness
        return per_batch, 2 * per_batch if most is None else most

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
            self._bounded_reward_model(func) if isinstance(func, nn.Module) else checked_reward(func, name, problems)
            for func, name in zip(user_funcs, self.reward_func_names, strict=True)
        ]
        try:
            # TRL's warning once, as GRPOTrainer logs it (ours follows); replaced by the contract error if one broke
            with quiet_trl_unscored_warning(lambda: self._let_trl_unscored_warning(problems)):
                rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        finally:
            self.reward_funcs = user_funcs
        penalty = self._overlong_penalty(prompts, completions, completion_ids_list, problems)
        self._raise_reward_problems(problems)
        self._warn_unscored_rows(rewards_per_func, prompts, completions)
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

    def _let_trl_unscored_warning(self, problems: list[str]) -> bool:
        if problems or getattr(self, "_said_trl_unscored", False):
            return False
        self._said_trl_unscored = True
        return True

    def _warn_unscored_rows(self, rewards_per_func: torch.Tensor, prompts: list, completions: list) -> None:
        """Say once that some rows could not be scored by any reward (TRL says it for every call)."""
        unscored = torch.isnan(rewards_per_func).all(dim=1)  # (N,) gathered
        if not unscored.any() or unscored.all() or not self.accelerator.is_main_process:
            return  # every row unscored: each function that scored nothing is named by `_warn_about_rewards`
        count, rows = int(unscored.sum()), unscored.numel()
        if self._warned_unscored:
            logger.debug(f"No reward function could score {count} of the {rows} completions of this batch.")
            return
        self._warned_unscored = True
        start = self.accelerator.process_index * len(prompts)
        local = unscored[start : start + len(prompts)].nonzero().flatten().tolist()
        example = (prompts[local[0]], completions[local[0]]) if local else None
        logger.warning(unscored_rows_message(count, rows, example))

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
        self.log_metric("accuracy", self._accuracy(values))
        for name, rows in (("correct", correct), ("incorrect", scored & ~correct)):
            if rows.any():
                self.log_metric(f"completions/{name}_mean_length", lengths[rows].mean().item())
                self.log_metric(f"completions/{name}_max_length", lengths[rows].max().item())

    def _accuracy(self, values: torch.Tensor) -> float:
        """Share of scored filter values (NaN: unscored, left out) that reach [`correct_value`]; NaN if none scored."""
        scored = values[~torch.isnan(values)]
        return (scored >= self._correct_value).float().mean().item() if scored.numel() else math.nan

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
            if kind == "none":
                advice = (
                    "Check the dataset column it reads (e.g. MathVerifierReward's answer_column) and that its gold "
                    "answers parse; rows no reward can score get no advantage and are never trained on."
                )
            else:
                correct = getattr(self.reward_funcs[i], "correct_reward", None)
                advice = constant_reward_advice(
                    scored[0].item(),
                    filters=self._ds_active and i == self._filter_index,
                    correct_value=float(correct) if isinstance(correct, int | float) else None,
                )
            logger.warning(f"Reward function {name!r} {detail} of this batch. {advice}")

    # ------------------------------------------------------------------ generation

    def _tokenize_prompts(self, prompts: list):
        prompt_ids, images, multimodal_fields = super()._tokenize_prompts(prompts)
        limit = self.args.max_prompt_length
        if limit is None:
            context = self._model_context()
            longest = max((len(ids) for ids in prompt_ids), default=0)
            if context is not None and longest > context:
                raise ValueError(
                    f"A prompt of {longest} tokens is longer than the model's context of {context} tokens. Set "
                    "max_prompt_length to cut long prompts (prompt_truncation_side='left' keeps their end)."
                )
            return prompt_ids, images, multimodal_fields
        if images is not None and any(len(ids) > limit for ids in prompt_ids):
            raise ValueError(
                f"A prompt with images is longer than max_prompt_length={limit}: cutting it could cut image tokens. "
                "Raise max_prompt_length or shorten the prompt."
            )
        prompt_ids, cut = truncate_prompt_ids(list(prompt_ids), limit, self.args.prompt_truncation_side)
        self._log_metric("prompts/truncated_ratio", cut / max(len(prompt_ids), 1))
        return prompt_ids, images, multimodal_fields

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
        self.train_dataset = PacingDataset(max(size, self._ds_target))
        try:
            return super().get_train_dataloader()
        finally:
            self.train_dataset = real

    def _get_train_sampler(self, dataset=None):
        """TRL's sampler, with each epoch's order a function of the seed and the epoch (exact resume past epoch 0)."""
        sampler = super()._get_train_sampler(dataset)
        if not EpochSampler.wraps(sampler):
            return sampler
        return EpochSampler(sampler, epoch=lambda: self.state.epoch)  # restored on resume, on every process

    # ------------------------------------------------------------------ exact token-level normaliser

    def _prepare_inputs(self, generation_batch):
        if not (self.model.training and self._cycles_aligned and (self._exact_normalizer or self._ds_active)):
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
        if self._ds_active and self._step % self.args.gradient_accumulation_steps == 0:
            self._plan_update(skip=window == 0)
        if not self._exact_normalizer:
            return inputs
        num_items = trl_num_items_for_exact_normalizer(
            window,
            steps_per_generation=self.args.steps_per_generation,
            gradient_accumulation_steps=self.current_gradient_accumulation_steps,
        )
        return {**inputs, "num_items_in_batch": torch.tensor(num_items, device=self.accelerator.device)}

    # ------------------------------------------------------------------ optimizer steps without a loss token

    def _plan_update(self, *, skip: bool) -> None:
        """
        Decide, at the first micro-step of an optimizer step, whether its update is skipped: with dynamic sampling, a
        step whose micro-batches hold no loss token on any process (no informative group reached it) has a gradient of
        exactly 0, yet AdamW would still move the weights on its stale moments, apply weight decay and advance the
        schedule. `global_step` still counts the step (logging, checkpoints and `max_steps` count batches); the
        learning-rate schedule counts updates, as after a mixed-precision overflow.
        """
        self._install_update_skipping()
        if skip and self.is_deepspeed_enabled:
            if not self._warned_deepspeed_skip:
                self._warned_deepspeed_skip = True
                logger.warning(
                    "An optimizer step holds no loss token, but DeepSpeed updates the weights inside its engine: the "
                    "update cannot be skipped there, and AdamW moves the weights on its stale moments."
                )
            skip = False
        self._skip_update = skip
        self.log_metric("dynamic_sampling/skipped_updates", float(skip))

    def _install_update_skipping(self) -> None:
        """
        Wrap the optimizer's and the scheduler's `step` (once; both exist by the first micro-step): a skipped step
        leaves the weights, the optimizer moments and the learning-rate schedule where they are. A mixed-precision
        scaler (`torch.amp.GradScaler`, FSDP's `ShardedGradScaler`) still closes its step, keeping its scale: gradient
        clipping has already unscaled the gradients, and the next step's unscaling would otherwise fail.
        """
        optimizer, scheduler = self.optimizer, self.lr_scheduler
        if getattr(optimizer, "_dapo_skips_updates", False):
            return
        step = optimizer.step

        @functools.wraps(step)  # keeps the mark torch's scheduler put on the step it wrapped
        def step_unless_skipped(*args, **kwargs):
            if self._skip_update:
                scaler = getattr(optimizer, "scaler", None)  # accelerate's, on its optimizer wrapper
                if scaler is not None and scaler.is_enabled():
                    scaler.update(scaler.get_scale())  # ends the scaler's step (unscaled state) at the same scale
                return None
            self._policy_updates += 1  # the policy version carried rows are dated with
            return step(*args, **kwargs)

        optimizer.step = step_unless_skipped
        optimizer._dapo_skips_updates = True
        if scheduler is not None and not isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            scheduler.__class__ = _schedule_unless_skipped(type(scheduler), lambda: self._skip_update)

    # ------------------------------------------------------------------ loss forward and monitors

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        with self._positions_from_mask(model):
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

    @contextlib.contextmanager
    def _positions_from_mask(self, model):
        """
        With dynamic sampling, every log-probability forward numbers positions over attended tokens
        ([`_batch.position_ids`]), so re-padding rows between the old-log-prob forward and the loss forward changes
        nothing: the ratio stays 1 (to float rounding) for learned absolute positions as for RoPE. The model gets
        `position_ids` through a forward pre-hook for the duration of the call (TRL's forward passes none).
        """
        module = self.accelerator.unwrap_model(model)
        if not (self._ds_active and _accepts_position_ids(module)):
            yield
            return

        def add_positions(_module, args, kwargs):
            mask = kwargs.get("attention_mask")
            if mask is None or kwargs.get("position_ids") is not None:
                return None
            return args, {**kwargs, "position_ids": _batch.position_ids(mask)}

        handle = module.register_forward_pre_hook(add_positions, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()

    def _compute_loss(self, model, inputs):
        self._loss_inputs = inputs
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._loss_inputs = None
        if self._loss_logps is not None:
            self._log_token_probs(inputs, self._loss_logps)
            if self.importance_sampling_level == "sequence" and self._ds_active:
                self._fix_sequence_clip_metrics(inputs, self._loss_logps)
            self._loss_logps = None
        return loss

    def _log_token_probs(self, inputs: dict, logps: torch.Tensor) -> None:
        """The paper's monitors (§3.1): mean probability of sampled tokens and of tokens cut by the upper clip."""
        sums = token_prob_sums(
            logps, inputs.get("old_per_token_logps"), inputs["advantages"], _batch.loss_mask(inputs), self.epsilon_high
        )
        sums = self.accelerator.reduce(sums, reduction="sum")
        self.log_metric("token_prob/mean", (sums[0] / sums[1].clamp(min=1)).item())
        if sums[3] > 0:
            self.log_metric("token_prob/high_clipped_mean", (sums[2] / sums[3]).item())

    def _fix_sequence_clip_metrics(self, inputs: dict, logps: torch.Tensor) -> None:
        """
        With `importance_sampling_level="sequence"` TRL averages `clip_ratio/*` over rows, so the fully masked rows that
        pad an underfilled batch would dilute them: recompute them over rows with at least one loss token. Only with
        dynamic sampling (the only source of padding rows); without it TRL's values stand (docs/differences.md, 17).
        """
        if self.loss_type not in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
            return
        low, high, real = sequence_clip_flags(
            logps,
            inputs.get("old_per_token_logps"),
            inputs["advantages"],
            _batch.loss_mask(inputs),
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
        )
        sums = torch.stack([low.sum(), high.sum(), (low | high).sum(), real.sum()]).float()
        sums = self.accelerator.reduce(sums, reduction="sum")
        metrics = self._metrics["train" if self.model.training else "eval"]
        count = sums[3].clamp(min=1)
        for key, value in (("low_mean", sums[0]), ("high_mean", sums[1]), ("region_mean", sums[2])):
            if metrics.get(f"clip_ratio/{key}"):
                metrics[f"clip_ratio/{key}"][-1] = (value / count).item()
        nan = torch.tensor(torch.nan, device=logps.device)
        for key, flags, reduce in (("low_min", low, torch.min), ("high_max", high, torch.max)):
            values = self.accelerator.gather(torch.where(real, flags.float(), nan))
            values = values[~torch.isnan(values)]
            if metrics.get(f"clip_ratio/{key}") and values.numel():
                metrics[f"clip_ratio/{key}"][-1] = reduce(values).item()

    # ------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self, model, trial):
        with self.staged_checkpoint(trial):  # every file must be inside before the checkpoint is published
            super()._save_checkpoint(model, trial)
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            self._save_generation_buffer(folder)
            if self._ds_active and self.args.should_save:
                torch.save(self.sampler_state_dict(), os.path.join(folder, SAMPLER_STATE_NAME))
            if self._ds_active and self.accelerator.num_processes > 1:
                os.makedirs(folder, exist_ok=True)
                path = os.path.join(folder, CARRY_STATE_NAME.format(rank=self.accelerator.process_index))
                torch.save({"carry": self._carry_state()}, path)

    def _carry_state(self) -> dict | None:
        return {k: v.cpu() for k, v in self._carry.items()} if self._carry else None

    def _load_carry(self, checkpoint: str, processes: int) -> None:
        """
        This process's carried rows, saved by `processes` processes. With another process count, process 0 takes them
        all in process order: the batch keeps the same rows in the same order (rows are ordered by group, then by
        process), only which process sends them changes.
        """
        if processes == 1:
            return  # in the main state file
        rank = self.accelerator.process_index
        ranks = [rank] if processes == self.accelerator.num_processes else (range(processes) if rank == 0 else [])
        pieces = []
        for r in ranks:
            path = os.path.join(checkpoint, CARRY_STATE_NAME.format(rank=r))
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"{path} is missing: the checkpoint was saved by {processes} processes, each with its own carried "
                    "rows. Restore the file, or delete dapo_sampler_state.pt to resume without the sampler state."
                )
            carry = _load_state_file(path, ("carry",))["carry"]
            if carry:
                pieces.append(carry)
        carry = _batch.concat_rows(pieces, pad_token_id=self._tokenizer.pad_token_id)
        self._carry = {k: v.to(self.accelerator.device) for k, v in carry.items()} if carry else None

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
        state = _load_state_file(path, SAMPLER_STATE_KEYS)
        self.load_sampler_state_dict(state)
        self._load_carry(checkpoint, int(state.get("carry_processes", 1)))

    def _load_generation_buffer(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, BUFFER_STATE_NAME.format(rank=self.accelerator.process_index))
        if not os.path.exists(path):
            return
        state = _load_state_file(path, BUFFER_STATE_KEYS)
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


def _to_dapo_config(args: GRPOConfig) -> DAPOConfig:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(GRPOConfig) if f.init}
    values["generation_batch_size"] = None  # derived again from steps_per_generation
    logger.warning(
        "DAPOTrainer got a GRPOConfig: converted to DAPOConfig keeping its values; the DAPO-only settings "
        "(dynamic_sampling, overlong_shaping, ...) take their defaults."
    )
    return DAPOConfig(**values)


def _schedule_unless_skipped(cls: type, skipped) -> type:
    """
    `cls` whose `step` does nothing while `skipped()`: a subclass, not an instance attribute, so that the scheduler's
    `state_dict` (its `__dict__`, saved with every checkpoint) holds nothing new.
    """

    class ScheduleUnlessSkipped(cls):
        def step(self, *args, **kwargs):
            return None if skipped() else super().step(*args, **kwargs)

    ScheduleUnlessSkipped.__name__ = ScheduleUnlessSkipped.__qualname__ = cls.__name__
    return ScheduleUnlessSkipped


def _accepts_position_ids(model: nn.Module) -> bool:
    """Whether the model (the base model under PEFT) takes `position_ids` in its forward."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "position_ids" in inspect.signature(type(base).forward).parameters
    except (TypeError, ValueError):
        return False


def _load_state_file(path: str, keys: tuple[str, ...] = ()) -> dict:
    """`torch.load` of a dapo-trl state file holding `keys`, with an error that names the file when it is not one."""
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as error:  # truncated, foreign or garbage files fail in many ways inside torch
        raise ValueError(
            f"{path} is not a readable dapo-trl state file ({type(error).__name__}: {_first_line(error)}). "
            "It may be truncated or come from another program. Delete it to resume without it (the prompt stream "
            "then restarts; a half-used generation batch is generated again)."
        ) from error
    if not isinstance(state, dict):
        raise ValueError(
            f"{path} holds a {type(state).__name__}, not a dapo-trl state dict. Delete it to resume without it."
        )
    missing = [key for key in keys if key not in state]
    if missing:
        raise ValueError(
            f"{path} lacks the entries {missing} of a dapo-trl state file (it holds {sorted(map(str, state))[:8]}): it "
            "was not written by DAPOTrainer. Delete it to resume without it (the prompt stream then restarts; a "
            "half-used generation batch is generated again)."
        )
    return state


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else "no details"
