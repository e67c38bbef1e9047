"""A DAPOTrainer subclass that changes behaviour through the extension points: a curriculum that retires solved prompts.

DAPO's dynamic sampling (§3.2) drops groups whose completions are all correct, but it still pays to generate them.
This trainer remembers which training prompts the policy keeps solving with all `G` completions and stops drawing
them:

- `on_groups_scored` counts, for every prompt index, how many times in a row its group came back all-correct;
- after `retire_after` such rounds in a row the prompt is *retired* and `skip_prompt` passes over it from then on
  (a floor, `min_active_prompts`, keeps enough prompts in play to fill a batch);
- `log_dynamic_sampling` adds `curriculum/retired_prompts` and `curriculum/active_prompts` to the trainer's metrics;
- `sampler_state_dict` / `load_sampler_state_dict` add the curriculum to the sampler state DAPOTrainer saves in every
  checkpoint (`dapo_sampler_state.pt`), so a resumed run retires exactly what the uninterrupted one would.

The script builds everything locally with `dapo_trl.run.toy` (a character tokenizer, a ~0.1M-parameter Qwen2, easy
addition problems), warms the model up with a few hundred supervised steps so that some groups are all-correct and
others mixed, then trains with the curriculum. It runs on CPU in well under a minute with its defaults.

Launch:
```
OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python examples/custom_trainer.py
OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python examples/custom_trainer.py --max-steps 30 --retire-after 3 --save-steps 10
```
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile

import torch

from dapo_trl import DAPOConfig, DAPOTrainer
from dapo_trl.run.toy import build_char_tokenizer, build_tiny_model, make_math_dataset, toy_reward, warmup_sft

logger = logging.getLogger(__name__)


class CurriculumDAPOTrainer(DAPOTrainer):
    """
    [`DAPOTrainer`] that stops sampling prompts solved by every completion of their group several times in a row.

    Args:
        retire_after (`int`, *optional*, defaults to `3`):
            All-correct groups in a row after which a prompt is retired (never drawn again by dynamic sampling).
        min_active_prompts (`int`, *optional*):
            Retiring stops when it would leave fewer prompts than this in play. Defaults to two generation batches'
            worth of groups.
        *args, **kwargs:
            Passed to [`DAPOTrainer`] unchanged.
    """

    def __init__(self, *args, retire_after: int = 3, min_active_prompts: int | None = None, **kwargs):
        if retire_after < 1:
            raise ValueError(f"retire_after must be at least 1, got {retire_after}.")
        super().__init__(*args, **kwargs)
        self.retire_after = retire_after
        groups_per_batch = self.args.generation_batch_size // self.num_generations
        self.min_active_prompts = 2 * groups_per_batch if min_active_prompts is None else min_active_prompts
        self.streaks: dict[int, int] = {}  # prompt index -> all-correct groups in a row
        self.retired: set[int] = set()

    # Extension points -------------------------------------------------------------------------------------------------

    def skip_prompt(self, index: int) -> bool:
        return index in self.retired

    def on_groups_scored(self, prompt_indices, values, informative, classification) -> None:
        super().on_groups_scored(prompt_indices, values, informative, classification)
        # Same arguments on every process, so every process retires the same prompts.
        num_prompts = len(self.train_dataset)
        for index, solved in zip(prompt_indices, classification.all_correct.tolist(), strict=True):
            if index in self.retired:  # drawn twice in one round, across an epoch boundary, and retired by the first
                continue
            self.streaks[index] = self.streaks.get(index, 0) + 1 if solved else 0
            if self.streaks[index] >= self.retire_after and num_prompts - len(self.retired) > self.min_active_prompts:
                self.retired.add(index)
                logger.debug(f"Curriculum: prompt {index} retired after {self.streaks[index]} all-correct groups.")

    def log_dynamic_sampling(self, stats: dict[str, float]) -> None:
        super().log_dynamic_sampling(stats)
        self.log_metric("curriculum/retired_prompts", len(self.retired))
        self.log_metric("curriculum/active_prompts", len(self.train_dataset) - len(self.retired))

    # Checkpoints: the curriculum rides along in the trainer's own sampler state ----------------------------------------

    def sampler_state_dict(self) -> dict:
        curriculum = {"streaks": sorted(self.streaks.items()), "retired": sorted(self.retired)}
        return {**super().sampler_state_dict(), "curriculum": curriculum}

    def load_sampler_state_dict(self, state: dict) -> None:
        super().load_sampler_state_dict(state)
        self.streaks = {int(index): int(streak) for index, streak in state["curriculum"]["streaks"]}
        self.retired = {int(index) for index in state["curriculum"]["retired"]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from dapo_trl.run.cli import positive_int

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", default=None, help="Where checkpoints go (default: a temporary folder).")
    parser.add_argument("--max-steps", type=positive_int, default=12, help="Optimizer steps of DAPO training.")
    parser.add_argument("--sft-steps", type=int, default=300, help="Supervised warm-up steps before DAPO.")
    parser.add_argument("--num-prompts", type=positive_int, default=32, help="Training prompts.")
    parser.add_argument("--num-generations", type=positive_int, default=8, help="Group size G.")
    parser.add_argument(
        "--groups-per-step", type=positive_int, default=4, help="Informative groups per optimizer step."
    )
    parser.add_argument(
        "--retire-after", type=positive_int, default=2, help="All-correct groups in a row to retire a prompt."
    )
    parser.add_argument("--save-steps", type=int, default=0, help="Checkpoint every N steps (0: no checkpoints).")
    parser.add_argument(
        "--resume-from-checkpoint", default=None, help="A checkpoint folder of an earlier run to continue."
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed of the model, the data and sampling.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> CurriculumDAPOTrainer:
    """Warm up a tiny model on easy addition, then train it with the curriculum. Returns the trained trainer."""
    options = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    output_dir = options.output_dir or tempfile.mkdtemp(prefix="dapo-curriculum-")

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=64, seed=options.seed)
    # One- and two-digit additions: after the warm-up some are always solved (retired) and some are not yet.
    dataset = make_math_dataset(
        options.num_prompts, seed=options.seed, level_weights=(0.6, 0.4, 0, 0, 0), ops="+", work_prob=0.0
    )
    if options.sft_steps:
        warmup_sft(model, tokenizer, dataset, steps=options.sft_steps, batch_size=32, warmup_steps=20, progress=False)

    args = DAPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        report_to="none",
        learning_rate=3e-4,
        warmup_steps=0,
        max_steps=options.max_steps,
        num_generations=options.num_generations,
        per_device_train_batch_size=options.num_generations * options.groups_per_step,
        max_completion_length=16,
        logging_steps=1,
        save_strategy="steps" if options.save_steps else "no",
        save_steps=options.save_steps or 500,
        seed=options.seed,
        disable_tqdm=True,
    )
    trainer = CurriculumDAPOTrainer(
        model=model,
        reward_funcs=toy_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        retire_after=options.retire_after,
    )
    trainer.train(resume_from_checkpoint=options.resume_from_checkpoint)
    history = trainer.state.log_history
    retired = [int(h["curriculum/retired_prompts"]) for h in history if "curriculum/retired_prompts" in h]
    informative = [h["dynamic_sampling/informative_frac"] for h in history if "dynamic_sampling/informative_frac" in h]
    third = max(1, len(informative) // 3)
    print(
        f"Retired {len(trainer.retired)} of {len(dataset)} prompts (after each step: {retired}). Informative share of "
        f"the generated groups: {sum(informative[:third]) / third:.2f} in the first {third} steps, "
        f"{sum(informative[-third:]) / third:.2f} in the last {third}."
    )
    return trainer


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
