"""The installation check must show that training happens; a warning that recurs every step is printed once."""

import logging

import pytest
from _tiny import ScriptedReward, config, scripted_dataset, tiny_model_and_tokenizer

from dapo_trl import DAPOTrainer
from dapo_trl.run.console import format_summary, training_signal


def test_training_signal_says_whether_the_policy_moved():
    moved = [{"dynamic_sampling/informative_frac": 0.0, "grad_norm": 0.0}, {"dynamic_sampling/informative_frac": 0.5}]
    moved.append({"grad_norm": 2.0})
    assert training_signal(moved) == (
        "training signal: informative groups in 1 of 2 generation steps, max grad norm 2: training works"
    )
    frozen = [{"dynamic_sampling/informative_frac": 0.0, "grad_norm": 0.0, "loss": 0.0}] * 4
    assert "informative groups in 0 of 4" in training_signal(frozen)
    assert "NOTHING WAS LEARNED" in training_signal(frozen)
    grpo = [{"frac_reward_zero_std": 0.75, "grad_norm": 0.3}]  # plain GRPO metrics: a quarter of groups vary
    assert training_signal(grpo).endswith("training works")


def test_training_signal_does_not_say_training_works_with_a_zero_learning_rate():
    """Informative groups and a gradient, but `learning_rate: 0` throughout: the weights never moved."""
    history = [{"dynamic_sampling/informative_frac": 0.5, "grad_norm": 1.2, "learning_rate": 0.0}] * 3
    line = training_signal(history)
    assert "training works" not in line and "NOTHING WAS LEARNED" in line and "learning rate 0" in line
    history.append({"dynamic_sampling/informative_frac": 0.5, "grad_norm": 1.0, "learning_rate": 1e-5})  # warm-up
    assert training_signal(history).endswith("training works")


def test_summary_counts_the_underfilled_steps():
    history = [{"dynamic_sampling/underfilled_steps": 1.0}, {"dynamic_sampling/underfilled_steps": 3.0}]
    assert "underfilled steps   3 (warned once" in format_summary("t", [], history)
    assert "underfilled" not in format_summary("t", [], [{"dynamic_sampling/underfilled_steps": 0.0}])


@pytest.mark.integration
def test_an_underfill_every_step_is_warned_once_and_counted(tmp_path, caplog):
    model, tokenizer = tiny_model_and_tokenizer()
    args = config(tmp_path, max_steps=3, dynamic_sampling_max_rounds=2)
    trainer = DAPOTrainer(
        model=model,
        reward_funcs=[ScriptedReward()],
        args=args,
        train_dataset=scripted_dataset(kinds=("easy", "hard")),  # no informative group exists
        processing_class=tokenizer,
    )
    with caplog.at_level(logging.WARNING, logger="dapo_trl.trainer.dynamic_sampling"):
        trainer.train()
    warnings = [r for r in caplog.records if "informative groups a batch needs" in r.getMessage()]
    assert len(warnings) == 1 and "dynamic_sampling/underfilled_steps" in warnings[0].getMessage()
    counts = [h["dynamic_sampling/underfilled_steps"] for h in trainer.state.log_history if "loss" in h]
    assert counts == [1, 2, 3]
    assert "NOTHING WAS LEARNED" in training_signal(trainer.state.log_history)
