"""TRL's reward-function interface for BFS-PO, and our questions as a TRL data set.

BFS-PO needs a verdict per chain, v(o, a*) of Eq. 4: the search selects the shortest correct path
(Eq. 5) and dynamic sampling counts correct chains (Eq. 2). TRL's reward functions supply it: a
chain is correct when the weighted sum of the trainer's `reward_funcs` is positive, so
`verifier_reward` (1.0 correct, 0.0 wrong, as TRL's own `accuracy_reward`), a user's function or
several of them all work. The leaf reward itself, +-1 plus the overlong term (Eq. 3-4), is then
computed from the verdict and the chain's length (bfspo.algorithm.rewards), whatever the function
returned. Nothing here imports TRL.
"""

from __future__ import annotations

from typing import Callable

from bfspo.tasks.benchmarks import get_benchmark
from bfspo.tasks.prompts import user_message
from bfspo.tasks.rows import read_rows


def completion_text(completion) -> str:
    """The text of one completion as TRL passes it: a string, or a conversation whose last turn is the answer."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


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
