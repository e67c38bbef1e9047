"""Preemption: a signal stops training at a step boundary with a complete checkpoint; a restart resumes it exactly."""

import os
import signal
import threading

import pytest
from _tiny import Recorder, ScriptedReward, config, scripted_dataset, tiny_model_and_tokenizer
from transformers import TrainerCallback

from dapo_trl.dapo_config import DAPOConfig
from dapo_trl.preemption import (
    PREEMPTION_EXIT_CODE,
    PreemptionCallback,
    PreemptionMixin,
    is_complete_checkpoint,
    latest_complete_checkpoint,
    steps_per_rollout,
)

# Two optimizer steps per rollout (so "finish the rollout" is tested), carry-over on (its buffer is sampler state that
# must survive), no periodic saves: the only checkpoint is the one the signal causes.
COMMON = dict(max_steps=6, steps_per_generation=2, dynamic_sampling_carry_over=True, dynamic_sampling_margin=4.0)
COMPARED = ("loss", "reward", "dynamic_sampling/prompts_consumed", "dynamic_sampling/groups_carried")


class SignalAt(TrainerCallback):
    """Sends `signum` to this process when optimizer step `step` begins (its generation and update still run)."""

    def __init__(self, signum, step):
        self.signum, self.step = signum, step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            os.kill(os.getpid(), self.signum)


class SignalDuringRefill(Recorder):
    """Sends SIGTERM right after the first round of step `step` is scored, when a refill round is still to come."""

    signal_step = 3

    def on_groups_scored(self, prompt_indices, values, informative, classification):
        super().on_groups_scored(prompt_indices, values, informative, classification)
        if self.state.global_step + 1 == self.signal_step and not getattr(self, "_sent", False):
            self._sent = True
            os.kill(os.getpid(), signal.SIGTERM)


class SignalDuringSave(Recorder):
    """Receives two more signals while its checkpoint is being written, and records what the folder looked like."""

    def _save_optimizer_and_scheduler(self, output_dir):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)
        final = os.path.join(self.args.output_dir, os.path.basename(output_dir))
        self.seen_during_save = getattr(self, "seen_during_save", []) + [(output_dir, os.path.exists(final))]
        super()._save_optimizer_and_scheduler(output_dir)


class Killed(Exception):
    pass


class DiesDuringSecondSave(Recorder):
    """Stands in for a process killed in the middle of writing its second checkpoint."""

    def _save_optimizer_and_scheduler(self, output_dir):
        if self.state.global_step == 4:
            raise Killed("killed while saving")
        super()._save_optimizer_and_scheduler(output_dir)


def make(cls, output_dir, eval_dataset=None, **overrides):
    model, tokenizer = tiny_model_and_tokenizer()
    return cls(
        model=model,
        reward_funcs=[ScriptedReward()],
        args=config(output_dir, **{**COMMON, **overrides}),
        train_dataset=scripted_dataset(),
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
    )


def tail(trainer, after_step):
    rows = [h for h in trainer.state.log_history if "loss" in h and h["step"] > after_step]
    return {key: [h.get(key) for h in rows] for key in COMPARED}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    trainer = make(Recorder, tmp_path_factory.mktemp("full"))
    trainer.train()
    return trainer


def assert_resumes_like(uninterrupted, output_dir, checkpoint_step, cls=Recorder, **overrides):
    resumed = make(cls, output_dir, auto_resume=True, **overrides)
    resumed.train()  # the same "command" again
    assert resumed.state.global_step == COMMON["max_steps"]
    trained = len(resumed.recorded)  # micro-batches (one per optimizer step here) that reached the loss
    assert trained == COMMON["max_steps"] - checkpoint_step, "did not resume from the checkpoint"
    expected, got = tail(uninterrupted, checkpoint_step), tail(resumed, checkpoint_step)
    for key in COMPARED:
        assert expected[key] and got[key] == pytest.approx(expected[key]), key


@pytest.mark.integration
def test_sigterm_mid_training_saves_exits_75_and_restart_matches(uninterrupted, tmp_path):
    trainer = make(Recorder, tmp_path, preemption_stop_at="rollout")
    trainer.add_callback(SignalAt(signal.SIGTERM, step=3))  # step 3 starts the second rollout (steps 3-4)
    with pytest.raises(SystemExit) as exit_info:
        trainer.train()
    assert exit_info.value.code == PREEMPTION_EXIT_CODE
    assert trainer.state.global_step == 4, "must finish the rollout the signal interrupted"
    checkpoint = tmp_path / "checkpoint-4"
    assert latest_complete_checkpoint(tmp_path) == str(checkpoint)
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "dapo_sampler_state.pt"):
        assert (checkpoint / name).is_file(), name
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".partial-")]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "handlers must be restored"
    assert_resumes_like(uninterrupted, tmp_path, 4, preemption_stop_at="rollout")


@pytest.mark.integration
def test_sigterm_during_a_refill_round(uninterrupted, tmp_path):
    trainer = make(SignalDuringRefill, tmp_path, dynamic_sampling_round_sizing="deficit", preemption_stop_at="rollout")
    with pytest.raises(SystemExit):
        trainer.train()
    assert trainer.state.global_step == 4
    rounds = [h["dynamic_sampling/rounds"] for h in trainer.state.log_history if h.get("step") == 3 and "loss" in h]
    assert rounds and rounds[0] >= 2, "the signal must arrive before the refill round, which then still runs"
    full = make(Recorder, tmp_path / "full-deficit", dynamic_sampling_round_sizing="deficit")
    full.train()
    assert_resumes_like(full, tmp_path, 4, dynamic_sampling_round_sizing="deficit", preemption_stop_at="rollout")


@pytest.mark.integration
def test_stop_at_step_stops_inside_the_rollout_and_resumes_exactly(uninterrupted, tmp_path):
    trainer = make(Recorder, tmp_path)  # DAPOConfig's default: preemption_stop_at="step"
    trainer.add_callback(SignalAt(signal.SIGUSR1, step=3))
    with pytest.raises(SystemExit):
        trainer.train()
    assert trainer.state.global_step == 3
    assert is_complete_checkpoint(tmp_path / "checkpoint-3")
    assert (tmp_path / "checkpoint-3" / "dapo_generation_buffer_rank0.pt").is_file()  # the rollout's second half
    assert_resumes_like(uninterrupted, tmp_path, 3)


@pytest.mark.integration
def test_second_signal_during_the_save_does_not_corrupt_it(uninterrupted, tmp_path):
    trainer = make(SignalDuringSave, tmp_path, save_strategy="steps", save_steps=2, preemption_stop_at="rollout")
    with pytest.raises(SystemExit) as exit_info:
        trainer.train()  # signals during the periodic save at step 2 stop the run at the next rollout end, step 4
    assert exit_info.value.code == PREEMPTION_EXIT_CODE
    (first, first_published), (last, last_published) = trainer.seen_during_save  # two more signals during this one
    assert first.endswith("/.partial-checkpoint-2/checkpoint-2") and not first_published
    assert last.endswith("/.partial-checkpoint-4/checkpoint-4") and not last_published
    assert trainer.state.global_step == 4
    assert latest_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    assert is_complete_checkpoint(tmp_path / "checkpoint-2")
    assert_resumes_like(uninterrupted, tmp_path, 4)


@pytest.mark.integration
def test_a_save_killed_midway_is_ignored_and_the_previous_checkpoint_resumes(uninterrupted, tmp_path):
    trainer = make(DiesDuringSecondSave, tmp_path, save_strategy="steps", save_steps=2)
    with pytest.raises(Killed):
        trainer.train()
    assert not (tmp_path / "checkpoint-4").exists()
    assert (tmp_path / ".partial-checkpoint-4" / "checkpoint-4" / "model.safetensors").exists()  # half-written
    assert latest_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")
    assert_resumes_like(uninterrupted, tmp_path, 2, save_strategy="steps", save_steps=2)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".partial-")], "the stale partial save is removed"


@pytest.mark.integration
def test_plain_grpo_trainer_with_the_callback_and_the_mixin(tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    class AtomicGRPOTrainer(PreemptionMixin, GRPOTrainer):
        pass

    model, tokenizer = tiny_model_and_tokenizer()
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        learning_rate=1e-3,
        max_steps=4,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=8,
        disable_tqdm=True,
    )
    for cls, folder in ((GRPOTrainer, "plain"), (AtomicGRPOTrainer, "mixin")):
        args.output_dir = str(tmp_path / folder)
        callbacks = [SignalAt(signal.SIGTERM, step=2)] + ([PreemptionCallback()] if cls is GRPOTrainer else [])
        trainer = cls(
            model=model,
            reward_funcs=[ScriptedReward()],
            args=args,
            train_dataset=scripted_dataset(),
            processing_class=tokenizer,
            callbacks=callbacks,
        )
        with pytest.raises(SystemExit) as exit_info:
            trainer.train()
        assert exit_info.value.code == PREEMPTION_EXIT_CODE
        assert latest_complete_checkpoint(tmp_path / folder) == str(tmp_path / folder / "checkpoint-2")


@pytest.mark.integration
def test_published_checkpoints_keep_best_model_tracking_and_rotation(tmp_path):
    """transformers records the best checkpoint by the path it wrote to: it must name the published folder."""
    trainer = make(
        Recorder,
        tmp_path,
        eval_dataset=scripted_dataset(8),
        save_strategy="steps",
        save_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        per_device_eval_batch_size=8,
        metric_for_best_model="eval_reward",
        load_best_model_at_end=True,  # loads state.best_model_checkpoint at the end: fails on a stale path
        save_total_limit=2,
    )
    trainer.train()
    best = trainer.state.best_model_checkpoint
    assert best is not None and ".partial-" not in best and os.path.isdir(best)
    kept = sorted(p for p in os.listdir(tmp_path) if p.startswith("checkpoint-"))
    assert len(kept) == 2 and {os.path.basename(best), "checkpoint-6"} <= set(kept), kept  # rotation kept both
    for name in kept:
        assert ".partial-" not in (tmp_path / name / "trainer_state.json").read_text()


@pytest.mark.integration
def test_saving_a_step_again_replaces_its_checkpoint(tmp_path):
    make(Recorder, tmp_path, max_steps=4, save_strategy="steps", save_steps=2).train()
    first = (tmp_path / "checkpoint-4" / "trainer_state.json").stat().st_mtime_ns
    again = make(Recorder, tmp_path, max_steps=4, save_strategy="steps", save_steps=2)
    again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))  # an older checkpoint, chosen explicitly
    assert (tmp_path / "checkpoint-4" / "trainer_state.json").stat().st_mtime_ns > first
    assert latest_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    assert sorted(os.listdir(tmp_path / "checkpoint-4")) == sorted(os.listdir(tmp_path / "checkpoint-2"))
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".partial-")]


# ---------------------------------------------------------------------------------------------------- units


def test_latest_complete_checkpoint_skips_partial_and_incomplete_folders(tmp_path):
    assert latest_complete_checkpoint(tmp_path / "missing") is None
    for name, complete in [("checkpoint-2", True), ("checkpoint-10", True), ("checkpoint-12", False)]:
        (tmp_path / name).mkdir()
        if complete:
            (tmp_path / name / "trainer_state.json").write_text("{}")
    (tmp_path / ".partial-checkpoint-14" / "checkpoint-14").mkdir(parents=True)
    (tmp_path / ".partial-checkpoint-14" / "checkpoint-14" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-9x").mkdir()
    assert latest_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")  # numeric order, not text
    (tmp_path / "checkpoint-10" / "checkpoint-is-incomplete.txt").write_text("transformers JIT save in progress")
    assert latest_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")


@pytest.mark.parametrize(
    ("steps_per_generation", "num_iterations", "accumulation", "expected"),
    [(1, 1, 1, 1), (4, 1, 1, 4), (64, 1, 16, 4), (4, 2, 2, 4), (2, 1, 4, 1), (6, 1, 4, 3)],
)
def test_steps_per_rollout(steps_per_generation, num_iterations, accumulation, expected):
    class Args:
        pass

    args = Args()
    args.steps_per_generation, args.num_iterations, args.gradient_accumulation_steps = (
        steps_per_generation,
        num_iterations,
        accumulation,
    )
    assert steps_per_rollout(args) == expected


def test_config_checks(tmp_path):
    common = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="preemption_stop_at"):
        DAPOConfig(preemption_stop_at="epoch", **common)
    with pytest.raises(ValueError, match="enable_jit_checkpoint"):
        DAPOConfig(enable_jit_checkpoint=True, **common)
    DAPOConfig(enable_jit_checkpoint=True, preemption_handling=False, **common)
    with pytest.raises(ValueError, match="save_only_model"):
        DAPOConfig(auto_resume=True, save_only_model=True, **common)
    with pytest.raises(ValueError, match="stop_at"):
        PreemptionCallback(stop_at="epoch")


def test_handlers_are_not_installed_off_the_main_thread(caplog):
    callback = PreemptionCallback()
    thread = threading.Thread(target=callback.install)
    thread.start()
    thread.join()
    assert "main thread" in caplog.text
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_repeated_signals_are_recorded_once():
    callback = PreemptionCallback()
    callback.install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        callback.uninstall()
    assert callback.received == signal.SIGUSR1
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
