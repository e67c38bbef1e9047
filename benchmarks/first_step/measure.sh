#!/usr/bin/env bash
# Time from `git clone` to the first trained step of a user's own GRPO script after the import swap (README, "Quick
# start"). The existing TRL project is the environment of $PYTHON (default: python3), seen through a new venv so that
# nothing is installed into it; dapo-trl is installed with the README's `pip install "./dapo-trl[plot]"`.
#
#   bash benchmarks/first_step/measure.sh                 # clone this checkout, swap the import
#   NO_SWAP=1 bash benchmarks/first_step/measure.sh       # the same script with TRL's GRPOTrainer, for comparison
#
# Not timed: building the venv and the user's model (a 89k-parameter Qwen2 saved to a folder, standing in for a
# downloaded checkpoint). pip fetches setuptools for the build (its isolated build environment): needs the index.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=${REPO:-$(cd "$here/../.." && pwd)}
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

# The existing TRL environment: links to every installed entry but dapo-trl's, in a folder ending in site-packages
# (datasets' fingerprinting pickles classes by reference only from such a folder), listed in the new venv's .pth.
site=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
mkdir -p existing/lib/site-packages
for entry in "$site"/*; do
  case "$(basename "$entry")" in *dapo_trl* | *dapo-trl*) ;; *) ln -s "$entry" existing/lib/site-packages/ ;; esac
done
"$python" -m venv --without-pip env
echo "$work/existing/lib/site-packages" >"$(env/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_existing.pth"
. env/bin/activate
if python -c "import dapo_trl" 2>/dev/null; then echo "dapo_trl is importable before the install" >&2; exit 1; fi
PYTHONPATH="$repo/src" python -c "
from dapo_trl.run.toy import build_char_tokenizer, build_tiny_model
tokenizer = build_char_tokenizer()
build_tiny_model(tokenizer, hidden_size=64, num_heads=2, seed=0).save_pretrained('my-model')
tokenizer.save_pretrained('my-model')" 2>/dev/null
cp "$here/train_grpo.py" .
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1

t0=$(date +%s.%N)
git clone -q "$repo" dapo-trl
t1=$(date +%s.%N)
python -m pip install -q "./dapo-trl[plot]" 2> >(grep -v "^WARNING: Location" >&2)
t2=$(date +%s.%N)
if [[ -z "${NO_SWAP:-}" ]]; then
  sed -i 's/^from trl import GRPOConfig, GRPOTrainer$/from dapo_trl import DAPOConfig as GRPOConfig, DAPOTrainer as GRPOTrainer/' train_grpo.py
fi
grep '^from .* import .*GRPOTrainer' train_grpo.py
python train_grpo.py my-model >run.log 2>&1 || { tail -30 run.log >&2; exit 1; }
grep -o 'step [0-9]* ended at .*' run.log
t3=$(grep -o 'FIRST_TRAINED_STEP [0-9.]*' run.log | cut -d' ' -f2)
python -c "
t0, t1, t2, t3 = $t0, $t1, $t2, $t3
print(f'clone {t1 - t0:.1f} s, install {t2 - t1:.1f} s, script to its first trained step {t3 - t2:.1f} s: {t3 - t0:.1f} s')"
uptime
