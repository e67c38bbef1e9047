"""The package layout: the folders are the architecture, and the module paths users import keep working."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import dapo_trl

PACKAGE = Path(dapo_trl.__file__).parent
ENTRY = {"__init__", "__main__", "_compat", "_help", "_validate", "dapo_config", "dapo_trainer"}  # the entry
ALIASES = {"data", "evaluation", "launch"}  # old module paths, kept as aliases of dapo_trl.run.*
FOLDERS = {"trainer", "rewards", "run", "verifier"}


def imported_packages(path: Path) -> set[str]:
    """The dapo_trl subpackages a module imports from (relative imports resolved against its own folder)."""
    here = path.relative_to(PACKAGE).parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(here[: len(here) - (node.level - 1)])
                target = [*base, *(node.module.split(".") if node.module else [])]
            elif node.module and node.module.startswith("dapo_trl."):
                target = node.module.split(".")[1:]
            else:
                continue
            found.add(target[0] if target else "")
    return found


def test_the_top_level_holds_only_the_entry_and_the_aliases():
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules == ENTRY | ALIASES
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == FOLDERS


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_modules_inside_a_folder_drop_the_leading_underscore(folder):
    private = [p.name for p in (PACKAGE / folder).glob("_*.py") if p.name != "__init__.py"]
    assert private == []


def test_the_trainer_steps_import_neither_the_run_tools_nor_the_rewards():
    """trainer/ -> verifier/ and the entry's config only; run/ may use trainer/, never the other way round."""
    for path in (PACKAGE / "trainer").glob("*.py"):
        assert imported_packages(path) <= {"trainer", "verifier", "dapo_config", "_validate", "_compat"}, path.name
    for path in (PACKAGE / "verifier").glob("*.py"):
        assert imported_packages(path) <= {"verifier"}, path.name


def test_old_module_paths_still_import():
    from dapo_trl import data, evaluation, launch, run

    assert data is run.data and evaluation is run.evaluation and launch is run.launch
    assert data.load_math_dataset is run.data.load_math_dataset
    from dapo_trl.data import load_math_dataset  # noqa: F401
    from dapo_trl.rewards import MathVerifierReward, MultipleChoiceReward

    assert MathVerifierReward is dapo_trl.MathVerifierReward and MultipleChoiceReward is dapo_trl.MultipleChoiceReward


def test_every_public_name_resolves_from_the_top_level():
    missing = [name for name in dapo_trl.__all__ if getattr(dapo_trl, name, None) is None]
    assert missing == []


@pytest.mark.parametrize("module", ["dapo_trl.evaluation", "dapo_trl.launch"])
def test_the_documented_command_lines_still_run(module):
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"python -m {module}" in done.stdout or "usage:" in done.stdout


def test_the_evaluation_command_line_exits_0_after_a_run(tmp_path):
    """`python -m dapo_trl.evaluation` runs the module itself: its exit code is the module's, not its return value."""
    import json

    from _tiny import tiny_model_and_tokenizer

    model, tokenizer = tiny_model_and_tokenizer()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(2)))
    command = [sys.executable, "-m", "dapo_trl.evaluation", "--model", str(tmp_path / "model"), "--dataset", str(data)]
    command += [
        "--k",
        "1",
        "--max_new_tokens",
        "2",
        "--backend",
        "transformers",
        "--output",
        str(tmp_path / "out.json"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "out.json").read_text())["num_prompts"] == 2
