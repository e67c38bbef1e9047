"""The DAPO objective (paper Eq. 8-12) and its exact token-level normaliser, as pure tensor functions.

[`DAPOTrainer`] computes the per-token surrogate with TRL's own `loss_type="dapo"` code and only replaces the
normaliser, which TRL approximates with the generation batch's average token count per step. The functions here are
the reference the trainer is tested against (gradient equality to 1e-6) and the arithmetic that turns the exact
per-step token count into the value TRL's formula expects.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def clipped_surrogate(
    log_ratio: torch.Tensor, advantages: torch.Tensor, *, epsilon_low: float = 0.2, epsilon_high: float = 0.28
) -> torch.Tensor:
    r"""
    Per-token negated clipped surrogate with decoupled clip range (Clip-Higher, DAPO §3.1, Eq. 10):

    $$
    \ell_{i,t} = -\min\Big(r_{i,t}\,\hat A_{i,t},\ \mathrm{clip}\big(r_{i,t}, 1-\varepsilon_{\text{low}},
    1+\varepsilon_{\text{high}}\big)\,\hat A_{i,t}\Big), \qquad r_{i,t} = \exp(\log\pi_\theta - \log\pi_{\theta_{old}})
    $$

    Args:
        log_ratio (`torch.Tensor` of shape `(B, T)`):
            $\log \pi_\theta(o_t) - \log \pi_{\theta_{old}}(o_t)$ per completion token.
        advantages (`torch.Tensor` of shape `(B,)` or `(B, T)`):
            Group-relative advantages $\hat A_{i,t}$ (Eq. 9), one per sequence or per token.
        epsilon_low (`float`, *optional*, defaults to `0.2`):
            Lower clip range $\varepsilon_{\text{low}}$.
        epsilon_high (`float`, *optional*, defaults to `0.28`):
            Upper clip range $\varepsilon_{\text{high}}$.

    Returns:
        `torch.Tensor` of shape `(B, T)`: the per-token loss (to be masked and normalised).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (B, 1)
    ratio = torch.exp(log_ratio)  # (B, T)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)  # (B, T)
    return -torch.min(ratio * advantages, clipped * advantages)


def token_level_mean(per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    r"""
    Token-level aggregation of DAPO §3.3 (Eq. 12): $\frac{1}{\sum_i |o_i|} \sum_i \sum_t \ell_{i,t}$.

    Every valid token of the batch weighs the same, so a 100-token completion contributes ten times the weight of a
    10-token one. `mask` is `(B, T)` with 1 on completion tokens that count.
    """
    mask = mask.to(per_token_loss.dtype)
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)


def sequence_level_mean(per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    r"""
    GRPO's sample-level aggregation (DAPO Eq. 8): $\frac{1}{G} \sum_i \frac{1}{|o_i|} \sum_t \ell_{i,t}$.

    Each completion weighs the same whatever its length; kept for comparison and for the ablation's naive GRPO.
    """
    mask = mask.to(per_token_loss.dtype)
    return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def dapo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.28,
) -> torch.Tensor:
    """
    The full DAPO policy loss over one optimizer step's batch: [`clipped_surrogate`] aggregated by
    [`token_level_mean`]. `logps`, `old_logps` and `mask` are `(B, T)`; `advantages` is `(B,)`.
    """
    per_token = clipped_surrogate(logps - old_logps, advantages, epsilon_low=epsilon_low, epsilon_high=epsilon_high)
    return token_level_mean(per_token, mask)


def window_token_counts(
    microbatch_tokens: Sequence[int | float],
    *,
    steps_per_generation: int,
    num_iterations: int,
    gradient_accumulation_steps: int,
) -> list[float]:
    """
    Token count of the optimizer step each micro-step of a generation cycle belongs to.

    TRL splits one generation batch into `steps_per_generation` micro-batches and replays them `num_iterations`
    times: micro-step `k` of the cycle trains on micro-batch `k % steps_per_generation`, and optimizer step `w` is made
    of micro-steps `w * GA ... (w + 1) * GA - 1`. The exact token-level normaliser of micro-step `k` is therefore the
    summed token count of the micro-batches in its window, which can differ from window to window (lengths vary) and
    from one replay to the next when `steps_per_generation` is not a multiple of the accumulation steps.

    Args:
        microbatch_tokens (`Sequence[int | float]`):
            Valid completion tokens of each of the `steps_per_generation` micro-batches, summed over all processes.
        steps_per_generation (`int`), num_iterations (`int`), gradient_accumulation_steps (`int`):
            The trainer's settings. `steps_per_generation * num_iterations` must be a multiple of
            `gradient_accumulation_steps` so that no optimizer step spans two generation cycles.

    Returns:
        `list[float]` of length `steps_per_generation * num_iterations`: the normaliser of each micro-step.

    Example:
    ```python
    >>> window_token_counts([10, 20, 30], steps_per_generation=3, num_iterations=2, gradient_accumulation_steps=2)
    [30.0, 30.0, 40.0, 40.0, 50.0, 50.0]

    ```
    """
    if len(microbatch_tokens) != steps_per_generation:
        raise ValueError(f"Expected {steps_per_generation} micro-batch token counts, got {len(microbatch_tokens)}.")
    cycle = steps_per_generation * num_iterations
    if cycle % gradient_accumulation_steps != 0:
        raise ValueError(
            f"steps_per_generation * num_iterations ({cycle}) must be a multiple of gradient_accumulation_steps "
            f"({gradient_accumulation_steps}) for an exact per-step token normaliser."
        )
    per_step = [float(microbatch_tokens[k % steps_per_generation]) for k in range(cycle)]
    counts = []
    for start in range(0, cycle, gradient_accumulation_steps):
        window = sum(per_step[start : start + gradient_accumulation_steps])
        counts.extend([window] * gradient_accumulation_steps)
    return counts


def exact_normalizer_applies(
    *, steps_per_generation: int, num_iterations: int, gradient_accumulation_steps: int
) -> bool:
    """
    Whether [`window_token_counts`] can give every micro-step its optimizer step's exact token count.

    It can when each optimizer step lies inside one generation cycle (`steps_per_generation * num_iterations` a
    multiple of `gradient_accumulation_steps`): the cycle is generated before its first micro-step. Otherwise (for
    instance `steps_per_generation < gradient_accumulation_steps`, generating once per micro-batch to save memory) a
    step spans several generation batches, and its first micro-batch is back-propagated before the later ones exist,
    so its token count is not known in time; the trainer then keeps TRL's normaliser, a token mean per generation batch.

    Example:
    ```python
    >>> exact_normalizer_applies(steps_per_generation=4, num_iterations=1, gradient_accumulation_steps=2)
    True
    >>> exact_normalizer_applies(steps_per_generation=1, num_iterations=1, gradient_accumulation_steps=4)
    False

    ```
    """
    return (steps_per_generation * num_iterations) % gradient_accumulation_steps == 0


def trl_num_items_for_exact_normalizer(
    window_tokens: float, *, steps_per_generation: int, gradient_accumulation_steps: int
) -> float:
    """
    Value of `num_items_in_batch` that makes TRL's `loss_type="dapo"` normaliser equal the exact window count.

    TRL 1.16 divides each micro-batch's summed token loss by `num_items_in_batch / P * GA / steps_per_generation` on
    every one of the `P` processes, and DDP then averages the gradients over processes. For the step's gradient to be
    `sum of token losses / window_tokens`, each process must divide by `window_tokens / P`, hence this inversion.
    A test pins it against TRL's code (`tests/test_trainer_loss.py`), so a change in TRL's formula fails loudly.
    """
    return window_tokens * steps_per_generation / gradient_accumulation_steps


def _rows(advantages: torch.Tensor) -> torch.Tensor:
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


def token_prob_sums(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon_high: float,
) -> torch.Tensor:
    """
    Sums behind the paper's monitors (§3.1): `[sum of p(token), token count, sum of p_old(token) over tokens cut by the
    upper clip, their count]`, over the loss tokens of one micro-batch (`(B, T)` tensors; `old_logps=None` is TRL's
    aligned case, where the old policy is the current one). Sum them over processes, then divide.
    """
    mask = mask.float()
    old = logps if old_logps is None else old_logps
    high = ((torch.exp(logps - old) > 1 + epsilon_high) & (_rows(advantages) > 0)).float() * mask
    return torch.stack([(torch.exp(logps) * mask).sum(), mask.sum(), (torch.exp(old) * high).sum(), high.sum()])


def sequence_clip_flags(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """
    Per row, with a sequence-level importance ratio (GSPO's mean token log-ratio, as TRL's
    `importance_sampling_level="sequence"`): `(clipped low, clipped high, has loss tokens)`, three bool `(B,)` tensors.
    """
    mask = mask.float()
    old = logps if old_logps is None else old_logps
    ratio = torch.exp(((logps - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))  # (B,)
    advantages = _rows(advantages)[:, 0]
    real = mask.sum(-1) > 0
    low = (ratio < 1 - epsilon_low) & (advantages < 0) & real
    high = (ratio > 1 + epsilon_high) & (advantages > 0) & real
    return low, high, real
