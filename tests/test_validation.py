"""Validation during training: sums merged over ranks, and greedy answers that draw no random number
(so a run with `val_every` trains exactly as one without)."""

import random

import numpy as np
import pytest
import torch

from bfspo.training import validation


def test_ranks_merge_by_sums():
    parts = [{"n": 2, "correct": 1, "length": 10, "cut": 0}, {"n": 1, "correct": 1, "length": 5, "cut": 1},
             {"n": 0, "correct": 0, "length": 0, "cut": 0}]
    assert validation.merge(parts) == pytest.approx(
        {"val_accuracy": 2 / 3, "val_len_mean": 5.0, "val_cutoff_frac": 1 / 3, "val_questions": 3})
    assert np.isnan(validation.merge([parts[2]])["val_accuracy"])


def test_greedy_validation_leaves_every_random_state_alone(tiny_model_dir):
    from bfspo.model_io import load_model
    from bfspo.rollout import make_engine

    torch.set_num_threads(1)
    model, tokenizer = load_model(str(tiny_model_dir), device="cpu")
    engine = make_engine("transformers", model, tokenizer, batch_size=4)
    prompts = [tokenizer.encode(f"What is {i} plus {i}?") for i in range(3)]
    states = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    seen = []
    first = validation.answer(engine, prompts, 8, lambda i, ids: seen.append((i, ids)) or i == 1)
    assert torch.equal(states[0], torch.get_rng_state()) and np.array_equal(states[1], np.random.get_state()[1])
    assert states[2] == random.getstate()
    assert first["n"] == 3 and first["correct"] == 1 and 3 <= first["length"] <= 24 and [i for i, _ in seen] == [0, 1, 2]
    assert validation.answer(engine, prompts, 8, lambda i, ids: i == 1) == first  # greedy: the same answers
    assert validation.answer(engine, [], 8, lambda i, ids: True)["n"] == 0
