"""Checks shared by the command lines (`python -m dapo_trl.evaluation`, `examples/train_math.py`).

Each check returns an error message naming the flag or the path, which the caller hands to `parser.error` so that a
mistyped command stops at once with argparse's usage line, before anything is loaded or trained.
"""

from __future__ import annotations

import argparse
import os
import re

# What a Hub repository id may look like: `name` or `owner/name` (huggingface_hub's own rule is stricter).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
_DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".arrow", ".gz", ".txt")


def positive_int(text: str) -> int:
    """argparse `type` for counts (`--k`, `--batch_size`, `--max_samples`): an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def require_positive(parser: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    """Make the integer flags `names` of an existing parser (e.g. a `TrlParser`) refuse values below 1."""
    for action in parser._actions:
        if action.dest in names:
            action.type = positive_int


def positive_float(text: str) -> float:
    """argparse `type` for a finite float > 0 (`--temperature`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def probability(text: str) -> float:
    """argparse `type` for a top-p: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text}")
    return value


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def check_model_path(flag: str, value: str) -> str | None:
    """
    `None` when `value` is a saved model folder, or may be a Hub model id; else the message to show.

    A saved model folder holds `config.json` (or `adapter_config.json` for a PEFT adapter). A value that does not exist
    locally is taken for a Hub id only when it has a Hub id's shape and its first part is not a local folder (so
    `outputs/my-run`, next to an existing `outputs/`, is reported as a missing path rather than looked up on the Hub);
    with `HF_HUB_OFFLINE` set, it must also be in the local Hub cache.
    """
    if os.path.isdir(value):
        if not any(os.path.isfile(os.path.join(value, name)) for name in ("config.json", "adapter_config.json")):
            return f"{flag} {value}: the folder holds no config.json, so it is not a saved model."
        return None
    if os.path.isfile(value) and value.lower().endswith(".gguf"):
        from ._validate import GGUF_ADVICE

        return f"{flag} {value} is a GGUF file, which TRL cannot train from: {GGUF_ADVICE}."
    if os.path.exists(value):
        return (
            f"{flag} {value} is a file; give the folder a model was saved to (save_pretrained / trainer.save_model)."
        )
    problem = _missing_path_problem(flag, value, "model folder")
    if problem:
        return problem
    if hub_offline() and not _in_hub_cache(value, "config.json", repo_type="model"):
        return (
            f"{flag} {value}: no such local folder ({os.path.abspath(value)}), and HF_HUB_OFFLINE is set, so it cannot "
            "be fetched from the Hub (it is not in the local Hub cache)."
        )
    return None


def check_data_path(flag: str, value: str) -> str | None:
    """
    `None` when `value` is a non-empty local data file or folder, or may be a Hub dataset id; else the message to show.
    """
    if os.path.isfile(value):
        if os.path.getsize(value) == 0 or not _has_content(value):
            return f"{flag} {value} is empty: it holds no rows."
        return None
    if os.path.isdir(value):
        if not os.listdir(value):
            return f"{flag} {value} is an empty folder: it holds no data files."
        return None
    return _missing_path_problem(flag, value, "file or folder", data=True)


def _missing_path_problem(flag: str, value: str, kind: str, *, data: bool = False) -> str | None:
    where = f"no such {kind}: {value} (looked for {os.path.abspath(os.path.expanduser(value))})"
    looks_local = (
        value.startswith((".", "/", "~")) or "\\" in value or value.endswith("/") or not _HUB_ID.fullmatch(value)
    )
    if looks_local or (data and value.lower().endswith(_DATA_SUFFIXES)):
        return f"{flag}: {where}."
    first = value.split("/", 1)[0]
    if "/" in value and os.path.isdir(first):
        return (
            f"{flag}: {where}. {first}/ is a local folder, so this is read as a path, not as a Hub id; check the name "
            f"(existing entries: {', '.join(sorted(os.listdir(first))[:8]) or 'none'})."
        )
    return None


def _has_content(path: str, probe: int = 1 << 16) -> bool:
    if path.lower().endswith((".parquet", ".arrow", ".gz")):
        return True  # binary formats: their readers report emptiness themselves
    with open(path, "rb") as f:
        return bool(f.read(probe).strip())


def _in_hub_cache(repo_id: str, filename: str, *, repo_type: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return True
    try:
        found = try_to_load_from_cache(repo_id, filename, repo_type=repo_type)
    except Exception:  # an id huggingface_hub rejects: not in the cache either
        return False
    return isinstance(found, str)
