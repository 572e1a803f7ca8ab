"""`BFSPOTrainer`: BFS-PO on TRL's GRPOTrainer, so that TRL's engine (accelerate's DDP and DeepSpeed,
logging to W&B and the rest, checkpoints, the hub) runs the method of the paper.

A GRPOTrainer user passes the same model, data set, reward functions and PEFT config. What changes
is what one generation batch becomes and what the loss is:

1. `grow_trees`: the generation batch's questions (each once, whatever rank TRL dealt its copies to)
   are shared out over the ranks, and each question grows its search tree with Algorithm 1
   (bfspo.algorithm.search.build_trees). Sampling goes through TRL's own generation
   (`_generate_single_turn`: transformers' `generate`, or TRL's vLLM modes), wrapped as a rollout
   engine (`TRLGeneration`); the training model then rescores every sample, tree-packed
   (bfspo.rollout.rescore.RescoredEngine), for the old log-probs and the entropies that
   backtracking needs (Eq. 6-7). A chain's verdict comes from one reward function, the verdict
   function (bfspo.integrations.trl.rewards), its reward from Eq. 3-4 plus the other functions'
   weighted values, and the advantages from Eq. 8-9 (bfspo.algorithm.advantages). `log_rollout`
   logs GRPOTrainer's metrics and `bfspo train`'s, and `write_trees` the trees (docs/trl.md).
2. `compute_loss`: each micro-step's trees are packed into one row, each shared prefix once, and run
   through one call of the model's forward, redirected for that call (`packed_forward`: DDP and
   DeepSpeed see the call, and the model is left as it was) with the tree attention; the loss
   is Eq. 10 (bfspo.algorithm.loss.policy_loss), normalised by the unique tokens of the whole
   optimizer step over all ranks, as `bfspo train` normalises a mini-batch.

With K = 0 the trees are GRPO's groups and the loss is TRL's `loss_type="dapo"`
(tests/test_trl_integration.py). What is not supported, and why, is `unsupported_settings` and
`unsupported_distribution`, and docs/trl.md.
"""

from __future__ import annotations

import inspect
import math
from collections import defaultdict, deque
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import torch
from accelerate.utils import gather_object
from transformers.integrations import WandbCallback
from trl import GRPOTrainer
from trl.data_utils import is_conversational
from trl.trainer.utils import get_callable_name

from bfspo.algorithm.advantages import assign_advantages, assign_rewards, keep_tree, per_chain
from bfspo.algorithm.attention_options import BUCKET_TOKENS
from bfspo.algorithm.loss import policy_loss
from bfspo.algorithm.packing import attention_mode, n_entries, pack_trees, packed_logprobs, row_buckets
from bfspo.algorithm.search import build_trees
from bfspo.algorithm.tree_attention import flex_errors
from bfspo.detokenize import token_texts
from bfspo.integrations.trl.config import BFSPOConfig
from bfspo.integrations.trl.rewards import chain_value, extra_reward, is_correct_value, verdict_index
from bfspo.rollout.base import Completion, per_context_budgets
from bfspo.rollout.rescore import RescoredEngine
from bfspo.training import step_metrics
from bfspo.training.run_dir import write_trees

NAN = float("nan")


class TRLGeneration:
    """The rollout engine (bfspo.rollout.base.RolloutEngine's `generate`) of Algorithm 1 on a TRL
    trainer: n samples of each context through the trainer's own generation, at its temperature,
    top_p and top_k and with its random state (the `seed` and `keys` of the protocol are not used;
    TRL seeds its processes). TRL's backends sample a batch to one length limit, so a call asks for
    its longest budget and each context's samples are cut at its own: the tokens up to a cut are
    drawn exactly as if sampling had stopped there. Log-probs and entropies are left NaN: the
    RescoredEngine around this one computes both with the training model."""

    def __init__(self, trainer: BFSPOTrainer):
        self.trainer = trainer

    def generate(self, contexts, n, max_new_tokens, **_sampling):
        budgets = per_context_budgets(max_new_tokens, len(contexts))
        repeated = [list(c) for c in contexts for _ in range(n)]  # TRL's batches hold each prompt n times
        with self.trainer.generation_limit(max(budgets)):
            ids, _ = self.trainer._generate_single_turn(repeated, None, {}, n)
        eos = set(self.trainer.eos_token_ids)
        out = []
        for i, budget in enumerate(budgets):
            cut = [list(c)[:budget] for c in ids[i * n:(i + 1) * n]]
            out.append([Completion(t, [NAN] * len(t), [NAN] * len(t), bool(t) and t[-1] in eos) for t in cut])
        return out


def packed_forward(wrapper: torch.nn.Module, module: torch.nn.Module, packed, attention: str, max_tokens: int):
    """The tree-packed (log-probs, entropies) of `packed` (bfspo.algorithm.packing.packed_logprobs)
    under `module`, computed inside one call of `wrapper`'s forward (the DDP or DeepSpeed module
    around it, or `module` itself), as the wrapper needs: DDP prepares its gradient reduction there.
    As TRL's `_ForwardRedirection`: `module.forward` is redirected for this one call and then left
    exactly as it was found (tests/test_trl_integration.py). The redirection also passes over
    accelerate's mixed-precision wrapper of the forward (`bf16`, `fp16`), so the update runs in the
    model's own dtype, as the rescoring that gives the old log-probs does: the ratio of Eq. 10 compares
    log-probs of one precision, and the tree attention's CPU kernel gets tensors of one dtype (to train
    in bfloat16, load the model in it: docs/trl.md). The flex kernel's rows are padded to the bucket
    lengths below `max_tokens` (bfspo.algorithm.attention_options)."""
    own = vars(module)
    had, found = "forward" in own, own.get("forward")

    def restore() -> None:
        if had:
            module.forward = found
        else:
            own.pop("forward", None)

    def redirected(*_args, **_kwargs):
        restore()  # packed_logprobs runs the model's own forward
        buckets = row_buckets(attention, packed.input_ids.device, max_tokens, BUCKET_TOKENS)
        return packed_logprobs(module, packed, attention=attention, buckets=buckets)

    module.forward = redirected
    try:
        return wrapper()
    finally:
        restore()


def unsupported_settings(args: BFSPOConfig, reward_funcs) -> list[str]:
    """Why these settings cannot train BFS-PO, one reason each (empty: they can)."""
    problems = []
    if args.beta != 0.0:
        problems.append(f"beta={args.beta}: Eq. 10 has no KL term (set beta=0.0)")
    if args.loss_type != "dapo":
        problems.append(f"loss_type={args.loss_type!r}: BFS-PO's loss is DAPO's clipped token-mean over the tree's "
                        "unique tokens (Eq. 10); set loss_type='dapo'")
    if args.importance_sampling_level != "token":
        problems.append("importance_sampling_level must be 'token' (Eq. 10's ratio is per token)")
    if args.top_entropy_quantile < 1.0 or args.off_policy_mask_threshold is not None or args.delta is not None:
        problems.append("top_entropy_quantile, off_policy_mask_threshold and delta change GRPO's loss, not Eq. 10's")
    if args.entropy_coef != 0.0 or args.use_adaptive_entropy:
        problems.append("entropy_coef / use_adaptive_entropy: Eq. 10 has no entropy bonus")
    if args.use_vllm and args.vllm_importance_sampling_correction:
        problems.append("vllm_importance_sampling_correction: the old log-probs are the training model's own "
                        "rescoring of vLLM's samples, there is no mismatch to correct (set it False)")
    if args.steps_per_generation % args.gradient_accumulation_steps:
        problems.append(f"steps_per_generation ({args.steps_per_generation}) must be a multiple of "
                        f"gradient_accumulation_steps ({args.gradient_accumulation_steps}): each optimizer step "
                        "trains whole trees of one generation batch, normalised by their unique tokens")
    questions = args.generation_batch_size // args.num_generations
    if questions < args.world_size * args.steps_per_generation:
        problems.append(f"a generation batch holds {questions} question(s) (generation_batch_size / num_generations), "
                        f"fewer than processes x steps_per_generation = {args.world_size * args.steps_per_generation}: "
                        "every micro-step of every process needs a tree of its own")
    if args.use_liger_kernel:
        problems.append("use_liger_kernel: Liger's fused GRPO loss is not Eq. 10 over a tree's unique tokens (set it False)")
    if args.scale_rewards not in ("group", True) or args.mask_truncated_completions:
        problems.append("scale_rewards and mask_truncated_completions shape GRPO's advantages and mask: BFS-PO's "
                        "advantages are Eq. 8-9 and a chain cut at the budget is wrong with Eq. 3's reward (leave "
                        "both at TRL's defaults)")
    if args.eval_strategy != "no":
        problems.append("evaluation during training (eval_strategy) is not supported: evaluate the saved adapter "
                        "with `bfspo evaluate`")
    funcs = reward_funcs if isinstance(reward_funcs, list) else [] if reward_funcs is None else [reward_funcs]
    if not funcs:
        problems.append("no reward function: BFS-PO needs one for each chain's verdict (e.g. verifier_reward)")
    plain = True
    for f in funcs:
        if isinstance(f, (str, torch.nn.Module)) or not callable(f) or _is_async(f):
            plain = False
            problems.append(f"reward function {f!r}: BFS-PO reads a verdict per chain from plain (synchronous) "
                            "reward functions; reward models and async functions are not supported")
    if funcs and plain:
        try:
            verdict_index([get_callable_name(f) for f in funcs], args.verdict_reward)
        except ValueError as e:
            problems.append(str(e))
    return problems


def _is_async(f) -> bool:
    return inspect.iscoroutinefunction(f) or inspect.iscoroutinefunction(getattr(f, "__call__", None))


def unsupported_distribution(trainer: GRPOTrainer) -> list[str]:
    """Why the trainer's distributed set-up cannot run BFS-PO (empty: it can). Trees grow a different
    number of rounds on each process, so generation that meets the other processes (TRL's vLLM modes
    over several processes, ZeRO-3's and FSDP's parameter gathering) could wait forever; and the
    rescoring and the packed update reach into the model's submodules, which ZeRO-3 and FSDP shard."""
    problems = []
    if trainer.is_fsdp_enabled:
        problems.append("FSDP shards the parameters the packed forwards read: use DDP or DeepSpeed ZeRO-1/2")
    plugin = trainer.accelerator.state.deepspeed_plugin
    if plugin is not None and plugin.zero_stage == 3:
        problems.append("DeepSpeed ZeRO-3 shards the parameters the packed forwards read: use ZeRO-1/2")
    if trainer.use_vllm and trainer.accelerator.num_processes > 1:
        problems.append("TRL's vLLM generation over several processes meets the other processes in every call, "
                        "while each process grows its trees for its own number of rounds: use one process, or "
                        "the transformers generation (use_vllm=False)")
    if trainer._is_vlm:
        problems.append("vision-language models (a processor, not a tokenizer) are not supported")
    return problems


# the sections of `bfspo train`'s keys: rollout/, tree/, advantage/, train/, timing/, val-core/
SECTIONS = tuple(sorted({key.split("/")[0] + "/" for key in step_metrics.SECTIONS.values()}))


class SectionedWandbCallback(WandbCallback):
    """transformers' W&B callback, which prefixes every key with `train/` (`rewrite_logs`), except
    for the keys already in one of `bfspo train`'s sections (bfspo.training.step_metrics: `rollout/`,
    `tree/`, `advantage/`, `train/`, `timing/`): those keep their names, so that a panel overlays a
    TRL run and a `bfspo train` run, with no `train/train/...`. TRL's own metrics (`reward`,
    `completions/mean_length`, ...) get the prefix as in a GRPOTrainer run. Both land in one row."""

    def on_log(self, args, state, control, model=None, logs=None, **kwargs):
        ours = {k: v for k, v in (logs or {}).items() if k.startswith(SECTIONS)}
        if ours and self._wandb is not None and state.is_world_process_zero:
            if not self._initialized:
                self.setup(args, state, model)
            self._wandb.log(ours, commit=False)  # committed with the rest of the row just below
        super().on_log(args, state, control, model=model, logs={k: v for k, v in logs.items() if k not in ours},
                       **kwargs)


class BFSPOTrainer(GRPOTrainer):
    """BFS-PO (Algorithm 1, Eq. 3-4, 8-10) as a TRL trainer; see the module docstring and docs/trl.md.

    Example:

    ```python
    from datasets import Dataset
    from bfspo.integrations.trl import BFSPOConfig, BFSPOTrainer, question_rows, verifier_reward

    dataset = Dataset.from_list(question_rows("results/data/gsm8k_train.jsonl", "gsm8k_train"))
    trainer = BFSPOTrainer(
        model="Qwen/Qwen2.5-0.5B-Instruct",
        reward_funcs=verifier_reward("gsm8k_train"),  # the verdict: 1.0 correct, 0.0 wrong
        args=BFSPOConfig(output_dir="bfspo-gsm8k", k=3, num_generations=8, max_completion_length=512),
        train_dataset=dataset,
    )
    trainer.train()
    ```
    """

    _tag_names = ["trl", "bfspo"]

    def __init__(self, model, reward_funcs, args: BFSPOConfig | None = None, train_dataset=None,
                 processing_class=None, callbacks=None, optimizers=(None, None), peft_config=None):
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = BFSPOConfig(f"{str(name).rstrip('/').split('/')[-1]}-BFSPO")
        if not isinstance(args, BFSPOConfig):
            raise TypeError(f"BFSPOTrainer needs a BFSPOConfig, got {type(args).__name__}")
        problems = unsupported_settings(args, reward_funcs)
        columns = getattr(train_dataset, "column_names", None)
        if columns is not None and "prompt" not in columns:
            problems.append(f"the train_dataset has no 'prompt' column (its columns: {', '.join(columns) or 'none'}); "
                            "each row needs its prompt, plain text or a conversation (question_rows makes them)")
        if problems:
            raise ValueError("BFSPOTrainer: " + "; ".join(problems))
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                         processing_class=processing_class, callbacks=callbacks, optimizers=optimizers,
                         peft_config=peft_config)
        problems = unsupported_distribution(self)
        if problems:
            raise ValueError("BFSPOTrainer: " + "; ".join(problems))
        if self.callback_handler.pop_callback(WandbCallback) is not None:
            self.add_callback(SectionedWandbCallback())
        self.verdict = verdict_index(self.reward_func_names, args.verdict_reward)
        if self.log_completions:  # TRL's table holds a generation batch's completions; a tree has up to (K + 1) G
            rows = args.generation_batch_size * (args.k + 1)
            self._logs.update({key: deque(maxlen=rows) for key in ("prompt", "completion", "advantages")})
            self._logs["rewards"] = defaultdict(lambda: deque(maxlen=rows))
        self.rollout = RescoredEngine(TRLGeneration(self), self.model, args.micro_batch_tokens, args.tree_attention)
        self._update_mode = ExitStack()  # the tree attention, held from a micro-step's forward through its backward

    # --- generation: one search tree per question -------------------------------------------------

    @contextmanager
    def generation_limit(self, tokens: int):
        """TRL's generation samples at most `tokens` new tokens within the block (an expansion from
        depth d needs budget - d, not the whole budget)."""
        def limit(value: int) -> None:
            if self.use_vllm:
                self.vllm_generation.max_completion_length = value
            else:  # the config generate() gets, and the kwargs TRL writes over the model's own
                self.generation_config.max_new_tokens = self.generation_kwargs["max_new_tokens"] = value

        limit(tokens)
        try:
            yield
        finally:
            limit(self.max_completion_length)

    def scorer(self, row: dict, values: dict):
        """v(o, a*) of one question for Algorithm 1: a chain (its generated token ids) is correct when
        the verdict function's value on it is positive (bfspo.integrations.trl.rewards). Every reward
        function runs on every chain, with the row's columns as in GRPOTrainer; their values go to
        `values` (chain ids -> one value per function, NaN for None) for the leaf rewards and the logs."""
        conversational = is_conversational({"prompt": row["prompt"]})
        columns = {k: [v] for k, v in row.items() if k not in ("prompt", "completion", "completion_ids")}

        def score(ids: list[int]) -> bool:
            text = self.processing_class.decode(ids, skip_special_tokens=True)
            completion = [{"role": "assistant", "content": text}] if conversational else text
            values[tuple(ids)] = found = [
                chain_value(name, func(prompts=[row["prompt"]], completions=[completion], completion_ids=[list(ids)],
                                       trainer_state=self.state, **columns))
                for func, name in zip(self.reward_funcs, self.reward_func_names)]
            return is_correct_value(found[self.verdict])
        return score

    def grow_trees(self, rows: list[dict]) -> list:
        """This process's search trees of a generation batch (TRL's rows: each question
        `num_generations` times, dealt over the processes): every question once, the processes taking
        them in turn; Algorithm 1 on each, then Eq. 3-4 and 8 (rewards, plus the other reward
        functions' weighted values: `extra_reward`) and Eq. 9 (advantages). Each tree's meta holds its
        question's `id` (where the data has one) and every function's value on each leaf.
        The one place trees come from: a subclass may return others (the tests replay given trees)."""
        args = self.args
        questions = gather_object(list(rows))[::self.num_generations]
        mine = questions[self.accelerator.process_index::self.accelerator.num_processes]
        for q in mine:
            if not q["prompt"]:
                raise ValueError(f"BFSPOTrainer: an empty prompt ({q['prompt']!r}) in the train_dataset"
                                 + (f", row id {q['id']!r}" if "id" in q else "") + ": every question needs a prompt")
        prompt_ids, _, _ = self._tokenize_prompts([q["prompt"] for q in mine])
        values = [{} for _ in mine]
        trees = build_trees(self.rollout, prompt_ids, [self.scorer(q, v) for q, v in zip(mine, values)],
                            group_size=self.num_generations, k=args.k, budget=args.max_completion_length,
                            selection=args.selection, temperature=args.temperature, top_p=args.top_p,
                            filter=args.filter)
        weights = self.reward_weights.tolist()
        for tree, q, found in zip(trees, mine, values):
            per_leaf = [found[tuple(tree.path_tokens(leaf))] for leaf in tree.leaves()]
            assign_rewards(tree, overlong=args.overlong, window=args.overlong_window,
                           extra={leaf: extra_reward(v, weights, self.verdict) for leaf, v in zip(tree.leaves(), per_leaf)})
            assign_advantages(tree, args.advantage)
            tree.meta.update({"question_id": q.get("id"), "rewards": {
                name: [None if math.isnan(v[i]) else v[i] for v in per_leaf]
                for i, name in enumerate(self.reward_func_names)}})
        return trees

    def _prepare_inputs(self, generation_batch):
        """Every `steps_per_generation x num_iterations` micro-steps, a new generation batch's trees cut
        into `steps_per_generation` micro-steps (`micro_steps`); in between, the next of them."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            trees = self.grow_trees(generation_batch)
            self.log_rollout(trees)
            self.write_trees(trees)
            self._buffered_inputs = self.micro_steps(trees)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def micro_steps(self, trees: list) -> list[dict]:
        """The trees cut into `steps_per_generation` runs of whole trees, each with the filter's verdict
        on its trees (`keep_tree`: a tree without signal stays out of the loss) and the normaliser of
        Eq. 10 for its optimizer step: the kept trees' entries (unique tokens, or chain tokens for a
        per-chain advantage) of all its micro-steps on all processes."""
        steps, accumulate = self.args.steps_per_generation, self.args.gradient_accumulation_steps
        parts = [list(p) for p in np.array_split(np.arange(len(trees)), steps)]
        keep = [keep_tree(t, self.args.filter) for t in trees]
        local = torch.tensor([sum(n_entries(trees[i]) for i in p if keep[i]) for p in parts],
                             dtype=torch.long, device=self.accelerator.device)
        entries = self.accelerator.reduce(local, reduction="sum").view(-1, accumulate).sum(1)
        return [{"trees": [trees[i] for i in p], "keep": [keep[i] for i in p], "normalizer": int(entries[j // accumulate])}
                for j, p in enumerate(parts)]

    # --- what a generation batch logs ---------------------------------------------------------------

    def log_rollout(self, trees: list) -> None:
        """The generation batch's metrics, over all processes, into TRL's metrics (docs/trl.md's table):
        GRPOTrainer's own under its names and with its meaning, over every chain (root-to-leaf path)
        of the trees; BFS-PO's under `bfspo train`'s names (bfspo.training.step_metrics), with theirs;
        and, with `log_completions`, each chain in TRL's completions table."""
        names, weights = self.reward_func_names, self.reward_weights.tolist()
        keep = [keep_tree(t, self.args.filter) for t in trees]
        stats = step_metrics.rollout_stats(trees, [t for t, k in zip(trees, keep) if k])
        chains = [sum(len(t.leaves()) for t, k in zip(trees, keep) if k), sum(len(t.leaves()) for t in trees)]
        stats |= {"groups_kept": sum(keep), "groups_filtered": len(trees) - sum(keep), "chains": chains[0],
                  "chains_generated": chains[1], "tokens_unique": sum(t.n_tokens for t in trees),
                  "tokens_total": sum(t.n_chain_tokens for t in trees)}
        stats = step_metrics.reduce_ranks(gather_object([stats]))
        stats |= {"packing_gain": stats["tokens_total"] / max(stats["tokens_unique"], 1),
                  "filtered_frac": stats["groups_filtered"] / max(stats["groups_kept"] + stats["groups_filtered"], 1)}
        metrics = self._metrics["train"]
        for key, value in stats.items():
            metrics[step_metrics.SECTIONS[key]].append(value)

        chains = gather_object([(t.segments[s].leaf.length, t.segments[s].leaf.finished, len(t.prompt_ids))
                                for t in trees for s in t.leaves()])
        lengths = np.array([c[0] for c in chains], dtype=float)
        finished = np.array([c[1] for c in chains], dtype=bool)
        per_func = np.array(gather_object([v for t in trees for v in leaf_values(t, names)]), dtype=float).reshape(
            -1, len(names))
        rewards = trl_reward(per_func, weights)
        self.state.num_input_tokens_seen += int(sum(c[0] + c[2] for c in chains))  # prompt + completion, per chain
        metrics["num_tokens"] = [self.state.num_input_tokens_seen]
        terminated = lengths[finished] if finished.any() else np.zeros(1)
        for name, values in (("length", lengths), ("terminated_length", terminated)):
            metrics[f"completions/mean_{name}"].append(float(values.mean()))
            metrics[f"completions/min_{name}"].append(float(values.min()))
            metrics[f"completions/max_{name}"].append(float(values.max()))
        metrics["completions/clipped_ratio"].append(float((~finished).mean()))
        for i, name in enumerate(names):
            metrics[f"rewards/{name}/mean"].append(nan_stat(np.nanmean, per_func[:, i]))
            metrics[f"rewards/{name}/std"].append(nan_stat(nanstd, per_func[:, i]))
        metrics["reward"].append(nan_stat(np.nanmean, rewards))
        metrics["reward_std"].append(nan_stat(nanstd, rewards))
        flat = gather_object([nan_stat(nanstd, trl_reward(np.array(leaf_values(t, names), dtype=float), weights)) == 0
                              for t in trees])
        metrics["frac_reward_zero_std"].append(float(np.mean(flat)))
        if self.log_completions:
            self.log_chains(trees)

    def log_chains(self, trees: list) -> None:
        """TRL's completions table (`log_completions`): one row per chain of the trees, its prompt, its
        text, each reward function's value and its advantage (a per-chain advantage, or under Eq. 9
        the advantage of its last segment, the branch it ends in). TRL keeps the last
        `generation_batch_size` rows."""
        names = self.reward_func_names
        rows = []
        for t in trees:
            prompt = self.processing_class.decode(t.prompt_ids, skip_special_tokens=True)
            for leaf, values in zip(t.leaves(), leaf_values(t, names)):
                seg = t.segments[leaf]
                advantage = seg.leaf.advantage if per_chain(t) else seg.advantage
                rows.append((prompt, self.processing_class.decode(t.path_tokens(leaf), skip_special_tokens=True),
                             values, advantage))
        for prompt, completion, values, advantage in gather_object(rows):
            self._logs["prompt"].append(prompt)
            self._logs["completion"].append(completion)
            for name, value in zip(names, values):
                self._logs["rewards"][name].append(value)
            self._logs["advantages"].append(advantage)

    def write_trees(self, trees: list) -> None:
        """The first `log_trees` trees of the generation batch (all for -1, none for 0; split over the
        processes as in `bfspo train`) to output_dir/trees/step_NNNNN.jsonl, NNNNN the first optimizer
        step they train, with their token text: what `bfspo tree show` and `bfspo tree stats` read."""
        n = self.args.log_trees
        if n == 0:
            return
        mine = trees if n < 0 else trees[:math.ceil(n / self.accelerator.num_processes)]
        decoded = gather_object([t.to_dict(decode=lambda ids: token_texts(self.processing_class, ids)) for t in mine])
        if self.accelerator.is_main_process and decoded:
            write_trees(Path(self.args.output_dir), self.state.global_step + 1, decoded)

    # --- the update: Eq. 10 over the unique tokens --------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Eq. 10 on one micro-step's trees, packed in one row: its share of the optimizer step's loss
        (the sum over its kept trees' entries divided by the step's normaliser), times the process
        count, since DDP and DeepSpeed average the processes' gradients where Eq. 10 sums them. A
        micro-step whose trees were all filtered out still runs one of them with zero weight, so that
        every process meets the others in the backward pass."""
        if return_outputs:
            raise ValueError("BFSPOTrainer does not return outputs")
        kept = [t for t, k in zip(inputs["trees"], inputs["keep"]) if k]
        packed = pack_trees(kept or inputs["trees"][:1]).to(self.accelerator.device)
        if packed.n_row_tokens > self.args.micro_batch_tokens:
            raise ValueError(f"a micro-step's trees fill a row of {packed.n_row_tokens} tokens, more than "
                             f"micro_batch_tokens={self.args.micro_batch_tokens}: raise steps_per_generation (more "
                             "micro-steps, fewer trees each) or micro_batch_tokens")
        # Gradient checkpointing runs the attention again in the backward pass: the mode lasts until
        # training_step has run it (it closes the stack).
        self._update_mode.enter_context(attention_mode(self.model, self.args.tree_attention))
        self._update_mode.enter_context(flex_errors())
        logprobs, entropies = packed_forward(model, self.model, packed, self.args.tree_attention,
                                             self.args.micro_batch_tokens)
        mask = torch.full_like(logprobs, bool(kept), dtype=torch.bool)
        loss, stats = policy_loss(logprobs, packed.old_logprobs, packed.advantages, mask, eps_low=self.epsilon_low,
                                  eps_high=self.epsilon_high, normalizer=inputs["normalizer"])
        self.log_update(stats, entropies, mask)
        return loss * self.accelerator.num_processes

    def log_update(self, stats: dict, entropies: torch.Tensor, mask: torch.Tensor) -> None:
        """A micro-step's update metrics over all processes: TRL's `entropy` and `clip_ratio/*_mean`
        (over the trained tokens, each unique token once) and `bfspo train`'s `train/clip_frac*` and
        `train/approx_kl`. Every process takes part, also one whose trees were all filtered out."""
        n = float(mask.sum())
        local = torch.tensor([n, float(entropies[mask].sum()), stats["clip_frac"] * n, stats["clip_frac_low"] * n,
                              stats["clip_frac_high"] * n, stats["approx_kl"] * n],
                             dtype=torch.float64, device=self.accelerator.device)
        n, entropy, region, low, high, kl = self.accelerator.reduce(local, reduction="sum").tolist()
        if not n:
            return
        metrics = self._metrics["train"]
        metrics["entropy"].append(entropy / n)
        for trl_name, ours, value in (("region_mean", "clip_frac", region), ("low_mean", "clip_frac_low", low),
                                      ("high_mean", "clip_frac_high", high)):
            metrics[f"clip_ratio/{trl_name}"].append(value / n)
            metrics[f"train/{ours}"].append(value / n)
        metrics["train/approx_kl"].append(kl / n)

    def training_step(self, model, inputs, num_items_in_batch):
        """GRPOTrainer's step, with the tree attention's mode closed after the backward pass
        (`compute_loss` opens it). Overridden for a second reason too: HF's `training_step` calls
        `_prepare_inputs`, which is where GRPOTrainer, and this trainer, generate (grow the trees)."""
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:
            self._update_mode.close()


def leaf_values(tree, names: list[str]) -> list[list[float]]:
    """Each leaf's value of each reward function (tree.meta, from `grow_trees`), NaN for None; NaN
    throughout for a tree grown elsewhere (a replayed one)."""
    rewards = tree.meta.get("rewards", {})
    return [[math.nan if rewards.get(n) is None or rewards[n][j] is None else rewards[n][j] for n in names]
            for j in range(len(tree.leaves()))]


def trl_reward(per_func: np.ndarray, weights: list[float]) -> np.ndarray:
    """GRPOTrainer's `reward` of each chain: the weighted sum of the functions' values, None (NaN)
    left out, NaN where every function returned None."""
    per_func = per_func.reshape(-1, len(weights))
    return np.where(np.isnan(per_func).all(1), np.nan, np.nansum(per_func * np.array(weights), 1))


def nanstd(values: np.ndarray) -> float:
    """TRL's `nanstd`: the unbiased standard deviation of the non-NaN values."""
    return float(np.nanstd(values, ddof=1))


def nan_stat(stat, values: np.ndarray) -> float:
    """`stat` over the non-NaN values; NaN where there are none (TRL's log then drops it) or one (for a std)."""
    finite = values[~np.isnan(values)]
    return float(stat(finite)) if len(finite) > (stat is nanstd) else math.nan
