"""DAPOTrainer end to end on a tiny local model (CPU)."""

import pytest
import torch
from _tiny import (
    GradientCapture,
    Recorder,
    ScriptedReward,
    config,
    reference_gradients,
    scripted_dataset,
    tiny_model_and_tokenizer,
)

from dapo_trl.dapo_trainer import DAPOTrainer

pytestmark = pytest.mark.integration


def run_and_compare(tmp_path, **overrides):
    model, tokenizer = tiny_model_and_tokenizer()
    args = config(tmp_path, **overrides)
    trainer = Recorder(
        model=model,
        reward_funcs=[ScriptedReward()],
        args=args,
        train_dataset=scripted_dataset(),
        processing_class=tokenizer,
    )
    capture = GradientCapture(trainer)
    trainer.add_callback(capture)
    trainer.train()
    assert len(capture.steps) == args.max_steps
    reference_model, _ = tiny_model_and_tokenizer()  # a fresh copy: accelerate patches the trained model's forward
    for step in capture.steps:
        assert len(step["batches"]) == args.gradient_accumulation_steps
        reference_model.load_state_dict(step["params"])
        expected = reference_gradients(
            reference_model, step["batches"], epsilon_low=args.epsilon, epsilon_high=args.epsilon_high
        )
        for name, grad in step["grads"].items():
            torch.testing.assert_close(grad, expected[name], atol=1e-6, rtol=1e-5, msg=name)
    return trainer, capture


def test_gradient_equals_token_mean_over_the_step_with_grad_accumulation(tmp_path):
    run_and_compare(tmp_path, gradient_accumulation_steps=4, per_device_train_batch_size=4, max_steps=2)


def test_gradient_exact_with_more_updates_per_generation_and_iterations(tmp_path):
    # 2 optimizer steps per generation batch, each generation replayed twice: ratios move, clipping acts, and windows
    # carry different token counts.
    trainer, capture = run_and_compare(
        tmp_path,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
        num_iterations=2,
        max_steps=4,
        per_device_train_batch_size=4,
    )
    assert any("old_per_token_logps" in b for s in capture.steps for b in s["batches"])


def test_gradient_exact_with_masked_truncated_completions(tmp_path):
    trainer, capture = run_and_compare(
        tmp_path,
        gradient_accumulation_steps=2,
        per_device_train_batch_size=8,
        mask_truncated_completions=True,
        max_completion_length=4,
    )
    masks = torch.cat([b["completion_mask"].sum(1) for s in capture.steps for b in s["batches"]])
    assert (masks == 0).any(), "the test needs at least one truncated (masked) completion"


def test_trl_normaliser_is_not_exact_but_ours_is(tmp_path):
    """The window counts differ from TRL's generation-batch average: the override changes something."""
    trainer, capture = run_and_compare(
        tmp_path,
        gradient_accumulation_steps=1,
        steps_per_generation=4,
        per_device_train_batch_size=4,
        max_steps=4,
        max_completion_length=24,  # long enough for some completions to end early
    )
    counts = [float(b["completion_mask"].sum()) for s in capture.steps for b in s["batches"]]
    assert len(set(counts)) > 1, "micro-batches of different token counts are what makes TRL's average inexact"


@pytest.mark.parametrize("dynamic_sampling", [True, False])
@pytest.mark.parametrize("spg,ga,per_device", [(1, 2, 8), (2, 4, 4)])
def test_fewer_steps_per_generation_than_accumulation_trains_with_trls_normaliser(
    tmp_path, caplog, dynamic_sampling, spg, ga, per_device
):
    """
    Generating once per micro-batch (or every few): an optimizer step spans several generation batches, whose token
    count is unknown at the first backward pass. The step's gradient is TRL's: the mean over its generation batches of
    each batch's token-mean gradient, and the user is told once.
    """
    import logging

    model, tokenizer = tiny_model_and_tokenizer()
    args = config(
        tmp_path,
        steps_per_generation=spg,
        gradient_accumulation_steps=ga,
        per_device_train_batch_size=per_device,
        max_completion_length=24,  # long enough for completions to end early: batches of different token counts
        dynamic_sampling=dynamic_sampling,
    )
    with caplog.at_level(logging.WARNING, logger="dapo_trl.dapo_trainer"):
        trainer = Recorder(
            model=model,
            reward_funcs=[ScriptedReward()],
            args=args,
            train_dataset=scripted_dataset(),
            processing_class=tokenizer,
        )
    warnings = [r.getMessage() for r in caplog.records if "token mean is taken per generation batch" in r.getMessage()]
    assert len(warnings) == 1
    capture = GradientCapture(trainer)
    trainer.add_callback(capture)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert len(capture.steps) == args.max_steps
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())
    reference_model, _ = tiny_model_and_tokenizer()
    counts = []
    for step in capture.steps:
        assert len(step["batches"]) == ga
        reference_model.load_state_dict(step["params"])
        generation_batches = [step["batches"][i : i + spg] for i in range(0, ga, spg)]
        expected: dict[str, torch.Tensor] = {}
        for batches in generation_batches:
            counts.append(float(sum(b["completion_mask"].sum() for b in batches)))
            grads = reference_gradients(
                reference_model, batches, epsilon_low=args.epsilon, epsilon_high=args.epsilon_high
            )
            for name, grad in grads.items():
                expected[name] = expected.get(name, 0) + grad / len(generation_batches)
        for name, grad in step["grads"].items():
            torch.testing.assert_close(grad, expected[name], atol=1e-6, rtol=1e-5, msg=name)
    assert len(set(counts)) > 1, "generation batches of equal token counts would not tell the two normalisers apart"


def test_two_steps_change_parameters_and_log_new_metrics(tmp_path):
    model, tokenizer = tiny_model_and_tokenizer()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = DAPOTrainer(
        model=model,
        reward_funcs=[ScriptedReward()],
        args=config(tmp_path, steps_per_generation=2),
        train_dataset=scripted_dataset(),
        processing_class=tokenizer,
    )
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, "no parameter changed"
    logged = set().union(*[h.keys() for h in trainer.state.log_history])
    for key in [
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "entropy",
        "token_prob/mean",
        "accuracy",
        "completions/correct_mean_length",
        "completions/incorrect_max_length",
        "overlong/ratio",
        "overlong/truncated_ratio",
        "overlong/penalty_mean",
        "overlong/penalised_ratio",
        "dynamic_sampling/rounds",
        "dynamic_sampling/informative_frac",
        "dynamic_sampling/all_correct_frac",
        "dynamic_sampling/all_wrong_frac",
        "dynamic_sampling/groups_generated",
        "dynamic_sampling/groups_discarded",
        "dynamic_sampling/underfilled",
        "dynamic_sampling/prompts_consumed",
        "dynamic_sampling/reward_before_filter",
        "dynamic_sampling/accuracy_after_filter",
    ]:
        assert key in logged, key


def test_grpo_config_is_accepted_and_converted(tmp_path):
    from trl import GRPOConfig

    model, tokenizer = tiny_model_and_tokenizer()
    grpo_args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to="none",
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=8,
        max_steps=1,
        epsilon_high=0.28,
    )
    trainer = DAPOTrainer(
        model=model,
        reward_funcs=ScriptedReward(),
        args=grpo_args,
        train_dataset=scripted_dataset(),
        processing_class=tokenizer,
    )
    assert trainer.args.dynamic_sampling and trainer.args.epsilon_high == 0.28
    assert trainer.reward_func_names == ["scripted"]  # the overlong penalty is not a reward function
