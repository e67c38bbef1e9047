"""Pins the TRL surface DAPOTrainer builds on, so a TRL release that moves it fails here, loudly."""

import inspect

import pytest
import trl
from packaging.version import Version
from trl import GRPOTrainer

from dapo_trl._compat import (
    SUPPORTED_RANGE,
    SUPPORTED_TRL,
    TRL_HOOKS,
    check_trl_hooks,
    check_trl_version,
    hook_problem,
    trl_runtime_problem,
)
from dapo_trl.dapo_trainer import DAPOTrainer


@pytest.mark.parametrize("hook", [h for h in TRL_HOOKS if h.owner == "GRPOTrainer"], ids=lambda h: h.name)
def test_overridden_trl_methods_keep_their_signature(hook):
    from dapo_trl.trainer.dynamic_sampling import DynamicSamplingMixin

    assert hook_problem(getattr(GRPOTrainer, hook.name, None), hook) is None
    overriding = DAPOTrainer if hook.name in DAPOTrainer.__dict__ else DynamicSamplingMixin
    assert hook.name in overriding.__dict__, f"DAPOTrainer no longer overrides {hook.name}: drop it from TRL_HOOKS"


def test_every_trl_method_the_trainer_overrides_is_checked():
    """A new override of a GRPOTrainer method must be added to TRL_HOOKS, so that the import check covers it."""
    from dapo_trl.trainer.dynamic_sampling import DynamicSamplingMixin

    overridden = {
        name
        for cls in (DAPOTrainer, DynamicSamplingMixin)
        for name, value in cls.__dict__.items()
        if callable(value) and name != "__init__" and hasattr(GRPOTrainer, name)
    }
    assert overridden <= {hook.name for hook in TRL_HOOKS}, overridden - {hook.name for hook in TRL_HOOKS}


def test_generated_rows_come_back_as_completion_ids_and_logprobs():
    # DynamicSamplingMixin concatenates the chunks as (completion_ids, logprobs): both per-row lists (logprobs may be
    # None).
    assert "return completion_ids, logprobs" in inspect.getsource(GRPOTrainer._generate_single_turn)


def fake_grpo_trainer(**replaced):
    """A GRPOTrainer subclass with some methods replaced (`None`: removed), as a TRL release that moved them."""
    namespace = {name: method for name, method in replaced.items() if method is not None}
    cls = type("GRPOTrainer", (GRPOTrainer,), namespace)
    for name in [name for name, method in replaced.items() if method is None]:
        setattr(cls, name, None)
    return cls


def test_the_import_check_names_a_missing_method():
    with pytest.raises(ImportError, match=r"GRPOTrainer\._calculate_rewards does not exist") as error:
        check_trl_hooks(fake_grpo_trainer(_calculate_rewards=None), installed="9.9.9")
    assert "trl 9.9.9" in str(error.value) and "pip install 'trl>=1.14,<1.17'" in str(error.value)


def test_the_import_check_names_a_moved_or_missing_parameter():
    with pytest.raises(
        ImportError, match=r"_compute_loss\(self, model, inputs\).*parameter 2 is 'batch', not 'inputs'"
    ):
        check_trl_hooks(fake_grpo_trainer(_compute_loss=lambda self, model, batch: None))
    with pytest.raises(ImportError, match="takes no keyword 'compute_entropy'"):
        check_trl_hooks(
            fake_grpo_trainer(
                _get_per_token_logps_and_entropies=lambda self, model, input_ids, attention_mask, logits_to_keep: None
            )
        )


def test_the_import_check_accepts_trl_1_14s_forwarded_arguments():
    """TRL 1.14.2 declares `_get_per_token_logps_and_entropies(self, model, *args, batch_size=None, ...,
    **kwargs)`: the override's positional arguments and `compute_entropy` reach its `*args` and `**kwargs`."""

    def trl_1_14(self, model, *args, batch_size=None, compute_aux_loss=False, **kwargs):
        return None

    check_trl_hooks(fake_grpo_trainer(_get_per_token_logps_and_entropies=trl_1_14))


def test_trl_1_15_without_triton_is_refused_before_training_with_what_to_install():
    assert trl_runtime_problem("1.16.0") is None and trl_runtime_problem("1.14.2") is None
    assert trl_runtime_problem("1.15.0", fused_kernel_available=True) is None
    problem = trl_runtime_problem("1.15.0", fused_kernel_available=False)
    assert "Triton" in problem and "1.14.2 or 1.16" in problem


# transformers Trainer method -> the parameters PreemptionMixin's override passes on or relies on
MIXIN_OVERRIDDEN = {
    "train": ["self", "resume_from_checkpoint", "trial", "ignore_keys_for_eval"],
    "_get_output_dir": ["self", "trial"],
    "_save_checkpoint": ["self", "model", "trial"],
    "_push_from_checkpoint": ["self", "checkpoint_folder"],
    "_determine_best_metric": ["self", "metrics", "trial"],
    "_issue_warnings_after_load": ["self", "load_result"],
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
    # The Trainer must not divide the loss by GA again: TRL 1.16 says so with `loss_is_scaled_for_ga = True`, TRL 1.14
    # by passing a dummy `compute_loss_func` to `Trainer.__init__` (transformers then skips the division too).
    if Version(trl.__version__) >= Version("1.16"):
        assert GRPOTrainer.loss_is_scaled_for_ga is True
    else:
        assert 'compute_loss_func="non-None value to disable scaling"' in inspect.getsource(GRPOTrainer.__init__)


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
    for supported in ("1.14.0", "1.14.2", "1.15.0", "1.16.3"):
        check_trl_version(supported)
    with pytest.raises(
        ImportError, match=r"supports trl.*1\.17.*tested: 1\.14\.2, 1\.16\.0.* but trl 1\.13\.0 is installed"
    ):
        check_trl_version("1.13.0")
    with pytest.raises(ImportError, match="1.17.0"):
        check_trl_version("1.17.0")
    monkeypatch.setenv("DAPO_TRL_SKIP_VERSION_CHECK", "1")
    with pytest.warns(UserWarning, match="1.13.0"):
        check_trl_version("1.13.0")
    assert "1.16.0" in SUPPORTED_TRL and "1.14.2" in SUPPORTED_TRL


def test_the_supported_range_is_the_one_pyproject_declares():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert f"trl{SUPPORTED_RANGE}" in [d.replace(" ", "") for d in project["dependencies"]]
    assert f"trl[vllm]{SUPPORTED_RANGE}" in project["optional-dependencies"]["vllm"]


def test_public_api_resolves_and_is_typed():
    import pathlib

    import dapo_trl

    assert sorted(dapo_trl.__all__) == sorted([*dapo_trl._EXPORTS, "__version__"])
    for name in dapo_trl.__all__:
        assert getattr(dapo_trl, name) is not None, name
    assert (pathlib.Path(dapo_trl.__file__).parent / "py.typed").exists()


def test_doctests():
    import doctest

    from dapo_trl import _compat

    assert doctest.testmod(_compat).failed == 0
