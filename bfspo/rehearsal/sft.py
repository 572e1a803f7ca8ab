"""`bfspo stand-in-sft`: the second step of a stand-in, a short supervised fine-tuning of the
random-init model (`bfspo stand-in`) on the training questions it then sees in RL.

    bfspo stand-in-sft --model INIT_DIR --data BENCHMARK=FILE [BENCHMARK=FILE ...] --questions N --out-dir MODEL_DIR

A random-init model never answers right, so every group of its rollouts is uniform and filtered
out, and a run makes no optimizer step. The first N questions of every FILE (the questions a run
with `train.limit: N` trains on), each rendered with its BENCHMARK's prompt, get a one-line target
in the benchmark's answer format, `The answer is \\boxed{ANSWER}.`, and the model is fully
fine-tuned on them for a few steps with the toy's machinery (bfspo/toy/sft.py). Stopped well
before it has learnt every answer, it writes the format and a right answer only some of the time at
T = 1, so its groups mix right and wrong answers. Its scores still mean nothing.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, replace
from pathlib import Path

from bfspo import tracking
from bfspo.errors import BfspoError
from bfspo.io import atomic_dir, read_jsonl, write_json
from bfspo.rehearsal.stand_in import parse_data
from bfspo.toy.sft import SFTConfig, encode, fit_summary, train

TARGET = "The answer is \\boxed{{{answer}}}."
# 60 steps of 8 over 2 x 8 questions: the format is learnt, the answers in part (about 70% right at
# T = 1, and 9 of 16 groups of 4 mixed, measured on the rehearsal's 3b stand-in).
CONFIG = SFTConfig(steps=60, batch_size=8, lr=3e-3, warmup=5, threads=0, device="cpu")


def sft_rows(data: dict[str, Path], questions: int) -> list[dict]:
    """The first `questions` rows of every file, with their benchmark and a one-line boxed target."""
    rows = []
    for benchmark, path in data.items():
        first = [r for _, r in zip(range(questions), (row for _, row in read_jsonl(path)))]
        if not first:
            raise BfspoError(f"no questions in {path}")
        rows += [dict(r, benchmark=benchmark, solution=TARGET.format(answer=r["answer"])) for r in first]
    return rows


def build(model_dir: Path, data: dict[str, Path], questions: int, out_dir: Path, cfg: SFTConfig = CONFIG,
          run=None) -> dict:
    """Fine-tune the model of `model_dir` on `sft_rows` (logged to the W&B `run`, if any) and save it,
    with sft.json, to `out_dir`."""
    import torch

    from bfspo.model_io import load_model

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    rows = sft_rows(data, questions)
    model, tokenizer = load_model(str(model_dir), device="cpu", dtype=torch.float32)
    examples = [encode(tokenizer, r, r["benchmark"]) for r in rows]
    losses = train(model, examples, tokenizer.pad_token_id, cfg, name="stand-in sft", run=run)
    summary = fit_summary(model, cfg, rows, losses, t0) | {
        "stand_in": True, "base": str(model_dir), "questions": {b: questions for b in data}, "target": TARGET}
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_json(tmp / "sft.json", summary)
    return summary


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, required=True, help="the random-init stand-in (`bfspo stand-in`)")
    parser.add_argument("--data", nargs="+", required=True, metavar="BENCHMARK=FILE",
                        help="prepared training sets, each with the benchmark whose prompt renders its questions")
    parser.add_argument("--questions", type=int, required=True, help="fine-tune on the first N questions of each")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=CONFIG.steps)
    parser.add_argument("--seed", type=int, default=CONFIG.seed)
    tracking.add_arguments(parser, "fine-tuning (losses and learning rate per step, sft/)")


def run(args) -> int:
    if args.questions < 1 or args.steps < 1:
        raise BfspoError("--questions and --steps must be positive")
    if not (args.model / "config.json").is_file():
        raise BfspoError(f"{args.model} is not a model directory (no config.json)")
    cfg = replace(CONFIG, steps=args.steps, seed=args.seed)
    run = tracking.start_from_arguments(args, asdict(cfg) | {"base": str(args.model), "questions": args.questions},
                                        "sft")
    info = build(args.model, parse_data(args.data), args.questions, args.out_dir, cfg, run=run)
    tracking.finish(run, {k: info[k] for k in ("parameters", "loss_first", "loss_last", "wall_s")})
    print(f"stand-in sft -> {args.out_dir}: {info['train_rows']} rows, {cfg.steps} steps, "
          f"loss {info['loss_first']:.3f} -> {info['loss_last']:.3f} in {info['wall_s']:.0f} s")
    return 0
