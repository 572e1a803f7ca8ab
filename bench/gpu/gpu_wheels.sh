#!/usr/bin/env bash
# Download the wheels of bench/gpu/gpu-wheels.txt (no dependencies) into DIR (default bench/gpu/wheels/),
# keeping those already there, and fail if DIR passes 64 MiB: what a GPU session may carry.
#
#   bash bench/gpu/gpu_wheels.sh [DIR]
set -euo pipefail
DIR=${1:-bench/gpu/wheels}
LIMIT=$((64 * 1024 * 1024))
PYTHON=${PYTHON:-python3}
mkdir -p "$DIR"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$DIR" -r bench/gpu/gpu-wheels.txt
size=$(du -sb "$DIR" | cut -f1)
echo "$DIR: $(ls "$DIR" | wc -l) wheels, $((size / 1024 / 1024)) MiB (limit 64 MiB)"
if [ "$size" -gt "$LIMIT" ]; then
  echo "error: $DIR holds $size bytes, more than the 64 MiB a GPU session carries" >&2
  exit 1
fi
