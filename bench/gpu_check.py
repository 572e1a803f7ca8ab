"""The GPU check (issue 30): what CI cannot run, in at most 8 minutes of one GPU.

Parts, in order of value, each in a process of its own under its own time limit (PRESETS); each
writes OUT/<part>.json and OUT/<part>.md as it goes, and OUT/summary.md is written again after
every part, so a run cut off at any point still returns what it measured:

1. attention: tree attention on the project's own packed trees (bench.bench_plan_memory's
   paper-shaped trees, Qwen2.5-3B's heads: 16 query heads, 2 key/value heads of 128), in bfloat16 on
   CUDA, at several row lengths: compiled flex attention (`flex_tree_attention`), the blockwise
   kernel (`blockwise_attention`) and the dense reference (sdpa with the [T, T] mask of
   `PackedBatch.dense_mask`, in float32, up to `dense_max` tokens): forward and backward, their
   differences from the reference, seconds per call (first call: compile included), and torch's
   compile counters. On CPU, torch has no flex backward: it is skipped with that reason, and
   dynamo is reset between lengths (the dynamic-shape CPU graph does not compile, issue 30).
2. update: one mini-batch update at Qwen2.5-3B's shapes (random weights from config/models/,
   `layers` of its 36 layers, micro_batch_tokens 32768, gradient checkpointing, bf16 on CUDA):
   peak memory and trained tokens/s beside the plan's (bench/bench_plan_memory.py).
3. generation: the transformers engine's tokens/s at the Qwen2.5-0.5B shape (bench/bench_rollout.py).
4. toy: toy data, a toy model fine-tuned on the device, then a few steps of DAPO and BFS-PO
   (`bfspo train`, bf16 on CUDA), their per-step figures from metrics.jsonl, and the two runs
   against their plans (bench/plan_vs_run.py).

    python -m bench.gpu_check --out OUT                  # on the GPU (bench/gpu_session.sh wraps it)
    python -m bench.gpu_check --out OUT --preset tiny    # CPU rehearsal (make gpu-session-rehearsal)

Exit status 1 if a part failed or ran out of time (the others still ran).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

TOTAL_S = 480  # the whole check, on the GPU: 8 minutes
# Per part: its time limit (s) and settings, for the GPU and for the CPU rehearsal.
PRESETS = {
    "gpu": {
        "attention": dict(limit=120, lengths=[1500, 6000, 12000, 32000], dense_max=16384, repeats=3),
        "update": dict(limit=150, layers=36, tokens=32768),
        "generation": dict(limit=70, args=["--shape", "0.5b", "--batch", "128", "--prompt", "128", "--new", "128",
                                            "--group", "8", "--prefixes", "400", "--repeats", "2"]),
        "toy": dict(limit=130, size="default", sft_steps=400, n_train=4000, n_rl=512, steps=3, chains=128, mini=64),
    },
    "tiny": {
        "attention": dict(limit=240, lengths=[300, 517, 900], dense_max=1024, repeats=1),
        "update": dict(limit=120, layers=2, tokens=2048,  # Qwen2.5-3B's config.json, narrower (as tests/test_plan.py)
                       narrow=dict(hidden_size=256, intermediate_size=1024, num_attention_heads=4, vocab_size=4096)),
        "generation": dict(limit=60, args=["--shape", "cpu", "--batch", "4", "--prompt", "16", "--new", "16",
                                            "--group", "2", "--prefixes", "32", "--repeats", "1"]),
        "toy": dict(limit=180, size="test", sft_steps=30, n_train=300, n_rl=64, steps=2, chains=16, mini=16),
    },
}
PARTS = tuple(PRESETS["gpu"])
ABSENT_ON_IMAGE = ("vllm", "math_verify", "snakemake", "wandb", "pandas")  # reported (math_verify is carried)


def write(out: Path, part: str, result, md: str) -> None:
    """The part's results so far (written after each measurement, whole files replaced)."""
    (out / f"{part}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / f"{part}.md").write_text(md)


# ---- part 1: tree attention --------------------------------------------------------------------------


def packed_rows(length: int, vocab: int = 1000):
    """The project's packed trees (bench.bench_plan_memory.paper_trees: a 140-token prompt, 16 answers,
    K = 3 expansions) until one row holds at least `length` tokens, then the row cut to `length`
    (a cut DFS row is a valid row: every interval is clipped to it): the batch with the cut `ends`."""
    from bench.bench_plan_memory import paper_trees
    from bfspo.algorithm.packing import pack_trees

    trees = paper_trees(argparse.Namespace(prompt=140, answer=317, budget=512, group=16, k=3, tokens=length), vocab)
    packed = pack_trees(trees)
    return replace(packed, ends=packed.ends[:length].clamp(max=length))


def compile_counts() -> dict:
    from torch._dynamo.utils import counters

    return {k: v for k, v in counters["stats"].items()}


def attention(out: Path, cfg: dict) -> None:
    import torch
    import torch.nn.functional as F

    from bfspo.algorithm.tree_attention import blockwise_attention, flex_tree_attention, interval_block_mask

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    hq, hkv, d = 16, 2, 128  # Qwen2.5-3B
    scale = d ** -0.5
    rows, lines = [], []

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def run(fn, q, k, v, grad_out, backward: bool):
        """(output, grads or None, seconds) of one call."""
        q, k, v = (x.detach().requires_grad_(backward) for x in (q, k, v))
        sync()
        t = time.perf_counter()
        o = fn(q, k, v)
        grads = None
        if backward:
            grads = torch.autograd.grad(o, (q, k, v), grad_out)
        sync()
        return o.detach(), grads, time.perf_counter() - t

    def err(a, b):
        return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-12))

    header = ("| T | kernel | pass | first call s | later s | max rel. err vs dense (out; dq dk dv) | "
              "compiles so far |\n|---|---|---|---|---|---|---|\n")
    for length in cfg["lengths"]:
        if not cuda:
            torch._dynamo.reset()  # static shapes per length on CPU (its dynamic-shape flex graph fails to compile)
        packed = packed_rows(length)
        ends = packed.ends.to(device)
        g = torch.Generator(device="cpu").manual_seed(length)
        q = torch.randn(1, hq, length, d, generator=g).to(device, dtype)
        k = torch.randn(1, hkv, length, d, generator=g).to(device, dtype)
        v = torch.randn(1, hkv, length, d, generator=g).to(device, dtype)
        grad_out = torch.randn(1, hq, length, d, generator=g).to(device, dtype)
        ref = None
        if length <= cfg["dense_max"]:
            mask = packed.dense_mask().to(device)

            def dense(q, k, v):
                return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale,
                                                      enable_gqa=True)
            o, grads, s = run(dense, q, k, v, grad_out.float(), backward=True)
            ref = (o, grads)
            rows.append(dict(T=length, kernel="dense fp32", pass_="fwd+bwd", first_s=s))
            del mask
        block_mask = interval_block_mask(ends)
        kernels = {
            "flex compiled": lambda q, k, v: flex_tree_attention(q, k, v, block_mask, scale, compiled=True),
            "blockwise": lambda q, k, v: blockwise_attention(q, k, v, ends, scale),
        }
        for name, fn in kernels.items():
            passes = [True] if (cuda or name != "flex compiled") else [False]
            for backward in passes:
                row = dict(T=length, kernel=name, pass_="fwd+bwd" if backward else "fwd (no grad)")
                if name == "flex compiled" and not cuda:
                    row["skipped"] = "backward: torch has no flex attention backward on CPU"
                try:
                    o, grads, first = run(fn, q, k, v, grad_out, backward)
                    later = [run(fn, q, k, v, grad_out, backward)[2] for _ in range(cfg["repeats"])]
                    row |= dict(first_s=first, later_s=statistics.median(later))
                    if ref is not None:
                        row["err_out"] = err(o, ref[0])
                        if grads is not None:
                            row["err_grads"] = [err(a, b) for a, b in zip(grads, ref[1])]
                except Exception as e:  # noqa: BLE001 - a kernel that fails is the finding; the others go on
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                row["compiles"] = compile_counts()
                rows.append(row)
                lines.append(_attention_line(row))
                write(out, "attention", {"device": device, "dtype": str(dtype), "heads": [hq, hkv, d], "rows": rows},
                      f"tree attention, {hq} query / {hkv} key-value heads of {d}, {str(dtype)[6:]} on {device}\n\n"
                      + header + "".join(lines))
            del o, grads


def _attention_line(r: dict) -> str:
    def f(x):
        return f"{x:.3g}" if isinstance(x, float) else ("-" if x is None else str(x))

    errs = "-" if "err_out" not in r else f(r["err_out"]) + (
        "; " + " ".join(f(e) for e in r["err_grads"]) if "err_grads" in r else "")
    note = r.get("error") or r.get("skipped")
    compiles = r["compiles"].get("unique_graphs", 0)
    return (f"| {r['T']} | {r['kernel']} | {r['pass_']} | {f(r.get('first_s'))} | {f(r.get('later_s'))} | {errs} | "
            f"{compiles} |" + (f" {note}" if note else "") + "\n")


# ---- part 2: one update at Qwen2.5-3B's shapes ------------------------------------------------------


def update(out: Path, cfg: dict) -> None:
    from bfspo.pipeline.shapes import config_path

    shape = "Qwen/Qwen2.5-3B-Instruct"
    if "narrow" in cfg:  # the rehearsal's: the model's config.json with narrower layers
        shape = work_dir() / "narrow"
        shape.mkdir(parents=True, exist_ok=True)
        (shape / "config.json").write_text(json.dumps(json.loads(config_path("Qwen/Qwen2.5-3B-Instruct").read_text())
                                                      | cfg["narrow"]))
    cmd = [sys.executable, "-m", "bench.bench_plan_memory", "--json", "--shape", str(shape),
           "--layers", str(cfg["layers"]), "--tokens", str(cfg["tokens"])]
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
    gib = 2**30
    md = (f"{r['shape']} shapes, {r['layers']} layers, one row of {r['row_tokens']} tokens, gradient checkpointing, "
          f"{r['dtype']} on {r['device']}\n\n| | measured | plan |\n|---|---|---|\n"
          f"| peak memory GiB | {r['measured_bytes'] / gib:.2f} | {r['plan_bytes'] / gib:.2f} |\n"
          f"| trained tokens/s (plan: an A100 at its MFU) | {r['tokens_per_s']:.0f} | {r['plan_tokens_per_s']:.0f} |\n"
          f"| update s (after a warm-up update at the same shapes) | {r['seconds']:.2f} | |\n"
          f"| compiles during the timed update | {r['compiles_in_timed_update']} | |\n")
    write(out, "update", r, md)


# ---- part 3: generation ------------------------------------------------------------------------------


def generation(out: Path, cfg: dict) -> None:
    text = subprocess.run([sys.executable, "-m", "bench.bench_rollout", *cfg["args"]], check=True,
                          capture_output=True, text=True).stdout
    write(out, "generation", {"args": cfg["args"], "output": text}, text)


# ---- part 4: DAPO and BFS-PO on the toy model ---------------------------------------------------------

METRICS = ("timing/rollout_s", "timing/old_logprobs_s", "timing/update_s", "timing/rollout_tok_s",
           "timing/train_tok_s", "timing/peak_mem_gb", "rollout/tokens_unique")


def work_dir() -> Path:
    """Where the parts write what is not a result (data, models, runs): $GPU_CHECK_WORK."""
    return Path(os.environ.get("GPU_CHECK_WORK", "/tmp/bfspo-gpu-check"))


def toy(out: Path, cfg: dict) -> None:
    work = work_dir()
    bfspo = [sys.executable, "-m", "bfspo.cli"]
    result, lines = {}, []

    def stage(name, label, cmd):
        t = time.perf_counter()
        with open(out / "toy-commands.log", "a") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
        result[name] = {"seconds": round(time.perf_counter() - t, 1)}
        lines.append(f"- {name} ({label}): {result[name]['seconds']} s\n")
        write(out, "toy", result, "".join(lines))

    stage("data", f"{cfg['n_train']} SFT rows", [*bfspo, "toy", "data", "--out-dir", str(work / "data"), "--n-train", str(cfg["n_train"]),
                   "--n-rl", str(cfg["n_rl"]), "--n-eval", "32"])
    stage("model", f"size {cfg['size']}, {cfg['sft_steps']} SFT steps",
          [*bfspo, "toy", "build", "--train", str(work / "data/train.jsonl"), "--out-dir", str(work / "model"),
           "--size", cfg["size"], "--steps", str(cfg["sft_steps"]), "--warmup", "10"])
    for name, k in (("dapo", 0), ("bfspo", 3)):
        run_dir = work / "runs" / name
        stage(f"train {name}", f"{cfg['steps']} steps of {cfg['chains']} chains",
              [*bfspo, "train", "--output-dir", str(run_dir), "--set", f"model={work / 'model'}",
               "--set", f"train_data={work / 'data/rl_train.jsonl'}", "--set", "benchmark=toy", "--set", "budget=160",
               "--set", f"k={k}", "--set", f"steps={cfg['steps']}", "--set", f"train_batch={cfg['chains']}",
               "--set", f"mini_batch={cfg['mini']}", "--set", "lr=1e-3", "--set", "save_every=1000"])
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        medians = {m: statistics.median(r[m] for r in rows) for m in METRICS if all(m in r for r in rows)}
        result[f"train {name}"] |= {"steps": len(rows), "medians": medians}
        lines.append("  " + ", ".join(f"{m.split('/')[1]} {v:.3g}" for m, v in medians.items()) + "\n")
        write(out, "toy", result, "".join(lines))
    against = subprocess.run([sys.executable, "-m", "bench.plan_vs_run", str(work / "runs/dapo"), str(work / "runs/bfspo")],
                             check=True, capture_output=True, text=True).stdout
    result["plan_vs_run"] = against
    write(out, "toy", result, "".join(lines) + against)


# ---- the driver --------------------------------------------------------------------------------------


def environment() -> str:
    import torch

    versions = []
    for name in ("torch", "transformers", "peft", "accelerate", "tokenizers", "huggingface_hub"):
        try:
            versions.append(f"{name} {__import__(name).__version__}")
        except ImportError:
            versions.append(f"{name} absent")
    absent = [m for m in ABSENT_ON_IMAGE if importlib.util.find_spec(m) is None]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit or 'unknown'}\n"
            f"device: {device}; python {platform.python_version()}; {', '.join(versions)}\n"
            f"not installed: {', '.join(absent) or 'none'}\n")


def run_part(part: str, limit: float, preset: str, out: Path) -> tuple[str, float]:
    """Run one part in a process group of its own; kill the group at its limit. (status, seconds)"""
    t = time.perf_counter()
    with open(out / f"{part}.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "bench.gpu_check", "--part", part, "--preset", preset,
                                 "--out", str(out)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
            status = "ok" if rc == 0 else f"failed (exit {rc}, see {part}.log)"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = f"cut off at its limit of {limit:.0f} s (what it measured is below)"
    return status, time.perf_counter() - t


def summary(out: Path, env: str, done: list) -> None:
    md = ["# GPU check\n\n", env, "\n| part | status | seconds | limit |\n|---|---|---|---|\n"]
    md += [f"| {p} | {s} | {t:.0f} | {limit:.0f} |\n" for p, s, t, limit in done]
    for p, *_ in done:
        f = out / f"{p}.md"
        md.append(f"\n## {p}\n\n" + (f.read_text() if f.exists() else "(nothing measured)\n"))
    (out / "summary.md").write_text("".join(md))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--preset", default="gpu", choices=sorted(PRESETS))
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS, help="which parts, in this order")
    p.add_argument("--total-s", type=float, default=TOTAL_S, help="time for all parts together")
    p.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # the child process of one part
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part:
        globals()[args.part](args.out, PRESETS[args.preset][args.part])
        return 0
    start = time.perf_counter()
    shutil.rmtree(work_dir(), ignore_errors=True)  # a toy run found there would be resumed, not run
    env = environment()
    (args.out / "env.txt").write_text(env)
    print(env, flush=True)
    done, failed = [], False
    for part in args.parts:
        limit = min(PRESETS[args.preset][part]["limit"], args.total_s - (time.perf_counter() - start))
        if limit < 10:
            done.append((part, "not run: the check's time is spent", 0.0, 0.0))
            failed = True
        else:
            status, seconds = run_part(part, limit, args.preset, args.out)
            failed |= status != "ok"
            done.append((part, status, seconds, limit))
        summary(args.out, env, done)
        print(f"{part}: {done[-1][1]} ({done[-1][2]:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
