r"""A Beta posterior of each training prompt's success rate, and Thompson draws of its next group's informativeness.

Pure functions over numpy arrays, used by [`SkipPolicy`] under `rule="posterior"` (MoPPS, arXiv 2507.04632, models
each prompt's success rate the same way):

- a group of `n` scored completions with `k` successes updates its prompt's posterior by `(k, n - k)`; older counts
  are multiplied by `2^{-age / h}` (`h` the half-life in training steps), so the estimate follows the policy as it
  improves ([`forgetting_weight`]);
- the prior, shared by every prompt, is the population's: a beta-binomial moment fit to the first group of each
  prompt ([`fit_prior`]), capped at one group's worth of pseudo-counts so that a prompt's own groups soon dominate;
- the next group of `G` completions of a prompt with success rate `q` is informative (neither all-correct nor
  all-wrong) with chance `1 - q^G - (1 - q)^G` ([`informative_chance_at`]); its expectation under the posterior has a
  closed form ([`informative_chance`]) and a Thompson draw samples `q` from the posterior first
  ([`thompson_informative`]).
"""

from __future__ import annotations

import math

import numpy as np

# Beta(1, 1) until this many first groups have been seen.
MIN_PRIOR_GROUPS = 16
DEFAULT_PRIOR = (1.0, 1.0)


def forgetting_weight(age: np.ndarray | float, half_life: float | None) -> np.ndarray:
    """Weight kept by counts `age` steps old: `2^{-age / half_life}` (`1` everywhere when `half_life` is `None`)."""
    age = np.maximum(np.asarray(age, dtype=np.float64), 0.0)
    if half_life is None:
        return np.ones_like(age)
    return np.exp2(-age / half_life)


def fit_prior(moments: np.ndarray, group_size: int, *, max_strength: float | None = None) -> tuple[float, float]:
    r"""
    Beta prior `(a, b)` of the population's success rates, from the moments `(count, Σ r, Σ r²)` of the success share
    `r = k / n` of one group per prompt (its first: an unbiased draw of the population, since the stream is random).

    Method of moments for a beta-binomial with `G = group_size` trials: the share's variance is
    `μ(1 - μ)(1/G + (1 - 1/G) ρ)` with `ρ = 1 / (a + b + 1)`, so `a + b = 1/ρ - 1`. `ρ` is clipped so that
    `a + b` stays in `[0.01, max_strength]` (`max_strength` defaults to `G`: the prior never weighs more than one group).
    Returns `DEFAULT_PRIOR` (`Beta(1, 1)`) before `MIN_PRIOR_GROUPS` groups.

    Example:
    ```python
    >>> fit_prior(np.array([0.0, 0.0, 0.0]), 16)
    (1.0, 1.0)
    >>> a, b = fit_prior(np.array([100.0, 20.0, 20.0]), 16)  # 20 prompts all solved, 80 never: polarised
    >>> round(a / (a + b), 2), a + b < 0.1
    (0.2, True)

    ```
    """
    count, total, squares = (float(x) for x in moments)
    if count < MIN_PRIOR_GROUPS:
        return DEFAULT_PRIOR
    mean = min(max(total / count, 1e-3), 1 - 1e-3)
    var = max(squares / count - (total / count) ** 2, 0.0)
    G = max(int(group_size), 2)
    rho = (var / (mean * (1 - mean)) - 1 / G) / (1 - 1 / G)
    max_strength = float(G if max_strength is None else max_strength)
    rho = min(max(rho, 1 / (max_strength + 1)), 1 / 1.01)
    strength = 1 / rho - 1
    return mean * strength, (1 - mean) * strength


def informative_chance_at(rate: np.ndarray | float, group_size: int) -> np.ndarray:
    """Chance that `G` completions at success rate `rate` are neither all correct nor all wrong."""
    rate = np.asarray(rate, dtype=np.float64)
    return 1.0 - rate**group_size - (1.0 - rate) ** group_size


def _log_beta(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lgamma = np.vectorize(math.lgamma, otypes=[np.float64])
    return lgamma(a) + lgamma(b) - lgamma(a + b)


def informative_chance(a: np.ndarray | float, b: np.ndarray | float, group_size: int) -> np.ndarray:
    r"""
    Posterior predictive chance that the next group of `G` is informative, for success rates `q ~ Beta(a, b)`:
    `1 - B(a + G, b) / B(a, b) - B(a, b + G) / B(a, b)`.

    Example:
    ```python
    >>> float(informative_chance(1.0, 1.0, 16)).__round__(4)  # uniform: all-correct and all-wrong each 1/17
    0.8824

    ```
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    base = _log_beta(a, b)
    every = np.exp(_log_beta(a + group_size, b) - base)
    none = np.exp(_log_beta(a, b + group_size) - base)
    return np.clip(1.0 - every - none, 0.0, 1.0)


def posterior_std(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Standard deviation of `Beta(a, b)`."""
    total = a + b
    return np.sqrt(a * b / (total * total * (total + 1)))


def thompson_informative(a: float, b: float, group_size: int, rng: np.random.Generator, draws: int = 1) -> float:
    """
    The highest informative chance over `draws` success rates drawn from `Beta(a, b)`: Thompson sampling's draw
    (`draws=1`), or a more optimistic one (more exploration) for `draws > 1`.
    """
    rates = rng.beta(a, b, size=draws)
    return float(informative_chance_at(rates, group_size).max())


def decision_rng(seed: int, index: int, count: int) -> np.random.Generator:
    """A generator that depends only on `(seed, prompt index, decision count)`: the same on every process and resume."""
    mask = (1 << 64) - 1
    return np.random.default_rng([seed & mask, index & mask, count & mask])
