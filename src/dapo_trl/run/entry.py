"""
One command for a run's steps: `dapo-trl COMMAND ...` (the console script) or `python -m dapo_trl COMMAND ...`.

| command | runs | the same as |
|---|---|---|
| `train` | the main job (the CPU demo without a model or dataset) | `python examples/train_math.py ...` |
| `plan` | the main job's batch plan for the settings given, without loading anything | `... examples/train_math.py --print_plan` |
| `evaluate` | avg@k / pass@k / maj@k of a saved run on a math dataset | `python -m dapo_trl.evaluation ...` |
| `launch` | the `accelerate launch` line of one node of a cluster | `python -m dapo_trl.launch ...` |

Every argument after the command goes to it unchanged (`dapo-trl train --help` lists the training settings). With
several processes, launch the module: `accelerate launch -m dapo_trl train --config configs/smoke.yaml`.

The main job is `examples/train_math.py` of the source tree dapo-trl was installed from (a clone, or an editable
install); an install from a wheel has no examples, and `train` and `plan` then say where to get the script.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

PROG = "dapo-trl"
SOURCE_ROOT = Path(__file__).resolve().parents[3]  # src/dapo_trl/run/entry.py -> the repository
MAIN_JOB = SOURCE_ROOT / "examples" / "train_math.py"

# command -> what it does, for the usage text
COMMANDS: dict[str, str] = {
    "train": "train with DAPO: examples/train_math.py (the CPU demo without --model_name_or_path / --dataset_name)",
    "plan": "print the batch plan of the settings given (train's flags), without loading anything",
    "evaluate": "avg@k / pass@k / maj@k of a saved run on a math dataset (python -m dapo_trl.evaluation)",
    "launch": "the accelerate launch line of one node of a cluster (python -m dapo_trl.launch)",
}


def usage() -> str:
    """The text `dapo-trl` without a command (or with `--help`) prints."""
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} COMMAND [ARGS ...]   ({PROG} COMMAND --help lists the command's arguments)", ""]
    lines += [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the command named by the first argument with the rest; exit code 2 and the usage for an unknown one."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        raise SystemExit(0 if argv else 2)
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(
            f"{usage()}\n\n{PROG}: error: unknown command {command!r}; choose one of {list(COMMANDS)}.",
            file=sys.stderr,
        )
        raise SystemExit(2)
    if command == "evaluate":
        from .evaluation import main as evaluate

        _run_as(f"{PROG} evaluate", rest, lambda: evaluate(rest))
    elif command == "launch":
        _run_as(f"{PROG} launch", rest, lambda: runpy.run_module("dapo_trl.run.launch", run_name="__main__"))
    else:
        script = main_job()
        rest = [*rest, "--print_plan"] if command == "plan" and "--print_plan" not in rest else rest
        _run_as(f"{PROG} {command}", rest, lambda: runpy.run_path(str(script), run_name="__main__"))


def main_job() -> Path:
    """The main job's script, or an exit naming where it lives when this install has no source tree."""
    if not MAIN_JOB.is_file():
        print(
            f"{PROG}: error: the main job is examples/train_math.py of dapo-trl's source tree, which this install "
            f"(from a wheel) does not have ({MAIN_JOB} is missing). Clone the repository and install it from there "
            "(`pip install -e ./dapo-trl`), or run the script from a clone.",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return MAIN_JOB


def _run_as(prog: str, argv: list[str], run) -> None:
    """Run `run()` with `sys.argv` as the command would see it (its usage and errors name `prog`)."""
    saved = sys.argv
    sys.argv = [prog, *argv]
    try:
        run()
    finally:
        sys.argv = saved
