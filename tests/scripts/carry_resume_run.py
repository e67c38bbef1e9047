"""Run by tests/test_distributed.py under `accelerate launch --multi_gpu --num_processes 2` on CPU (gloo).

Mode `full`: three dynamic-sampling steps with carried groups, a checkpoint after each. Mode `resume`: the same run
resumed from checkpoint-1. Saves, per rank, every micro-batch that reached the loss and the carried-group count.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from _tiny import Recorder, ScriptedReward, config, end_runner, tiny_model_and_tokenizer  # noqa: E402
from datasets import Dataset  # noqa: E402

torch.set_num_threads(1)


def main(out_dir: str, mode: str) -> None:
    args = config(
        out_dir,
        per_device_train_batch_size=6,  # 12 rows per step over 2 processes = 3 groups of 4: one spans the ranks
        gradient_accumulation_steps=1,
        max_steps=3,
        shuffle_dataset=False,
        ddp_find_unused_parameters=False,
        dynamic_sampling_carry_over=True,
        save_strategy="steps",
        save_steps=1,
    )
    kinds = ["mixed", "mixed", "hard", "mixed", "mixed", "easy"] * 20  # rounds find more groups than a batch trains
    dataset = Dataset.from_dict({"prompt": [f"q{i}?\n" for i in range(len(kinds))], "kind": kinds})
    model, tokenizer = tiny_model_and_tokenizer()
    trainer = Recorder(
        model=model, reward_funcs=[ScriptedReward()], args=args, train_dataset=dataset, processing_class=tokenizer
    )
    checkpoint = os.path.join(out_dir, "checkpoint-1") if mode == "resume" else None
    trainer.train(resume_from_checkpoint=checkpoint)
    rank = trainer.accelerator.process_index
    state = {"batches": trainer.recorded, "world": trainer.accelerator.num_processes}
    torch.save(state, os.path.join(out_dir, f"{mode}_rank{rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    end_runner(sys.argv[1], sys.argv[2])
