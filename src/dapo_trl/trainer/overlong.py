"""Overlong reward shaping (DAPO §3.4).

Two pieces, both pure:

- [`soft_overlong_penalty`]: the length-aware penalty of paper Eq. 13, added to the correctness reward.
- [`is_truncated`]: whether a completion was cut off by the length limit rather than ended by the model.

[`OverlongPenalty`] wraps the first as a TRL reward function so that the trainer can add it to the correctness
reward before advantages are computed, while the correctness reward stays available on its own (dynamic sampling
filters on it, never on the shaped sum).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence


def soft_overlong_penalty(length: int, *, max_length: int, buffer_len: int, penalty_factor: float = 1.0) -> float:
    r"""
    Soft overlong punishment of DAPO Eq. 13.

    $$
    R_{\text{length}}(y) = \begin{cases}
        0, & |y| \le L_{\max} - L_{\text{cache}} \\
        \frac{(L_{\max} - L_{\text{cache}}) - |y|}{L_{\text{cache}}}, & L_{\max} - L_{\text{cache}} < |y| \le L_{\max} \\
        -1, & L_{\max} < |y|
    \end{cases}
    $$

    scaled by `penalty_factor`.

    Args:
        length (`int`):
            Number of generated tokens $|y|$.
        max_length (`int`):
            $L_{\max}$, the maximum completion length.
        buffer_len (`int`):
            $L_{\text{cache}}$, the length of the punishment interval before `max_length`.
        penalty_factor (`float`, *optional*, defaults to `1.0`):
            Penalty at (and beyond) `max_length`.

    Returns:
        `float`: a value in `[-penalty_factor, 0]`.

    Example:
    ```python
    >>> soft_overlong_penalty(16, max_length=20, buffer_len=4)
    0.0
    >>> soft_overlong_penalty(18, max_length=20, buffer_len=4)
    -0.5
    >>> soft_overlong_penalty(25, max_length=20, buffer_len=4, penalty_factor=2.0)
    -2.0

    ```
    """
    if buffer_len <= 0 or buffer_len >= max_length:
        raise ValueError(f"buffer_len must be in (0, max_length={max_length}), got {buffer_len}.")
    if length < 0:
        raise ValueError(f"length must be non-negative, got {length}.")
    expected_len = max_length - buffer_len
    if length <= expected_len:
        return 0.0
    if length <= max_length:
        return penalty_factor * (expected_len - length) / buffer_len
    return -float(penalty_factor)


def is_truncated(completion_ids: Sequence[int], *, eos_token_ids: Iterable[int], max_length: int) -> bool:
    """
    Whether a completion was cut off by the length limit.

    A completion is truncated when it reached `max_length` tokens without ending in one of the EOS tokens. A
    completion of exactly `max_length` tokens whose last token is an EOS token finished on its own and is *not*
    truncated; a shorter completion is never truncated (generation only stops early on EOS). Models may have several
    EOS ids (e.g. `<|im_end|>` and `<|endoftext|>`): any of them ends a completion.

    Example:
    ```python
    >>> is_truncated([5, 6, 7], eos_token_ids=[2], max_length=3)
    True
    >>> is_truncated([5, 6, 2], eos_token_ids=[2], max_length=3)
    False
    >>> is_truncated([5, 9], eos_token_ids=[2, 9], max_length=3)
    False

    ```
    """
    if len(completion_ids) < max_length:
        return False
    return completion_ids[-1] not in set(eos_token_ids)


class OverlongPenalty:
    """
    TRL reward function computing [`soft_overlong_penalty`] from each completion's token count.

    [`DAPOTrainer`] appends an instance of this class to the reward functions when `overlong_shaping=True`, so that
    TRL sums it with the correctness reward before computing advantages (paper Eq. 13 is additive), logs it as
    `rewards/overlong_penalty/mean`, and keeps the correctness reward in its own column.

    It also logs, through TRL's `log_metric` hook, `overlong/ratio` (share of completions inside the buffer zone),
    `overlong/truncated_ratio` (share cut off at `max_length`) and `overlong/penalty_mean`.

    Args:
        max_length (`int`):
            Maximum completion length ($L_{\\max}$).
        buffer_len (`int`):
            Punishment interval ($L_{\\text{cache}}$).
        penalty_factor (`float`, *optional*, defaults to `1.0`):
            Penalty at and beyond `max_length`.
        eos_token_ids (`Iterable[int]`, *optional*):
            EOS ids used to tell a truncated completion from one that ended exactly at `max_length`. The trainer
            fills them from the tokenizer / generation config.
    """

    __name__ = "overlong_penalty"

    def __init__(
        self,
        *,
        max_length: int,
        buffer_len: int,
        penalty_factor: float = 1.0,
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        soft_overlong_penalty(0, max_length=max_length, buffer_len=buffer_len)  # validates the arguments
        self.max_length = max_length
        self.buffer_len = buffer_len
        self.penalty_factor = penalty_factor
        self.eos_token_ids = tuple(eos_token_ids)

    def __call__(
        self,
        completions: list,
        completion_ids: list[list[int]],
        log_metric: Callable[[str, float], None] | None = None,
        **kwargs,
    ) -> list[float]:
        lengths = [len(ids) for ids in completion_ids]
        penalties = [
            soft_overlong_penalty(
                n, max_length=self.max_length, buffer_len=self.buffer_len, penalty_factor=self.penalty_factor
            )
            for n in lengths
        ]
        if log_metric is not None and lengths:
            start = self.max_length - self.buffer_len
            in_zone = sum(start < n <= self.max_length for n in lengths)
            truncated = sum(
                is_truncated(ids, eos_token_ids=self.eos_token_ids, max_length=self.max_length)
                for ids in completion_ids
            )
            log_metric("overlong/ratio", in_zone / len(lengths))
            log_metric("overlong/truncated_ratio", truncated / len(lengths))
            log_metric("overlong/penalty_mean", sum(penalties) / len(penalties))
        return penalties
