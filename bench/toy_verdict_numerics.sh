#!/usr/bin/env bash
# The toy's verdict under other CPU float paths (issue 44, item 6; docs/reproducibility.md). From
# the shipped start model (its bytes are the same on every CPU), config.yaml's verdict table (DAPO
# and BFS-PO K = 3, seeds 0-2, and the zero-shot rows) is rebuilt under each float path given, each
# in its own results folder, results/numerics/<path>; the pinned path is config.yaml's own (the
# table that `make toy` builds, in results/, built here if missing). Prints one row per path and
# column: the two methods' accuracy, the paired differences with their intervals and verdicts, and
# how many of the trained adapters are byte-equal to the pinned path's.
#
#   bash bench/toy_verdict_numerics.sh [PATH ...]   # from the repository root; default: all five
#   CONFIG=config/toy-paper-reading.yaml TABLE=toy-paper-reading bash bench/toy_verdict_numerics.sh native
#                                                   # another paired table of the toy (here 10 seeds)
#
# Paths: pinned (config.yaml's: bfspo/toy/numerics.py), pinned-non-intel and pinned-zen (the same,
# with MKL told it runs on a non-Intel CPU or an AMD Zen: bench/mkl_vendor.c), native (the CPU's own
# kernels: `toy.numerics: native`), native-zen (those, with MKL's Zen path: what an AVX-512 Zen
# runs unpinned, as far as an LD_PRELOAD emulates it). On the default table each path is 6 RL runs
# and 14 evaluations, about 7 min on 2 cores. SNAKEMAKE_ARGS adds options (default: --cores 2).
set -euo pipefail
CONFIG=${CONFIG:-config/config.yaml}
TABLE=${TABLE:-toy-verdict}
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
  # the path's config, kept where a rerun finds it (a table belongs to one config file: bfspo/reporting/owner.py)
  derived="results/numerics/$path-$TABLE.yaml"
  if [ "$path" = pinned ]; then
    target=("results/tables/$TABLE.md" --configfile "$CONFIG")  # --configfile takes every word after it
  else
    target=(--configfile "$derived")
  fi
  mkdir -p results/numerics
  "$BIN/python" - "$path" "$derived" "$CONFIG" "$TABLE" <<'PY'
import sys, yaml
path, out, config, table = sys.argv[1:]
cfg = yaml.safe_load(open(config))
cfg["results"] = f"results/numerics/{path}"
cfg["toy"]["numerics"] = path.split("-")[0]
cfg["tables"] = {table: cfg["tables"][table]}
yaml.safe_dump(cfg, open(out, "w"), sort_keys=False)
PY
  log="results/numerics/$path-$TABLE.log"
  echo "toy_verdict_numerics: $path, $TABLE (log: $log)" >&2
  env "${pre[@]}" "$BIN/snakemake" "${target[@]}" ${SNAKEMAKE_ARGS:---cores 2} > "$log" 2>&1 \
    || { tail -20 "$log" >&2; exit 1; }
done

"$BIN/python" - "$TABLE" "${PATHS[@]}" <<'PY'
import hashlib, sys
from pathlib import Path
import pandas as pd

def results(path):
    return Path("results" if path == "pinned" else f"results/numerics/{path}")

table_name, *paths = sys.argv[1:]

def adapters(path):
    """run -> the SHA-256 of its adapter, for the runs of the table's per-seed rows."""
    runs = pd.read_csv(results(path) / f"tables/{table_name}_seeds.csv").run
    return {run: hashlib.sha256((results(path) / "runs" / run / "adapter/adapter_model.safetensors").read_bytes()).hexdigest()
            for run in runs}

# the pinned path's adapters, where its table was built (by this call or `make toy`)
pinned = adapters("pinned") if (results("pinned") / f"tables/{table_name}_seeds.csv").exists() else None
print("| float path | column | DAPO acc. | BFS-PO acc. | acc. diff [95%] | len. diff [95%] | AES diff [95%] "
      "| verdicts (acc., len., AES) | adapters = pinned |")
print("|---|---|---|---|---|---|---|---|---|")
for path in paths:
    table = pd.read_csv(results(path) / f"tables/{table_name}.csv")
    own = adapters(path)
    same = "-" if pinned is None else sum(own[r] == pinned.get(r) for r in own)
    for column, rows in table[table.what.str.contains(r"\(")].groupby("what", sort=False):
        by = rows.set_index("metric")
        cell = lambda m: f"{by.loc[m, 'diff']:+.2f} [{by.loc[m, 'ci_low']:+.2f}, {by.loc[m, 'ci_high']:+.2f}]"
        verdicts = ", ".join(by.loc[m, "verdict"] for m in ("Acc.", "Avg. Len.", "AES"))
        print(f"| {path} | {column} | {by.loc['Acc.', 'baseline']:.1f} | {by.loc['Acc.', 'value']:.1f} | {cell('Acc.')} "
              f"| {cell('Avg. Len.')} | {cell('AES')} | {verdicts} | {same}/{len(own)} |")
PY
