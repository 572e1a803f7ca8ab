"""Results of the DAG made with other code than the checkout's, named at plan time (`snakemake -n`).

Snakemake reruns a job when its rule's code or its inputs change, not when the package changes: a
finished training run or evaluation made with an older advantage function is "Nothing to be done".
The code is not part of a run's identity either (bfspo.code_identity), so nothing reruns it
silently (hundreds of GPU-hours on a cluster): the plan names each one, with the way to rerun it.
"""

from __future__ import annotations

from bfspo.code_identity import stale, stale_line

RERUN = ("They are not rerun: to rerun one, delete its folder ({results}/runs/<run>/ or "
         "{results}/eval/<run>/<benchmark>/) and run snakemake again (docs/workflow.md, \"Runs made with other code\").")


def warning(matrix) -> str | None:
    """The lines naming the matrix's finished training runs (done.json) and evaluations (summary.json)
    made with other code than the checkout's, and how to rerun them; None when there are none."""
    runs = stale({run: matrix.done(run) for run in matrix.runs}, "train")
    evaluations = stale({f"{run}/{bench}": matrix.summary(run, bench) for run, bench in matrix.evaluations()},
                        "evaluate")
    lines = [line for line in (stale_line(runs, "training run"), stale_line(evaluations, "evaluation")) if line]
    return "\n".join([*lines, RERUN.format(results=matrix.results)]) if lines else None

