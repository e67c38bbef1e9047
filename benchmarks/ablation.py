r"""Does DAPO beat GRPO? The paper's ablation (DAPO Table 1), reproduced at CPU scale on the embedded toy task.

The paper (AIME24 avg@32, Qwen2.5-32B): naive GRPO 30, + overlong filtering 36, + clip-higher 38, + soft overlong
punishment 41, + token-level loss 42, + dynamic sampling 50; full DAPO needs half of GRPO's training steps. This script
trains the same rows on [`dapo_trl.run.toy`] (addition problems, a 0.34M-parameter model) and prints a table with the
steps and generated tokens each variant needs to reach a held-out accuracy target, its final held-out accuracy and its
entropy, and draws the curves.

| row                         | DAPOConfig settings (cumulative)                                                    |
|-----------------------------|-------------------------------------------------------------------------------------|
| naive GRPO                  | `epsilon=epsilon_high=0.2`, `loss_type="grpo"` (sequence mean), everything else off |
| + overlong filtering        | `mask_truncated_completions=True`                                                   |
| + clip-higher               | `epsilon_high=0.28`                                                                 |
| + soft overlong punishment  | `overlong_shaping=True` (Eq. 13)                                                    |
| + token-level loss          | `loss_type="dapo"`                                                                  |
| + dynamic sampling          | `dynamic_sampling=True`                                                             |
| full DAPO (defaults)        | `DAPOConfig`'s defaults: the row above with overlong filtering off                  |
| full DAPO + prompt skipping | the defaults and `dynamic_sampling_skip=True` (pre-rollout skipping, not a paper row) |
| full DAPO + posterior skipping | the same with `dynamic_sampling_skip_rule="posterior"` (not a paper row)         |

Protocol:

- One supervised warm-up per seed ([`warmup_sft`]), saved once and reloaded by every variant of that seed (and by later
  invocations with the same settings, from `--cache-dir`): the comparison isolates the RL phase.
- The same generation budget for every run: `--budget-groups` prompt groups of `num_generations` completions,
  counting every completion generated for training, dynamic sampling's discarded groups and extra rounds included.
  Training stops at the first generation-cycle boundary past the budget (every rollout generated is trained on), so a
  dynamic-sampling run overshoots by at most one batch's rounds; the table reports the groups and completion tokens
  actually generated, and the optimizer steps they paid for. Dynamic sampling spends the budget on fewer, fuller steps.
- Held-out sampled accuracy ([`accuracy_report`], T=1, fixed sampling seed, one test set shared by all seeds and
  variants, disjoint from training) before RL and every `--eval-steps` optimizer steps (a multiple of the updates per
  rollout, so each checkpoint closes a generation cycle). The global RNG state is saved and restored around it, so
  measuring does not change the training run.
- Steps (tokens) to target: the first checkpoint at or above the target, averaged over the seeds that reach it. The
  target is chosen from the runs by a fixed rule ([`choose_target`]: half-way from the warm-up accuracy to the weakest
  variant's final accuracy) unless `--target` is given.
- Entropy: TRL's `entropy` metric (mean token entropy of the policy on the rollout tokens in the loss), every step.
- RL prompts (`--rl-train-size N`): by default the RL phase draws from the whole training set (the one the warm-up
  used), so 1,600 groups from 20,000 problems (7,220 distinct: the 1-digit levels repeat) visit ~0.08 of it and no
  prompt comes back. Prompt skipping only acts on a prompt drawn before, so its row needs prompts to recur: with
  `--rl-train-size N` the warm-up still uses all `--train-size` problems, but the RL phase draws from only the first
  `N` distinct ones (in the set's order, so the level mix is the warm-up's), and the budget covers
  `budget / N` passes over them.

Settings. The RL settings are the CPU demo's (`CPU_DEMO` in `examples/train_math.py`): 8 completions per prompt,
64 rows (8 prompts) per optimizer step, 4 optimizer steps per rollout of 32 prompts (`steps_per_generation=4` >
`gradient_accumulation_steps=1`, so the probability ratio leaves 1 and clipping can act; the paper does 16),
lr 1e-4 constant, T=1, `max_completion_length=28` with `overlong_buffer_len=7`, 20,000 training problems, and the
toy's warm-up (1,200 steps, batch 32, lr 3e-3). Two departures: held-out accuracy uses 4 samples per problem on
256 problems (the demo uses 8; it halves evaluation time), and a run is bounded by generated groups, not steps.

Why these, and not the shorter settings tried first:

- `max_completion_length=28` leaves room for the longest well-formed completion (21 tokens with EOS, `Rev:` work line
  included) and puts it exactly at `max_completion_length - overlong_buffer_len`, where Eq. 13's penalty starts: like
  the paper's 16k expected length inside a 20k limit, the length rules only act on runaway completions. With the
  previous demo limit of 16, every work line on a 2-digit answer was cut off inside the answer: RL then only learned
  to drop the work line (held-out 0.37 -> 0.60 within ~40 steps for every variant, then flat at the 2+2-digit
  ceiling), which tests the length limit rather than the algorithms, and overlong filtering hid exactly the signal
  that lesson needs.
- lr 3e-4 (tried with the limit of 16) was unstable: naive GRPO rose to 0.55 and fell back to ~0.45 within 160 steps.

Results (`benchmarks/results/ablation.md`; 3 seeds, 1,600 prompt groups = ~210k completion tokens per run):

- Final held-out accuracy: no technique beats naive GRPO at this budget. Every row ends within one seed spread
  (0.02-0.04) of naive GRPO's 0.559; paired by seed, full DAPO ends 0.024 +- 0.014 lower (lower in all three seeds, by
  0.008-0.037; one checkpoint's sampling error is ~0.015). All curves are still rising when the budget runs out.
- Steps: full DAPO reaches the target (warm-up + 0.025) in 0.70x naive GRPO's optimizer steps (28 vs 40), not the
  paper's 0.5x, and with 1.15x the generated tokens. The saving is dynamic sampling's alone (the "+ dynamic sampling"
  row needs the same 28 steps): a step holds only informative groups, so the budget buys fewer, fuller steps
  (124-127 instead of 200). Here 57-88% of groups are informative (seed-dependent) and ~1.05 rounds fill a batch,
  so it saves steps, not generation.
- Why the other rows show nothing, measured rather than assumed:
  - Overlong filtering and soft punishment have nothing to act on: 0.02-0.06% of rollouts are truncated and
    well-formed completions stay below the penalty zone (by the choice above). "+ overlong filtering" trains like
    naive GRPO checkpoint for checkpoint until the first truncated rollout differs.
  - Clip-higher: the ratio almost never leaves the clip range (0.02-0.04% of tokens at the upper clip, 0.15-0.23% at
    the lower one, with 4 updates per rollout), so raising the upper bound changes almost nothing. One-seed probes:
    the paper's 16 updates per rollout at lr 1e-4 still clip only 0.08% / 0.41%; at lr 3e-4, 0.2-0.3% / 0.8-1%,
    but then both naive GRPO and clip-higher lose accuracy (0.474 -> 0.41 / 0.43) and their entropy falls alike
    (0.150 -> 0.096 / 0.093).
  - Entropy does not collapse within the budget: every row goes 0.139 -> 0.10-0.12 (the dynamic-sampling rows end
    highest, after fewer steps); clip-higher ends at 0.104 against 0.103 without it.
  - Token-level loss: completions are 10-21 tokens (under 2x apart) in groups of 8, so token and sequence means
    weight them almost alike; its row is within noise of the one before.
- A fair test of the remaining techniques needs what this budget cannot give a 0.34M model: longer reasoning that
  raises accuracy and runs into the length limit (so truncation is common and costly), and enough updates for
  symmetric clipping to collapse entropy (the paper trains for thousands of steps).

Prompt skipping (`benchmarks/results/ablation_skip.md`; naive GRPO, full DAPO and full DAPO + prompt skipping,
`--rl-train-size 200`, 3 seeds, the same budget; docs/prompt_skipping.md reads it in full):

- Tokens to the target (warm-up + 0.015): skipping 1.16x naive GRPO's (per seed 0.70-1.84x; the issue's goal was
  <= 0.8x) and 0.99x full DAPO's. The target is reached 174-415 groups in (0.9-2.1 passes over the 200 prompts),
  before the history has had more than one pass to act.
- Skipping acts where most groups are zero-variance: in seed 0 (56% informative without it) it skipped 49% of the
  prompts reached and trained 112 steps instead of 96 on the budget; in seeds 1-2 (89% and 78% informative, above
  `dynamic_sampling_skip_target=0.75`) it skipped 0.3% and 8%, and the step counts did not change.
- Final held-out accuracy 0.517 +- 0.037 against full DAPO's 0.533 +- 0.038 (paired: -0.016 +- 0.004, not larger
  where more was skipped); RL on 200 problems ends lower than on 20,000 (naive GRPO 0.530 against 0.559).
- Runtime: 15.4 min wall-clock on the 2 shared cores, 2 runs at a time, three warm-ups (~5 min) included.

Runtime of the full run: 39.6 min wall-clock on the 2 shared cores (2 runs at a time, one thread each; the load
average from other jobs was 4-6), of which ~6 min were the three warm-ups. `--quick`: ~30 s.

Launch:
```
OMP_NUM_THREADS=1 python benchmarks/ablation.py            # full run: 3 seeds x 8 variants, 2 runs at a time
OMP_NUM_THREADS=1 python benchmarks/ablation.py --quick    # CI smoke: 1 seed, 3 variants, a few steps
# prompt skipping against its baselines, RL on 200 prompts (8 passes at the budget): ablation_skip.{md,png,json}
OMP_NUM_THREADS=1 python benchmarks/ablation.py --rl-train-size 200 --stem ablation_skip \
    --variants "naive GRPO" "full DAPO (defaults)" "full DAPO + prompt skipping"
python benchmarks/ablation.py --from-json benchmarks/results/ablation.json   # re-render table and PNG, no training
```
Results go to `benchmarks/results/ablation.{md,png,json}` (`--quick`: `ablation_quick.*`; `--stem` renames them).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import math
import os
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

logger = logging.getLogger("ablation")
RESULTS_DIR = Path(__file__).resolve().parent / "results"

# The five DAPO techniques in the order of the paper's Table 1, each added on top of the previous ones.
NAIVE_GRPO: dict = {
    "epsilon": 0.2,
    "epsilon_high": 0.2,
    "loss_type": "grpo",
    "mask_truncated_completions": False,
    "overlong_shaping": False,
    "dynamic_sampling": False,
}
TECHNIQUES: tuple[tuple[str, dict], ...] = (
    ("+ overlong filtering", {"mask_truncated_completions": True}),
    ("+ clip-higher", {"epsilon_high": 0.28}),
    ("+ soft overlong punishment", {"overlong_shaping": True}),
    ("+ token-level loss", {"loss_type": "dapo"}),
    ("+ dynamic sampling", {"dynamic_sampling": True}),
)


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    overrides: dict  # DAPOConfig fields; empty means DAPOConfig's defaults


NAIVE = "naive GRPO"
FULL_DAPO = "full DAPO (defaults)"
SKIPPING = "full DAPO + prompt skipping"
POSTERIOR = "full DAPO + posterior skipping"


def variants() -> tuple[Variant, ...]:
    """
    Naive GRPO, each technique added cumulatively, full DAPO (DAPOConfig's defaults: no overlong filtering), then full
    DAPO with pre-rollout prompt skipping ([`skipping_variant`]), by the streak rule and by the posterior rule.
    """
    rows = [Variant(NAIVE, dict(NAIVE_GRPO))]
    for name, change in TECHNIQUES:
        rows.append(Variant(name, {**rows[-1].overrides, **change}))
    rows.append(Variant(FULL_DAPO, {}))
    rows.append(skipping_variant())
    rows.append(skipping_variant("posterior"))
    return tuple(rows)


SKIP_RULE_ROWS = {"streak": SKIPPING, "posterior": POSTERIOR}


def skipping_variant(rule: str = "streak") -> Variant:
    """
    Full DAPO with pre-rollout prompt skipping (`dynamic_sampling_skip=True`, the other skip settings at their
    defaults; `rule="posterior"` also sets `dynamic_sampling_skip_rule`). Skipping only acts on prompts drawn before,
    so the row differs from full DAPO only in runs that cover 2+ epochs of their RL prompts: the default budget (1,600
    groups from 20,000 prompts) covers about 0.08, hence `--rl-train-size`.
    """
    if rule not in SKIP_RULE_ROWS:
        raise ValueError(f"Unknown skip rule {rule!r}; expected one of {sorted(SKIP_RULE_ROWS)}.")
    overrides = {"dynamic_sampling_skip": True}
    if rule != "streak":
        overrides["dynamic_sampling_skip_rule"] = rule
    return Variant(SKIP_RULE_ROWS[rule], overrides)


# ---------------------------------------------------------------------------------------------------------------------
# Warm-up, shared by every variant of a seed
# ---------------------------------------------------------------------------------------------------------------------


def warmup_key(args: argparse.Namespace, seed: int) -> str:
    fields = (
        seed,
        args.train_size,
        args.sft_steps,
        args.sft_batch_size,
        args.sft_lr,
        args.level_weights,
        args.work_prob,
    )
    return hashlib.sha1(repr(fields).encode()).hexdigest()[:10]


def warm_up(args: argparse.Namespace, seed: int) -> str:
    """Supervised warm-up for `seed`, saved once (and reused by later invocations with the same settings)."""
    from dapo_trl.run.toy import build_char_tokenizer, build_tiny_model, warmup_sft

    folder = Path(args.cache_dir) / f"warmup-seed{seed}-{warmup_key(args, seed)}"
    if (folder / "config.json").exists():
        return str(folder)
    torch.set_num_threads(1)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed)
    train_set = training_set(args, seed)
    warmup_sft(
        model,
        tokenizer,
        train_set,
        steps=args.sft_steps,
        batch_size=args.sft_batch_size,
        lr=args.sft_lr,
        seed=seed,
        progress=False,
    )
    # Only the weights: the tokenizer is rebuilt (AutoTokenizer would read this folder's Qwen2 config.json and load a
    # Qwen2Tokenizer instead of the character-level one).
    model.save_pretrained(folder)
    return str(folder)


def training_set(args: argparse.Namespace, seed: int):
    """The warm-up's training set (`--train-size` problems; the small levels repeat some prompts)."""
    from dapo_trl.run.toy import make_math_dataset

    return make_math_dataset(args.train_size, seed=seed, level_weights=args.level_weights, work_prob=args.work_prob)


def rl_training_set(args: argparse.Namespace, seed: int):
    """
    The RL phase's prompts: the warm-up's training set, or with `--rl-train-size N` its first `N` distinct prompts (in
    the set's order, so the level mix stays the warm-up's, less the repeats), so that prompts recur within the budget.
    """
    train_set = training_set(args, seed)
    if args.rl_train_size is None:
        return train_set
    first: dict[str, int] = {}
    for i, prompt in enumerate(train_set["prompt"]):
        first.setdefault(prompt, i)
        if len(first) == args.rl_train_size:
            break
    if len(first) < args.rl_train_size:
        raise SystemExit(
            f"--rl-train-size {args.rl_train_size}: the training set of --train-size {args.train_size} holds only "
            f"{len(first)} distinct prompts."
        )
    return train_set.select(sorted(first.values()))


def held_out_set(args: argparse.Namespace):
    from dapo_trl.run.toy import make_math_dataset

    # One held-out set for every seed and variant.
    return make_math_dataset(args.test_size, seed=0, split="test", level_weights=args.level_weights)


# ---------------------------------------------------------------------------------------------------------------------
# One RL run
# ---------------------------------------------------------------------------------------------------------------------


def rl_config(args: argparse.Namespace, variant: Variant, seed: int, output_dir: str):
    from dapo_trl import DAPOConfig

    shared = {
        "output_dir": output_dir,
        "use_cpu": True,
        "bf16": False,
        "activation_checkpointing": False,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "logging_steps": 1,
        "seed": seed,
        "max_steps": 100_000,  # the generation budget stops training (see BudgetAndEval)
        "learning_rate": args.lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "num_generations": args.num_generations,
        "per_device_train_batch_size": args.prompts_per_step * args.num_generations,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": args.updates_per_rollout,
        "num_iterations": 1,
        "max_completion_length": args.max_completion_length,
        "overlong_buffer_len": args.overlong_buffer_len,
        "temperature": 1.0,
        "top_p": 1.0,
        "beta": 0.0,
        "dynamic_sampling_max_rounds": args.max_rounds,
        "log_completions": False,
    }
    return DAPOConfig(**shared, **variant.overrides)


def run_variant(args: argparse.Namespace, variant: Variant, seed: int, warmup_dir: str) -> dict:
    """Load the seed's warmed-up weights, train `variant` until the generation budget is spent, return its record."""
    import tempfile

    from transformers import AutoModelForCausalLM, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import logging as hf_logging

    from dapo_trl import DAPOTrainer, MathVerifierReward
    from dapo_trl.run.toy import accuracy_report, build_char_tokenizer

    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("dapo_trl").setLevel(logging.ERROR)
    tokenizer = build_char_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(warmup_dir)
    train_set = rl_training_set(args, seed)
    test_set = held_out_set(args)
    budget_groups = args.budget_groups

    def evaluate() -> dict:
        state = torch.get_rng_state()  # the held-out sampling must not move the training's random stream
        try:
            report = accuracy_report(
                trainer.model,
                tokenizer,
                test_set,
                num_samples=args.eval_samples,
                max_new_tokens=args.max_completion_length,
                seed=1234,
            )
        finally:
            torch.set_rng_state(state)
            trainer.model.train()
        return report

    class CountingTrainer(DAPOTrainer):
        """Counts every training completion generated (all dynamic-sampling rounds included)."""

        generated_completions = 0
        generated_tokens = 0

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            if self.model.training:
                self.generated_completions += len(completion_ids_list)
                self.generated_tokens += sum(len(ids) for ids in completion_ids_list)
            return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    curve: list[dict] = []

    class BudgetAndEval(TrainerCallback):
        """Held-out accuracy every `eval_steps` optimizer steps; stop at the first generation-cycle boundary past the
        budget (a cycle's rollouts are all trained on before stopping)."""

        def on_train_begin(self, train_args, state, control, **kwargs):
            curve.append({"step": 0, "groups": 0, "tokens": 0, **evaluate()})

        def on_step_end(self, train_args, state, control, **kwargs):
            groups = trainer.generated_completions / args.num_generations
            done = state.global_step % train_args.steps_per_generation == 0 and groups >= budget_groups
            if state.global_step % args.eval_steps == 0 or done:
                report = evaluate()
                curve.append(
                    {"step": state.global_step, "groups": groups, "tokens": trainer.generated_tokens, **report}
                )
                logger.info(
                    f"{variant.name} seed {seed}: step {state.global_step} groups {groups:.0f} "
                    f"accuracy {report['accuracy']:.3f}"
                )
            if done:
                control.should_training_stop = True

    with tempfile.TemporaryDirectory() as output_dir:
        trainer = CountingTrainer(
            model=model,
            reward_funcs=MathVerifierReward(answer_column="answer", num_workers=1),
            args=rl_config(args, variant, seed, output_dir),
            train_dataset=train_set,
            processing_class=tokenizer,
            callbacks=[BudgetAndEval()],
        )
        trainer.remove_callback(PrinterCallback)
        started = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - started
    history = [
        {k: v for k, v in entry.items() if k in LOGGED or k == "step"}
        for entry in trainer.state.log_history
        if "entropy" in entry
    ]
    return {
        "variant": variant.name,
        "seed": seed,
        "steps": trainer.state.global_step,
        "groups": trainer.generated_completions / args.num_generations,
        "tokens": trainer.generated_tokens,
        "seconds": seconds,
        "curve": curve,
        "history": history,
        # Whole-run counts of the skip policy (the logged metrics are per generation batch and ratios).
        "skip": trainer._skip_policy.run_totals() if trainer._skip_policy is not None else None,
    }


LOGGED = (
    "entropy",
    "accuracy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "completions/mean_length",
    "completions/clipped_ratio",
    "dynamic_sampling/informative_frac",
    "dynamic_sampling/all_correct_frac",
    "dynamic_sampling/all_wrong_frac",
    "dynamic_sampling/rounds",
    "dynamic_sampling/prompts_skipped",
    "dynamic_sampling/drawn_informative_rate",
    "dynamic_sampling/skip_miss_rate",
)


def _run_job(job: tuple) -> dict:
    args, variant, seed, warmup_dir = job
    return run_variant(args, variant, seed, warmup_dir)


# ---------------------------------------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------------------------------------


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    values = list(values)
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def first_reaching(curve: Sequence[dict], gain: float) -> dict | None:
    """The first checkpoint whose accuracy is at least `gain` above the run's own warm-up accuracy (`curve[0]`)."""
    start = curve[0]["accuracy"]
    return next((point for point in curve[1:] if point["accuracy"] - start >= gain - 1e-9), None)


def window_mean(history: Sequence[dict], key: str, start: float, stop: float) -> float:
    """Mean of `key` over the logged steps in the `[start, stop)` fraction of the run."""
    values = [h[key] for h in history if key in h and h[key] is not None and not math.isnan(h[key])]
    if not values:
        return math.nan
    lo, hi = int(start * len(values)), max(int(stop * len(values)), int(start * len(values)) + 1)
    return statistics.fmean(values[lo:hi])


def choose_target(runs: dict[str, list[dict]]) -> float:
    """
    The target, as a gain over each seed's own warm-up accuracy (the seeds start from different warm-ups): half the
    weakest variant's mean final gain, rounded down to 0.005. Every variant reaches it on average, on the part of the
    curve where they can still differ.
    """
    gains = [
        statistics.fmean(r["curve"][-1]["accuracy"] - r["curve"][0]["accuracy"] for r in rs) for rs in runs.values()
    ]
    return max(0.005, math.floor(200 * 0.5 * min(gains) + 1e-9) / 200)


def to_target(rs: Sequence[dict], target: float) -> dict[str, float]:
    """Mean steps and tokens at the first checkpoint `target` above warm-up, over the seeds that reach it."""
    hit = [p for p in (first_reaching(r["curve"], target) for r in rs) if p is not None]
    steps, steps_std = mean_std([p["step"] for p in hit])
    tokens, tokens_std = mean_std([p["tokens"] for p in hit])
    return {"reached": len(hit), "steps": steps, "steps_std": steps_std, "tokens": tokens, "tokens_std": tokens_std}


def summarize(runs: dict[str, list[dict]], target: float) -> dict[str, dict[str, float]]:
    """One row of numbers per variant (means over seeds, spreads as standard deviations over seeds)."""
    rows = {}
    baseline = {r["seed"]: r["curve"][-1]["accuracy"] for r in runs.get(NAIVE, [])}
    for name, rs in runs.items():
        final_mean, final_std = mean_std([r["curve"][-1]["accuracy"] for r in rs])
        paired = [r["curve"][-1]["accuracy"] - baseline[r["seed"]] for r in rs if r["seed"] in baseline]
        vs_naive, vs_naive_std = mean_std(paired)
        rows[name] = {
            "seeds": len(rs),
            "steps": mean_std([r["steps"] for r in rs])[0],
            "groups": mean_std([r["groups"] for r in rs])[0],
            "tokens": mean_std([r["tokens"] for r in rs])[0],
            "final": final_mean,
            "final_std": final_std,
            "vs_naive": vs_naive,
            "vs_naive_std": vs_naive_std,
            "entropy_first": mean_std([window_mean(r["history"], "entropy", 0.0, 0.1) for r in rs])[0],
            "entropy_last": mean_std([window_mean(r["history"], "entropy", 0.9, 1.0) for r in rs])[0],
            "clip_high": mean_std([window_mean(r["history"], "clip_ratio/high_mean", 0, 1) for r in rs])[0],
            "clip_low": mean_std([window_mean(r["history"], "clip_ratio/low_mean", 0, 1) for r in rs])[0],
            "truncated": mean_std([window_mean(r["history"], "completions/clipped_ratio", 0, 1) for r in rs])[0],
            "seconds": mean_std([r["seconds"] for r in rs])[0],
            **{f"to_target_{k}": v for k, v in to_target(rs, target).items()},
        }
    return rows


def ratio_line(runs: dict[str, list[dict]], rows: dict[str, dict], name: str, base: str, target: float) -> str | None:
    """`name`'s steps and tokens to the target over `base`'s (ratio of the means, and per seed), if both reach it."""
    row, ref = rows.get(name), rows.get(base)
    if not (row and ref and row["to_target_reached"] and ref["to_target_reached"]):
        return None
    if ref["to_target_steps"] <= 0 or ref["to_target_tokens"] <= 0:
        return None
    base_hits = {r["seed"]: first_reaching(r["curve"], target) for r in runs[base]}
    per_seed = []
    for r in runs[name]:
        hit, base_hit = first_reaching(r["curve"], target), base_hits.get(r["seed"])
        if hit is not None and base_hit is not None and base_hit["tokens"] > 0:
            per_seed.append(f"{hit['tokens'] / base_hit['tokens']:.2f}x")
    return (
        f"{name} / {base} to the target: {row['to_target_steps'] / ref['to_target_steps']:.2f}x the optimizer steps, "
        f"{row['to_target_tokens'] / ref['to_target_tokens']:.2f}x the generated tokens (per seed: "
        f"{', '.join(per_seed) or 'none reached by both'})."
    )


def paired_final_line(runs: dict[str, list[dict]], name: str, base: str) -> str | None:
    """
    `name`'s final held-out accuracy minus `base`'s on the same seed (same warm-up, same budget of generated groups):
    the mean, its standard error over seeds, each seed's difference, and both rows' mean generated tokens.
    """
    base_runs = {r["seed"]: r for r in runs.get(base, [])}
    pairs = [(r, base_runs[r["seed"]]) for r in runs.get(name, []) if r["seed"] in base_runs]
    if not pairs:
        return None
    diffs = [r["curve"][-1]["accuracy"] - b["curve"][-1]["accuracy"] for r, b in pairs]
    mean, std = mean_std(diffs)
    se = std / math.sqrt(len(diffs))
    tokens = [statistics.fmean(x["tokens"] for x in side) / 1e3 for side in zip(*pairs, strict=True)]
    return (
        f"Final held-out accuracy, {name} - {base} (same seed): {mean:+.3f} +- {se:.3f} (standard error over "
        f"{len(diffs)} seeds; per seed {', '.join(f'{d:+.3f}' for d in diffs)}), at {tokens[0]:.0f}k and "
        f"{tokens[1]:.0f}k generated tokens."
    )


def skip_line(runs: dict[str, list[dict]], name: str = SKIPPING) -> str | None:
    """
    What the skip policy of row `name` did over each whole run, seed by seed (the seeds differ most in how informative
    their groups are, which decides how much is skipped), against full DAPO's informative share of the same seed.
    """
    rs = [r for r in runs.get(name, []) if r.get("skip")]
    if not rs:
        return None
    full = {
        r["seed"]: window_mean(r["history"], "dynamic_sampling/informative_frac", 0, 1)
        for r in runs.get(FULL_DAPO, [])
    }

    skipped = [
        f"{100 * r['skip']['skipped'] / max(r['skip']['skipped'] + r['skip']['generated'], 1):.1f}%" for r in rs
    ]
    informative = [f"{100 * r['skip']['informative'] / max(r['skip']['generated'], 1):.0f}%" for r in rs]
    without = [f"{100 * full[r['seed']]:.0f}%" if r["seed"] in full else "-" for r in rs]
    missed = [
        f"{100 * r['skip']['missed'] / r['skip']['redrawn']:.0f}% of {r['skip']['redrawn']}"
        if r["skip"]["redrawn"]
        else "-"
        for r in rs
    ]
    return (
        f"{name.removeprefix('full DAPO + ').capitalize()}, per seed ({', '.join(str(r['seed']) for r in rs)}): "
        f"prompts skipped, of those the stream reached, {' / '.join(skipped)}; generated groups informative "
        f"{' / '.join(informative)} (full DAPO: "
        f"{' / '.join(without)}); skipped prompts generated later that were informative (the predictor's miss rate) "
        f"{' / '.join(missed)}."
    )


def rl_prompts(args: argparse.Namespace) -> str:
    """The header's note on the RL prompts when `--rl-train-size` narrows them (empty otherwise)."""
    size = getattr(args, "rl_train_size", None)  # absent from results saved before the option existed
    if size is None:
        return ""
    return (
        f" RL prompts: the first {size} distinct training prompts (--rl-train-size; the warm-up used all "
        f"{args.train_size}), so the budget covers ~{args.budget_groups / size:.1f} passes over them."
    )


def format_table(runs: dict[str, list[dict]], target: float, args: argparse.Namespace) -> str:
    rows = summarize(runs, target)
    seeds = max(row["seeds"] for row in rows.values())
    starts = [r["curve"][0]["accuracy"] for r in next(iter(runs.values()))]
    lines = [
        f"Budget per run: {args.budget_groups} prompt groups x {args.num_generations} completions generated (training "
        f"stops at the first generation-cycle boundary past it). {seeds} seeds; +- is the standard deviation over "
        f"seeds. Held-out sampled accuracy after the warm-up, per seed: {', '.join(f'{a:.3f}' for a in starts)}. "
        f"Target: warm-up accuracy + {target:.3f} (each seed from its own warm-up).{rl_prompts(args)}",
        "",
        "| variant | optimizer steps | generated groups / tokens | steps to target | tokens to target "
        "| final held-out accuracy | final - naive GRPO (same seed) | entropy (first -> last 10% of steps) "
        "| clipped high / low | truncated rollouts |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        partial = (
            "" if row["to_target_reached"] == row["seeds"] else f" ({row['to_target_reached']}/{row['seeds']} seeds)"
        )
        if row["to_target_reached"]:
            to_steps = f"{row['to_target_steps']:.0f} +- {row['to_target_steps_std']:.0f}{partial}"
            to_tokens = f"{row['to_target_tokens'] / 1e3:.0f}k +- {row['to_target_tokens_std'] / 1e3:.0f}k{partial}"
        else:
            to_steps = to_tokens = "not reached"
        # "-" where no seed of this variant has a naive-GRPO run to pair with (naive GRPO not among --variants)
        vs_naive = "-" if math.isnan(row["vs_naive"]) else f"{row['vs_naive']:+.3f} +- {row['vs_naive_std']:.3f}"
        lines.append(
            f"| {name} | {row['steps']:.0f} | {row['groups']:.0f} / {row['tokens'] / 1e3:.0f}k | {to_steps} "
            f"| {to_tokens} | {row['final']:.3f} +- {row['final_std']:.3f} | {vs_naive} "
            f"| {row['entropy_first']:.3f} -> {row['entropy_last']:.3f} "
            f"| {100 * row['clip_high']:.2f}% / {100 * row['clip_low']:.2f}% | {100 * row['truncated']:.2f}% |"
        )
    notes = [
        ratio_line(runs, rows, FULL_DAPO, NAIVE, target),
        ratio_line(runs, rows, SKIPPING, NAIVE, target),
        ratio_line(runs, rows, SKIPPING, FULL_DAPO, target),
        ratio_line(runs, rows, POSTERIOR, FULL_DAPO, target),
        ratio_line(runs, rows, POSTERIOR, SKIPPING, target),
        paired_final_line(runs, SKIPPING, FULL_DAPO),
        paired_final_line(runs, POSTERIOR, FULL_DAPO),
        paired_final_line(runs, POSTERIOR, SKIPPING),
        skip_line(runs),
        skip_line(runs, POSTERIOR),
    ]
    notes = [note for note in notes if note]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


def plot(runs: dict[str, list[dict]], target: float, path: Path) -> Path:
    """Held-out accuracy vs generated tokens and vs optimizer steps, and entropy vs step; one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tok_ax, step_ax, ent_ax) = plt.subplots(1, 3, figsize=(19, 5.5))
    start = statistics.fmean(r["curve"][0]["accuracy"] for r in next(iter(runs.values())))
    for name, rs in runs.items():
        # Checkpoints sit at the same steps in every seed (and at nearly the same token counts): average by position.
        # A run's last checkpoint (end of budget) is kept even where the seeds' checkpoint counts differ.
        n = min(len(r["curve"]) for r in rs) - 1
        points = [[r["curve"][i] for r in rs] for i in range(n)] + [[r["curve"][-1] for r in rs]]
        tokens = [statistics.fmean(p["tokens"] for p in column) / 1e3 for column in points]
        steps = [statistics.fmean(p["step"] for p in column) for column in points]
        accuracy = [statistics.fmean(p["accuracy"] for p in column) for column in points]
        style = {
            "linestyle": "-" if name in (NAIVE, FULL_DAPO, SKIPPING, POSTERIOR) else ":",
            "linewidth": 2 if name in (NAIVE, FULL_DAPO, SKIPPING, POSTERIOR) else 1.2,
        }
        tok_ax.plot(tokens, accuracy, marker=".", label=name, **style)
        step_ax.plot(steps, accuracy, marker=".", label=name, **style)
        m = min(len(r["history"]) for r in rs)
        entropy = [statistics.fmean(r["history"][i]["entropy"] for r in rs) for i in range(m)]
        ent_ax.plot([rs[0]["history"][i]["step"] for i in range(m)], _smooth(entropy, 9), label=name, **style)
    for ax in (tok_ax, step_ax):
        ax.axhline(start + target, color="grey", linestyle="--", linewidth=1, label=f"warm-up + {target:.3f}")
        ax.set_ylabel("held-out sampled accuracy (T=1)")
    tok_ax.set_xlabel("generated completion tokens (thousands)")
    tok_ax.set_title("held-out accuracy vs generated tokens")
    step_ax.set_xlabel("optimizer step")
    step_ax.set_title("held-out accuracy vs optimizer steps")
    ent_ax.set_xlabel("optimizer step")
    ent_ax.set_ylabel("mean token entropy of the rollouts")
    ent_ax.set_title("entropy vs step (moving average of 9 steps)")
    tok_ax.legend(fontsize=8)
    fig.suptitle(f"DAPO ablation on the toy task, mean over {min(len(rs) for rs in runs.values())} seeds")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _smooth(values: Sequence[float], width: int) -> list[float]:
    half = width // 2
    return [statistics.fmean(values[max(0, i - half) : i + half + 1]) for i in range(len(values))]


# ---------------------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke: 1 seed, 3 variants, a few steps.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Seeds of each variant.")
    parser.add_argument("--variants", nargs="+", help="Run only these variants (by name).")
    parser.add_argument("--jobs", type=int, default=2, help="Runs in parallel (one thread each).")
    parser.add_argument("--out-dir", default=str(RESULTS_DIR), help="Folder of the results (JSON, table, PNG).")
    parser.add_argument(
        "--stem", help="File name of the results, without extension (default: ablation; --quick: ablation_quick)."
    )
    parser.add_argument("--cache-dir", default="outputs/ablation", help="Where warmed-up weights are kept.")
    parser.add_argument("--from-json", help="Re-render the table and PNG from a saved ablation.json (no training).")
    parser.add_argument(
        "--target", type=float, help="Target gain of held-out accuracy over the warm-up (default: choose_target)."
    )
    # task
    parser.add_argument("--train-size", type=int, default=20_000, help="Synthetic training problems.")
    parser.add_argument("--test-size", type=int, default=256, help="Held-out problems drawn.")
    parser.add_argument(
        "--level-weights",
        type=float,
        nargs=5,
        default=[0.2, 0.4, 0.4, 0.0, 0.0],
        help="Share of each difficulty level of the task.",
    )
    parser.add_argument("--work-prob", type=float, default=0.5, help="Share of warm-up targets that show work.")
    parser.add_argument("--sft-steps", type=int, default=1200, help="Supervised warm-up steps.")
    parser.add_argument("--sft-batch-size", type=int, default=32, help="Warm-up batch size.")
    parser.add_argument("--sft-lr", type=float, default=3e-3, help="Warm-up learning rate.")
    # RL
    parser.add_argument("--budget-groups", type=int, default=1600, help="Prompt groups generated per run.")
    parser.add_argument(
        "--rl-train-size",
        type=int,
        help="RL on only the first N distinct training prompts (the warm-up keeps --train-size), so that prompts "
        "recur within the budget. Default: the whole training set.",
    )
    parser.add_argument("--eval-steps", type=int, default=12, help="Held-out accuracy every N optimizer steps.")
    parser.add_argument("--eval-samples", type=int, default=4, help="Samples per held-out problem.")
    parser.add_argument("--lr", type=float, default=1e-4, help="RL learning rate.")
    parser.add_argument("--num-generations", type=int, default=8, help="Group size G.")
    parser.add_argument("--prompts-per-step", type=int, default=8, help="Prompt groups per optimizer step.")
    parser.add_argument("--updates-per-rollout", type=int, default=4, help="steps_per_generation.")
    parser.add_argument("--max-completion-length", type=int, default=28, help="Completion cap in tokens.")
    parser.add_argument("--overlong-buffer-len", type=int, default=7, help="Soft overlong interval (Eq. 13).")
    parser.add_argument("--max-rounds", type=int, default=4, help="dynamic_sampling_max_rounds.")
    args = parser.parse_args(argv)
    args.level_weights = tuple(args.level_weights)
    if args.quick:
        args.seeds = args.seeds[:1]
        args.variants = args.variants or [NAIVE, FULL_DAPO, SKIPPING]
        args.sft_steps, args.train_size, args.test_size = 150, 500, 40
        args.prompts_per_step, args.updates_per_rollout, args.max_rounds = 2, 2, 2
        args.budget_groups, args.eval_steps, args.eval_samples = 16, 2, 2
        args.rl_train_size = 4  # dynamic sampling's rounds pass over it several times: the skip policy decides
    if args.rl_train_size is not None and not 1 <= args.rl_train_size <= args.train_size:
        parser.error(
            f"--rl-train-size must be between 1 and --train-size ({args.train_size}), got {args.rl_train_size}."
        )
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        kept = {"from_json": args.from_json, "target": args.target, "out_dir": args.out_dir}  # the rest: as run
        kept["stem"] = args.stem or saved["args"].get("stem")
        args = argparse.Namespace(**{**vars(args), **saved["args"], **kept})
        runs, total = saved["runs"], saved["total_seconds"]
    else:
        runs, total = run_all(args)
    target = args.target if args.target is not None else choose_target(runs)
    table = format_table(runs, target, args)
    runtime = (
        f"Total runtime: {total / 60:.1f} min wall-clock ({args.jobs} runs in parallel, one thread each, on 2 shared "
        "CPU cores), warm-ups included."
    )
    print(table)
    print(f"\n{runtime}")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = args.stem or ("ablation_quick" if args.quick else "ablation")
    (out / f"{stem}.md").write_text(f"{table}\n\n{runtime}\n")
    if not args.from_json:
        saved = {"args": vars(args), "total_seconds": total, "runs": runs}
        (out / f"{stem}.json").write_text(json.dumps(_rounded(saved), separators=(",", ":")))
    plot(runs, target, out / f"{stem}.png")
    return {"runs": runs, "target": target, "table": table, "summary": summarize(runs, target)}


def _rounded(value, digits: int = 5):
    """`value` with every float rounded (keeps the saved JSON small)."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v, digits) for v in value]
    return value


def run_all(args: argparse.Namespace) -> tuple[dict[str, list[dict]], float]:
    """Warm up every seed once, then train every (seed, variant) from it; `args.jobs` runs at a time."""
    started = time.perf_counter()
    chosen = [v for v in variants() if not args.variants or v.name in args.variants]
    if args.variants and len(chosen) != len(args.variants):
        raise SystemExit(f"Unknown variant in {args.variants}; choose from {[v.name for v in variants()]}.")
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=get_context("spawn")) as pool:
        warmups = dict(zip(args.seeds, pool.map(warm_up, [args] * len(args.seeds), args.seeds)))
        jobs = [(args, v, seed, warmups[seed]) for seed in args.seeds for v in chosen]
        results = list(pool.map(_run_job, jobs))
    runs = {v.name: [r for r in results if r["variant"] == v.name] for v in chosen}
    return runs, time.perf_counter() - started


if __name__ == "__main__":
    main()
