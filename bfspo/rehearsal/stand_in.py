"""`bfspo stand-in`: a tiny random-init model, the first step of a stand-in for a hub model where
none can be downloaded (the rehearsal of the paper DAG; `bfspo stand-in-sft` is the second step).

    bfspo stand-in --data BENCHMARK=FILE [BENCHMARK=FILE ...] --budget N --out-dir MODEL_DIR [--seed S]

The tokenizer is a byte-level BPE trained with `tokenizers` on the prepared questions, the chat
template is Qwen2.5's, and the weights are a random-init Qwen2 (bfspo/toy/model.py). Its max
positions hold the longest prompt of every FILE, as rendered for its BENCHMARK, plus N generated
tokens, so nothing is ever truncated. The model answers at random: its scores mean nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bfspo.errors import BfspoError
from bfspo.io import atomic_dir, read_jsonl, write_json

VOCAB_SIZE = 512
HIDDEN_SIZE = 128  # 4 heads of 32: the smallest head dim that vLLM's CPU attention supports
LAYERS = 2


def parse_data(pairs: list[str]) -> dict[str, Path]:
    """`BENCHMARK=FILE` pairs -> {benchmark: file}."""
    data = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise BfspoError(f"--data {pair!r} is not of the form BENCHMARK=FILE")
        data[name] = Path(path)
    return data


def read_questions(data: dict[str, Path]) -> dict[str, list[str]]:
    questions = {name: [str(row["question"]) for _, row in read_jsonl(path)] for name, path in data.items()}
    empty = [str(data[name]) for name, qs in questions.items() if not qs]
    if empty:
        raise BfspoError(f"no questions in {', '.join(empty)}")
    return questions


def longest_prompt(tokenizer, questions: dict[str, list[str]]) -> int:
    """Tokens of the longest prompt, each question rendered with its benchmark's instruction."""
    from bfspo.tasks.prompts import render_prompt

    texts = [render_prompt(tokenizer, name, q) for name, qs in questions.items() for q in qs]
    return max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])


def build(data: dict[str, Path], budget: int, out_dir: Path, seed: int = 0) -> dict:
    from bfspo.toy.model import new_model, save_model_dir, train_tokenizer

    questions = read_questions(data)
    tokenizer = train_tokenizer((q for qs in questions.values() for q in qs), vocab_size=VOCAB_SIZE)
    longest = longest_prompt(tokenizer, questions)
    model = new_model(tokenizer, hidden_size=HIDDEN_SIZE, layers=LAYERS, max_positions=longest + budget, seed=seed)
    info = {"stand_in": True, "seed": seed, "longest_prompt": longest, "budget": budget,
            "max_positions": longest + budget, "questions": {k: len(v) for k, v in questions.items()}}
    with atomic_dir(out_dir) as tmp:
        save_model_dir(model, tokenizer, tmp)
        write_json(tmp / "stand_in.json", info)
    return info


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", nargs="+", required=True, metavar="BENCHMARK=FILE",
                        help="prepared JSONL files, each with the benchmark whose prompt renders its questions")
    parser.add_argument("--budget", type=int, required=True, help="the largest generation budget of any job")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)


def run(args) -> int:
    if args.budget < 1:
        raise BfspoError("--budget must be positive")
    if args.out_dir.exists():
        raise BfspoError(f"{args.out_dir} exists; remove it to rebuild the stand-in")
    info = build(parse_data(args.data), args.budget, args.out_dir, args.seed)
    print(f"stand-in model -> {args.out_dir}: max positions {info['max_positions']} "
          f"(longest prompt {info['longest_prompt']} + budget {info['budget']})")
    return 0
