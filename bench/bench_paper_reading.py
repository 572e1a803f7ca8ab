"""BFS-PO against DAPO with config/paper.yaml's trees and dynamic sampling, on the toy, on both engines
(issue 32, first "Done when"; issue 36).

paper.yaml trains DAPO at G = 16 and BFS-PO (its methods' `train: &trees`) at K = 3 with G = 4, so that a
tree is (K + 1) G = 16 chains, one DAPO group; both with `filter: first_samples`, oversample 3 and up to
10 generation rounds, and dynamic sampling's rule (`--samplings`: `fixed` asks 3x the need at every step,
`keep_rate` 1 / the keep rate seen so far, within 1x-3x: issue 47). That much is kept here. What differs
from paper.yaml: a batch of `--chains` chains (64) trained in one optimizer step (`train_batch` =
`mini_batch`, counted in chains), against paper.yaml's 8,192 chains in 16 mini-batches of 512; lr 2e-3,
against 1e-6; the toy model, its questions and a budget of 160. With 64 chains, 4 DAPO groups against 4
BFS-PO trees: equal questions and chains per optimizer step. Everything else (model, questions, budget,
lr, LoRA, steps, threads) is the same for both arms.

Arms, per engine (`transformers`, `vllm` with its default `rollout: auto`, streamed on vLLM) and
sampling rule:
  dapo   K = 0, G = 16;
  bfspo  K = 3, G = 4.
Rounds are interleaved: round r runs every engine x arm x rule once with seed r, in an order reversed every
other round, each `bfspo train` its own process (1 thread), so a load change on the shared cores hits
the arms alike. Per run, the median over steps 2.. (step 1 warms up) of what metrics.jsonl logs:
seconds per optimizer step (`timing/step_s`) and its parts: rollout (on vLLM it includes the
rescoring, the training side's forwards over the samples: `rescore s`), old log-probs (0: they come
with the rollout), update (on vLLM it includes the engine's sleep, wake-up and weight sync); then
generation rounds, questions and chains generated, tokens generated (every token the engine generated),
questions and tokens aborted (of those, the trees a step dropped: drawn after its batch's prefix in
the draw order, their questions given back), tokens trained (per chain, flat), the same per chain trained,
and unique (tree-packed, what the update forwards), tokens generated per token trained (packed), the
questions asked (generated, and on vLLM aborted), the ask rate used and the keep rate seen.
The table gives per engine, arm and rule the median over rounds; per engine and rule the paired ratio
DAPO / BFS-PO of seconds per step in each round: its median and [min, max]; and, with both rules, per
engine and arm the paired ratio keep_rate / fixed of seconds per step and of tokens generated.

    python -m bench.bench_paper_reading --model results/toy/model --data results/toy/data/rl_train.jsonl

vLLM starts worker processes by spawn: hence the `__main__` guard.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import add_toy_arguments, print_table, train_metrics

ENGINES = ("transformers", "vllm")
ARMS = {"dapo": (0, 16), "bfspo": (3, 4)}  # arm -> (K, G)
# column -> metrics.jsonl key, each the median over a run's steps after the first
KEYS = {"step s": "timing/step_s", "rollout s": "timing/rollout_s", "old logprobs s": "timing/old_logprobs_s",
        "update s": "timing/update_s", "rescore s": "timing/rescore_s", "gen rounds": "rollout/gen_rounds",
        "questions generated": "rollout/questions_generated", "chains generated": "rollout/chains_generated",
        "tokens generated": "rollout/tokens_generated", "questions aborted": "rollout/questions_aborted",
        "tokens aborted": "rollout/tokens_aborted", "tokens trained (flat)": "rollout/tokens_total",
        "tokens trained per chain": "per chain", "tokens trained (packed)": "rollout/tokens_unique",
        "generated / trained": "generated / trained", "questions asked": "rollout/questions_asked",
        "ask rate": "rollout/ask_rate", "keep rate": "rollout/keep_rate"}
SAMPLINGS = ("fixed", "keep_rate")  # bfspo.training.batching.SAMPLINGS


def value(row: dict, key: str) -> float:
    """A metrics.jsonl row's value of `key`, or of "per chain" (flat tokens trained per chain trained)
    or "generated / trained" (tokens generated per tree-packed token trained)."""
    if key == "per chain":
        return row["rollout/tokens_total"] / row["rollout/chains"]
    if key == "generated / trained":
        return row["rollout/tokens_generated"] / row["rollout/tokens_unique"]
    return row.get(key, 0.0)


def run(args, engine: str, arm: str, sampling: str, seed: int, out_dir: Path) -> dict:
    """{column: median over steps 2..} of one `bfspo train` of `arm` on `engine` under the dynamic-sampling
    rule `sampling`, plus its wall seconds."""
    k, group = ARMS[arm]
    values = dict(model=args.model, train_data=args.data, benchmark="toy", budget=args.budget, k=k, group_size=group,
                  train_batch=args.chains, mini_batch=args.chains, filter="first_samples", oversample=3.0,
                  sampling=sampling, max_gen_rounds=10, lr=2e-3, steps=args.steps, save_every=args.steps, threads=1,
                  log_trees=0, val_every=0, seed=seed, engine=engine, wandb_mode="disabled")
    start = time.perf_counter()
    rows = train_metrics(values, out_dir)[1:]
    out = {column: statistics.median(value(r, key) for r in rows) for column, key in KEYS.items()}
    out["wall s"] = time.perf_counter() - start
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_toy_arguments(p)
    p.add_argument("--chains", type=int, default=64, help="chains per batch and per optimizer step")
    p.add_argument("--budget", type=int, default=160)
    p.add_argument("--steps", type=int, default=3, help="steps per run (the first is not counted)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--samplings", nargs="+", default=list(SAMPLINGS), choices=SAMPLINGS,
                   help="dynamic sampling's rules (train.sampling), each an arm of its own")
    args = p.parse_args()
    runs = {(engine, arm, rule): [] for engine in args.engines for arm in ARMS for rule in args.samplings}
    order = list(runs)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for engine, arm, rule in order if r % 2 == 0 else order[::-1]:
                result = run(args, engine, arm, rule, r, Path(tmp) / f"{engine}-{arm}-{rule}-{r}")
                runs[engine, arm, rule].append(result)
                print(f"round {r} {engine} {arm} {rule}: " + ", ".join(f"{c} {v:.3g}" for c, v in result.items()),
                      flush=True)
    columns = list(KEYS) + ["wall s"]
    print_table(f"BFS-PO (K = 3, G = 4) against DAPO (G = 16), paper.yaml's trees and dynamic sampling (first_samples, "
                f"oversample 3) on the toy: {args.chains} chains in one optimizer step per batch (paper.yaml: 8,192 "
                f"in 16 mini-batches), lr 2e-3 (paper.yaml: 1e-6), budget {args.budget}; medians over {args.rounds} "
                f"rounds of the per-run median over steps 2-{args.steps}",
                ["engine", "arm", "sampling", *columns],
                [[engine, arm, rule, *(statistics.median(x[c] for x in results) for c in columns)]
                 for (engine, arm, rule), results in runs.items()])
    print_table("paired ratio DAPO / BFS-PO of seconds per optimizer step (> 1: BFS-PO faster)",
                ["engine", "sampling", "median", "[min, max]", "per round", "rollout s ratio (median)"],
                [[engine, rule, *paired(runs[engine, "dapo", rule], runs[engine, "bfspo", rule])]
                 for engine in args.engines for rule in args.samplings])
    if len(args.samplings) == 2:
        print_table("paired ratio keep_rate / fixed (< 1: the keep-rate rule is cheaper)",
                    ["engine", "arm", "step s: median", "[min, max]", "per round", "rollout s (median)",
                     "tokens generated (median)"],
                    [[engine, arm, *paired(runs[engine, arm, "keep_rate"], runs[engine, arm, "fixed"]),
                      statistics.median(a["tokens generated"] / b["tokens generated"]
                                        for a, b in zip(runs[engine, arm, "keep_rate"], runs[engine, arm, "fixed"]))]
                     for engine in args.engines for arm in ARMS])


def paired(a: list[dict], b: list[dict]) -> list:
    """The per-round ratios a / b of seconds per step: median, [min, max], each; and of rollout seconds, the median."""
    ratios = [x["step s"] / y["step s"] for x, y in zip(a, b)]
    rollout = [x["rollout s"] / y["rollout s"] for x, y in zip(a, b)]
    return [statistics.median(ratios), f"[{min(ratios):.3g}, {max(ratios):.3g}]", " ".join(f"{x:.3g}" for x in ratios),
            statistics.median(rollout)]


if __name__ == "__main__":
    main()
