"""Bad input reaching the trainer gets a clear error naming the culprit (the reward, the column, the file, the
setting), or a defined result; never a silent wrong answer, a deep crash or a hang."""

import logging
import os

import numpy as np
import pytest
import torch
from _tiny import Recorder, ScriptedReward, config, scripted_dataset, tiny_model_and_tokenizer, tiny_trainer
from datasets import Dataset

from dapo_trl.dapo_trainer import BUFFER_STATE_NAME, SAMPLER_STATE_NAME
from dapo_trl.trainer.reward_checks import check_reward_output

pytestmark = pytest.mark.integration


def make(tmp_path, reward=None, dataset=None, **overrides):
    model, tokenizer = tiny_model_and_tokenizer()
    rewards = reward if isinstance(reward, list) else [reward or ScriptedReward()]
    return Recorder(
        model=model,
        reward_funcs=rewards,
        args=config(tmp_path, **overrides),
        train_dataset=dataset if dataset is not None else scripted_dataset(),
        processing_class=tokenizer,
    )


# ---------------------------------------------------------------- class 1 and 4: rewards that are not rewards


def reward_returning(value):
    def bad_reward(completions, **kwargs):
        return value(len(completions)) if callable(value) else value

    return bad_reward


@pytest.mark.parametrize(
    "output,match",
    [
        (lambda n: [float("nan")] * n, "returned NaN"),
        (lambda n: [float("inf")] * n, "must be finite"),
        (lambda n: [-float("inf")] + [0.0] * (n - 1), "must be finite"),
        (lambda n: [1e30] * n, "at most 1e"),
        (lambda n: ["1.0"] * n, "rewards must be numbers"),
        (1.0, "returned a float"),
        (lambda n: [0.0] * (n - 1), "rewards for"),
        (lambda n: {"reward": 1.0}, "returned a dict"),
    ],
)
def test_a_reward_breaking_the_contract_is_named(tmp_path, output, match, caplog):
    trainer = make(tmp_path, reward=reward_returning(output), max_steps=1)
    with caplog.at_level(logging.WARNING), pytest.raises(ValueError, match=match) as error:
        trainer.train()
    assert "'bad_reward'" in str(error.value)
    assert "All reward functions returned None" not in caplog.text  # the error is the one message


def test_rows_no_reward_can_score_are_said_once(tmp_path, caplog):
    def partial(completions, kind, **kwargs):
        return [None if k == "hard" else 1.0 if i % 2 else 0.0 for i, k in enumerate(kind)]

    trainer = make(tmp_path, reward=partial, max_steps=2, dynamic_sampling_max_rounds=3)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    messages = [r.getMessage() for r in caplog.records]
    trl = [i for i, m in enumerate(messages) if "All reward functions returned None" in m]
    said = [i for i, m in enumerate(messages) if "No reward function could score" in m]
    assert len(trl) == 1 and len(said) == 1 and trl[0] < said[0]  # TRL's warning, as GRPOTrainer logs it, then ours
    assert caplog.records[trl[0]].name == "trl.trainer.grpo_trainer" and "e.g. prompt 'q" in messages[said[0]]


def test_reward_output_check_accepts_numbers_bools_none_and_zero_dim_tensors():
    rewards, problem = check_reward_output("r", [1, None, 0.5, torch.tensor(2.0)], 4)
    assert problem is None and rewards == [1.0, None, 0.5, 2.0]
    # Bools are scores as in TRL (`[pred == gold for ...]`), whether Python, numpy or torch ones.
    values = [True, False, np.bool_(True), np.bool_(False), torch.tensor(True)]
    assert check_reward_output("r", values, 5) == ([1.0, 0.0, 1.0, 0.0, 1.0], None)


def test_a_reward_returning_bools_trains_as_in_grpo(tmp_path, caplog):
    def matches(completions, kind, **kwargs):
        return [ScriptedReward()(completions, kind)[i] > 0 for i in range(len(completions))]

    trainer = make(tmp_path, reward=matches, max_steps=1)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "All reward functions returned None" not in caplog.text
    assert trainer.state.log_history[0]["rewards/matches/mean"] == pytest.approx(0.5, abs=0.25)


class RewardClass:
    def __call__(self, completions, **kwargs):
        return [0.0] * len(completions)


def test_a_reward_class_or_a_reward_name_is_refused_at_construction(tmp_path):
    with pytest.raises(TypeError, match="RewardClass.*pass an instance, e.g. RewardClass()"):
        make(tmp_path, reward=RewardClass)
    with pytest.raises(ValueError, match="'math_verifier'.*no folder of that name"):
        make(tmp_path, reward="math_verifier")
    with pytest.raises(TypeError, match="not callable"):
        make(tmp_path, reward=[ScriptedReward(), 3])


def test_reward_functions_with_the_same_name_are_named(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        make(tmp_path, reward=[ScriptedReward(), ScriptedReward()], dynamic_sampling_reward="total")
    assert "share the name(s) ['scripted']" in caplog.text
    with pytest.raises(ValueError, match="names several reward functions"):
        make(tmp_path, reward=[ScriptedReward(), ScriptedReward()], dynamic_sampling_reward="scripted")


# ---------------------------------------------------------------- class 3: data of the wrong shape


def test_missing_prompt_column_and_empty_prompts_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"no 'prompt' column \(its columns are \['question', 'kind'\]\)"):
        make(tmp_path, dataset=Dataset.from_dict({"question": ["q?"] * 8, "kind": ["mixed"] * 8}))
    conversational = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "  "}]]
    with pytest.raises(ValueError, match=r"1 empty prompts \(rows \[1\]\)"):
        make(tmp_path, dataset=Dataset.from_dict({"prompt": conversational, "kind": ["mixed"] * 2}))


def long_prompts(n=8, length=300):
    return Dataset.from_dict(
        {"prompt": [f"q{i}?" + "1+" * (length // 2) + "\n" for i in range(n)], "kind": ["mixed"] * n}
    )


def test_a_prompt_longer_than_the_context_is_refused_at_construction_naming_its_row(tmp_path):
    dataset = Dataset.from_dict({"prompt": ["short\n", "1+" * 100 + "\n", "ok\n"], "kind": ["mixed"] * 3})
    with pytest.raises(
        ValueError, match=r"1 training prompts are longer than the model's context of 128 tokens \(row 1"
    ):
        make(tmp_path, dataset=dataset)


@pytest.mark.parametrize("side", ["left", "right"])
def test_max_prompt_length_cuts_long_prompts_on_the_chosen_side(tmp_path, side):
    trainer = make(tmp_path, dataset=long_prompts(), max_steps=1, max_prompt_length=12, prompt_truncation_side=side)
    trainer.train()
    texts = trainer.processing_class.batch_decode(trainer.recorded[0]["prompt_ids"], skip_special_tokens=True)
    assert all(len(t) <= 12 for t in texts)
    assert all(t.endswith("\n") for t in texts) == (side == "left")  # "left" keeps the end of the prompt
    assert trainer.state.log_history[0]["prompts/truncated_ratio"] == 1.0


def test_prompt_truncation_side_error_refuses_long_prompts(tmp_path):
    trainer = make(tmp_path, dataset=long_prompts(), max_steps=1, max_prompt_length=12, prompt_truncation_side="error")
    with pytest.raises(ValueError, match="longer than max_prompt_length=12"):
        trainer.train()


# ---------------------------------------------------------------- class 5: checkpoints


def checkpoint(tmp_path, steps=2, **overrides):
    trainer = make(tmp_path / "run", max_steps=steps, save_strategy="steps", save_steps=steps, **overrides)
    trainer.train()
    return tmp_path / "run" / f"checkpoint-{steps}"


@pytest.mark.parametrize("content", [b"", b"not a zip file", b"PK\x03\x04 truncated"])
def test_a_garbage_sampler_state_names_the_file_and_the_way_out(tmp_path, content):
    folder = checkpoint(tmp_path)
    (folder / SAMPLER_STATE_NAME).write_bytes(content)
    trainer = make(tmp_path / "again", max_steps=3)
    with pytest.raises(ValueError, match=f"{SAMPLER_STATE_NAME} is not a readable dapo-trl state file.*Delete it"):
        trainer.train(resume_from_checkpoint=str(folder))


def test_a_foreign_sampler_state_is_named(tmp_path):
    folder = checkpoint(tmp_path)
    torch.save([1, 2, 3], folder / SAMPLER_STATE_NAME)
    trainer = make(tmp_path / "again", max_steps=3)
    with pytest.raises(ValueError, match="holds a list, not a dapo-trl state dict"):
        trainer.train(resume_from_checkpoint=str(folder))


def test_a_sampler_state_with_other_keys_names_the_file_and_what_it_lacks(tmp_path):
    folder = checkpoint(tmp_path)
    torch.save({"step": 2, "weights": torch.zeros(2)}, folder / SAMPLER_STATE_NAME)
    trainer = make(tmp_path / "again", max_steps=3)
    with pytest.raises(ValueError, match=rf"{SAMPLER_STATE_NAME} lacks the entries \['stream', 'planner'.*Delete it"):
        trainer.train(resume_from_checkpoint=str(folder))


def test_a_generation_buffer_with_other_keys_names_the_file_and_what_it_lacks(tmp_path):
    folder = checkpoint(tmp_path, steps=1, steps_per_generation=2, gradient_accumulation_steps=1)
    buffer = folder / BUFFER_STATE_NAME.format(rank=0)
    assert buffer.is_file(), "the test needs a checkpoint saved in the middle of a generation batch"
    torch.save({"step": 1}, buffer)
    trainer = make(tmp_path / "again", max_steps=3, steps_per_generation=2, gradient_accumulation_steps=1)
    with pytest.raises(ValueError, match=r"rank0.pt lacks the entries \['processes', 'buffer'\].*Delete it"):
        trainer.train(resume_from_checkpoint=str(folder))


def test_resuming_with_a_smaller_dataset_is_named(tmp_path):
    folder = checkpoint(tmp_path)
    trainer = make(tmp_path / "again", dataset=scripted_dataset(24), max_steps=3)
    with pytest.raises(ValueError, match="training set of 48 prompts, but this run's has 24"):
        trainer.train(resume_from_checkpoint=str(folder))


def test_resuming_carried_groups_with_another_group_size_is_named(tmp_path):
    folder = checkpoint(tmp_path, steps=1, dynamic_sampling_carry_over=True, dynamic_sampling_margin=6.0)
    state = torch.load(folder / SAMPLER_STATE_NAME, weights_only=True)
    assert state["carry"] is not None, "the test needs a checkpoint with carried groups"
    trainer = make(tmp_path / "again", max_steps=3, num_generations=2, dynamic_sampling_carry_over=True)
    with pytest.raises(ValueError, match="carries groups of 4 completions but this run uses num_generations=2"):
        trainer.train(resume_from_checkpoint=str(folder))


def test_resuming_without_the_sampler_state_restarts_the_stream_with_a_warning(tmp_path, caplog):
    folder = checkpoint(tmp_path)
    os.remove(folder / SAMPLER_STATE_NAME)
    trainer = make(tmp_path / "again", max_steps=3)
    with caplog.at_level(logging.WARNING):
        trainer.train(resume_from_checkpoint=str(folder))
    assert "restarts its prompt stream" in caplog.text


# ---------------------------------------------------------------- class 9: never hang


def none_reward(completions, **kwargs):
    return [None] * len(completions)


@pytest.mark.timeout(120)
def test_following_the_underfill_advice_with_a_reward_that_scores_nothing_does_not_hang(tmp_path, caplog):
    trainer = make(tmp_path, reward=none_reward, max_steps=2, dynamic_sampling_max_rounds=100000)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    rounds = [h["dynamic_sampling/rounds"] for h in trainer.state.log_history if "dynamic_sampling/rounds" in h]
    assert rounds == [1.0, 1.0]
    assert "No completion of this batch could be scored" in caplog.text


def test_constant_reward_advice_tells_all_wrong_from_a_reward_that_ignores_the_completion():
    from dapo_trl.trainer.reward_checks import constant_reward_advice

    wrong = constant_reward_advice(-1.0, filters=True, correct_value=1.0)  # a verifier on prompts the model fails
    assert "scored wrong" in wrong and "easier prompts" in wrong and "dynamic_sampling_reward" not in wrong
    right = constant_reward_advice(1.0, filters=True, correct_value=1.0)
    assert "too easy" in right and "dynamic_sampling_reward" not in right
    unknown = constant_reward_advice(1.0, filters=True, correct_value=None)  # a reward with no correct value
    assert "does not look at the completion, set dynamic_sampling_reward" in unknown


def test_a_verifier_that_scores_every_completion_wrong_is_not_called_blind(tmp_path, caplog):
    """The model is simply always wrong: the warning must not advise another dynamic_sampling_reward."""
    trainer = tiny_trainer(
        tmp_path, dataset=scripted_dataset(kinds=("hard",)), max_steps=1, dynamic_sampling_max_rounds=2
    )
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "'scripted' returned the same value -1 for all" in caplog.text
    assert "Every completion was scored wrong" in caplog.text
    assert "If it does not look at the completion" not in caplog.text


def test_a_tolerance_as_wide_as_the_rewards_gap_is_refused_at_start(tmp_path):
    class ZeroOne(ScriptedReward):
        correct_reward, incorrect_reward = 1.0, 0.0

    with pytest.raises(ValueError, match=r"dynamic_sampling_tolerance=1.5 .* gap of 1 .*'scripted'"):
        make(tmp_path, reward=ZeroOne(), dynamic_sampling_tolerance=1.5)
    make(tmp_path, reward=ZeroOne(), dynamic_sampling_tolerance=0.5)  # below the gap: accepted
