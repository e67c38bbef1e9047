"""Every command line of the project: bad input ends in one `error:` line and exit code 2, every option has help."""

import argparse
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARGPARSE_TOOLS = [
    "src/dapo_trl/run/launch.py",
    "src/dapo_trl/run/evaluation.py",
    "examples/custom_trainer.py",
    *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "scripts").glob("*.py"))),
    *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "benchmarks").glob("*.py"))),
]


def run(argv, tmp_path, env=None):
    base = {k: v for k, v in os.environ.items() if k not in ("NUM_MACHINES", "MACHINE_RANK", "MAIN_PROCESS_IP")}
    base.update(PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", **(env or {}))
    return subprocess.run([sys.executable, *argv], cwd=tmp_path, env=base, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("path", ARGPARSE_TOOLS)
def test_every_argparse_option_has_help(path):
    tree = ast.parse((ROOT / path).read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_argument"]
    missing = [ast.unparse(c)[:80] for c in calls if not any(k.arg == "help" for k in c.keywords)]
    assert missing == []


def _actions_without_help(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for parser_ in action.choices.values():
                out += _actions_without_help(parser_)
        elif not (action.help or "").strip():
            out.append("/".join(action.option_strings) or action.dest)
    return out


def test_every_option_of_the_built_parsers_has_help():
    from dapo_trl.run.evaluation import build_parser
    from dapo_trl.run.launch import _parser

    assert _actions_without_help(_parser()) == [] and _actions_without_help(build_parser()) == []
    sys.path.insert(0, str(ROOT / "tests"))
    from test_train_domain_qa import train_domain_qa
    from test_train_math import train_math

    assert _actions_without_help(train_math.build_parser()) == []
    assert _actions_without_help(train_domain_qa.build_parser()) == []


def _assert_one_line_error(result, *named):
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, result.stderr[-2000:]
    for name in named:
        assert name in errors[0], errors[0]


def test_launch_env_without_its_variables(tmp_path):
    result = run(["-m", "dapo_trl.launch", "env", "--dry_run", "train.py"], tmp_path)
    _assert_one_line_error(result, "MACHINE_RANK")
    result = run(["-m", "dapo_trl.launch", "env", "--dry_run", "train.py"], tmp_path, {"MACHINE_RANK": "0"})
    _assert_one_line_error(result, "NUM_MACHINES")
    env = {"MACHINE_RANK": "0", "NUM_MACHINES": "two", "MAIN_PROCESS_IP": "h", "PROCESSES_PER_MACHINE": "1"}
    _assert_one_line_error(run(["-m", "dapo_trl.launch", "env", "--dry_run", "t.py"], tmp_path, env), "'two'")
    result = run(["-m", "dapo_trl.launch", "slurm", "--dry_run", "train.py"], tmp_path)
    _assert_one_line_error(result, "SLURM_JOB_NODELIST")
    result = run(["-m", "dapo_trl.launch", "env", "--processes_per_machine", "0", "t.py"], tmp_path)
    _assert_one_line_error(result, "--processes_per_machine")


def test_evaluation_with_unreadable_data(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "data.jsonl").write_text(json.dumps({"foo": "1", "bar": "2"}) + "\n")
    result = run(["-m", "dapo_trl.evaluation", "--model", "model", "--dataset", "data.jsonl"], tmp_path)
    _assert_one_line_error(result, "--dataset data.jsonl", "['bar', 'foo']")


@pytest.mark.integration  # each run imports torch and TRL: seconds apiece
@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["examples/train_math.py", "--config", "no/such.yaml"], "no/such.yaml"),
        (["examples/train_math.py", "--num_generations", "3"], "num_generations"),
        (["examples/train_domain_qa.py", "--config", "no/such.yaml"], "no/such.yaml"),
        (["examples/train_domain_qa.py", "--dataset_name", "missing.jsonl", "--max_steps", "1"], "missing.jsonl"),
        (["examples/custom_trainer.py", "--max-steps", "0"], "--max-steps"),
        (["scripts/gen_api_docs.py", "--chek"], "--chek"),
    ],
    ids=["math-config", "math-batch", "qa-config", "qa-data", "custom-trainer", "gen-api-docs"],
)
def test_examples_and_scripts_end_bad_input_in_one_line(argv, named, tmp_path):
    result = run([str(ROOT / argv[0]), *argv[1:]], tmp_path)
    _assert_one_line_error(result, named)
