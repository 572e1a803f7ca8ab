"""BFS-PO with TRL: train a LoRA adapter on the toy task with `BFSPOTrainer` (docs/trl.md).

First the toy data and model (about 3 min on CPU; `--size test` builds a weaker one in under 2 minutes):

    bfspo toy data --out-dir results/toy/data --seed 0
    bfspo toy build --train results/toy/data/train.jsonl --out-dir results/toy/model --size default
    python examples/trl_bfspo.py --steps 3                                         # one process
    accelerate launch --multi_gpu --num_processes 2 examples/trl_bfspo.py --steps 3   # two processes (DDP; gloo on CPU)

Any causal LM and prepared question file work (`--model`, `--data`, `--benchmark`). `--budget` is
TRL's `max_completion_length`, which is also where Eq. 3's overlong penalty starts from: answers
past 0.6 x budget lose reward (at TRL's default of 256, past about 154 tokens), so set it to the
answer length you mean to allow. W&B logs offline into the output directory, in the project
`bfspo-trl`, unless WANDB_MODE and WANDB_PROJECT say otherwise (`bfspo sync` or `wandb sync`
uploads it).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer

from bfspo.integrations.trl import BFSPOConfig, BFSPOTrainer, question_rows, verifier_reward
from bfspo.training.config import LORA_TARGETS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="results/toy/model", help="a causal LM folder or hub id (the toy model)")
    p.add_argument("--data", default="results/toy/data/rl_train.jsonl", help="prepared questions (id, question, answer)")
    p.add_argument("--benchmark", default="toy", help="prompt and verifier of the questions")
    p.add_argument("--output-dir", default="results/trl/bfspo-toy")
    p.add_argument("--k", type=int, default=3, help="expansions K of Algorithm 1 (0: DAPO)")
    p.add_argument("--group", type=int, default=8, help="G: answers per question and per expansion")
    p.add_argument("--questions", type=int, default=2, help="questions per optimizer step on each process")
    p.add_argument("--budget", type=int, default=160, help="L_budget (max_completion_length): most generated tokens "
                   "per path; Eq. 3 penalises answers past 0.6 x budget")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report-to", default="wandb", help="TRL's report_to: wandb (offline by default) or none")
    args = p.parse_args()

    if args.model == p.get_default("model") and not os.path.isdir(args.model):
        sys.exit(f"examples/trl_bfspo.py: no toy model at {args.model}; build it first (docs/trl.md):\n"
                 "  bfspo toy data --out-dir results/toy/data --seed 0\n"
                 "  bfspo toy build --train results/toy/data/train.jsonl --out-dir results/toy/model --size default\n"
                 "or pass --model and --data")
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_PROJECT", "bfspo-trl")  # transformers' W&B callback's default is "huggingface"
    os.environ.setdefault("WANDB_DIR", args.output_dir)
    os.makedirs(args.output_dir, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    config = BFSPOConfig(
        output_dir=args.output_dir, k=args.k, num_generations=args.group, max_completion_length=args.budget,
        per_device_train_batch_size=args.questions * args.group,  # completions of the first groups: 2 questions
        max_steps=args.steps, learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
        logging_steps=1, save_strategy="no", report_to=args.report_to, run_name=os.path.basename(args.output_dir),
        seed=args.seed, use_cpu=not torch.cuda.is_available(), bf16=torch.cuda.is_available(),
        gradient_checkpointing=False, disable_tqdm=True)
    trainer = BFSPOTrainer(
        model=model, reward_funcs=verifier_reward(args.benchmark), args=config, processing_class=tokenizer,
        train_dataset=Dataset.from_list(question_rows(args.data, args.benchmark)),
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"))
    trainer.train()
    trainer.save_model(args.output_dir)  # the LoRA adapter
    trainer.save_state()  # trainer_state.json: every step's logged metrics (log_history)
    trainer.accelerator.end_training()  # trackers finished, the process group destroyed, as `bfspo train` ends


if __name__ == "__main__":
    main()
