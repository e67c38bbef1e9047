"""Correct where users train: unscorable rows, metrics over refill rounds, carried rows' ratios, bounded calls,
tiny datasets, skipping everything, mid-batch resume, sequence-level clip metrics."""

import logging
import math

import pytest
import torch
from _tiny import Recorder, config, logged, scripted_dataset, tiny_model_and_tokenizer, tiny_trainer
from datasets import Dataset
from trl import GRPOTrainer

from dapo_trl.trainer.advantages import compute_advantages
from dapo_trl.trainer.overlong import soft_overlong_penalty

pytestmark = pytest.mark.integration

G = 4


class FourthUnscored:
    """Alternating +1/-1 along each group, except its last completion, which cannot be scored (None)."""

    __name__ = "fourth_unscored"
    correct_reward = 1.0

    def __call__(self, completions, **kwargs):
        return [None if i % G == G - 1 else (1.0 if i % 2 == 0 else -1.0) for i in range(len(completions))]


class OutputSpy(Recorder):
    """Keeps what `_generate_and_score_completions` returns, before TRL shuffles the rows."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outputs = []

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if self.model.training:
            self.outputs.append({k: v.detach().clone() for k, v in out.items() if isinstance(v, torch.Tensor)})
        return out


@pytest.mark.parametrize("dynamic_sampling", [False, True])
def test_unscorable_rows_stay_unscorable_with_overlong_shaping(tmp_path, dynamic_sampling):
    trainer = tiny_trainer(
        tmp_path,
        reward=FourthUnscored(),
        cls=OutputSpy,
        dynamic_sampling=dynamic_sampling,
        max_steps=1,
        max_completion_length=8,
        overlong_buffer_len=4,
    )
    trainer.train()
    out = trainer.outputs[0]
    lengths = out["completion_mask"].sum(1).tolist()
    rewards = torch.tensor(
        [[math.nan if i % G == G - 1 else (1.0 if i % 2 == 0 else -1.0)] for i in range(len(lengths))]
    )
    penalty = torch.tensor([soft_overlong_penalty(int(n), max_length=8, buffer_len=4) for n in lengths])
    assert (penalty < 0).any(), "the test needs completions in the penalty zone"
    advantages = out["advantages"]
    assert advantages[G - 1 :: G].abs().max() == 0  # unscorable: no advantage despite its length penalty
    expected = compute_advantages(rewards, torch.ones(1), num_generations=G, penalty=penalty).advantages
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=1e-5)
    # the other rows' advantages do not see the unscorable row: recompute each group on its 3 scored rows
    for g in range(len(lengths) // G):
        rows = slice(g * G, g * G + G - 1)
        shaped = rewards[rows, 0] + penalty[rows]
        torch.testing.assert_close(
            advantages[rows], (shaped - shaped.mean()) / (shaped.std() + 1e-4), atol=1e-5, rtol=0
        )


class RewardSpy(OutputSpy):
    """Keeps every gathered reward table of the step (all generation calls)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tables = []

    def _calculate_rewards(self, *args, **kwargs):
        rewards = super()._calculate_rewards(*args, **kwargs)
        self.tables.append(rewards.clone())
        return rewards


def refill_dataset(n=60):
    # With a sequential stream and deficit refills, rounds come out of different sizes and accuracies.
    kinds = ["easy", "mixed", "easy", "hard", "easy", "hard", "mixed", "easy"] * (n // 8 + 1)
    return Dataset.from_dict({"prompt": [f"q{i}?\n" for i in range(n)], "kind": kinds[:n]})


def test_metrics_of_a_multi_round_step_cover_every_generated_row(tmp_path):
    trainer = tiny_trainer(
        tmp_path,
        dataset=refill_dataset(),
        cls=RewardSpy,
        max_steps=1,
        shuffle_dataset=False,
        dynamic_sampling_round_sizing="deficit",
        per_device_train_batch_size=12,  # 3 groups per batch
        log_completions=True,
    )
    trainer.train()
    assert logged(trainer, "dynamic_sampling/rounds")[0] >= 3
    rewards = torch.cat(trainer.tables)[:, 0]  # every row generated in the step
    groups = rewards.view(-1, G)
    constant = (groups.max(1).values == groups.min(1).values).float()
    history = trainer.state.log_history[0]
    assert history["accuracy"] == pytest.approx((rewards >= 1).float().mean().item())
    assert history["reward"] == pytest.approx(rewards.mean().item())
    assert history["reward_std"] == pytest.approx(rewards.std().item(), rel=1e-5)
    assert history["frac_reward_zero_std"] == pytest.approx(constant.mean().item())
    assert history["rewards/scripted/mean"] == pytest.approx(rewards.mean().item())
    assert history["dynamic_sampling/groups_generated"] == groups.size(0)
    # the completions table shows the rows that were trained, with their advantages
    prompts = list(trainer._logs["prompt"])
    assert len(prompts) == trainer.args.generation_batch_size
    assert {kind_of(p) for p in prompts} == {"mixed"}
    trained = trainer.outputs[0]["advantages"]
    assert sorted(trainer._logs["advantages"]) == pytest.approx(sorted(trained.tolist()))


def kind_of(prompt: str) -> str:
    return refill_dataset()["kind"][int(prompt.strip()[1:-1])]


def test_no_generation_call_holds_more_than_one_generation_batch(tmp_path, monkeypatch):
    sizes = []  # rows of each generation call (a round is scored in one TRL call, generated in chunks)
    original = GRPOTrainer._generate_single_turn

    def spy(self, prompt_ids, *args, **kwargs):
        sizes.append(len(prompt_ids))
        return original(self, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", spy)
    trainer = tiny_trainer(tmp_path, max_steps=2, dynamic_sampling_margin=8.0)  # a large margin asks for big rounds
    trainer.train()
    rounds = sum(logged(trainer, "dynamic_sampling/rounds"))
    assert len(sizes) > rounds, "no round was large enough to be split"
    assert max(sizes) <= trainer.args.generation_batch_size


class DropoutRatioSpy(Recorder):
    """Keeps the loss forward's log-probabilities next to the recorded micro-batches."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_logps = []

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if kwargs.get("compute_entropy") and self.model.training:
            self.loss_logps.append(out[0].detach().clone())
        return out


def test_fresh_rows_keep_the_exact_on_policy_ratio_next_to_carried_rows(tmp_path):
    model, _ = tiny_model_and_tokenizer()
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.3  # dropout makes a second forward differ from the loss forward
    trainer = tiny_trainer(
        tmp_path,
        cls=DropoutRatioSpy,
        model=model,
        max_steps=4,
        dynamic_sampling_carry_over=True,
        dynamic_sampling_margin=4.0,
    )
    trainer.train()
    assert sum(logged(trainer, "dynamic_sampling/groups_carried")) > 0
    saw_carried = False
    for batch, logps in zip(trainer.recorded, trainer.loss_logps, strict=True):
        mask = batch["completion_mask"].bool()
        old = batch.get("old_per_token_logps")
        fresh = batch["dapo_on_policy"] if "dapo_on_policy" in batch else torch.ones(mask.size(0), dtype=torch.bool)
        saw_carried |= bool((~fresh).any())
        if old is not None:
            diff = ((logps - old).abs() * mask)[fresh]
            assert diff.numel() == 0 or diff.max() == 0, "a fresh row's ratio moved away from 1"
            carried = ((logps - old).abs() * mask)[~fresh]
            assert carried.numel() == 0 or carried.max() > 0  # carried rows: sampled by an older policy
    assert saw_carried


def test_a_training_set_smaller_than_one_generation_batch_trains(tmp_path):
    # 3 prompts, 4 per generation batch: TRL's sampler would drop the incomplete batch and train 0 steps
    trainer = tiny_trainer(
        tmp_path, dataset=scripted_dataset(3, kinds=("mixed",)), max_steps=2, per_device_train_batch_size=16
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert logged(trainer, "dynamic_sampling/groups_trained") == [4, 4]


def test_a_training_set_smaller_than_one_generation_batch_is_refused_without_dynamic_sampling(tmp_path):
    with pytest.raises(ValueError, match="3 prompts but one generation batch needs 4"):
        tiny_trainer(tmp_path, dataset=scripted_dataset(3), dynamic_sampling=False, per_device_train_batch_size=16)


class SkipEverything(Recorder):
    def skip_prompt(self, index):
        return True


def test_skipping_every_prompt_follows_on_exhausted(tmp_path, caplog):
    trainer = tiny_trainer(tmp_path / "train", cls=SkipEverything, max_steps=1)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "No prompt could be drawn" in caplog.text
    assert logged(trainer, "dynamic_sampling/underfilled") == [1.0]
    assert all(b["completion_mask"].sum() == 0 for b in trainer.recorded)
    trainer = tiny_trainer(tmp_path / "raise", cls=SkipEverything, max_steps=1, dynamic_sampling_on_exhausted="raise")
    with pytest.raises(RuntimeError, match="No prompt could be drawn"):
        trainer.train()


@pytest.mark.parametrize("dynamic_sampling", [True, False])
def test_resume_in_the_middle_of_a_generation_batch_is_exact(tmp_path, dynamic_sampling):
    common = dict(
        max_steps=4,
        steps_per_generation=4,
        gradient_accumulation_steps=1,
        per_device_train_batch_size=4,
        save_strategy="steps",
        save_steps=1,
        dynamic_sampling=dynamic_sampling,
    )
    full = tiny_trainer(tmp_path / "full", **common)
    full.train()
    resumed = tiny_trainer(tmp_path / "resumed", **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))  # mid generation batch
    assert len(full.recorded) == 4 and len(resumed.recorded) == 2
    for a, b in zip(full.recorded[2:], resumed.recorded, strict=True):
        assert torch.equal(a["completion_ids"], b["completion_ids"])
        assert torch.equal(a["advantages"], b["advantages"])
    tail = lambda t: [h["loss"] for h in t.state.log_history if "loss" in h and h["step"] > 2]  # noqa: E731
    assert tail(full) == pytest.approx(tail(resumed))


class ClipSpy(DropoutRatioSpy):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.clip_logged = []

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        self.clip_logged.append(self._metrics["train"]["clip_ratio/region_mean"][-1])
        return loss


def test_sequence_level_clip_ratios_ignore_padding_rows(tmp_path):
    dataset = scripted_dataset(30, kinds=("mixed", "easy"))  # with a sequential stream, each batch is half masked
    trainer = tiny_trainer(
        tmp_path,
        dataset=dataset,
        cls=ClipSpy,
        max_steps=4,
        shuffle_dataset=False,
        importance_sampling_level="sequence",
        num_iterations=2,
        learning_rate=0.05,
        epsilon=0.001,
        epsilon_high=0.001,
        dynamic_sampling_max_rounds=1,
        dynamic_sampling_round_sizing="deficit",
    )
    trainer.train()
    checked = 0
    for batch, logps, value in zip(trainer.recorded, trainer.loss_logps, trainer.clip_logged, strict=True):
        mask = batch["completion_mask"].float()
        real = mask.sum(1) > 0
        if real.all() or not real.any():
            continue
        old = batch.get("old_per_token_logps", logps)
        ratio = torch.exp(((logps - old) * mask).sum(1) / mask.sum(1).clamp(min=1))
        adv = batch["advantages"]
        clipped = ((ratio < 1 - 0.001) & (adv < 0)) | ((ratio > 1 + 0.001) & (adv > 0))
        expected = clipped[real].float().mean().item()
        assert value == pytest.approx(expected, abs=1e-6)
        checked += expected > 0
    assert checked, "no underfilled batch with clipping was seen"


def test_weight_syncs_are_counted(tmp_path):
    trainer = tiny_trainer(tmp_path)

    class FakeGeneration:
        calls = 0

        def sync_weights(self):
            FakeGeneration.calls += 1

    trainer.use_vllm = True
    trainer.vllm_generation = FakeGeneration()
    trainer._count_weight_syncs()
    trainer.vllm_generation.sync_weights()
    trainer.vllm_generation.sync_weights()
    assert trainer._weight_syncs == 2 and FakeGeneration.calls == 2


def test_reward_lists_and_logged_reward_are_grpo_trainers(tmp_path):
    """Overlong shaping changes advantages, not the reward lists or the logged `reward` (weights 0.7, all truncated)."""

    def always_one(completions, **kwargs):
        return [1.0] * len(completions)

    logs = {}
    for cls in (GRPOTrainer, Recorder):
        model, tokenizer = tiny_model_and_tokenizer()
        extra = {} if cls is GRPOTrainer else dict(dynamic_sampling_max_rounds=1)
        args = config(tmp_path / cls.__name__, max_steps=1, reward_weights=[0.7], max_completion_length=4, **extra)
        trainer = cls(
            model=model,
            reward_funcs=[always_one],
            args=args,
            train_dataset=scripted_dataset(),
            processing_class=tokenizer,
        )
        assert len(trainer.reward_funcs) == len(trainer.reward_func_names) == 1
        assert len(trainer.reward_weights) == len(trainer.reward_processing_classes) == 1
        trainer.train()
        logs[cls] = trainer.state.log_history[0]
    assert logs[GRPOTrainer]["reward"] == pytest.approx(0.7)
    assert logs[Recorder]["reward"] == pytest.approx(0.7)
    assert logs[Recorder]["overlong/penalty_mean"] < -0.5  # almost every completion is cut at 4 tokens


def none_reward(completions, **kwargs):
    return [None] * len(completions)


def constant_reward(completions, **kwargs):
    return [0.5] * len(completions)


def test_a_reward_that_scores_nothing_is_named_and_costs_one_round(tmp_path, caplog):
    trainer = tiny_trainer(tmp_path, reward=none_reward, max_steps=1, dynamic_sampling_max_rounds=100000)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "'none_reward' returned None for all" in caplog.text
    assert "too easy or too hard" not in caplog.text
    assert logged(trainer, "dynamic_sampling/rounds") == [1.0]


def test_a_constant_reward_is_named_with_its_value(tmp_path, caplog):
    trainer = tiny_trainer(tmp_path, reward=constant_reward, max_steps=1, dynamic_sampling_max_rounds=2)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "'constant_reward' returned the same value 0.5 for all" in caplog.text
    # the underfill warning names the constant filter reward as the cause, with the groups as they were
    assert "gave every completion of this batch the same value 0.5" in caplog.text
    assert "were all-correct" not in caplog.text and "too easy" not in caplog.text


@pytest.mark.parametrize("level", ["sequence", "token"])
def test_removed_by_vllm_importance_sampling_is_counted(tmp_path, level):
    """TRL's vLLM correction (mask modes) zeroes the weight of whole sequences or tokens; the trainer counts them."""
    trainer = tiny_trainer(tmp_path)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    if level == "sequence":
        ratio = torch.tensor([[0.0], [1.2], [0.0], [1.0]])  # rows 0 and 2 exceed the cap: 7 tokens removed
        expected = (2, 2 / 3, 7, 7 / 9)
    else:
        ratio = torch.tensor([[0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 1.0, 1.0], [1.0] * 4, [1.0] * 4])
        expected = (1, 1 / 3, 4, 4 / 9)
    batch = {"completion_mask": mask, "importance_sampling_ratio": ratio}
    trainer._log_importance_sampling(batch)
    metrics = trainer._metrics["train"]
    names = ("sequences", "sequence_frac", "tokens", "token_frac")
    got = tuple(metrics[f"sampling/is_removed_{name}"][-1] for name in names)
    assert got == pytest.approx(expected)
