#!/usr/bin/env bash
# A separate virtual environment with another supported TRL release, for the tier that runs part of the suite against it
# (`make trl114-env`, `make test-trl114`; README, "TRL versions").
#
# Why a separate venv: the main environment holds the newest supported TRL (1.16), and pip keeps one TRL per
# environment. The rest of the stack (torch, transformers, accelerate, ...) resolves as in the main environment.
#
# Usage: scripts/install_trl_version.sh [VENV] [TRL_VERSION]        (defaults: .venv-trl114 1.14.2)
# On a machine whose pip fetches CUDA torch wheels by default, set
# TORCH_INDEX="--extra-index-url https://download.pytorch.org/whl/cpu" so that torch resolves to the CPU build.
set -euo pipefail
VENV=${1:-.venv-trl114}
TRL_VERSION=${2:-1.14.2}
PYTHON=${PYTHON:-python3}
TORCH_INDEX=${TORCH_INDEX:-}
cd "$(dirname "$0")/.."

[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)
# torch first, so that resolving TRL never pulls a CUDA torch.
# shellcheck disable=SC2086
"${PIP[@]}" $TORCH_INDEX "torch==2.13.0"
# shellcheck disable=SC2086
"${PIP[@]}" $TORCH_INDEX "torch==2.13.0" "trl==$TRL_VERSION" -e ".[dev]"
"$VENV/bin/python" -c "import torch, transformers, trl; print('trl', trl.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
