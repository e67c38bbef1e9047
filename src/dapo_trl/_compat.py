"""
What dapo-trl needs from TRL, checked with messages that say what is missing and what to install.

Three checks, from cheapest to most specific:

1. [`check_trl_version`] at `import dapo_trl`: the installed TRL lies in [`SUPPORTED_TRL`] (the releases the suite runs
   against: [`TESTED_TRL`]). Set `DAPO_TRL_SKIP_VERSION_CHECK=1` to turn the error into a warning.
2. [`check_trl_hooks`] when `dapo_trl.dapo_trainer` is imported: every TRL or transformers method DAPOTrainer overrides
   ([`TRL_HOOKS`]) exists and takes the parameters the override passes on or reads. Whatever the version: a TRL that
   passed (1) but moved a hook, or one let through by `DAPO_TRL_SKIP_VERSION_CHECK`, is refused naming the method and
   the parameter, instead of failing mid-run.
3. [`trl_runtime_problem`] when a DAPOTrainer is built: TRL 1.15.x computes every log-probability through a fused LM
   head written in Triton, which CPU builds of torch lack; there GRPOTrainer itself fails at its first forward.

Where a TRL release changes what a hook looks like, [`TRL_HOOKS`] names the release (TRL 1.14 takes the arguments of
`_get_per_token_logps_and_entropies` as `*args, **kwargs`).
"""

from __future__ import annotations

import inspect
import os
import warnings
from dataclasses import dataclass
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import Version

SUPPORTED_RANGE = ">=1.14,<1.17"  # as pyproject.toml spells it (a SpecifierSet prints its parts sorted)
SUPPORTED_TRL = SpecifierSet(SUPPORTED_RANGE)
# The releases the suite runs against: 1.16.0 in the main environment, 1.14.2 in `make test-trl114` (README, "TRL
# versions"). 1.15.0 is not tested on CPU (see `trl_runtime_problem`).
TESTED_TRL = ("1.14.2", "1.16.0")
SKIP_ENV = "DAPO_TRL_SKIP_VERSION_CHECK"
INSTALL_HINT = f"pip install 'trl{SUPPORTED_RANGE}'"


@dataclass(frozen=True)
class Hook:
    """
    A method DAPOTrainer overrides, and what its override relies on.

    Args:
        owner (`str`):
            `"GRPOTrainer"` (TRL's, read from `trl.GRPOTrainer`) or `"Trainer"` (transformers').
        name (`str`):
            The method's name.
        positional (`tuple[str, ...]`):
            The leading parameters, `self` first, in the order the override receives and passes them on.
        keywords (`tuple[str, ...]`, *optional*, defaults to `()`):
            Keyword arguments the override reads or passes by name.
    """

    owner: str
    name: str
    positional: tuple[str, ...]
    keywords: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.owner}.{self.name}({', '.join((*self.positional, *(f'{k}=' for k in self.keywords)))})"


TRL_HOOKS: tuple[Hook, ...] = (
    Hook("GRPOTrainer", "_calculate_rewards", ("self", "inputs", "prompts", "completions", "completion_ids_list")),
    Hook("GRPOTrainer", "_generate_and_score_completions", ("self", "inputs")),
    Hook(
        "GRPOTrainer",
        "_generate_single_turn",
        ("self", "prompt_ids", "images", "multimodal_fields", "num_generations"),
    ),
    Hook("GRPOTrainer", "_prepare_inputs", ("self", "generation_batch")),
    # TRL 1.14 declares `(self, model, *args, batch_size=None, compute_aux_loss=False, **kwargs)` and forwards the rest
    # to `_full_logits_logps`; TRL 1.16 names every parameter. The override passes the first four positionally.
    Hook(
        "GRPOTrainer",
        "_get_per_token_logps_and_entropies",
        ("self", "model", "input_ids", "attention_mask", "logits_to_keep"),
        ("compute_entropy",),
    ),
    Hook("GRPOTrainer", "_compute_loss", ("self", "model", "inputs")),
    Hook("GRPOTrainer", "_tokenize_prompts", ("self", "prompts")),
    Hook("GRPOTrainer", "get_train_dataloader", ("self",)),
    Hook("GRPOTrainer", "_get_train_sampler", ("self", "dataset")),
    Hook("GRPOTrainer", "_save_checkpoint", ("self", "model", "trial")),
    Hook("GRPOTrainer", "_load_optimizer_and_scheduler", ("self", "checkpoint")),
    # PreemptionMixin (transformers' Trainer)
    Hook("Trainer", "train", ("self", "resume_from_checkpoint", "trial", "ignore_keys_for_eval")),
    Hook("Trainer", "_get_output_dir", ("self", "trial")),
    Hook("Trainer", "_push_from_checkpoint", ("self", "checkpoint_folder")),
    Hook("Trainer", "_determine_best_metric", ("self", "metrics", "trial")),
    Hook("Trainer", "_issue_warnings_after_load", ("self", "load_result")),
)


def check_trl_version(installed: str | None = None) -> None:
    """
    Raise `ImportError` when the installed TRL is outside [`SUPPORTED_TRL`].

    DAPOTrainer overrides a few TRL methods whose signatures and behaviour are pinned by tests for this range; another
    TRL may work, or may silently compute something else. Set `DAPO_TRL_SKIP_VERSION_CHECK=1` to turn the error into a
    warning at your own risk ([`check_trl_hooks`] still refuses a TRL that lacks a hooked method or parameter).
    """
    if installed is None:
        try:
            installed = metadata.version("trl")
        except metadata.PackageNotFoundError as error:
            raise ImportError(
                f"dapo-trl needs trl{SUPPORTED_RANGE}, which is not installed: {INSTALL_HINT}."
            ) from error
    if Version(installed) in SUPPORTED_TRL:
        return
    message = (
        f"dapo-trl supports trl{SUPPORTED_RANGE} (tested: {', '.join(TESTED_TRL)}) but trl {installed} is installed. "
        f"Install a supported TRL with `{INSTALL_HINT}`, or set {SKIP_ENV}=1 to try this one anyway."
    )
    if os.environ.get(SKIP_ENV) == "1":
        warnings.warn(message, stacklevel=2)
        return
    raise ImportError(message)


def check_trl_hooks(grpo_trainer: type, trainer: type | None = None, *, installed: str | None = None) -> None:
    """
    Raise `ImportError` naming the first hook of [`TRL_HOOKS`] that `grpo_trainer` (and `trainer`, transformers'
    `Trainer`, by default the one `grpo_trainer` derives from) lacks, or whose signature cannot take what the override
    passes.

    Args:
        grpo_trainer (`type`): `trl.GRPOTrainer`.
        trainer (`type`, *optional*): `transformers.Trainer`; defaults to the one imported by transformers.
        installed (`str`, *optional*): The TRL version to name in the message; defaults to the installed one.
    """
    if trainer is None:
        from transformers import Trainer as trainer
    owners = {"GRPOTrainer": grpo_trainer, "Trainer": trainer}
    for hook in TRL_HOOKS:
        problem = hook_problem(getattr(owners[hook.owner], hook.name, None), hook)
        if problem:
            version = installed or _installed_version("trl" if hook.owner == "GRPOTrainer" else "transformers")
            package = "trl" if hook.owner == "GRPOTrainer" else "transformers"
            raise ImportError(
                f"dapo-trl overrides {hook.describe()}, but in {package} {version} {problem}. This {package} is not "
                f"one dapo-trl supports: `{INSTALL_HINT}` (tested: trl {', '.join(TESTED_TRL)})."
            )


def hook_problem(method, hook: Hook) -> str | None:
    """
    What keeps `method` from taking the arguments `hook` describes, in words, or `None`.

    A leading parameter must have the expected name at its position, unless an earlier `*args` takes it; a keyword must
    be a parameter of that name or go to `**kwargs` (TRL 1.14's `_get_per_token_logps_and_entropies` forwards both).

    Example:
    ```python
    >>> hook = Hook("GRPOTrainer", "f", ("self", "model", "inputs"), ("compute_entropy",))
    >>> hook_problem(lambda self, model, *args, **kwargs: None, hook) is None
    True
    >>> hook_problem(lambda self, model, batch: None, hook)
    "its parameter 2 is 'batch', not 'inputs' (signature (self, model, batch))"

    ```
    """
    if method is None:
        return f"{hook.owner}.{hook.name} does not exist"
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return f"{hook.owner}.{hook.name} has no readable signature"
    params = list(signature.parameters.values())
    has_var_positional = False
    for index, expected in enumerate(hook.positional):
        if index < len(params) and params[index].kind is inspect.Parameter.VAR_POSITIONAL:
            has_var_positional = True
        if has_var_positional:
            break
        if index >= len(params) or params[index].kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            return f"it takes no parameter {expected!r} at position {index} (signature {signature})"
        if params[index].name != expected:
            return f"its parameter {index} is {params[index].name!r}, not {expected!r} (signature {signature})"
    names = {p.name for p in params if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    for keyword in hook.keywords:
        if keyword not in names and not takes_kwargs:
            return f"it takes no keyword {keyword!r} (signature {signature})"
    return None


def trl_runtime_problem(installed: str | None = None, *, fused_kernel_available: bool | None = None) -> str | None:
    """
    Why the installed TRL cannot train on this machine, or `None`.

    TRL 1.15.x computes the log-probabilities of every forward (GRPOTrainer's too) with a fused LM head whose kernel
    needs Triton; without Triton (CPU builds of torch) its first forward raises `AttributeError: 'NoneType' object has
    no attribute 'apply'`. TRL 1.14 and 1.16 compute them in plain torch.

    Example:
    ```python
    >>> trl_runtime_problem("1.16.0") is None, trl_runtime_problem("1.15.0", fused_kernel_available=True) is None
    (True, True)
    >>> trl_runtime_problem("1.15.0", fused_kernel_available=False)[:48]
    'trl 1.15.0 computes log-probabilities with a fus'

    ```
    """
    installed = installed or _installed_version("trl")
    if Version(installed) not in SpecifierSet("==1.15.*"):
        return None
    if fused_kernel_available is None:
        from trl.trainer import utils as trl_utils

        fused_kernel_available = getattr(trl_utils, "_ChunkedLogProbFunction", None) is not None
    if fused_kernel_available:
        return None
    return (
        f"trl {installed} computes log-probabilities with a fused LM head whose kernel needs Triton, which this torch "
        "build lacks (CPU builds have none): GRPOTrainer and DAPOTrainer fail at their first forward here. Install "
        f"TRL 1.14.2 or 1.16 (`pip install 'trl==1.16.*'`), or run on a GPU machine with Triton."
    )


def _installed_version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "(not installed)"
