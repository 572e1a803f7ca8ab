#!/usr/bin/env bash
# The GPU check (issues 30, 38) on a GPU machine: at most 8 minutes on one H100 or H200, its results in
# OUT as they are measured (bench/gpu/gpu_check.py says what each part measures, in which order, under
# which time limit). OUT holds four files: summary.md, results.json, env.txt, logs.txt.
#
#   bash bench/gpu/gpu_session.sh OUT [bench/gpu/gpu_check.py options, e.g. --parts attention update]
#
# From the repository root. The machine's image needs torch, transformers, peft and accelerate
# (not vllm, snakemake, wandb or pandas; no network; math-verify travels as a wheel). The wheels of
# bench/gpu/gpu-wheels.txt, in $GPU_WHEELS (default bench/gpu/wheels/, built by
# `bash bench/gpu/gpu_wheels.sh` and carried with the checkout), are unpacked into a folder of their
# own and put before the image's packages; if they do not import there, the image's own packages are
# used, as OUT/env.txt says.
# `make gpu-session-rehearsal` runs this script on CPU at tiny sizes, in a venv of the image's packages.
set -euo pipefail
OUT=${1:?usage: bench/gpu/gpu_session.sh OUT_DIR [gpu_check options]}
shift
PYTHON=${PYTHON:-python3}  # the interpreter that has the image's packages
WHEELS=${GPU_WHEELS:-bench/gpu/wheels}
export WANDB_MODE=disabled HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export GPU_CHECK_WORK=${GPU_CHECK_WORK:-/tmp/bfspo-gpu-check}
mkdir -p "$OUT"
path=$PWD
errors=$GPU_CHECK_WORK-wheels.err  # outside OUT: only what the check keeps goes there
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  site=$GPU_CHECK_WORK-site
  rm -rf "$site"
  for wheel in "$WHEELS"/*.whl; do "$PYTHON" -m zipfile -e "$wheel" "$site"; done  # a wheel is a zip of its files
  if PYTHONPATH="$site:$PWD" "$PYTHON" -c "import transformers, peft, bfspo.training.trainer" 2>"$errors"; then
    path="$site:$PWD"
    echo "wheels: carried, $(cd "$WHEELS" && ls -- *.whl | tr '\n' ' ')" > "$OUT/env.txt"
  else
    { echo "wheels: the carried ones do not import over the image's packages, so the image's own are used:"
      tail -n 5 "$errors"; } > "$OUT/env.txt"
  fi
else
  echo "wheels: none in $WHEELS, the image's packages are used" > "$OUT/env.txt"
fi
PYTHONPATH="$path" exec "$PYTHON" -m bench.gpu.gpu_check --out "$OUT" "$@"
