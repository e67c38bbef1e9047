"""Run by tests/test_preemption.py in a subprocess (alone or under `accelerate launch`): a tiny DAPO run to interrupt.

    python tests/scripts/preemption_run.py OUTPUT_DIR MODE [--key value ...]   (DAPOConfig overrides, ints or strings)

MODE: `train` (steps until signalled), `slow-save` (a save that takes a minute, to signal during it), `stuck-reward`
(the reward never returns from its second call on: a step that never ends). Each process writes
`OUTPUT_DIR/progress-rank<r>` (the last finished step) and markers `saving-rank<r>` / `stuck-rank<r>`, and at exit
`OUTPUT_DIR/exit-rank<r>.json` (global step, step it stopped at for a signal, gloo threads still alive).
"""

import atexit
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from _tiny import (  # noqa: E402
    Recorder,
    ScriptedReward,
    config,
    live_gloo_threads,
    scripted_dataset,
    tiny_model_and_tokenizer,
)
from transformers import TrainerCallback  # noqa: E402

from dapo_trl import released_process_group  # noqa: E402
from dapo_trl.trainer.preemption import PreemptionCallback  # noqa: E402

torch.set_num_threads(1)
OUT, MODE = Path(sys.argv[1]), sys.argv[2]
RANK = int(os.environ.get("RANK", "0"))
record: dict = {}  # filled when train() ends (also by a stop's SystemExit); no reference to the trainer is kept


def marker(name: str) -> None:
    (OUT / f"{name}-rank{RANK}").touch()


class Progress(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        path = OUT / f"progress-rank{RANK}"
        path.with_suffix(".tmp").write_text(str(state.global_step))
        os.replace(path.with_suffix(".tmp"), path)


class StuckReward(ScriptedReward):
    calls = 0

    def __call__(self, completions, kind, **kwargs):
        StuckReward.calls += 1
        if StuckReward.calls > 1:
            marker("stuck")
            while True:  # a remote judge that never answers
                time.sleep(0.05)
        return super().__call__(completions, kind, **kwargs)


class Trainer(Recorder):
    def _save_optimizer_and_scheduler(self, output_dir):
        if MODE == "slow-save":
            marker("saving")
            time.sleep(60)
        super()._save_optimizer_and_scheduler(output_dir)

    def train(self, *args, **kwargs):
        try:
            return super().train(*args, **kwargs)
        finally:
            callback = next((c for c in self.callback_handler.callbacks if isinstance(c, PreemptionCallback)), None)
            record.update(global_step=self.state.global_step, stopped_at_step=callback and callback.stopped_at_step)


@atexit.register
def dump() -> None:
    if record:
        record.update(gloo_threads_at_exit=live_gloo_threads())  # released before exit, also after a stop
        (OUT / f"exit-rank{RANK}.json").write_text(json.dumps(record))


def main(argv: list[str]) -> None:
    overrides = {k.lstrip("-"): int(v) if v.lstrip("-").isdigit() else v for k, v in zip(argv[::2], argv[1::2])}
    values = {"max_steps": 10_000, "ddp_find_unused_parameters": False, **overrides}
    model, tokenizer = tiny_model_and_tokenizer()
    trainer = Trainer(
        model=model,
        reward_funcs=[StuckReward() if MODE == "stuck-reward" else ScriptedReward()],
        args=config(OUT, **values),
        train_dataset=scripted_dataset(),
        processing_class=tokenizer,
        callbacks=[Progress()],
    )
    trainer.train()


if __name__ == "__main__":
    with released_process_group():
        main(sys.argv[3:])
