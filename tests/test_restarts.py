"""Restarts: the preemption message says what resumes, a fresh run next to checkpoints warns, examples honour resume."""

import logging
import os
import signal
from types import SimpleNamespace

import pytest
from _tiny import ScriptedReward, config, scripted_dataset, tiny_model_and_tokenizer
from test_train_domain_qa import train_domain_qa
from test_train_math import ROOT, train_math
from transformers import TrainerCallback

from dapo_trl import DAPOTrainer
from dapo_trl.trainer.preemption import PREEMPTION_EXIT_CODE, fresh_start_warning, resume_hint


def complete_checkpoint(folder, step):
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text("{}")
    return str(path)


def test_resume_hint_names_the_flag_a_rerun_needs(tmp_path):
    latest = complete_checkpoint(tmp_path, 4)
    hint = resume_hint(SimpleNamespace(output_dir=str(tmp_path), auto_resume=False))
    assert "--auto_resume true" in hint and f"--resume_from_checkpoint {latest}" in hint
    assert "step 0" in hint
    assert "same command again" in resume_hint(SimpleNamespace(output_dir=str(tmp_path), auto_resume=True))


def test_fresh_start_warning_only_next_to_a_complete_checkpoint(tmp_path):
    assert fresh_start_warning(tmp_path) is None
    (tmp_path / "checkpoint-3").mkdir()  # incomplete: no trainer state
    assert fresh_start_warning(tmp_path) is None
    latest = complete_checkpoint(tmp_path, 2)
    assert f"--resume_from_checkpoint {latest}" in fresh_start_warning(tmp_path)


class SignalAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def make(output_dir, **overrides):
    model, tokenizer = tiny_model_and_tokenizer()
    args = config(output_dir, **{"max_steps": 3, **overrides})
    return DAPOTrainer(
        model=model,
        reward_funcs=[ScriptedReward()],
        args=args,
        train_dataset=scripted_dataset(),
        processing_class=tokenizer,
    )


@pytest.mark.integration
def test_a_preempted_run_says_how_to_resume_and_a_fresh_rerun_warns(tmp_path, caplog):
    trainer = make(tmp_path)
    trainer.add_callback(SignalAt(step=2))
    with caplog.at_level(logging.WARNING, logger="dapo_trl.trainer.preemption"), pytest.raises(SystemExit) as stop:
        trainer.train()
    assert stop.value.code == PREEMPTION_EXIT_CODE
    checkpoint = tmp_path / "checkpoint-2"
    assert f"--resume_from_checkpoint {checkpoint}" in caplog.text and "--auto_resume true" in caplog.text
    caplog.clear()
    rerun = make(tmp_path)  # the same command again, auto_resume off: starts at step 0, and says so
    with caplog.at_level(logging.WARNING, logger="dapo_trl.trainer.preemption"):
        rerun.train()
    assert "holds complete checkpoints" in caplog.text and str(checkpoint) in caplog.text
    caplog.clear()
    resumed = make(tmp_path, auto_resume=True)
    with caplog.at_level(logging.WARNING, logger="dapo_trl.trainer.preemption"):
        resumed.train()
    assert "holds complete checkpoints" not in caplog.text


class Stop(Exception):
    pass


@pytest.mark.integration
@pytest.mark.parametrize("value", ["true", "some/checkpoint-7"])
def test_the_demos_honour_resume_from_checkpoint(value, tmp_path, monkeypatch):
    """The CPU demo paths hand --resume_from_checkpoint to train() (`true`: the newest complete checkpoint)."""
    seen = []

    def train(self, resume_from_checkpoint=None, **kwargs):
        seen.append(resume_from_checkpoint)
        raise Stop

    monkeypatch.setattr(DAPOTrainer, "train", train)
    smoke = ["--config", str(ROOT / "configs" / "smoke.yaml"), "--output_dir", str(tmp_path / "math")]
    smoke += ["--demo_sft_steps", "2"]
    with pytest.raises(Stop):
        train_math.main([*smoke, "--resume_from_checkpoint", value])
    qa = ["--output_dir", str(tmp_path / "qa"), "--demo_sft_steps", "2", "--max_train_samples", "64"]
    with pytest.raises(Stop):
        train_domain_qa.main([*qa, "--eval_max_samples", "2", "--eval_k", "1", "--resume_from_checkpoint", value])
    expected = True if value == "true" else value
    assert seen == [expected, expected]
