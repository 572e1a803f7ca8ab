"""Rollout throughput and prefix reuse of the transformers engine (issue 8, goals 1-2).

1. New tokens/s sampling `--new` tokens after `--prompt`-token prompts at batch `--batch`:
   `model.generate` against bfspo's TransformersEngine (random weights never stop early, so
   every row runs to the budget: the lengths are fixed).
2. Prefix reuse: sampling G continuations of one P-token prefix costs one prefill with the
   engine (its KV is shared), against G prefills when the prefix is repeated as G contexts.

    python bench/bench_rollout.py --shape cpu --batch 16 --prompt 32 --new 32
    python bench/bench_rollout.py --shape 0.5b --batch 256 --prompt 128 --new 256   # on a GPU
"""

from __future__ import annotations

import argparse

import torch

from bench.common import device_and_dtype, print_table, random_model, timed
from bfspo.rollout.hf_engine import TransformersEngine


class NoTokenizer:
    """The engine needs only EOS and padding ids; an id past the vocabulary never gets sampled."""

    def __init__(self, vocab: int):
        self.eos_token_id = vocab + 1
        self.pad_token_id = 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="cpu")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--group", type=int, default=8, help="G for the prefix-reuse table")
    p.add_argument("--prefixes", default="100,400", help="prefix lengths for the prefix-reuse table")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    device, _ = device_and_dtype()
    model = random_model(args.shape)
    vocab = model.config.vocab_size
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    engine = TransformersEngine(model, NoTokenizer(vocab), batch_size=args.batch)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(5, vocab, (args.batch, args.prompt), generator=gen).to(device)

    def hf_generate():
        with torch.no_grad():
            model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0,
                           top_p=1.0, top_k=0, max_new_tokens=args.new, min_new_tokens=args.new)

    contexts = prompts.tolist()

    def ours():
        engine.generate(contexts, 1, args.new, temperature=1.0, top_p=1.0, seed=0)

    new_tokens = args.batch * args.new
    t_hf, t_ours = timed(hf_generate, args.repeats, 1), timed(ours, args.repeats, 1)
    print_table(f"sampling throughput, {args.shape} shape, batch {args.batch}, prompt {args.prompt}, {args.new} new",
                ["method", "s", "new tokens/s"],
                [["model.generate", t_hf, new_tokens / t_hf], ["bfspo TransformersEngine", t_ours, new_tokens / t_ours]])

    rows = []
    for plen in (int(x) for x in args.prefixes.split(",")):
        prefix = torch.randint(5, vocab, (plen,), generator=gen).tolist()
        shared = timed(lambda: engine.generate([prefix], args.group, 1, seed=0), args.repeats, 1)
        repeated = timed(lambda: engine.generate([prefix] * args.group, 1, 1, seed=0), args.repeats, 1)
        rows.append([plen, args.group, shared * 1e3, repeated * 1e3, repeated / shared])
    print_table("prefix reuse: prefill + 1 token for G continuations of one prefix",
                ["prefix tokens", "G", "shared KV ms", "G separate prefills ms", "ratio"], rows)


if __name__ == "__main__":
    main()
