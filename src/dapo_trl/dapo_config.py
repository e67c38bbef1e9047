"""Configuration of [`DAPOTrainer`]: TRL's `GRPOConfig` with the DAPO paper's defaults and the settings TRL lacks."""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig

from ._help import apply_docstring_help
from ._validate import check_settings, gguf_problem
from .trainer.preemption import STOP_POINTS
from .trainer.probing import default_probe, probe_problem, probe_warning
from .trainer.sampling import STRATEGIES

EXHAUSTED_POLICIES = ("train", "raise")
TRUNCATION_SIDES = ("left", "right", "error")
VLLM_DTYPES = ("auto", "float32", "bfloat16", "float16")

logger = logging.getLogger(__name__)


@dataclass
class DAPOConfig(GRPOConfig):
    r"""
    Configuration class for [`DAPOTrainer`].

    Every [`~trl.GRPOConfig`] parameter is accepted. Defaults follow the DAPO recipe (arXiv 2503.14476, §4.1) where
    TRL's differ, and the parameters below are added. All of them are usable from YAML and the command line through
    [`~trl.TrlParser`], so an existing GRPOConfig YAML loads unchanged.

    > Defaults different from [`~trl.GRPOConfig`]: `epsilon_high=0.28` (Clip-Higher, §3.1, Eq. 10),
    > `num_generations=16` (§4.1), `per_device_train_batch_size=16` (this project's choice: the default batch then holds
    > whole groups of 16), `lr_scheduler_type="constant_with_warmup"` with `warmup_steps=20` (§4.1 warms the learning
    > rate up linearly over 20 *rollout* steps; `warmup_steps` counts *optimizer* steps, so the default is 20 optimizer
    > steps, and `configs/dapo_qwen2.5_32b.yaml` sets 320 = 20 rollout steps x 16 updates per rollout). Kept from TRL
    > because they already match the paper: `epsilon=0.2` (Eq. 10), `beta=0.0` (no KL term, no reference model, §2.3),
    > `loss_type="dapo"` (token-level loss, Eq. 12; made exact per optimizer step by the trainer), `temperature=1.0`,
    > `top_p=1.0`, `learning_rate=1e-6` (§4.1) and `scale_rewards="group"` (Eq. 9). Not the paper's:
    > `max_completion_length` keeps TRL's default of 512 (§4.1 generates up to 20,480 tokens; the paper config sets
    > it), and `mask_truncated_completions=False` (overlong *filtering* off) follows verl's DAPO recipe and its README,
    > not the paper, whose Table 1 adds overlong filtering as a step; turn it on to mask truncated completions out of
    > the loss.

    Parameters:
        > Defaults that differ from GRPOConfig's (DAPO §4.1)

        epsilon_high (`float`, *optional*, defaults to `0.28`):
            Upper clip range of the probability ratio (Clip-Higher, DAPO §3.1, Eq. 10); the lower one is `epsilon`.
        num_generations (`int`, *optional*, defaults to `16`):
            Completions sampled per prompt, the group size G (DAPO §4.1).
        per_device_train_batch_size (`int`, *optional*, defaults to `16`):
            Rows (completions) per device and micro-step. The default holds one whole group of the default
            `num_generations`.
        lr_scheduler_type (`str`, *optional*, defaults to `"constant_with_warmup"`):
            Learning-rate schedule: constant after a linear warm-up (DAPO §4.1).
        warmup_steps (`float`, *optional*, defaults to `20`):
            Linear warm-up, in optimizer steps (an integer) or as a ratio of the total steps (below 1); DAPO §4.1 warms
            up over 20 rollout steps, i.e. 20 x the optimizer steps per rollout step.

        > Overlong reward shaping (DAPO §3.4)

        overlong_shaping (`bool`, *optional*, defaults to `True`):
            Add the soft overlong punishment of Eq. 13 to the correctness reward before advantages are computed.
        overlong_buffer_len (`int`, *optional*):
            Length $L_{\text{cache}}$ of the punishment interval before `max_completion_length`. Defaults to
            `max_completion_length // 5`, the paper's ratio (4,096 of 20,480). Must be in `(0, max_completion_length)`.
        overlong_penalty_factor (`float`, *optional*, defaults to `1.0`):
            Penalty reached at `max_completion_length` (and beyond).

        > Dynamic sampling (DAPO §3.2, Algorithm 1)

        dynamic_sampling (`bool`, *optional*, defaults to `True`):
            Keep only prompt groups whose filter reward varies across the group, and keep generating rounds of new
            prompts until the generation batch (`generation_batch_size // num_generations` groups) is full of them.
            Evaluation never filters.
        dynamic_sampling_reward (`str`, *optional*):
            Name of the reward function that decides whether a group is informative (its `__name__`, as in the
            `rewards/<name>/mean` metric), or `"total"` for the weighted sum of all rewards including the overlong
            penalty. Defaults to the first reward function passed to the trainer: the correctness reward alone,
            before overlong shaping (filtering on the shaped sum would let all-wrong groups of different lengths
            through).
        dynamic_sampling_tolerance (`float`, *optional*, defaults to `0.0`):
            A group is informative when `max - min` of its filter rewards exceeds this (exact inequality by default;
            raise it for continuous rewards).
        dynamic_sampling_max_rounds (`int`, *optional*, defaults to `10`):
            Most generation rounds per generation batch. When reached, `dynamic_sampling_on_exhausted` applies.
        dynamic_sampling_on_exhausted (`str`, *optional*, defaults to `"train"`):
            What to do when the rounds run out before the batch is full: `"train"` trains on the informative groups
            collected so far (the batch is padded with fully masked rows, the token normaliser counts only real
            tokens, a warning is logged and `dynamic_sampling/underfilled` is 1), `"raise"` stops with an explanation.
        dynamic_sampling_round_sizing (`str`, *optional*, defaults to `"adaptive"`):
            How many prompts each round asks for: `"adaptive"` (from the informative rate observed so far, so that one
            round usually suffices), `"deficit"` (exactly the missing groups) or `"fixed"` (3x the batch every round,
            like verl).
        dynamic_sampling_max_round_prompts (`int`, *optional*):
            Largest round, in prompts. Defaults to 8x the number of groups of the generation batch.
        dynamic_sampling_margin (`float`, *optional*, defaults to `1.5`):
            Safety margin of the adaptive sizing, in binomial standard deviations: higher means fewer second rounds
            and more surplus groups.
        dynamic_sampling_carry_over (`bool`, *optional*):
            Carry informative groups left over once the batch is full into the next generation batches instead of
            discarding them. A carried group is at least one generation batch stale (`steps_per_generation *
            num_iterations / gradient_accumulation_steps` optimizer updates at its first micro-step, logged as
            `dynamic_sampling/carried_staleness`), is trained before fresh groups, waits while it stays within
            `dynamic_sampling_carry_max_staleness`, and its importance ratio uses the log-probabilities of the policy
            that sampled it (computed when it was generated). Defaults to `dynamic_sampling_skip` (off unless prompt
            skipping is on, which measured best with it).
        dynamic_sampling_carry_max_staleness (`float`, *optional*):
            Most optimizer updates between the policy that sampled a carried group and the first update that trains
            it; a carried group that would be older waiting for the next batch is discarded. Defaults to two
            generation batches (`2 * steps_per_generation * num_iterations / gradient_accumulation_steps`); at least
            one batch's updates.

        > Prompt length (TRL 1.16 has no prompt limit: string prompts are tokenised whole)

        max_prompt_length (`int`, *optional*):
            Longest prompt, in tokens (after the chat template); a longer prompt is cut on `prompt_truncation_side`
            before generation, and `prompts/truncated_ratio` logs how often. `None` (default) sets no limit, and a
            training prompt longer than the model's context (`max_position_embeddings`) is refused when the trainer
            is built, naming its row. verl's DAPO recipe uses 2,048.
        prompt_truncation_side (`str`, *optional*, defaults to `"left"`):
            `"left"` keeps the end of the prompt (the question and the answer format usually come last; verl's
            choice), `"right"` keeps its start, `"error"` refuses a prompt longer than `max_prompt_length`.

        > Pre-rollout prompt skipping (dynamic sampling)

        dynamic_sampling_skip (`bool`, *optional*, defaults to `False`):
            Before generating, pass over prompts whose next group is unlikely to be informative, as judged by
            `dynamic_sampling_skip_rule` ([`SkipPolicy`]), never beyond `dynamic_sampling_skip_max_prob`. Saves
            generation from the second epoch on; off by default, like the paper's recipe. Needs
            `dynamic_sampling=True`.
        dynamic_sampling_skip_rule (`str`, *optional*, defaults to `"streak"`):
            `"posterior"`: a Beta posterior of each prompt's success rate (population prior, forgotten with
            `dynamic_sampling_skip_half_life`); a prompt seen before is generated when a Thompson draw of the chance
            that its next group is informative reaches the skip threshold. `"streak"`: the deterministic-history rule,
            which skips prompts whose last groups were all all-correct (or all all-wrong) by their class's measured
            informative rate.
        dynamic_sampling_skip_half_life (`float`, *optional*, defaults to `100.0`):
            Half-life, in optimizer steps, of the success counts behind each prompt's posterior (posterior rule): older
            groups count less, so the estimate follows the policy as it improves. Must be positive.
        dynamic_sampling_skip_draws (`int`, *optional*, defaults to `1`):
            Thompson draws per decision (posterior rule); a prompt is skipped only when every draw says so, so more
            draws explore more.
        dynamic_sampling_skip_target (`float`, *optional*, defaults to `0.75`):
            Informative rate of the generated groups that skipping steers towards, in `(0, 1]`: while the generated
            groups are less informative, skipping tightens (as far as the measured rates justify); above it, it
            relaxes. `1.0` always skips as far as the measured rates justify.
        dynamic_sampling_skip_max_prob (`float`, *optional*, defaults to `0.99`):
            Highest probability of skipping a prompt, in `[0, 1)`: a skipped prompt keeps at least
            `1 - dynamic_sampling_skip_max_prob` chance to be generated each time the stream reaches it, so prompts
            that become learnable are found again. `0.0` never skips. Skipping makes the stream pass faster, so a
            skipped prompt is reached often: at 0.95, each easy or hard prompt of the simulation's held-out task was
            generated again 0.84 times in 5 passes, at 0.99 0.40 times (docs/prompt_skipping.md).
        dynamic_sampling_probe (`int`, *optional*):
            Probe before completing a group: each round generates this many of a prompt's `num_generations`
            completions first, and the rest only for groups whose probe is mixed, or whose kind of prompt completes
            informative often enough to pay for the rest ([`ProbeRule`]); the trained group is the whole
            `num_generations`, the probe's completions included. One more generation call per round. `0` generates
            whole groups. Defaults to `num_generations // 4` (at least 2, from `num_generations=4`) with
            `dynamic_sampling_skip=True`, else 0. Must be 0, or at least 2 and below `num_generations`.

        > Preemption and restarts (see `dapo_trl.trainer.preemption`)

        preemption_handling (`bool`, *optional*, defaults to `True`):
            On SIGTERM, SIGUSR1 or Ctrl-C (SIGINT), finish the current optimizer step (see `preemption_stop_at`), run
            the evaluation due there, save a complete checkpoint (model, optimizer, scheduler, RNG, dynamic-sampling
            state; even with `save_strategy="no"`) and exit with code 75 (130 after Ctrl-C). All processes stop at the
            same step even when only some received the signal. A second signal stops at once, without saving.
        preemption_stop_at (`str`, *optional*, defaults to `"step"`):
            `"step"`: stop after the current optimizer step; a checkpoint taken in the middle of a rollout keeps the
            rollout's unused micro-batches, so the resumed run matches an uninterrupted one exactly. `"rollout"`: stop
            once the current generation round's updates are done (up to `steps_per_generation * num_iterations /
            gradient_accumulation_steps` optimizer steps later: 16 in the paper's recipe, longer than a typical
            preemption notice).
        preemption_timeout (`float` or `None`, *optional*, defaults to `600.0`):
            Longest wait, in seconds from the first signal, for the stop point (`preemption_stop_at`). When it passes
            first (a step that never ends, e.g. dynamic sampling refilling without an informative group), the process
            logs why and exits with code 124 without saving. The due evaluation and the save, once started, are not
            bounded by it. `None`: wait without bound. Keep it below the scheduler's grace period minus one save.
        auto_resume (`bool`, *optional*, defaults to `False`):
            `train()` called without `resume_from_checkpoint` resumes from the newest complete `checkpoint-N` in
            `output_dir` (partially written ones are skipped), or starts fresh when there is none, so a preempted job
            restarts with the same command. Checkpoints are published atomically either way. Without it (and without
            `resume_from_checkpoint`), a run into an `output_dir` that holds a complete checkpoint is refused rather
            than replacing it; see `overwrite_output_dir`.
        overwrite_output_dir (`bool`, *optional*, defaults to `False`):
            Start at step 0 in an `output_dir` that holds checkpoints, deleting its `checkpoint-N` folders first. Set it
            for one run, not in a command a scheduler reruns (each restart would start over). Not with `auto_resume`.

        > vLLM engine (with `use_vllm=True`; see docs/vllm.md)

        vllm_dtype (`str`, *optional*, defaults to `"auto"`):
            Dtype of the colocated vLLM engine's weights and compute (TRL passes none, and vLLM then serves a float32
            model in bfloat16). `"auto"` on vLLM's CPU platform follows the trainer: `"bfloat16"` with `bf16=True`,
            `"float16"` with `fp16=True`, else the dtype of the model's weights (float32 for float32 training). On a
            GPU `"auto"` leaves the choice to vLLM, as for GRPOTrainer's engine (a float32 checkpoint in bfloat16): a
            float32 engine there doubles the engine's weight memory, so ask for it with `"float32"`. Or one of
            `"float32"`, `"bfloat16"`, `"float16"`. The log-probability gap this leaves between vLLM and the trainer is
            logged by TRL as `sampling/sampling_logp_difference/mean` and `/max`. Not used in server mode (the server
            sets its own).

        > Diagnostics

        diagnostics (`bool`, *optional*, defaults to `True`):
            Register a [`DiagnosticsCallback`] that watches the logged metrics for GRPO's failure modes (entropy
            collapse, vanishing gradient signal, length collapse or explosion, truncation growth, reward-hacking hints),
            warns once per symptom with the numbers and the setting to change, and logs `diagnostics/<name>` (0/1).
    """

    # Paper defaults that differ from GRPOConfig's
    epsilon_high: float | None = 0.28
    num_generations: int | None = 16
    per_device_train_batch_size: int = 16
    lr_scheduler_type: str = "constant_with_warmup"
    warmup_steps: float = 20

    # Overlong reward shaping
    overlong_shaping: bool = True
    overlong_buffer_len: int | None = None
    overlong_penalty_factor: float = 1.0

    # Dynamic sampling
    dynamic_sampling: bool = True
    dynamic_sampling_reward: str | None = None
    dynamic_sampling_tolerance: float = 0.0
    dynamic_sampling_max_rounds: int = 10
    dynamic_sampling_on_exhausted: str = field(default="train", metadata={"choices": EXHAUSTED_POLICIES})
    dynamic_sampling_round_sizing: str = field(default="adaptive", metadata={"choices": STRATEGIES})
    dynamic_sampling_max_round_prompts: int | None = None
    dynamic_sampling_margin: float = 1.5
    dynamic_sampling_carry_over: bool | None = None
    dynamic_sampling_carry_max_staleness: float | None = None

    # Prompt length
    max_prompt_length: int | None = None
    prompt_truncation_side: str = field(default="left", metadata={"choices": TRUNCATION_SIDES})

    # Pre-rollout prompt skipping
    dynamic_sampling_skip: bool = False
    dynamic_sampling_skip_rule: str = "streak"
    dynamic_sampling_skip_half_life: float = 100.0
    dynamic_sampling_skip_draws: int = 1
    dynamic_sampling_skip_target: float = 0.75
    dynamic_sampling_skip_max_prob: float = 0.99
    dynamic_sampling_probe: int | None = None

    # Preemption and restarts
    preemption_handling: bool = True
    preemption_stop_at: str = field(default="step", metadata={"choices": STOP_POINTS})
    preemption_timeout: float | None = 600.0
    auto_resume: bool = False
    overwrite_output_dir: bool = False

    # vLLM engine
    vllm_dtype: str = "auto"

    # Diagnostics
    diagnostics: bool = True

    def __post_init__(self):
        # TRL derives the generation batch from these when the user sets neither (its errors then name it anyway)
        derived_generation_batch, steps_given = (
            self.generation_batch_size is None,
            self.steps_per_generation is not None,
        )
        try:
            check_settings(self)
            _check_positive_counts(self)
            try:
                super().__post_init__()
            except ValueError as error:
                if derived_generation_batch and "must be divisible by num_generations" in str(error):
                    raise ValueError(_whole_groups_message(self, steps_given=steps_given)) from None
                raise
            self._check_gguf()
            self._check_clipping()
            self._check_overlong()
            self._resolve_skip_defaults()
            self._check_dynamic_sampling()
            self._check_prompt_length()
            self._check_dynamic_sampling_skip()
            self._check_preemption()
            self._check_vllm_dtype()
        except ValueError as error:
            # after the import swap a user reads "(16)" as their own value: say which defaults the error involves
            if error.args and isinstance(error.args[0], str):
                error.args = (error.args[0] + default_notes(error.args[0], self), *error.args[1:])
            raise

    def _check_gguf(self) -> None:
        problem = gguf_problem(
            model_init_kwargs=self.model_init_kwargs if isinstance(self.model_init_kwargs, dict) else None
        )
        if problem:
            raise ValueError(problem[0].upper() + problem[1:])

    def _check_clipping(self) -> None:
        if self.epsilon < 0 or (self.epsilon_high is not None and self.epsilon_high < 0):
            raise ValueError(
                f"epsilon ({self.epsilon}) and epsilon_high ({self.epsilon_high}) must be non-negative: they are the "
                "clip ranges below and above a probability ratio of 1 (the paper uses 0.2 and 0.28)."
            )
        if self.epsilon >= 1:
            raise ValueError(
                f"epsilon ({self.epsilon}) must be below 1, otherwise the lower clip bound 1 - epsilon is not positive."
            )

    def _check_overlong(self) -> None:
        if self.max_completion_length is None or self.max_completion_length < 1:
            raise ValueError(f"max_completion_length must be a positive integer, got {self.max_completion_length}.")
        if not self.overlong_shaping:
            return
        if self.overlong_buffer_len is None:
            self.overlong_buffer_len = max(1, self.max_completion_length // 5)
        if not 0 < self.overlong_buffer_len < self.max_completion_length:
            raise ValueError(
                f"overlong_buffer_len ({self.overlong_buffer_len}) must be between 0 and max_completion_length "
                f"({self.max_completion_length}), exclusive. The paper uses 4096 of 20480; set it lower, or set "
                "overlong_shaping=False."
            )
        if self.overlong_penalty_factor < 0:
            raise ValueError(
                f"overlong_penalty_factor ({self.overlong_penalty_factor}) must be non-negative: it is the size of the "
                "penalty subtracted from overlong completions."
            )

    def _check_dynamic_sampling(self) -> None:
        if self.dynamic_sampling_on_exhausted not in EXHAUSTED_POLICIES:
            raise ValueError(
                f"dynamic_sampling_on_exhausted must be one of {EXHAUSTED_POLICIES}, got "
                f"{self.dynamic_sampling_on_exhausted!r}."
            )
        if self.dynamic_sampling_round_sizing not in STRATEGIES:
            raise ValueError(
                f"dynamic_sampling_round_sizing must be one of {STRATEGIES}, got {self.dynamic_sampling_round_sizing!r}."
            )
        if self.dynamic_sampling_max_rounds < 1:
            raise ValueError(
                f"dynamic_sampling_max_rounds must be at least 1, got {self.dynamic_sampling_max_rounds}."
            )
        if self.dynamic_sampling_tolerance < 0:
            raise ValueError(f"dynamic_sampling_tolerance must be >= 0, got {self.dynamic_sampling_tolerance}.")
        if self.dynamic_sampling_margin < 0:
            raise ValueError(f"dynamic_sampling_margin must be >= 0, got {self.dynamic_sampling_margin}.")
        if self.dynamic_sampling_max_round_prompts is not None and self.dynamic_sampling_max_round_prompts < 1:
            raise ValueError("dynamic_sampling_max_round_prompts must be a positive integer or None.")
        if self.dynamic_sampling and self.dynamic_sampling_carry_over and self.use_liger_kernel:
            raise ValueError(
                "dynamic_sampling_carry_over needs the trainer's own loss forward (carried rows are trained against the "
                "log-probabilities of the policy that sampled them, fresh rows against the current ones), which the "
                "Liger fused loss bypasses. Set use_liger_kernel=False or dynamic_sampling_carry_over=False."
            )

    def _resolve_skip_defaults(self) -> None:
        """Settings whose default follows `dynamic_sampling_skip`: with it, the sampler that measured best."""
        if self.dynamic_sampling_carry_over is None:
            # (carry-over cannot run under Liger's fused loss: only an explicit request gets that error)
            self.dynamic_sampling_carry_over = bool(self.dynamic_sampling_skip) and not self.use_liger_kernel
        if self.dynamic_sampling_probe is None:
            self.dynamic_sampling_probe = default_probe(self.num_generations) if self.dynamic_sampling_skip else 0
        problem = probe_problem(self.dynamic_sampling_probe, self.num_generations)
        if problem and self.dynamic_sampling:
            raise ValueError(problem)
        warning = probe_warning(self.dynamic_sampling_probe, self.num_generations)
        if warning and self.dynamic_sampling:
            logger.warning(warning)
        per_batch = self.steps_per_generation * self.num_iterations / self.gradient_accumulation_steps
        most = self.dynamic_sampling_carry_max_staleness
        if most is not None and most < per_batch - 1e-9:
            raise ValueError(
                f"dynamic_sampling_carry_max_staleness={most:g} is below the {per_batch:g} optimizer updates a carried "
                "group waits at the least (one generation batch: steps_per_generation * num_iterations / "
                "gradient_accumulation_steps). Raise it, or set dynamic_sampling_carry_over=False."
            )

    def _check_prompt_length(self) -> None:
        if self.prompt_truncation_side not in TRUNCATION_SIDES:
            raise ValueError(
                f"prompt_truncation_side must be one of {TRUNCATION_SIDES}, got {self.prompt_truncation_side!r}."
            )
        if self.max_prompt_length is not None and (
            isinstance(self.max_prompt_length, bool) or not isinstance(self.max_prompt_length, int)
        ):
            raise ValueError(f"max_prompt_length must be a positive integer or None, got {self.max_prompt_length!r}.")
        if self.max_prompt_length is not None and self.max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be a positive integer or None, got {self.max_prompt_length}.")

    def _check_dynamic_sampling_skip(self) -> None:
        if not 0.0 < self.dynamic_sampling_skip_target <= 1.0:
            raise ValueError(
                f"dynamic_sampling_skip_target must be in (0, 1], got {self.dynamic_sampling_skip_target}: it is the "
                "informative rate of the generated groups that prompt skipping steers towards."
            )
        if not 0.0 <= self.dynamic_sampling_skip_max_prob < 1.0:
            raise ValueError(
                f"dynamic_sampling_skip_max_prob must be in [0, 1), got {self.dynamic_sampling_skip_max_prob}: below 1 "
                "so that a skipped prompt can still be drawn again when it becomes learnable."
            )
        if self.dynamic_sampling_skip_rule not in ("posterior", "streak"):
            raise ValueError(
                f"dynamic_sampling_skip_rule must be 'posterior' or 'streak', got {self.dynamic_sampling_skip_rule!r}."
            )
        if not self.dynamic_sampling_skip_half_life > 0 or math.isinf(self.dynamic_sampling_skip_half_life):
            raise ValueError(
                f"dynamic_sampling_skip_half_life must be a positive number of steps, got "
                f"{self.dynamic_sampling_skip_half_life}: it is how fast a prompt's posterior forgets old groups."
            )
        if isinstance(self.dynamic_sampling_skip_draws, bool) or self.dynamic_sampling_skip_draws < 1:
            raise ValueError(
                f"dynamic_sampling_skip_draws must be a positive integer, got {self.dynamic_sampling_skip_draws!r}."
            )
        if self.dynamic_sampling_skip and not self.dynamic_sampling:
            raise ValueError(
                "dynamic_sampling_skip=True passes over prompts drawn by dynamic sampling's prompt stream, but "
                "dynamic_sampling=False. Set dynamic_sampling=True, or dynamic_sampling_skip=False."
            )

    def _check_vllm_dtype(self) -> None:
        if self.vllm_dtype not in VLLM_DTYPES:
            raise ValueError(f"vllm_dtype must be one of {VLLM_DTYPES}, got {self.vllm_dtype!r}.")

    def _check_preemption(self) -> None:
        if self.preemption_stop_at not in STOP_POINTS:
            raise ValueError(f"preemption_stop_at must be one of {STOP_POINTS}, got {self.preemption_stop_at!r}.")
        timeout = self.preemption_timeout
        if timeout is not None and not timeout > 0:  # its type is checked with the other settings'
            raise ValueError(
                f"preemption_timeout must be a number of seconds above 0 (or None to wait without bound), got "
                f"{timeout!r}."
            )
        if self.preemption_handling and self.enable_jit_checkpoint:
            raise ValueError(
                "preemption_handling and transformers' enable_jit_checkpoint both handle SIGTERM. Keep "
                "preemption_handling (all processes stop at the same step, checkpoints are published atomically) and "
                "set enable_jit_checkpoint=False, or set preemption_handling=False."
            )
        if self.auto_resume and self.overwrite_output_dir:
            raise ValueError(
                "auto_resume=True continues the run in output_dir and overwrite_output_dir=True deletes its "
                "checkpoints to start over: set one of them to False."
            )
        if self.auto_resume and self.save_only_model:
            raise ValueError(
                "auto_resume=True with save_only_model=True: such checkpoints hold no optimizer, scheduler or RNG "
                "state, so a resumed run would not continue the interrupted one. Set save_only_model=False."
            )
        if self.preemption_handling and self.save_only_model:
            logger.warning(
                "save_only_model=True: the checkpoint saved on preemption holds only the model (no optimizer, scheduler "
                "or RNG state), so a restart cannot continue the run exactly."
            )


apply_docstring_help(DAPOConfig)  # each setting's --help is its docstring entry (dapo_trl._help)


def _check_positive_counts(config: DAPOConfig) -> None:
    """Counts TRL divides by in its own `__post_init__` (a 0 there is a bare `ZeroDivisionError`)."""
    for name in ("num_generations", "per_device_train_batch_size", "gradient_accumulation_steps", "num_iterations"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value}.")
    for name in ("steps_per_generation", "generation_batch_size", "num_generations_eval"):
        value = getattr(config, name, None)
        if value is not None and value < 1:
            raise ValueError(f"{name} must be a positive integer or None, got {value}.")


def _whole_groups_message(config: DAPOConfig, *, steps_given: bool) -> str:
    """
    TRL's "generation_batch_size must be divisible by num_generations" in the settings the user gave: TRL derives the
    generation batch from them, so the user never set the size it names.
    """
    steps = config.steps_per_generation
    processes = config.world_size
    rows = config.per_device_train_batch_size * processes * steps
    return (
        f"A generation batch must hold whole groups of num_generations ({config.num_generations}) completions, but "
        f"per_device_train_batch_size ({config.per_device_train_batch_size}) x processes ({processes}) x "
        f"steps_per_generation ({steps}{'' if steps_given else ', = gradient_accumulation_steps'}) "
        f"= {rows} rows. Set per_device_train_batch_size (or steps_per_generation) so that this product is a multiple "
        f"of {config.num_generations}, e.g. per_device_train_batch_size={config.num_generations}, or change "
        "num_generations."
    )


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def changed_defaults() -> dict[str, tuple[Any, Any]]:
    """
    `{name: (DAPOConfig's default, GRPOConfig's default)}` for every setting the two classes share whose defaults
    differ, read from the dataclasses themselves.

    Example:
    ```python
    >>> changed_defaults()["num_generations"]
    (16, 8)

    ```
    """
    trl = {f.name: _field_default(f) for f in dataclasses.fields(GRPOConfig)}
    return {
        f.name: (_field_default(f), trl[f.name])
        for f in dataclasses.fields(DAPOConfig)
        if f.name in trl and _field_default(f) != trl[f.name]
    }


def added_switches_on() -> dict[str, Any]:
    """`{name: default}` of the boolean settings GRPOConfig lacks that DAPOConfig turns on by default."""
    trl = {f.name for f in dataclasses.fields(GRPOConfig)}
    return {f.name: f.default for f in dataclasses.fields(DAPOConfig) if f.name not in trl and f.default is True}


def inherited_defaults(config: Any) -> dict[str, tuple[Any, Any]]:
    """The entries of [`changed_defaults`] that `config` still holds (the user left them unset, or set the same)."""
    return {
        name: (dapo, trl) for name, (dapo, trl) in changed_defaults().items() if getattr(config, name, None) == dapo
    }


def defaults_notice(config: Any) -> str | None:
    """
    One paragraph naming the settings where `config` runs on a DAPOConfig default that GRPOConfig does not have, and
    the DAPO-only switches that are on, or `None` when there is none. Printed once when training starts.
    """
    changed = inherited_defaults(config)
    switches = {name: getattr(config, name) for name in added_switches_on() if getattr(config, name, False) is True}
    if not changed and not switches:
        return None
    parts = []
    if changed:
        listed = ", ".join(f"{name}={_show(dapo)} (GRPOConfig: {_show(trl)})" for name, (dapo, trl) in changed.items())
        parts.append(f"DAPOConfig defaults in effect that differ from GRPOConfig's: {listed}")
    if switches:
        parts.append(f"DAPO settings on by default that GRPOConfig lacks: {', '.join(switches)}")
    return "; ".join(parts) + ". Set any of them to change it (this notice lists only values left at DAPO's default)."


def default_notes(message: str, config: Any) -> str:
    """
    What to append to an error `message` about `config`: for each setting the message names that holds a DAPOConfig
    default differing from GRPOConfig's, that it is DAPO's default and what TRL's is ("" when there is none).
    """
    notes = [
        f"{name}={_show(dapo)} is DAPOConfig's default (GRPOConfig's is {_show(trl)})"
        for name, (dapo, trl) in inherited_defaults(config).items()
        if re.search(rf"\b{re.escape(name)}\b", message)
    ]
    return f" [{'; '.join(notes)}.]" if notes else ""


def _show(value: Any) -> str:
    return str(getattr(value, "value", value))
