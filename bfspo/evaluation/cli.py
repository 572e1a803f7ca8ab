"""`bfspo evaluate`'s command line: its options, and the checks of them that need no torch (the
benchmark, the decoding protocol, positive sizes: `protocol_of`), made before bfspo.evaluation.evaluate
imports torch, transformers and the engines, so that a mistyped option is reported in about a second."""

from __future__ import annotations

import argparse
from pathlib import Path

from bfspo.device import DEVICES
from bfspo.evaluation.protocol import protocol_of


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="hub id or local model directory (the base model)")
    parser.add_argument("--adapter", help="peft LoRA adapter directory trained on --model")
    parser.add_argument("--benchmark", required=True, help="benchmark name (e.g. gsm8k, math500, aime25)")
    parser.add_argument("--data", required=True, type=Path, help="prepared JSONL (rows id, question, answer)")
    parser.add_argument("--out-dir", required=True, type=Path, help="where samples.jsonl and summary.json go")
    parser.add_argument("--budget", type=int, help="max generated tokens (default: the benchmark's)")
    parser.add_argument("--samples", type=int, help="responses per question (default: the benchmark's)")
    parser.add_argument("--temperature", type=float, help="0 = greedy (default: the benchmark's); finite")
    parser.add_argument("--batch-size", type=int, default=64, help="sequences generated at once")
    parser.add_argument("--limit", type=int, help="evaluate only the first N questions")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's); 1 where jobs share cores")
    parser.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="cuda: stop at once without a usable CUDA device (the workflow's GPU size classes pass "
                             "it); auto: CUDA if usable, else the CPU (bfspo/device.py)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                        help="vLLM on a GPU: the fraction of its memory vLLM may take (an evaluation has the GPU "
                             "to itself)")
    parser.add_argument("--max-num-seqs", type=int, default=1024,
                        help="vLLM: most sequences decoded at once (a --batch-size call is scheduled by vLLM)")
    parser.add_argument("--per-request-seeds", type=parse_bool, metavar="{true,false}",
                        help="vLLM: seed every request (reproducible batches; slower on GPUs) or seed the engine "
                             "once with --seed (default: true on CPU, false on CUDA)")
    parser.add_argument("--meta", nargs="*", default=[], metavar="KEY=VALUE",
                        help="labels copied into summary.json (e.g. method=bfspo k=3)")
    parser.add_argument("--wandb-project", help="also log the summary to this W&B project (job_type eval)")
    parser.add_argument("--wandb-group", help="W&B group (one per table or sweep)")
    parser.add_argument("--wandb-mode", default="offline", choices=["offline", "online", "disabled"],
                        help="W&B mode (the WANDB_MODE environment variable wins)")
    parser.add_argument("--run-name", help="W&B run name (default: the --out-dir folder name)")
    parser.add_argument("--wandb-tags", nargs="*", default=[], metavar="TAG",
                        help="W&B tags added to those of --meta's tables (comma-separated), method, model_label and seed")
    parser.add_argument("--wandb-samples", type=int, default=20,
                        help="responses logged to W&B as a table of samples")


def parse_bool(text: str) -> bool:
    """`true` or `false` (any case), as YAML writes them; anything else is an argparse error."""
    value = {"true": True, "false": False}.get(text.strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    protocol_of(args)  # before torch, and before the lock creates the output folder
    from bfspo.evaluation import evaluate

    return evaluate.run(args)
