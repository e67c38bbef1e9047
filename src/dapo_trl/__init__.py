"""DAPO for Hugging Face TRL: decoupled clipping, dynamic sampling, token-level loss and overlong shaping.

Public API (what `__all__` lists is what users may rely on; modules and names starting with `_` are private):

- [`DAPOConfig`], [`DAPOTrainer`]: the trainer and its configuration.
- [`MathVerifierReward`], [`extract_answer`], [`verify`], [`verify_batch`], [`score_completion`]: the rule-based math
  reward and its pure pieces.
- [`OverlongPenalty`], [`soft_overlong_penalty`], [`is_truncated`]: overlong reward shaping (Eq. 13).
- [`classify_groups`], [`RoundPlanner`], [`plan_selection`], [`PromptStream`], [`SelectionPlan`]: dynamic sampling
  decisions, for subclasses that override the trainer's extension points.
- [`SkipPolicy`], [`PromptHistory`]: pre-rollout skipping of prompts whose recent groups were all zero-variance.
- [`clipped_surrogate`], [`token_level_mean`], [`sequence_level_mean`], [`dapo_loss`]: the objective as pure functions.
- [`PreemptionCallback`], [`PreemptionMixin`], [`latest_complete_checkpoint`]: preemption-safe training for any
  transformers `Trainer` (built into DAPOTrainer).
- [`DiagnosticsCallback`], [`add_diagnostics`], [`diagnose`], [`DiagnosticThresholds`], [`Diagnosis`]: live diagnosis
  of GRPO's failure modes from the logged metrics.
- [`MultipleChoiceReward`], [`extract_choice`], [`load_choice_dataset`]: multiple-choice questions (a domain beyond
  math), composable with TRL's `think_format_reward`.
- [`tiny_model_and_tokenizer`]: a tiny model and tokenizer built offline, for a first script or a test.
- [`released_process_group`], [`release_process_group`]: the end of a distributed script: free the process group
  (gloo's threads) before interpreter exit.

Layout: `trainer/` holds the trainer's steps (most of them pure functions), `rewards/` the reward functions,
`verifier/` the math verifier, `run/` what surrounds a run (data, evaluation, launch, plan, console); `dapo_config` and
`dapo_trainer` are the entry. `dapo_trl.data`, `dapo_trl.evaluation` and `dapo_trl.launch` are aliases of `dapo_trl.run.*`.

Names are imported lazily, so that `import dapo_trl.verifier` pays for neither TRL nor torch; the verifier works without
TRL installed, while the trainer and the reward function need it (the TRL version is checked when TRL is installed).
"""

from importlib import import_module, metadata
from typing import TYPE_CHECKING

from ._compat import check_trl_version

__version__ = "0.1.0"

try:
    _trl_installed = bool(metadata.version("trl"))
except metadata.PackageNotFoundError:
    _trl_installed = False
if _trl_installed:
    check_trl_version()
_NEEDS_TRL = {"dapo_config", "dapo_trainer", "rewards.math", "rewards.choice"}

_EXPORTS = {
    "DAPOConfig": "dapo_config",
    "DAPOTrainer": "dapo_trainer",
    "MathVerifierReward": "rewards.math",
    "extract_answer": "verifier",
    "verify": "verifier",
    "verify_batch": "verifier",
    "score_completion": "verifier",
    "OverlongPenalty": "trainer.overlong",
    "soft_overlong_penalty": "trainer.overlong",
    "is_truncated": "trainer.overlong",
    "classify_groups": "trainer.sampling",
    "GroupClassification": "trainer.sampling",
    "RoundPlanner": "trainer.sampling",
    "plan_selection": "trainer.sampling",
    "SelectionPlan": "trainer.sampling",
    "PromptStream": "trainer.sampling",
    "SkipPolicy": "trainer.prompt_history",
    "PromptHistory": "trainer.prompt_history",
    "clipped_surrogate": "trainer.loss",
    "token_level_mean": "trainer.loss",
    "sequence_level_mean": "trainer.loss",
    "dapo_loss": "trainer.loss",
    "PreemptionCallback": "trainer.preemption",
    "PreemptionMixin": "trainer.preemption",
    "latest_complete_checkpoint": "trainer.preemption",
    "DiagnosticsCallback": "trainer.diagnostics",
    "DiagnosticThresholds": "trainer.diagnostics",
    "Diagnosis": "trainer.diagnostics",
    "add_diagnostics": "trainer.diagnostics",
    "diagnose": "trainer.diagnostics",
    "MultipleChoiceReward": "rewards.choice",
    "extract_choice": "rewards.choice",
    "load_choice_dataset": "rewards.choice",
    "tiny_model_and_tokenizer": "run.toy",
    "release_process_group": "run.process_group",
    "released_process_group": "run.process_group",
}

__all__ = [
    "DAPOConfig",
    "DAPOTrainer",
    "GroupClassification",
    "MathVerifierReward",
    "OverlongPenalty",
    "PromptHistory",
    "PreemptionCallback",
    "PreemptionMixin",
    "PromptStream",
    "RoundPlanner",
    "SelectionPlan",
    "SkipPolicy",
    "__version__",
    "classify_groups",
    "clipped_surrogate",
    "dapo_loss",
    "extract_answer",
    "is_truncated",
    "latest_complete_checkpoint",
    "plan_selection",
    "sequence_level_mean",
    "soft_overlong_penalty",
    "token_level_mean",
    "score_completion",
    "verify",
    "verify_batch",
    "DiagnosticsCallback",
    "DiagnosticThresholds",
    "Diagnosis",
    "add_diagnostics",
    "diagnose",
    "MultipleChoiceReward",
    "extract_choice",
    "load_choice_dataset",
    "tiny_model_and_tokenizer",
    "release_process_group",
    "released_process_group",
]


def __getattr__(name: str):
    if name in _EXPORTS:
        if _EXPORTS[name] in _NEEDS_TRL and not _trl_installed:
            check_trl_version()  # raises: TRL is not installed, and says which version to install
        value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(__all__)


if TYPE_CHECKING:
    from .dapo_config import DAPOConfig
    from .dapo_trainer import DAPOTrainer
    from .rewards.choice import MultipleChoiceReward, extract_choice, load_choice_dataset
    from .rewards.math import MathVerifierReward
    from .run.process_group import release_process_group, released_process_group
    from .run.toy import tiny_model_and_tokenizer
    from .trainer.diagnostics import Diagnosis, DiagnosticsCallback, DiagnosticThresholds, add_diagnostics, diagnose
    from .trainer.loss import clipped_surrogate, dapo_loss, sequence_level_mean, token_level_mean
    from .trainer.overlong import OverlongPenalty, is_truncated, soft_overlong_penalty
    from .trainer.preemption import PreemptionCallback, PreemptionMixin, latest_complete_checkpoint
    from .trainer.prompt_history import PromptHistory, SkipPolicy
    from .trainer.sampling import (
        GroupClassification,
        PromptStream,
        RoundPlanner,
        SelectionPlan,
        classify_groups,
        plan_selection,
    )
    from .verifier import extract_answer, score_completion, verify, verify_batch
