"""`dapo-trl` / `python -m dapo_trl`: one entry point for the main job, its batch plan, evaluation and launch lines."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from dapo_trl.run import entry

ROOT = Path(__file__).resolve().parents[1]


def test_the_console_script_is_the_entry_point():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"dapo-trl": "dapo_trl.run.entry:main"}
    from importlib.metadata import entry_points

    (installed,) = entry_points(group="console_scripts", name="dapo-trl")
    assert installed.load() is entry.main


def test_python_dash_m_lists_the_commands_and_refuses_an_unknown_one():
    listed = subprocess.run([sys.executable, "-m", "dapo_trl"], capture_output=True, text=True, cwd=ROOT)
    assert listed.returncode == 2 and all(f"  {name}" in listed.stdout for name in ("train", "plan", "evaluate"))
    wrong = subprocess.run([sys.executable, "-m", "dapo_trl", "trian"], capture_output=True, text=True, cwd=ROOT)
    assert wrong.returncode == 2 and "unknown command 'trian'" in wrong.stderr


def test_plan_prints_the_main_jobs_batch_plan(capsys):
    entry.main(["plan", "--config", str(ROOT / "configs" / "smoke.yaml")])
    out = capsys.readouterr().out
    assert "dynamic sampling target   4 informative groups per rollout step" in out and "recipe plan" in out


def test_evaluate_and_train_pass_their_arguments_on(capsys):
    with pytest.raises(SystemExit) as stop:
        entry.main(["evaluate", "--help"])
    assert stop.value.code == 0 and "--dataset_format" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        entry.main(["train", "--dataset_name", "nosuch.jsonl"])  # the main job's own check answers
    assert stop.value.code == 2 and "give both --model_name_or_path and --dataset_name" in capsys.readouterr().err


def test_an_install_without_the_source_tree_says_where_the_main_job_is(monkeypatch, capsys):
    monkeypatch.setattr(entry, "MAIN_JOB", ROOT / "no" / "train_math.py")
    with pytest.raises(SystemExit) as stop:
        entry.main(["train"])
    assert stop.value.code == 2 and "Clone the repository" in capsys.readouterr().err
