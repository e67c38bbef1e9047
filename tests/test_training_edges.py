"""Correct at the edges of training: metrics merged over refill rounds, resume past the first epoch, steps without a
loss token, padding between the old-log-prob and loss forwards, staleness of carried groups."""

import logging

import pytest
import torch
from _tiny import (
    Recorder,
    ScriptedReward,
    StateCapture,
    logged,
    scripted_dataset,
    tiny_gpt2,
    tiny_model_and_tokenizer,
    tiny_trainer,
)
from datasets import Dataset

pytestmark = pytest.mark.integration

G = 4


def refill_dataset(n=60):
    # With a sequential stream and deficit refills, rounds come out of different sizes and accuracies.
    kinds = ["easy", "mixed", "easy", "hard", "easy", "hard", "mixed", "easy"] * (n // 8 + 1)
    return Dataset.from_dict({"prompt": [f"q{i}?\n" for i in range(n)], "kind": kinds[:n]})


# ---------------------------------------------------------------------------------------------- merged metrics


def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


class ToolRows(Recorder):
    """
    Every generation call goes through TRL's tool branch with a scripted tool loop: row `i` of a call makes
    `len(completion) % 3` tool calls, one of which fails when its first token id is odd. Keeps each row's length,
    truncation (TRL's rule), tool calls and failures, for every call.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tools = [multiply]
        self.rows: list[tuple[int, bool, int, int]] = []

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields):
        calls = [len(ids) % 3 for ids in completion_ids]
        failures = [int(c > 0 and ids[0] % 2 == 1) for c, ids in zip(calls, completion_ids, strict=True)]
        if self.model.training:
            eos_and_pad = [*self.eos_token_ids, self._tokenizer.pad_token_id]
            for ids, c, f in zip(completion_ids, calls, failures, strict=True):
                self.rows.append((len(ids), ids[-1] not in eos_and_pad, c, f))
        tool_mask = [[1] * len(ids) for ids in completion_ids]
        tool_images = [[] for _ in completion_ids]
        return tool_mask, completions, completion_ids, logprobs, sum(calls), sum(failures), tool_images


def one_call_metrics(rows: list[tuple[int, bool, int, int]]) -> dict[str, float]:
    """What TRL's `_generate_and_score_completions` would log for all `rows` in one call."""
    lengths = torch.tensor([r[0] for r in rows], dtype=torch.float32)
    truncated = torch.tensor([r[1] for r in rows])
    terminated = lengths[~truncated] if (~truncated).any() else torch.zeros(1)
    calls, failures = sum(r[2] for r in rows), sum(r[3] for r in rows)
    return {
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": truncated.float().mean().item(),
        "completions/mean_terminated_length": terminated.mean().item(),
        "completions/min_terminated_length": terminated.min().item(),
        "completions/max_terminated_length": terminated.max().item(),
        "tools/call_frequency": calls / len(rows),
        "tools/failure_frequency": failures / calls if calls else 0.0,
    }


def test_completion_and_tool_metrics_of_a_multi_round_step_are_those_of_one_call(tmp_path):
    trainer = tiny_trainer(
        tmp_path,
        dataset=refill_dataset(),
        cls=ToolRows,
        max_steps=1,
        shuffle_dataset=False,
        dynamic_sampling_round_sizing="deficit",
        per_device_train_batch_size=12,  # 3 groups per batch
        max_completion_length=12,
        temperature=2.0,  # spread the lengths: some completions end early, some are cut
    )
    trainer.train()
    assert logged(trainer, "dynamic_sampling/rounds")[0] >= 3
    history = trainer.state.log_history[0]
    expected = one_call_metrics(trainer.rows)
    assert 0 < expected["completions/clipped_ratio"] < 1, "the test needs both terminated and truncated rows"
    assert expected["completions/min_length"] < expected["completions/max_length"]
    for key, value in expected.items():
        assert history[key] == pytest.approx(value, rel=1e-6), key


class LoggingReward(ScriptedReward):
    """[`ScriptedReward`] that also logs a metric and a completions-table column through TRL's reward kwargs."""

    def __call__(self, completions, kind, log_extra=None, log_metric=None, **kwargs):
        log_extra("echo", [f"<{c}>" for c in completions])
        log_metric("rewards/scripted/judge_calls", 1.0)
        return super().__call__(completions, kind, **kwargs)


def test_a_rewards_own_metric_and_table_column_are_kept_over_rounds(tmp_path):
    # Several rounds per batch, the first larger than one generation batch (TRL's table keeps that many rows).
    trainer = tiny_trainer(
        tmp_path, dataset=refill_dataset(), reward=LoggingReward(), max_steps=2, log_completions=True
    )
    trainer.train()
    assert max(logged(trainer, "dynamic_sampling/rounds")) > 1
    assert logged(trainer, "rewards/scripted/judge_calls") == [1.0, 1.0]
    logs = trainer._logs
    assert len(logs["prompt"]) == trainer.args.generation_batch_size
    assert list(logs["extra"]["echo"]) == [f"<{c}>" for c in logs["completion"]]


# ---------------------------------------------------------------------------------------------- resume past epoch 0


def test_drop_in_resume_past_the_first_epoch_trains_the_same_prompts_in_the_same_order(tmp_path):
    # 8 prompts, 2 per step: 4 steps per epoch; the resumed runs start in epoch 2 (at its start and inside it).
    common = dict(
        dataset=scripted_dataset(8),
        dynamic_sampling=False,
        max_steps=10,
        save_strategy="steps",
        save_steps=1,
    )
    full = tiny_trainer(tmp_path / "full", **common)
    full.train()
    epochs = [tuple(sorted(b["prompt_ids"][:, -4:].tolist())) for b in full.recorded]
    assert epochs[0:4] != epochs[4:8], "the test needs epochs in different orders"
    for step in (8, 9):
        resumed = tiny_trainer(tmp_path / f"resumed-{step}", **common)
        resumed.train(resume_from_checkpoint=str(tmp_path / "full" / f"checkpoint-{step}"))
        assert len(resumed.recorded) == 10 - step
        for a, b in zip(full.recorded[step:], resumed.recorded, strict=True):
            assert torch.equal(a["prompt_ids"], b["prompt_ids"])
            assert torch.equal(a["completion_ids"], b["completion_ids"])


def test_epoch_sampler_keeps_trls_order_and_restarts_at_any_epoch():
    from trl.trainer.utils import RepeatSampler

    from dapo_trl.trainer.prompt_source import EpochSampler

    def make_sampler():
        return RepeatSampler(range(10), mini_repeat_count=2, batch_size=3, repeat_count=2, seed=7)

    trl_sampler, ours = make_sampler(), EpochSampler(make_sampler())
    passes = [list(trl_sampler) for _ in range(3)]
    assert passes[0] != passes[1] != passes[2]
    for epoch in range(3):
        ours.set_epoch(epoch)
        assert list(ours) == passes[epoch]
    unset = EpochSampler(make_sampler())  # without set_epoch, each pass is the next epoch
    assert [list(unset) for _ in range(3)] == passes
    resumed = EpochSampler(make_sampler())
    resumed.set_epoch(2)
    assert list(resumed) == passes[2] and len(resumed) == len(trl_sampler)


def test_resumed_multi_process_loader_draws_the_resumed_epochs_order(tmp_path):
    # What transformers builds for process 0 of 2 resumed inside epoch 2: SkipBatchSampler(BatchSamplerShard(
    # BatchSampler(sampler))), then set_epoch as its training loop calls it; neither reaches the innermost sampler.
    from accelerate.data_loader import prepare_data_loader, skip_first_batches
    from trl import GRPOTrainer

    trainer = tiny_trainer(tmp_path, dataset=scripted_dataset(8), dynamic_sampling=False)
    batch_size = trainer.args.per_device_train_batch_size

    def loader(sampler):
        data = torch.utils.data.DataLoader(range(8), batch_size=batch_size, sampler=sampler)
        return prepare_data_loader(data, num_processes=2, process_index=0, put_on_device=False)

    trl_sampler = GRPOTrainer._get_train_sampler(trainer)
    passes = [torch.cat(list(loader(trl_sampler))).tolist() for _ in range(3)]
    assert passes[2] != passes[0], "the test needs epochs in different orders"
    trainer.state.epoch = 2.5  # restored from the checkpoint
    resumed = skip_first_batches(loader(trainer._get_train_sampler()), 1)
    resumed.set_epoch(2)
    underlying = getattr(resumed.batch_sampler, "batch_sampler", None)
    if hasattr(underlying, "set_epoch"):
        underlying.set_epoch(2)
    assert torch.cat(list(resumed)).tolist() == passes[2][batch_size:]


# ---------------------------------------------------------------------------------------------- empty batches


def assert_same_state(a: dict, b: dict) -> None:
    for name, value in a["params"].items():
        assert torch.equal(value, b["params"][name]), f"{name} moved"
    for index, state in a["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][index][key]), f"optimizer {key} of {index} moved"
    assert a["scheduler"] == b["scheduler"] and a["lr"] == b["lr"]


def test_a_batch_without_an_informative_group_takes_no_optimizer_step(tmp_path, caplog):
    # Sequential stream, one round per batch: the first batch holds two mixed groups, the next two hold none.
    dataset = scripted_dataset(12, kinds=("mixed", "mixed", "easy", "easy", "hard", "hard"))
    trainer = tiny_trainer(
        tmp_path,
        dataset=dataset,
        max_steps=3,
        shuffle_dataset=False,
        dynamic_sampling_max_rounds=1,
        dynamic_sampling_round_sizing="deficit",
        weight_decay=0.1,
    )
    capture = StateCapture(trainer)
    trainer.add_callback(capture)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert logged(trainer, "dynamic_sampling/groups_trained") == [2, 0, 0]
    assert logged(trainer, "dynamic_sampling/skipped_updates") == [0.0, 1.0, 1.0]
    assert trainer.state.global_step == 3
    first, *skipped = capture.steps
    assert first["optimizer"]["state"], "the first step must have given AdamW moments"
    for state in skipped:
        assert_same_state(first, state)
    assert "the optimizer update is skipped" in caplog.text


def test_fp16_with_gradient_clipping_trains_on_after_skipped_updates(tmp_path):
    # A GradScaler as accelerate makes for fp16 on a GPU (it makes none on CPU), and clipping, which unscales the
    # gradients of every step before the optimizer step; steps 2 and 3 are skipped, step 4 trains again.
    dataset = scripted_dataset(12, kinds=("mixed", "mixed", "easy", "easy", "hard", "hard"))
    trainer = tiny_trainer(
        tmp_path,
        dataset=dataset,
        max_steps=4,
        shuffle_dataset=False,
        dynamic_sampling_max_rounds=1,
        dynamic_sampling_round_sizing="deficit",
        fp16=True,
        max_grad_norm=1.0,
    )
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    trainer.accelerator.scaler, trainer.accelerator.native_amp = scaler, True
    capture = StateCapture(trainer)
    trainer.add_callback(capture)
    trainer.train()
    assert trainer.optimizer.scaler is scaler
    assert logged(trainer, "dynamic_sampling/skipped_updates") == [0.0, 1.0, 1.0, 0.0]
    first, *skipped, last = capture.steps
    for state in skipped:
        assert_same_state(first, state)
    assert any(not torch.equal(v, last["params"][k]) for k, v in first["params"].items()), "step 4 must train"
    assert scaler.get_scale() == 2.0**8


# ---------------------------------------------------------------------------------------------- padding and positions


class LossLogps(Recorder):
    """Keeps the loss forward's log-probabilities next to each recorded micro-batch."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_logps: list[torch.Tensor] = []

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if kwargs.get("compute_entropy") and self.model.training:
            self.loss_logps.append(out[0].detach().clone())
        return out


def varied_prompts(n=80, *, blocks=False):
    """
    Prompts of 3 to 6 tokens (so generation calls pad to different widths); one group in five is informative (three with
    `blocks`). With
    `blocks`, widths change by blocks of 10 prompts, so that read in order, rounds differ in their widest prompt.
    """
    kinds = ("mixed", "easy", "mixed", "hard", "mixed") if blocks else ("mixed", "easy", "hard", "easy", "hard")
    digits = [1 + (i // 10) % 4 if blocks else 1 + i % 4 for i in range(n)]
    return Dataset.from_dict(
        {
            "prompt": [f"q{str(i * 7919)[-d:]:0>{d}}?\n" for i, d in enumerate(digits)],
            "kind": [kinds[i % 5] for i in range(n)],
        }
    )


@pytest.mark.parametrize("architecture", ["qwen2", "gpt2"])
@pytest.mark.parametrize("steps_per_generation", [1, 2])  # 1: carried rows keep sampling log-probs; 2: TRL's old ones
def test_repadded_rows_keep_a_ratio_of_one_before_any_update(tmp_path, architecture, steps_per_generation):
    # learning_rate=0: the policy never changes, so every row's ratio must be 1 at every micro-step, carried or fresh,
    # whatever padding the assembled batch gave it.
    model, tokenizer = tiny_model_and_tokenizer()
    if architecture == "gpt2":
        model = tiny_gpt2(tokenizer)
    trainer = tiny_trainer(
        tmp_path,
        cls=LossLogps,
        model=model,
        dataset=varied_prompts(blocks=True),  # read in order: rounds of different widths, so rows are re-padded
        shuffle_dataset=False,
        max_steps=4,
        learning_rate=0.0,
        steps_per_generation=steps_per_generation,
        dynamic_sampling_round_sizing="fixed",
        dynamic_sampling_carry_over=True,
    )
    trainer.train()
    assert sum(logged(trainer, "dynamic_sampling/groups_carried")) > 0  # carried rows meet rows of another width
    checked = 0
    for batch, logps in zip(trainer.recorded, trainer.loss_logps, strict=True):
        old = batch.get("old_per_token_logps")
        if old is None:
            continue
        mask = batch["completion_mask"].bool()
        assert ((logps - old).abs() * mask).max() <= 1e-6
        checked += 1
    assert checked


# ---------------------------------------------------------------------------------------------- staleness


def test_carried_rows_are_logged_as_stale_by_the_updates_of_one_generation_batch(tmp_path):
    # steps_per_generation=2, gradient_accumulation_steps=1: two optimizer updates per generation batch, so rows
    # carried into the next batch were sampled by a policy two updates older than the one of its first update.
    trainer = tiny_trainer(
        tmp_path,
        dataset=varied_prompts(),
        max_steps=8,
        steps_per_generation=2,
        dynamic_sampling_round_sizing="fixed",
        dynamic_sampling_carry_over=True,
    )
    trainer.train()
    staleness = logged(trainer, "dynamic_sampling/carried_staleness")
    assert staleness and set(staleness) == {2.0}
    assert len(staleness) == sum(1 for c in logged(trainer, "dynamic_sampling/groups_carried") if c > 0)
