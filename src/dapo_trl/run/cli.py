"""Checks and parsing shared by the command lines (`python -m dapo_trl.evaluation`, the examples).

Each check returns an error message naming the flag or the path, which the caller hands to `parser.error` so that a
mistyped command stops at once with argparse's usage line, before anything is loaded or trained.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

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


def non_negative_float(text: str) -> float:
    """argparse `type` for a finite float >= 0 (`--temperature`, where 0 is greedy decoding)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
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
        from .._validate import GGUF_ADVICE

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


def resume_argument(value: str | bool | None) -> str | bool | None:
    """
    `--resume_from_checkpoint` as `Trainer.train` takes it: a checkpoint folder as given, `True` for `true` (the newest
    complete checkpoint of `output_dir`, as in `DAPOTrainer.train`), `None` for an unset value or `false`.
    """
    if isinstance(value, str) and value.strip().lower() in ("true", "false", ""):
        return True if value.strip().lower() == "true" else None
    return value or None


def with_default_config(argv: Sequence[str], default: str | os.PathLike, *, unless: Sequence[str] = ()) -> list[str]:
    """
    `argv` with `--config default` in front when it names no `--config` and none of the flags `unless`.

    This is open-r1's way of giving a script a default recipe: the demo's YAML is a `--config` like any other, so
    command-line flags override its values instead of replacing all of them. `unless` lists the flags of a run on
    the user's own model or data, for which the demo's settings (a CPU, a tiny model's batch) would be wrong.
    """
    argv = list(argv)
    given = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    if "--config" in given or given & set(unless):
        return argv
    if not Path(default).is_file():
        raise SystemExit(f"The default config {default} is missing; pass --config YAML.")
    return ["--config", str(default), *argv]


# Settings transformers renamed: new name -> the name older releases know. transformers 5.25 has
# `activation_checkpointing` (and warns on `gradient_checkpointing`); 5.17 (the vLLM-CPU environment's) only the old one.
RENAMED_SETTINGS = {"activation_checkpointing": "gradient_checkpointing"}


def parse_or_exit(parser: Any, argv: Sequence[str]) -> tuple[Any, ...]:
    """
    [`~trl.TrlParser.parse_args_and_config`], with a bad config (missing file, unknown keys, values a dataclass
    refuses) ending in one line and exit code 2 instead of a traceback; bf16 on a machine without it is told in
    dapo-trl's terms ([`device_advice`]). A setting of `RENAMED_SETTINGS` that the
    installed transformers knows only under its old name is passed under that name (flag or YAML key).
    """
    import yaml

    known = _setting_names(parser)
    argv = _old_setting_names(list(argv), known)
    if "--config" in argv and argv.index("--config") + 1 < len(argv):
        path = argv[argv.index("--config") + 1]
        try:
            with open(path) as f:
                config = yaml.safe_load(f)
        except (OSError, yaml.YAMLError) as error:
            parser.error(f"--config {path}: {_one_line(error)}")
        if isinstance(config, dict) and any(_renamed(str(key), known) for key in config):
            config = {_renamed(str(key), known) or key: value for key, value in config.items()}
            argv[argv.index("--config") + 1] = _write_renamed_config(config, path)
        if isinstance(config, dict):  # anything else is refused below by TRL's parser
            unknown = [str(key) for key in config if key != "env" and key not in known]
            if unknown:  # before the dataclasses are built: their checks would report what the typo caused
                parser.error(f"--config {path}: {unknown_settings(unknown, known)}")
    flags = [a.split("=", 1)[0][2:] for a in argv if a.startswith("--") and a != "--config"]
    unknown = [f for f in flags if f not in known and not any(k.startswith(f) for k in known)]  # argparse prefixes
    if unknown:
        parser.error(unknown_settings(unknown, known, prefix="--"))
    try:
        return parser.parse_args_and_config(argv)
    except (ValueError, OSError, yaml.YAMLError) as error:
        parser.error(device_advice(_one_line(error)))


def device_advice(message: str, *, cuda: bool | None = None) -> str:
    """
    transformers' bf16 refusal ("Your setup doesn't support bf16/gpu ...") in dapo-trl's terms: the flags that run on
    this machine. bf16 is on by default in DAPOConfig, as in GRPOConfig. Any other message is returned as it is.

    Example:
    ```python
    >>> device_advice("Your setup doesn't support bf16/gpu. You need to assign use_cpu ...", cuda=False)[:67]
    'this machine has no GPU, and bf16 (on by default, as in GRPOConfig)'

    ```
    """
    if "bf16/gpu" not in message:
        return message
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if cuda:
        return (
            "this GPU does not support bf16 (on by default, as in GRPOConfig): add `--bf16 false` (`--fp16 true` for "
            "half precision)."
        )
    return (
        "this machine has no GPU, and bf16 (on by default, as in GRPOConfig) needs one. To train on the CPU add "
        "`--use_cpu true --bf16 false` (in a YAML: `use_cpu: true` and `bf16: false`, as configs/smollm2_cpu.yaml "
        "does); `--config configs/smoke.yaml` checks an installation on CPU in seconds."
    )


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """
    Inside the block, a `ValueError` or `FileNotFoundError` (a setting or the data refused while a run is being set
    up: the model, the data, the trainer) ends the program as argparse's errors do: `PROG: error: <the message on one
    line>` and exit code 2, without a traceback, which would only point into the library. Wrap the set-up only: an
    error raised while training keeps its traceback.
    """
    try:
        yield
    except (ValueError, FileNotFoundError) as error:
        print(f"{Path(sys.argv[0]).name}: error: {_one_line(error)}", file=sys.stderr)
        raise SystemExit(2) from None


def _renamed(name: str, known: set[str]) -> str | None:
    """The old name to pass for `name` when only the old one is known, else `None`."""
    old = RENAMED_SETTINGS.get(name)
    return old if old is not None and name not in known and old in known else None


def _old_setting_names(argv: list[str], known: set[str]) -> list[str]:
    """`argv` with each `--new_name[=value]` flag of `RENAMED_SETTINGS` spelled as the installed release knows it."""
    renamed = []
    for arg in argv:
        name, sep, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        old = _renamed(name, known)
        renamed.append(f"--{old}{sep}{value}" if old else arg)
    return renamed


def _write_renamed_config(config: dict, path: str) -> str:
    """A copy of the YAML `path` with renamed keys, in a temporary file (read once by TRL's parser)."""
    import tempfile

    import yaml

    with tempfile.NamedTemporaryFile("w", prefix=Path(path).stem + "-", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return f.name


def _setting_names(parser: Any) -> set[str]:
    """What a YAML key or a flag may name: every field of the parser's dataclasses, as flags spell them too."""
    names = set()
    for action in parser._actions:
        names.add(action.dest)
        names.update(o[2:] for o in action.option_strings if o.startswith("--"))
    return names


def unknown_settings(unknown: Sequence[str], known: set[str] | Sequence[str], prefix: str = "") -> str:
    """
    An error naming settings no field has, each with the closest known one (a typo such as `num_generation` otherwise
    surfaces as the error its missing value causes).

    Example:
    ```python
    >>> unknown_settings(["num_generation", "colour"], ["num_generations", "learning_rate"])
    "unknown settings: 'num_generation' (did you mean 'num_generations'?), 'colour'."

    ```
    """
    import difflib

    described = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        described.append(f"'{prefix}{name}'" + (f" (did you mean '{prefix}{close[0]}'?)" if close else ""))
    return f"unknown setting{'s' if len(unknown) > 1 else ''}: {', '.join(described)}."


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def organize_help(parser: Any, *, script_class: type, model_class: type | None = None) -> None:
    """
    Group the `--help` of an example's `TrlParser((script_class, DAPOConfig, model_class))` the way a DAPO user reads
    it: the DAPO settings first, under the headings of DAPOConfig's docstring (its defaults that differ from
    GRPOConfig's, overlong shaping, dynamic sampling, ...), then the script's settings, then those of TRL's
    GRPOConfig, transformers' TrainingArguments and TRL's `model_class`. A `--no_X` flag says that it turns `X` off
    (transformers gives it `X`'s own text).
    """
    import dataclasses

    from transformers import TrainingArguments
    from trl import GRPOConfig

    from .._help import parameter_docs, plain_text
    from ..dapo_config import DAPOConfig

    def names(cls: type | None) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)} if cls is not None else set()

    training = names(TrainingArguments)
    sections: dict[str, set[str]] = {}
    for name, doc in parameter_docs(DAPOConfig.__doc__ or "").items():
        sections.setdefault(f"DAPO: {plain_text(doc.heading)}", set()).add(name)
    sections[f"{script_class.__name__}: the script's settings"] = names(script_class)
    sections["TRL GRPOConfig"] = names(GRPOConfig) - training
    sections["transformers TrainingArguments"] = training
    if model_class is not None:
        sections[f"TRL {model_class.__name__}"] = names(model_class)
    groups = {title: argparse._ArgumentGroup(parser, title) for title in sections}
    remaining = []
    for action in [a for group in parser._action_groups for a in group._group_actions]:
        title = next((t for t, members in sections.items() if action.dest in members), None)
        if title is None:  # --help, and any flag no dataclass declares
            remaining.append(action)
            continue
        if action.option_strings and action.option_strings[0].startswith("--no_"):
            # `%(default).0s` prints nothing, and keeps the formatter from adding the (False) default of this flag
            action.help = f"Turn off --{action.dest}.%(default).0s"
        groups[title]._group_actions.append(action)
    options = argparse._ArgumentGroup(parser, "other options")
    options._group_actions.extend(remaining)
    parser._action_groups = [options, *(g for g in groups.values() if g._group_actions)]


def parse_values(parser: Any, argv: Sequence[str]) -> argparse.Namespace:
    """
    Every field's value from `--config` and the command line (command line last), as [`~trl.TrlParser`] reads them,
    without building the dataclasses: their checks depend on the machine (its process count, whether it has a GPU),
    which a plan for another machine must not. Unknown keys and flags stop at `parser.error`, naming them.
    """
    import yaml

    known = _setting_names(parser)
    argv = _old_setting_names(list(argv), known)
    if "--config" in argv:
        index = argv.index("--config")
        argv.pop(index)
        if index >= len(argv):
            parser.error("--config needs a YAML file.")
        path = argv.pop(index)
        try:
            with open(path) as f:
                config = yaml.safe_load(f)
        except (OSError, yaml.YAMLError) as error:
            parser.error(f"--config {path}: {error}")
        if not isinstance(config, dict):
            parser.error(f"--config {path} must hold a YAML mapping of settings.")
        config.pop("env", None)
        config = {_renamed(str(key), known) or key: value for key, value in config.items()}
        unknown = parser.set_defaults_with_config(**config)
        if unknown:
            parser.error(f"--config {path}: {unknown_settings([u[2:] for u in unknown[::2]], known)}")
    namespace, remaining = parser.parse_known_args(argv)
    flags = [arg.split("=", 1)[0][2:] for arg in remaining if arg.startswith("--")]
    if flags:
        parser.error(unknown_settings(flags, known, prefix="--"))
    if remaining:
        parser.error(f"unrecognized arguments: {' '.join(remaining)}")
    return namespace


def wants_plan(argv: Sequence[str]) -> bool:
    """Whether `argv` asks for `--print_plan` (also written `--print_plan true`)."""
    from transformers.hf_argparser import string_to_bool

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--print_plan", type=string_to_bool, nargs="?", const=True, default=False)
    return bool(pre.parse_known_args(list(argv))[0].print_plan)


def print_plan(parser: Any, argv: Sequence[str], script_class: type) -> dict[str, Any]:
    """
    `--print_plan` of an example: print the batch plan of the settings in effect (`--config` and the flags over it)
    on `--num_processes` processes (default: this launch's), and the recipe's plan it reaches or misses. The config
    is not built (see [`parse_values`]): a batch written for 7 processes may not divide on this machine's one.
    """
    import dataclasses
    from types import SimpleNamespace

    from ..dapo_config import DAPOConfig
    from .plan import batch_plan, format_plan

    values = parse_values(parser, argv)

    def fields_of(cls: type) -> dict[str, Any]:
        return {f.name: getattr(values, f.name) for f in dataclasses.fields(cls) if f.init and hasattr(values, f.name)}

    script_args = script_class(**fields_of(script_class))
    processes = script_args.num_processes or int(os.environ.get("WORLD_SIZE", "1"))
    plan = batch_plan(SimpleNamespace(**fields_of(DAPOConfig)), processes)
    recipe = {
        "prompts_per_rollout": script_args.recipe_prompts_per_rollout,
        "completions_per_update": script_args.recipe_completions_per_update,
        "num_processes": script_args.recipe_num_processes,
    }
    if int(os.environ.get("RANK", "0")) == 0:
        print(format_plan(plan, recipe=recipe))
    return {"plan": plan, "config": values}
