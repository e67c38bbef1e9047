"""Detectors of GRPO's failure modes on synthetic metric histories (both directions), the callback, and one tiny run."""

import doctest
import logging
import random

import pytest
from transformers import TrainerControl, TrainerState

from dapo_trl.trainer import diagnostics
from dapo_trl.trainer.diagnostics import (
    DETECTORS,
    DiagnosticsCallback,
    DiagnosticThresholds,
    add_diagnostics,
    diagnose,
    fired_from_history,
    metric_series,
)

T = DiagnosticThresholds()


def history(n: int = 10, every: int = 1, **curves) -> list[dict]:
    """`n` log entries (steps 1..n*every); each keyword is a metric name (`/` written `__`) -> value or f(i)."""
    entries = []
    for i in range(n):
        entry = {"step": (i + 1) * every, "loss": 0.1}
        for name, curve in curves.items():
            value = curve(i) if callable(curve) else curve
            if value is not None:
                entry[name.replace("__", "/")] = value
        entries.append(entry)
    return entries


def falling(start: float, end: float, n: int = 10):
    return lambda i: start + (end - start) * i / (n - 1)


def test_doctests():
    assert doctest.testmod(diagnostics).failed == 0


def test_series_skips_missing_none_and_nan():
    h = [{"step": 1, "a": 1.0}, {"step": 2}, {"step": 3, "a": None}, {"step": 4, "a": float("nan")}, {"a": 5.0}]
    assert metric_series(h, "a") == ([1], [1.0])


def test_thresholds_are_validated():
    with pytest.raises(ValueError, match="min_points"):
        DiagnosticThresholds(window=5, min_points=6)
    with pytest.raises(ValueError, match="entropy_drop"):
        DiagnosticThresholds(entropy_drop=1.5)


# ---------------------------------------------------------------------------------------------- entropy collapse


def test_entropy_collapse_fires_when_entropy_falls_the_clip_binds_and_tokens_are_certain():
    h = history(entropy=falling(0.8, 0.2), clip_ratio__high_mean=0.02, token_prob__mean=falling(0.8, 0.95))
    found = DETECTORS["entropy_collapse"](h, T, {"epsilon_high": 0.2})
    assert found is not None and found.step == 10
    assert "epsilon_high (now 0.2)" in found.advice and "Clip-Higher" in found.advice
    assert found.evidence["entropy_start"] > 0.6 and found.evidence["entropy_end"] < 0.35
    assert "2.00% of tokens" in found.symptom and "0.950" in found.symptom


@pytest.mark.parametrize(
    "curves",
    [
        dict(entropy=0.8, clip_ratio__high_mean=0.02, token_prob__mean=0.95),  # flat entropy
        dict(entropy=falling(0.8, 0.7), clip_ratio__high_mean=0.02, token_prob__mean=0.95),  # slow fall
        dict(entropy=falling(0.8, 0.2), clip_ratio__high_mean=0.02, token_prob__mean=0.6),  # tokens not certain
        dict(entropy=falling(0.8, 0.2), clip_ratio__high_mean=0.0),  # GRPO without token_prob: clip must bind
    ],
    ids=["flat", "gentle-fall", "uncertain", "no-clip-no-prob"],
)
def test_entropy_collapse_stays_silent(curves):
    assert DETECTORS["entropy_collapse"](history(**curves), T) is None


def test_entropy_collapse_without_clip_binding_blames_the_updates_not_the_clip():
    h = history(entropy=falling(0.8, 0.2), clip_ratio__high_mean=0.0, token_prob__mean=0.95)
    found = DETECTORS["entropy_collapse"](h, T, {"learning_rate": 0.01})
    assert found is not None
    assert "Clip-Higher alone will not stop it" in found.advice and "learning_rate (now 0.01)" in found.advice


def test_entropy_collapse_on_plain_grpo_metrics_needs_the_clip():
    h = history(entropy=falling(0.8, 0.2), clip_ratio__high_mean=0.01)
    assert DETECTORS["entropy_collapse"](h, T) is not None


def test_too_few_points_give_no_verdict():
    h = history(3, entropy=falling(0.8, 0.1, 3), clip_ratio__high_mean=0.05, token_prob__mean=0.99)
    assert DETECTORS["entropy_collapse"](h, T) is None


def test_only_the_window_counts():
    """An old collapse followed by a long flat stretch is no longer reported."""
    h = history(30, entropy=lambda i: 0.8 if i < 5 else 0.2, clip_ratio__high_mean=0.05, token_prob__mean=0.97)
    assert DETECTORS["entropy_collapse"](h, T) is None
    assert DETECTORS["entropy_collapse"](h[:9], T) is not None


# ---------------------------------------------------------------------------------------------- vanishing signal


def test_vanishing_signal_with_dynamic_sampling_names_too_easy_data():
    h = history(
        dynamic_sampling__informative_frac=0.1,
        dynamic_sampling__all_correct_frac=0.85,
        dynamic_sampling__all_wrong_frac=0.05,
        dynamic_sampling__rounds=1.2,
        dynamic_sampling__underfilled=0.0,
    )
    found = DETECTORS["vanishing_signal"](h, T)
    assert found is not None and "10%" in found.symptom
    assert "too easy" in found.advice and "dynamic_sampling_max_rounds" not in found.advice
    assert "dynamic_sampling_skip" in found.advice  # the remedy for groups that are always solved
    assert "dynamic_sampling_skip" not in DETECTORS["vanishing_signal"](h, T, {"dynamic_sampling_skip": True}).advice


def test_vanishing_signal_on_underfilled_batches_names_max_rounds():
    h = history(
        dynamic_sampling__informative_frac=0.35,
        dynamic_sampling__all_correct_frac=0.05,
        dynamic_sampling__all_wrong_frac=0.6,
        dynamic_sampling__rounds=4.0,
        dynamic_sampling__underfilled=0.5,
    )
    found = DETECTORS["vanishing_signal"](h, T, {"dynamic_sampling_max_rounds": 4})
    assert found is not None
    assert "too hard" in found.advice and "dynamic_sampling_max_rounds (now 4)" in found.advice


def test_vanishing_signal_with_no_informative_group_does_not_advise_more_rounds():
    h = history(
        dynamic_sampling__informative_frac=0.0,
        dynamic_sampling__all_correct_frac=0.0,
        dynamic_sampling__all_wrong_frac=1.0,
        dynamic_sampling__rounds=4.0,
        dynamic_sampling__underfilled=1.0,
    )
    found = DETECTORS["vanishing_signal"](h, T, {"dynamic_sampling_max_rounds": 4})
    assert found is not None and "too hard" in found.advice
    assert "dynamic_sampling_max_rounds" not in found.advice  # 0 informative: more rounds find none either


def test_vanishing_signal_silent_when_groups_are_informative():
    h = history(
        dynamic_sampling__informative_frac=0.6, dynamic_sampling__rounds=1.0, dynamic_sampling__underfilled=0.0
    )
    assert DETECTORS["vanishing_signal"](h, T) is None


def test_vanishing_signal_on_plain_grpo_uses_zero_std_groups():
    found = DETECTORS["vanishing_signal"](history(frac_reward_zero_std=0.9), T)
    assert (
        found is not None
        and "dynamic_sampling" in found.advice
        and found.evidence["frac_reward_zero_std"] == pytest.approx(0.9)
    )
    assert DETECTORS["vanishing_signal"](history(frac_reward_zero_std=0.4), T) is None


def test_generation_metrics_logged_every_few_steps_are_read():
    """With steps_per_generation > 1, generation metrics appear only in some entries."""
    h = history(40, frac_reward_zero_std=lambda i: 0.9 if i % 4 == 0 else None)
    found = DETECTORS["vanishing_signal"](h, T)
    assert found is not None and "steps 1-37" in found.symptom


# ---------------------------------------------------------------------------------------------- lengths


def test_length_explosion_quotes_correct_and_incorrect_lengths():
    h = history(
        completions__mean_length=falling(100, 300),
        completions__correct_mean_length=falling(100, 120),
        completions__incorrect_mean_length=falling(100, 400),
    )
    found = DETECTORS["length_explosion"](h, T, {"loss_type": "grpo", "overlong_shaping": False})
    assert found is not None and DETECTORS["length_collapse"](h, T) is None
    assert "incorrect" in found.symptom and "loss_type='dapo'" in found.advice and "overlong_shaping" in found.advice


def test_length_explosion_advice_skips_what_is_already_set():
    h = history(completions__mean_length=falling(100, 300))
    found = DETECTORS["length_explosion"](h, T, {"loss_type": "dapo", "overlong_shaping": True})
    assert "loss_type" not in found.advice and "overlong_buffer_len" in found.advice


def test_length_collapse():
    h = history(completions__mean_length=falling(300, 60))
    found = DETECTORS["length_collapse"](h, T)
    assert found is not None and DETECTORS["length_explosion"](h, T) is None
    assert found.evidence["length_end"] < 0.5 * found.evidence["length_start"]


@pytest.mark.parametrize(
    "curve",
    [falling(100, 120), falling(100, 80), falling(1, 2.5), lambda i: 100 + 20 * (-1) ** i],
    ids=["gentle-growth", "gentle-shrink", "tiny-absolute", "noisy-flat"],
)
def test_length_detectors_stay_silent(curve):
    h = history(completions__mean_length=curve)
    assert DETECTORS["length_explosion"](h, T) is None and DETECTORS["length_collapse"](h, T) is None


# ---------------------------------------------------------------------------------------------- truncation


def test_truncation_growth_prefers_the_overlong_metric():
    h = history(overlong__truncated_ratio=falling(0.01, 0.3), completions__clipped_ratio=0.0)
    found = DETECTORS["truncation_growth"](h, T, {"overlong_shaping": False, "max_completion_length": 512})
    assert found is not None and "overlong/truncated_ratio" in found.symptom
    assert "turn on overlong_shaping" in found.advice and "max_completion_length (now 512)" in found.advice


def test_truncation_growth_falls_back_to_trl_clipped_ratio():
    found = DETECTORS["truncation_growth"](history(completions__clipped_ratio=falling(0.0, 0.2)), T)
    assert found is not None and "completions/clipped_ratio" in found.symptom


@pytest.mark.parametrize(
    "curve", [0.9, falling(0.0, 0.03), falling(0.3, 0.05)], ids=["high-but-flat", "below-minimum", "falling"]
)
def test_truncation_growth_stays_silent(curve):
    assert DETECTORS["truncation_growth"](history(overlong__truncated_ratio=curve), T) is None


# ---------------------------------------------------------------------------------------------- reward hacking


def with_evals(train: list[dict], accuracy: list[float], every: int) -> list[dict]:
    out = []
    for entry in train:
        out.append(entry)
        if entry["step"] % every == 0 and entry["step"] // every <= len(accuracy):
            out.append({"step": entry["step"], "eval_accuracy": accuracy[entry["step"] // every - 1]})
    return out


def test_reward_hacking_fires_when_reward_rises_and_heldout_accuracy_does_not():
    train = history(30, reward=falling(-0.5, 0.8, 30), reward_std=0.9)
    h = with_evals(train, [0.40, 0.41, 0.38], every=10)
    found = DETECTORS["reward_hacking"](h, T)
    assert found is not None and found.step == 30
    assert "0.4 -> 0.38" in found.symptom and "eval_accuracy" in found.symptom


def test_reward_hacking_silent_when_heldout_accuracy_follows():
    train = history(30, reward=falling(-0.5, 0.8, 30), reward_std=0.9)
    assert DETECTORS["reward_hacking"](with_evals(train, [0.40, 0.55, 0.70], every=10), T) is None


def test_reward_hacking_silent_when_reward_is_flat_or_never_evaluated():
    flat = history(30, reward=lambda i: 0.1 + 0.02 * (-1) ** i, reward_std=0.9)
    assert DETECTORS["reward_hacking"](with_evals(flat, [0.40, 0.40, 0.39], every=10), T) is None
    rising = history(30, reward=falling(-0.5, 0.8, 30), reward_std=0.9)
    assert DETECTORS["reward_hacking"](rising, T) is None


def test_reward_hacking_reads_a_custom_heldout_metric():
    train = history(30, reward=falling(-0.5, 0.8, 30), reward_std=0.9)
    h = [
        {("eval_pass@1" if k == "eval_accuracy" else k): v for k, v in e.items()}
        for e in with_evals(train, [0.4, 0.4, 0.4], 10)
    ]
    assert DETECTORS["reward_hacking"](h, T) is None
    assert DETECTORS["reward_hacking"](h, DiagnosticThresholds(heldout_keys=("eval_pass@1",))) is not None


# ---------------------------------------------------------------------------------------------- a healthy run


def test_a_healthy_noisy_run_fires_nothing():
    rng = random.Random(0)
    h = history(
        60,
        entropy=lambda i: 0.5 - 0.001 * i + rng.uniform(-0.03, 0.03),
        clip_ratio__high_mean=lambda i: rng.uniform(0, 0.004),
        token_prob__mean=lambda i: 0.93 + rng.uniform(-0.01, 0.01),
        completions__mean_length=lambda i: 200 + i + rng.uniform(-15, 15),
        overlong__truncated_ratio=lambda i: rng.uniform(0, 0.02),
        dynamic_sampling__informative_frac=lambda i: rng.uniform(0.4, 0.7),
        dynamic_sampling__rounds=1.0,
        dynamic_sampling__underfilled=0.0,
        reward=lambda i: -0.2 + 0.005 * i + rng.uniform(-0.05, 0.05),
        reward_std=0.9,
    )
    for end in range(1, len(h) + 1):
        assert all(d is None for d in diagnose(h[:end]).values()), end


# ---------------------------------------------------------------------------------------------- callback


class FakeTrainer:
    """What the callback and `add_diagnostics` touch: `state`, `callback_handler.callbacks`, and `Trainer.log`."""

    def __init__(self, callback):
        self.state = TrainerState()
        self.control = TrainerControl()
        self.callback_handler = type("Handler", (), {"callbacks": ["printer"]})()
        add_diagnostics(self, callback)

    def log(self, step: int, logs: dict, args=None):
        self.state.global_step = step
        self.state.log_history.append({**logs, "step": step})  # as transformers.Trainer.log does
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, DiagnosticsCallback):
                callback.on_log(args, self.state, self.control, logs=logs)


def test_callback_flags_every_log_and_warns_once(caplog):
    callback = DiagnosticsCallback()
    trainer = FakeTrainer(callback)
    assert trainer.callback_handler.callbacks[0] is callback  # ahead of the reporting integrations
    curve = falling(100, 300, 10)
    seen = []
    with caplog.at_level(logging.WARNING, logger="dapo_trl.trainer.diagnostics"):
        for i in range(14):
            logs = {"completions/mean_length": curve(min(i, 9))}
            trainer.log(i + 1, logs)
            seen.append(logs["diagnostics/length_explosion"])
            assert (
                trainer.state.log_history[-1]["diagnostics/length_explosion"] == logs["diagnostics/length_explosion"]
            )
            assert set(k for k in logs if k.startswith("diagnostics/")) == {f"diagnostics/{n}" for n in DETECTORS}
    warnings = [r for r in caplog.records if "length_explosion" in r.getMessage()]
    assert len(warnings) == 1 and "mean completion length went" in warnings[0].getMessage()
    assert seen[:3] == [0.0, 0.0, 0.0] and seen[9] == 1.0  # fires once the window shows the growth
    first = seen.index(1.0) + 1
    assert callback.diagnoses["length_explosion"].step == first
    assert fired_from_history(trainer.state.log_history) == {"length_explosion": first}


def test_callback_ignores_the_end_of_training_summary():
    trainer = FakeTrainer(DiagnosticsCallback())
    logs = {"train_runtime": 1.0, "train_loss": 0.1}
    trainer.log(5, logs)
    assert not any(k.startswith("diagnostics/") for k in logs)


def test_resumed_run_does_not_warn_again(caplog):
    callback = DiagnosticsCallback()
    state = TrainerState()
    state.log_history = [{"step": 3, "diagnostics/entropy_collapse": 1.0}]
    callback.on_train_begin(None, state, TrainerControl())
    assert callback.diagnoses["entropy_collapse"].step == 3


def test_add_diagnostics_does_not_duplicate():
    callback = DiagnosticsCallback()
    trainer = FakeTrainer(callback)
    trainer.callback_handler.callbacks.append(trainer.callback_handler.callbacks.pop(0))  # moved last
    assert add_diagnostics(trainer) is callback
    assert trainer.callback_handler.callbacks == [callback, "printer"]


def test_callback_quotes_the_run_settings():
    from dapo_trl import DAPOConfig

    args = DAPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, epsilon_high=0.2, report_to="none")
    trainer = FakeTrainer(DiagnosticsCallback())
    curve = falling(0.8, 0.2, 10)
    for i in range(10):
        trainer.log(i + 1, {"entropy": curve(i), "clip_ratio/high_mean": 0.02, "token_prob/mean": 0.95}, args=args)
    assert "epsilon_high (now 0.2)" in trainer.callback_handler.callbacks[0].diagnoses["entropy_collapse"].advice


# ---------------------------------------------------------------------------------------------- a tiny run


def share_of_a(completions, **kwargs):
    """Rewards completions made of the letter `a`: its optimum is a deterministic policy."""
    return [c.count("a") / max(1, len(c)) for c in completions]


@pytest.mark.integration
def test_symmetric_clipping_with_many_updates_per_rollout_makes_entropy_collapse_fire(tmp_path, caplog):
    """
    A deliberately bad run: symmetric clipping (epsilon_high = epsilon = 0.2), 4 updates per rollout at a high learning
    rate, and a reward whose optimum is one repeated letter. A short warm-up first gives the policy a spread of letters
    to lose (entropy ~2 nats). DAPOTrainer's default callback must flag the collapse while it trains (~6 s on CPU).
    """
    from _tiny import config, tiny_model_and_tokenizer
    from datasets import Dataset

    from dapo_trl import DAPOTrainer
    from dapo_trl.run.toy import warmup_sft
    from dapo_trl.trainer.diagnostics import fired_diagnoses

    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    rng = random.Random(0)
    targets = ["".join(rng.choice("abcd") for _ in range(6)) for _ in range(64)]
    dataset = Dataset.from_dict({"prompt": [f"q{i}?\n" for i in range(64)], "target": targets})
    warmup_sft(model, tokenizer, dataset, steps=60, lr=3e-3, warmup_steps=5, stop_accuracy=None, progress=False)
    args = config(
        tmp_path,
        max_steps=40,
        epsilon_high=0.2,  # the bad settings
        num_iterations=4,
        learning_rate=1e-2,
        per_device_train_batch_size=16,
        overlong_shaping=False,
        dynamic_sampling_tolerance=0.01,
    )
    trainer = DAPOTrainer(
        model=model, reward_funcs=share_of_a, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    assert isinstance(trainer.callback_handler.callbacks[0], DiagnosticsCallback)  # on by default, ahead of reporters
    with caplog.at_level(logging.WARNING, logger="dapo_trl.trainer.diagnostics"):
        trainer.train()

    fired = {d.name: d for d in fired_diagnoses(trainer)}
    assert "entropy_collapse" in fired, [e.get("entropy") for e in trainer.state.log_history]
    collapse = fired["entropy_collapse"]
    assert collapse.evidence["entropy_end"] < 0.7 * collapse.evidence["entropy_start"]
    assert collapse.evidence["token_prob"] >= 0.9
    flags = [
        e["diagnostics/entropy_collapse"] for e in trainer.state.log_history if "diagnostics/entropy_collapse" in e
    ]
    assert flags[0] == 0.0 and 1.0 in flags
    assert fired_from_history(trainer.state.log_history)["entropy_collapse"] == collapse.step
    assert sum("entropy_collapse at step" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.integration
def test_diagnostics_false_registers_no_callback(tmp_path):
    from _tiny import ScriptedReward, config, scripted_dataset, tiny_model_and_tokenizer

    from dapo_trl import DAPOTrainer

    model, tokenizer = tiny_model_and_tokenizer()
    trainer = DAPOTrainer(
        model=model,
        reward_funcs=ScriptedReward(),
        args=config(tmp_path, diagnostics=False),
        train_dataset=scripted_dataset(),
        processing_class=tokenizer,
    )
    assert not any(isinstance(c, DiagnosticsCallback) for c in trainer.callback_handler.callbacks)


# ---------------------------------------------------------------------------------------------- the setting


def test_the_setting_is_validated_and_reachable_from_yaml_and_the_command_line(tmp_path):
    from trl import TrlParser

    from dapo_trl import DAPOConfig

    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    assert DAPOConfig(**base).diagnostics is True
    with pytest.raises(TypeError, match="diagnostics must be a bool"):
        DAPOConfig(**base, diagnostics="no")
    parser = TrlParser((DAPOConfig,))
    (args,) = parser.parse_args_and_config(["--output_dir", str(tmp_path), "--use_cpu", "--diagnostics", "false"])
    assert args.diagnostics is False
    config = tmp_path / "run.yaml"
    config.write_text(f"output_dir: {tmp_path}\nuse_cpu: true\nbf16: false\ndiagnostics: false\n")
    (args,) = parser.parse_args_and_config(["--config", str(config)])
    assert args.diagnostics is False
