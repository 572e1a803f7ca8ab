"""The GPU check (issues 30, 38): the figures the plan rests on, from one GPU in at most 8 minutes, kept as measured.

Parts, in order of value, each in a process of its own (a process group, killed at its limit):

1. attention: tree attention on the project's packed trees (bench.bench_plan_memory's paper-shaped
   trees, Qwen2.5-3B's heads: 16 query heads, 2 key/value heads of 128, bfloat16 on CUDA) at the
   trainer's own row lengths for paper.yaml's 3B class (`bucket_lengths(micro_batch_tokens,
   attention_bucket)`): the largest first (a full micro-batch of the update), then the smallest
   (a rescoring row of a few groups), then the middle one. Per length: the reference (the dense
   fp32 sdpa under the [T, T] mask up to `dense_max` tokens, else the blockwise kernel), the compiled
   flex kernel forward and backward (the update's graph), forward without gradients (the
   rescoring's), and the blockwise kernel; seconds of the first call (its compile) and of later
   calls, their difference (the compile: the plan's `compile_graph_s`), differences from the
   reference, and dynamo's graph count. On CPU torch has no flex backward (skipped, with the
   reason) and dynamo is reset between lengths (its dynamic-shape CPU graph does not compile).
2. update: one mini-batch update at Qwen2.5-3B's shapes (random weights from config/models/, all
   36 layers, gradient checkpointing, LoRA, bfloat16) over one row of one bucket (micro_batch_tokens
   = attention_bucket = 32768: one flex compile), warmed up on the measured model alone
   (bench/bench_plan_memory.py --one-row: trees of paper.yaml's BFS-PO, G = 4 and K = 3, whole in
   the row): the built model, the warm-up update (its compile), the
   timed update (tokens/s and TFLOP/s beside the plan's) and its peak memory beside the plan's.
3. toy: toy data, a toy model fine-tuned on the device, then BFS-PO (K = 3) with `bfspo train` and
   one attention bucket (attention_bucket = micro_batch_tokens: one compile), its per-step figures
   and the run against its plan (bench/plan_vs_run.py).
4. generation: the transformers engine's tokens/s (bench/bench_rollout.py). Not vLLM's, which the
   plan counts and the image lacks.

Each measurement is added to OUT/results.json as soon as it is made, and OUT/summary.md (every part's
table and status) is written again from it, so a part killed at its limit, or the whole check killed,
leaves what it measured. OUT holds four files: summary.md, results.json, env.txt (the environment:
a probe that fails, git or nvidia-smi missing, is recorded as unknown) and logs.txt (every part's
output, one after the other). Intermediate data goes to $GPU_CHECK_WORK.

Limits (PRESETS): each part's from what its compiles need, sized on issue 38's 30-90 s for one
flex forward and backward compile on an H100, at the high end (COMPILE_PAIR_S; a forward alone,
COMPILE_FORWARD_S), so that a part's first measurement is not cut: attention, START_S + the
largest length's pair and forward + 15 s for its reference and repeats (later lengths run while
time is left); update, START_S + 20 s to build the 3B model + one pair + 10 s for two updates of
32,768 tokens (2-3 s each at the plan's MFU); toy, START_S + 20 s of data and fine-tuning + one
`bfspo train` process (START_S + a pair + 20 s of steps); generation, 30 s. 7 min 55 s in all: with
a machine start of about 3 minutes, 15 minutes of device time leave room for one rerun of any part.
The `tiny` preset (the CPU rehearsal) lifts the limits to HANG_S each: shared CPU cores time nothing.

    python -m bench.gpu.gpu_check --out OUT                 # on the GPU (bench/gpu/gpu_session.sh wraps it)
    python -m bench.gpu.gpu_check --out OUT --preset tiny   # CPU rehearsal (make gpu-session-rehearsal)

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

START_S = 15  # a part's process: Python, torch, CUDA's initialisation
COMPILE_PAIR_S = 90  # one compiled flex forward and backward on an H100 (issue 38: 30-90 s), the high end
COMPILE_FORWARD_S = 30  # a compiled flex forward alone (the rescoring's graph)
PAPER_CLASS = dict(micro_batch_tokens=32768, attention_bucket=2048)  # config/paper.yaml's 3b class (a test keeps it so)
HANG_S = 1800  # the rehearsal's limit per part: a guard against a hang, not a timing (shared CPU cores)
PRESETS = {
    "gpu": {
        "attention": dict(limit=START_S + COMPILE_PAIR_S + COMPILE_FORWARD_S + 15, **PAPER_CLASS, dense_max=16384,
                          repeats=3),
        "update": dict(limit=START_S + 20 + COMPILE_PAIR_S + 10, layers=36, tokens=32768, group=4, k=3),
        "toy": dict(limit=START_S + 20 + START_S + COMPILE_PAIR_S + 20, size="default", sft_steps=200, n_train=2000,
                    n_rl=256, steps=2, chains=128, mini=64, micro_batch_tokens=4096),
        "generation": dict(limit=30, args=["--shape", "0.5b", "--batch", "128", "--prompt", "128", "--new", "128",
                                            "--group", "8", "--prefixes", "400", "--repeats", "2"]),
    },
    "tiny": {
        "attention": dict(limit=HANG_S, micro_batch_tokens=1024, attention_bucket=256, dense_max=1024, repeats=1),
        "update": dict(limit=HANG_S, layers=2, tokens=4096, group=4, k=3,  # Qwen2.5-3B's config.json, narrower
                       narrow=dict(hidden_size=256, intermediate_size=1024, num_attention_heads=4, vocab_size=4096)),
        "toy": dict(limit=HANG_S, size="test", sft_steps=30, n_train=300, n_rl=64, steps=2, chains=16, mini=16,
                    micro_batch_tokens=2048),
        "generation": dict(limit=HANG_S, args=["--shape", "cpu", "--batch", "4", "--prompt", "16", "--new", "16",
                                                "--group", "2", "--prefixes", "32", "--repeats", "1"]),
    },
}
PARTS = tuple(PRESETS["gpu"])
TOTAL_S = {preset: sum(cfg["limit"] for cfg in parts.values()) for preset, parts in PRESETS.items()}
RESULTS, SUMMARY, ENV, LOGS = "results.json", "summary.md", "env.txt", "logs.txt"
OUT_FILES = (SUMMARY, RESULTS, ENV, LOGS)  # all that OUT holds (the device returns at most 8 files)
ABSENT_ON_IMAGE = ("vllm", "math_verify", "snakemake", "wandb", "pandas")  # reported (math_verify is carried)


# ---- results.json and summary.md, rewritten after every measurement ------------------------------------


def load(out: Path) -> dict:
    path = out / RESULTS
    return json.loads(path.read_text()) if path.exists() else {"env": {}, "parts": {}}


def _replace(path: Path, text: str) -> None:
    """Write `path` whole: a temporary file beside it, then a rename (a kill leaves the old file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save(out: Path, results: dict) -> None:
    _replace(out / RESULTS, json.dumps(results, indent=1, default=str) + "\n")
    _replace(out / SUMMARY, summary(results))


def record(out: Path, part: str, measurement: dict) -> None:
    """Add one measurement of `part` to results.json and rewrite summary.md."""
    results = load(out)
    results["parts"].setdefault(part, {}).setdefault("measurements", []).append(measurement)
    save(out, results)


def set_status(out: Path, part: str, **fields) -> None:
    results = load(out)
    results["parts"].setdefault(part, {}).update(fields)
    save(out, results)


def _f(x) -> str:
    return f"{x:.3g}" if isinstance(x, float) else ("-" if x is None else str(x))


def attention_md(ms: list[dict]) -> str:
    lines = ["| T | kernel | pass | first call s | later s | compile s | max rel. err vs reference (out; dq dk dv) | "
             "graphs so far |\n|---|---|---|---|---|---|---|---|\n"]
    for m in ms:
        errs = "-" if "err_out" not in m else _f(m["err_out"]) + (
            "; " + " ".join(_f(e) for e in m["err_grads"]) if "err_grads" in m else "") + f" ({m['reference']})"
        note = m.get("error") or m.get("skipped")
        lines.append(f"| {m['T']} | {m['kernel']} | {m['pass']} | {_f(m.get('first_s'))} | {_f(m.get('later_s'))} | "
                     f"{_f(m.get('compile_s'))} | {errs} | {m.get('graphs', '-')} |" + (f" {note}" if note else "") + "\n")
    return "".join(lines)


def update_md(ms: list[dict]) -> str:
    r = ms[-1]
    gib = 2**30
    rows = [f"{r['shape']} shapes, {r['layers']} layers, {r['trees']} trees in one row of {r['row_tokens']} tokens "
            f"(bucket {r['bucket']}), gradient checkpointing, {r['dtype']} on {r['device']}\n\n| | measured | plan |\n"
            "|---|---|---|\n", f"| model built, s | {_f(r['build_s'])} | |\n"]
    if "warmup_s" in r:
        rows.append(f"| warm-up update s (compiles included: {r['compiles_in_warmup']} graphs) | {_f(r['warmup_s'])} | |\n")
    if "seconds" in r:
        rows += [f"| update s (after the warm-up; {r['compiles_in_timed_update']} graphs compiled in it) | "
                 f"{_f(r['seconds'])} | |\n",
                 f"| trained tokens/s (plan: an A100 at its MFU) | {r['tokens_per_s']:.0f} | {r['plan_tokens_per_s']:.0f} |\n",
                 f"| TFLOP/s (6N per token of the padded row; plan: 30% of an A100) | {_f(r['tflops'])} | "
                 f"{_f(r['plan_tflops'])} |\n"]
    if "measured_bytes" in r:
        peak = "max allocated" if r["device"] != "CPU" else "peak RSS"
        rows.append(f"| peak memory GiB ({peak} above the start) | {r['measured_bytes'] / gib:.2f} | "
                    f"{r['plan_bytes'] / gib:.2f} |\n")
    return "".join(rows)


def toy_md(ms: list[dict]) -> str:
    lines = []
    for m in ms:
        if "medians" in m:
            lines.append(f"- {m['stage']}: {m['seconds']} s, {m['steps']} steps; " + ", ".join(
                f"{k.split('/')[1]} {v:.3g}" for k, v in m["medians"].items()) + "\n")
        elif "text" in m:
            lines.append(m["text"])
        else:
            lines.append(f"- {m['stage']} ({m['label']}): {m['seconds']} s\n")
    return "".join(lines)


def generation_md(ms: list[dict]) -> str:
    return "".join(m["text"] for m in ms)


RENDER = {"attention": attention_md, "update": update_md, "toy": toy_md, "generation": generation_md}


def summary(results: dict) -> str:
    env = results.get("env", {})
    md = ["# GPU check\n\n", "".join(f"- {k}: {v}\n" for k, v in env.items()),
          "\n| part | status | seconds | limit s |\n|---|---|---|---|\n"]
    parts = results["parts"]
    md += [f"| {p} | {r.get('status', '-')} | {_f(r.get('seconds'))} | {_f(r.get('limit_s'))} |\n"
           for p, r in parts.items()]
    for p, r in parts.items():
        ms = r.get("measurements", [])
        md.append(f"\n## {p}\n\n" + (RENDER[p](ms) if ms else "(nothing measured)\n"))
    return "".join(md)


# ---- part 1: tree attention --------------------------------------------------------------------------


def attention_lengths(micro_batch_tokens: int, attention_bucket: int) -> list[int]:
    """The trainer's bucket lengths, in the order they are measured: the largest, the smallest, the middle."""
    from bfspo.algorithm.attention_options import bucket_lengths

    lengths = bucket_lengths(micro_batch_tokens, attention_bucket)
    return list(dict.fromkeys([lengths[-1], lengths[0], lengths[(len(lengths) - 1) // 2]]))


def packed_rows(length: int, vocab: int = 1000):
    """The project's packed trees (bench.bench_plan_memory.paper_trees: a 140-token prompt, 16 answers,
    K = 3 expansions) until one row holds at least `length` tokens, then the row cut to `length`
    (a cut DFS row is a valid row: every interval is clipped to it): the batch with the cut `ends`."""
    from bench.bench_plan_memory import paper_trees
    from bfspo.algorithm.packing import pack_trees

    trees = paper_trees(argparse.Namespace(prompt=140, answer=317, budget=512, group=16, k=3, tokens=length), vocab)
    packed = pack_trees(trees)
    return replace(packed, ends=packed.ends[:length].clamp(max=length))


def attention(out: Path, cfg: dict) -> None:
    import torch
    import torch.nn.functional as F
    from torch._dynamo.utils import counters

    from bfspo.algorithm.tree_attention import blockwise_attention, flex_tree_attention, interval_block_mask

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    hq, hkv, d = 16, 2, 128  # Qwen2.5-3B
    scale = d ** -0.5

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def run(fn, q, k, v, grad_out, backward: bool):
        """(output, grads or None, seconds) of one call."""
        q, k, v = (x.detach().requires_grad_(backward) for x in (q, k, v))
        sync()
        t = time.perf_counter()
        with torch.set_grad_enabled(backward):
            o = fn(q, k, v)
            grads = torch.autograd.grad(o, (q, k, v), grad_out) if backward else None
        sync()
        return o.detach(), grads, time.perf_counter() - t

    def err(a, b):
        return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-12))

    for length in attention_lengths(cfg["micro_batch_tokens"], cfg["attention_bucket"]):
        if not cuda:
            torch._dynamo.reset()  # static shapes per length on CPU (its dynamic-shape flex graph fails to compile)
        packed = packed_rows(length)
        ends = packed.ends.to(device)
        g = torch.Generator(device="cpu").manual_seed(length)
        q = torch.randn(1, hq, length, d, generator=g).to(device, dtype)
        k = torch.randn(1, hkv, length, d, generator=g).to(device, dtype)
        v = torch.randn(1, hkv, length, d, generator=g).to(device, dtype)
        grad_out = torch.randn(1, hq, length, d, generator=g).to(device, dtype)
        block_mask = interval_block_mask(ends)
        kernels = [("blockwise", lambda q, k, v: blockwise_attention(q, k, v, ends, scale), True),
                   ("flex compiled", lambda q, k, v: flex_tree_attention(q, k, v, block_mask, scale), True),
                   ("flex compiled", lambda q, k, v: flex_tree_attention(q, k, v, block_mask, scale), False)]
        if length <= cfg["dense_max"]:
            mask = packed.dense_mask().to(device)

            def dense(q, k, v):
                return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale,
                                                      enable_gqa=True)
            kernels.insert(0, ("dense fp32", dense, True))
        ref = None
        for name, fn, backward in kernels:
            m = dict(T=length, kernel=name, **{"pass": "fwd+bwd" if backward else "fwd (no grad)"})
            if name == "flex compiled" and backward and not cuda:
                m["skipped"] = "torch has no flex attention backward on CPU"
            else:
                go = grad_out.float() if name == "dense fp32" else grad_out
                try:
                    o, grads, first = run(fn, q, k, v, go, backward)
                    later = [run(fn, q, k, v, go, backward)[2] for _ in range(cfg["repeats"])]
                    m |= dict(first_s=first, later_s=statistics.median(later))
                    if name == "flex compiled":
                        m["compile_s"] = first - m["later_s"]
                    if ref is None:
                        ref = (name, o, grads)
                    else:
                        m |= dict(reference=ref[0], err_out=err(o, ref[1]))
                        if grads is not None:
                            m["err_grads"] = [err(a, b) for a, b in zip(grads, ref[2])]
                    del o, grads
                except Exception as e:  # noqa: BLE001 - a kernel that fails is the finding; the others go on
                    m["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            m["graphs"] = counters["stats"]["unique_graphs"]
            record(out, "attention", m)
            print(f"attention: {m}", flush=True)
        del ref


# ---- part 2: one update at Qwen2.5-3B's shapes ------------------------------------------------------


def update(out: Path, cfg: dict) -> None:
    from bfspo.pipeline.shapes import config_path

    shape = "Qwen/Qwen2.5-3B-Instruct"
    if "narrow" in cfg:  # the rehearsal's: the model's config.json with narrower layers
        shape = work_dir() / "narrow"
        shape.mkdir(parents=True, exist_ok=True)
        (shape / "config.json").write_text(json.dumps(json.loads(config_path("Qwen/Qwen2.5-3B-Instruct").read_text())
                                                      | cfg["narrow"]))
    cmd = [sys.executable, "-m", "bench.bench_plan_memory", "--json", "--one-row", "--shape", str(shape),
           "--layers", str(cfg["layers"]), "--tokens", str(cfg["tokens"]), "--group", str(cfg["group"]),
           "--k", str(cfg["k"])]
    stream(cmd, lambda line: record(out, "update", json.loads(line)) if line.startswith("{") else print(line, end=""))


def stream(cmd: list[str], each) -> None:
    """Run `cmd`, handing each line of its stdout to `each` as it comes (its stderr goes to the log);
    exit with its status if it fails."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:
            each(line)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:3])}... exited with {proc.returncode}")


# ---- part 3: BFS-PO on the toy model ------------------------------------------------------------------

METRICS = ("timing/rollout_s", "timing/update_s", "timing/rollout_tok_s", "timing/train_tok_s", "timing/peak_mem_gb",
           "rollout/tokens_unique")


def work_dir() -> Path:
    """Where the parts write what is not a result (data, models, runs): $GPU_CHECK_WORK."""
    return Path(os.environ.get("GPU_CHECK_WORK", "/tmp/bfspo-gpu-check"))


def toy(out: Path, cfg: dict) -> None:
    work = work_dir()
    bfspo = [sys.executable, "-m", "bfspo.cli"]

    def stage(name, label, cmd) -> float:
        t = time.perf_counter()
        subprocess.run(cmd, check=True)
        seconds = round(time.perf_counter() - t, 1)
        if not name.startswith("train"):
            record(out, "toy", {"stage": name, "label": label, "seconds": seconds})
        return seconds

    stage("data", f"{cfg['n_train']} SFT rows", [*bfspo, "toy", "data", "--out-dir", str(work / "data"),
                                                 "--n-train", str(cfg["n_train"]), "--n-rl", str(cfg["n_rl"]),
                                                 "--n-eval", "32"])
    stage("model", f"size {cfg['size']}, {cfg['sft_steps']} SFT steps",
          [*bfspo, "toy", "build", "--train", str(work / "data/train.jsonl"), "--out-dir", str(work / "model"),
           "--size", cfg["size"], "--steps", str(cfg["sft_steps"]), "--warmup", "10"])
    run_dir = work / "runs" / "bfspo"
    tokens = cfg["micro_batch_tokens"]
    seconds = stage("train bfspo", "", [
        *bfspo, "train", "--output-dir", str(run_dir), "--set", f"model={work / 'model'}",
        f"train_data={work / 'data/rl_train.jsonl'}", "benchmark=toy", "budget=160", "k=3", f"steps={cfg['steps']}",
        f"train_batch={cfg['chains']}", f"mini_batch={cfg['mini']}", "lr=1e-3", "save_every=1000",
        f"micro_batch_tokens={tokens}", f"attention_bucket={tokens}"])  # one bucket: one flex compile
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    medians = {m: statistics.median(r[m] for r in rows) for m in METRICS if all(m in r for r in rows)}
    record(out, "toy", {"stage": f"train BFS-PO (K = 3, {cfg['chains']} chains a step, one bucket of {tokens})",
                        "seconds": seconds, "steps": len(rows), "medians": medians})
    against = subprocess.run([sys.executable, "-m", "bench.plan_vs_run", str(run_dir)], check=True,
                             capture_output=True, text=True).stdout
    record(out, "toy", {"stage": "plan_vs_run", "text": against})


# ---- part 4: generation ------------------------------------------------------------------------------


def generation(out: Path, cfg: dict) -> None:
    table: list[str] = []

    def each(line: str) -> None:  # bench.common.print_table: each table starts with "### "
        if line.startswith("### ") and any(x.startswith("### ") for x in table):
            record(out, "generation", {"text": "".join(table)})
            table.clear()
        table.append(line)

    stream([sys.executable, "-m", "bench.bench_rollout", *cfg["args"]], each)
    record(out, "generation", {"text": "".join(table)})


# ---- the driver --------------------------------------------------------------------------------------


def probe(fn) -> str:
    """fn()'s answer, or "unknown" (with why): no probe of the environment can stop the check."""
    try:
        return str(fn()).strip() or "unknown"
    except Exception as e:  # noqa: BLE001 - git, nvidia-smi or a package missing is a finding, not a failure
        return f"unknown ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]})"


def environment() -> dict:
    """What the check ran on: every value a probe, "unknown" where it fails."""
    def command(*cmd):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout

    def version(name):
        return __import__(name).__version__

    def cuda_device():
        import torch

        if not torch.cuda.is_available():
            return f"CPU ({os.cpu_count()} cores)"
        props = torch.cuda.get_device_properties(0)
        return f"{props.name}, {props.total_memory / 2**30:.1f} GiB"

    env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "commit": probe(lambda: command("git", "rev-parse", "HEAD")),
           "device": probe(cuda_device),
           "driver": probe(lambda: command("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")),
           "torch CUDA": probe(lambda: __import__("torch").version.cuda), "python": platform.python_version()}
    env |= {name: probe(lambda name=name: version(name))
            for name in ("torch", "transformers", "peft", "accelerate", "tokenizers", "huggingface_hub")}
    env["not installed"] = probe(lambda: ", ".join(m for m in ABSENT_ON_IMAGE if importlib.util.find_spec(m) is None)
                                 or "none")
    return env


def run_part(part: str, limit: float, preset: str, out: Path) -> tuple[str, float]:
    """Run one part in a process group of its own, its output appended to logs.txt; kill the group at
    its limit. (status, seconds)"""
    t = time.perf_counter()
    with open(out / LOGS, "a") as log:
        log.write(f"\n===== {part} (limit {limit:.0f} s) =====\n")
        log.flush()
        proc = subprocess.Popen([sys.executable, "-m", "bench.gpu.gpu_check", "--part", part, "--preset", preset,
                                 "--out", str(out)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
            status = ("ok" if rc == 0 else f"killed by signal {-rc}" if rc < 0 else
                      f"failed (exit {rc}, see {LOGS})")
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = f"cut off at its limit of {limit:.0f} s (what it measured is below)"
    for tmp in out.glob(".*.tmp"):  # a write cut by the kill
        tmp.unlink()
    return status, time.perf_counter() - t


def run_one(out: Path, part: str, cfg: dict) -> None:
    """The child process of one part: say its process group (to kill it), then measure."""
    set_status(out, part, status="running", pid=os.getpid())
    globals()[part](out, cfg)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--preset", default="gpu", choices=sorted(PRESETS))
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS, help="which parts, in this order")
    p.add_argument("--total-s", type=float, help="time for all parts together (default: their limits' sum)")
    p.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # the child process of one part
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part:
        run_one(args.out, args.part, PRESETS[args.preset][args.part])
        return 0
    total_s = args.total_s or TOTAL_S[args.preset]
    start = time.perf_counter()
    shutil.rmtree(work_dir(), ignore_errors=True)  # a toy run found there would be resumed, not run
    for name in (RESULTS, SUMMARY, LOGS):
        (args.out / name).unlink(missing_ok=True)
    env = environment()
    with open(args.out / ENV, "a") as f:  # after bench/gpu/gpu_session.sh's line on the carried wheels
        f.write("".join(f"{k}: {v}\n" for k, v in env.items()))
    save(args.out, {"preset": args.preset, "env": env,
                    "parts": {part: {"status": "waiting", "measurements": []} for part in args.parts}})
    print("".join(f"{k}: {v}\n" for k, v in env.items()), flush=True)
    failed = False
    for part in args.parts:
        limit = min(PRESETS[args.preset][part]["limit"], total_s - (time.perf_counter() - start))
        if limit < 10:
            set_status(args.out, part, status="not run: the check's time is spent", seconds=0.0, limit_s=0.0)
            failed = True
        else:
            set_status(args.out, part, limit_s=round(limit))
            status, seconds = run_part(part, limit, args.preset, args.out)
            failed |= status != "ok"
            set_status(args.out, part, status=status, seconds=round(seconds, 1))
        print(f"{part}: {load(args.out)['parts'][part]['status']}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
