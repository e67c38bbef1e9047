r"""
Rule-based verification of a model's final math answer: the correctness signal behind DAPO's reward (DAPO §2.4, Eq. 7).

A component of its own, importable without TRL or torch (`import dapo_trl.verifier`):

| module | what it decides |
|---|---|
| `extraction` | where the final answer is in a completion or a gold column (strict and lenient modes) |
| `normalize`, `numbers`, `guards` | how an answer is read: decoration, structure, exact numbers, junk and undefined values |
| `compare` | the equality policy (what counts as the same answer, kind by kind, and why) and the string-level comparison |
| `symbolic` | the SymPy comparison, run only inside worker processes |
| `pool` | the worker processes and their hard per-call deadline |
| `dapo_rule` | the DAPO paper's own rule (last `Answer:` line in the last 300 characters, exact normalised match) |
| `api` | the entry points below, with their arguments checked |

[`extract_answer`] finds the final answer in a completion, [`extract_gold_answer`] does the same for a reference,
[`verify`] decides whether two extracted answers are equivalent, [`verify_batch`] does it for a training batch, and
[`score_completion`] chains them. The TRL reward function built on them is `dapo_trl.rewards.math.MathVerifierReward`.
"""

from .api import (
    DEFAULT_NUM_WORKERS,
    DEFAULT_TIMEOUT_S,
    REWARD_RULES,
    extract_answer,
    extract_gold_answer,
    score_completion,
    shutdown_workers,
    verify,
    verify_batch,
    warm_up,
)
from .extraction import EXTRACTION_MODES

__all__ = [
    "DEFAULT_NUM_WORKERS",
    "DEFAULT_TIMEOUT_S",
    "EXTRACTION_MODES",
    "REWARD_RULES",
    "extract_answer",
    "extract_gold_answer",
    "score_completion",
    "shutdown_workers",
    "verify",
    "verify_batch",
    "warm_up",
]
