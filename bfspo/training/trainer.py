"""`bfspo train`: DAPO and BFS-PO with LoRA, one model on one training set.

Each step (one training batch):
1. rollout: build one search tree per question (Algorithm 1; K = 0 is DAPO's group of G), score
   the leaves with the verifier, drop trees without signal (dynamic sampling, Eq. 2's constraint,
   on all leaves or on the first answers before the search: `filter`, docs/algorithm.md),
   asking for the questions the batch needs at the keep rate seen so far (`sampling`), or oversampling
   them `oversample` times, and repeating for at most `max_gen_rounds` rounds until the batch holds
   `train_batch_chains` complete chains (Sec. 4.2: BFS-PO uses as many chains as DAPO uses
   sequences; bfspo/training/batching.py);
2. rewards (Eq. 3-4, 8) and advantages (Eq. 9, or Eq. 1 for DAPO and the global variant);
3. the old log-probs are the trees' own, fixed at the rollout: the transformers engine's (the
   trained model itself), or the training side's rescoring of vLLM's samples, the same forward
   that gives the entropies for backtracking (docs/algorithm.md, "Old log-probs");
4. `train_batch_chains / mini_batch_chains` optimizer steps, each on a mini-batch of whole trees,
   with the clipped token-mean objective over the unique tree tokens (Eq. 10), accumulated over
   micro-batches of at most `micro_batch_tokens` tokens.

The run directory (config.json, inputs.json, metrics.jsonl, trees/, checkpoint/, adapter/ and,
written last, done.json) and its lifecycle are bfspo/training/run_dir.py's: running the same command
again resumes from the last checkpoint, or says that the run is finished; if the inputs changed
since, the old run moves to a new previous/<n>/ once the new inputs have loaded, and the run starts
over.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import random
import resource
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bfspo import code_identity, console, fingerprint, model_io, runlock
from bfspo.algorithm.advantages import assign_advantages, assign_rewards, keep_tree
from bfspo.algorithm.packing import n_entries
from bfspo.algorithm.search import build_trees
from bfspo.device import resolve_device
from bfspo.errors import BfspoError
from bfspo.io import append_line, write_json
from bfspo.rollout.base import needed_model_len
from bfspo.rollout.rescore import RescoredEngine
from bfspo.rollout.streamed import StreamedSearch, resolve_rollout
from bfspo.training import batching, checkpoint, dist, step_metrics, validation
from bfspo.training.accumulate import minibatch_backward
from bfspo.training.batching import minibatch_plan
from bfspo.training.config import TrainConfig
from bfspo.training.nonfinite import step_if_finite
from bfspo.training.run_dir import Start, prepare_run_dir, run_inputs, set_aside, trim_metrics, write_trees
from bfspo.training.samples import sample_table


@dataclass
class Question:
    id: str
    prompt_ids: list[int]
    gold: str


def load_questions(cfg: TrainConfig, tokenizer, max_positions: int | None, split: str = "train",
                   data: bytes | None = None) -> list[Question]:
    """Tokenised prompts of the training set (its first `cfg.limit`, if set), or with split "val" of
    the held-out set (its first `cfg.val_questions`); rows are read by `bfspo.tasks.rows.read_rows`
    (the rule evaluation follows too) from `data`, the file's bytes that the run fingerprinted, if
    given. An empty set or a prompt with no room for the budget is an error."""
    from bfspo.tasks.benchmarks import get_benchmark
    from bfspo.tasks.prompts import prompt_ids
    from bfspo.tasks.rows import read_rows

    path, benchmark, limit = ((cfg.train_data, cfg.benchmark, cfg.limit) if split == "train"
                              else (cfg.val_data, cfg.val_benchmark or cfg.benchmark, cfg.val_questions))
    get_benchmark(benchmark)
    questions = []
    for row in read_rows(path, limit or None, max_positions, data=data):
        ids = prompt_ids(tokenizer, benchmark, row["question"])
        if max_positions is not None and len(ids) + cfg.budget > max_positions:
            raise BfspoError(f"{path}: question {row['id']!r}: the prompt ({len(ids)} tokens) plus the budget "
                             f"({cfg.budget}) exceed the model's {max_positions} positions")
        questions.append(Question(row["id"], ids, row["answer"]))
    if not questions:
        raise BfspoError(f"{path}: no {'training' if split == 'train' else 'validation'} questions")
    return questions


def peak_memory_gb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


class Trainer:
    """Holds the model, optimizer, engine and data cursor of one run; `fit()` runs it to the end."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, train_data: bytes | None = None):
        """`train_data`: the training file's bytes that the run fingerprinted (read from the file if None)."""
        from peft import LoraConfig, get_peft_model

        from bfspo.rollout import make_engine

        self.cfg, self.run_dir = cfg, run_dir
        device = resolve_device(cfg.device)
        self.rank, self.world = dist.setup(cfg.collective_timeout_min, device)
        self.rank_chains = cfg.rank_chains(self.world)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        if device.type == "cuda" and self.world > 1:
            device = torch.device("cuda", torch.cuda.current_device())
        base, self.tokenizer = model_io.load_model(cfg.model, device=device)
        if cfg.gradient_checkpointing:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            base.enable_input_require_grads()
        lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules=list(cfg.lora_target_modules), task_type="CAUSAL_LM")
        try:
            self.model = get_peft_model(base, lora)
        except ValueError as e:
            raise BfspoError(f"LoRA: {e}") from None
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        max_positions = getattr(base.config, "max_position_embeddings", None)
        self.questions = load_questions(cfg, self.tokenizer, max_positions, data=train_data)
        self.val_questions = load_questions(cfg, self.tokenizer, max_positions, "val") if cfg.val_every else []
        if cfg.engine == "vllm":  # make_engine rescores vLLM's rollouts on the training side (RescoredEngine)
            self.engine = make_engine(
                "vllm", self.model, self.tokenizer, model_path=cfg.model, max_num_seqs=cfg.max_num_seqs,
                tensor_parallel_size=cfg.tensor_parallel_size, gpu_memory_utilization=cfg.gpu_memory_utilization,
                max_model_len=needed_model_len([len(q.prompt_ids) for q in self.questions], cfg.budget),
                seed=int(np.random.SeedSequence([cfg.seed, self.rank]).generate_state(1)[0]),
                per_request_seeds=cfg.per_request_seeds, sleep_mode=True, micro_batch_tokens=cfg.micro_batch_tokens,
                attention=cfg.tree_attention, bucket=cfg.attention_bucket)
        else:
            self.engine = make_engine("transformers", self.model, self.tokenizer, batch_size=cfg.rollout_batch_size)
        self.rollout_kind = resolve_rollout(cfg.rollout, cfg.engine)
        self.step, self.nonfinite, self.empty_steps, self.tokens_seen = 0, 0, 0, 0
        self.cursors = [0] * self.world  # position of each rank in its share of the data order
        self.keep_rate = batching.KeepRate()  # dynamic sampling's keep rate so far (`sampling: keep_rate`)
        self.wandb_logged = 0  # the last step an earlier attempt sent to the W&B run (tracking.last_logged_step)

    # --- data -----------------------------------------------------------------------------------

    def next_questions(self, n: int) -> list[Question]:
        """The next n questions of this rank's share of the seeded data order (one epoch after another)."""
        share = len(self.questions) // self.world or 1
        out = []
        for _ in range(n):
            epoch, pos = divmod(self.cursors[self.rank], share)
            order = np.random.default_rng([self.cfg.seed, epoch]).permutation(len(self.questions))
            out.append(self.questions[order[(pos * self.world + self.rank) % len(self.questions)]])
            self.cursors[self.rank] += 1
        return out

    def scorer(self, q: Question):
        from bfspo.tasks.verify import is_correct

        def score(ids: list[int]) -> bool:
            return is_correct(self.cfg.benchmark, self.tokenizer.decode(ids, skip_special_tokens=True), q.gold)
        return score

    # --- one step -------------------------------------------------------------------------------

    def step_seed(self) -> int:
        """The search seed of this step on this rank; its trees' samples are seeded by it and their
        places in the step's draw order (bfspo.algorithm.search)."""
        return (self.cfg.seed * 1_000_003 + self.step) * 65536 + self.rank * 128

    def label(self, q: Question, tree, round_: int) -> None:
        """Record in the tree's meta where it comes from: its question, step, round and rank."""
        tree.meta.update(question_id=q.id, step=self.step, round=round_, rank=self.rank)

    def generate(self, n: int, round_: int, start: int) -> list:
        """The scored trees (Algorithm 1) of the next n questions, in one generation round (`batching.fill`)
        of the step whose questions start at data cursor `start`: each tree is seeded by its place in
        the step's draw order, so that it does not depend on the round that drew it."""
        cfg = self.cfg
        first_place = self.cursors[self.rank] - start
        qs = self.next_questions(n)
        trees = build_trees(self.engine, [q.prompt_ids for q in qs], [self.scorer(q) for q in qs],
                            group_size=cfg.group_size, k=cfg.k, budget=cfg.budget, selection=cfg.selection,
                            temperature=cfg.temperature, top_p=cfg.top_p, seed=self.step_seed(),
                            filter=cfg.filter, first_place=first_place)
        for q, tree in zip(qs, trees):
            self.label(q, tree, round_)
        return trees

    def add_question(self, search: StreamedSearch) -> None:
        """Plant the next question's tree in the streamed search (`batching.fill_streamed`)."""
        q = self.next_questions(1)[0]
        self.label(q, search.trees[search.add(q.prompt_ids, self.scorer(q))], 0)

    def rollout(self) -> tuple[list, list, dict]:
        """(batch trees, all generated trees, stats) for this rank's share of the batch: Algorithm 1,
        rewards, advantages and dynamic sampling (bfspo/training/batching.py)."""
        from bfspo.tasks.verify import timeouts

        cfg = self.cfg
        target = self.rank_chains
        missed = timeouts()
        self.engine.pop_occupancy()  # drop what validation's calls counted
        keep = functools.partial(keep_tree, filter=cfg.filter)
        rate = batching.ask_rate(cfg.sampling, self.keep_rate, cfg.oversample)
        start = self.cursors[self.rank]
        if self.rollout_kind == "streamed":
            search = StreamedSearch(self.engine, group_size=cfg.group_size, k=cfg.k, budget=cfg.budget,
                                    selection=cfg.selection, temperature=cfg.temperature, top_p=cfg.top_p,
                                    seed=self.step_seed(), filter=cfg.filter)
            filled = batching.fill_streamed(search, functools.partial(self.add_question, search), keep, target,
                                            cfg.chains_per_question, cfg.oversample, cfg.max_gen_rounds, rate)
        else:
            filled = batching.prefix(batching.fill(functools.partial(self.generate, start=start), keep, target,
                                                   cfg.chains_per_question, rate, cfg.max_gen_rounds,
                                                   agree=dist.any_rank), target)
        # The step consumes the questions of its batch's prefix only: those of the trees it dropped go back
        # to the data order, so that the next step's questions depend neither on the engine's timing nor
        # on how many questions the sampling rule asked for.
        self.cursors[self.rank] = start + len(filled.generated)
        for tree in filled.generated:
            assign_rewards(tree, overlong=cfg.overlong, window=cfg.overlong_window)
            assign_advantages(tree, cfg.advantage)
        batch = batching.select(filled.kept, target)
        mine = batching.batch_stats(filled, batch, target)
        merged = batching.merge_ranks(dist.gather(mine))
        observed = (merged["chains_kept"], merged["questions_generated"], cfg.chains_per_question)
        sampling = {"keep_rate": batching.KeepRate().update(*observed).value, "keep_rate_est": self.keep_rate.value,
                    "ask_rate": rate}
        self.keep_rate = self.keep_rate.update(*observed)  # every rank: the same estimate, from all ranks' counts
        stats = step_metrics.rollout_row(filled, batch, mine, merged, timeouts() - missed, self.engine.pop_occupancy(),
                                         sampling)
        return batch, filled.generated, stats

    def update(self, trees: list) -> dict:
        """Optimizer steps on global mini-batches of whole trees (`minibatch_plan`), Eq. 10 each, each
        mini-batch's gradient accumulated over micro-batches of at most `micro_batch_tokens` row
        tokens (bfspo.training.accumulate), normalised by its entry count over all ranks.

        The old log-probs are the trees' own (docs/algorithm.md, "Old log-probs"): the engine's
        when it computes them with the trained model itself (transformers), the training side's
        rescoring of the rollout otherwise (RescoredEngine, vLLM). No second pass recomputes them:
        the policy has not changed since the rollout. `logprob_gap_mean`/`_max` compare the
        engine's log-probs with the trainer's: over every rescored token for a RescoredEngine,
        over the first mini-batch's tokens (before any optimizer step) otherwise.
        """
        cfg = self.cfg
        plan = minibatch_plan(dist.gather([len(t.leaves()) for t in trees]), cfg.mini_batch_chains)
        rescored = self.engine.pop_stats() if isinstance(self.engine, RescoredEngine) else None
        gap = None if rescored is None else (rescored["gap_sum"], rescored["gap_max"], rescored["gap_count"])
        self.model.train()
        losses, stats, norms, skipped = [], [], [], 0
        for mb in plan:
            mine = [trees[i] for r, i in mb if r == self.rank]
            acc = minibatch_backward(self.model, mine, micro_batch_tokens=cfg.micro_batch_tokens,
                                     normalizer=dist.sum_scalar(sum(n_entries(t) for t in mine)),
                                     eps_low=cfg.eps_low, eps_high=cfg.eps_high, attention=cfg.tree_attention,
                                     bucket=cfg.attention_bucket)
            if acc.stats:
                stats.append(acc.stats)
            if gap is None:  # the first mini-batch, still at the rollout's weights
                gap = (acc.gap_sum, acc.gap_max, acc.gap_count)
            dist.sum_gradients(self.params)
            norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf)
            total = dist.sum_scalar(acc.loss)  # the gradients are summed already: every rank sees the same norm
            if not (math.isfinite(total) and torch.isfinite(norm) and step_if_finite(self.optimizer, self.params)):
                self.optimizer.zero_grad(set_to_none=True)
                self.nonfinite += 1
                skipped += 1
                console.line(f"step {self.step}: non-finite loss, gradient or update skipped ({self.nonfinite} so far)")
                if self.nonfinite > cfg.max_nonfinite:
                    raise BfspoError(f"step {self.step}: {self.nonfinite} non-finite losses, gradients or updates, "
                                     f"more than max_nonfinite={cfg.max_nonfinite}; stopping")
                continue
            self.optimizer.zero_grad(set_to_none=True)
            losses.append(total)
            norms.append(float(norm))
        self.model.eval()
        return step_metrics.update_stats(losses, norms, stats, skipped, self.nonfinite,
                                         dist.gather(gap or (0.0, 0.0, 0)), rescored)

    # --- the run --------------------------------------------------------------------------------

    def state(self) -> dict:
        return {"step": self.step, "nonfinite": self.nonfinite, "empty_steps": self.empty_steps,
                "tokens_seen": self.tokens_seen, "cursors": dist.gather(self.cursors[self.rank]),
                "keep_rate": [self.keep_rate.kept, self.keep_rate.asked]}

    def restore(self) -> None:
        """Load the last checkpoint, if any, and trim metrics.jsonl to the steps it covers (saying
        which of them lost their rows: the checkpoint's step stands, run_dir.trim_metrics)."""
        ckpt = checkpoint.latest(self.run_dir)
        if ckpt is not None:
            state = checkpoint.load(ckpt, self.model, self.optimizer)
            if len(state["cursors"]) != self.world:
                raise BfspoError(f"{ckpt}: saved with {len(state['cursors'])} ranks, resumed with {self.world}")
            self.step, self.nonfinite, self.empty_steps = state["step"], state["nonfinite"], state["empty_steps"]
            self.tokens_seen = state.get("tokens_seen", 0)  # absent from checkpoints written before it was counted
            self.cursors = list(state["cursors"])
            self.keep_rate = batching.KeepRate(*state.get("keep_rate", (0.0, 0.0)))  # absent before it was kept
            self.engine.sync_weights(self.model)  # an engine holding its own weights (vLLM) samples the restored policy
            console.line(f"resuming {self.run_dir} from step {self.step}")
        if self.rank == 0:
            trim_metrics(self.run_dir / "metrics.jsonl", self.step)

    def save_checkpoint(self) -> None:
        state = self.state()
        if self.rank == 0:
            checkpoint.save(self.run_dir, self.model, self.optimizer, state)
        dist.barrier()

    def fit(self) -> None:
        """Train to `cfg.steps`. SIGTERM (Slurm's time limit, scancel) or SIGUSR1 (Slurm's warning before
        the time limit, `--signal=USR1@<seconds>`) ends the run after the current step with a
        checkpoint of it, and exit status 143 (128 + SIGTERM, for both), which the workflow's retries
        resume from; a second SIGTERM kills at once.

        Around each update the engine sleeps (vLLM on CUDA frees its GPU memory for the update) and
        wakes, and only then gets the new weights: sleep -> update -> wake_up -> sync_weights, and the
        next step's rollout generates from them."""
        from bfspo import tracking

        cfg = self.cfg
        self.restore()
        run = tracking.start(self.run_dir, cfg.to_dict(), project=cfg.wandb_project, group=cfg.wandb_group,
                             job_type="train", name=cfg.run_name or self.run_dir.name, mode=cfg.wandb_mode,
                             enabled=self.rank == 0, footer=False)
        self.wandb_logged = tracking.last_logged_step(run)
        if self.wandb_logged > self.step:
            console.line(f"W&B: the run holds steps {self.step + 1}-{self.wandb_logged} from the interrupted attempt; "
                         "they are redone but not sent again (metrics.jsonl gets the redone rows)")
        bar = console.bar(total=cfg.steps, initial=self.step, desc=f"train {cfg.method}", unit="step",
                          disable=self.rank != 0)
        row = None
        terminated = []

        def on_stop_signal(signum, frame):
            terminated.append(signum)
            if signum == signal.SIGTERM:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)

        previous = {s: signal.signal(s, on_stop_signal) for s in (signal.SIGTERM, signal.SIGUSR1)}
        try:  # the handlers are this run's only: an error or a stop gives the caller its own back
            while self.step < cfg.steps:
                self.step += 1
                t0 = time.perf_counter()
                batch, generated, roll = self.rollout()
                t1 = time.perf_counter()
                if dist.sum_scalar(len(batch)) == 0:
                    self.empty_steps += 1
                    if self.empty_steps >= cfg.max_empty_steps:
                        raise BfspoError(f"step {self.step}: every tree of the last {self.empty_steps} batches was "
                                         "filtered out (all answers right or all wrong); the data gives no signal "
                                         "for this model")
                    upd = {"loss": float("nan"), "optimizer_steps": 0, "nonfinite": self.nonfinite}
                else:
                    self.empty_steps = 0
                    self.engine.sleep()
                    upd = self.update(batch)
                    self.engine.wake_up()
                    self.engine.sync_weights(self.model)
                t2 = time.perf_counter()
                val = self.validate() if self.validation_due() else {}
                row = self.log_step(roll, upd | val, generated, t1 - t0, t2 - t1, time.perf_counter() - t2, run)
                stop = dist.sum_scalar(len(terminated)) > 0  # every rank stops at the same step
                if self.checkpoint_due() or stop:
                    self.save_checkpoint()
                bar.update(1)
                if self.rank == 0:
                    console.line(step_metrics.step_line(row, cfg.steps))
                if stop:
                    cause = signal.Signals(terminated[0]).name if terminated else "a stop signal to another rank"
                    console.line(f"{cause}: stopped after step {self.step}, checkpoint saved; "
                                 "the same command resumes the run")
                    raise SystemExit(128 + signal.SIGTERM)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        bar.close()
        if self.rank == 0:
            self.finish()
        tracking.finish(run, row and {k: row[k] for k in step_metrics.SUMMARY_KEYS if k in row})
        dist.barrier()

    def log_step(self, roll: dict, upd: dict, generated: list, t_roll: float, t_train: float, t_val: float,
                 run) -> dict:
        """The step's sectioned row (bfspo.training.step_metrics) to metrics.jsonl and, at once, to W&B
        (unless an earlier attempt sent this step already: bfspo/tracking.py), and a sample of the
        step's trees (`log_trees`) to trees/; returns the row."""
        from bfspo import tracking

        stats = step_metrics.reduce_ranks(dist.gather(roll)) | upd
        self.tokens_seen += int(stats["rollout_tokens"])
        questions_seen = sum(dist.gather(self.cursors[self.rank]))
        old_s = upd.get("old_logprobs_s", 0.0)
        stats.update(lr=self.optimizer.param_groups[0]["lr"], rollout_s=t_roll, update_s=t_train - old_s,
                     step_s=t_roll + t_train + t_val, rollout_tok_s=stats["rollout_tokens"] / max(t_roll, 1e-9),
                     train_tok_s=stats["tokens_unique"] / max(t_train, 1e-9),
                     packing_gain=stats["tokens_total"] / max(stats["tokens_unique"], 1),
                     filtered_frac=stats["groups_filtered"] / max(stats["groups_kept"] + stats["groups_filtered"], 1),
                     questions_seen=questions_seen, tokens_seen=self.tokens_seen,
                     epoch=questions_seen / len(self.questions), peak_mem_gb=max(dist.gather(peak_memory_gb())))
        if upd.get("val_questions"):
            stats["val_s"] = t_val
        row = step_metrics.step_row(self.step, stats)
        trees = dist.gather([t.to_dict(decode=self.token_strings) for t in self.trees_to_log(generated)])
        trees = [t for part in trees for t in part]
        if self.rank == 0:
            append_line(self.run_dir / "metrics.jsonl", json.dumps(row))
            if trees:
                write_trees(self.run_dir, self.step, trees)
            if self.step > self.wandb_logged:
                samples = {"rollout/samples": tracking.table(sample_table(trees, self.step))} \
                    if trees and run is not None and self.checkpoint_due() else {}
                tracking.log(run, row | samples, step=self.step)
        return row

    def trees_to_log(self, generated: list) -> list:
        """This rank's share of the `log_trees` sample: its first ceil(N / ranks) trees (all for -1)."""
        n = self.cfg.log_trees
        return generated if n < 0 else generated[:math.ceil(n / self.world)]

    def validation_due(self) -> bool:
        return bool(self.cfg.val_every) and (self.step % self.cfg.val_every == 0 or self.step == self.cfg.steps)

    def validate(self) -> dict:
        """Greedy answers to this rank's share of the held-out questions, merged over ranks (validation.py)."""
        from bfspo.tasks.verify import is_correct

        mine = self.val_questions[self.rank::self.world]
        benchmark = self.cfg.val_benchmark or self.cfg.benchmark

        def correct(i: int, ids: list[int]) -> bool:
            return is_correct(benchmark, self.tokenizer.decode(ids, skip_special_tokens=True), mine[i].gold)

        engine = self.engine.engine if isinstance(self.engine, RescoredEngine) else self.engine  # no log-probs needed
        return validation.merge(dist.gather(validation.answer(engine, [q.prompt_ids for q in mine],
                                                              self.cfg.budget, correct)))

    def checkpoint_due(self) -> bool:
        return self.step % self.cfg.save_every == 0 or self.step == self.cfg.steps

    def token_strings(self, ids: list[int]) -> list[str]:
        """Each token's text within the decoded sequence, so characters split over tokens survive."""
        from bfspo.detokenize import token_texts

        return token_texts(self.tokenizer, ids)

    def optimizer_steps(self) -> int:
        """Optimizer steps kept in the whole run: AdamW's own count, which a checkpoint restores (and
        an undone non-finite step does not raise), so it survives a metrics.jsonl that lost rows."""
        return max((int(s["step"]) for s in self.optimizer.state.values() if "step" in s), default=0)

    def finish(self) -> None:
        """The final adapter (through a temporary folder), then done.json last, naming the adapter
        relative to the run directory (a copied run names its own) with its fingerprint and the code
        that trained it (bfspo.code_identity); a run in which no optimizer step was taken is an
        error, not a finished run."""
        if not self.optimizer_steps():
            raise BfspoError(f"{self.run_dir}: no optimizer step in {self.step} steps (every batch was filtered "
                             "out or skipped), so nothing was trained; check the budget, the data and the model")
        final, tmp = self.run_dir / "adapter", self.run_dir / "adapter.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model_io.save_adapter(self.model, tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        adapter = fingerprint.digest(fingerprint.folder_files(final, "adapter"))
        write_json(self.run_dir / "done.json", {"steps": self.step, "method": self.cfg.method, "adapter": final.name,
                                                "adapter_sha256": adapter, "nonfinite": self.nonfinite,
                                                "code": code_identity.identity("train")})


def check_loaded(data: dict[str, str], stamps: dict[str, list[int]]) -> None:
    """Once every rank has loaded its model and data: each rank's training bytes are those rank 0
    fingerprinted, and no model or tokenizer file rank 0 fingerprinted (`stamps`, empty on the
    other ranks) was replaced or written to since. Otherwise a BfspoError on every rank, before
    inputs.json is written: the run would not be what it records."""
    dist.barrier()
    try:
        fingerprint.check_unchanged(stamps, "loading the model")
        problem = None
    except BfspoError as e:
        problem = str(e)
    views = dist.gather((data, problem))
    problem = views[0][1] or next((f"rank {r} read other training data bytes than rank 0 fingerprinted "
                                   "(the file changed while the ranks started); run the command again"
                                   for r, (theirs, _) in enumerate(views) if theirs != views[0][0]), None)
    if problem:
        raise BfspoError(problem)


def train(cfg: TrainConfig, run_dir: Path) -> int:
    """`bfspo train` once its arguments are checked (bfspo/training/cli.py): train `cfg` in `run_dir`,
    resuming from its checkpoint; 0 when the run is done. An earlier run on other inputs is set
    aside only once the new model and data have loaded and been checked (bfspo.training.run_dir)."""
    device = resolve_device(cfg.device)  # before anything else: a GPU job without CUDA stops here
    if cfg.tree_attention == "flex" and device.type != "cuda":
        raise BfspoError(f"tree_attention: flex trains on CUDA only (torch has no flex attention backward pass on "
                         f"{device.type}); set tree_attention: blockwise, or auto")
    dist.refuse_tensor_parallel(cfg.tensor_parallel_size)
    rank, _ = dist.setup(cfg.collective_timeout_min, device)
    with runlock.hold(run_dir, "train") if rank == 0 else contextlib.nullcontext():
        data, data_print = fingerprint.read_data(cfg.train_data)  # the bytes hashed are the bytes trained on
        stamps: dict[str, list[int]] = {}
        inputs = run_inputs(cfg, data_print, stamps) if rank == 0 else {}
        start = prepare_run_dir(cfg, run_dir, inputs) if rank == 0 else Start()
        if dist.gather(start.finished)[0]:
            print(f"{run_dir}: already finished (done.json exists) with this config and these inputs")
            return 0
        try:
            trainer = Trainer(cfg, run_dir, data)
            check_loaded(data_print, stamps)
            if rank == 0:
                if start.changed:
                    set_aside(run_dir, start.changed)
                write_json(run_dir / fingerprint.RUN_INPUTS, inputs)
                write_json(run_dir / "config.json", cfg.to_dict())
            dist.barrier()  # every rank resumes from what rank 0 left in place
            trainer.fit()
        finally:
            dist.teardown()
    return 0
