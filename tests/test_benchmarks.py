"""The benchmark registry: the paper's evaluation protocol (App. C) per benchmark."""

import pytest

from bfspo.errors import BfspoError
from bfspo.tasks.benchmarks import BENCHMARKS, Benchmark, get_benchmark


@pytest.mark.parametrize(
    "name, kind, budget, samples, temperature",
    [
        ("gsm8k", "math", 512, 1, 0.0),
        ("math500", "math", 1024, 1, 0.0),
        ("mmlu_stem", "mmlu", 512, 1, 0.0),
        ("aime25", "aime", 1024, 32, 1.0),
        ("minerva_math", "math", 1024, 1, 0.0),
        ("gsm8k_train", "math", 512, 1, 0.0),
        ("math_train", "math", 1024, 1, 0.0),
        ("toy", "math", 160, 1, 0.0),
        ("toy_ood", "math", 256, 1, 0.0),
    ],
)
def test_protocol(name, kind, budget, samples, temperature):
    assert get_benchmark(name) == Benchmark(name, kind, budget, samples, temperature)


def test_registry_is_exactly_the_known_splits():
    assert set(BENCHMARKS) == {"gsm8k", "math500", "mmlu_stem", "aime25", "minerva_math",
                               "gsm8k_train", "math_train", "toy", "toy_ood"}
    assert all(name == b.name for name, b in BENCHMARKS.items())


def test_benchmark_is_frozen_and_passes_through():
    b = get_benchmark("gsm8k")
    assert get_benchmark(b) is b
    with pytest.raises(AttributeError):
        b.eval_budget = 1024


@pytest.mark.parametrize("bad", ["gsm9k", "", None])
def test_unknown_name_lists_the_known_ones(bad):
    with pytest.raises(BfspoError, match="unknown benchmark.*known: gsm8k, math500, mmlu_stem"):
        get_benchmark(bad)
