"""Run by tests/test_state_space.py: short dynamic-sampling trainings over drawn points of the sampler's state space.

    python state_space_run.py OUT_DIR DRAWS_JSON                         # one process
    accelerate launch --multi_gpu --num_processes 2 ... state_space_run.py OUT_DIR DRAWS_JSON   # two (gloo)
    ... state_space_run.py OUT_DIR DRAWS_JSON --resume-from DIR          # each draw resumed from DIR/NAME/checkpoint-K

Each draw (a dict, see `tests/test_state_space.py::draw`) fixes the global batch, so one and two processes train the
same generation batches. Per draw and rank it saves `NAME.rank{r}.pt`: the world size and, per optimizer step, the rows
of every micro-batch and the prompts of the rows that carry weight. A collective that processes run differently
raises (gloo: "Received data size doesn't match") or times out (`ddp_timeout`), and the launch fails naming the draw.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from _tiny import Recorder, config, end_runner, tiny_model_and_tokenizer  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

torch.set_num_threads(1)

KIND_PATTERNS = {
    "easy": ["easy"],
    "hard": ["hard"],
    "mixed": ["mixed"],
    "alternating": ["mixed", "hard", "easy"],
    "mostly_constant": ["easy", "hard", "hard", "mixed", "easy", "hard"],
    "mostly_mixed": ["mixed", "mixed", "hard", "mixed", "mixed", "easy"],
    # Round positions alternate between 2 processes chunk by chunk: a fixed round of these 6 trains the groups at
    # positions 0 and 1 and carries those at 3 and 5, both held by process 1.
    "surplus_on_one_process": ["mixed", "mixed", "hard", "mixed", "easy", "mixed"],
}


class OccurrenceReward:
    """
    A reward whose informativeness does not depend on how rows are split over processes: `easy` prompts score high,
    `hard` ones low, and the rows of a `mixed` prompt alternate by their local occurrence count shifted by the rank,
    so every group of a mixed prompt holds both values on one process or two. `mode`: `binary` (+1/-1, a verifier's
    `correct_reward`), `continuous` (values in (0.1, 1), no correct value) or `none` (every reward `None`).
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.__name__ = f"occurrence_{mode}"
        if mode == "binary":
            self.correct_reward = 1.0

    def __call__(self, completions, prompts, kind, **kwargs):
        if self.mode == "none":
            return [None] * len(completions)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        high, low = (1.0, -1.0) if self.mode == "binary" else (0.9, 0.2)
        seen: dict[str, int] = {}
        out = []
        for prompt, k in zip(prompts, kind, strict=True):
            count = seen.get(prompt, 0)
            seen[prompt] = count + 1
            if k == "easy":
                out.append(high if self.mode == "binary" else 0.8)
            elif k == "hard":
                out.append(low if self.mode == "binary" else 0.15)
            else:
                out.append(high if (count + rank) % 2 == 0 else low)
        return out


class DrawTrainer(Recorder):
    """Records micro-batches; from step `run_out_at` on, passes over every prompt (no prompt can be drawn)."""

    run_out_at: int | None = None

    def skip_prompt(self, index: int) -> bool:
        return self.run_out_at is not None and self.state.global_step >= self.run_out_at


class PerStep(TrainerCallback):
    """After each optimizer step: the rows of each micro-batch and the prompts of the rows that carry weight."""

    def __init__(self, trainer: DrawTrainer, tokenizer) -> None:
        self.trainer, self.tokenizer, self.seen, self.steps = trainer, tokenizer, 0, []

    def on_step_end(self, args, state, control, **kwargs):
        batches = self.trainer.recorded[self.seen :]
        self.seen = len(self.trainer.recorded)
        prompts = []
        for batch in batches:
            real = batch["completion_mask"].sum(dim=1) > 0
            prompts += self.tokenizer.batch_decode(batch["prompt_ids"][real], skip_special_tokens=True)
        self.steps.append(
            {
                "step": state.global_step,
                "rows": [int(b["completion_ids"].size(0)) for b in batches],
                "prompts": sorted(p.strip() for p in prompts),
            }
        )


def build(draw: dict, out_dir: str, world: int) -> tuple[DrawTrainer, PerStep]:
    rows = draw["rows_per_step"]
    if rows % world:
        raise ValueError(f"draw {draw['name']}: {rows} rows per step cannot be split over {world} processes")
    pattern = KIND_PATTERNS[draw["kinds"]]
    kinds = [pattern[i % len(pattern)] for i in range(draw["num_prompts"])]
    dataset = Dataset.from_dict({"prompt": [f"q{i}?\n" for i in range(len(kinds))], "kind": kinds})
    args = config(
        os.path.join(out_dir, draw["name"]),
        per_device_train_batch_size=rows // world,
        num_generations=draw["num_generations"],
        gradient_accumulation_steps=draw["gradient_accumulation_steps"],
        steps_per_generation=draw["steps_per_generation"],
        num_iterations=draw["num_iterations"],
        max_steps=draw["max_steps"],
        max_completion_length=4,
        seed=draw["seed"],
        ddp_find_unused_parameters=False,
        ddp_timeout=120,
        dynamic_sampling_carry_over=draw["carry_over"],  # None: the default (on with skipping)
        dynamic_sampling_carry_max_staleness=draw.get("carry_max_staleness"),
        dynamic_sampling_probe=draw.get("probe"),  # None: the default (G // 4, at least 2, with skipping)
        dynamic_sampling_round_sizing=draw["round_sizing"],
        dynamic_sampling_max_rounds=draw["max_rounds"],
        dynamic_sampling_skip=draw["skip_rule"] is not None,
        dynamic_sampling_skip_rule=draw["skip_rule"] or "streak",
        dynamic_sampling_on_exhausted="train",
        save_strategy="steps" if draw.get("save") else "no",
        save_steps=1,
        diagnostics=False,
        shuffle_dataset=draw.get("shuffle", True),
    )
    model, tokenizer = tiny_model_and_tokenizer(seed=draw["seed"])
    trainer = DrawTrainer(
        model=model,
        reward_funcs=[OccurrenceReward(draw["reward"])],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.run_out_at = draw.get("run_out_at")
    per_step = PerStep(trainer, tokenizer)
    trainer.add_callback(per_step)
    return trainer, per_step


def main(out_dir: str, draws_path: str, resume_from: str | None) -> None:
    with open(draws_path) as file:
        draws = json.load(file)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for draw in draws:
        print(f"state-space draw {draw['name']} on {world} process(es): {json.dumps(draw)}", flush=True)
        trainer, per_step = build(draw, out_dir, world)
        checkpoint = None
        if resume_from is not None:
            checkpoint = os.path.join(resume_from, draw["name"], f"checkpoint-{draw['resume_at']}")
        trainer.train(resume_from_checkpoint=checkpoint)
        rank = trainer.accelerator.process_index
        rounds = [h["dynamic_sampling/rounds"] for h in trainer.state.log_history if "dynamic_sampling/rounds" in h]
        result = {"world": trainer.accelerator.num_processes, "steps": per_step.steps, "rounds": rounds}
        torch.save(result, os.path.join(out_dir, f"{draw['name']}.rank{rank}.pt"))
        trainer.accelerator.wait_for_everyone()
        del trainer


if __name__ == "__main__":
    resume = sys.argv[sys.argv.index("--resume-from") + 1] if "--resume-from" in sys.argv else None
    main(sys.argv[1], sys.argv[2], resume)
    end_runner(sys.argv[1], "state_space")  # without a release: SIGABRT at exit twice in about 20 launches of 44 draws
