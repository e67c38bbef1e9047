"""Installing the built wheel into an existing TRL environment changes none of torch, transformers and trl, and the
install commands the README gives for existing TRL projects work as written.

Run with `pytest --run-slow -m network tests/test_install.py` (needs the package index for the isolated build and the
dependency resolution). The environment is a fresh venv that sees this interpreter's installed packages but dapo-trl,
so it already holds the supported torch/transformers/trl, as a user's TRL project would (a venv installing them from
scratch takes minutes and ~1.5 GB).
"""

import importlib.metadata
import json
import os
import shlex
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
    return existing_trl_environment(tmp_path_factory)


def existing_trl_environment(tmp_path_factory) -> Path:
    """
    A fresh venv that sees this environment's packages (torch, transformers, trl, pip...) except dapo-trl itself,
    as a user's TRL project would: a folder of links to every installed entry but dapo-trl's, listed in a .pth.
    """
    venv = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    existing = tmp_path_factory.mktemp("existing-environment")
    for folder in (p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)):
        for entry in os.listdir(folder):
            if "dapo_trl" not in entry.lower().replace("-", "_") and not (existing / entry).exists():
                (existing / entry).symlink_to(Path(folder, entry))
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    Path(site, "_existing_environment.pth").write_text(f"{existing}\n")
    return python


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


# ---------------------------------------------------------------------------------------------------------------------
# The README's install commands for an existing TRL project
# ---------------------------------------------------------------------------------------------------------------------


def readme_install_commands() -> list[list[str]]:
    """The `pip ...` lines of the README's install block ("Installing into an existing TRL environment")."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("```bash", readme.index("Installing into an existing TRL environment"))
    block = readme[start + len("```bash") : readme.index("```", start + 3)]
    return [shlex.split(line) for line in block.splitlines() if line.startswith("pip ")]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A git repository holding the package sources, standing in for a clone of this repository (./dapo-trl)."""
    folder = tmp_path_factory.mktemp("checkout") / "dapo-trl"
    folder.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, folder / name)
    shutil.copytree(
        ROOT / "src" / "dapo_trl", folder / "src" / "dapo_trl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    git = ["git", "-C", folder, "-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    run(*git[:3], "init", "-q")
    run(*git, "add", ".")
    run(*git, "commit", "-q", "-m", "sources")
    return folder


def test_readme_install_commands_work_as_written(clone, tmp_path_factory, tmp_path):
    """
    Each documented command runs in the stand-in TRL environment, with the README's placeholders replaced by real
    paths (the clone, a git URL of it, the wheel the documented `pip wheel` line builds): installs resolve (dry run)
    to dapo-trl plus the extra's packages and replace none of torch, transformers and trl.
    """
    venv_python = existing_trl_environment(tmp_path_factory)  # dapo-trl not installed yet
    commands = readme_install_commands()
    assert [c[:2] for c in commands] == [["pip", "install"], ["pip", "install"], ["pip", "wheel"], ["pip", "install"]]
    commit = run("git", "-C", clone, "rev-parse", "HEAD").strip()
    dist = tmp_path / "dist"

    def real(arg: str) -> str:
        # file://localhost/...: pip 23 reads "name @ git+file:///path" (empty host) as a file path and refuses it
        arg = arg.replace("<repository URL>@<tag or commit>", f"file://localhost{clone}@{commit}")
        if arg == "./dapo-trl" or arg.startswith("./dapo-trl["):
            arg = str(clone) + arg[len("./dapo-trl") :]
        if arg == "dist" or arg.startswith("dist/"):
            arg = str(dist) + arg[len("dist") :]
        return arg

    for command in commands:
        args = [real(arg) for arg in command[1:]]
        if args[0] == "wheel":
            run(venv_python, "-m", "pip", *args)
            documented = next(Path(a).name for c in commands for a in c if a.startswith("dist/"))
            documented = documented.split("[")[0]
            built = sorted(p.name for p in dist.glob("dapo_trl-*.whl"))
            assert built == [documented], f"the README installs {documented}; pip wheel built {built}"
            continue
        report = tmp_path / "report.json"
        run(venv_python, "-m", "pip", args[0], "--dry-run", "--report", report, *args[1:])
        items = {canonical(i["metadata"]["name"]): i for i in json.loads(report.read_text())["install"]}
        assert "dapo-trl" in items, args
        assert "plot" in items["dapo-trl"].get("requested_extras", []), f"{args}: the [plot] extra was not requested"
        assert not set(PINNED) & set(items), f"{args} would replace {set(PINNED) & set(items)}"
