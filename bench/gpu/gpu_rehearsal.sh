#!/usr/bin/env bash
# `make gpu-session-rehearsal`: bench/gpu/gpu_session.sh on CPU at tiny sizes (bench/gpu/gpu_check.py's preset
# `tiny`, whose limits only guard against a hang: shared CPU cores time nothing), offline, in a clean
# venv that holds only what the GPU machine's image has (torch, transformers, peft, accelerate and
# their dependencies, at the lock's versions: the lock's CPU torch stands in for the image's 2.11.0)
# plus the carried wheels installed from their folder alone (--no-index), so no vllm, snakemake,
# wandb or pandas. Then bench/gpu/gpu_rehearsal_check.py: OUT as the device returns it (at most 8 plain
# files, none deeper than OUT/a/b/file), every part ran and measured, and the update part, run again
# and killed after its first measurement (into OUT-killed), left that measurement in results.json.
# Fails if the wheel folder passes 64 MiB (bench/gpu/gpu_wheels.sh), if one of those packages is
# importable, or if a part or a check fails.
#
#   bash bench/gpu/gpu_rehearsal.sh [OUT]      # default results/gpu-rehearsal
set -euo pipefail
OUT=${1:-results/gpu-rehearsal}
WHEELS=${GPU_WHEELS:-bench/gpu/wheels}
VENV=${GPU_VENV:-.gpu-venv}
PY=${PY:-python3}
start=$SECONDS
PYTHON=$PY bash bench/gpu/gpu_wheels.sh "$WHEELS"
"$PY" -m venv --clear "$VENV"
"$VENV/bin/pip" install --quiet -c requirements/lock-cpu.txt torch transformers peft accelerate
"$VENV/bin/pip" install --quiet --no-deps --no-index --find-links "$WHEELS" -r bench/gpu/gpu-wheels.txt
"$VENV/bin/python" - <<'PY'
import importlib.util, sys
present = [m for m in ("vllm", "snakemake", "wandb", "pandas") if importlib.util.find_spec(m)]
sys.exit(f"the rehearsal's venv holds {present}, which the GPU image lacks" if present else 0)
PY
rm -rf "$OUT" "$OUT-killed"
work="${TMPDIR:-/tmp}/bfspo-gpu-rehearsal"
env -u PYTHONPATH PYTHON="$VENV/bin/python" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" GPU_CHECK_WORK="$work" \
  GPU_WHEELS="$WHEELS" bash bench/gpu/gpu_session.sh "$OUT" --preset tiny
env -u PYTHONPATH OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" GPU_CHECK_WORK="$work" WANDB_MODE=disabled \
  HF_HUB_OFFLINE=1 "$VENV/bin/python" -m bench.gpu.gpu_rehearsal_check "$OUT"
echo "gpu-session-rehearsal: passed in $((SECONDS - start)) s; $OUT/summary.md"
