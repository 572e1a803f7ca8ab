"""Peak memory of one micro-batch update, measured against the plan (bfspo/pipeline/memory.py).

A random-weight model with a shipped model's layer shapes (config/models/<hub id>/config.json) but
`--layers` layers, LoRA as the trainer puts it (bfspo/training/trainer.py: r 8 on the seven
projections, gradient checkpointing as asked), and paper-shaped trees (a `--prompt`-token prompt,
G = `--group` answers of about `--answer` tokens, K = `--k` expansions) filling one micro-batch of
at most `--tokens` row tokens (the last tree cut into pieces by the micro-batch planner so that the
first micro-batch is full; with `--one-row`, whole trees only, in one row padded to one bucket,
attention_bucket = `--tokens`: the update then runs one row length, one flex compile on CUDA). One
mini-batch update as the trainer runs it (bfspo.training.accumulate: per micro-batch a packed
forward, the loss and its backward; then AdamW's step) in the device's dtype (float32 on CPU,
bfloat16 on CUDA). The timed update follows a warm-up update of the same model on the same trees
(nothing compiles in it: `compiles_in_timed_update`). Printed: the measured peak of the timed update
(CUDA: max allocated; CPU: peak RSS, VmHWM, reset before the update), above what the process held
before the model was built (on CPU after a warm-up update of a tiny model of the same kind, so that
lazily loaded code and the math libraries' workspaces are not counted, and with glibc's mmap
threshold at 64 KiB, so that freed memory leaves the RSS: see MALLOC_ENV; on CUDA max allocated
needs no such warm-up, and the tiny model's head size would cost a flex compile of its own), the
plan's peak for the same model, dtype and row tokens, term by term, and their ratio; the update's
trained tokens/s against the plan's 6N (4N without checkpointing) at its MFU on CUDA.

    python -m bench.bench_plan_memory --layers 2 --tokens 8192          # CPU, Qwen2.5-3B's layers
    python -m bench.bench_plan_memory --layers 36 --tokens 32768 --one-row   # on a GPU, bfloat16

Each measurement runs in a fresh process. `--json` prints one JSON line per measurement as it is
made (the built model, the warm-up update, the timed update, its peak memory; each has a `stage`),
the last line holding every field, so that a process killed on the way has printed what it measured
(bench/gpu/gpu_check.py records them as they come).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import random
import sys
import time

import torch

from bfspo.pipeline import memory
from bfspo.pipeline.gpu_plan import CUDA_CONTEXT, HEAD_CHUNK_ROWS
from bfspo.pipeline.shapes import load_shape
from bfspo.pipeline.throughput import ASSUMPTIONS, forward_s

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def rss_bytes(field: str = "VmRSS") -> int:
    """This process's resident memory (VmRSS), or its peak since the last `reset_peak_rss` (VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def reset_peak_rss() -> None:
    """Linux: VmHWM starts again from the current RSS (proc(5), /proc/pid/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def paper_trees(args, vocab: int) -> list:
    """Trees shaped like a paper mini-batch's (random tokens), until they hold `--tokens` row tokens
    (the last one is cut into pieces by the micro-batch planner, so that the first micro-batch is full)."""
    from bfspo.algorithm.advantages import assign_advantages, assign_rewards
    from bfspo.algorithm.tree import SearchTree

    rng = random.Random(0)
    trees, tokens = [], 0
    while True:
        tree = SearchTree(prompt_ids=[rng.randrange(5, vocab) for _ in range(args.prompt)], budget=args.budget)

        def add(parent, length):
            ids = [rng.randrange(5, vocab) for _ in range(length)]
            s = tree.add_completion(parent, ids, [-rng.random() for _ in ids], [rng.random() for _ in ids], True,
                                    0 if parent is None else 1)
            tree.segments[s].leaf.correct = rng.random() < 0.5

        def length():
            return max(1, min(args.budget, int(rng.uniform(0.5, 1.5) * args.answer)))

        for _ in range(args.group):
            add(None, length())
        for _ in range(args.k):  # an expansion at the middle of a random path, G new continuations
            leaf = rng.choice(tree.leaves())
            s = tree.path(leaf)[-1]
            seg = tree.segments[s]
            if len(seg.token_ids) < 2:
                continue
            wb = tree.split(s, len(seg.token_ids) // 2)
            tree.segments[wb].ends_in_B = True
            room = args.budget - tree.segments[wb].end  # an expansion stays within the budget
            for _ in range(args.group if room > 0 else 0):
                add(wb, max(1, min(room, length() // 2)))
        assign_rewards(tree, overlong=False)
        assign_advantages(tree, "branch")
        trees.append(tree)
        tokens += len(tree.prompt_ids) + tree.n_tokens
        if tokens >= args.tokens:
            return trees


def one_row(trees: list, tokens: int) -> list:
    """`paper_trees`' trees less the last, cut one: whole trees within `tokens` row tokens."""
    kept, total = [], 0
    for tree in trees:
        total += len(tree.prompt_ids) + tree.n_tokens
        if total > tokens:
            break
        kept.append(tree)
    if not kept:
        raise SystemExit(f"one tree holds more than --tokens {tokens} row tokens: raise --tokens or lower --group")
    return kept


def measure(args):
    """The measurements, one dict each as it is made (`stage`: model, warm-up, update, peak memory),
    the last holding every field."""
    from peft import LoraConfig, get_peft_model
    from torch._dynamo.utils import counters
    from transformers import AutoConfig, AutoModelForCausalLM

    from bfspo.algorithm.attention_options import BUCKET_TOKENS, bucket_lengths, padded_length
    from bfspo.algorithm.packing import pack_trees, plan_micro_batches
    from bfspo.pipeline.memory import matmul_params
    from bfspo.pipeline.shapes import config_path
    from bfspo.training.accumulate import minibatch_backward

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    config = AutoConfig.from_pretrained(config_path(args.shape).parent)
    config.num_hidden_layers = args.layers
    bucket = args.tokens if getattr(args, "one_row", False) else BUCKET_TOKENS

    def trainer_model(cfg):
        """The model as the trainer builds it: gradient checkpointing as asked, LoRA, AdamW."""
        torch.manual_seed(0)
        with torch.device(device):  # initialised where it runs: 36 layers of 3B take a minute on CPU
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
        if args.checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS,
                                                 task_type="CAUSAL_LM"))
        model.train()
        return model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)

    def update(model, optimizer, trees):
        minibatch_backward(model, trees, micro_batch_tokens=args.tokens, normalizer=1000.0, eps_low=0.2,
                           eps_high=0.28, bucket=bucket)
        optimizer.step()  # AdamW's moments exist from here on, as in every later update
        if cuda:
            torch.cuda.synchronize()

    if not cuda:
        # A warm-up update of a tiny model of the same kind, so that the code loaded lazily and the math
        # libraries' workspaces are in the RSS baseline, not in the measurement.
        tiny = copy.deepcopy(config)
        for key, value in dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=16, vocab_size=256, num_hidden_layers=1).items():
            setattr(tiny, key, value)
        update(*trainer_model(tiny), paper_trees(argparse.Namespace(**{**vars(args), "tokens": 256}), 256))
        gc.collect()
    baseline = torch.cuda.memory_allocated() if cuda else rss_bytes()

    t0 = time.perf_counter()
    model, optimizer = trainer_model(config)
    trees = paper_trees(args, config.vocab_size)
    if getattr(args, "one_row", False):
        trees = one_row(trees, args.tokens)
    row_tokens = max(pack_trees(trees, pieces=pieces).input_ids.shape[1]
                     for pieces in plan_micro_batches(trees, args.tokens))  # the largest micro-batch
    out = {"device": torch.cuda.get_device_name() if cuda else "CPU", "dtype": str(dtype).split(".")[1],
           "shape": args.shape, "layers": args.layers, "trees": len(trees), "row_tokens": row_tokens,
           "bucket": bucket, "checkpointing": args.checkpointing, "build_s": time.perf_counter() - t0}
    yield out | {"stage": "model"}
    # A warm-up update at the measured shapes (the same model and trees), so that the timed one
    # compiles nothing (flex attention compiles per row length on CUDA) and runs on warm kernels.
    compiles = counters["stats"]["unique_graphs"]
    t0 = time.perf_counter()
    update(model, optimizer, trees)
    out |= {"warmup_s": time.perf_counter() - t0, "compiles_in_warmup": counters["stats"]["unique_graphs"] - compiles}
    yield out | {"stage": "warm-up"}
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    else:
        reset_peak_rss()
    before = (torch.cuda.memory_allocated() if cuda else rss_bytes()) - baseline
    compiles = counters["stats"]["unique_graphs"]
    t0 = time.perf_counter()
    update(model, optimizer, trees)
    seconds = time.perf_counter() - t0
    measured = (torch.cuda.max_memory_allocated() if cuda else rss_bytes("VmHWM")) - baseline

    shape = load_shape(args.shape)
    s = type(shape)(**{**shape.__dict__, "layers": args.layers})
    # flex pads the row to its bucket on CUDA: the hardware runs (and holds) the padded row; the plan's
    # rate counts the trained tokens only
    padded = padded_length(row_tokens, bucket_lengths(args.tokens, bucket)) if cuda else row_tokens
    plan_s = forward_s(s, row_tokens, 6 if args.checkpointing else 4, ASSUMPTIONS)
    out |= {"padded_tokens": padded, "seconds": seconds, "tokens_per_s": row_tokens / seconds,
            "plan_tokens_per_s": row_tokens / plan_s,
            "tflops": (6 if args.checkpointing else 4) * matmul_params(s) * padded / seconds / 1e12,
            "plan_tflops": ASSUMPTIONS.train_mfu * ASSUMPTIONS.hardware.flops / 1e12,
            "compiles_in_timed_update": counters["stats"]["unique_graphs"] - compiles}
    yield out | {"stage": "update"}
    b = 2 if cuda else 4
    terms = {
        "weights": memory.weights(s, b),
        "LoRA+AdamW": memory.lora_state(memory.lora_params(s, 8, LORA_TARGETS)),
        f"activations@{padded}": memory.activations(s, padded, b, 8, LORA_TARGETS, args.checkpointing),
        "logits": memory.update_logits(s, padded, b, 8, LORA_TARGETS, args.checkpointing, HEAD_CHUNK_ROWS),
    }
    out |= {"measured_bytes": measured, "baseline_rss_bytes": baseline, "before_update_bytes": before,
            "plan_terms": terms, "plan_bytes": sum(terms.values()), "cuda_context_not_counted": CUDA_CONTEXT if cuda else 0}
    yield out | {"stage": "peak memory"}


# glibc keeps freed heap memory for reuse, so a process's peak RSS overstates its peak of live memory
# (which is what the plan models and what CUDA's max_memory_allocated reports). With this threshold
# every block of 64 KiB or more is mmap-ed and returned to the system when freed.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def main() -> None:
    if not torch.cuda.is_available() and any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        os.execve(sys.executable, [sys.executable, "-m", "bench.bench_plan_memory", *sys.argv[1:]],
                  {**os.environ, **MALLOC_ENV})  # glibc reads it at start-up
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="Qwen/Qwen2.5-3B-Instruct", help="hub id under config/models, or a model dir")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--tokens", type=int, default=8192,
                   help="micro_batch_tokens (more than the prompt plus the budget, as the trainer needs)")
    p.add_argument("--prompt", type=int, default=140)
    p.add_argument("--answer", type=int, default=317, help="mean answer tokens (GSM8K: 0.62 x 512)")
    p.add_argument("--budget", type=int, default=512)
    p.add_argument("--group", type=int, default=16)
    p.add_argument("--k", type=int, default=0)
    p.add_argument("--no-checkpointing", dest="checkpointing", action="store_false")
    p.add_argument("--one-row", action="store_true",
                   help="whole trees in one row of one bucket (attention_bucket = --tokens): one row length")
    p.add_argument("--json", action="store_true", help="print a JSON line per measurement, the last with every field")
    args = p.parse_args()
    for r in measure(args):
        if args.json:
            print(json.dumps(r), flush=True)
    if args.json:
        return
    gib = 2**30
    print(f"\n### One micro-batch update against the plan [{r['device']}, {r['dtype']}, torch {torch.__version__}]\n")
    print(f"{r['shape']} shapes with {r['layers']} layers, LoRA r 8 on 7 projections, gradient checkpointing "
          f"{'on' if r['checkpointing'] else 'off'}; {r['trees']} trees (prompt {args.prompt}, G {args.group}, "
          f"answers ~{args.answer}, K {args.k}) in one row of {r['row_tokens']} tokens\n")
    print("| | GiB |\n|---|---|")
    for name, value in r["plan_terms"].items():
        print(f"| plan: {name} | {value / gib:.3f} |")
    print(f"| **plan: peak** | **{r['plan_bytes'] / gib:.3f}** |")
    print(f"| **measured peak** ({'max allocated' if r['device'] != 'CPU' else 'peak RSS above the RSS before the model'})"
          f"| **{r['measured_bytes'] / gib:.3f}** |")
    print(f"| measured / plan | {r['measured_bytes'] / r['plan_bytes']:.3f} |")
    step = sum(v for k, v in r["plan_terms"].items() if k.startswith(("activations", "logits")))
    print(f"| the update alone: measured peak - memory before it, plan activations + logits | "
          f"{(r['measured_bytes'] - r['before_update_bytes']) / gib:.3f} vs {step / gib:.3f} |")
    print(f"\nupdate: {r['seconds']:.2f} s, {r['tokens_per_s']:.0f} tokens/s, {r['tflops']:.1f} TFLOP/s (plan at "
          f"{ASSUMPTIONS.train_mfu:.0%} MFU of an {ASSUMPTIONS.hardware.name}: {r['plan_tokens_per_s']:.0f}, "
          f"{r['plan_tflops']:.1f})")


if __name__ == "__main__":
    main()
