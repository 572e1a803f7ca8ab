"""TRL's reward-function interface for BFS-PO, and our questions as a TRL data set.

BFS-PO needs one verdict per chain, v(o, a*) of Eq. 4: the search selects the shortest correct path
(Alg. 1, Eq. 5), Eq. 3-4 reward it, and dynamic sampling counts correct chains (Eq. 2). One of the
trainer's `reward_funcs` gives it, the *verdict function* (`BFSPOConfig.verdict_reward`, by its
name; by default the only function, or the one `verifier_reward` made): a chain is correct when its
value is positive. Each other function adds its weighted value to the leaf reward of Eq. 4
(`extra_reward`), so a format reward shapes the reward without making a formatted wrong answer
correct (TRL's GRPOTrainer sums all functions instead: docs/trl.md). As in TRL, None means "not
applicable": it adds nothing; from the verdict function, None or NaN counts as wrong (no verdict,
no correct answer). Nothing here imports TRL.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from numbers import Real

from bfspo.tasks.benchmarks import get_benchmark
from bfspo.tasks.prompts import user_message
from bfspo.tasks.rows import read_rows


def completion_text(completion) -> str:
    """The text of one completion as TRL passes it: a string, or a conversation whose last turn is the answer."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


VERIFIER_PREFIX = "verifier_"  # verifier_reward's functions are named verifier_<benchmark>


def verdict_index(names: Sequence[str], chosen: str | None) -> int:
    """Which of the reward functions (TRL's names for them) gives the verdict: `chosen`
    (BFSPOConfig.verdict_reward), else the only function, else the only `verifier_reward` one.
    A ValueError naming the field where none can be told apart from, say, a format reward."""
    if chosen is not None:
        if list(names).count(chosen) != 1:
            raise ValueError(f"BFSPOConfig.verdict_reward={chosen!r} must name exactly one of the reward functions "
                             f"({', '.join(names)})")
        return list(names).index(chosen)
    if len(names) == 1:
        return 0
    verifiers = [i for i, n in enumerate(names) if n.startswith(VERIFIER_PREFIX)]
    if len(verifiers) == 1:
        return verifiers[0]
    raise ValueError(f"BFSPOConfig.verdict_reward: with several reward functions ({', '.join(names)}) name the one "
                     "whose value says whether a chain is correct (positive: correct); BFS-PO's search and Eq. 3-4 "
                     "need that verdict, and a sum with a format reward would count formatted wrong answers as "
                     "correct. The others add their weighted values to the leaf reward (docs/trl.md)")


def chain_value(name: str, output) -> float:
    """The value of reward function `name` on one chain, from what it returned for a batch of one
    completion: a list of one number, or None (not applicable: NaN here). Anything else is an error
    naming the function and what it must return."""
    if isinstance(output, (list, tuple)) and len(output) == 1:
        (value,) = output
        if value is None:
            return math.nan
        if isinstance(value, Real) and not isinstance(value, bool):
            return float(value)
    raise TypeError(f"reward function {name!r} returned {output!r:.120}: a reward function must return a list with "
                    "one float (or None: not applicable) per completion it is given")


def is_correct_value(value: float) -> bool:
    """v(o, a*) from the verdict function's value: positive is correct; NaN (None) is not."""
    return value > 0


def extra_reward(values: Sequence[float], weights: Sequence[float], verdict: int) -> float:
    """What the functions other than the verdict add to a leaf's Eq. 4 reward: their weighted sum,
    those that returned None (NaN) left out, as TRL's sum leaves them out."""
    return math.fsum(w * v for i, (v, w) in enumerate(zip(values, weights)) if i != verdict and not math.isnan(v))


def verifier_reward(benchmark: str, answer_column: str = "answer") -> Callable[..., list[float]]:
    """A TRL reward function (`reward_funcs=verifier_reward("gsm8k_train")`) that scores each
    completion with the project's verifier (bfspo.tasks.verify.is_correct, math-verify for math
    answers) against the data set's `answer_column`: 1.0 correct, 0.0 wrong."""
    from bfspo.tasks.verify import is_correct

    get_benchmark(benchmark)  # an unknown benchmark fails here, not at the first reward

    def reward(completions, **columns) -> list[float]:
        if answer_column not in columns:
            raise KeyError(f"verifier_reward: the data set has no {answer_column!r} column (its columns: "
                           f"{', '.join(sorted(k for k in columns if k != 'trainer_state'))})")
        return [float(is_correct(benchmark, completion_text(c), str(gold)))
                for c, gold in zip(completions, columns[answer_column])]

    reward.__name__ = f"verifier_{benchmark}"  # TRL names the reward's metrics after it
    return reward


def question_rows(path: str, benchmark: str, limit: int | None = None) -> list[dict]:
    """A prepared question file (`bfspo prepare`, `bfspo toy data`) as TRL's conversational rows:
    {"prompt": [the user turn of TokenSkip's protocol], "answer", "id"}. TRL's chat template then
    gives the same prompt tokens as `bfspo train` (bfspo.tasks.prompts.prompt_ids)."""
    return [{"prompt": [{"role": "user", "content": user_message(benchmark, row["question"])}],
             "answer": row["answer"], "id": row["id"]} for row in read_rows(path, limit)]
