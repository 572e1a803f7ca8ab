"""Validation during training (verl's `val-core/*`): greedy answers to held-out questions.

Every `val_every` steps, and at the last step, each rank answers its share of the first
`val_questions` questions of `val_data` greedily within the training budget, with the policy just
updated; the step's row gets their accuracy, mean length and the fraction cut off at the budget
(`val-core/`). Greedy decoding draws no random number, so a run with validation trains exactly as
one without (tests/test_validation.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def answer(engine, prompts: Sequence[Sequence[int]], budget: int,
           correct: Callable[[int, list[int]], bool]) -> dict:
    """Sums over one rank's share: greedy answers to `prompts`, each scored by `correct(index, token_ids)`."""
    out = {"n": 0, "correct": 0, "length": 0, "cut": 0}
    if not prompts:
        return out
    results = engine.generate(list(prompts), 1, budget, temperature=0.0)
    for i, (completion,) in enumerate(results):
        out["n"] += 1
        out["correct"] += bool(correct(i, completion.token_ids))
        out["length"] += len(completion.token_ids)
        out["cut"] += not completion.finished
    return out


def merge(parts: Sequence[dict]) -> dict:
    """The step row's validation statistics from every rank's sums."""
    n = sum(p["n"] for p in parts)
    total = {k: sum(p[k] for p in parts) for k in ("correct", "length", "cut")}
    nan = float("nan")
    return {"val_accuracy": total["correct"] / n if n else nan, "val_len_mean": total["length"] / n if n else nan,
            "val_cutoff_frac": total["cut"] / n if n else nan, "val_questions": n}
