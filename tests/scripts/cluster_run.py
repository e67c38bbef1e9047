"""Run by tests/test_cluster.py on each "node": examples/train_math.py, unchanged, with a DAPOTrainer that records.

Per process it records every dynamic-sampling round (prompts drawn, informative verdicts), the shape of every
micro-batch that reached the loss, the log history and where training stopped, in `$CLUSTER_RECORD_DIR/rank<r>.json`
(written at exit, also when a preemption ends the process), and the last finished step in `progress-rank<r>`.
"""

import atexit
import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
from transformers import TrainerCallback

from dapo_trl import DAPOTrainer
from dapo_trl.trainer.preemption import PreemptionCallback

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from _tiny import live_gloo_threads  # noqa: E402

RECORD_DIR = Path(os.environ["CLUSTER_RECORD_DIR"])
RANK = int(os.environ.get("RANK", "0"))
record: dict = {"rank": RANK, "rounds": [], "batches": []}


class Progress(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        path = RECORD_DIR / f"progress-rank{RANK}"
        path.with_suffix(".tmp").write_text(str(state.global_step))
        os.replace(path.with_suffix(".tmp"), path)


class RecordingTrainer(DAPOTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_callback(Progress())

    def train(self, *args, **kwargs):
        # Recorded here, also when a preemption stop raises SystemExit; no reference to the trainer is kept, so the
        # main job's own release can free its process group before exit.
        try:
            return super().train(*args, **kwargs)
        finally:
            callback = next((c for c in self.callback_handler.callbacks if isinstance(c, PreemptionCallback)), None)
            record.update(
                world_size=self.accelerator.num_processes,
                process_index=self.accelerator.process_index,
                local_process_index=self.accelerator.local_process_index,
                global_step=self.state.global_step,
                stopped_at_step=callback.stopped_at_step if callback else None,
                history=self.state.log_history,
            )

    def on_groups_scored(self, prompt_indices, values, informative, classification):
        super().on_groups_scored(prompt_indices, values, informative, classification)
        record["rounds"].append(
            {"step": self.state.global_step, "prompts": list(prompt_indices), "informative": informative.tolist()}
        )

    def _compute_loss(self, model, inputs):
        if self.model.training:
            shapes = {k: list(v.shape) for k, v in sorted(inputs.items()) if isinstance(v, torch.Tensor)}
            record["batches"].append({"step": self.state.global_step, "shapes": shapes})
        return super()._compute_loss(model, inputs)


@atexit.register
def dump() -> None:
    # At exit: the main job should have released the group and freed gloo's threads (tests/_tiny.live_gloo_threads).
    record.update(process_group_live=torch.distributed.is_initialized(), gloo_threads_at_exit=live_gloo_threads())
    (RECORD_DIR / f"rank{RANK}.json").write_text(json.dumps(record))


spec = importlib.util.spec_from_file_location("train_math", ROOT / "examples" / "train_math.py")
train_math = importlib.util.module_from_spec(spec)
sys.modules["train_math"] = train_math
spec.loader.exec_module(train_math)
train_math.DAPOTrainer = RecordingTrainer

if __name__ == "__main__":
    with train_math.released_process_group():  # as train_math's own `__main__` does
        train_math.main(sys.argv[1:])
