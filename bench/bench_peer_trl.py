"""The project's DAPO and BFS-PO (K = 3) against a peer, TRL's GRPOTrainer with the DAPO loss, and BFS-PO
as a TRL trainer (bfspo.integrations.trl), at equal work (issue 32, item 5; issue 40).

    python -m bench.bench_peer_trl --rounds 5 --steps 6 --warmup 2      # `make setup` installs TRL (the trl extra)

Every arm trains the same model on the same questions with the same G, questions per optimizer step,
budget, temperature, top_p, LoRA (r, alpha, dropout, modules), AdamW (lr, weight decay, no schedule),
gradient clipping and eps_low / eps_high, one optimizer step per generated batch, the same reward
(the project's verifier and Eq. 4 with Eq. 3's overlong term, computed by the same functions) and the
same device and thread count. The arms:

- `trl`: GRPOTrainer, loss_type "dapo", beta 0, transformers generation (vLLM hidden, see below);
- `dapo`, `bfspo`: `bfspo train` at K = 0 and K = 3 with their dynamic sampling (`filter: all_leaves`;
  each generation round asks for `--oversample` times the questions the batch still lacks, as the toy
  config does, until the batch is full of groups with signal);
- `dapo-all`, `bfspo-all`: the same with `filter: none` and `oversample: 1`: every group kept and
  exactly the batch's questions generated, as TRL does;
- `bfspo-trl`: BFSPOTrainer (TRL's engine, K = 3, `filter: none`) on the same one question per step as
  `bfspo-all`: TRL's generation (`generate` on the question's contexts, repeated G times), the
  training model's rescoring, Eq. 10 tree-packed; its reward is `verifier_reward`'s verdict turned into
  Eq. 4 with Eq. 3's paper window by the trainer, as the project's arms compute it.

A batch counts prompts (`batch_unit: prompts`), so BFS-PO, which fills a batch with as many chains as
DAPO's through whole trees (Sec. 4.2), trains on one tree of (K + 1) G = 32 chains per step where DAPO
and TRL train on 4 groups of 8: equal chains per optimizer step, a quarter of the questions.

Each run is its own process, so its peak RSS (os.wait4) is its own; the arms run in interleaved rounds
(each round every arm once, in an order rotated per round; seed = round), so a load change on shared
cores hits every arm alike. Per run: the median seconds per optimizer step after `--warmup` steps, the
tokens generated per step and their rate (generated tokens over step time), and peak RSS. The table
gives per arm the median over rounds with [min, max], and each arm's time per step over TRL's in the
same round. bench/RESULTS.md holds a measured table and the differences that remain.

On a GPU the same command runs: both sides take CUDA when torch sees it (`--device`), the model in
bfloat16 (bfspo.model_io.default_dtype, which the TRL arm loads through too), and each run also reports
torch's peak allocated GPU memory.

TRL is imported with the CPU vLLM build hidden (`sys.modules["vllm"] = None`): TRL 1.16 checks
`importlib.util.find_spec("vllm")`, which then answers None, so TRL neither imports vLLM nor offers it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import train_command

ROOT = Path(__file__).resolve().parents[1]
# arm -> (trainer, K, dynamic-sampling filter): "trl" runs in a TRL process (`trl_child`), "bfspo" is `bfspo train`
ARMS = {"trl": ("trl", 0, None), "dapo": ("bfspo", 0, "all_leaves"), "dapo-all": ("bfspo", 0, "none"),
        "bfspo": ("bfspo", 3, "all_leaves"), "bfspo-all": ("bfspo", 3, "none"), "bfspo-trl": ("trl", 3, "none")}


def hide_vllm() -> None:
    """Make `vllm` unimportable in this process before TRL is imported: importlib.util.find_spec
    returns None for a module set to None in sys.modules, and `import vllm` raises ImportError."""
    sys.modules["vllm"] = None


def shared_settings(args) -> dict:
    """The TrainConfig fields both sides get, by their project names."""
    from bfspo.algorithm.loss import EPS_HIGH, EPS_LOW

    return dict(model=args.model, train_data=args.data, benchmark=args.benchmark, group_size=args.group,
                batch_unit="prompts", train_batch=args.questions, mini_batch=args.questions, budget=args.budget,
                temperature=args.temperature, top_p=1.0, lr=args.lr, weight_decay=0.01, max_grad_norm=1.0,
                eps_low=EPS_LOW, eps_high=EPS_HIGH, lora_r=8, lora_alpha=16, lora_dropout=0.0, steps=args.steps,
                threads=args.threads, device=args.device, overlong=True, overlong_window="paper")


def project_command(args, arm: str, seed: int, out_dir: Path) -> list[str]:
    _, k, filter_ = ARMS[arm]
    settings = shared_settings(args) | dict(k=k, filter=filter_, seed=seed, engine="transformers",
                                            oversample=1.0 if filter_ == "none" else args.oversample,
                                            rollout_batch_size=max(64, (k + 1) * args.group * args.questions),
                                            save_every=args.steps, log_trees=0, val_every=0, wandb_mode="disabled")
    return train_command(settings, out_dir)


def project_result(out_dir: Path, on_gpu: bool) -> dict:
    """Per-step seconds, generated tokens and questions from the run's metrics.jsonl, and on a GPU its
    peak allocated memory (timing/peak_mem_gb, torch.cuda.max_memory_allocated there)."""
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"step_s": [r["timing/step_s"] for r in rows], "tokens": [r["rollout/tokens_generated"] for r in rows],
            "questions": [r["rollout/questions_generated"] for r in rows],
            "peak_gpu_gb": max(r["timing/peak_mem_gb"] for r in rows) if on_gpu else None}


def trl_child(args) -> int:
    """One run of a TRL arm (`args.trl_arm`: GRPOTrainer, or BFSPOTrainer at its K) in this process;
    writes {step_s, tokens, questions, peak_gpu_gb} to args.result."""
    hide_vllm()
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from bfspo.algorithm.rewards import sequence_reward
    from bfspo.device import resolve_device
    from bfspo.integrations.trl import BFSPOConfig, BFSPOTrainer, question_rows, verifier_reward
    from bfspo.model_io import load_model
    from bfspo.tasks.verify import is_correct
    from bfspo.training.config import LORA_TARGETS

    assert "vllm" not in sys.modules or sys.modules["vllm"] is None, "TRL imported vLLM"
    _, k, filter_ = ARMS[args.trl_arm]
    s = shared_settings(args)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    model, tokenizer = load_model(args.model, device=device)
    rows = question_rows(args.data, args.benchmark)
    tokens, questions, times = [], [], []

    def reward(completions, answer, completion_ids, **_):
        """Eq. 4 with Eq. 3 (the project's sequence_reward) on the project's verifier's verdict."""
        tokens.append(sum(len(ids) for ids in completion_ids))
        questions.append(len(completions) // args.group)
        return [sequence_reward(is_correct(args.benchmark, c[0]["content"], gold), len(ids), s["budget"],
                                s["overlong"], s["overlong_window"])
                for c, gold, ids in zip(completions, answer, completion_ids)]

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **kw):
            times.append(-time.perf_counter())

        def on_step_end(self, *a, **kw):
            times[-1] += time.perf_counter()

        def on_log(self, args_, state, control, logs=None, **kw):
            if k and logs and "rollout/tokens_unique" in logs:  # BFSPOTrainer: the step's generated trees
                tokens.append(logs["rollout/tokens_unique"])
                questions.append(logs["rollout/groups_kept"] + logs["rollout/groups_filtered"])

    # BFS-PO fills DAPO's chains per step with whole trees of (K + 1) G chains (Sec. 4.2), as the bfspo arms
    per_step = max(1, s["train_batch"] // (k + 1))
    common = dict(
        per_device_train_batch_size=per_step * s["group_size"], num_generations=s["group_size"],
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1, max_completion_length=s["budget"],
        temperature=s["temperature"], top_p=s["top_p"], top_k=0, learning_rate=s["lr"], lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=s["weight_decay"], max_grad_norm=s["max_grad_norm"], optim="adamw_torch",
        loss_type="dapo", beta=0.0, epsilon=s["eps_low"], epsilon_high=s["eps_high"], max_steps=s["steps"],
        logging_steps=1, save_strategy="no", report_to="none", seed=args.seed, data_seed=args.seed,
        # GRPOConfig's defaults that differ from the project's: gradient checkpointing on, bf16 on
        use_cpu=device.type == "cpu", gradient_checkpointing=False, bf16=False, fp16=False,
        disable_tqdm=True, use_vllm=False, dataloader_num_workers=0)
    lora = LoraConfig(r=s["lora_r"], lora_alpha=s["lora_alpha"], lora_dropout=s["lora_dropout"],
                      target_modules=list(LORA_TARGETS), task_type="CAUSAL_LM")
    with tempfile.TemporaryDirectory() as tmp:
        if k:
            config = BFSPOConfig(output_dir=tmp, k=k, filter=filter_, overlong=s["overlong"],
                                 overlong_window=s["overlong_window"], **common)
            trainer = BFSPOTrainer(model=model, reward_funcs=verifier_reward(args.benchmark), args=config,
                                   train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                                   peft_config=lora, callbacks=[StepTimer()])
        else:
            config = GRPOConfig(output_dir=tmp, scale_rewards="group", **common)
            trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=Dataset.from_list(rows),
                                  processing_class=tokenizer, peft_config=lora, callbacks=[StepTimer()])
        trainer.train()
    peak_gpu = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    Path(args.result).write_text(json.dumps({"step_s": times, "tokens": tokens, "questions": questions,
                                             "peak_gpu_gb": peak_gpu}))
    return 0


def on_gpu(device: str) -> bool:
    """Whether the runs take CUDA (bfspo.device.resolve_device's choice, which both sides make)."""
    from bfspo.device import resolve_device

    return resolve_device(device).type == "cuda"


def run_arm(args, arm: str, seed: int, work: Path) -> dict:
    """One run of `arm` in its own process: its steps, tokens and peak RSS (os.wait4, this child only)."""
    out = work / f"{arm}_s{seed}"
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
                        "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1",
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    in_trl = ARMS[arm][0] == "trl"
    if in_trl:
        result = out.with_suffix(".json")
        cmd = [sys.executable, "-m", "bench.bench_peer_trl", "--trl-child", "--trl-arm", arm, "--result", str(result),
               "--seed", str(seed), *child_args(args)]
    else:
        cmd = project_command(args, arm, seed, out)
    log = out.with_suffix(".log")
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{arm} (seed {seed}) failed; its log: {log}\n" + log.read_text()[-3000:])
    got = json.loads(result.read_text()) if in_trl else project_result(out, on_gpu(args.device))
    return got | {"peak_rss_gb": usage.ru_maxrss / 2**20}


def child_args(args) -> list[str]:
    return ["--model", args.model, "--data", args.data, "--benchmark", args.benchmark, "--group", str(args.group),
            "--questions", str(args.questions), "--budget", str(args.budget), "--temperature", str(args.temperature),
            "--lr", str(args.lr), "--steps", str(args.steps), "--threads", str(args.threads), "--device", args.device]


def summarise(run: dict, warmup: int) -> dict:
    """A run's median seconds per optimizer step after warm-up, tokens and questions per step, tokens/s."""
    step_s, tokens, questions = run["step_s"][warmup:], run["tokens"], run["questions"]
    steps = len(run["step_s"])
    return {"s_per_step": statistics.median(step_s), "tokens_per_step": sum(tokens) / steps,
            "questions_per_step": sum(questions) / steps,
            "tok_s": sum(tokens[warmup:]) / sum(step_s) if len(tokens) == steps else sum(tokens) / sum(run["step_s"]),
            "peak_rss_gb": run["peak_rss_gb"], "peak_gpu_gb": run["peak_gpu_gb"]}


def spread(xs: list[float]) -> str:
    """median [min, max], to 3 significant digits (whole numbers from 100 on)."""
    def fmt(x: float) -> str:
        return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"
    return f"{fmt(statistics.median(xs))} [{fmt(min(xs))}, {fmt(max(xs))}]"


def table(summaries: dict[str, list[dict]]) -> str:
    header = ["arm", "s / optimizer step", "vs TRL (same round)", "generated tokens / step", "questions / step",
              "generated tokens / s", "peak RSS GB"]
    gpu = any(s["peak_gpu_gb"] is not None for runs in summaries.values() for s in runs)
    header += ["peak GPU GB"] if gpu else []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for arm, runs in summaries.items():
        ratios = [r["s_per_step"] / t["s_per_step"] for r, t in zip(runs, summaries["trl"])]
        cells = [arm, spread([r["s_per_step"] for r in runs]), spread(ratios),
                 spread([r["tokens_per_step"] for r in runs]), spread([r["questions_per_step"] for r in runs]),
                 spread([r["tok_s"] for r in runs]), spread([r["peak_rss_gb"] for r in runs])]
        cells += [spread([r["peak_gpu_gb"] for r in runs])] if gpu else []
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="results/toy/model", help="the toy model (bfspo toy build) or any causal LM")
    p.add_argument("--data", default="results/toy/data/rl_train.jsonl", help="prepared questions (id, question, answer)")
    p.add_argument("--benchmark", default="toy", help="prompt and verifier of the questions")
    p.add_argument("--group", type=int, default=8, help="G: answers per question (and per expansion)")
    p.add_argument("--questions", type=int, default=4, help="questions of G answers per optimizer step (DAPO, TRL)")
    p.add_argument("--budget", type=int, default=160, help="most generated tokens per answer")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--oversample", type=float, default=1.5,
                   help="dynamic sampling's questions per question missing, of the filtered arms (the toy config's)")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps per run")
    p.add_argument("--warmup", type=int, default=2, help="first steps of each run left out of its time per step")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds: each runs every arm once")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--threads", type=int, default=1, help="torch threads of every run")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--work-dir", help="where the runs' directories and logs go (default: a temporary one)")
    p.add_argument("--json", help="also write every run's numbers here")
    p.add_argument("--trl-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--trl-arm", default="trl", choices=[a for a, spec in ARMS.items() if spec[0] == "trl"],
                   help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.trl_child:
        return trl_child(args)
    if "trl" not in args.arms:
        p.error("--arms must include trl: every ratio is against it")
    if args.warmup >= args.steps:
        p.error(f"--warmup ({args.warmup}) must leave steps of --steps ({args.steps}) to time")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        runs: dict[str, list[dict]] = {arm: [] for arm in args.arms}
        for r in range(args.rounds):
            order = args.arms[r % len(args.arms):] + args.arms[:r % len(args.arms)]
            for arm in order:
                t = time.perf_counter()
                runs[arm].append(run_arm(args, arm, seed=r, work=work))
                print(f"round {r + 1}/{args.rounds} {arm}: {time.perf_counter() - t:.0f} s, "
                      f"load average {os.getloadavg()[0]:.1f}", flush=True)
                if args.json:  # after every run, so an interrupted benchmark keeps its finished runs
                    Path(args.json).write_text(json.dumps(runs, indent=1))
    summaries = {arm: [summarise(run, args.warmup) for run in rs] for arm, rs in runs.items()}
    print(f"\n{args.rounds} rounds x {args.steps} optimizer steps (first {args.warmup} left out of the time), "
          f"G = {args.group}, {args.questions} questions of G per step, budget {args.budget}, {args.threads} thread(s), "
          f"device {args.device}; median [min, max] over rounds\n")
    print(table(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
