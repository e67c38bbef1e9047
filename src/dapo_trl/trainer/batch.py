"""Row operations on the batch dict that TRL's `_generate_and_score_completions` returns.

Dynamic sampling selects rows out of several generation rounds, moves them between processes and concatenates them.
Each key's padding side and value must match TRL's: prompts are left-padded, completions right-padded, and TRL pads
`tool_mask` with 1. A key not listed here is refused with an explanation rather than concatenated wrongly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# key -> (padding side, padding value); `None` means "the tokenizer's pad token id".
PER_TOKEN_KEYS: dict[str, tuple[str, float | None]] = {
    "prompt_ids": ("left", None),
    "prompt_mask": ("left", 0),
    "completion_ids": ("right", None),
    "completion_mask": ("right", 0),
    "old_per_token_logps": ("right", 0.0),
    "ref_per_token_logps": ("right", 0.0),
    "sampling_per_token_logps": ("right", 0.0),
    "importance_sampling_ratio": ("right", 1.0),  # (B, T) token-level or (B, 1) sequence-level
    "tool_mask": ("right", 1),
    "_carry_logps": ("right", 0.0),  # sampling-policy log-probabilities kept for rows that may be carried over
}
# Rows whose `old_per_token_logps` the trainer fills from the loss forward itself (fresh rows of TRL's aligned case
# trained next to carried rows): their ratio stays exactly 1, as in GRPOTrainer.
ON_POLICY_KEY = "dapo_on_policy"
# One value per row, shape (B,). Keys starting with "_" are private bookkeeping added by the trainer.
PER_ROW_KEYS = {"advantages", ON_POLICY_KEY}
# Recomputed by the trainer after rows are selected.
DERIVED_KEYS = {"num_items_in_batch"}


def check_supported(batch: dict) -> None:
    """Raise if `batch` holds a key whose rows cannot be selected and concatenated safely."""
    unknown = [
        key
        for key in batch
        if key not in PER_TOKEN_KEYS
        and key not in PER_ROW_KEYS
        and key not in DERIVED_KEYS
        and not key.startswith("_")
    ]
    if unknown:
        raise ValueError(
            f"Dynamic sampling cannot combine generation rounds holding {sorted(unknown)}: multimodal inputs "
            "(images, pixel values) are not supported yet. Set dynamic_sampling=False for this model."
        )


def loss_mask(batch: dict) -> torch.Tensor:
    """The tokens the loss counts: completion tokens, minus tool outputs when a tool mask is present. `(B, T)`."""
    mask = batch["completion_mask"]
    return mask * batch["tool_mask"] if "tool_mask" in batch else mask


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """
    Positions counted over attended tokens only, as transformers' `generate` numbers them: a row's first real token is
    at position 0 however much left padding it has (padding gets 0). `(B, T)`.

    Dynamic sampling left-pads rows of different generation calls to a common width after their old log-probabilities
    were computed at another width; with positions counted from the first column (the default of a forward without
    `position_ids`) a model with learned absolute positions (GPT-2, OPT) would then see the same row at other
    positions, and its probability ratio would move away from 1 before any update.

    Example:
    ```python
    >>> position_ids(torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 0]])).tolist()
    [[0, 0, 0, 1, 2], [0, 0, 1, 2, 0]]

    ```
    """
    mask = attention_mask.long()
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def select_rows(batch: dict, index: torch.Tensor) -> dict:
    """Rows `index` (a long or bool tensor) of every per-row tensor; derived keys are dropped."""
    out = {}
    for key, value in batch.items():
        if key in DERIVED_KEYS or not isinstance(value, torch.Tensor):
            continue
        out[key] = value[index.to(value.device)]
    return out


def keep_rows(batch: dict, keep: torch.Tensor) -> dict:
    """Rows where the bool `keep` is true, as [`select_rows`]; `batch` itself (no copy) when every row is kept."""
    return batch if bool(keep.all()) else select_rows(batch, keep)


def sort_rows(batch: dict, key: torch.Tensor) -> dict:
    """Rows in stable order of `key` `(B,)`; `batch` itself (no copy) when they already are."""
    if key.numel() < 2 or bool((key[1:] >= key[:-1]).all()):
        return batch
    return select_rows(batch, torch.argsort(key, stable=True))


def _pad_width(tensor: torch.Tensor, width: int, side: str, value: float) -> torch.Tensor:
    missing = width - tensor.size(1)
    if missing <= 0:
        return tensor
    pad = tensor.new_full((tensor.size(0), missing, *tensor.shape[2:]), value)
    return torch.cat([pad, tensor] if side == "left" else [tensor, pad], dim=1)


def _pad_value(key: str, pad_token_id: int) -> tuple[str, float]:
    side, value = PER_TOKEN_KEYS[key]
    return side, pad_token_id if value is None else value


def concat_rows(batches: Sequence[dict], *, pad_token_id: int) -> dict:
    """
    Concatenate row-wise, padding per-token tensors to the widest on TRL's side for each key.

    All batches must hold the same keys. Example: prompts `[[5, 6]]` and `[[7]]` (left-padded) give `[[5, 6], [0, 7]]`
    with pad id 0.
    """
    batches = [b for b in batches if b]
    if not batches:
        return {}
    if len(batches) == 1:  # nothing to pad or join: no copy of the tensors
        return {k: v for k, v in batches[0].items()}
    keys = set(batches[0])
    for b in batches[1:]:
        if set(b) != keys:
            raise ValueError(f"Cannot concatenate batches with different keys: {sorted(keys)} vs {sorted(b)}.")
    out = {}
    for key in batches[0]:
        tensors = [b[key] for b in batches]
        if key in PER_TOKEN_KEYS and tensors[0].dim() >= 2:
            side, value = _pad_value(key, pad_token_id)
            width = max(t.size(1) for t in tensors)
            tensors = [_pad_width(t, width, side, value) for t in tensors]
        out[key] = torch.cat(tensors, dim=0)
    return out


def pad_rows(batch: dict, num_rows: int, *, template: dict, pad_token_id: int) -> dict:
    """
    Append fully masked copies of `template`'s first row up to `num_rows`: their completion (and tool) mask and
    advantage are zero, so they add nothing to the loss or the token count; they exist so every process trains on the
    same shapes. `batch` may be empty (`{}`).
    """
    have = batch["completion_ids"].size(0) if batch else 0
    missing = num_rows - have
    if missing <= 0:
        return batch
    template = select_rows(template, torch.zeros(missing, dtype=torch.long))
    template["completion_mask"] = torch.zeros_like(template["completion_mask"])
    if "tool_mask" in template:
        template["tool_mask"] = torch.zeros_like(template["tool_mask"])
    template["advantages"] = torch.zeros_like(template["advantages"])
    for key in template:
        if key.startswith("_"):
            template[key] = torch.full_like(template[key], -1)
    return concat_rows([batch, template], pad_token_id=pad_token_id)


def widths(batch: dict) -> dict[str, int]:
    """Width of each per-token tensor, to agree on a common width across processes before gathering."""
    return {k: v.size(1) for k, v in batch.items() if k in PER_TOKEN_KEYS and v.dim() >= 2}


def pad_to(batch: dict, key_widths: dict[str, int], num_rows: int, *, pad_token_id: int) -> dict:
    """Pad every per-token tensor to `key_widths[key]` and every tensor to `num_rows` rows (zeros) for a gather."""
    out = {}
    for key, value in batch.items():
        if key in key_widths:
            side, pad = _pad_value(key, pad_token_id)
            value = _pad_width(value, key_widths[key], side, pad)
        missing = num_rows - value.size(0)
        if missing > 0:
            value = torch.cat([value, value.new_zeros((missing, *value.shape[1:]))], dim=0)
        out[key] = value
    return out
