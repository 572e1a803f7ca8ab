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
   backtracking needs (Eq. 6-7). A chain's verdict comes from the reward functions
   (bfspo.integrations.trl.rewards), its reward from Eq. 3-4, and the advantages from Eq. 8-9
   (bfspo.algorithm.advantages).
2. `compute_loss`: each micro-step's trees are packed into one row, each shared prefix once, and run
   through the model's forward (so DDP and DeepSpeed see the call) with the tree attention; the loss
   is Eq. 10 (bfspo.algorithm.loss.policy_loss), normalised by the unique tokens of the whole
   optimizer step over all ranks, as `bfspo train` normalises a mini-batch.

With K = 0 the trees are GRPO's groups and the loss is TRL's `loss_type="dapo"`
(tests/test_trl_integration.py). What is not supported, and why, is `unsupported_settings` and
`unsupported_distribution`, and docs/trl.md.
"""

from __future__ import annotations

import functools
import inspect
from contextlib import ExitStack, contextmanager

import numpy as np
import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer
from trl.data_utils import is_conversational

from bfspo.algorithm.advantages import assign_advantages, assign_rewards, keep_tree
from bfspo.algorithm.attention_options import BUCKET_TOKENS
from bfspo.algorithm.loss import policy_loss
from bfspo.algorithm.packing import attention_mode, n_entries, pack_trees, packed_logprobs, row_buckets
from bfspo.algorithm.search import build_trees
from bfspo.algorithm.tree_attention import flex_errors
from bfspo.integrations.trl.config import BFSPOConfig
from bfspo.rollout.base import Completion, per_context_budgets
from bfspo.rollout.rescore import RescoredEngine

NAN = float("nan")


class TRLGeneration:
    """The rollout engine (bfspo.rollout.base.RolloutEngine's `generate`) of Algorithm 1 on a TRL
    trainer: n samples of each context through the trainer's own generation, at its temperature,
    top_p and top_k and with its random state (the `seed` and `keys` of the protocol are not used;
    TRL seeds its processes). TRL's backends sample a batch to one length limit, so a call asks for
    its longest budget and each context's samples are cut at its own: the tokens up to a cut are
    drawn exactly as if sampling had stopped there. Log-probs and entropies are left NaN: the
    RescoredEngine around this one computes both with the training model."""

    def __init__(self, trainer: "BFSPOTrainer"):
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


def route_packed_forward(model: torch.nn.Module, attention: str, max_tokens: int) -> None:
    """Give `model` (the module that DDP or DeepSpeed wrap) a second kind of forward call:
    `model(bfspo_packed=packed)` returns the tree-packed (log-probs, entropies) of `packed`
    (bfspo.algorithm.packing.packed_logprobs); any other call is the model's own forward. The update
    goes through the wrapper's forward this way, as the wrapper needs (DDP prepares its gradient
    reduction there), while the row's layout and the tree attention stay the project's. The flex
    kernel's rows are padded to the bucket lengths below `max_tokens` (bfspo.algorithm.attention_options)."""
    original = model.forward

    @functools.wraps(original)  # generate() checks its keyword arguments against the original signature
    def forward(*args, bfspo_packed=None, **kwargs):
        if bfspo_packed is None:
            return original(*args, **kwargs)
        buckets = row_buckets(attention, bfspo_packed.input_ids.device, max_tokens, BUCKET_TOKENS)
        return packed_logprobs(model, bfspo_packed, attention=attention, buckets=buckets)

    model.forward = forward


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
    if args.eval_strategy != "no":
        problems.append("evaluation during training (eval_strategy) is not supported: evaluate the saved adapter "
                        "with `bfspo evaluate`")
    funcs = reward_funcs if isinstance(reward_funcs, list) else [] if reward_funcs is None else [reward_funcs]
    if not funcs:
        problems.append("no reward function: BFS-PO needs one for each chain's verdict (e.g. verifier_reward)")
    for f in funcs:
        if isinstance(f, (str, torch.nn.Module)) or not callable(f) or _is_async(f):
            problems.append(f"reward function {f!r}: BFS-PO reads a verdict per chain from plain (synchronous) "
                            "reward functions; reward models and async functions are not supported")
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


class BFSPOTrainer(GRPOTrainer):
    """BFS-PO (Algorithm 1, Eq. 3-4, 8-10) as a TRL trainer; see the module docstring."""

    _tag_names = ["trl", "bfspo"]

    def __init__(self, model, reward_funcs, args: BFSPOConfig | None = None, train_dataset=None,
                 processing_class=None, callbacks=None, optimizers=(None, None), peft_config=None):
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = BFSPOConfig(f"{str(name).rstrip('/').split('/')[-1]}-BFSPO")
        if not isinstance(args, BFSPOConfig):
            raise TypeError(f"BFSPOTrainer needs a BFSPOConfig, got {type(args).__name__}")
        problems = unsupported_settings(args, reward_funcs)
        if problems:
            raise ValueError("BFSPOTrainer: " + "; ".join(problems))
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                         processing_class=processing_class, callbacks=callbacks, optimizers=optimizers,
                         peft_config=peft_config)
        problems = unsupported_distribution(self)
        if problems:
            raise ValueError("BFSPOTrainer: " + "; ".join(problems))
        route_packed_forward(self.model, args.tree_attention, args.micro_batch_tokens)
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

    def scorer(self, row: dict):
        """v(o, a*) of one question for Algorithm 1: a chain (its generated token ids) is correct when
        the weighted sum of the reward functions on it is positive (bfspo.integrations.trl.rewards); a
        function's None counts as wrong. The functions get the row's columns, as in GRPOTrainer."""
        conversational = is_conversational({"prompt": row["prompt"]})
        columns = {k: [v] for k, v in row.items() if k not in ("prompt", "completion", "completion_ids")}
        weights = self.reward_weights.tolist()

        def score(ids: list[int]) -> bool:
            text = self.processing_class.decode(ids, skip_special_tokens=True)
            completion = [{"role": "assistant", "content": text}] if conversational else text
            total = 0.0
            for func, weight in zip(self.reward_funcs, weights):
                (value,) = func(prompts=[row["prompt"]], completions=[completion], completion_ids=[list(ids)],
                                trainer_state=self.state, **columns)
                total += weight * (NAN if value is None else value)
            return total > 0
        return score

    def grow_trees(self, rows: list[dict]) -> list:
        """This process's search trees of a generation batch (TRL's rows: each question
        `num_generations` times, dealt over the processes): every question once, the processes taking
        them in turn; Algorithm 1 on each, then Eq. 3-4 and 8 (rewards) and Eq. 9 (advantages).
        The one place trees come from: a subclass may return others (the tests replay given trees)."""
        args = self.args
        questions = gather_object(list(rows))[::self.num_generations]
        mine = questions[self.accelerator.process_index::self.accelerator.num_processes]
        prompt_ids, _, _ = self._tokenize_prompts([q["prompt"] for q in mine])
        trees = build_trees(self.rollout, prompt_ids, [self.scorer(q) for q in mine], group_size=self.num_generations,
                            k=args.k, budget=args.max_completion_length, selection=args.selection,
                            temperature=args.temperature, top_p=args.top_p, filter=args.filter)
        for tree in trees:
            assign_rewards(tree, overlong=args.overlong, window=args.overlong_window)
            assign_advantages(tree, args.advantage)
        return trees

    def _prepare_inputs(self, generation_batch):
        """Every `steps_per_generation x num_iterations` micro-steps, a new generation batch's trees cut
        into `steps_per_generation` micro-steps (`micro_steps`); in between, the next of them."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            trees = self.grow_trees(generation_batch)
            self.log_trees(trees)
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

    def log_trees(self, trees: list) -> None:
        """The generation batch's tree statistics, summed over processes, into TRL's metrics."""
        keep = [keep_tree(t, self.args.filter) for t in trees]
        leaves = [t.segments[i].leaf for t in trees for i in t.leaves()]
        local = torch.tensor([len(trees), sum(keep), len(leaves), sum(leaf.correct for leaf in leaves),
                              sum(leaf.reward for leaf in leaves), sum(t.n_tokens for t in trees),
                              sum(t.n_chain_tokens for t in trees)], dtype=torch.float64, device=self.accelerator.device)
        questions, kept, chains, correct, reward, unique, total = self.accelerator.reduce(local, "sum").tolist()
        # total: the chains' tokens, sum_i |o_i|
        metrics = self._metrics["train"]
        metrics["rollout/questions"].append(questions)
        metrics["rollout/kept_frac"].append(kept / max(questions, 1))
        metrics["rollout/accuracy"].append(correct / max(chains, 1))
        metrics["reward"].append(reward / max(chains, 1))
        metrics["tree/chains"].append(chains / max(questions, 1))
        metrics["rollout/chain_length"].append(total / max(chains, 1))
        metrics["tree/tokens_unique"].append(unique)
        metrics["tree/packing_gain"].append(total / max(unique, 1))

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
        logprobs, _ = model(bfspo_packed=packed)
        mask = torch.full_like(logprobs, bool(kept), dtype=torch.bool)
        loss, stats = policy_loss(logprobs, packed.old_logprobs, packed.advantages, mask, eps_low=self.epsilon_low,
                                  eps_high=self.epsilon_high, normalizer=inputs["normalizer"])
        if kept:
            for key in ("clip_frac", "clip_frac_low", "clip_frac_high", "approx_kl"):
                self._metrics["train"][f"train/{key}"].append(stats[key])
        return loss * self.accelerator.num_processes

    def training_step(self, model, inputs, num_items_in_batch):
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:
            self._update_mode.close()

