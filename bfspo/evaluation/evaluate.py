"""`bfspo evaluate`: score a model (optionally with a LoRA adapter) on one prepared benchmark split.

The protocol is the paper's (TokenSkip's): the model's chat template, greedy decoding within the
benchmark's token budget, except where the registry asks for several samples at a temperature
(AIME'25: 32 samples at T=1, scored by their mean accuracy). Length is the number of generated
tokens, reasoning and answer, counted with the model's tokenizer up to and including EOS.

A response cut off by the budget (`finished` false) is scored in two ways. `accuracy`, which the
tables use, scores it as written: TokenSkip's evaluation, whose protocol the paper adopts for
GSM8K, MATH-500 and MMLU-STEM, passes every output to its answer extraction (the last \\boxed{},
else "the answer is", else the last number) whether generation stopped at EOS or at
max_new_tokens; its generation loop records which outputs finished but the scoring never reads it
(TokenSkip's evaluation.py and eval/utils.py). `accuracy_cutoff_wrong` counts every cut-off
response wrong, as training does (bfspo.algorithm.search.add_completions). For AIME'25 and
Minerva-Math, which TokenSkip does not evaluate, no protocol is stated; the tables read them as
written too, so that every column is scored one way.

Questions are generated in fixed batches of --batch-size sequences, each batch with its own seed
(the sampling seed plus the batch's first position), and each batch's samples are appended to
DIR/samples.partial.jsonl as soon as they are scored: an interrupted evaluation, rerun with the same
settings, generates only the batches not yet on file and ends with the same samples and summary as
an uninterrupted one (bfspo.evaluation.progress). Then DIR/samples.jsonl (one row per response) and
DIR/summary.json, last, are written, each atomically. summary.json records the settings it was
made with, the SHA-256 of samples.jsonl's bytes (`samples_sha256`) and the code that scored it
(`code`, bfspo.code_identity: not a setting, since other code is named by `snakemake -n` and the
tables, never redone silently): a rerun with the same settings (and --meta), whose samples.jsonl
still holds those bytes, says it is already done and exits 0; one whose samples.jsonl is gone,
truncated or rewritten evaluates again, and a
rerun with other settings moves the finished files, with their W&B run, to a new DIR/previous/<n>/
(bfspo.history; after its input checks pass, before it generates anything), so that they never
sit beside a partial output of other settings looking finished, and the new evaluation gets a W&B
run of its own. One process at a time may write DIR (bfspo.runlock).

What is scored is what is fingerprinted: the data file is read once, its bytes hashed and parsed,
and the model, tokenizer and adapter files must be unchanged from their fingerprint to the end of
the evaluation (bfspo.fingerprint), or no summary is written.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from bfspo import code_identity, console, fingerprint, history, runlock
from bfspo.device import resolve_device
from bfspo.errors import BfspoError
from bfspo.evaluation.metrics import bootstrap_ci
from bfspo.evaluation.progress import Progress
from bfspo.evaluation.protocol import protocol_of
from bfspo.io import read_json, remove_temporaries, write_json, write_jsonl
from bfspo.model_io import check_adapter, check_weights, load_config, load_model, load_tokenizer, read_adapter_config
from bfspo.rollout import make_engine
from bfspo.rollout.base import Completion, RolloutEngine, needed_model_len
from bfspo.tasks.benchmarks import Benchmark, get_benchmark
from bfspo.tasks.prompts import prompt_ids
from bfspo.tasks.rows import read_rows
from bfspo.tasks.verify import extract_answer, is_correct, timeouts


def parse_meta(items: list[str]) -> dict[str, str]:
    meta = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BfspoError(f"--meta expects KEY=VALUE, got {item!r}")
        meta[key] = value
    return meta


def read_questions(path: Path, benchmark: Benchmark, limit: int | None = None,
                   max_positions: int | None = None, data: bytes | None = None) -> list[dict]:
    """The prepared rows of `path` (the first `limit`), read by `bfspo.tasks.rows.read_rows` (the rule
    training follows too) from `data`, the file's fingerprinted bytes, if given; each of the
    benchmark being evaluated where the row names one."""
    rows = read_rows(path, limit, max_positions, benchmark.name, data=data)
    if not rows:
        raise BfspoError(f"{path}: no questions")
    return rows


def check_lengths(rows: list[dict], prompts: list[list[int]], budget: int, max_positions: int | None) -> None:
    """Every prompt plus its budget must fit the model's positions."""
    if max_positions is None:
        return
    for row, prompt in zip(rows, prompts):
        if len(prompt) + budget > max_positions:
            raise BfspoError(f"question {row['id']!r}: prompt of {len(prompt)} tokens plus budget {budget} exceeds "
                             f"the model's {max_positions} positions" + ("" if len(prompt) >= max_positions
                                                                         else "; lower --budget"))


def question_batches(prompts: list[list[int]], size: int) -> list[list[int]]:
    """Question indices in generation batches of `size`: longest prompt first, so that a batch holds
    prompts of similar length (little padding). The batches depend only on the prompts and `size`,
    so a resumed evaluation generates each batch exactly as an uninterrupted one would."""
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    return [order[i:i + size] for i in range(0, len(order), size)]


def score(benchmark: Benchmark, rows: list[dict], results: list[list[Completion]], tokenizer) -> list[dict]:
    """One samples.jsonl row per response: its text, extracted answer, correctness and length, and
    whether its verification missed its deadline (then it is scored wrong)."""
    samples = []
    for row, completions in zip(rows, results):
        gold = row["answer"]
        for index, c in enumerate(completions):
            text = tokenizer.decode(c.token_ids, skip_special_tokens=True)
            missed = timeouts()
            samples.append({"id": row["id"], "sample": index, "response": text,
                            "extracted": extract_answer(benchmark, text), "gold": gold,
                            "correct": is_correct(benchmark, text, gold), "num_tokens": len(c.token_ids),
                            "finished": c.finished, "verify_timeout": timeouts() > missed})
    return samples


def summarize(samples: list[dict], n_questions: int, seed: int = 0) -> dict:
    """Accuracy (percent) and length: per-question means over samples, then the mean over questions,
    each with a 95% bootstrap interval that resamples questions. `accuracy` scores cut-off responses
    as written (the tables' reading), `accuracy_cutoff_wrong` counts them wrong (module doc)."""
    per_q = len(samples) // n_questions

    def per_question(values) -> np.ndarray:
        return np.array(values, dtype=float).reshape(n_questions, per_q).mean(1)

    correct = per_question([s["correct"] for s in samples]) * 100
    strict = per_question([s["correct"] and s["finished"] for s in samples]) * 100
    length = per_question([s["num_tokens"] for s in samples])
    return {"n_questions": n_questions, "samples_per_question": per_q,
            "accuracy": float(correct.mean()), "accuracy_ci": list(bootstrap_ci(correct, seed=seed)),
            "accuracy_cutoff_wrong": float(strict.mean()),
            "accuracy_cutoff_wrong_ci": list(bootstrap_ci(strict, seed=seed)),
            "avg_length": float(length.mean()), "avg_length_ci": list(bootstrap_ci(length, seed=seed)),
            "finished_fraction": float(np.mean([s["finished"] for s in samples])),
            "verify_timeouts": sum(bool(s.get("verify_timeout")) for s in samples)}


def build_engine(args, tokenizer, max_model_len: int) -> RolloutEngine:
    """The --engine engine; vLLM's holds sequences of `max_model_len` tokens (the longest prompt plus the
    budget: bfspo.rollout.base.needed_model_len), so that its KV cache is sized for what is asked."""
    if args.engine == "vllm":
        if args.adapter is not None:
            check_adapter(args.adapter, args.model)
        check_weights(args.model)
        return make_engine("vllm", None, tokenizer, model_path=args.model, adapter=args.adapter,
                           max_num_seqs=args.max_num_seqs, gpu_memory_utilization=args.gpu_memory_utilization,
                           max_model_len=max_model_len, seed=args.seed, per_request_seeds=args.per_request_seeds)
    model, _ = load_model(args.model, args.adapter, device=resolve_device(args.device))
    return make_engine("transformers", model, tokenizer, batch_size=args.batch_size)


def log_to_wandb(summary: dict, samples: list[dict], args) -> None:
    """One eval run: what was evaluated as its config (`run_config`), accuracy, length and their
    intervals in its W&B summary, and the first --wandb-samples responses as a table."""
    import pandas as pd  # only W&B logging needs pandas (a GPU machine may lack it: bench/gpu/gpu_check.py)
    import wandb

    from bfspo import tracking

    config = run_config(summary)
    run = tracking.start(args.out_dir, config, project=args.wandb_project, group=args.wandb_group,
                         job_type="eval", name=args.run_name or args.out_dir.name, mode=args.wandb_mode,
                         tags=tracking.run_tags(config | {"wandb_tags": args.wandb_tags}))
    if run is not None:
        run.summary.update(eval_summary(summary))
        shown = pd.DataFrame(samples[:args.wandb_samples],
                             columns=["id", "sample", "correct", "num_tokens", "finished", "extracted", "gold", "response"])
        run.log({"eval/samples": wandb.Table(dataframe=shown)})
    tracking.finish(run)


def run_config(summary: dict) -> dict:
    """An eval run's W&B config: the model, data and protocol evaluated, and the workflow's names
    typed as in a training run's config (`seed` the training seed, an int; `tables` a list;
    `method_key`); the results go to the run's summary (`eval_summary`), not here."""
    meta = dict(summary["meta"])
    seed = meta.pop("seed", None)
    try:
        seed = None if seed in (None, "") else int(seed)
    except ValueError:
        raise BfspoError(f"--meta seed={seed}: the training seed must be an integer") from None
    tables = [t for t in meta.pop("tables", "").split(",") if t]
    protocol = {k: summary[k] for k in ("benchmark", "model", "adapter", "data", "budget", "temperature", "engine")}
    return protocol | {"samples": summary["samples_per_question"], "eval_seed": summary["seed"]} | meta | {
        "method_key": meta.get("method"), "seed": seed, "tables": tables}


def eval_summary(summary: dict) -> dict:
    """The `eval/` keys of an evaluation run's W&B summary: accuracy and length with their 95% intervals."""
    out = {}
    for key in ("accuracy", "accuracy_cutoff_wrong", "avg_length"):
        out[f"eval/{key}"] = summary[key]
        out[f"eval/{key}_ci_low"], out[f"eval/{key}_ci_high"] = summary[f"{key}_ci"]
    out |= {f"eval/{k}": summary[k] for k in ("finished_fraction", "n_questions", "samples_per_question",
                                              "generated_tokens_per_s", "verify_timeouts")}
    return out


def run(args) -> int:
    """`bfspo evaluate` once its arguments are checked (bfspo/evaluation/cli.py)."""
    resolve_device(args.device)  # a GPU job without CUDA stops here, within seconds
    with runlock.hold(args.out_dir, "evaluate"):
        return evaluate(args)


def samples_intact(out_dir: Path, summary: dict) -> bool:
    """Whether out_dir/samples.jsonl holds the bytes that `summary` recorded (`samples_sha256`)."""
    path = out_dir / "samples.jsonl"
    return path.is_file() and summary.get("samples_sha256") == fingerprint.file_sha256(path)


def earlier_summary(out_dir: Path) -> dict:
    """The summary.json of an earlier evaluation in out_dir ({} if there is none, or it is unreadable)."""
    try:
        return read_json(out_dir / "summary.json")
    except BfspoError:
        return {}


# An evaluation's own files in its folder, summary.json (what marks it finished) first; its partial
# output (bfspo.evaluation.progress) stays: it is resumed, or replaced when of other settings.
EVALUATION_FILES = ("summary.json", "samples.jsonl", "wandb_id.txt", "wandb")


def set_aside(out_dir: Path, settings: dict, meta: dict) -> None:
    """Move an earlier evaluation's files (`EVALUATION_FILES`, its W&B run with them) to a new
    out_dir/previous/<n>/, keeping every earlier one (bfspo.history), and say which settings differ.
    Nothing is moved without a summary.json or samples.jsonl: a W&B run alone is an attempt of the
    evaluation being resumed."""
    if not ((out_dir / "summary.json").exists() or (out_dir / "samples.jsonl").exists()):
        return
    old = earlier_summary(out_dir)
    recorded = old.get("settings")
    if isinstance(recorded, dict):
        differ = [k for k in settings if recorded.get(k) != settings[k]] + (["meta"] if old.get("meta") != meta else [])
        differ = ("other " + ", ".join(differ)) if differ else "a samples.jsonl that is not the one it recorded"
    else:
        differ = "settings it did not record"
    found = [name for name in EVALUATION_FILES if (out_dir / name).exists()]
    moved = history.set_aside(out_dir, found)
    listed = " and ".join([", ".join(found[:-1]), found[-1]] if len(found) > 1 else found)
    console.line(f"{out_dir}: moved the {listed} of an earlier evaluation ({differ}) to {moved}, where they stay "
                 "until you delete them; starting over")
    console.line(history.holdings_line(out_dir, "evaluation"))


def fingerprints(args, data: dict[str, str], stamps: dict[str, list[int]]) -> dict[str, str | None]:
    """What is evaluated, by content (bfspo.fingerprint): the base model's network and tokenizer, the
    adapter (None without one) and the data (`data`, the fingerprint of the bytes read); each model
    and adapter file's stamp goes to `stamps`. summary.json records them under `settings`, so that a
    table pairs an adapter only with the base model its run was trained on (bfspo.reporting.summaries)."""
    model = fingerprint.model_inputs(args.model, stamps)
    adapter = None
    if args.adapter is not None:
        read_adapter_config(args.adapter)  # a missing or non-adapter folder, named
        adapter = fingerprint.digest(fingerprint.folder_files(args.adapter, "adapter", stamps))
    return {"model": fingerprint.digest(model["model"]), "tokenizer": fingerprint.digest(model["tokenizer"]),
            "adapter": adapter, "data": fingerprint.digest(data)}


def evaluate(args) -> int:
    benchmark = get_benchmark(args.benchmark)
    meta = parse_meta(args.meta)
    budget, samples, temperature = protocol_of(args)
    moved = history.finish_set_aside(args.out_dir, lambda: [n for n in EVALUATION_FILES if (args.out_dir / n).exists()])
    if moved is not None:
        console.line(f"{args.out_dir}: finished moving an earlier evaluation to {moved}, which a kill had interrupted")
    remove_temporaries(args.out_dir)
    data, data_print = fingerprint.read_data(args.data)  # the bytes hashed are the bytes scored
    stamps: dict[str, list[int]] = {}
    settings = {"benchmark": benchmark.name, "model": args.model, "adapter": args.adapter, "data": str(args.data),
                "limit": args.limit, "budget": budget, "samples": samples, "temperature": temperature,
                "seed": args.seed, "batch_size": args.batch_size, "engine": args.engine,
                "fingerprints": fingerprints(args, data_print, stamps)}
    settings = json.loads(json.dumps(settings))
    earlier = earlier_summary(args.out_dir)
    if earlier.get("settings") == settings and earlier.get("meta") == meta and samples_intact(args.out_dir, earlier):
        print(f"{args.out_dir}: already done with these settings (summary.json); delete it to evaluate again")
        return 0
    max_positions = getattr(load_config(args.model), "max_position_embeddings", None)
    rows = read_questions(args.data, benchmark, args.limit, max_positions, data)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    tokenizer = load_tokenizer(args.model)
    prompts = [prompt_ids(tokenizer, benchmark, row["question"]) for row in rows]
    check_lengths(rows, prompts, budget, max_positions)
    engine = build_engine(args, tokenizer, needed_model_len([len(p) for p in prompts], budget))
    fingerprint.check_unchanged(stamps, "loading the model")
    batches = question_batches(prompts, max(1, args.batch_size // samples))
    set_aside(args.out_dir, settings, meta)
    batch_ids = [[rows[i]["id"] for i in batch] for batch in batches]
    progress = Progress(args.out_dir, settings, batch_ids)
    todo = [k for k in range(len(batches)) if k not in progress.done]
    bar = console.bar(total=sum(len(batches[k]) for k in todo) * samples, desc=f"evaluate {benchmark.name}", unit="seq")
    with bar:
        for n, k in enumerate(todo, 1):
            batch = batches[k]
            start = time.perf_counter()
            results = engine.generate([prompts[i] for i in batch], samples, budget, temperature=temperature,
                                      seed=args.seed + sum(len(b) for b in batches[:k]))
            seconds = time.perf_counter() - start
            scored_batch = score(benchmark, [rows[i] for i in batch], results, tokenizer)
            progress.record(k, batch_ids[k], seconds, scored_batch)
            bar.update(len(batch) * samples)
            console.line(f"evaluate {benchmark.name}: batch {n}/{len(todo)} | {len(batch)} questions x {samples} | "
                         f"acc {np.mean([s['correct'] for s in scored_batch]):.3f} | "
                         f"len {np.mean([s['num_tokens'] for s in scored_batch]):.1f} | {seconds:.1f} s")

    by_id = {row["id"]: [] for row in rows}
    for record in progress.done.values():
        for sample in record["samples"]:
            by_id[sample["id"]].append(sample)
    scored = [sample for row in rows for sample in by_id[row["id"]]]
    seconds = sum(record["seconds"] for record in progress.done.values())
    write_jsonl(args.out_dir / "samples.jsonl", scored)
    summary = {"benchmark": benchmark.name, "model": args.model, "adapter": args.adapter,
               **summarize(scored, len(rows), seed=args.seed), "budget": budget, "temperature": temperature,
               "engine": args.engine, "seed": args.seed, "data": str(args.data),
               "generation_seconds": round(seconds, 3),
               "generated_tokens_per_s": round(sum(s["num_tokens"] for s in scored) / max(seconds, 1e-9), 1),
               "samples_sha256": fingerprint.file_sha256(args.out_dir / "samples.jsonl"), "meta": meta,
               "settings": settings, "code": code_identity.identity("evaluate")}
    fingerprint.check_unchanged(stamps, "the evaluation")  # vLLM loads an adapter at its first request
    if args.wandb_project:
        log_to_wandb(summary, scored, args)
    write_json(args.out_dir / "summary.json", summary)
    progress.remove()
    if summary["verify_timeouts"]:
        print(f"{benchmark.name}: {summary['verify_timeouts']} verification(s) missed their deadline and were scored "
              "wrong (samples.jsonl: verify_timeout)")
    print(f"{benchmark.name}: accuracy {summary['accuracy']:.1f}% "
          f"[{summary['accuracy_ci'][0]:.1f}, {summary['accuracy_ci'][1]:.1f}] "
          f"({summary['accuracy_cutoff_wrong']:.1f}% with cut-off answers wrong), "
          f"avg length {summary['avg_length']:.1f} tokens ({len(rows)} questions x {samples}) -> {args.out_dir}")
    return 0
