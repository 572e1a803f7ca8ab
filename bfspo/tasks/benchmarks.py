"""The benchmarks and training sets, with the evaluation protocol the paper uses for each (App. C).

Budgets follow TokenSkip: 512 tokens for GSM8K and MMLU-STEM, 1024 for MATH-500, and 1024 for
AIME'25 and Minerva-Math. Decoding is greedy (one sample) except AIME'25, which the paper scores
by mean accuracy over 32 samples at temperature 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bfspo.errors import BfspoError

Kind = Literal["math", "mmlu", "aime"]


@dataclass(frozen=True)
class Benchmark:
    """One split and how it is prompted, scored and decoded.

    name: the split's key (also the prepared file's stem, `results/data/<name>.jsonl`).
    kind: "math" (free-form answer checked with math-verify), "mmlu" (a letter A-D) or
        "aime" (an integer).
    eval_budget: the maximum number of generated tokens at evaluation (L_budget).
    samples: completions per question at evaluation; accuracy is their mean.
    temperature: sampling temperature at evaluation (0 = greedy).
    """

    name: str
    kind: Kind
    eval_budget: int
    samples: int
    temperature: float


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("gsm8k", "math", 512, 1, 0.0),
        Benchmark("math500", "math", 1024, 1, 0.0),
        Benchmark("mmlu_stem", "mmlu", 512, 1, 0.0),
        Benchmark("aime25", "aime", 1024, 32, 1.0),
        Benchmark("minerva_math", "math", 1024, 1, 0.0),
        Benchmark("gsm8k_train", "math", 512, 1, 0.0),
        Benchmark("math_train", "math", 1024, 1, 0.0),
        Benchmark("toy", "math", 160, 1, 0.0),
        Benchmark("toy_ood", "math", 256, 1, 0.0),
    )
}


def get_benchmark(benchmark: str | Benchmark) -> Benchmark:
    """The registered benchmark called `benchmark` (a Benchmark passes through unchanged)."""
    if isinstance(benchmark, Benchmark):
        return benchmark
    try:
        return BENCHMARKS[benchmark]
    except (KeyError, TypeError):
        raise BfspoError(f"unknown benchmark {benchmark!r}; known: {', '.join(BENCHMARKS)}") from None
