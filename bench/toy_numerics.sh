#!/usr/bin/env bash
# The toy SFT's bytes under CPU numerics variants, on this CPU as it is and with MKL told it runs on
# a non-Intel CPU or an AMD Zen (issue 36; docs/reproducibility.md). Prints one row per build: the
# settings, the SHA-256 of model.safetensors (12 hex digits), torch's capability and the seconds.
#
#   bash bench/toy_numerics.sh [STEPS]        # default 30 SFT steps of the default toy size, 1 thread
#
# MKL's vendor emulation: bench/mkl_vendor.c, an LD_PRELOAD library (its comment says what it
# emulates and what not): evidence about MKL's vendor dispatch, not a run on another CPU.
set -euo pipefail
STEPS=${1:-30}
BFSPO=${BFSPO:-.venv/bin/bfspo}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cc -shared -fPIC -O2 -o "$WORK/non-intel.so" bench/mkl_vendor.c -ldl
cc -shared -fPIC -O2 -DZEN -o "$WORK/zen.so" bench/mkl_vendor.c -ldl
"$BFSPO" toy data --out-dir "$WORK/data" --seed 0 > /dev/null

build() {  # LABEL [--native-numerics|--] [VAR=VALUE ...]
  local label=$1 flag=$2 out="$WORK/m"
  shift 2
  rm -rf "$out"
  env "$@" "$BFSPO" toy build --train "$WORK/data/train.jsonl" --out-dir "$out" --size default --steps "$STEPS" \
    --threads 1 $([ "$flag" = --native-numerics ] && echo --native-numerics) > "$WORK/log" 2>&1 \
    || { cat "$WORK/log" >&2; exit 1; }
  printf '| %s | %s | %s |\n' "$label" "$(sha256sum "$out/model.safetensors" | cut -c1-12)" \
    "$(python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(d['cpu_capability'], '|', round(d['wall_s']))" "$out/sft.json")"
}

echo "| CPU numerics (SFT: default size, $STEPS steps, 1 thread) | model.safetensors | torch capability | s |"
echo "|---|---|---|---|"
for vendor in as-is non-intel zen; do
  pre=(); [ "$vendor" != as-is ] && pre=(LD_PRELOAD="$WORK/$vendor.so")
  build "$vendor: none (the CPU's own kernels)" --native-numerics "${pre[@]}"
  build "$vendor: ATEN_CPU_CAPABILITY=avx2" --native-numerics "${pre[@]}" ATEN_CPU_CAPABILITY=avx2
  build "$vendor: ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2" --native-numerics "${pre[@]}" ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2
  build "$vendor: MKL_CBWR=COMPATIBLE" --native-numerics "${pre[@]}" MKL_CBWR=COMPATIBLE
  build "$vendor: pinned (bfspo/toy/numerics.py)" -- "${pre[@]}"
  build "$vendor: pinned, over ATEN_CPU_CAPABILITY=avx512 MKL_CBWR=AVX2" -- "${pre[@]}" ATEN_CPU_CAPABILITY=avx512 MKL_CBWR=AVX2
done
