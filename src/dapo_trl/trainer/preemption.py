"""Preemption-safe training: stop cleanly on a signal, publish only complete checkpoints, resume from the newest one.

Spot instances and Kubernetes send SIGTERM a minute or two before they take a machine back; SLURM can send SIGUSR1
before a job's time limit (`#SBATCH --signal`). transformers' Trainer installs no handler for either, so a preempted
run dies at once and keeps only its last periodic checkpoint. Three pieces fix that, for any transformers `Trainer`
(TRL's `GRPOTrainer` included; [`DAPOTrainer`] has all three built in):

- [`PreemptionCallback`]: on the signal, finish the current rollout (or optimizer step), save a checkpoint, and stop.
  A signal may reach only some processes (one node reclaimed, one launcher signalled), so every process contributes
  its flag to an all-reduce at each step end and they all stop at the same step; the all-reduce moves one number.
- [`PreemptionMixin`]: writes each checkpoint into `_partial-checkpoint-N/` and renames it to `checkpoint-N` only once
  every process has written its part, so a second signal, a `SIGKILL` at the end of the grace period or a crash
  during the save can leave a partial folder but never a `checkpoint-N` that is incomplete. It also resumes from the
  newest complete checkpoint when `auto_resume` is set, and installs the callback when `preemption_handling` is.
- [`latest_complete_checkpoint`]: the newest `checkpoint-N` of a run folder that is complete.

Ctrl-C (SIGINT) is handled the same way: the first one stops at the same agreed point and saves, a second one stops
at once (`KeyboardInterrupt`). A second SIGTERM or SIGUSR1 also stops at once (the signal's default action). The wait
for the stop point is bounded by a timeout (`preemption_timeout`): a step that never ends (dynamic sampling refilling
without end) cannot defer the stop forever.

Exit codes: a training process stopped by a preemption signal exits with [`PREEMPTION_EXIT_CODE`] (75,
`EX_TEMPFAIL`: "temporary failure, retry") once its checkpoint is saved, with [`INTERRUPT_EXIT_CODE`] (130, as an
interrupted command) after Ctrl-C, and with [`PREEMPTION_TIMEOUT_EXIT_CODE`] (124) without saving when the stop point
was not reached within the timeout. Under `accelerate launch` / `torchrun`, the launcher itself exits with
`128 + signal` (143 for SIGTERM, 138 for SIGUSR1) when it received the signal (it forwards it to its training
processes and waits for them up to `TORCH_ELASTIC_SHUTDOWN_TIMEOUT` seconds), or with 1 when only its training
processes were signalled (the log names exit code 75).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shutil
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

logger = logging.getLogger(__name__)

PREEMPTION_EXIT_CODE = 75
"""Exit code of a training process that saved a checkpoint and stopped because of a preemption signal."""

INTERRUPT_EXIT_CODE = 130
"""Exit code of a training process that saved a checkpoint and stopped because of Ctrl-C (128 + SIGINT)."""

PREEMPTION_TIMEOUT_EXIT_CODE = 124
"""Exit code of a training process that did not reach its stop point within the timeout and saved nothing."""

DEFAULT_PREEMPTION_TIMEOUT_S = 600.0
PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")
STOP_POINTS = ("rollout", "step")
# Checkpoints are staged in `_partial-checkpoint-N/`: transformers' Hub uploads of the run folder ignore `_*`, so a
# background upload never sends a staged optimizer or RNG file to the model repository.
PARTIAL_PREFIX = "_partial-"
_LEGACY_PARTIAL_PREFIX = ".partial-"  # staging folders of earlier versions, still recognised and cleaned up
# A launcher forwards the signal a scheduler also sent every process (SLURM signals all of a job step's processes):
# the same signal again within this many seconds is that copy, not a second request.
_REPEAT_WINDOW_S = 2.0
# A training process started by `torchrun` / `accelerate launch` checks this often whether its launcher is still there.
_LAUNCHER_POLL_S = 1.0
# Variables that torchrun (and accelerate's multi-process launch) and accelerate's single-process launcher set.
_LAUNCHER_VARIABLES = ("TORCHELASTIC_RUN_ID", "ACCELERATE_DYNAMO_BACKEND")
TRAINER_STATE_NAME = "trainer_state.json"  # transformers.trainer.TRAINER_STATE_NAME
_JIT_INCOMPLETE_MARKER = "checkpoint-is-incomplete.txt"  # how transformers' JIT checkpointing marks a partial save
_CHECKPOINT_RE = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


# ---------------------------------------------------------------------------------------------------- checkpoints


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """
    Whether a checkpoint folder was completely written.

    A folder published by [`PreemptionMixin`] is complete by construction (it is renamed into place last); for folders
    written by a plain transformers `Trainer`, which writes `trainer_state.json` after the model, optimizer, scheduler
    and RNG files, its presence is the test.
    """
    path = os.fspath(path)
    return os.path.isfile(os.path.join(path, TRAINER_STATE_NAME)) and not os.path.exists(
        os.path.join(path, _JIT_INCOMPLETE_MARKER)
    )


def tied_missing_keys(model: Any, missing_keys: list[str]) -> set[str]:
    """
    The `missing_keys` of a checkpoint load that name a parameter tied to one that was loaded (the very same tensor,
    such as a head tied to the input embedding): the checkpoint holds them under the other name.

    Example:
    ```python
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Embedding(4, 2), torch.nn.Linear(2, 4, bias=False))
    >>> model[1].weight = model[0].weight
    >>> tied_missing_keys(model, ["1.weight"]), tied_missing_keys(model, ["0.weight", "1.weight"])
    ({'1.weight'}, set())

    ```
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    missing = set(missing_keys)
    loaded = [p for name, p in params.items() if name not in missing]
    return {name for name in missing if name in params and any(params[name] is p for p in loaded)}


def latest_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """
    The newest complete `checkpoint-N` folder of `output_dir` (highest `N`), or `None` when there is none.

    Partially written checkpoints are skipped with a warning: `_partial-checkpoint-N` folders (a save that did not
    finish) never match, and a `checkpoint-N` without `trainer_state.json` is passed over for the next older one.
    """
    output_dir = os.fspath(output_dir)
    if not os.path.isdir(output_dir):
        return None
    steps = []
    for name in os.listdir(output_dir):
        match = _CHECKPOINT_RE.match(name)
        if match and os.path.isdir(os.path.join(output_dir, name)):
            steps.append((int(match.group(1)), name))
        elif name.startswith((PARTIAL_PREFIX, _LEGACY_PARTIAL_PREFIX)):
            logger.warning(f"Ignoring {os.path.join(output_dir, name)}: a checkpoint save that did not finish.")
    for _, name in sorted(steps, reverse=True):
        path = os.path.join(output_dir, name)
        if is_complete_checkpoint(path):
            return path
        logger.warning(f"Ignoring {path}: incomplete (no {TRAINER_STATE_NAME}); trying older checkpoints.")
    return None


def steps_per_rollout(args) -> int:
    """
    Optimizer steps between two generation rounds of a GRPO-style trainer (1 for any other trainer).

    TRL generates once every `steps_per_generation * num_iterations` micro-batches and restarts that count at 0 when
    it resumes, so a checkpoint taken on this boundary resumes exactly where the uninterrupted run would have been;
    one taken inside the window makes the resumed run regenerate the rest of the rollout.
    """
    per_generation = getattr(args, "steps_per_generation", None)
    if not per_generation:
        return 1
    cycle = per_generation * (getattr(args, "num_iterations", 1) or 1)  # micro-batches per rollout
    return cycle // math.gcd(cycle, args.gradient_accumulation_steps)


def _join(thread: threading.Thread | None) -> None:
    """Wait for a helper thread told to stop (it wakes at once); not from that thread itself."""
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout=5 * _LAUNCHER_POLL_S)


# ---------------------------------------------------------------------------------------------------- the callback


class PreemptionCallback(TrainerCallback):
    """
    Stops training cleanly on a preemption signal or Ctrl-C: finish the current rollout (or optimizer step), run the
    evaluation due there, save a checkpoint, stop, and exit with [`PREEMPTION_EXIT_CODE`] ([`INTERRUPT_EXIT_CODE`]
    after Ctrl-C).

    The signal handler only records the signal. At each optimizer step end every process all-reduces its flag (a
    collective of one number, so all processes stop at the same step even when the signal reached only some), and at
    the first step end where the flag is set and the stop point is reached the callback asks the Trainer to save a
    checkpoint (through its normal `_save_checkpoint`, so every process writes its share: RNG states, sharded
    optimizer states) and to stop. An evaluation due at that step (or at the end of the epoch that step completes)
    runs before the save, as it would in an uninterrupted run, so the resumed run continues exactly like one.

    A training process started by `torchrun` or `accelerate launch` also stops this way (exit code 75) when its
    launcher is gone (killed with SIGKILL, or by the out-of-memory killer): it checks every second, instead of
    training on as an orphan.

    A second signal stops at once, without saving: Ctrl-C raises `KeyboardInterrupt`, SIGTERM and SIGUSR1 take their
    default action (the process is killed). [`PreemptionMixin`] makes sure that leaves no incomplete `checkpoint-N`.
    The same signal arriving again within 2 seconds counts as the first one (a launcher forwarding the signal that a
    scheduler also sent every process), and so does a SIGTERM within 2 seconds of Ctrl-C (a terminal's Ctrl-C reaches
    `accelerate launch` and its training process alike, and the launcher then stops that process with SIGTERM).

    The wait for the stop point is bounded by `timeout`: if the stop point is not reached in time (a step that never
    ends, e.g. dynamic sampling refilling a batch no group of which is informative), the process logs why and exits
    with [`PREEMPTION_TIMEOUT_EXIT_CODE`] without saving; the newest complete checkpoint stays the one to resume from.
    The due evaluation and the save, once started, are not bounded by it.

    Time from the signal to the exit: the rest of the current rollout (`stop_at="rollout"`) or optimizer step
    (`"step"`), the due evaluation, plus the save. Give the orchestrator a grace period above that (Kubernetes
    `terminationGracePeriodSeconds`, SLURM `--signal=...@seconds`).

    With a plain `GRPOTrainer`, pass it in `callbacks=[PreemptionCallback()]` (checkpoints are then published by
    transformers directly, not atomically; use [`PreemptionMixin`] for that).

    Args:
        signals (`Sequence[str]`, *optional*, defaults to `("SIGTERM", "SIGUSR1", "SIGINT")`):
            Names of the signals that mean "save and stop" (names the platform lacks are skipped).
        stop_at (`str`, *optional*, defaults to `"rollout"`):
            `"rollout"`: stop at the end of the current generation round's updates (`steps_per_generation *
            num_iterations` micro-batches), so that the resumed run continues exactly like an uninterrupted one.
            `"step"`: stop after the current optimizer step (faster when a rollout has many updates; the resumed run
            regenerates the remainder of the interrupted rollout instead of reusing it).
        exit_code (`int` or `None`, *optional*, defaults to `75`):
            Exit the process with this code (130 after Ctrl-C) at the end of `train()` when training stopped for a
            signal (the callback raises `SystemExit` in `on_train_end`, so add it after callbacks that must see that
            event). `None`: do not exit; check [`preempted`] after `train()` returns.
        timeout (`float` or `None`, *optional*, defaults to `600.0`):
            Seconds from the first signal to the stop point after which the process exits with code 124 without
            saving. `None`: wait without bound.
        rollout_done (`Callable[[], bool]` or `None`, *optional*):
            Whether the current rollout's micro-batches are all used, asked at a step end with `stop_at="rollout"`.
            Default: counted in optimizer steps from the step `train()` started at (exact for TRL's trainers, which
            regenerate a rollout on resume; [`PreemptionMixin`] passes TRL's own micro-batch counter, which a
            [`DAPOTrainer`] restores from a checkpoint taken inside a rollout).
    """

    def __init__(
        self,
        *,
        signals: Sequence[str] = PREEMPTION_SIGNALS,
        stop_at: str = "rollout",
        exit_code: int | None = PREEMPTION_EXIT_CODE,
        timeout: float | None = DEFAULT_PREEMPTION_TIMEOUT_S,
        rollout_done: Callable[[], bool] | None = None,
    ):
        if stop_at not in STOP_POINTS:
            raise ValueError(f"PreemptionCallback(stop_at={stop_at!r}): choose one of {STOP_POINTS}.")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"PreemptionCallback(timeout={timeout!r}): a number of seconds above 0, or None.")
        self.signals = tuple(signals)
        self.stop_at = stop_at
        self.exit_code = exit_code
        self.timeout = timeout
        self.rollout_done = rollout_done
        self.received: int | None = None  # first signal this process received
        self.stopped_at_step: int | None = None  # global step at which training stopped for a signal
        self._received_at = 0.0
        self._start_step = 0
        self._saved = False  # the stop step's checkpoint is saved and no evaluation ran after it
        self._timer: threading.Timer | None = None
        self._previous: dict[int, object] = {}
        self._watch_stop: threading.Event | None = None
        self._watch_thread: threading.Thread | None = None

    @property
    def preempted(self) -> bool:
        """Whether the last `train()` stopped because of a signal (after saving a checkpoint)."""
        return self.stopped_at_step is not None

    @property
    def stop_exit_code(self) -> int:
        """The exit code for a stop caused by [`received`]: 130 after Ctrl-C, else 75 (also on a process only told)."""
        return INTERRUPT_EXIT_CODE if self.received == signal.SIGINT else PREEMPTION_EXIT_CODE

    # -------------------------------------------------------------------------------- signal handlers

    def install(self) -> None:
        """Install the signal handlers (done at `on_train_begin`; a no-op outside the main thread, with a warning)."""
        if self._previous:
            return
        if threading.current_thread() is not threading.main_thread():
            logger.warning("Preemption handling is off: signal handlers can only be installed from the main thread.")
            return
        for name in self.signals:
            signum = getattr(signal, name, None)
            if signum is not None:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        if started_by_a_launcher():
            self._watch_launcher()

    def uninstall(self) -> None:
        """
        Restore the handlers that were there before [`install`] and stop the timeout and the launcher watch. Both
        threads are ended when this returns: they reach the trainer (through `rollout_done`), and a trainer a thread
        still holds cannot be freed before interpreter exit (see `dapo_trl.release_process_group`).
        """
        self._cancel_timer()
        if self._watch_stop is not None:
            self._watch_stop.set()
            _join(self._watch_thread)
            self._watch_stop = self._watch_thread = None
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        now = time.monotonic()
        if self.received is not None:
            if now - self._received_at < _REPEAT_WINDOW_S and _same_request(self.received, signum):
                logger.warning(
                    f"{name} received {now - self._received_at:.2f} s after "
                    f"{signal.Signals(self.received).name}: taken as the same request (a launcher passing it on); "
                    "send a signal again to stop at once."
                )
                return
            self._stop_at_once(signum)
            return
        self._request(signum, now)

    def _request(self, signum: int, now: float) -> None:
        name = signal.Signals(signum).name
        self.received, self._received_at = signum, now
        point = "rollout" if self.stop_at == "rollout" else "step"
        if signum == signal.SIGINT:
            logger.warning(f"Ctrl-C: stopping after this {point} and saving; press again to stop at once.")
        else:
            logger.warning(
                f"{name} received: training stops at the end of the current {point} and saves a checkpoint "
                "(a second signal stops at once, without saving)."
            )
        self._start_timer(name)

    def _watch_launcher(self) -> None:
        # A launcher killed outright (SIGKILL, the out-of-memory killer) passes nothing on: its training processes are
        # re-parented and would train on, unseen, until the end. Its loss is a stop request like SIGTERM.
        launcher = os.getppid()
        if launcher <= 1:
            return
        stop = self._watch_stop = threading.Event()

        def watch() -> None:
            while not stop.wait(_LAUNCHER_POLL_S):
                if os.getppid() != launcher:
                    _stderr_off_the_launchers_pipe()
                    if self.received is None:
                        logger.warning(f"The launcher (process {launcher}) is gone: stopping as on SIGTERM.")
                        self._request(signal.SIGTERM, time.monotonic())
                    return

        self._watch_thread = threading.Thread(target=watch, name="dapo-launcher-watch", daemon=True)
        self._watch_thread.start()

    def _stop_at_once(self, signum: int) -> None:
        name = signal.Signals(signum).name
        logger.warning(f"{name} received again: stopping at once, without saving a checkpoint.")
        self._cancel_timer()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # the default action: the process ends here, as without preemption handling

    def _start_timer(self, name: str) -> None:
        if self.timeout is None:
            return
        self._timer = threading.Timer(self.timeout, self._on_timeout, args=(name,))
        self._timer.daemon = True
        self._timer.start()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            _join(self._timer)
            self._timer = None

    def _on_timeout(self, name: str) -> None:
        point = "rollout" if self.stop_at == "rollout" else "optimizer step"
        logger.error(
            f"{name} was received {self.timeout:g} s ago and training has not reached the end of the current {point} "
            "(a step that does not end: e.g. dynamic sampling refilling a batch in which no group is informative, or "
            f"a hung collective). Exiting with code {PREEMPTION_TIMEOUT_EXIT_CODE} WITHOUT saving a checkpoint "
            "(preemption_timeout); the newest complete checkpoint is the one to resume from."
        )
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        # From this thread: the main thread may be inside a call that does not return (a collective, a refill loop).
        os._exit(PREEMPTION_TIMEOUT_EXIT_CODE)

    # -------------------------------------------------------------------------------- trainer events

    def on_train_begin(self, args, state, control, **kwargs):
        self.received = self.stopped_at_step = None
        self._saved = False
        self._start_step = state.global_step  # TRL counts rollouts from here after a resume
        self.install()

    def on_step_end(self, args, state, control, **kwargs):
        if not self._any_process_signalled(args):
            return
        if self.stop_at == "rollout" and not self._rollout_done(state, args):
            return
        self._cancel_timer()  # the stop point is reached: the due evaluation and the save are not cut short
        self.stopped_at_step = state.global_step
        control.should_training_stop = True
        if not _completes_epoch(state) or args.save_strategy == "best":
            # After the evaluation due at this step, if any (transformers' order). At an epoch end the save comes at
            # on_epoch_end, after the epoch's own evaluation; with save_strategy="best" transformers saves there only
            # for a new best, so save here too.
            control.should_save = True
        logger.warning(f"Stopping at step {state.global_step} for a signal: saving a checkpoint.")

    def on_evaluate(self, args, state, control, **kwargs):
        if self.preempted:
            self._saved = False  # an evaluation after the save moved the RNG state and the log history on

    def on_save(self, args, state, control, **kwargs):
        if self.preempted and state.global_step == self.stopped_at_step:
            self._saved = True

    def on_epoch_end(self, args, state, control, **kwargs):
        if not self.preempted:
            return
        if not _completes_epoch(state):  # training left the epoch early: its evaluation and save are not due
            control.should_evaluate = False
            control.should_save = False
        control.should_save = control.should_save or control.should_evaluate or not self._saved

    def on_train_end(self, args, state, control, **kwargs):
        self.uninstall()
        if self.preempted and self.exit_code is not None:
            code = self.stop_exit_code if self.exit_code == PREEMPTION_EXIT_CODE else self.exit_code
            logger.warning(f"Checkpoint saved at step {self.stopped_at_step}; exiting with code {code}.")
            raise SystemExit(code)

    def _rollout_done(self, state, args) -> bool:
        if self.rollout_done is not None:
            return self.rollout_done()
        return (state.global_step - self._start_step) % steps_per_rollout(args) == 0

    def _any_process_signalled(self, args) -> bool:
        flag = self.received is not None
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            if torch.distributed.get_world_size() > 1:
                value = torch.tensor([float(flag)], device=args.device)
                torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
                flag = bool(value.item())
        return flag


def started_by_a_launcher() -> bool:
    """Whether this process was started by `torchrun` or `accelerate launch` (by the variables they set)."""
    return any(name in os.environ for name in _LAUNCHER_VARIABLES)


def _stderr_off_the_launchers_pipe() -> None:
    """
    Point stderr at stdout (or nowhere) when it is a pipe: accelerate's launcher reads its training process's stderr
    through one, and once the launcher is gone every write there fails (a warning during the save would end it).
    """
    with contextlib.suppress(OSError):
        if not stat.S_ISFIFO(os.fstat(2).st_mode):
            return
        target = 1 if not stat.S_ISFIFO(os.fstat(1).st_mode) else os.open(os.devnull, os.O_WRONLY)
        os.dup2(target, 2)


def _same_request(first: int, then: int) -> bool:
    """
    Whether signal `then`, arriving shortly after `first`, is the same stop request passed on by a launcher: the same
    signal again (a scheduler signalled every process and the launcher forwards its copy), or SIGTERM after Ctrl-C
    (a terminal sends SIGINT to the launcher and its training processes alike, and accelerate's launcher then stops
    its training process with SIGTERM).
    """
    return then == first or (first == signal.SIGINT and then == signal.SIGTERM)


def _completes_epoch(state) -> bool:
    """Whether the step just taken is the last of its epoch (transformers sets `epoch` to a whole number there)."""
    return state.epoch is not None and float(state.epoch).is_integer()


# ---------------------------------------------------------------------------------------------------- the mixin


class PreemptionMixin:
    """
    Mixin for a transformers `Trainer` subclass: atomic checkpoints, auto-resume and preemption handling.

    ```python
    class MyTrainer(PreemptionMixin, GRPOTrainer): ...
    ```

    - **Atomic checkpoints.** `_save_checkpoint` writes `checkpoint-N` inside `<run dir>/_partial-checkpoint-N/`;
      after every process has written its part, the process(es) that save (`args.should_save`) rename it to
      `<run dir>/checkpoint-N` and then rotate old checkpoints (`save_total_limit`). Renaming a folder is atomic on
      one filesystem, so `checkpoint-N` is either absent or complete, for this package's resume logic and for
      transformers' own `get_last_checkpoint` alike. Subclasses that add files to a checkpoint after calling
      `super()._save_checkpoint` wrap their override in [`staged_checkpoint`] so those files are inside before it
      is published. A Hub push that transformers asks for during the save (`push_to_hub` with any `hub_strategy`)
      starts after publishing, from `checkpoint-N`; staging folders are never uploaded.
    - **Auto-resume.** `train()` without `resume_from_checkpoint` resumes from [`latest_complete_checkpoint`] of
      `output_dir` when `args.auto_resume` is true (a fresh start when there is none), and `resume_from_checkpoint=True`
      means the newest *complete* checkpoint. The main process decides and tells the others.
    - **No silent overwrite.** A `train()` that would start at step 0 in an `output_dir` holding a complete checkpoint
      (neither `auto_resume` nor `resume_from_checkpoint`) is refused with the two settings to choose from, unless
      `args.overwrite_output_dir` is true: then that folder's checkpoints are deleted first, so a later resume cannot
      pick one of the old run's.
    - **Preemption.** Unless `args.preemption_handling` is false, `train()` adds a [`PreemptionCallback`]
      (`args.preemption_stop_at`, `args.preemption_timeout`; with `"rollout"` the rollout end is read from TRL's
      micro-batch counter) and, when it stopped training, raises `SystemExit(PREEMPTION_EXIT_CODE)` (130 after
      Ctrl-C) once `train()` has finished its own clean-up.

    Settings are read from `args` with these defaults when absent (e.g. a plain `GRPOConfig`): `auto_resume=False`,
    `overwrite_output_dir=False`, `preemption_handling=True`, `preemption_stop_at="rollout"`, `preemption_timeout=600`.

    With `save_on_each_node=True` (one disk per node), each node's local main process publishes its own copy. On a
    filesystem shared by the nodes keep the default `save_on_each_node=False`: with `True`, two processes would write
    the same files, and the second rename fails with an error naming the setting.
    """

    _checkpoint_staging: str | None = None
    _push_pending = False

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None):
        """
        `Trainer.train`, plus: with `args.auto_resume` and no `resume_from_checkpoint` (or with
        `resume_from_checkpoint=True`), resume from the newest complete checkpoint of `output_dir`; when a preemption
        signal stopped training, raise `SystemExit(75)` once the checkpoint is saved and `train()` has cleaned up.
        """
        args = self.args
        if resume_from_checkpoint is True or (resume_from_checkpoint is None and getattr(args, "auto_resume", False)):
            latest = self._agreed_latest_checkpoint()
            if latest is None and resume_from_checkpoint is True:
                raise ValueError(f"resume_from_checkpoint=True: no complete checkpoint in {args.output_dir}.")
            if latest is not None:
                logger.info(f"Resuming from {latest} (the newest complete checkpoint).")
            resume_from_checkpoint = latest
        elif resume_from_checkpoint is None and self._agreed_latest_checkpoint() is not None:
            self._start_over_or_refuse()
        callback = self._preemption_callback()
        try:
            output = super().train(
                resume_from_checkpoint=resume_from_checkpoint, trial=trial, ignore_keys_for_eval=ignore_keys_for_eval
            )
        finally:
            if callback is not None:
                callback.uninstall()
        if callback is not None and callback.preempted:
            code = callback.stop_exit_code
            logger.warning(
                f"Training stopped for a signal at step {callback.stopped_at_step} with a complete checkpoint; "
                f"exiting with code {code}. {resume_hint(args)}"
            )
            raise SystemExit(code)
        return output

    def _start_over_or_refuse(self) -> None:
        # Checkpoints are never destroyed without an explicit setting: a rerun of the same command is refused.
        args = self.args
        if not getattr(args, "overwrite_output_dir", False):
            raise ValueError(fresh_start_conflict(args.output_dir))
        if args.should_save:
            removed = remove_checkpoints(args.output_dir)
            logger.warning(f"overwrite_output_dir: deleted {', '.join(removed)} of {args.output_dir}; starting over.")
        self.accelerator.wait_for_everyone()

    def _agreed_latest_checkpoint(self) -> str | None:
        from accelerate.utils import broadcast_object_list

        choice = [latest_complete_checkpoint(self.args.output_dir) if self.accelerator.is_main_process else None]
        if self.accelerator.num_processes > 1:
            broadcast_object_list(choice)  # every process must resume from the same step
        return choice[0]

    def _preemption_callback(self) -> PreemptionCallback | None:
        if not getattr(self.args, "preemption_handling", True):
            return None
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, PreemptionCallback):
                return callback
        callback = PreemptionCallback(
            stop_at=getattr(self.args, "preemption_stop_at", "rollout"),
            exit_code=None,
            timeout=getattr(self.args, "preemption_timeout", DEFAULT_PREEMPTION_TIMEOUT_S),
            rollout_done=self._rollout_done,
        )
        self.add_callback(callback)
        return callback

    def _determine_best_metric(self, metrics, trial) -> bool:
        # With save_strategy="best" transformers saves after an evaluation only for a new best; the evaluation that a
        # stop for a signal runs before its save must not cancel that save.
        is_new_best = super()._determine_best_metric(metrics, trial)
        callback = next((c for c in self.callback_handler.callbacks if isinstance(c, PreemptionCallback)), None)
        return is_new_best or (callback is not None and callback.stopped_at_step == self.state.global_step)

    def _rollout_done(self) -> bool:
        """
        Whether the current rollout's micro-batches are all used, by TRL's own micro-batch counter (`_step`), which
        a resumed [`DAPOTrainer`] restores when its checkpoint was taken inside a rollout; 1 rollout per optimizer step
        for trainers without one.
        """
        per_generation = getattr(self.args, "steps_per_generation", None)
        if not per_generation or not isinstance(getattr(self, "_step", None), int):
            return True
        return self._step % (per_generation * (getattr(self, "num_iterations", 1) or 1)) == 0

    # -------------------------------------------------------------------------------- atomic checkpoints

    def _get_output_dir(self, trial) -> str:
        if self._checkpoint_staging is not None:
            return self._checkpoint_staging  # transformers then writes <staging>/checkpoint-N
        return super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):
        with self.staged_checkpoint(trial):
            super()._save_checkpoint(model, trial)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        # transformers starts its background Hub upload from inside `_save_checkpoint`, i.e. from the staging folder,
        # which is renamed away at once, and before files added after it (sampler state) are written: push the
        # published folder instead, once it is complete (see `staged_checkpoint`).
        if self._checkpoint_staging is not None:
            self._push_pending = True
            return
        super()._push_from_checkpoint(checkpoint_folder)

    def _issue_warnings_after_load(self, load_result) -> None:
        # safetensors keeps one copy of tensors a model shares, so a checkpoint of a model whose head is tied to its
        # input embedding (SmolLM2, Qwen2.5-1.5B, the tiny model) "misses" the head: it is loaded with the embedding.
        # transformers warns about it unless the model lists it in `_keys_to_ignore_on_save`; re-tie it silently.
        tied = tied_missing_keys(self.model, load_result.missing_keys)
        if tied:
            self.model.tie_weights()
            logger.debug(f"{sorted(tied)} tied to a loaded parameter: restored with it.")
            load_result = load_result._replace(missing_keys=[k for k in load_result.missing_keys if k not in tied])
        super()._issue_warnings_after_load(load_result)

    @contextlib.contextmanager
    def staged_checkpoint(self, trial=None) -> Iterator[str]:
        """
        Context manager: while it is open, `checkpoint-N` (N the current global step) is written inside
        `_partial-checkpoint-N/`; when it closes without an exception, the checkpoint is published. Every process
        must enter it (it synchronises them). Re-entrant: an inner use yields the same folder and publishes nothing.

        Yields:
            `str`: the folder being written, where extra files for this checkpoint go.
        """
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self._checkpoint_staging is not None:
            yield os.path.join(self._checkpoint_staging, name)
            return
        run_dir = self._get_output_dir(trial)
        staging = os.path.join(run_dir, PARTIAL_PREFIX + name)
        staged, final = os.path.join(staging, name), os.path.join(run_dir, name)
        if self.args.should_save:
            shutil.rmtree(staging, ignore_errors=True)  # left by an interrupted save of the same step
        self.accelerator.wait_for_everyone()
        self._checkpoint_staging = staging
        try:
            yield staged
        finally:
            self._checkpoint_staging = None
        if self.state.best_model_checkpoint == staged:  # transformers recorded the path it wrote to
            self.state.best_model_checkpoint = final
            if self.args.should_save:
                self.state.save_to_json(os.path.join(staged, TRAINER_STATE_NAME))
        self.accelerator.wait_for_everyone()  # every process has written its share (RNG states, shards)
        if self.args.should_save:
            _publish(staged, final, staging, save_on_each_node=self.args.save_on_each_node)
            if self._push_pending:  # transformers asked for a Hub push while the checkpoint was being written
                self._push_pending = False
                self._push_from_checkpoint(final)
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )
        self.accelerator.wait_for_everyone()
        if not self.args.should_save and os.path.isdir(staging):
            shutil.rmtree(staging, ignore_errors=True)  # this node's local copy of files nobody publishes


def _publish(staged: str, final: str, staging: str, *, save_on_each_node: bool) -> None:
    if not os.path.isdir(staged):
        hint = (
            " save_on_each_node=True, but the nodes share this filesystem, so another node already published it: "
            "set save_on_each_node=False."
            if save_on_each_node
            else ""
        )
        raise RuntimeError(f"Checkpoint folder {staged} disappeared before it could be published.{hint}")
    if os.path.exists(final):  # the same step saved again (e.g. a resumed run): replace it
        os.rename(final, os.path.join(staging, "replaced"))
    os.rename(staged, final)
    shutil.rmtree(staging, ignore_errors=True)
    run_dir = os.path.dirname(final)
    for name in os.listdir(run_dir):  # partial folders of saves that were killed: a complete one now exists
        if name.startswith(PARTIAL_PREFIX + PREFIX_CHECKPOINT_DIR):
            shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- restarts


def resume_hint(args) -> str:
    """What to run to continue a stopped run from the newest complete checkpoint of `args.output_dir`."""
    if getattr(args, "auto_resume", False):
        return "Run the same command again to resume (auto_resume is on)."
    latest = latest_complete_checkpoint(args.output_dir) or os.path.join(args.output_dir, "checkpoint-N")
    return (
        f"To resume, run the same command with --auto_resume true (or --resume_from_checkpoint {latest}); "
        "without either a rerun is refused (--overwrite_output_dir true starts over)."
    )


def fresh_start_conflict(output_dir: str | os.PathLike) -> str | None:
    """
    Why a run may not start at step 0 in `output_dir`: it holds a complete checkpoint, which the run's own
    checkpoints would replace step by step. `None` when it holds none.
    """
    latest = latest_complete_checkpoint(output_dir)
    if latest is None:
        return None
    return (
        f"{output_dir} holds complete checkpoints (newest: {latest}); this run would start at step 0 and replace "
        "them. Choose: --auto_resume true (or --resume_from_checkpoint <checkpoint>) to continue that run, or "
        "--overwrite_output_dir true to start over (its checkpoints are deleted first); or use another output_dir."
    )


def remove_checkpoints(output_dir: str | os.PathLike) -> list[str]:
    """Delete the `checkpoint-N` folders (and partially written ones) of `output_dir`; returns their names."""
    output_dir = os.fspath(output_dir)
    names = [
        name
        for name in sorted(os.listdir(output_dir))
        if (_CHECKPOINT_RE.match(name) or name.startswith((PARTIAL_PREFIX, _LEGACY_PARTIAL_PREFIX)))
        and os.path.isdir(os.path.join(output_dir, name))
    ]
    for name in names:
        shutil.rmtree(os.path.join(output_dir, name))
    return names
