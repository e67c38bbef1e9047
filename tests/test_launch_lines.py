"""
Every launch line written down in the project (README, docs/, config comments, the example's docstring, the Makefile) is
parsed and validated: accelerate/torchrun options that exist and agree with each other, script flags that
`examples/train_math.py` accepts and DAPOConfig builds, a batch plan TRL accepts and that reaches the plan its recipe
states, a vLLM server for the recipe's model with room for a prompt, and evaluation flags the CLI accepts.
"""

import importlib.util
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from dapo_trl.run.evaluation import build_parser as evaluation_parser
from dapo_trl.run.plan import batch_plan, recipe_advice

ROOT = Path(__file__).resolve().parents[1]


def _load_example():
    if "train_math" in sys.modules:  # loaded by tests/test_train_math.py
        return sys.modules["train_math"]
    spec = importlib.util.spec_from_file_location("train_math", ROOT / "examples" / "train_math.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


train_math = _load_example()
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(accelerate launch|torchrun|python3? |trl vllm-serve)")
TARGETS = ("train_math.py", "dapo_trl.evaluation", "trl vllm-serve")  # the main job, its evaluation and its server
# tokens a vLLM context keeps for the prompt beyond max_completion_length when the recipe sets no max_prompt_length
PROMPT_ROOM = 2048  # verl's prompt limit


def _logical_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Join shell continuation lines (ending with a backslash)."""
    out, buffer, start = [], "", None
    for number, text in lines:
        if start is None:
            start = number
        if text.rstrip().endswith("\\"):
            buffer += text.rstrip()[:-1] + " "
            continue
        out.append((start, buffer + text))
        buffer, start = "", None
    return out


def _markdown_lines(path: Path) -> list[tuple[int, str]]:
    lines, fence = [], None  # fence: the language of the open code block, None outside one
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if text.lstrip().startswith("```"):
            fence = (text.strip()[3:] or "text") if fence is None else None
            continue
        if fence in ("bash", "sh", "shell", "text"):
            lines.append((number, text))
        elif fence is None:  # inline commands written in the prose
            spans = re.findall(r"`([^`]+)`", text)
            lines.extend((number, span) for span in spans if COMMAND.match(span) and " --" in span)
    return lines


def _comment_lines(path: Path) -> list[tuple[int, str]]:
    return [
        (number, text.lstrip()[1:].strip())
        for number, text in enumerate(path.read_text().splitlines(), 1)
        if text.lstrip().startswith("#")
    ]


def _docstring_lines(path: Path) -> list[tuple[int, str]]:
    text = path.read_text()
    docstring = text[: text.index('"""', 3)]
    block = docstring[docstring.index("```") + 3 : docstring.index("```", docstring.index("```") + 3)]
    first = docstring[: docstring.index("```")].count("\n") + 2
    return [(first + i, line) for i, line in enumerate(block.splitlines()[1:])]


def _makefile_lines(path: Path) -> list[tuple[int, str]]:
    return [(n, t.strip()) for n, t in enumerate(path.read_text().splitlines(), 1) if t.startswith("\t")]


def documented_launch_lines() -> list[tuple[str, str]]:
    sources = [(ROOT / "README.md", _markdown_lines), (ROOT / "Makefile", _makefile_lines)]
    sources += [(path, _markdown_lines) for path in sorted((ROOT / "docs").glob("*.md"))]
    sources.append((ROOT / "examples" / "train_math.py", _docstring_lines))
    sources += [(path, _comment_lines) for path in sorted((ROOT / "configs").rglob("*.yaml"))]
    found = []
    for path, reader in sources:
        for number, line in _logical_lines(reader(path)):
            line = line.strip()
            if COMMAND.match(line) and any(target in line for target in TARGETS):
                found.append((f"{path.relative_to(ROOT)}:{number}", line))
    return found


LINES = documented_launch_lines()


def test_the_documented_launch_lines_are_found():
    """The collector must see the lines the README, docs/ and the recipes are known to hold (else it checks nothing)."""
    text = " ".join(line for _, line in LINES)
    assert len(LINES) >= 20, LINES
    for needle in (
        "--print_plan --num_processes 64",
        "--num_processes 128",
        "--gradient_accumulation_steps 8 --steps_per_generation 128",
        "--gradient_accumulation_steps 28 --steps_per_generation 112",
        "trl vllm-serve --model Qwen/Qwen2.5-32B",
        "python -m dapo_trl.evaluation --model outputs/cpu-demo --dataset outputs/cpu-demo/heldout.jsonl",
        "torchrun --nproc_per_node 2",
    ):
        assert needle in text, needle


def _split(line: str) -> tuple[dict[str, str], list[str]]:
    tokens = shlex.split(line, comments=True)
    env = {}
    while tokens and re.fullmatch(r"[A-Z_]+=\S+", tokens[0]):
        key, value = tokens.pop(0).split("=", 1)
        env[key] = value
    if tokens and tokens[-1] == "&":
        tokens.pop()
    return env, ["x" if token.startswith("$") else token for token in tokens]


def _launcher(tokens: list[str]) -> tuple[int, int, list[str]]:
    """(processes, machines, script arguments) of a train_math.py launch."""
    script = next(i for i, t in enumerate(tokens) if t.endswith("train_math.py"))
    options, args = tokens[:script], tokens[script + 1 :]
    assert (ROOT / tokens[script]).exists(), tokens[script]

    def option(name: str) -> str | None:
        return options[options.index(name) + 1] if name in options else None

    if options[:2] == ["accelerate", "launch"]:
        processes, machines = 1, 1
        if option("--config_file"):
            config_file = ROOT / option("--config_file")
            assert config_file.exists(), config_file
            accelerate = yaml.safe_load(config_file.read_text())
            processes, machines = accelerate.get("num_processes", 1), accelerate.get("num_machines", 1)
        processes = int(option("--num_processes") or processes)
        machines = int(option("--num_machines") or machines)
        if "--num_processes" not in options:
            assert "--config_file" not in options or processes == 1 or machines == 1
        return processes, machines, args
    if options[0] == "torchrun":
        return int(option("--nproc_per_node")) * int(option("--nnodes") or 1), int(option("--nnodes") or 1), args
    assert options[0] in ("python", "python3"), options
    return 1, 1, args


def _train_math(env: dict[str, str], tokens: list[str], tmp_path: Path):
    processes, machines, args = _launcher(tokens)
    if "CUDA_VISIBLE_DEVICES" in env and machines == 1:
        assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == processes, "one GPU per training process"
    if args:
        # this machine has no GPU; the plan does not depend on the device
        args = [*args, "--use_cpu", "true", "--bf16", "false", "--output_dir", str(tmp_path)]
    script_args, training_args, _ = train_math.parse_args([str(a) for a in args])
    if script_args.print_plan:
        processes = script_args.num_processes or processes
    plan = batch_plan(training_args, processes)
    assert plan.problems() == [], plan.problems()
    if not script_args.print_plan:
        advice = recipe_advice(
            plan,
            prompts_per_rollout=script_args.recipe_prompts_per_rollout,
            completions_per_update=script_args.recipe_completions_per_update,
            num_processes=script_args.recipe_num_processes,
        )
        assert advice is None, advice
    return training_args, script_args


def _server_recipe(where: str, line: str) -> dict:
    """The recipe a `trl vllm-serve` line serves: its own config file, or the next launch line's --config."""
    path = where.rsplit(":", 1)[0]
    if path.startswith("configs/dapo_"):
        return yaml.safe_load((ROOT / path).read_text())
    index = next(i for i, (w, text) in enumerate(LINES) if (w, text) == (where, line))
    following = next(text for w, text in LINES[index + 1 :] if "train_math.py" in text and "--config" in text)
    config = shlex.split(following)[shlex.split(following).index("--config") + 1]
    return yaml.safe_load((ROOT / config).read_text())


@pytest.mark.parametrize(("where", "line"), LINES, ids=[where for where, _ in LINES])
def test_documented_launch_line(where, line, tmp_path):
    env, tokens = _split(line)
    if any(t.endswith("train_math.py") for t in tokens):
        _train_math(env, tokens, tmp_path)
    elif tokens[:2] == ["trl", "vllm-serve"]:
        recipe = _server_recipe(where, line)
        assert tokens[tokens.index("--model") + 1] == recipe["model_name_or_path"]
        max_model_len = int(tokens[tokens.index("--max_model_len") + 1])
        room = recipe.get("max_prompt_length") or PROMPT_ROOM
        assert max_model_len >= recipe["max_completion_length"] + room, "no room left for the prompt"
        if "vllm_max_model_length" in recipe:
            assert recipe["vllm_max_model_length"] == max_model_len
    else:
        assert tokens[1:3] == ["-m", "dapo_trl.evaluation"], tokens
        args = tokens[3:]
        for required in ("--model", "--dataset"):  # prose may show only the flag it is about
            if required not in args:
                args += [required, "x"]
        evaluation_parser().parse_args(args)  # exits (a test failure) on an unknown flag or a bad value
