#!/usr/bin/env bash
# The GPU checks that CI cannot run, in one command (issues 5, 6, 8 and 21), for a session that has a
# CUDA GPU for a few minutes:
#   1. the toy task and the larger toy model (`--size gpu`, SFT on CUDA);
#   2. the plan against measurements (bfspo/pipeline, issue 21), first, so that a cut-off call
#      still has them: one micro-batch update at Qwen2.5-3B's layer shapes (PLAN_LAYERS layers,
#      PLAN_TOKENS tokens, bf16): peak memory and trained tokens/s against the plan
#      (bench/bench_plan_memory.py); vLLM's decode rate at the paper's concurrency against the
#      plan's roofline (bench/bench_plan_decode.py, where vllm is installed);
#   3. one DAPO and one BFS-PO (K=3) `bfspo train` in bf16 on the toy model, then their
#      evaluations, and the two runs' peak memory, tokens/s and step time against their plans
#      (bench/plan_vs_run.py);
#   4. bench/bench_packing.py and bench/bench_rollout.py at the Qwen2.5-0.5B shape;
#   5. bench/bench_vllm.py at that shape, where vLLM's CUDA build is installed.
# Everything it reports goes to OUT (at most 8 files): env.txt, plan.txt (the plan's numbers beside
# the measured ones), summary.md (eval summaries and per-step training figures, the numbers for
# bench/RESULTS.md), packing.txt, rollout.txt, vllm.txt, log.txt.
#
#   bash bench/gpu_session.sh OUT            # from the repository root
#
# It needs torch, transformers, peft, tokenizers, tqdm and pyyaml, plus math-verify,
# latex2sympy2_extended and antlr4-python3-runtime (pure-Python wheels a bare GPU machine can be
# given: `pip download --no-deps -d .whl math-verify==0.9.0 latex2sympy2_extended==1.11.0
# antlr4-python3-runtime==4.13.2`, then `pip install --no-deps --target /tmp/site .whl/*.whl` and
# PYTHONPATH=/tmp/site there). W&B is disabled, so wandb need not be installed.
# Sizes come from the environment; the defaults fit one 10-minute call on an H100. The tests run
# it on CPU at SIZE=test with tiny values.
set -euo pipefail
OUT=${1:?usage: bench/gpu_session.sh OUT_DIR}
SIZE=${SIZE:-gpu}                 # toy model size (bfspo/toy/sft.py SIZES)
N_TRAIN=${N_TRAIN:-50000}         # SFT rows
N_EVAL=${N_EVAL:-500}             # questions per evaluation split
STEPS=${STEPS:-20}                # RL steps per method
CHAINS=${CHAINS:-256}             # chains per RL step
MINI=${MINI:-32}                  # chains per mini-batch
BENCH_SHAPE=${BENCH_SHAPE:-0.5b}  # bench/common.py SHAPES
PLAN_SHAPE=${PLAN_SHAPE:-Qwen/Qwen2.5-3B-Instruct}  # config/models/<hub id>, or a model directory
PLAN_LAYERS=${PLAN_LAYERS:-8}     # layers of the plan-checked model (its other shapes are the model's)
PLAN_TOKENS=${PLAN_TOKENS:-32768} # micro_batch_tokens of the measured update (paper.yaml's 3B class)
PLAN_ARGS=${PLAN_ARGS:-}          # extra arguments of bench_plan_memory (e.g. --no-checkpointing)
DECODE_ARGS=${DECODE_ARGS:---layers 8 --seqs 512 --prompt 140 --new 317}  # bench_plan_decode
PACKING_ARGS=${PACKING_ARGS:-}    # extra arguments of bench_packing (e.g. smaller sizes on CPU)
ROLLOUT_ARGS=${ROLLOUT_ARGS:-}    # extra arguments of bench_rollout
WORK=${WORK:-/tmp/bfspo-gpu-session}

mkdir -p "$OUT"
rm -rf "$WORK"
export WANDB_MODE=disabled HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PYTHON=${PYTHON:-python3}         # the interpreter that has the packages
bfspo() { "$PYTHON" -m bfspo.cli "$@"; }
exec 3>>"$OUT/log.txt"

{
  date -u
  git rev-parse HEAD 2>/dev/null || echo "commit unknown"
  "$PYTHON" - <<'EOF'
import platform, torch, transformers, peft, tokenizers
print("python", platform.python_version(), "| torch", torch.__version__, "| transformers", transformers.__version__,
      "| peft", peft.__version__, "| tokenizers", tokenizers.__version__)
print("device:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (no CUDA)")
EOF
} | tee "$OUT/env.txt"

step() { echo "== $*" | tee -a /dev/fd/3; }  # -a: tee would truncate log.txt, reopened through /dev/fd
# A failed check is reported in plan.txt and the session goes on.
check() { "$PYTHON" -m "$@" 2>&3 || echo "($1 failed: see log.txt)"; }
step "plan against measurement at $PLAN_SHAPE's shapes"
# shellcheck disable=SC2086  # PLAN_ARGS and DECODE_ARGS are lists of arguments
check bench.bench_plan_memory --shape "$PLAN_SHAPE" --layers "$PLAN_LAYERS" --tokens "$PLAN_TOKENS" $PLAN_ARGS \
  | tee "$OUT/plan.txt"
# shellcheck disable=SC2086
check bench.bench_plan_decode --shape "$PLAN_SHAPE" $DECODE_ARGS | tee -a "$OUT/plan.txt"

step "toy data and model (size $SIZE)"
bfspo toy data --out-dir "$WORK/data" --n-train "$N_TRAIN" --n-eval "$N_EVAL" >&3 2>&1
bfspo toy build --train "$WORK/data/train.jsonl" --out-dir "$WORK/model" --size "$SIZE" >&3 2>&1

for method in dapo:0 bfspo:3; do
  name=${method%:*}
  step "train $name (bf16 on CUDA when visible)"
  bfspo train --output-dir "$WORK/runs/$name" --set model="$WORK/model" train_data="$WORK/data/rl_train.jsonl" \
    benchmark=toy budget=160 k="${method#*:}" steps="$STEPS" train_batch="$CHAINS" \
    mini_batch="$MINI" lr=1e-3 save_every=1000 >&3 2>&1
  for bench in toy:160 toy_ood:256; do
    b=${bench%:*}
    step "evaluate $name on $b"
    bfspo evaluate --model "$WORK/model" --adapter "$WORK/runs/$name/adapter" --benchmark "$b" \
      --data "$WORK/data/$b.jsonl" --budget "${bench#*:}" --out-dir "$WORK/eval/$name/$b" >&3 2>&1
  done
done

"$PYTHON" - "$WORK" > "$OUT/summary.md" <<'EOF'
import json, statistics, sys
from pathlib import Path
work = Path(sys.argv[1])
print("| run | benchmark | accuracy | avg length | finished |\n|---|---|---|---|---|")
for s in sorted(work.glob("eval/*/*/summary.json")):
    d = json.loads(s.read_text())
    print(f"| {s.parent.parent.name} | {d['benchmark']} | {d['accuracy']} | {d['avg_length']:.1f} | {d['finished_fraction']} |")
keys = ("timing/rollout_s", "timing/old_logprobs_s", "timing/update_s", "timing/rollout_tok_s", "timing/train_tok_s",
        "rollout/tokens_unique", "rollout/packing_gain", "timing/peak_mem_gb")
print("\n| run | steps | " + " | ".join(f"median {k}" for k in keys) + " |\n|---|---|" + "---|" * len(keys))
for m in sorted(work.glob("runs/*/metrics.jsonl")):
    rows = [json.loads(line) for line in m.read_text().splitlines()]
    print(f"| {m.parent.name} | {len(rows)} | " + " | ".join(f"{statistics.median(r[k] for r in rows):.3g}" for k in keys) + " |")
EOF
cat "$OUT/summary.md"
check bench.plan_vs_run "$WORK/runs/dapo" "$WORK/runs/bfspo" | tee -a "$OUT/plan.txt"

step "benchmarks at shape $BENCH_SHAPE"
# shellcheck disable=SC2086  # *_ARGS are lists of arguments
"$PYTHON" -m bench.bench_packing --shape "$BENCH_SHAPE" $PACKING_ARGS | tee "$OUT/packing.txt"
# shellcheck disable=SC2086
"$PYTHON" -m bench.bench_rollout --shape "$BENCH_SHAPE" $ROLLOUT_ARGS | tee "$OUT/rollout.txt"

# vLLM decode tokens/s at 64 and 512 concurrent sequences, per-request seeds at 512, and the time of
# sleep(level=1) / wake_up() with the GPU memory they free (bench/bench_vllm.py), into vllm.txt.
# Only where vLLM's CUDA build is importable and a GPU is visible; skipped otherwise (CPU, or a GPU
# machine without `pip install '.[vllm]'`). About 3 minutes at the 0.5b shape on an H100 (estimate).
VLLM_ARGS=${VLLM_ARGS:-}          # extra arguments of bench_vllm (e.g. --concurrency 64 512 1024)
if "$PYTHON" -c "import torch; assert torch.cuda.is_available(); import vllm" >/dev/null 2>&1; then
  step "vLLM at shape $BENCH_SHAPE: concurrency, seeds, sleep/wake"
  # shellcheck disable=SC2086
  "$PYTHON" -m bench.bench_vllm --shape "$BENCH_SHAPE" $VLLM_ARGS 2>&3 | tee "$OUT/vllm.txt"
else
  step "vLLM step skipped: no CUDA GPU with vllm installed"
fi
step "done"
