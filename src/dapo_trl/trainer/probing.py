r"""Probing before completing a group (dynamic sampling), as pure decisions.

Dynamic sampling (DAPO §3.2) generates all `G` completions of a prompt before it can tell whether the group is
informative. With `dynamic_sampling_probe = k`, a round first generates `k` completions of each of its prompts (the
*probe*, one generation call for the whole round), and only then the other `G - k` of the groups worth completing (a
second call with the same sampling settings). The trained group is the whole `G`, the probe's completions included.

Which groups are completed ([`ProbeRule`]):

- a probe whose completions differ is completed: the group is informative whatever the rest gives;
- a probe whose completions agree (all correct, or all wrong) is completed when its class of prompts completes
  informative often enough to pay for the rest: the class is the prompt's last outcome (never seen, informative,
  all-correct, all-wrong) and the probe's, and its rate `m` is measured on the uniform probes completed so far (a
  Beta estimate whose counts decay per round). Completing costs `(G - k) / G` of a group and yields an informative
  group with chance `m`; drawing new prompts instead yields `π` informative groups per group generated (the decayed
  rate of the run so far, at least `min_efficiency`). So a class is completed when `m >= τ = π (G - k) / G`, and below
  that with probability `max((m / τ)^s, min_accept)`: the floor keeps measuring every class, so a class that becomes
  worth completing as training moves is found again.

Why `π` has a floor: the rate measured during a run's first pass (every prompt new, nothing to skip yet) is the
lowest the run will see, and an informative group found then stands in for one found later, when skipping has raised
the rate. Priced at the first pass's own rate, most uniform probes of never-seen prompts looked worth completing: on
the held-out task of `benchmarks/dynamic_sampling.py` (G = 4) the first pass wasted 0.568 groups per trained group,
against 0.592 without any probe; with `min_efficiency = 0.5`, 0.361 (`benchmarks/skip_decomposition.py`).

Costs: the probe adds one sequential generation call per round, and a group dropped after its probe may have been
informative (more often for prompts solved almost always or almost never, which tilts training toward prompts near a
pass rate of 0.5). A probe of `k` pays only when `G` is well above `k`; `benchmarks/dynamic_sampling.py` measures it.

Every decision is a function of the calls received and a hash of `(seed, prompt, decision count)`: identical on every
process that makes the same calls, and exact across `state_dict()` / `load_state_dict()`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .prompt_history import ALL_CORRECT, ALL_WRONG, INFORMATIVE, UNSEEN, hashed_uniform, outcome_codes
from .sampling import GroupClassification

# Smallest group the default probe is used with (`k = 2`, half the group; a probe needs 2 completions to be mixed).
MIN_USEFUL_GROUP = 4
_SALT = 0x5EED_0F_9B0BE  # keeps the probe's random numbers apart from the skip policy's
_PREVIOUS = (UNSEEN, INFORMATIVE, ALL_CORRECT, ALL_WRONG)  # the prompt's last outcome, row of the class table


def probe_problem(probe: int, num_generations: int) -> str | None:
    """Why `dynamic_sampling_probe = probe` cannot work with groups of `num_generations`, or `None`."""
    if probe == 0:
        return None
    if probe < 2:
        return (
            f"dynamic_sampling_probe={probe}: a probe of one completion can never show a mixed group. Use at least 2 "
            "(e.g. num_generations // 4), or 0 to generate whole groups."
        )
    if probe >= num_generations:
        return (
            f"dynamic_sampling_probe={probe} must be below num_generations={num_generations}: the probe generates "
            "part of each group before deciding whether to complete it. Use num_generations // 4, or 0 to turn probing "
            "off."
        )
    return None


def probe_warning(probe: int, num_generations: int) -> str | None:
    """Why a probe is unlikely to pay with groups of `num_generations` (it runs anyway), or `None`."""
    if probe == 0 or probe <= num_generations // 2:
        return None
    return (
        f"dynamic_sampling_probe={probe} with num_generations={num_generations}: the probe is more than half of each "
        "group, so stopping a group after its probe saves little; in the simulation (benchmarks/dynamic_sampling.py) "
        f"probes of num_generations // 4 (at least 2) pay. Consider dynamic_sampling_probe="
        f"{default_probe(num_generations)}."
    )


def default_probe(num_generations: int) -> int:
    """
    The probe when `dynamic_sampling_skip` is on and `dynamic_sampling_probe` is not set: `G // 4`, at least 2, from
    `G = 4` (0 below: no probe).
    """
    return max(2, num_generations // 4) if num_generations >= MIN_USEFUL_GROUP else 0


def probe_granularity(processes: int, num_generations: int, probe: int) -> int:
    """
    Prompts per round must be a multiple of this, so that the rows of a whole-group call (`G` per prompt), a probe
    (`k`) and a completion (`G - k`) all split evenly over `processes`.

    Example:
    ```python
    >>> probe_granularity(2, 16, 4), probe_granularity(2, 8, 3), probe_granularity(4, 8, 2)
    (1, 2, 2)

    ```
    """
    sizes = (num_generations, probe, num_generations - probe) if probe else (num_generations,)
    return math.lcm(*(processes // math.gcd(size, processes) for size in sizes))


def pad_completions(complete: np.ndarray, multiple: int) -> np.ndarray:
    """
    `complete` with the first groups not yet completed added until their number is a multiple of `multiple` (so that
    the completion call's rows split evenly over the processes). A group completed for this reason is an ordinary
    group: trained if it turns out informative.

    Example:
    ```python
    >>> pad_completions(np.array([False, True, False, False]), 2).tolist()
    [True, True, False, False]

    ```
    """
    complete = np.asarray(complete, dtype=bool).copy()
    missing = -int(complete.sum()) % multiple
    complete[np.flatnonzero(~complete)[:missing]] = True
    return complete


class ProbeRule:
    """
    Decides which probed groups to complete (see the module docstring), learns from what completed groups gave, and
    keeps each prompt's last outcome.

    Args:
        num_generations (`int`):
            Group size `G`.
        probe (`int`):
            Completions in a probe, `k` (`2 <= k < G`).
        num_prompts (`int`, *optional*):
            Size of the training set, to remember each prompt's last outcome; `None` (a streamed set) classes every
            prompt as never seen.
        seed (`int`, *optional*, defaults to `0`):
            Seed of the decisions.
        decay (`float`, *optional*, defaults to `0.9`):
            Weight kept by past rounds in the class rates and in `π`, per round.
        prior_rate (`float`, *optional*, defaults to `0.5`), prior_strength (`float`, *optional*, defaults to `1.0`):
            Beta prior of every class's rate.
        min_accept (`float`, *optional*, defaults to `0.05`):
            Lowest chance of completing a uniform probe (the exploration floor).
        min_efficiency (`float`, *optional*, defaults to `0.5`):
            Lowest `π` the threshold uses, in `[0, 1]`; `0` prices completions at the measured rate alone.
        sharpness (`float`, *optional*, defaults to `4.0`):
            Exponent `s` of the step around the threshold.
    """

    def __init__(
        self,
        num_generations: int,
        probe: int,
        *,
        num_prompts: int | None = None,
        seed: int = 0,
        decay: float = 0.9,
        prior_rate: float = 0.5,
        prior_strength: float = 1.0,
        min_accept: float = 0.05,
        sharpness: float = 4.0,
        min_efficiency: float = 0.5,
    ) -> None:
        problem = probe_problem(probe, num_generations)
        if problem or probe == 0:
            raise ValueError(problem or "ProbeRule needs a probe of at least 2 completions.")
        if not 0.0 <= min_efficiency <= 1.0:
            raise ValueError(f"min_efficiency must be in [0, 1], got {min_efficiency}.")
        self.num_generations = num_generations
        self.probe = probe
        self.seed = seed
        self.decay = decay
        self.prior_rate = prior_rate
        self.prior_strength = prior_strength
        self.min_accept = min_accept
        self.sharpness = sharpness
        self.min_efficiency = min_efficiency
        self.last_outcome = None if num_prompts is None else np.full(num_prompts, UNSEEN, dtype=np.int8)
        # Decayed (informative, completed) counts of completed uniform probes, per last outcome and probe outcome.
        self._counts = np.zeros((len(_PREVIOUS), 2, 2), dtype=np.float64)
        self._efficiency = np.zeros(2, dtype=np.float64)  # decayed (informative groups, groups generated)
        self.decisions = 0  # decisions made so far: the hash counter
        self._batch = np.zeros(3, dtype=np.int64)  # this batch: probed, completed, dropped

    @property
    def rest_share(self) -> float:
        """What completing a group costs, in groups: `(G - k) / G`."""
        return (self.num_generations - self.probe) / self.num_generations

    @property
    def efficiency(self) -> float:
        """`π`: informative groups per group generated, decayed over rounds (`prior_rate` before any round)."""
        informative, generated = self._efficiency
        return float(informative / generated) if generated > 0 else self.prior_rate

    @property
    def threshold(self) -> float:
        """
        `τ = max(π, min_efficiency) (G - k) / G`: the rate at which completing a uniform probe pays as much as drawing
        new prompts.
        """
        return max(self.efficiency, self.min_efficiency) * self.rest_share

    def class_rate(self, previous: int, probe_outcome: int) -> float:
        """Measured chance that completing a uniform probe of this class gives an informative group."""
        informative, completed = self._counts[_PREVIOUS.index(previous), probe_outcome - ALL_CORRECT]
        return (self.prior_rate * self.prior_strength + informative) / (self.prior_strength + completed)

    def _previous(self, indices: np.ndarray) -> np.ndarray:
        if self.last_outcome is None:
            return np.full(indices.shape, UNSEEN, dtype=np.int8)
        return self.last_outcome[indices]

    def complete(self, indices: Sequence[int], probe: GroupClassification) -> np.ndarray:
        """Which of the probed groups (`indices[j]`'s probe is group `j` of `probe`) to complete, `(n,)` bool."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        codes = outcome_codes(probe)
        previous = self._previous(indices)
        threshold = self.threshold
        complete = codes == INFORMATIVE
        for j in np.flatnonzero(~complete):
            rate = self.class_rate(int(previous[j]), int(codes[j]))
            ratio = rate / threshold if threshold > 0 else math.inf
            accept = 1.0 if ratio >= 1 else max(ratio**self.sharpness, self.min_accept)
            complete[j] = hashed_uniform(self.seed ^ _SALT, int(indices[j]), self.decisions + int(j)) < accept
        self.decisions += len(indices)
        return complete

    def record(
        self,
        indices: Sequence[int],
        probe: GroupClassification,
        completed: np.ndarray,
        informative: torch.Tensor,
        groups: GroupClassification,
    ) -> None:
        """
        Learn from a probed round: `completed` says which groups were completed, `informative` is the trainer's verdict
        on each group as generated (`(n,)` bool) and `groups` their classification (whole groups where completed).
        """
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        completed = np.asarray(completed, dtype=bool)
        probe_codes = outcome_codes(probe)
        verdict = informative.detach().cpu().bool().numpy()
        uniform = completed & (probe_codes != INFORMATIVE)
        rows = np.array([_PREVIOUS.index(int(p)) for p in self._previous(indices)[uniform]], dtype=np.int64)
        self._counts *= self.decay
        cols = probe_codes[uniform].astype(np.int64) - ALL_CORRECT
        np.add.at(self._counts[..., 0], (rows, cols), verdict[uniform])
        np.add.at(self._counts[..., 1], (rows, cols), 1.0)
        generated = len(indices) * self.probe / self.num_generations + completed.sum() * self.rest_share
        self._efficiency = self.decay * self._efficiency + (verdict.sum(), generated)
        if self.last_outcome is not None:
            self.last_outcome[indices] = outcome_codes(groups, informative)
        self._batch += (len(indices), int(completed.sum()), int((~completed).sum()))

    def metrics(self) -> dict[str, float]:
        """This generation batch's probing statistics (since the previous call), for `dynamic_sampling/<name>`."""
        probed, completed, dropped = self._batch.tolist()
        self._batch[:] = 0
        return {
            "probe_completed_frac": completed / probed if probed else math.nan,
            "probe_dropped": float(dropped),
            "probe_threshold": self.threshold,
        }

    def state_dict(self) -> dict:
        return {
            "num_generations": self.num_generations,
            "probe": self.probe,
            "seed": self.seed,
            "last_outcome": None if self.last_outcome is None else torch.from_numpy(self.last_outcome.copy()),
            "counts": torch.from_numpy(self._counts.copy()),
            "efficiency": torch.from_numpy(self._efficiency.copy()),
            "decisions": self.decisions,
            "batch": torch.from_numpy(self._batch.copy()),
        }

    def load_state_dict(self, state: dict) -> None:
        saved = (int(state["num_generations"]), int(state["probe"]), int(state["seed"]))
        if saved != (self.num_generations, self.probe, self.seed):
            raise ValueError(
                f"The checkpoint's probe state was saved with num_generations, dynamic_sampling_probe and seed "
                f"{saved}, this run has {(self.num_generations, self.probe, self.seed)}: resume with the same settings."
            )
        last = state["last_outcome"]
        if (last is None) != (self.last_outcome is None) or (
            last is not None and last.numel() != self.last_outcome.size
        ):
            raise ValueError("The checkpoint's probe state covers another training set: resume with the same dataset.")
        if last is not None:
            self.last_outcome = last.numpy().astype(np.int8)
        self._counts = state["counts"].numpy().astype(np.float64)
        self._efficiency = state["efficiency"].numpy().astype(np.float64)
        self.decisions = int(state["decisions"])
        self._batch = state["batch"].numpy().astype(np.int64)
