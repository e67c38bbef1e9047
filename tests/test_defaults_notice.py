"""After the import swap a run must say which DAPOConfig defaults it runs on, and errors must name them."""

import dataclasses
import logging
from types import SimpleNamespace

import pytest
from _tiny import ScriptedReward, config, scripted_dataset, tiny_model_and_tokenizer
from trl import GRPOConfig

from dapo_trl import DAPOTrainer
from dapo_trl.dapo_config import DAPOConfig, changed_defaults, defaults_notice
from dapo_trl.run.console import DefaultsNoticeCallback


def make(**kwargs):
    return DAPOConfig(**{"output_dir": "/tmp/dapo-notice-test", "use_cpu": True, "bf16": False, **kwargs})


def test_changed_defaults_come_from_the_two_dataclasses():
    changed = changed_defaults()
    assert changed["num_generations"] == (16, 8)
    assert changed["warmup_steps"] == (20, 0) and changed["epsilon_high"] == (0.28, None)
    trl = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    for f in dataclasses.fields(DAPOConfig):
        if f.name in trl and f.default is not dataclasses.MISSING and f.name not in changed:
            assert f.default == trl[f.name], f.name  # nothing that differs is left out


def test_notice_lists_the_defaults_left_unset_with_both_values():
    notice = defaults_notice(make(num_generations=8, per_device_train_batch_size=8))
    assert "warmup_steps=20 (GRPOConfig: 0)" in notice and "epsilon_high=0.28 (GRPOConfig: None)" in notice
    assert "lr_scheduler_type=constant_with_warmup (GRPOConfig: linear)" in notice
    assert "dynamic_sampling" in notice and "overlong_shaping" in notice
    assert "num_generations" not in notice and "per_device_train_batch_size" not in notice  # set by the user
    quiet = dict(num_generations=8, per_device_train_batch_size=8, warmup_steps=0, lr_scheduler_type="linear")
    quiet.update(epsilon_high=None, dynamic_sampling=False, overlong_shaping=False, preemption_handling=False)
    assert defaults_notice(make(**quiet, diagnostics=False)) is None


def test_an_error_about_a_dapo_default_names_it_and_trl_s():
    with pytest.raises(ValueError) as error:
        make(per_device_train_batch_size=8)  # GRPOConfig's batch with DAPOConfig's 16 samples per prompt
    message = str(error.value)
    assert "must hold whole groups of num_generations (16) completions" in message
    assert "num_generations=16 is DAPOConfig's default (GRPOConfig's is 8)" in message
    with pytest.raises(ValueError) as error:
        make(per_device_train_batch_size=6, num_generations=4)  # the user's own values: no note
    assert "DAPOConfig's default" not in str(error.value)


def test_callback_logs_once_on_the_main_process_only(caplog):
    args = make()
    callback = DefaultsNoticeCallback()
    with caplog.at_level(logging.WARNING, logger="dapo_trl.run.console"):
        DefaultsNoticeCallback().on_train_begin(args, SimpleNamespace(is_world_process_zero=False), None)
        assert caplog.records == []
        callback.on_train_begin(args, SimpleNamespace(is_world_process_zero=True), None)
        callback.on_train_begin(args, SimpleNamespace(is_world_process_zero=True), None)
    assert len(caplog.records) == 1 and "warmup_steps=20" in caplog.text


@pytest.mark.integration
def test_training_announces_the_dapo_defaults_once(tmp_path, caplog):
    model, tokenizer = tiny_model_and_tokenizer()
    args = config(tmp_path, max_steps=1, lr_scheduler_type="constant_with_warmup", warmup_steps=20)
    trainer = DAPOTrainer(
        model=model,
        reward_funcs=ScriptedReward(),
        args=args,
        train_dataset=scripted_dataset(),
        processing_class=tokenizer,
    )
    with caplog.at_level(logging.WARNING, logger="dapo_trl.run.console"):
        trainer.train()
    notices = [r for r in caplog.records if "DAPOConfig defaults in effect" in r.getMessage()]
    assert len(notices) == 1
    assert "warmup_steps=20 (GRPOConfig: 0)" in notices[0].getMessage()
    assert "num_generations" not in notices[0].getMessage()


def test_a_trainer_error_about_a_dapo_default_names_it(tmp_path):
    model, tokenizer = tiny_model_and_tokenizer()
    args = make(output_dir=str(tmp_path), dynamic_sampling=False, steps_per_generation=4, max_steps=1)
    with pytest.raises(ValueError) as error:
        DAPOTrainer(
            model=model,
            reward_funcs=ScriptedReward(),
            args=args,
            train_dataset=scripted_dataset(n=2),
            processing_class=tokenizer,
        )
    assert "num_generations=16 is DAPOConfig's default (GRPOConfig's is 8)" in str(error.value)
