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
_NEEDS_TRL = {"dapo_config", "dapo_trainer", "rewards"}

_EXPORTS = {
    "DAPOConfig": "dapo_config",
    "DAPOTrainer": "dapo_trainer",
    "MathVerifierReward": "rewards",
    "extract_answer": "verifier",
    "verify": "verifier",
    "verify_batch": "verifier",
    "score_completion": "verifier",
    "OverlongPenalty": "overlong",
    "soft_overlong_penalty": "overlong",
    "is_truncated": "overlong",
    "classify_groups": "sampling",
    "GroupClassification": "sampling",
    "RoundPlanner": "sampling",
    "plan_selection": "sampling",
    "SelectionPlan": "sampling",
    "PromptStream": "sampling",
    "SkipPolicy": "prompt_history",
    "PromptHistory": "prompt_history",
    "clipped_surrogate": "loss",
    "token_level_mean": "loss",
    "sequence_level_mean": "loss",
    "dapo_loss": "loss",
    "PreemptionCallback": "preemption",
    "PreemptionMixin": "preemption",
    "latest_complete_checkpoint": "preemption",
    "DiagnosticsCallback": "diagnostics",
    "DiagnosticThresholds": "diagnostics",
    "Diagnosis": "diagnostics",
    "add_diagnostics": "diagnostics",
    "diagnose": "diagnostics",
    "MultipleChoiceReward": "choice",
    "extract_choice": "choice",
    "load_choice_dataset": "choice",
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
    from .choice import MultipleChoiceReward, extract_choice, load_choice_dataset
    from .dapo_config import DAPOConfig
    from .dapo_trainer import DAPOTrainer
    from .diagnostics import Diagnosis, DiagnosticsCallback, DiagnosticThresholds, add_diagnostics, diagnose
    from .loss import clipped_surrogate, dapo_loss, sequence_level_mean, token_level_mean
    from .overlong import OverlongPenalty, is_truncated, soft_overlong_penalty
    from .preemption import PreemptionCallback, PreemptionMixin, latest_complete_checkpoint
    from .prompt_history import PromptHistory, SkipPolicy
    from .rewards import MathVerifierReward
    from .sampling import (
        GroupClassification,
        PromptStream,
        RoundPlanner,
        SelectionPlan,
        classify_groups,
        plan_selection,
    )
    from .verifier import extract_answer, score_completion, verify, verify_batch
