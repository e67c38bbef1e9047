#!/usr/bin/env bash
# Download, into .whl/ (git-ignored), every wheel that benchmarks/gpu_step.py needs on an offline GPU machine that
# already has Python 3.12 (x86_64, glibc >= 2.17) with torch, transformers, accelerate, peft, matplotlib and pytest:
# TRL 1.16, datasets, latex2sympy2_extended and the dependencies such a machine lacks, plus the dapo-trl wheel built
# from this checkout. Run it where the package index is reachable; it prints the total size (carry it in well under
# 64 MiB) and checks that every requirement of the downloaded wheels is either among them or expected on the machine.
#
#   scripts/fetch_gpu_wheels.sh                        # download into .whl/
#   scripts/fetch_gpu_wheels.sh --have pyarrow,pandas  # the GPU machine already has these (see `pip list` there)
#   scripts/fetch_gpu_wheels.sh --list                 # print the packages, download nothing
#
# Then, on the GPU machine, from the checkout's root (docs/gpu_check.md):
#   python3 -m pip install --no-index --find-links .whl dapo-trl && python3 benchmarks/gpu_step.py
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
DEST=.whl
LIMIT_MIB=64  # what a GPU machine is sent: the wheels and the checkout (~1.5 MiB) together
WARN_MIB=48

# name==version, one per line, with the reason each is needed. Versions are pinned so that the set resolves the same
# way every time; datasets 5.0.x accepts huggingface-hub 0.25-1.x, the range transformers 5.x installs.
PACKAGES=(
    "trl==1.16.0"                          # the trainer dapo-trl extends
    "datasets==5.0.1"                      # TRL's data layer
    "latex2sympy2_extended==1.11.0"        # dapo-trl's symbolic verifier
    "antlr4-python3-runtime==4.13.2"       #   its parser runtime
    "pyarrow==21.0.0"                      # datasets, TRL (>=21; the smallest wheel of the allowed versions)
    "pandas==2.3.3"                        # datasets, TRL (2.3 runs with numpy 1.26 and 2.x)
    "pytz==2026.6"                         #   pandas 2.x
    "tzdata==2026.6"                       #   pandas 2.x
    "dill==0.4.1"                          # datasets (<0.4.2)
    "multiprocess==0.70.19"                # datasets (<0.70.20)
    "xxhash==4.1.0"                        # datasets
    "fsspec==2026.6.0"                     # datasets caps fsspec at 2026.6.0; used only if the machine's is newer
    "requests==2.34.2"                     # datasets
    "charset-normalizer==3.5.3"            #   requests
    "urllib3==2.8.0"                       #   requests
    "aiohttp==3.14.5"                      # fsspec[http], required by datasets
    "aiohappyeyeballs==2.7.1"              #   aiohttp
    "aiosignal==1.4.0"                     #   aiohttp
    "attrs==26.1.0"                        #   aiohttp
    "frozenlist==1.8.0"                    #   aiohttp
    "multidict==7.2.1"                     #   aiohttp
    "propcache==0.5.4"                     #   aiohttp
    "yarl==1.25.1"                         #   aiohttp
)

# What the GPU machine is expected to have (torch, transformers, accelerate, peft, matplotlib, pytest and their own
# requirements); the check below names anything needed that is neither downloaded nor in this list.
ON_MACHINE="torch transformers accelerate peft matplotlib pytest numpy packaging pyyaml tqdm filelock fsspec jinja2
sympy mpmath networkx typing-extensions huggingface-hub httpx certifi idna psutil safetensors tokenizers regex
python-dateutil six pillow typer click rich"

HAVE=""
LIST_ONLY=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --list) LIST_ONLY=1 ;;
        --have) HAVE="${2//,/ }"; shift ;;
        --have=*) HAVE="${1#--have=}"; HAVE="${HAVE//,/ }" ;;
        *) echo "unknown argument: $1 (use --list or --have NAME,NAME)" >&2; exit 2 ;;
    esac
    shift
done

selected=()
for spec in "${PACKAGES[@]}"; do
    name=${spec%%==*}
    if [[ " $HAVE " == *" $name "* ]]; then continue; fi
    selected+=("$spec")
done

if [[ $LIST_ONLY == 1 ]]; then
    printf '%s\n' "${selected[@]}"
    exit 0
fi

mkdir -p "$DEST"
rm -f "$DEST"/*.whl  # a stale second version of a package would stop the install
for spec in "${selected[@]}"; do
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp --abi cp312 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        --dest "$DEST" "$spec"
done

# dapo-trl itself, pure Python (alternatively run from the checkout with PYTHONPATH=src)
rm -f "$DEST"/dapo_trl-*.whl
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$DEST" .

# Every requirement of every wheel here, for CPython 3.12 on x86_64 Linux, must be met by a wheel here or be on the
# machine; a version conflict between two wheels here is reported too.
"$PYTHON" - "$DEST" "$ON_MACHINE $HAVE" <<'EOF'
import sys, zipfile
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

dest, on_machine = Path(sys.argv[1]), {canonicalize_name(n) for n in sys.argv[2].split()}
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "implementation_name": "cpython", "os_name": "posix", "extra": ""}
wheels = {}
for path in sorted(dest.glob("*.whl")):
    name, version, _, _ = parse_wheel_filename(path.name)
    if name in wheels:
        sys.exit(f"two versions of {name} in {dest}: remove one (pip would refuse to install both)")
    with zipfile.ZipFile(path) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [line.split(":", 1)[1].strip() for line in zf.read(meta).decode().splitlines()
                    if line.startswith("Requires-Dist:")]
    wheels[name] = (version, requires)



def requirements(name: str, extra: str) -> list[Requirement]:
    """What installing `name` (or, with `extra`, its extra alone) requires on the target."""
    out = []
    for text in wheels[name][1]:
        req = Requirement(text)
        base = req.marker is None or req.marker.evaluate({**env, "extra": ""})
        if extra == "" and base:
            out.append(req)
        elif extra and req.marker is not None and not base and req.marker.evaluate({**env, "extra": extra}):
            out.append(req)
    return out


missing, conflicts, from_machine = set(), [], set()
todo, seen = [(name, "") for name in wheels], set()
while todo:
    name, extra = todo.pop()
    if (name, extra) in seen:
        continue
    seen.add((name, extra))
    for req in requirements(name, extra):
        dep = canonicalize_name(req.name)
        if dep in wheels:
            if not req.specifier.contains(wheels[dep][0], prereleases=True):
                conflicts.append(f"{name} needs {req}, {dest} has {dep} {wheels[dep][0]}")
            todo += [(dep, "")] + [(dep, e) for e in req.extras]
        elif dep in on_machine:
            from_machine.add(f"{dep}{req.specifier}")
        else:
            missing.add(f"{dep} (needed by {name})")
if conflicts or missing:
    sys.exit("\n".join(["Incomplete wheel set:"] + conflicts + sorted(missing)))
print(f"{len(wheels)} wheels; every requirement is met by them or by the machine's: {', '.join(sorted(from_machine))}")
EOF

total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
mib=$(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "Total: $mib MiB in $(ls "$DEST"/*.whl | wc -l) wheels under $DEST/"
if (( total > LIMIT_MIB * 1048576 )); then
    echo "Over $LIMIT_MIB MiB: pass --have for the packages the GPU machine already has (pyarrow is the largest)." >&2
    exit 1
elif (( total > WARN_MIB * 1048576 )); then
    echo "Note: pyarrow and pandas are most of it; if the GPU machine has them, --have pyarrow,pandas,pytz,tzdata." >&2
fi
