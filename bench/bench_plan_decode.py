"""vLLM's decode rate against the plan's throughput assumption (bfspo/pipeline/throughput.py).

A random-weight model with a shipped model's shapes (config/models/<hub id>/config.json; `--layers`
fewer layers for a quick start, the plan is computed for the same shape), saved in bfloat16 and
served by vLLM without a tokenizer: `--seqs` prompts of `--prompt` random tokens, `--new` tokens
each (EOS ignored, so every sequence runs to its length), at most `--seqs` sequences at once
(max_num_seqs). Printed: the measured generated tokens/s (prefill included) beside the plan's
decode roofline for that concurrency and mean context, and vLLM's KV cache size.

    python -m bench.bench_plan_decode --shape Qwen/Qwen2.5-3B-Instruct --seqs 512 --prompt 140 --new 317

Needs CUDA and vllm (vllm==0.32.0, the `[vllm]` extra); without them it says so and exits 0.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="Qwen/Qwen2.5-3B-Instruct")
    p.add_argument("--layers", type=int, default=0, help="0: the model's own")
    p.add_argument("--seqs", type=int, default=512)
    p.add_argument("--prompt", type=int, default=140)
    p.add_argument("--new", type=int, default=317)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("\nvLLM decode against the plan: no CUDA GPU; not measured")
        return
    try:
        import vllm
    except ImportError:
        print("\nvLLM decode against the plan: vllm is not installed here; not measured")
        return
    from transformers import AutoConfig, AutoModelForCausalLM

    from bfspo.pipeline.shapes import config_path, load_shape
    from bfspo.pipeline.throughput import ASSUMPTIONS, decode_tokens_per_s

    config = AutoConfig.from_pretrained(config_path(args.shape).parent)
    if args.layers:
        config.num_hidden_layers = args.layers
    shape = load_shape(args.shape)
    shape = type(shape)(**{**shape.__dict__, "layers": config.num_hidden_layers})
    with tempfile.TemporaryDirectory() as model_dir:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(model_dir)
        llm = vllm.LLM(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16", max_num_seqs=args.seqs,
                       gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=args.prompt + args.new + 16,
                       enable_prefix_caching=True, seed=0)
        rng = random.Random(0)
        prompts = [{"prompt_token_ids": [rng.randrange(5, config.vocab_size) for _ in range(args.prompt)]}
                   for _ in range(args.seqs)]
        params = vllm.SamplingParams(max_tokens=args.new, min_tokens=args.new, ignore_eos=True, detokenize=False,
                                     temperature=1.0)
        llm.generate(prompts[:8], vllm.SamplingParams(max_tokens=8, ignore_eos=True, detokenize=False))  # warm-up
        t0 = time.perf_counter()
        out = llm.generate(prompts, params)
        seconds = time.perf_counter() - t0
    generated = sum(len(o.outputs[0].token_ids) for o in out)
    plan = decode_tokens_per_s(shape, args.seqs, args.prompt + args.new / 2, ASSUMPTIONS)
    print(f"\n### vLLM decode against the plan [{torch.cuda.get_device_name()}, vllm {vllm.__version__}]\n")
    print(f"{args.shape} shapes, {shape.layers} layers, random weights; {args.seqs} sequences at once, prompts of "
          f"{args.prompt}, {args.new} new tokens each\n")
    print("| generated tokens | seconds | measured tok/s | plan tok/s (A100 roofline) | measured / plan |")
    print("|---|---|---|---|---|")
    print(f"| {generated} | {seconds:.1f} | {generated / seconds:.0f} | {plan:.0f} | {generated / seconds / plan:.2f} |")
    print(f"\n(The plan assumes an {ASSUMPTIONS.hardware.name}; an H100 should beat it.)")


if __name__ == "__main__":
    main()
