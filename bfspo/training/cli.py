"""`bfspo train`'s command line: its options, and every check of them that needs no torch, made
before the trainer (torch, transformers, peft) is imported, so that a mistyped option or key is
reported in about a second, not after a minute of imports on a busy node.

- each `--set KEY=VALUE` is checked as it is parsed: its form, and its key against TrainConfig's
  fields (bfspo/training/config.py, the one list of them), with the closest field for a typo;
- a field given as an option (`--steps 5`) is named with the `--set` that sets it;
- then the config file and every value (`load_train_config`), and only then the trainer.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from bfspo.training.config import TrainConfig, config_help, load_train_config, unknown_key

OPTIONS = ("--config", "--set", "--output-dir", "-h", "--help")


def override(pair: str) -> str:
    """One `--set KEY=VALUE` (argparse's `type`): the pair itself, once its form and key are valid;
    its value is checked with the others (`load_train_config`)."""
    key, sep, _ = pair.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{pair!r} is not of the form KEY=VALUE")
    if key.strip() not in {f.name for f in fields(TrainConfig)}:
        raise argparse.ArgumentTypeError(unknown_key(key.strip()))
    return pair


def check_argv(argv: list[str]) -> str | None:
    """A TrainConfig field given as an option (`--steps 5`, `--group-size=4`): the `--set` that sets it."""
    names = {f.name for f in fields(TrainConfig)}
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        name = flag.removeprefix("--").replace("-", "_")
        if flag.startswith("--") and flag not in OPTIONS and name in names:
            if not eq:
                value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else "VALUE"
            return f"{flag}: TrainConfig fields go through --set: --set {name}={value}"
    return None


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = config_help()
    p.add_argument("--config", help="YAML file of TrainConfig fields (the keys below)")
    p.add_argument("--set", nargs="+", default=[], action="extend", metavar="KEY=VALUE", type=override,
                   help="override config fields, e.g. --set k=3 advantage=global")
    p.add_argument("--output-dir", required=True, help="run directory (resumed if it holds a checkpoint)")


def run(args: argparse.Namespace) -> int:
    cfg = load_train_config(args.config, args.set)
    from bfspo.training.trainer import train

    return train(cfg, Path(args.output_dir))
