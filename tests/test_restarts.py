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
from dapo_trl.dapo_config import DAPOConfig
from dapo_trl.trainer.preemption import (
    PREEMPTION_EXIT_CODE,
    fresh_start_conflict,
    latest_complete_checkpoint,
    resume_hint,
)


def complete_checkpoint(folder, step):
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text("{}")
    return str(path)


def test_resume_hint_names_the_flag_a_rerun_needs(tmp_path):
    latest = complete_checkpoint(tmp_path, 4)
    hint = resume_hint(SimpleNamespace(output_dir=str(tmp_path), auto_resume=False))
    assert "--auto_resume true" in hint and f"--resume_from_checkpoint {latest}" in hint
    assert "refused" in hint and "--overwrite_output_dir true" in hint
    assert "same command again" in resume_hint(SimpleNamespace(output_dir=str(tmp_path), auto_resume=True))


def test_fresh_start_conflict_only_next_to_a_complete_checkpoint(tmp_path):
    assert fresh_start_conflict(tmp_path) is None
    (tmp_path / "checkpoint-3").mkdir()  # incomplete: no trainer state
    assert fresh_start_conflict(tmp_path) is None
    complete_checkpoint(tmp_path, 2)
    assert "--auto_resume true" in fresh_start_conflict(tmp_path)
    assert "--overwrite_output_dir true" in fresh_start_conflict(tmp_path)


def test_auto_resume_and_overwrite_output_dir_together_are_refused(tmp_path):
    with pytest.raises(ValueError, match="overwrite_output_dir"):
        DAPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, auto_resume=True, overwrite_output_dir=True)


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
def test_a_preempted_run_says_how_to_resume_and_a_rerun_never_replaces_its_checkpoints(tmp_path, caplog):
    trainer = make(tmp_path)
    trainer.add_callback(SignalAt(step=2))
    with caplog.at_level(logging.WARNING, logger="dapo_trl.trainer.preemption"), pytest.raises(SystemExit) as stop:
        trainer.train()
    assert stop.value.code == PREEMPTION_EXIT_CODE
    checkpoint = tmp_path / "checkpoint-2"
    assert f"--resume_from_checkpoint {checkpoint}" in caplog.text and "--auto_resume true" in caplog.text
    saved = (checkpoint / "trainer_state.json").read_text()
    rerun = make(tmp_path)  # the same command again, auto_resume off: refused before any step
    with pytest.raises(ValueError, match="--overwrite_output_dir true") as refused:
        rerun.train()
    assert "--auto_resume true" in str(refused.value) and str(checkpoint) in str(refused.value)
    assert rerun.state.global_step == 0 and (checkpoint / "trainer_state.json").read_text() == saved
    resumed = make(tmp_path, auto_resume=True)
    resumed.train()
    assert resumed.state.global_step == 3
    over = make(tmp_path, overwrite_output_dir=True, max_steps=1)  # starts over: the old checkpoints go first
    (tmp_path / "_partial-checkpoint-9").mkdir()
    over.train()
    assert over.state.global_step == 1 and latest_complete_checkpoint(tmp_path) is None
    assert not [p for p in os.listdir(tmp_path) if "checkpoint-" in p]


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


@pytest.mark.integration
def test_resuming_a_model_with_a_tied_head_warns_about_no_missing_key(tmp_path, monkeypatch):
    """The checkpoint holds the tied head once, as the embedding: transformers named it a missing key."""
    import transformers.trainer
    from _tiny import tiny_trainer

    warnings = []
    monkeypatch.setattr(transformers.trainer.logger, "warning", lambda message, *a, **kw: warnings.append(message))
    first = tiny_trainer(tmp_path, save_strategy="steps", save_steps=1, max_steps=1)
    assert first.model.lm_head.weight is first.model.model.embed_tokens.weight
    first.train()
    resumed = tiny_trainer(tmp_path, save_strategy="steps", save_steps=1, max_steps=2)
    resumed.train(resume_from_checkpoint=True)
    assert not [w for w in warnings if "missing keys" in str(w)], warnings
    assert resumed.model.lm_head.weight is resumed.model.model.embed_tokens.weight


def test_preemption_doctests():
    import doctest

    from dapo_trl.trainer import preemption

    assert doctest.testmod(preemption).failed == 0
