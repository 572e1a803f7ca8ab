#!/usr/bin/env bash
# Run the CI config (config/test.yaml: the toy DAG at its smallest) end to end through
# `snakemake --profile slurm` on the one-node cluster of setup_cluster.sh, typed as a user types
# it in the repository root, in a scratch copy of the workflow so that its results stay apart.
#
#   tests/slurm/run_toy.sh [extra snakemake arguments, e.g. targets]
#
# Environment: CONFIG (default config/test.yaml), TIMEOUT (seconds, default 1800), WORK (the
# scratch directory), KEEP_CLUSTER=1 (leave the daemons running).
# The Slurm executor can wait forever when it loses track of a job and ignores SIGTERM, hence
# `timeout -k`.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CONFIG=${CONFIG:-config/test.yaml}
TIMEOUT=${TIMEOUT:-1800}
WORK=${WORK:-$(mktemp -d /tmp/bfspo-slurm-run.XXXXXX)}

"$ROOT/tests/slurm/setup_cluster.sh"
if [[ ${KEEP_CLUSTER:-0} != 1 ]]; then
    trap '"$ROOT/tests/slurm/setup_cluster.sh" --stop' EXIT
fi

mkdir -p "$WORK/data"
cp -r "$ROOT/Snakefile" "$ROOT/workflow" "$ROOT/config" "$ROOT/slurm" "$ROOT/environment.yml" "$WORK/"
cp "$ROOT/data/reported_results.csv" "$WORK/data/"
ln -sfn "$ROOT/data/raw" "$WORK/data/raw"
cd "$WORK"
export PATH="$ROOT/.venv/bin:$PATH" HF_HUB_OFFLINE=1 WANDB_MODE=${WANDB_MODE:-offline}

start=$(date +%s)
rc=0
timeout -k 60 "$TIMEOUT" snakemake "$@" --profile slurm --configfile "$CONFIG" || rc=$?
echo "run_toy: snakemake exit $rc after $(( $(date +%s) - start )) s in $WORK ($CONFIG)"
exit "$rc"
