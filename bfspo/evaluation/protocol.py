"""The decoding protocol of one evaluation (token budget, samples per question, temperature), checked
alike by `bfspo evaluate` before it imports torch (`protocol_of`, bfspo/evaluation/cli.py) and by
the workflow's plan (bfspo.pipeline.preflight) before any job is submitted."""

from __future__ import annotations

import math

from bfspo.errors import BfspoError
from bfspo.tasks.benchmarks import get_benchmark


def check_protocol(budget, samples, temperature) -> None:
    """BfspoError unless the protocol can work: a positive budget and number of samples, a finite
    temperature >= 0 (0 is greedy decoding; NaN and inf sample nothing meaningful), and one sample
    per question when decoding greedily."""
    for name, value in (("budget", budget), ("samples", samples)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BfspoError(f"{name} must be a positive integer, got {value!r}")
    if (not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not math.isfinite(temperature)
            or temperature < 0):
        raise BfspoError(f"temperature must be a finite number >= 0 (0 is greedy decoding), got {temperature!r}")
    if samples > 1 and temperature == 0:
        raise BfspoError(f"{samples} samples per question at temperature 0 would all be the same greedy response")


def protocol_of(args) -> tuple[int, int, float]:
    """(budget, samples, temperature): the options, or the benchmark's protocol where not given;
    BfspoError for values that cannot work (`check_protocol`) or sizes below 1."""
    benchmark = get_benchmark(args.benchmark)
    budget = benchmark.eval_budget if args.budget is None else args.budget
    samples = benchmark.samples if args.samples is None else args.samples
    temperature = benchmark.temperature if args.temperature is None else args.temperature
    check_protocol(budget, samples, temperature)
    if args.batch_size < 1 or any(x is not None and x < 1 for x in (args.limit, args.threads)):
        raise BfspoError("--batch-size, --limit and --threads must be positive")
    return budget, samples, temperature
