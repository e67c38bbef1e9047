"""Installing the built wheel into an existing TRL environment changes none of torch, transformers and trl.

Run with `pytest --run-slow -m network tests/test_install.py` (needs the package index for the isolated build and the
dependency resolution). The environment is a fresh venv made with `--system-site-packages` from this interpreter, so
it already holds the supported torch/transformers/trl, as a user's TRL project would (a venv installing them from
scratch takes minutes and ~1.5 GB).
"""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.network, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
PINNED = ("torch", "transformers", "trl")


def run(*command, **kwargs) -> str:
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, command))} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Build from a copy of the sources so that the build leaves nothing (build/, *.egg-info) in the working tree.
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "src" / "dapo_trl", source / "src" / "dapo_trl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    dist = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", dist, source)
    (path,) = dist.glob("dapo_trl-*.whl")
    return path


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", "--system-site-packages", venv)
    return venv / "bin" / "python"


def test_wheel_holds_the_package_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "dapo_trl/__init__.py" in names and "dapo_trl/py.typed" in names
    assert all(n.startswith(("dapo_trl/", "dapo_trl-")) for n in names), names


def test_pip_would_change_none_of_torch_transformers_trl(wheel, venv_python, tmp_path):
    report = tmp_path / "report.json"
    run(venv_python, "-m", "pip", "install", "--dry-run", "--report", report, wheel)
    install = {
        canonical(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert "dapo-trl" in install
    changed = sorted(set(PINNED) & set(install))
    assert not changed, f"installing dapo-trl would replace {[(name, install[name]) for name in changed]}"


def test_import_from_the_venv(wheel, venv_python, tmp_path):
    run(venv_python, "-m", "pip", "install", wheel)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", OMP_NUM_THREADS="1")
    probe = (
        "import importlib.metadata as m, json, dapo_trl; from dapo_trl import DAPOConfig, DAPOTrainer; "
        "print(json.dumps({'file': dapo_trl.__file__, 'version': dapo_trl.__version__, "
        f"**{{name: m.version(name) for name in {PINNED!r}}}}}))"
    )
    found = json.loads(run(venv_python, "-c", probe, cwd=tmp_path, env=env).strip().splitlines()[-1])
    venv = venv_python.parent.parent
    assert Path(found["file"]).is_relative_to(venv), f"imported {found['file']}, not the wheel installed in {venv}"
    assert found["version"] == importlib.metadata.version("dapo-trl")
    for name in PINNED:
        assert found[name] == importlib.metadata.version(name), name
