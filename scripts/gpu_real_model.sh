#!/usr/bin/env bash
# On the offline GPU machine, after .carry/part1..3 were carried (scripts/prepare_gpu_carry.sh, docs/real_model.md):
# join and check SmolLM2-135M-Instruct's GGUF, install TRL, datasets, gguf and dapo-trl from the carried wheels, convert
# the model to a transformers folder and train it with GRPOTrainer and DAPOTrainer side by side
# (benchmarks/gpu_step.py --real-model). Extra arguments go to the benchmark. The report goes to $OUT (or outputs/).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
WORK=${WORK:-/tmp/dapo-trl-real-model}
REPORT_DIR=${OUT:-outputs/gpu-real-model}
mkdir -p "$WORK" "$REPORT_DIR"
gguf="$WORK/SmolLM2-135M-Instruct.Q4_1.gguf"

cat .carry/part1/smollm2.gguf.0 .carry/part2/smollm2.gguf.1 > "$gguf"
echo "$(cat .carry/part1/smollm2.gguf.sha256)  $gguf" | sha256sum -c -
"$PYTHON" -m pip install --quiet --no-index --find-links .carry/part2 --find-links .carry/part3 dapo-trl gguf
"$PYTHON" scripts/get_smollm2.py --gguf "$gguf" --output "$WORK/SmolLM2-135M-Instruct"
"$PYTHON" benchmarks/gpu_step.py --real-model "$WORK/SmolLM2-135M-Instruct" "$@" 2>&1 | tee "$REPORT_DIR/gpu_real_model.txt"
