r"""Group-relative advantages with DAPO's overlong shaping, as a pure function of the rewards.

TRL computes advantages inside `GRPOTrainer._generate_and_score_completions`, once per generation call, from the
reward columns it was given. DAPOTrainer needs the same numbers computed later and over another population: dynamic
sampling trains on groups collected over several generation rounds (and carried from the previous step), and the
overlong penalty of Eq. 13 must act on the advantage without becoming a reward column of its own. [`compute_advantages`]
reproduces TRL 1.16's formulas (`tests/test_advantages.py` checks them against GRPOTrainer to 1e-6) and adds the
penalty term.

Notation: rows are completions, `G` consecutive rows form a group, `r_{i,k}` is reward function `k` on row `i` (`NaN`
where it returned `None`), `w_k` its weight, `p_i` the overlong penalty of row `i` (0 without shaping). A row is
*unscorable* when every reward function returned `None` for it: it gets no penalty, stays out of every mean and
standard deviation below, and its advantage is 0 (TRL's rule, kept with shaping on).

- `multi_objective_aggregation="sum_then_normalize"` (TRL's default):
  $R_i = \sum_k w_k r_{i,k} + p_i$ (missing rewards count as 0, as in TRL's `nansum`), then
  $A_i = (R_i - \operatorname{mean}_{\text{group}(i)} R) / (s_i + 10^{-4})$ where $s_i$ is the group's standard
  deviation (`scale_rewards="group"`, DAPO Eq. 9), the standard deviation over every scorable row of the population
  (`"batch"`), or no division at all (`"none"`).
- `multi_objective_aggregation="normalize_then_sum"`: each reward is normalised within its group first,
  $\tilde r_{i,k} = (r_{i,k} - \operatorname{mean}_{\text{group}} r_k) / (\operatorname{std}_{\text{group}} r_k + 10^{-4})$,
  then $R_i = \sum_k w_k \tilde r_{i,k} + p_i$ and $A_i = (R_i - \operatorname{mean} R) / (\operatorname{std} R + 10^{-4})$
  over the population (TRL ignores `scale_rewards` here, and so does this function). The penalty is added *raw*, after
  the per-reward normalisation: normalising it within the group would blow a 0.01 length difference up to the same
  weight as a correct answer.

Standard deviations are Bessel-corrected (`nanstd`), as in TRL. The *population* is whatever rows are passed: TRL's
generation batch with dynamic sampling off, the trained rows of the optimizer batch with it on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EPS = 1e-4  # TRL's denominator guard
SCALE_REWARDS = ("group", "batch", "none")
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


@dataclass(frozen=True)
class Advantages:
    """Outcome of [`compute_advantages`]; every field has shape `(N,)`."""

    advantages: torch.Tensor  # 0 for unscorable rows
    rewards: torch.Tensor  # the aggregated reward R_i (penalty included), NaN for unscorable rows
    is_std_zero: torch.Tensor  # bool: the standard deviation that scales row i is 0 (TRL's frac_reward_zero_std)
    scorable: torch.Tensor  # bool: at least one reward function scored the row


def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Bessel-corrected standard deviation ignoring `NaN`; `NaN` where fewer than two values are present."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True)
    variance = variance * torch.where(count > 1, count / (count - 1), torch.full_like(variance, torch.nan))
    std = variance.sqrt()
    if keepdim:
        return std
    return std.squeeze() if dim is None else std.squeeze(dim)


def normalize_scale_rewards(value: str | bool) -> str:
    """TRL accepts `True`/`False` for `scale_rewards` (meaning `"group"`/`"none"`); map them to the string form."""
    if value is True:
        return "group"
    if value is False:
        return "none"
    return value


def compute_advantages(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    *,
    num_generations: int,
    scale_rewards: str | bool = "group",
    aggregation: str = "sum_then_normalize",
    penalty: torch.Tensor | None = None,
) -> Advantages:
    """
    Advantages of every row, as described in the module docstring.

    Args:
        rewards_per_func (`torch.Tensor` of shape `(N, F)`):
            Reward of each row under each reward function, `NaN` where a function returned `None`; groups of
            `num_generations` consecutive rows.
        weights (`torch.Tensor` of shape `(F,)`):
            Reward weights (`reward_weights`).
        num_generations (`int`):
            Group size `G`; `N` must be a multiple of it.
        scale_rewards (`str` or `bool`, *optional*, defaults to `"group"`):
            `"group"`, `"batch"` or `"none"` (or TRL's booleans).
        aggregation (`str`, *optional*, defaults to `"sum_then_normalize"`):
            TRL's `multi_objective_aggregation`.
        penalty (`torch.Tensor` of shape `(N,)`, *optional*):
            Overlong penalty per row (DAPO Eq. 13), added to scorable rows only.

    Example:
    ```python
    >>> nan = float("nan")
    >>> out = compute_advantages(torch.tensor([[1.0], [1.0], [-1.0], [nan]]), torch.ones(1), num_generations=4)
    >>> [round(a, 3) for a in out.advantages.tolist()]
    [0.577, 0.577, -1.155, 0.0]

    ```
    """
    scale_rewards = normalize_scale_rewards(scale_rewards)
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}.")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"multi_objective_aggregation must be one of {AGGREGATIONS}, got {aggregation!r}.")
    if rewards_per_func.dim() != 2 or rewards_per_func.size(0) % num_generations != 0:
        raise ValueError(
            f"rewards_per_func must have shape (N, F) with N a multiple of num_generations={num_generations}, got "
            f"{tuple(rewards_per_func.shape)}."
        )
    rewards_per_func = rewards_per_func.float()
    weights = weights.to(rewards_per_func)
    scorable = ~torch.isnan(rewards_per_func).all(dim=1)  # (N,)
    penalty = torch.zeros_like(scorable, dtype=torch.float32) if penalty is None else penalty.to(rewards_per_func)
    penalty = torch.where(scorable, penalty, torch.zeros_like(penalty))
    G = num_generations

    if aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * weights).nansum(dim=1) + penalty  # (N,)
        rewards = torch.where(scorable, rewards, torch.full_like(rewards, torch.nan))
        group_mean = torch.nanmean(rewards.view(-1, G), dim=1).repeat_interleave(G)  # (N,)
        if scale_rewards == "batch":
            std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        else:  # "group", and "none" (where the std only feeds is_std_zero)
            std = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G) if G > 1 else torch.zeros_like(rewards)
        advantages = rewards - group_mean
        if scale_rewards != "none":
            advantages = advantages / (std + EPS)
    else:
        grouped = rewards_per_func.view(-1, G, rewards_per_func.size(1))  # (N/G, G, F)
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True) if G > 1 else torch.zeros_like(mean_k)
        normalized = ((grouped - mean_k) / (std_k + EPS)).view(-1, rewards_per_func.size(1))  # (N, F)
        rewards = (normalized * weights).nansum(dim=1) + penalty
        rewards = torch.where(scorable, rewards, torch.full_like(rewards, torch.nan))
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        advantages = (rewards - torch.nanmean(rewards)) / (std + EPS)

    is_std_zero = torch.isclose(std, torch.zeros_like(std))
    return Advantages(
        advantages=torch.nan_to_num(advantages, nan=0.0),
        rewards=rewards,
        is_std_zero=is_std_zero,
        scorable=scorable,
    )
