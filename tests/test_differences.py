"""Each row of the "Differences from GRPOTrainer" table (docs/differences.md), asserted, so the list cannot go stale."""

import re
from pathlib import Path

import pytest
import torch
from _tiny import Recorder, ScriptedReward, config, scripted_dataset, tiny_gpt2, tiny_model_and_tokenizer, tiny_trainer
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from dapo_trl import DAPOConfig, DAPOTrainer

DIFFERENCES = Path(__file__).resolve().parents[1] / "docs" / "differences.md"


def listed_differences() -> list[int]:
    section = DIFFERENCES.read_text()
    return [int(n) for n in re.findall(r"^\| (\d+) \|", section, flags=re.M)]


def test_every_listed_difference_has_a_test():
    tested = sorted(int(name.split("_")[2]) for name in globals() if name.startswith("test_difference_"))
    assert listed_differences() == tested


def test_difference_1_defaults_and_converted_grpo_config(tmp_path):
    defaults = DAPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    assert (defaults.epsilon_high, defaults.num_generations, defaults.lr_scheduler_type) == (
        0.28,
        16,
        "constant_with_warmup",
    )
    grpo = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, num_generations=4, per_device_train_batch_size=8
    )
    model, tokenizer = tiny_model_and_tokenizer()
    trainer = DAPOTrainer(
        model=model,
        reward_funcs=ScriptedReward(),
        args=grpo,
        train_dataset=scripted_dataset(),
        processing_class=tokenizer,
    )
    assert trainer.args.num_generations == 4 and trainer.args.dynamic_sampling and trainer.args.overlong_shaping


def test_difference_2_steps_spanning_generation_batches_keep_trls_normaliser_with_a_warning(tmp_path, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="dapo_trl.dapo_trainer"):
        trainer = tiny_trainer(
            tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=4, steps_per_generation=2
        )
    assert "token mean is taken per generation batch" in caplog.text
    assert not trainer._exact_normalizer


@pytest.mark.integration
def test_difference_3_prompts_come_from_the_stream_not_the_dataloader(tmp_path):
    trainer = tiny_trainer(tmp_path, max_steps=2)
    seen = []
    original = trainer._dynamic_sampling_batch

    def spy():
        seen.append(trainer._prompts.consumed)
        return original()

    trainer._dynamic_sampling_batch = spy
    trainer.train()
    consumed = [h["dynamic_sampling/prompts_consumed"] for h in trainer.state.log_history if "loss" in h]
    assert consumed[-1] > 2 * trainer._ds_target  # refills drew more prompts than the dataloader paced
    assert seen[0] == 0


@pytest.mark.integration
def test_difference_4_generation_calls_hold_at_most_one_batch_and_maybe_fewer(tmp_path, monkeypatch):
    sizes = []
    original = GRPOTrainer._generate_and_score_completions

    def spy(self, inputs):
        sizes.append(len(inputs))
        return original(self, inputs)

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", spy)
    dataset = scripted_dataset(48, kinds=("mixed", "easy", "hard"))
    tiny_trainer(tmp_path, dataset=dataset, max_steps=2, dynamic_sampling_round_sizing="deficit").train()
    batch = config(tmp_path).generation_batch_size
    assert max(sizes) <= batch and min(sizes) < batch


class LengthPenalised(Recorder):
    """A stand-in length penalty that differs within every group, as completion lengths would."""

    def build_overlong_penalty(self):
        return lambda completions, **kwargs: [-0.1 * (i % 3) for i in range(len(completions))]


@pytest.mark.integration
def test_difference_5_advantages_include_the_overlong_penalty(tmp_path):
    advantages = {}
    for cls in (Recorder, LengthPenalised):
        trainer = tiny_trainer(tmp_path / cls.__name__, cls=cls, max_steps=1, overlong_shaping=cls is LengthPenalised)
        torch.manual_seed(0)
        trainer.train()
        advantages[cls] = torch.cat([b["advantages"] for b in trainer.recorded])
        assert trainer.reward_func_names == ["scripted"]  # the penalty is not a reward function
    assert not torch.allclose(advantages[Recorder], advantages[LengthPenalised])


@pytest.mark.integration
def test_difference_6_metrics_are_merged_per_batch_and_added(tmp_path):
    trainer = tiny_trainer(tmp_path, max_steps=1, dynamic_sampling_round_sizing="deficit")
    trainer.train()
    history = trainer.state.log_history[0]
    for key in ("dynamic_sampling/rounds", "overlong/penalty_mean", "token_prob/mean", "accuracy"):
        assert key in history
    assert history["dynamic_sampling/rounds"] > 1  # several calls, one merged value each
    assert isinstance(history["reward"], float)


def nan_reward(completions, **kwargs):
    return [float("nan")] * len(completions)


class RewardClass:
    def __call__(self, completions, **kwargs):
        return [0.0] * len(completions)


@pytest.mark.integration
def test_difference_7_broken_rewards_are_named(tmp_path):
    with pytest.raises(ValueError, match="'nan_reward' returned NaN"):
        tiny_trainer(tmp_path, reward=nan_reward, max_steps=1).train()
    with pytest.raises(TypeError, match="pass an instance"):
        tiny_trainer(tmp_path, reward=RewardClass)
    with pytest.raises(ValueError, match="no folder of that name"):
        tiny_trainer(tmp_path, reward="accuracy")


@pytest.mark.integration
def test_difference_8_small_training_sets(tmp_path):
    trainer = tiny_trainer(tmp_path, dataset=scripted_dataset(1, kinds=("mixed",)), max_steps=1)
    trainer.train()
    assert trainer.state.global_step == 1
    with pytest.raises(ValueError, match="train 0 steps"):
        tiny_trainer(tmp_path, dataset=scripted_dataset(1), dynamic_sampling=False)


def test_difference_9_prompt_column_and_empty_prompts(tmp_path):
    with pytest.raises(ValueError, match="no 'prompt' column"):
        tiny_trainer(tmp_path, dataset=Dataset.from_dict({"question": ["q?"] * 8, "kind": ["mixed"] * 8}))
    with pytest.raises(ValueError, match=r"2 empty prompts \(rows \[1, 3\]\)"):
        tiny_trainer(tmp_path, dataset=Dataset.from_dict({"prompt": ["a", "", "b", " "], "kind": ["mixed"] * 4}))


def test_difference_10_vision_language_models_refused_with_dynamic_sampling():
    import inspect

    from dapo_trl import dapo_trainer

    assert "does not support vision-language models" in inspect.getsource(dapo_trainer.DAPOTrainer)


@pytest.mark.integration
def test_difference_11_checkpoints_hold_sampler_state_and_half_used_batches(tmp_path):
    trainer = tiny_trainer(
        tmp_path,
        max_steps=1,
        steps_per_generation=2,
        gradient_accumulation_steps=1,
        save_strategy="steps",
        save_steps=1,
    )
    trainer.train()
    files = {p.name for p in (tmp_path / "checkpoint-1").iterdir()}
    assert {"dapo_sampler_state.pt", "dapo_generation_buffer_rank0.pt"} <= files


@pytest.mark.integration
def test_difference_12_diagnostics_callback_first_and_flags_logged(tmp_path):
    from dapo_trl import DiagnosticsCallback

    trainer = tiny_trainer(tmp_path, max_steps=1)
    assert isinstance(trainer.callback_handler.callbacks[0], DiagnosticsCallback)
    trainer.train()
    assert "diagnostics/entropy_collapse" in trainer.state.log_history[0]
    assert not any(
        isinstance(c, DiagnosticsCallback)
        for c in tiny_trainer(tmp_path, diagnostics=False).callback_handler.callbacks
    )


@pytest.mark.integration
def test_difference_13_a_step_without_a_loss_token_makes_no_update(tmp_path):
    params = []

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            params.append({k: v.detach().clone() for k, v in model.state_dict().items()})

    dataset = scripted_dataset(8, kinds=("mixed", "mixed", "easy", "easy"))  # first batch informative, second not
    trainer = tiny_trainer(
        tmp_path,
        dataset=dataset,
        max_steps=2,
        shuffle_dataset=False,
        dynamic_sampling_max_rounds=1,
        dynamic_sampling_round_sizing="deficit",
    )
    trainer.add_callback(Snapshot())
    trainer.train()
    assert [h["dynamic_sampling/skipped_updates"] for h in trainer.state.log_history[:2]] == [0.0, 1.0]
    assert all(torch.equal(v, params[1][k]) for k, v in params[0].items())


def test_difference_14_positions_are_counted_over_attended_tokens(tmp_path):
    _, tokenizer = tiny_model_and_tokenizer()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    padded = torch.cat([torch.full((1, 3), tokenizer.pad_token_id), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(ids)], dim=1)

    def logps(trainer, input_ids, attention_mask):
        with torch.no_grad():
            return trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention_mask, 3)[0]

    for dynamic_sampling, same in ((True, True), (False, False)):  # GPT-2: learned absolute positions
        trainer = tiny_trainer(tmp_path, model=tiny_gpt2(tokenizer), dynamic_sampling=dynamic_sampling)
        unpadded = logps(trainer, ids, torch.ones_like(ids))
        assert torch.allclose(unpadded, logps(trainer, padded, mask), atol=1e-6) is same


def test_difference_15_without_dynamic_sampling_each_epochs_order_depends_on_seed_and_epoch(tmp_path):
    from dapo_trl.trainer.prompt_source import EpochSampler

    trainer = tiny_trainer(tmp_path, dynamic_sampling=False)
    trl_sampler = GRPOTrainer._get_train_sampler(trainer)
    passes = [list(trl_sampler) for _ in range(3)]
    resumed = trainer._get_train_sampler()
    assert isinstance(resumed, EpochSampler)
    trainer.state.epoch = 2.25  # what a run resumed inside epoch 2 restores
    assert list(resumed) == passes[2] != passes[0]


def test_difference_16_signals_save_and_stop_instead_of_interrupting(tmp_path):
    import signal

    from transformers import TrainerCallback

    class SeeHandlers(TrainerCallback):
        seen: list = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.seen.append(signal.getsignal(signal.SIGINT))

    # What the process started with: Python's default handler, or SIG_IGN in a job started in the background.
    before = signal.getsignal(signal.SIGINT)
    for handling in (True, False):
        trainer = tiny_trainer(tmp_path, max_steps=1, preemption_handling=handling)
        trainer.add_callback(SeeHandlers())
        trainer.train()
        assert (SeeHandlers.seen.pop() is not before) is handling
    assert signal.getsignal(signal.SIGINT) is before, "restored after train()"


def test_difference_17_sequence_level_clip_ratios_are_trls_without_dynamic_sampling(tmp_path, monkeypatch):
    recomputed = []
    original = DAPOTrainer._fix_sequence_clip_metrics

    def spy(self, inputs, logps):
        recomputed.append(self._ds_active)
        return original(self, inputs, logps)

    monkeypatch.setattr(DAPOTrainer, "_fix_sequence_clip_metrics", spy)
    for dynamic in (False, True):
        trainer = tiny_trainer(
            tmp_path / str(dynamic), max_steps=1, importance_sampling_level="sequence", dynamic_sampling=dynamic
        )
        trainer.train()
        assert "clip_ratio/region_mean" in trainer.state.log_history[0]
    assert recomputed and all(recomputed), "recomputed only with dynamic sampling (no padding rows without it)"


def test_difference_18_vllm_dtype_auto_is_the_trainers_on_cpu_and_vllms_choice_on_a_gpu():
    from dapo_trl.trainer.vllm_colocate import resolve_dtype

    model = torch.nn.Linear(2, 2)  # float32 weights, float32 training
    assert resolve_dtype("auto", bf16=False, fp16=False, model=model, on_cpu=True) == "float32"
    assert resolve_dtype("auto", bf16=False, fp16=False, model=model, on_cpu=False) == "auto"  # as GRPOTrainer's
    assert resolve_dtype("float32", bf16=False, fp16=False, model=model, on_cpu=False) == "float32"


def test_difference_19_a_tied_model_with_an_adapter_on_its_embedding_is_refused_with_vllm():
    from peft import LoraConfig, get_peft_model

    from dapo_trl.trainer.vllm_colocate import tied_vocabulary_problem

    model, _ = tiny_model_and_tokenizer()
    assert model.config.tie_word_embeddings and tied_vocabulary_problem(model) is None
    adapted = get_peft_model(model, LoraConfig(r=2, target_modules=["embed_tokens"]))
    assert "tie_word_embeddings=True" in tied_vocabulary_problem(adapted)
