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


def test_sft_targets_are_the_first_questions_answered_in_the_format_the_verifier_reads(tmp_path):
    from bfspo.rehearsal.sft import sft_rows
    from bfspo.tasks.verify import is_correct

    write_jsonl(tmp_path / "math.jsonl", [{"id": str(i), "question": f"q{i}", "answer": a}
                                          for i, a in enumerate(["\\frac{1}{2}", "x^2+1", "7", "9"])])
    rows = sft_rows({"math_train": tmp_path / "math.jsonl"}, 3)
    assert [r["id"] for r in rows] == ["0", "1", "2"] and {r["benchmark"] for r in rows} == {"math_train"}
    assert all(is_correct("math_train", r["solution"], r["answer"]) for r in rows)
    assert not is_correct("math_train", rows[0]["solution"], "\\frac{1}{3}")


def test_sft_fine_tunes_the_random_init_stand_in_into_a_new_model_dir(tmp_path):
    from dataclasses import replace

    from transformers import AutoModelForCausalLM

    from bfspo.rehearsal import sft

    rows = [{"id": str(i), "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]
    write_jsonl(tmp_path / "gsm8k_train.jsonl", rows)
    data = parse_data([f"gsm8k_train={tmp_path / 'gsm8k_train.jsonl'}"])
    build(data, 32, tmp_path / "init")
    info = sft.build(tmp_path / "init", data, 4, tmp_path / "model", replace(sft.CONFIG, steps=20, threads=1))
    assert info["train_rows"] == 4 and info["loss_last"] < info["loss_first"] / 2
    assert read_json(tmp_path / "model/sft.json")["target"] == sft.TARGET
    AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert (tmp_path / "init/stand_in.json").is_file()  # the random-init step stays as it was
