"""`bfspo stand-in`: a tiny random-init model with room for the longest prompt plus the budget."""

from __future__ import annotations

import pytest

from bfspo.errors import BfspoError
from bfspo.io import read_json, write_jsonl
from bfspo.rehearsal.stand_in import build, parse_data


def test_max_positions_hold_the_longest_rendered_prompt_plus_the_budget(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    from bfspo.tasks.prompts import prompt_ids

    short = [{"id": str(i), "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(20)]
    long = [{"id": "x", "question": "A train leaves the station at noon. " * 40, "answer": "3"}]
    write_jsonl(tmp_path / "gsm8k.jsonl", short)
    write_jsonl(tmp_path / "aime25.jsonl", long)
    out = tmp_path / "model"
    info = build(parse_data([f"gsm8k={tmp_path / 'gsm8k.jsonl'}", f"aime25={tmp_path / 'aime25.jsonl'}"]), 64, out)

    tokenizer = AutoTokenizer.from_pretrained(out)
    longest = len(prompt_ids(tokenizer, "aime25", long[0]["question"]))
    assert info["longest_prompt"] == longest > max(len(prompt_ids(tokenizer, "gsm8k", r["question"])) for r in short)
    assert AutoConfig.from_pretrained(out).max_position_embeddings == longest + 64
    assert read_json(out / "stand_in.json") == info and tokenizer.chat_template
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".model")]  # the temporary folder is gone


def test_data_pairs_must_name_a_benchmark_and_a_file():
    with pytest.raises(BfspoError, match="BENCHMARK=FILE"):
        parse_data(["results/data/gsm8k.jsonl"])
