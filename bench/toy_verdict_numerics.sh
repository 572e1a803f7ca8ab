#!/usr/bin/env bash
# The toy's verdict under other CPU float paths (issue 44, item 6; docs/reproducibility.md). From
# the shipped start model (its bytes are the same on every CPU), config.yaml's verdict table (DAPO
# and BFS-PO K = 3, seeds 0-2, and the zero-shot rows) is rebuilt under each float path given, each
# in its own results folder, results/numerics/<path>; the pinned path is config.yaml's own (the
# table that `make toy` builds, in results/, built here if missing). Prints one row per path and
# column: the two methods' accuracy, the paired differences with their intervals and verdicts, and
# how many of the six trained adapters are byte-equal to the pinned path's.
#
#   bash bench/toy_verdict_numerics.sh [PATH ...]   # from the repository root; default: all five
#
# Paths: pinned (config.yaml's: bfspo/toy/numerics.py), pinned-non-intel and pinned-zen (the same,
# with MKL told it runs on a non-Intel CPU or an AMD Zen: bench/mkl_vendor.c), native (the CPU's own
# kernels: `toy.numerics: native`), native-zen (those, with MKL's Zen path: what an AVX-512 Zen
# runs unpinned, as far as an LD_PRELOAD emulates it). Each path is 6 RL runs and 14 evaluations:
# about 9 min on 2 cores. SNAKEMAKE_ARGS adds options (default: --cores 2).
set -euo pipefail
PATHS=("$@")
[ ${#PATHS[@]} -gt 0 ] || PATHS=(pinned pinned-non-intel pinned-zen native native-zen)
BIN=${BIN:-.venv/bin}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cc -shared -fPIC -O2 -o "$WORK/non-intel.so" bench/mkl_vendor.c -ldl
cc -shared -fPIC -O2 -DZEN -o "$WORK/zen.so" bench/mkl_vendor.c -ldl

for path in "${PATHS[@]}"; do
  case $path in
    pinned|native) pre=() ;;
    pinned-non-intel) pre=(LD_PRELOAD="$WORK/non-intel.so") ;;
    pinned-zen|native-zen) pre=(LD_PRELOAD="$WORK/zen.so") ;;
    *) echo "toy_verdict_numerics: unknown path '$path' (pinned, pinned-non-intel, pinned-zen, native, native-zen)" >&2; exit 2 ;;
  esac
  if [ "$path" = pinned ]; then
    target=(--configfile config/config.yaml results/tables/toy-verdict.md)
  else
    target=(--configfile "$WORK/$path.yaml")
  fi
  "$BIN/python" - "$path" "$WORK/$path.yaml" <<'PY'
import sys, yaml
path, out = sys.argv[1:]
cfg = yaml.safe_load(open("config/config.yaml"))
cfg["results"] = f"results/numerics/{path}"
cfg["toy"]["numerics"] = path.split("-")[0]
cfg["tables"] = {"toy-verdict": cfg["tables"]["toy-verdict"]}
yaml.safe_dump(cfg, open(out, "w"), sort_keys=False)
PY
  echo "toy_verdict_numerics: $path (log: results/numerics/$path.log)" >&2
  mkdir -p results/numerics
  env "${pre[@]}" "$BIN/snakemake" ${SNAKEMAKE_ARGS:---cores 2} "${target[@]}" > "results/numerics/$path.log" 2>&1 \
    || { tail -20 "results/numerics/$path.log" >&2; exit 1; }
done

"$BIN/python" - "${PATHS[@]}" <<'PY'
import hashlib, sys
from pathlib import Path
import pandas as pd

def results(path):
    return Path("results" if path == "pinned" else f"results/numerics/{path}")

def adapters(path):
    runs = results(path) / "runs"
    return {r.name: hashlib.sha256((r / "adapter/adapter_model.safetensors").read_bytes()).hexdigest()
            for r in sorted(runs.glob("toy_toy_*_s[012]")) if (r / "done.json").exists()}

pinned = adapters("pinned")
print("| float path | column | DAPO acc. | BFS-PO acc. | acc. diff [95%] | len. diff [95%] | AES diff [95%] "
      "| verdicts (acc., len., AES) | adapters = pinned |")
print("|---|---|---|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    table = pd.read_csv(results(path) / "tables/toy-verdict.csv")
    own = {run: digest for run, digest in adapters(path).items() if "_dapo_" in run or "_bfspo_" in run}
    same = sum(own[r] == pinned.get(r) for r in own)
    for column, rows in table[table.what.str.contains(r"\(")].groupby("what", sort=False):
        by = rows.set_index("metric")
        cell = lambda m: f"{by.loc[m, 'diff']:+.2f} [{by.loc[m, 'ci_low']:+.2f}, {by.loc[m, 'ci_high']:+.2f}]"
        verdicts = ", ".join(by.loc[m, "verdict"] for m in ("Acc.", "Avg. Len.", "AES"))
        print(f"| {path} | {column} | {by.loc['Acc.', 'baseline']:.1f} | {by.loc['Acc.', 'value']:.1f} | {cell('Acc.')} "
              f"| {cell('Avg. Len.')} | {cell('AES')} | {verdicts} | {same}/{len(own)} |")
PY
