"""The reward-function contract, checked where a broken reward is visible and named when it is not honoured.

TRL calls each reward function as `func(prompts=..., completions=..., completion_ids=..., **columns)` and expects a
list with one `float` (or `None`, "cannot score this one") per completion; like TRL, a `bool` counts as 1.0 / 0.0. A
function that breaks this contract today fails deep inside TRL (`'float' object is not iterable`), or worse passes
silently: `NaN` is read as "unscored", infinity or 1e30 turns every advantage of the batch into 0. This module:

- checks the reward functions given to the trainer ([`check_reward_funcs`]): a class instead of an instance, a name
  that TRL would try to load as a reward model, two functions with the same metric name;
- checks one call's output ([`check_reward_output`]) and returns a message naming the function and what it returned;
- wraps a function so its outputs are checked while TRL calls it ([`checked_reward`]); problems are collected rather
  than raised, so that in a multi-process run every process can raise together after TRL's collective gather;
- replaces TRL's per-call "All reward functions returned None" warning by one message per problem
  ([`quiet_trl_unscored_warning`], [`unscored_rows_message`]).
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

from trl.trainer.utils import get_callable_name, is_async_callable

logger = logging.getLogger(__name__)

# Largest reward magnitude accepted: float32 group statistics square the rewards (overflow near 1.8e19), and a reward
# this large is a bug (an unscaled log-likelihood, a sentinel value) rather than a score.
MAX_ABS_REWARD = 1e9


def callable_name(func: Any) -> str:
    """The name TRL logs a reward function under (`rewards/<name>/mean`): a reward model's id, else TRL's own rule."""
    config = getattr(func, "config", None)
    if config is not None and hasattr(config, "_name_or_path"):
        return str(config._name_or_path).split("/")[-1]
    return get_callable_name(func)


def check_reward_funcs(reward_funcs: Any) -> None:
    """
    Refuse reward functions TRL would mishandle, with a message saying what to pass instead; warn about duplicated
    names. Called before TRL sees them.
    """
    funcs = reward_funcs if isinstance(reward_funcs, list | tuple) else [reward_funcs]
    for i, func in enumerate(funcs):
        if isinstance(func, type):
            raise TypeError(
                f"reward_funcs[{i}] is the class {func.__name__}, not a reward function: pass an instance, e.g. "
                f"{func.__name__}()."
            )
        if isinstance(func, str) and "/" not in func and not os.path.isdir(func):
            raise ValueError(
                f"reward_funcs[{i}] is the string {func!r}. TRL loads a string as a reward *model* (a Hub id such as "
                "'org/model' or a local folder), and no folder of that name exists. To use a reward function, pass "
                "the callable itself (e.g. MathVerifierReward() or a function), not its name."
            )
        if not isinstance(func, str) and not callable(func):
            raise TypeError(f"reward_funcs[{i}] is a {type(func).__name__}, which is not callable.")
    names = [callable_name(f) if not isinstance(f, str) else f.split("/")[-1] for f in funcs]
    repeated = sorted(name for name, count in Counter(names).items() if count > 1)
    if repeated:
        logger.warning(
            f"Several reward functions share the name(s) {repeated}: their `rewards/<name>/*` metrics and completion "
            "table columns merge, and `dynamic_sampling_reward` cannot tell them apart. Give each a distinct "
            "`__name__`."
        )


def constant_reward_advice(value: float, *, filters: bool, correct_value: float | None) -> str:
    """
    What to do about a reward function that gave one value to every completion of a batch. A reward that declares its
    correct value (`correct_reward`, as MathVerifierReward does) reads the completion: one value below it means every
    completion was wrong (the model does not solve the prompts yet), one at it that every completion was right, and
    neither is fixed by choosing another filter reward or by more rounds. Without a correct value the two readings
    (prompts far from the model's level, a reward that ignores the completion) cannot be told apart, so both are named.

    Example:
    ```python
    >>> constant_reward_advice(-1.0, filters=True, correct_value=1.0).split(":")[0]
    'Every completion was scored wrong (-1, below the correct value 1)'
    >>> "dynamic_sampling_reward" in constant_reward_advice(1.0, filters=True, correct_value=None)
    True

    ```
    """
    if correct_value is not None and value < correct_value:
        return (
            f"Every completion was scored wrong ({value:g}, below the correct value {correct_value:g}): the model does "
            "not solve these prompts yet, or does not write its answer where the reward reads it. No group can be "
            "informative until some completions are right: use easier prompts, warm the model up first (a short "
            "supervised pass on answers in the reward's format, see docs/real_model.md), and check the answer column."
        )
    if correct_value is not None:
        return (
            f"Every completion was scored correct ({value:g}): the prompts are too easy for the model; use harder "
            "ones (dynamic_sampling_skip leaves out prompts that are always solved)."
        )
    if filters:
        return (
            "Dynamic sampling filters on this reward (dynamic_sampling_reward), so no group can be informative while "
            "it scores every completion alike. If it does not look at the completion, set dynamic_sampling_reward to "
            "the reward that does (or 'total')."
        )
    return (
        "Either every completion is scored alike (the prompts are far too easy or too hard for the model) or the "
        "function does not look at the completion; check it."
    )


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_reward_output(name: str, output: Any, num_rows: int) -> tuple[list[float | None], str | None]:
    """
    Check one call's output against the contract.

    Returns `(rewards, problem)`: the rewards as a list of `float | None` (all `None` when the output is unusable, so
    the caller can continue to a collective point), and `None` or a message naming the function and the offence.

    Example:
    ```python
    >>> check_reward_output("acc", [1, None, 0.5], 3)
    ([1.0, None, 0.5], None)
    >>> check_reward_output("acc", [True, False], 2)
    ([1.0, 0.0], None)
    >>> check_reward_output("acc", 1.0, 3)[1]
    "reward function 'acc' returned a float (1.0), not a list with one reward per completion (3 expected)."

    ```
    """
    blank: list[float | None] = [None] * num_rows
    try:
        values = list(output) if not isinstance(output, str | bytes | dict) else None
    except TypeError:
        values = None
    if values is None:
        return blank, (
            f"reward function {name!r} returned a {type(output).__name__} ({_describe(output)}), not a list with one "
            f"reward per completion ({num_rows} expected)."
        )
    if len(values) != num_rows:
        return blank, (
            f"reward function {name!r} returned {len(values)} rewards for {num_rows} completions: it must return "
            "exactly one value (a float, or None when it cannot score a completion) per completion."
        )
    rewards: list[float | None] = []
    for i, value in enumerate(values):
        if value is None:
            rewards.append(None)
            continue
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()  # numpy and torch scalars, numpy.bool_ included
        if isinstance(value, bool):  # `[pred == gold for ...]`: TRL reads True/False as 1.0/0.0
            value = float(value)
        if not isinstance(value, numbers.Real):
            return blank, (
                f"reward function {name!r} returned {_describe(value)} (a {type(value).__name__}) for completion "
                f"{i}: rewards must be numbers, or None for a completion it cannot score."
            )
        value = float(value)
        if math.isnan(value):
            return blank, (
                f"reward function {name!r} returned NaN for completion {i}. Return None for a completion that "
                "cannot be scored (it is then left out of its group's baseline); NaN is ambiguous."
            )
        if math.isinf(value) or abs(value) > MAX_ABS_REWARD:
            return blank, (
                f"reward function {name!r} returned {value!r} for completion {i}: rewards must be finite and at "
                f"most {MAX_ABS_REWARD:.0e} in magnitude (larger values overflow the float32 group statistics and "
                "zero every advantage). Rescale the reward."
            )
        rewards.append(value)
    return rewards, None


TRL_UNSCORED_WARNING = "All reward functions returned None"
TRL_LOGGER = "trl.trainer.grpo_trainer"


class _DropTrlUnscoredWarning(logging.Filter):
    def __init__(self, let_through: Callable[[], bool]) -> None:
        super().__init__()
        self.let_through = let_through

    def filter(self, record: logging.LogRecord) -> bool:
        # accelerate may prefix "[RANK 0] "
        return TRL_UNSCORED_WARNING not in record.getMessage() or self.let_through()


@contextlib.contextmanager
def quiet_trl_unscored_warning(let_through: Callable[[], bool] = lambda: False):
    """
    Hold back TRL's "All reward functions returned None" warning, which TRL prints for every call with an unscorable
    row and also after a reward broke the contract (the checked wrapper returns None for it), except when
    `let_through()` says otherwise (the trainer lets the first one through, as GRPOTrainer logs it, then says once what
    is wrong: [`unscored_rows_message`], or the contract error instead).
    """
    trl_logger, quiet = logging.getLogger(TRL_LOGGER), _DropTrlUnscoredWarning(let_through)
    trl_logger.addFilter(quiet)
    try:
        yield
    finally:
        trl_logger.removeFilter(quiet)


def _excerpt(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else repr(value)
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def unscored_rows_message(num_unscored: int, num_rows: int, example: tuple[Any, Any] | None) -> str:
    """
    The one warning about rows that no reward function could score (every function returned `None` for them).

    Example:
    ```python
    >>> unscored_rows_message(2, 8, ("1+1=", "Answer: 2"))[:69]
    'No reward function could score 2 of the 8 completions of this batch ('

    ```
    """
    shown = (
        f"e.g. prompt {_excerpt(example[0])}, completion {_excerpt(example[1])}" if example else "on another process"
    )
    return (
        f"No reward function could score {num_unscored} of the {num_rows} completions of this batch ({shown}): every "
        "reward function returned None for them, so they get no advantage and are never trained on. The usual causes "
        "are gold answers a verifier cannot use (see its own warning) or a dataset column a reward does not find. "
        "This is said once; later batches with unscorable completions are logged at DEBUG level."
    )


def checked_reward(func: Callable, name: str, problems: list[str]) -> Callable:
    """
    `func` with its outputs checked by [`check_reward_output`]; a problem is appended to `problems` and the call
    returns all-`None` rewards instead of raising, so the caller decides when to raise (after collectives).
    """
    if is_async_callable(func):  # TRL's own test, so TRL awaits the wrapper exactly when it would await `func`

        async def check_async(*args, completions, **kwargs):
            output = await func(*args, completions=completions, **kwargs)
            rewards, problem = check_reward_output(name, output, len(completions))
            if problem:
                problems.append(problem)
            return rewards

        check_async.__name__ = name
        return check_async

    def check(*args, completions, **kwargs):
        output = func(*args, completions=completions, **kwargs)
        rewards, problem = check_reward_output(name, output, len(completions))
        if problem:
            problems.append(problem)
        return rewards

    check.__name__ = name
    return check


def tolerance_problem(tolerance: float, filter_func: Any, name: str) -> str | None:
    """
    Why `dynamic_sampling_tolerance` leaves no group informative under the filter reward `filter_func` (named `name`),
    or `None`: a group is informative when its values spread wider than the tolerance, and a reward declaring
    `correct_reward` and `incorrect_reward` spreads at most their gap.

    Example:
    ```python
    >>> class Verifier:
    ...     correct_reward, incorrect_reward = 1.0, 0.0
    >>> tolerance_problem(1.0, Verifier(), "verifier")[:64]
    'dynamic_sampling_tolerance=1 is not below the gap of 1 between t'
    >>> tolerance_problem(0.5, Verifier(), "verifier") is None
    True

    ```
    """
    correct, incorrect = getattr(filter_func, "correct_reward", None), getattr(filter_func, "incorrect_reward", None)
    if not all(isinstance(v, numbers.Real) for v in (correct, incorrect)):
        return None
    gap = abs(float(correct) - float(incorrect))
    if tolerance < gap:
        return None
    return (
        f"dynamic_sampling_tolerance={tolerance:g} is not below the gap of {gap:g} between the correct ({correct:g}) "
        f"and incorrect ({incorrect:g}) rewards of {name!r}, the reward dynamic sampling filters on: no group could "
        f"ever count as informative and nothing would be trained. Set dynamic_sampling_tolerance below {gap:g} (0 "
        "keeps every group whose rewards differ)."
    )
