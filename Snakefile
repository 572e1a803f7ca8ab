"""BFS-PO: the paper's tables as a DAG.

    snakemake --cores 2                                     # the embedded toy (config/config.yaml)
    snakemake --profile slurm --configfile config/paper.yaml  # the full reproduction on Slurm

The config declares the experiment matrix; bfspo/pipeline/ derives the runs and every job's settings
from it, and workflow/rules/common.smk hands them to the rules.
See docs/workflow.md and config/README.md.
"""

# The toy is the default. A --configfile on the command line replaces it instead of being merged
# into it (Snakemake merges by default, which would mix the toy's models into the paper's).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


# Every config file through bfspo's YAML reader (bfspo/io.py) before any code walks the config.
# Snakemake loads an alias as a shared reference, so a kilobyte of aliases of aliases loads at once
# and expands without bound only when the schema validation (or its error message) walks it.
import sys

from bfspo.errors import BfspoError
from bfspo.io import check_expansion, read_yaml

try:
    for _path in workflow.configfiles:
        read_yaml(_path)
    check_expansion(config, "the config (--configfile and --config merged)")
except BfspoError as e:
    sys.exit(f"invalid config: {e}")


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/toy.smk"
include: "workflow/rules/rehearsal.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/tables.smk"


rule all:
    input:
        final_outputs(),


# Where the tables and figures are, and how to upload the W&B runs (bfspo/pipeline/matrix.py).
onsuccess:
    print(MATRIX.closing_message())
