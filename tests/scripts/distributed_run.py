"""Run by tests/test_distributed.py under `accelerate launch --multi_gpu --num_processes 2` on CPU (gloo).

Trains a few DAPO steps where prompt groups span the two processes and the first round puts no informative group on
rank 0, then saves, per rank, the micro-batches, gradients and parameters of every optimizer step.

Modes `discard`, `carry` (with prompt skipping and its defaults: carry-over and a probe of 2) and `probe` (a probe of
3 completions of 4, without skipping).

Mode `skip`: the first batch holds informative groups, the next ones none; saves, per rank, the weights, optimizer
state and learning rate after every optimizer step.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from _tiny import (  # noqa: E402
    GradientCapture,
    Recorder,
    ScriptedReward,
    StateCapture,
    config,
    end_runner,
    tiny_model_and_tokenizer,
)
from datasets import Dataset  # noqa: E402

from dapo_trl.trainer.sampling import RoundPlanner  # noqa: E402

torch.set_num_threads(1)


def count_forwards(model) -> list:
    """Shapes of every model forward outside generation (ZeRO-3/FSDP all-gather parameters in each one)."""
    seen: list = []
    generating = [False]

    def hook(module, args, kwargs):
        if not generating[0]:
            seen.append(tuple((kwargs.get("input_ids") if "input_ids" in kwargs else args[0]).shape))

    model.register_forward_pre_hook(hook, with_kwargs=True)
    generate = model.generate

    def counted_generate(*args, **kwargs):
        generating[0] = True
        try:
            return generate(*args, **kwargs)
        finally:
            generating[0] = False

    model.generate = counted_generate
    return seen


def skip_run(out_dir: str) -> None:
    """Sequential stream, one round per batch: two mixed groups in the first batch, none after."""
    overrides = dict(
        per_device_train_batch_size=4,  # 8 rows per step over 2 processes = 2 groups of 4
        max_steps=3,
        shuffle_dataset=False,
        ddp_find_unused_parameters=False,
        dynamic_sampling_max_rounds=1,
        dynamic_sampling_round_sizing="deficit",
        weight_decay=0.1,
    )
    kinds = ["mixed", "mixed", "easy", "easy", "hard", "hard"] * 2
    dataset = Dataset.from_dict({"prompt": [f"q{i}?\n" for i in range(len(kinds))], "kind": kinds})
    model, tokenizer = tiny_model_and_tokenizer()
    trainer = Recorder(
        model=model,
        reward_funcs=[ScriptedReward()],
        args=config(out_dir, **overrides),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    capture = StateCapture(trainer)
    trainer.add_callback(capture)
    trainer.train()
    rank = trainer.accelerator.process_index
    history = trainer.state.log_history if rank == 0 else None
    state = {"steps": capture.steps, "history": history, "world": trainer.accelerator.num_processes}
    torch.save(state, os.path.join(out_dir, f"rank{rank}.pt"))


def main(out_dir: str, carry_over: str) -> None:
    if carry_over == "skip":
        return skip_run(out_dir)
    overrides = dict(
        per_device_train_batch_size=6,  # 12 rows per step over 2 processes = 3 groups of 4: group 1 spans the ranks
        num_generations=4,
        gradient_accumulation_steps=1,
        max_steps=3,
        shuffle_dataset=False,  # the stream is then sequential, so the test controls what each rank gets
        ddp_find_unused_parameters=False,
        dynamic_sampling_carry_over=carry_over == "carry",
        dynamic_sampling_skip=carry_over == "carry",  # the skip history must stay identical on both ranks
        # probe 3 of 4: the rest (1 row a group) splits evenly only for an even number of groups, so padding acts
        dynamic_sampling_probe=3 if carry_over == "probe" else None,
    )
    args = config(out_dir, **overrides)
    target = args.generation_batch_size // args.num_generations
    first_round = RoundPlanner(target, granularity=1).next_round_size(target)
    # First half of the first round all "easy": rank 0's rows of that round hold no informative group.
    kinds = ["easy"] * (first_round // 2 + 1) + ["mixed", "hard", "mixed", "easy"] * 20
    dataset = Dataset.from_dict({"prompt": [f"q{i}?\n" for i in range(len(kinds))], "kind": kinds})
    model, tokenizer = tiny_model_and_tokenizer()
    trainer = Recorder(
        model=model, reward_funcs=[ScriptedReward()], args=args, train_dataset=dataset, processing_class=tokenizer
    )
    capture = GradientCapture(trainer)
    trainer.add_callback(capture)
    forwards = count_forwards(model)
    trainer.train()
    rank = trainer.accelerator.process_index
    history = trainer.state.log_history if rank == 0 else None
    torch.save(
        {
            "steps": capture.steps,
            "kinds": kinds,
            "history": history,
            "world": trainer.accelerator.num_processes,
            "forwards": forwards,
            "skip": trainer._skip_policy.state_dict() if trainer._skip_policy is not None else None,
            "probe": trainer._probe_rule.state_dict() if trainer._probe_rule is not None else None,
        },
        os.path.join(out_dir, f"rank{rank}.pt"),
    )


def resume_run(out_dir: str) -> None:
    """
    Mode `resume`, dynamic sampling off: 8 prompts, 2 steps per epoch; a run of 6 steps, then a run resumed from its
    checkpoint-5 (inside epoch 2). Saves, per rank, the prompts each run trained at every step.
    """
    overrides = dict(dynamic_sampling=False, max_steps=6, save_strategy="steps", save_steps=1)
    overrides.update(ddp_find_unused_parameters=False)
    dataset = Dataset.from_dict({"prompt": [f"q{i}?\n" for i in range(8)], "kind": ["mixed"] * 8})
    prompts = {}
    for name, resume in (("full", None), ("resumed", os.path.join(out_dir, "full", "checkpoint-5"))):
        model, tokenizer = tiny_model_and_tokenizer()
        trainer = Recorder(
            model=model,
            reward_funcs=[ScriptedReward()],
            args=config(os.path.join(out_dir, name), **overrides),
            train_dataset=dataset,
            processing_class=tokenizer,
        )
        trainer.train(resume_from_checkpoint=resume)
        prompts[name] = [b["prompt_ids"] for b in trainer.recorded]
    rank = trainer.accelerator.process_index
    state = {**prompts, "world": trainer.accelerator.num_processes}
    torch.save(state, os.path.join(out_dir, f"rank{rank}.pt"))


if __name__ == "__main__":
    (resume_run(sys.argv[1]) if sys.argv[2] == "resume" else main(sys.argv[1], sys.argv[2]))
    end_runner(sys.argv[1], sys.argv[2])
