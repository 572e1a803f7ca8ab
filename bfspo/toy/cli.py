"""`bfspo toy`: build the embedded toy task and its tiny reasoning model (two Snakemake rules).

    bfspo toy data  --out-dir DIR [--seed S] [--n-train N] [--n-rl N] [--n-eval N] [--max-value V] [--max-operand N]
                    [--min-steps N] [--max-steps N] [--exclude ROWS.jsonl]
        writes DIR/train.jsonl (SFT rows: question, answer, forms, solution), DIR/rl_train.jsonl
        (RL questions), DIR/toy.jsonl and DIR/toy_ood.jsonl (evaluation splits); all questions
        are distinct across the four files.
    bfspo toy build --train DIR/train.jsonl --out-dir MODEL_DIR [--size default|test|gpu] [overrides] [--native-numerics]
        trains the tokenizer, builds the Qwen2 model and fine-tunes it under the pinned CPU numerics
        (bfspo/toy/numerics.py); MODEL_DIR is a Hugging Face model directory with sft.json (config,
        losses, wall time, CPU numerics), renamed into place last.
    bfspo toy export --model-dir MODEL_DIR --out-dir SHIPPED_DIR --size SIZE --command CMD
        makes a shipped start model folder (bfspo/toy/shipped.py) from a built MODEL_DIR: its files
        and PROVENANCE.sha256 (the command that built it, its CPU, date, commit and hashes).
    bfspo toy install --shipped SHIPPED_DIR --out-dir MODEL_DIR --size SIZE
        checks a shipped folder (safetensors, JSON and Jinja files only, each with PROVENANCE's
        SHA-256; a model of SIZE) and copies it to MODEL_DIR, renamed into place last: the toy's
        start model without an SFT.
    bfspo toy forms EVAL_DIR [EVAL_DIR ...]
        how verbose the answers of a `bfspo evaluate` output directory are (bfspo/toy/report.py).
    bfspo toy hash --model-dir MODEL_DIR --data-dir DIR --out FILE [--record RECORDED_FILE]
        writes the SHA-256 of the data and model files (and what built them) to FILE and prints
        whether they equal a recorded set (bfspo/toy/record.py); a mismatch is printed, not an error.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bfspo.errors import BfspoError
from bfspo.io import read_jsonl, write_jsonl

SPLIT_FILES = ("toy", "toy_ood", "rl_train", "train")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="toy_command", required=True)
    data = sub.add_parser("data", help="generate the toy problems and their solutions of mixed verbosity")
    data.add_argument("--out-dir", required=True, type=Path)
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--n-train", type=int, default=20000, help="SFT rows (one solution each)")
    data.add_argument("--n-rl", type=int, default=2000, help="RL training questions")
    data.add_argument("--n-eval", type=int, default=200, help="questions in each of toy and toy_ood")
    from bfspo.toy.task import DEFAULT

    data.add_argument("--max-value", type=int, default=DEFAULT.max_value,
                      help="largest value a problem reaches (the difficulty; bfspo/toy/task.py Difficulty)")
    data.add_argument("--max-operand", type=int, default=DEFAULT.max_operand,
                      help="largest number added or subtracted in one step")
    data.add_argument("--min-steps", type=int, default=DEFAULT.min_steps, help="fewest steps of an in-domain problem")
    data.add_argument("--max-steps", type=int, default=DEFAULT.max_steps,
                      help="most steps of an in-domain problem (out of domain: the next two counts)")
    data.add_argument("--exclude", type=Path, help="a JSONL file whose questions are never drawn (e.g. the SFT "
                      "rows of the model that will train on these questions)")

    build = sub.add_parser("build", help="train the tokenizer and the tiny model on train.jsonl")
    build.add_argument("--train", required=True, type=Path, help="train.jsonl from `bfspo toy data`")
    build.add_argument("--out-dir", required=True, type=Path)
    build.add_argument("--size", default="default", help="default | test | gpu (bfspo/toy/sft.py SIZES)")
    from bfspo.toy.sft import SFTConfig

    for name, field in SFTConfig.__dataclass_fields__.items():
        build.add_argument(f"--{name.replace('_', '-')}", type=type(field.default), default=None,
                           help=f"override the size's {name}")
    build.add_argument("--native-numerics", action="store_true",
                       help="leave the CPU numerics to the environment (this CPU's own kernels, unless it sets "
                            "ATEN_CPU_CAPABILITY, MKL_CBWR or ONEDNN_MAX_CPU_ISA) instead of pinning those of "
                            "bfspo/toy/numerics.py: faster (2.5x for the default SFT on an AVX-512 Xeon), but the "
                            "bytes then depend on the CPU")
    from bfspo import tracking

    tracking.add_arguments(build, "fine-tuning (losses and learning rate per step, sft/)")

    hashes = sub.add_parser("hash", help="SHA-256 of the toy data and model, compared with a recorded set")
    hashes.add_argument("--model-dir", required=True, type=Path)
    hashes.add_argument("--data-dir", required=True, type=Path)
    hashes.add_argument("--out", required=True, type=Path, help="the hash file to write (sha256sum format)")
    hashes.add_argument("--record", type=Path, help="a recorded hash file to compare with (results/recorded/)")

    export = sub.add_parser("export", help="make a shipped start model folder from a built toy model")
    export.add_argument("--model-dir", required=True, type=Path)
    export.add_argument("--out-dir", required=True, type=Path)
    export.add_argument("--size", required=True, help="the size it was built at (bfspo/toy/sft.py SIZES)")
    export.add_argument("--command", required=True, help="the command that built it (recorded in PROVENANCE.sha256)")

    install = sub.add_parser("install", help="check a shipped start model folder and copy it to the model directory")
    install.add_argument("--shipped", required=True, type=Path)
    install.add_argument("--out-dir", required=True, type=Path)
    install.add_argument("--size", required=True, help="the size the config asks for (toy.size)")

    forms = sub.add_parser("forms", help="how verbose a toy model's answers are (from `bfspo evaluate` output)")
    forms.add_argument("eval_dirs", nargs="+", type=Path, help="output directories of `bfspo evaluate`")


def _run_forms(args) -> int:
    from bfspo.toy.report import format_report, verbosity_report

    for n, eval_dir in enumerate(args.eval_dirs):
        path = eval_dir / "samples.jsonl"
        if not path.is_file():
            raise BfspoError(f"{eval_dir}: no samples.jsonl (an output directory of `bfspo evaluate`)")
        rows = []
        for lineno, row in read_jsonl(path):
            if not isinstance(row.get("response"), str) or "correct" not in row or "num_tokens" not in row:
                raise BfspoError(f"{path}:{lineno}: a sample needs response, correct and num_tokens")
            rows.append(row)
        if not rows:
            raise BfspoError(f"{path}: no samples")
        print(("\n" if n else "") + format_report(str(eval_dir), verbosity_report(rows)))
    return 0


def _run_data(args) -> int:
    from bfspo.toy.task import Difficulty, make_splits

    for name in ("n_train", "n_rl", "n_eval"):
        if getattr(args, name) < 1:
            raise BfspoError(f"--{name.replace('_', '-')} must be at least 1")
    try:
        difficulty = Difficulty(args.max_value, args.max_operand, args.min_steps, args.max_steps)
    except ValueError as e:
        raise BfspoError(f"--max-value/--max-operand/--min-steps/--max-steps: {e}") from None
    exclude = frozenset()
    if args.exclude:
        if not args.exclude.is_file():
            raise BfspoError(f"--exclude {args.exclude}: no such file")
        exclude = frozenset(row.get("question") for _, row in read_jsonl(args.exclude))
    splits = make_splits(args.seed, args.n_train, args.n_rl, args.n_eval, difficulty, exclude)
    for name in SPLIT_FILES:
        n = write_jsonl(args.out_dir / f"{name}.jsonl", splits[name])
        print(f"bfspo toy data: wrote {n} rows to {args.out_dir / f'{name}.jsonl'}")
    return 0


def _run_build(args) -> int:
    from dataclasses import asdict

    from bfspo import console, tracking
    from bfspo.toy import numerics

    pinned = not args.native_numerics and numerics.pin()
    console.line(f"bfspo toy build: CPU numerics {numerics.describe()} ({'pinned' if pinned else 'not pinned'})")
    from bfspo.toy.sft import SFTConfig, build, config_for

    rows = []
    for lineno, row in read_jsonl(args.train):
        for key in ("question", "solution"):
            if not isinstance(row.get(key), str):
                raise BfspoError(f"{args.train}:{lineno}: field {key!r} missing or not a string")
        rows.append(row)
    overrides = {name: getattr(args, name) for name in SFTConfig.__dataclass_fields__}
    cfg = config_for(args.size, **overrides)
    run = tracking.start_from_arguments(args, asdict(cfg) | {"size": args.size, "train_rows": len(rows)}, "sft")
    summary = build(rows, cfg, args.out_dir, run=run)
    tracking.finish(run, {k: summary[k] for k in ("parameters", "loss_first", "loss_last", "wall_s")})
    print(f"bfspo toy build: {summary['parameters']} parameters, loss {summary['loss_first']:.3f} -> "
          f"{summary['loss_last']:.3f} in {summary['wall_s']:.0f} s; saved {args.out_dir}")
    return 0


def _run_hash(args) -> int:
    from bfspo.toy.record import write_and_check

    print(write_and_check(args.model_dir, args.data_dir, args.out, args.record))
    return 0


def _run_export(args) -> int:
    from bfspo.toy.shipped import export

    print(export(args.model_dir, args.out_dir, args.size, args.command))
    return 0


def _run_install(args) -> int:
    from bfspo.toy.shipped import install

    print(install(args.shipped, args.out_dir, args.size))
    return 0


def run(args) -> int:
    return {"data": _run_data, "build": _run_build, "forms": _run_forms, "hash": _run_hash, "export": _run_export,
            "install": _run_install}[args.toy_command](args)
