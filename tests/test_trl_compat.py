"""Pins the TRL surface DAPOTrainer builds on, so a TRL release that moves it fails here, loudly."""

import inspect

import pytest
from trl import GRPOTrainer

from dapo_trl._compat import SUPPORTED_TRL, check_trl_version
from dapo_trl.dapo_trainer import DAPOTrainer

# TRL method -> the leading parameters DAPOTrainer's override relies on
OVERRIDDEN = {
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    "_generate_and_score_completions": ["self", "inputs"],
    "_prepare_inputs": ["self", "generation_batch"],
    "_get_per_token_logps_and_entropies": [
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
    ],
    "_compute_loss": ["self", "model", "inputs"],
    "_save_checkpoint": ["self", "model", "trial"],
    "_load_optimizer_and_scheduler": ["self", "checkpoint"],
    "get_train_dataloader": ["self"],
    "_get_train_sampler": ["self", "dataset"],
    "_tokenize_prompts": ["self", "prompts"],
}


@pytest.mark.parametrize("name", sorted(OVERRIDDEN))
def test_overridden_trl_methods_keep_their_signature(name):
    params = list(inspect.signature(getattr(GRPOTrainer, name)).parameters)
    expected = OVERRIDDEN[name]
    assert params[: len(expected)] == expected, f"GRPOTrainer.{name} changed: {params}"
    assert name in DAPOTrainer.__dict__, f"DAPOTrainer no longer overrides {name}"


# TRL method -> the leading parameters DynamicSamplingMixin's override relies on (generation of a round in chunks)
DYNAMIC_SAMPLING_OVERRIDDEN = {
    "_generate_single_turn": ["self", "prompt_ids", "images", "multimodal_fields", "num_generations"],
}


@pytest.mark.parametrize("name", sorted(DYNAMIC_SAMPLING_OVERRIDDEN))
def test_dynamic_sampling_overrides_keep_their_signature(name):
    from dapo_trl.trainer.dynamic_sampling import DynamicSamplingMixin

    params = list(inspect.signature(getattr(GRPOTrainer, name)).parameters)
    expected = DYNAMIC_SAMPLING_OVERRIDDEN[name]
    assert params[: len(expected)] == expected, f"GRPOTrainer.{name} changed: {params}"
    assert name in DynamicSamplingMixin.__dict__
    # The chunks are concatenated as (completion_ids, logprobs): both per-row lists (logprobs may be None).
    assert "return completion_ids, logprobs" in inspect.getsource(getattr(GRPOTrainer, name))


# transformers Trainer method -> the parameters PreemptionMixin's override passes on or relies on
MIXIN_OVERRIDDEN = {
    "train": ["self", "resume_from_checkpoint", "trial", "ignore_keys_for_eval"],
    "_get_output_dir": ["self", "trial"],
    "_save_checkpoint": ["self", "model", "trial"],
    "_push_from_checkpoint": ["self", "checkpoint_folder"],
    "_determine_best_metric": ["self", "metrics", "trial"],
}


@pytest.mark.parametrize("name", sorted(MIXIN_OVERRIDDEN))
def test_preemption_mixin_overrides_keep_their_signature(name):
    from transformers import Trainer

    from dapo_trl.trainer.preemption import PreemptionMixin

    assert list(inspect.signature(getattr(Trainer, name)).parameters) == MIXIN_OVERRIDDEN[name], name
    assert name in PreemptionMixin.__dict__
    assert DAPOTrainer.__mro__.index(PreemptionMixin) < DAPOTrainer.__mro__.index(GRPOTrainer)


def test_checkpoints_are_written_under_the_output_dir_the_mixin_redirects():
    """PreemptionMixin stages a checkpoint by redirecting `_get_output_dir`: Trainer must build its path from it."""
    from transformers import Trainer

    source = inspect.getsource(Trainer._save_checkpoint)
    assert "run_dir = self._get_output_dir(trial=trial)" in source
    assert "output_dir = os.path.join(run_dir, checkpoint_folder)" in source


def test_hub_uploads_of_the_run_folder_leave_out_the_staging_folders():
    """Checkpoints are staged in `_partial-checkpoint-N/`: transformers' uploads of the run folder must ignore `_*`."""
    from transformers import Trainer

    for method in (Trainer.push_to_hub, Trainer._push_from_checkpoint):
        assert 'ignore_patterns=["_*", f"{PREFIX_CHECKPOINT_DIR}-*"]' in inspect.getsource(method), method.__name__
    assert "self._push_from_checkpoint(output_dir)" in inspect.getsource(Trainer._save_checkpoint)


def test_trl_loss_normaliser_formula_is_the_one_inverted():
    """`trl_num_items_for_exact_normalizer` inverts this exact expression of GRPOTrainer._compute_loss."""
    source = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes' in source
    assert "normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation" in (
        source
    )
    assert GRPOTrainer.loss_is_scaled_for_ga is True  # the Trainer must not divide by GA again


def test_trl_reads_old_logprobs_after_the_loss_forward():
    """Fresh rows next to carried ones get their old log-probabilities from the loss forward itself: TRL must read
    `inputs["old_per_token_logps"]` after that forward, and take the aligned case's `per_token_logps.detach()`."""
    source = inspect.getsource(GRPOTrainer._compute_loss)
    forward = source.index("self._get_per_token_logps_and_entropies(")
    read = source.index('old_per_token_logps = inputs.get("old_per_token_logps")')
    assert forward < read
    assert "per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps" in source


def test_trl_unscorable_rule_is_the_one_mirrored():
    """`compute_advantages` mirrors TRL's rule for rows every reward left unscored."""
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)" in source
    assert "advantages = torch.nan_to_num(advantages, nan=0.0)" in source


def test_constructor_is_a_drop_in_replacement():
    grpo = list(inspect.signature(GRPOTrainer.__init__).parameters)
    dapo = list(inspect.signature(DAPOTrainer.__init__).parameters)
    assert dapo == grpo


def test_trl_attributes_used_by_the_glue_exist():
    source = inspect.getsource(GRPOTrainer.__init__) + inspect.getsource(GRPOTrainer._prepare_inputs)
    for attribute in [
        "self.reward_funcs",
        "self.reward_func_names",
        "self.reward_processing_classes",
        "self.reward_weights",
        "self.eos_token_ids",
        "self._buffered_inputs",
        "self._step",
        "self._metrics",
        "self._is_vlm",
        "self.shuffle_dataset",
        "self.num_iterations",
        "self.loss_type",
        "self.epsilon_high",
        "self.epsilon_low",
        "self._logs",
        "self.log_completions",
        "self.scale_rewards",
        "self.multi_objective_aggregation",
        "self.num_generations_eval",
        "self.importance_sampling_level",
        "self.vllm_importance_sampling_correction",
    ]:
        assert attribute in source or attribute in inspect.getsource(GRPOTrainer), attribute


def test_version_check_names_both_versions(monkeypatch):
    check_trl_version("1.16.3")
    with pytest.raises(ImportError, match=r"supports trl.*1\.17.* but trl 1\.15\.0 is installed"):
        check_trl_version("1.15.0")
    with pytest.raises(ImportError, match="2.0.0"):
        check_trl_version("2.0.0")
    monkeypatch.setenv("DAPO_TRL_SKIP_VERSION_CHECK", "1")
    with pytest.warns(UserWarning, match="1.15.0"):
        check_trl_version("1.15.0")
    assert "1.16.0" in SUPPORTED_TRL


def test_public_api_resolves_and_is_typed():
    import pathlib

    import dapo_trl

    assert sorted(dapo_trl.__all__) == sorted([*dapo_trl._EXPORTS, "__version__"])
    for name in dapo_trl.__all__:
        assert getattr(dapo_trl, name) is not None, name
    assert (pathlib.Path(dapo_trl.__file__).parent / "py.typed").exists()
