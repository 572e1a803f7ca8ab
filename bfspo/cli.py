"""The `bfspo` command line.

Each subcommand lives in its own module, which defines `configure_parser(parser)` and
`run(args) -> int`, and may define `check_argv(argv) -> str | None`: a mistake in the arguments
that argparse would not explain (e.g. `bfspo train --steps 5`), reported before argparse's checks.
Modules are imported only when their subcommand runs, so `bfspo prepare` never pays for importing
torch; `train` and `evaluate` check their arguments before they import it (their `cli` modules).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from bfspo.errors import BfspoError

# subcommand -> (module, one-line help)
COMMANDS = {
    "prepare": ("bfspo.tasks.prepare", "normalise the raw benchmark files into one JSONL per split"),
    "evaluate": ("bfspo.evaluation.cli", "evaluate a model (optionally with a LoRA adapter) on one benchmark"),
    "train": ("bfspo.training.cli", "train one model with DAPO, BFS-PO or an ablation variant"),
    "model": ("bfspo.model_convert", "convert a model: `from-gguf FILE OUT` writes a Hugging Face model folder"),
    "toy": ("bfspo.toy.cli", "build the embedded toy task and its tiny reasoning model"),
    "plan": ("bfspo.pipeline.cli", "the GPU memory and time plan of every job of a workflow config"),
    "rehearsal-config": ("bfspo.rehearsal.config", "derive the rehearsal config (tiny stand-in models) from the paper config"),
    "stand-in": ("bfspo.rehearsal.stand_in", "build a tiny random-init model that stands in for a hub model"),
    "stand-in-sft": ("bfspo.rehearsal.sft", "fine-tune a stand-in on the training questions it then sees in RL"),
    "rehearsal-check": ("bfspo.rehearsal.check", "check that a rehearsal filled every table and trained every run"),
    "tables": ("bfspo.reporting.tables", "build the paper's tables from evaluation summaries"),
    "figures": ("bfspo.reporting.figures", "draw the Pareto, training-curve and backtracking figures"),
    "tree": ("bfspo.reporting.tree_show", "render logged search trees as text"),
    "report": ("bfspo.reporting.report", "log tables and figures to a W&B report run"),
    "sync": ("bfspo.reporting.sync", "upload every offline W&B run of a results folder (training, evaluation, report)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not sys.stderr.isatty():  # a log file: no library's tqdm stream either (tqdm reads this on import)
        os.environ.setdefault("TQDM_DISABLE", "1")
    # Import only the module of the chosen subcommand (and none when asking for top-level help).
    if argv and argv[0] in COMMANDS:
        module, help_text = COMMANDS[argv[0]]
        parser = argparse.ArgumentParser(prog=f"bfspo {argv[0]}", description=help_text)
        mod = importlib.import_module(module)
        mod.configure_parser(parser)
        problem = mod.check_argv(argv[1:]) if hasattr(mod, "check_argv") else None
        if problem:
            parser.error(problem)
        args = parser.parse_args(argv[1:])
        runner = mod.run
    else:
        parser = argparse.ArgumentParser(prog="bfspo", description=__doc__.splitlines()[0])
        parser.add_argument("command", choices=sorted(COMMANDS), help="; ".join(f"{k}: {v[1]}" for k, v in COMMANDS.items()))
        parser.parse_args(argv)
        return 2
    try:
        return int(runner(args) or 0)
    except BfspoError as e:
        print(f"bfspo {argv[0]}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `bfspo tree show FILE | head`
        sys.stderr.close()
        return 0
    except OSError as e:  # the system refused a file operation (full disk, permissions) outside bfspo.io's writes
        where = f"{e.filename}: " if e.filename else ""
        print(f"bfspo {argv[0]}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"bfspo {argv[0]}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
