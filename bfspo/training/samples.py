"""The table of sample trees a training run logs to W&B with each checkpoint: for the first few
trees of the step, the question, its leaves, how many are correct, the best correct length, and
the whole tree as `bfspo tree show` renders it (from the token text the trainer logs with it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bfspo.algorithm.tree_text import render_tree

if TYPE_CHECKING:
    import pandas as pd

SAMPLE_TREES = 4
COLUMNS = ["step", "question_id", "leaves", "correct", "best_length", "backtracks", "tree"]


def sample_table(tree_dicts: list[dict], step: int, n: int = SAMPLE_TREES) -> pd.DataFrame:
    """One row per sample tree (SearchTree.to_dict with text), the first n of the step. (pandas is
    imported here: only W&B logging needs it, and a GPU machine may lack it: bench/gpu/gpu_check.py.)"""
    import pandas as pd

    rows = [[step, d["meta"].get("question_id"), len(d["leaves"]), sum(leaf["correct"] for leaf in d["leaves"]),
             d["best"]["length"] if d["best"] else None, len(d["backtracking"]),
             render_tree(d, title=f"step {step}, question {d['meta'].get('question_id')}")]
            for d in tree_dicts[:n]]
    return pd.DataFrame(rows, columns=COLUMNS)
