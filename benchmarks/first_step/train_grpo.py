"""A user's own GRPO script, as TRL's quick start writes one: a model, a prompt dataset, a length reward.

`measure.sh` swaps its import for dapo-trl's and times it to the first optimizer step that moves the weights (with
DAPO's warm-up, step 1 has a learning rate of 0, so that is step 2; with GRPOTrainer's schedule, step 1).

    python train_grpo.py MODEL_FOLDER
"""

import sys
import time

from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_dict({"prompt": [f"Question {i}: say something.\n" for i in range(64)]})


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


class StopAtFirstTrainedStep(TrainerCallback):
    """Prints the time each step ends and stops after the first step whose learning rate is not 0."""

    def on_step_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        self.learning_rate = lr_scheduler.get_last_lr()[0]

    def on_step_end(self, args, state, control, **kwargs):
        print(f"step {state.global_step} ended at {time.time():.3f}, learning rate {self.learning_rate}", flush=True)
        if self.learning_rate > 0:
            print(f"FIRST_TRAINED_STEP {time.time():.3f}", flush=True)
            control.should_training_stop = True


args = GRPOConfig(
    output_dir="grpo-out", max_completion_length=32, logging_steps=1, use_cpu=True, bf16=False, report_to="none"
)
trainer = GRPOTrainer(
    model=sys.argv[1], reward_funcs=reward_len, args=args, train_dataset=dataset, callbacks=[StopAtFirstTrainedStep()]
)
trainer.train()
