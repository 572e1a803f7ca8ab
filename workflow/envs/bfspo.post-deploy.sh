#!/usr/bin/env bash
# Install the bfspo package of this checkout into the rules' conda environment. Snakemake runs
# this from its working directory, the repository root.
set -euo pipefail
pip install --no-deps -e .
