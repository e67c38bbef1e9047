"""Preemption: a signal stops training at a step boundary with a complete checkpoint; a restart resumes it exactly."""

import contextlib
import json
import os
import signal
import threading

import pytest
from _tiny import Recorder, ScriptedReward, config, scripted_dataset, tiny_model_and_tokenizer
from transformers import TrainerCallback

from dapo_trl.dapo_config import DAPOConfig
from dapo_trl.trainer.preemption import (
    PREEMPTION_EXIT_CODE,
    PREEMPTION_SIGNALS,
    PREEMPTION_TIMEOUT_EXIT_CODE,
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
    """
    Receives SIGTERM twice (a launcher forwarding the signal a scheduler also sent this process) while its checkpoint
    is being written, and records what the folder looked like.
    """

    def _save_optimizer_and_scheduler(self, output_dir):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
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


def make(cls, output_dir, eval_dataset=None, train_dataset=None, **overrides):
    model, tokenizer = tiny_model_and_tokenizer()
    return cls(
        model=model,
        reward_funcs=[ScriptedReward()],
        args=config(output_dir, **{**COMMON, **overrides}),
        train_dataset=train_dataset if train_dataset is not None else scripted_dataset(),
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
    assert not [p for p in os.listdir(tmp_path) if p.startswith("_partial-")]
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
def test_a_forwarded_copy_of_the_signal_during_the_save_is_not_a_second_signal(uninterrupted, tmp_path):
    trainer = make(SignalDuringSave, tmp_path, save_strategy="steps", save_steps=2, preemption_stop_at="rollout")
    with pytest.raises(SystemExit) as exit_info:
        trainer.train()  # signals during the periodic save at step 2 stop the run at the next rollout end, step 4
    assert exit_info.value.code == PREEMPTION_EXIT_CODE
    (first, first_published), (last, last_published) = trainer.seen_during_save  # two more copies during this one
    assert first.endswith("/_partial-checkpoint-2/checkpoint-2") and not first_published
    assert last.endswith("/_partial-checkpoint-4/checkpoint-4") and not last_published
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
    assert (tmp_path / "_partial-checkpoint-4" / "checkpoint-4" / "model.safetensors").exists()  # half-written
    assert latest_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")
    assert_resumes_like(uninterrupted, tmp_path, 2, save_strategy="steps", save_steps=2)
    assert not [p for p in os.listdir(tmp_path) if p.startswith("_partial-")], "the stale partial save is removed"


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
    assert best is not None and "_partial-" not in best and os.path.isdir(best)
    kept = sorted(p for p in os.listdir(tmp_path) if p.startswith("checkpoint-"))
    assert len(kept) == 2 and {os.path.basename(best), "checkpoint-6"} <= set(kept), kept  # rotation kept both
    for name in kept:
        assert "_partial-" not in (tmp_path / name / "trainer_state.json").read_text()


@pytest.mark.integration
def test_saving_a_step_again_replaces_its_checkpoint(tmp_path):
    make(Recorder, tmp_path, max_steps=4, save_strategy="steps", save_steps=2).train()
    first = (tmp_path / "checkpoint-4" / "trainer_state.json").stat().st_mtime_ns
    again = make(Recorder, tmp_path, max_steps=4, save_strategy="steps", save_steps=2)
    again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))  # an older checkpoint, chosen explicitly
    assert (tmp_path / "checkpoint-4" / "trainer_state.json").stat().st_mtime_ns > first
    assert latest_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    assert sorted(os.listdir(tmp_path / "checkpoint-4")) == sorted(os.listdir(tmp_path / "checkpoint-2"))
    assert not [p for p in os.listdir(tmp_path) if p.startswith("_partial-")]


# ---------------------------------------------------------------------------------------------------- units


def test_latest_complete_checkpoint_skips_partial_and_incomplete_folders(tmp_path):
    assert latest_complete_checkpoint(tmp_path / "missing") is None
    for name, complete in [("checkpoint-2", True), ("checkpoint-10", True), ("checkpoint-12", False)]:
        (tmp_path / name).mkdir()
        if complete:
            (tmp_path / name / "trainer_state.json").write_text("{}")
    for staging in ("_partial-checkpoint-14", ".partial-checkpoint-16"):  # this version's staging, an earlier one's
        (tmp_path / staging / staging[9:]).mkdir(parents=True)
        (tmp_path / staging / staging[9:] / "trainer_state.json").write_text("{}")
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
    for bad, error in ((0, ValueError), (-1.0, ValueError), ("10", TypeError), (True, TypeError)):
        with pytest.raises(error, match="preemption_timeout"):
            DAPOConfig(preemption_timeout=bad, **common)
    assert DAPOConfig(preemption_timeout=None, **common).preemption_timeout is None
    with pytest.raises(ValueError, match="timeout"):
        PreemptionCallback(timeout=0)


def test_handlers_are_not_installed_off_the_main_thread(caplog):
    callback = PreemptionCallback()
    thread = threading.Thread(target=callback.install)
    thread.start()
    thread.join()
    assert "main thread" in caplog.text
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_repeated_signal_at_once_is_a_copy_and_a_second_one_stops_at_once(caplog):
    # What the process started with (SIGINT is SIG_IGN in a job started in the background): uninstall restores it.
    before = {name: signal.getsignal(getattr(signal, name)) for name in PREEMPTION_SIGNALS}
    callback = PreemptionCallback(timeout=None)
    callback.install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)  # a launcher forwarding what the scheduler also sent: the same request
        assert callback.received == signal.SIGUSR1 and "same request" in caplog.text
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # a second, different signal: stop at once
    finally:
        callback.uninstall()
    assert {name: signal.getsignal(getattr(signal, name)) for name in before} == before


def test_uninstall_ends_the_threads_that_reach_the_trainer(monkeypatch):
    # The launcher watch and the timeout timer reach the trainer through `rollout_done`; a thread alive after
    # uninstall keeps the trainer, and its gloo process group, alive into interpreter exit (a SIGABRT there).
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")  # as under torchrun: the launcher watch starts
    owner = type("Trainer", (), {"rollout_done": lambda self: True})()
    callback = PreemptionCallback(timeout=60.0, rollout_done=owner.rollout_done)
    callback.install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)  # starts the timeout timer
        threads = [callback._watch_thread, callback._timer]
        assert all(thread is not None and thread.is_alive() for thread in threads)
    finally:
        callback.uninstall()
    assert not any(thread.is_alive() for thread in threads), [t.name for t in threads if t.is_alive()]


# ---------------------------------------------------------------------------------------------------- evaluation


def comparable(history):
    """The log entries of a run with the keys that measure time (or the whole run's summary) left out."""
    timing = ("runtime", "per_second", "step_time", "train_loss", "total_flos")
    return [
        {k: v for k, v in entry.items() if not any(t in k for t in timing)}
        for entry in history
        if "loss" in entry or "eval_loss" in entry
    ]


@pytest.mark.integration
@pytest.mark.parametrize("stop_at", ["step", "rollout"])
def test_the_evaluation_due_at_the_stop_step_runs_before_the_save(tmp_path, stop_at):
    evaluated = dict(
        eval_dataset=scripted_dataset(8),
        eval_strategy="steps",
        eval_steps=2,
        per_device_eval_batch_size=8,
        preemption_stop_at=stop_at,
    )
    full = make(Recorder, tmp_path / "full", **evaluated)
    full.train()
    trainer = make(Recorder, tmp_path / "run", **evaluated)
    trainer.add_callback(SignalAt(signal.SIGTERM, step=4))  # evaluation is due at step 4
    with pytest.raises(SystemExit):
        trainer.train()
    assert trainer.state.global_step == 4
    assert [h["step"] for h in trainer.state.log_history if "eval_loss" in h] == [2, 4]
    resumed = make(Recorder, tmp_path / "run", auto_resume=True, **evaluated)
    resumed.train()
    expected, got = comparable(full.state.log_history), comparable(resumed.state.log_history)
    assert [h["step"] for h in got if "eval_loss" in h] == [2, 4, 6]
    assert len(got) == len(expected)
    for want, have in zip(expected, got, strict=True):
        assert have.keys() == want.keys() and have == pytest.approx(want), (want["step"], have)


@pytest.mark.integration
def test_a_stop_at_an_epoch_end_evaluates_then_saves_also_when_saving_only_the_best(tmp_path, monkeypatch):
    from transformers import Trainer

    monkeypatch.setattr(Trainer, "_determine_best_metric", lambda self, metrics, trial: False)  # never a new best
    evaluated = dict(
        train_dataset=scripted_dataset(8),  # 4 steps per epoch
        eval_dataset=scripted_dataset(8),
        eval_strategy="epoch",
        save_strategy="best",
        metric_for_best_model="eval_reward",
        per_device_eval_batch_size=8,
        max_steps=8,
    )
    full = make(Recorder, tmp_path / "full", **evaluated)
    full.train()
    trainer = make(Recorder, tmp_path / "run", **evaluated)
    trainer.add_callback(SignalAt(signal.SIGTERM, step=4))
    with pytest.raises(SystemExit):
        trainer.train()
    assert trainer.state.global_step == 4 and trainer.state.epoch == 1.0
    assert [h["step"] for h in trainer.state.log_history if "eval_loss" in h] == [4]
    assert latest_complete_checkpoint(tmp_path / "run") == str(tmp_path / "run" / "checkpoint-4")
    resumed = make(Recorder, tmp_path / "run", auto_resume=True, **evaluated)
    resumed.train()
    expected, got = comparable(full.state.log_history), comparable(resumed.state.log_history)
    assert [h["step"] for h in got if "eval_loss" in h] == [4, 8]
    for want, have in zip(expected, got, strict=True):
        assert have.keys() == want.keys() and have == pytest.approx(want), (want["step"], have)


def test_a_stop_that_leaves_the_epoch_early_skips_the_epoch_end_evaluation_and_save():
    from transformers import TrainerControl, TrainerState

    class Args:
        gradient_accumulation_steps = 1
        save_strategy = "steps"

    callback = PreemptionCallback(stop_at="step", timeout=None)
    callback.received = signal.SIGTERM
    for epoch, completes in ((0.5, False), (1.0, True)):
        state, control = TrainerState(global_step=3, epoch=epoch), TrainerControl()
        callback.stopped_at_step = None
        callback.on_step_end(Args(), state, control)
        assert control.should_training_stop and control.should_save is not completes  # at the epoch end otherwise
        control.should_save = False
        callback.on_save(Args(), state, control)  # saved at the step end
        control.should_evaluate = control.should_save = True  # what DefaultFlowCallback asks at an epoch end
        callback.on_epoch_end(Args(), state, control)
        assert (control.should_evaluate, control.should_save) == (completes, completes)


# ---------------------------------------------------------------------------------------------------- resume mid-rollout


@pytest.mark.integration
def test_stop_at_rollout_after_a_resume_from_inside_a_rollout_stops_at_the_rollout_end(uninterrupted, tmp_path):
    trainer = make(Recorder, tmp_path, preemption_stop_at="step")
    trainer.add_callback(SignalAt(signal.SIGUSR1, step=3))  # inside the rollout of steps 3-4
    with pytest.raises(SystemExit):
        trainer.train()
    assert (tmp_path / "checkpoint-3" / "dapo_generation_buffer_rank0.pt").is_file()
    resumed = make(Recorder, tmp_path, auto_resume=True, preemption_stop_at="rollout")
    resumed.add_callback(SignalAt(signal.SIGTERM, step=4))
    with pytest.raises(SystemExit):
        resumed.train()
    assert resumed.state.global_step == 4, "step 4 ends the rollout the checkpoint was taken in"
    assert not (tmp_path / "checkpoint-4" / "dapo_generation_buffer_rank0.pt").exists()
    assert_resumes_like(uninterrupted, tmp_path, 4)


# ---------------------------------------------------------------------------------------------------- Hub pushes


class FakeHub:
    """Stands in for transformers' `hf_api()`: records every upload and the files it would send, listed at once."""

    def __init__(self):
        self.uploads: list[dict] = []

    def create_repo(self, repo_id, **kwargs):
        from types import SimpleNamespace

        return SimpleNamespace(repo_id=f"me/{repo_id.split('/')[-1]}")

    def upload_folder(self, *, folder_path, path_in_repo=None, ignore_patterns=None, **kwargs):
        from concurrent.futures import Future
        from pathlib import Path

        from huggingface_hub.utils import filter_repo_objects

        root = Path(folder_path)
        files = sorted(p.relative_to(root).as_posix() for p in root.glob("**/*") if p.is_file())
        sent = list(filter_repo_objects(files, ignore_patterns=ignore_patterns))
        self.uploads.append({"folder": str(folder_path), "path_in_repo": path_in_repo or "", "files": sent})
        done = Future()
        done.set_result(None)
        return done


@pytest.mark.integration
@pytest.mark.parametrize("strategy", ["checkpoint", "all_checkpoints"])
def test_hub_pushes_send_published_checkpoints_and_never_a_staging_folder(tmp_path, monkeypatch, strategy):
    import transformers.trainer

    hub = FakeHub()
    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: hub)
    trainer = make(
        Recorder,
        tmp_path,
        max_steps=4,
        save_strategy="steps",
        save_steps=2,
        push_to_hub=True,
        hub_model_id="tiny-dapo",
        hub_strategy=strategy,
    )
    trainer.train()
    (tmp_path / "_partial-checkpoint-9" / "checkpoint-9").mkdir(parents=True)  # a save that was killed
    (tmp_path / "_partial-checkpoint-9" / "checkpoint-9" / "optimizer.pt").write_bytes(b"x")
    trainer.push_to_hub()  # the end-of-training upload of the run folder
    root = [u for u in hub.uploads if u["path_in_repo"] == ""]
    checkpoints = [u for u in hub.uploads if u["path_in_repo"] != ""]
    assert len(root) == 3 and len(checkpoints) == 2
    for upload in hub.uploads:
        assert "partial-" not in upload["folder"] and os.path.isdir(upload["folder"]), upload["folder"]
        assert not [f for f in upload["files"] if "partial-" in f], upload["files"]
    for upload in root:  # the model repository's root: the model, never optimizer or RNG states
        assert "model.safetensors" in upload["files"]
        assert not [f for f in upload["files"] if f.startswith("optimizer") or f.startswith("rng_state")], upload
    for step, upload in zip((2, 4), checkpoints, strict=True):
        assert upload["folder"] == str(tmp_path / f"checkpoint-{step}")
        assert upload["path_in_repo"] == ("last-checkpoint" if strategy == "checkpoint" else f"checkpoint-{step}")
        assert {"optimizer.pt", "trainer_state.json", "dapo_sampler_state.pt"} <= set(upload["files"])


# ---------------------------------------------------------------------------------------------------- in a subprocess

RUN = os.path.join(os.path.dirname(__file__), "scripts", "preemption_run.py")


def start_run(out, mode, *args):
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    log = open(out / "console.log", "w")  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, RUN, str(out), mode, *args], stdout=log, stderr=subprocess.STDOUT, env=env
    ), log


def wait_for_file(path, process, timeout=120):
    import time

    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"the run ended ({process.returncode}) before {path.name} appeared"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout} s"
        time.sleep(0.05)


def finish(process, log, out, timeout=90):
    import subprocess

    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        code = None
    log.close()
    return code, (out / "console.log").read_text()


@pytest.mark.integration
def test_ctrl_c_stops_at_the_step_end_saves_and_says_so(tmp_path):
    process, log = start_run(tmp_path, "train")
    wait_for_file(tmp_path / "progress-rank0", process)
    process.send_signal(signal.SIGINT)
    code, console = finish(process, log, tmp_path)
    assert code == 130, console[-3000:]
    assert "Ctrl-C: stopping after this step and saving; press again to stop at once." in console
    assert "Traceback" not in console and "KeyboardInterrupt" not in console
    latest = latest_complete_checkpoint(tmp_path)
    assert latest is not None and (tmp_path / os.path.basename(latest) / "optimizer.pt").is_file()
    stopped = json.loads((tmp_path / "exit-rank0.json").read_text())["stopped_at_step"]
    assert latest.endswith(f"checkpoint-{stopped}")


@pytest.mark.integration
@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_during_the_save_stops_at_once(tmp_path, second):
    import time

    process, log = start_run(tmp_path, "slow-save")
    wait_for_file(tmp_path / "progress-rank0", process)
    process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    wait_for_file(tmp_path / "saving-rank0", process)  # the save takes a minute
    time.sleep(max(0.0, 2.5 - (time.monotonic() - sent)))  # later than a forwarded copy would come
    process.send_signal(second)
    code, console = finish(process, log, tmp_path, timeout=30)
    assert code == -second, console[-3000:]  # KeyboardInterrupt, or SIGTERM's default action
    assert f"{signal.Signals(second).name} received again: stopping at once" in console
    if second == signal.SIGINT:
        assert "KeyboardInterrupt" in console
    assert latest_complete_checkpoint(tmp_path) is None  # the save was cut short: nothing was published
    assert [p for p in os.listdir(tmp_path) if p.startswith("_partial-checkpoint-")]


@pytest.mark.integration
def test_a_signal_during_a_step_that_never_ends_exits_after_the_timeout(tmp_path):
    import time

    process, log = start_run(tmp_path, "stuck-reward", "--preemption_timeout", "3")
    wait_for_file(tmp_path / "stuck-rank0", process)  # step 2's reward never returns
    process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    code, console = finish(process, log, tmp_path, timeout=60)
    assert code == PREEMPTION_TIMEOUT_EXIT_CODE, console[-3000:]
    assert 3 <= time.monotonic() - sent < 30
    assert "WITHOUT saving a checkpoint (preemption_timeout)" in console
    assert latest_complete_checkpoint(tmp_path) is None and not (tmp_path / "exit-rank0.json").exists()


@pytest.mark.integration
@pytest.mark.distributed
def test_ctrl_c_under_accelerate_launch_stops_both_processes_at_the_same_step(tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    launch += ["--main_process_port", str(port), RUN, str(tmp_path), "train", "--per_device_train_batch_size", "4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true", "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / "console.log", "w")  # noqa: SIM115
    # A terminal's Ctrl-C reaches the launcher, which passes SIGINT on to each training process.
    launcher = subprocess.Popen(launch, stdout=log, stderr=subprocess.STDOUT, env=env)
    for rank in range(2):
        wait_for_file(tmp_path / f"progress-rank{rank}", launcher, timeout=240)
    launcher.send_signal(signal.SIGINT)
    code, console = finish(launcher, log, tmp_path, timeout=120)
    assert code == 128 + signal.SIGINT, console[-4000:]
    records = [json.loads((tmp_path / f"exit-rank{r}.json").read_text()) for r in range(2)]
    assert records[0]["stopped_at_step"] == records[1]["stopped_at_step"] == records[0]["global_step"] > 0
    assert records[0]["gloo_threads_at_exit"] == records[1]["gloo_threads_at_exit"] == []  # exit 130, not SIGABRT
    checkpoint = tmp_path / f"checkpoint-{records[0]['global_step']}"
    assert latest_complete_checkpoint(tmp_path) == str(checkpoint)
    assert {"rng_state_0.pth", "rng_state_1.pth", "optimizer.pt"} <= {p.name for p in checkpoint.iterdir()}
    assert console.count("Ctrl-C: stopping after this step and saving") == 2


# ---------------------------------------------------------------------------------------------------- launchers


def launch_line(launcher, out, mode):
    import socket
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = [RUN, str(out), mode]
    if launcher == "python":
        return [sys.executable, *script]
    if launcher == "accelerate":  # `make demo`'s launch: accelerate's single-process launcher
        return [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--mixed_precision", "no",
                "--dynamo_backend", "no", *script]  # fmt: skip
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "1",
        "--master_port",
        str(port),
        *script,
    ]


def start_in_own_group(launcher, out, mode="train"):
    """Starts the run as a terminal starts a command: in a process group of its own, which Ctrl-C signals whole."""
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "ACCELERATE_USE_CPU": "true"}
    log = open(out / "console.log", "w")  # noqa: SIM115
    process = subprocess.Popen(
        launch_line(launcher, out, mode), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    return process, log


@pytest.mark.integration
@pytest.mark.parametrize("launcher", ["python", "accelerate", "torchrun"])
def test_one_ctrl_c_to_the_process_group_saves_under_every_launcher(tmp_path, launcher):
    """A terminal's Ctrl-C signals the launcher and the training process; the launcher's own SIGTERM follows."""
    process, log = start_in_own_group(launcher, tmp_path)
    try:
        wait_for_file(tmp_path / "progress-rank0", process, timeout=240)
        os.killpg(process.pid, signal.SIGINT)
        code, console = finish(process, log, tmp_path, timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert "stopping at once" not in console, console[-4000:]
    assert "Ctrl-C: stopping after this step and saving" in console, console[-4000:]
    record = json.loads((tmp_path / "exit-rank0.json").read_text())
    assert record["stopped_at_step"] == record["global_step"] > 0, (code, console[-4000:])
    checkpoint = tmp_path / f"checkpoint-{record['global_step']}"
    assert latest_complete_checkpoint(tmp_path) == str(checkpoint)
    assert (checkpoint / "optimizer.pt").is_file()


@pytest.mark.integration
@pytest.mark.parametrize("launcher", ["accelerate", "torchrun"])
def test_a_training_process_whose_launcher_is_killed_saves_and_stops(tmp_path, launcher):
    import psutil

    process, log = start_in_own_group(launcher, tmp_path)
    try:
        wait_for_file(tmp_path / "progress-rank0", process, timeout=240)
        workers = [
            p
            for p in psutil.Process(process.pid).children(recursive=True)
            if "preemption_run" in " ".join(p.cmdline())
        ]
        assert len(workers) == 1, workers
        process.kill()  # the launcher dies without passing anything on
        process.wait()
        _, alive = psutil.wait_procs(workers, timeout=120)  # bounds the test; the stop takes a step and a save
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        log.close()
    console = (tmp_path / "console.log").read_text()
    assert not alive, "the training process trained on after its launcher was killed"
    record = json.loads((tmp_path / "exit-rank0.json").read_text())
    assert record["stopped_at_step"] == record["global_step"] > 0, console[-4000:]
    assert latest_complete_checkpoint(tmp_path) == str(tmp_path / f"checkpoint-{record['global_step']}")
