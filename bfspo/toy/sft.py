"""Supervised training of the tiny toy model on the solutions of mixed verbosity.

The tokenizer is trained on the toy corpus, a fresh Qwen2 model is sized for it, and the model is
fully fine-tuned (float32, plain torch AdamW) on the assistant turn of each training row, with
the prompt rendered exactly as RL and evaluation render it (`bfspo.tasks.prompts.prompt_ids`). The loss
covers the solution tokens and the closing EOS `<|im_end|>`, nothing of the prompt.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bfspo import console, tracking
from bfspo.errors import BfspoError
from bfspo.io import atomic_dir, write_json
from bfspo.tasks.prompts import prompt_ids, user_message
from bfspo.toy.model import DEFAULT_SYSTEM, new_model, save_model_dir, train_tokenizer

BENCHMARK = "toy"
IGNORE = -100


@dataclass(frozen=True)
class SFTConfig:
    """Size of the tiny model and how it is trained.

    vocab_size: BPE vocabulary size (special tokens included), trained on the toy corpus.
    hidden_size: width of the Qwen2 model.
    intermediate_size: width of the MLP (0 = 4 * hidden_size).
    layers: number of transformer blocks.
    heads: attention heads (head dim = hidden_size / heads).
    kv_heads: key/value heads (grouped-query attention, as in Qwen2).
    steps: optimizer steps.
    batch_size: sequences per step.
    lr: peak learning rate of AdamW, reached after `warmup` steps, then cosine decay to lr / 10.
    warmup: linear warm-up steps.
    weight_decay: AdamW decoupled weight decay.
    grad_clip: maximum global gradient norm.
    seed: seeds the model initialisation and the batch order.
    threads: torch CPU threads (0 = leave torch's default). The model's bytes depend on it (a matrix
        product or a reduction splits its sums by thread), so the CPU sizes fix it at 1: the same on
        every machine, whatever the cores; on shared cores 2 threads also run 8-10x slower
        (bench/RESULTS.md).
    device: `auto` (CUDA when available, else CPU), `cpu` or `cuda`. Training is float32 on either.
    """

    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    layers: int = 3
    heads: int = 4
    kv_heads: int = 2
    steps: int = 3000
    batch_size: int = 8
    lr: float = 5e-3
    warmup: int = 30
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    threads: int = 1
    device: str = "auto"


# "default": the toy DAG's model (aims at 30-80% accuracy at temperature 1 after SFT);
# "test": the CI config's model, trained in seconds (its accuracy is near zero);
# "gpu": config/toy-gpu.yaml's larger model, 4.9M parameters, meant for SFT on a GPU.
SIZES = {
    "default": SFTConfig(),
    "test": SFTConfig(vocab_size=400, hidden_size=32, intermediate_size=0, layers=2, steps=150, lr=1e-2, warmup=15),
    "gpu": SFTConfig(hidden_size=256, intermediate_size=768, layers=6, heads=8, kv_heads=4, steps=4000,
                     batch_size=32, lr=2e-3, warmup=100, threads=0),
}


def tokenizer_corpus(rows: Sequence[dict]) -> list[str]:
    """Every text the model sees: the chat roles, the system prompt, user turns and solutions."""
    texts = ["system\n", "user\n", "assistant\n", DEFAULT_SYSTEM]
    for r in rows:
        texts += [user_message(BENCHMARK, r["question"]), r["solution"]]
    return texts


def encode(tokenizer, row: dict, benchmark: str = BENCHMARK) -> tuple[list[int], int]:
    """(prompt + solution + EOS token ids, prompt length) for one training row, its question
    rendered with `benchmark`'s prompt."""
    prompt = prompt_ids(tokenizer, benchmark, row["question"])
    target = tokenizer(row["solution"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt + target, len(prompt)


def collate(examples: Sequence[tuple[list[int], int]], pad_id: int):
    """Right-padded (input_ids, attention_mask, labels); labels are IGNORE on prompt and padding."""
    import torch

    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (ids, n_prompt) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, n_prompt : len(ids)] = torch.tensor(ids[n_prompt:])
        mask[i, : len(ids)] = 1
    return input_ids, mask, labels


def lr_at(step: int, cfg: SFTConfig) -> float:
    """Linear warm-up to cfg.lr, then cosine decay to cfg.lr / 10 at the last step."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def batches(lengths: Sequence[int], batch_size: int, rng: random.Random) -> Iterator[list[int]]:
    """Endless batches of example indices, each example once per epoch. Batches are cut from
    length-sorted chunks of 16 batches, so little compute goes to padding, then shuffled."""
    while True:
        order = list(range(len(lengths)))
        rng.shuffle(order)
        chunk = 16 * batch_size
        epoch = []
        for i in range(0, len(order), chunk):
            part = sorted(order[i : i + chunk], key=lambda j: lengths[j])
            epoch += [part[k : k + batch_size] for k in range(0, len(part), batch_size)]
        rng.shuffle(epoch)
        yield from epoch


def train(model, examples: Sequence[tuple[list[int], int]], pad_id: int, cfg: SFTConfig,
          name: str = "toy sft", run=None) -> list[float]:
    """Full fine-tuning for cfg.steps steps; returns the training loss of every step (`name` labels
    the progress lines, the bar on a terminal and errors). Each step's loss and learning rate go to
    the W&B `run`, if any (sft/)."""
    import torch

    device = sft_device(cfg.device)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    stream = batches([len(ids) for ids, _ in examples], cfg.batch_size, random.Random(cfg.seed))
    losses = []
    model.train()
    bar, every, t0 = console.bar(total=cfg.steps, desc=name, unit="step"), console.every(cfg.steps), time.perf_counter()
    for step in range(cfg.steps):
        input_ids, mask, labels = (t.to(device) for t in collate([examples[i] for i in next(stream)], pad_id))
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        if not torch.isfinite(loss):
            raise BfspoError(f"{name}: loss became {loss.item()} at step {step}; lower the learning rate")
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        losses.append(loss.item())
        tracking.log(run, {"sft/loss": losses[-1], "sft/lr": lr_at(step, cfg)}, step=step + 1)
        bar.update(1)
        if (step + 1) % every == 0 or step + 1 == cfg.steps:
            recent = losses[-every:]
            console.line(f"{name}: step {step + 1}/{cfg.steps} | loss {sum(recent) / len(recent):.3f} "
                         f"| lr {lr_at(step, cfg):.2e} | {time.perf_counter() - t0:.0f} s")
    bar.close()
    model.to("cpu").eval()
    return losses


def sft_device(name: str):
    """The torch device of `SFTConfig.device`: `auto` is CUDA when visible, else CPU."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise BfspoError(f"toy sft: device must be auto, cpu or cuda, got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise BfspoError("toy sft: device cuda asked for, but no CUDA GPU is visible")
    return torch.device(name)


def build(rows: Sequence[dict], cfg: SFTConfig, out_dir: str | Path, run=None) -> dict:
    """Train the tokenizer, build the model, fine-tune it on `rows` (logged to the W&B `run`, if
    any) and save the model directory.

    The directory is written under a temporary name and renamed into place at the end, with
    `sft.json` (config, losses, wall time) inside: a half-built model never looks finished.
    """
    import torch

    if not rows:
        raise BfspoError("toy sft: no training rows")
    for r in rows:
        if "question" not in r or "solution" not in r:
            raise BfspoError(f"toy sft: training row {r.get('id', '?')} lacks 'question' or 'solution'")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    tokenizer = train_tokenizer(tokenizer_corpus(rows), cfg.vocab_size)
    model = new_model(tokenizer, hidden_size=cfg.hidden_size, layers=cfg.layers, heads=cfg.heads,
                      kv_heads=cfg.kv_heads, intermediate_size=cfg.intermediate_size or None,
                      max_positions=1024, seed=cfg.seed)
    examples = [encode(tokenizer, r) for r in rows]
    losses = train(model, examples, tokenizer.pad_token_id, cfg, run=run)
    with atomic_dir(out_dir) as tmp:
        save_model_dir(model, tokenizer, tmp)
        check_reload(tmp, examples[:50], rows[:50])
        summary = fit_summary(model, cfg, rows, losses, t0)
        write_json(tmp / "sft.json", summary)
    return summary


def fit_summary(model, cfg: SFTConfig, rows: Sequence[dict], losses: Sequence[float], t0: float) -> dict:
    """What sft.json records of a fine-tuning: config, device, the CPU kernels it ran on (torch's
    CPU capability and the settings of bfspo/toy/numerics.py), size, first and last losses, wall time."""
    import torch

    from bfspo.toy.numerics import describe

    return {
        "config": asdict(cfg),
        "device": str(sft_device(cfg.device)),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_numerics": describe(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": model.config.vocab_size,
        "train_rows": len(rows),
        "loss_first": losses[0],
        "loss_last": sum(losses[-10:]) / len(losses[-10:]),
        "losses": list(losses),
        "wall_s": time.perf_counter() - t0,
    }


def check_reload(model_dir: Path, examples: Sequence[tuple[list[int], int]], rows: Sequence[dict]) -> None:
    """The saved tokenizer, loaded the way every consumer loads it (AutoTokenizer), must encode
    exactly as the one the model was trained with; otherwise evaluation and RL would feed it
    token sequences it never saw."""
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    for row, example in zip(rows, examples):
        if encode(reloaded, row) != example:
            raise BfspoError(f"toy sft: the tokenizer saved in {model_dir} encodes row {row.get('id', '?')} "
                             "differently once reloaded")


def config_for(size: str, **overrides) -> SFTConfig:
    """The named size with the given fields replaced (None values are ignored)."""
    if size not in SIZES:
        raise BfspoError(f"unknown toy model size {size!r}; known: {', '.join(SIZES)}")
    return replace(SIZES[size], **{k: v for k, v in overrides.items() if v is not None})
