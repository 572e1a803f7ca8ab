"""`TrainConfig`: every value of a `bfspo train` run, with its default and meaning.

Defaults follow the paper (Appendix C, App. A): LoRA r=8, alpha=16; AdamW lr 1e-6, weight decay
0.01, no schedule; a training batch of 512 in mini-batches of 32 (16 optimizer steps per batch),
counted in chains unless `batch_unit: prompts` (config/README.md says which reading paper.yaml
takes and why); eps_low 0.2, eps_high 0.28; K = 3 expansions. The paper never states G: the
default G = 8 is ours (DAPO's recipe uses 16 answers per prompt). Dynamic sampling fills every
batch as verl's DAPO recipe does: 3x the questions needed, up to 10 generation rounds.
A config is a YAML mapping of these fields; `key=value` overrides are parsed as YAML scalars.
This module imports no torch (tests/test_train_help.py checks it): `bfspo train` checks its
arguments against these fields before it imports the trainer (bfspo/training/cli.py).
"""

from __future__ import annotations

import difflib
import math
import textwrap
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from bfspo.algorithm.advantages import ADVANTAGES, FILTERS
from bfspo.algorithm.attention_options import ATTENTIONS, BUCKET_TOKENS, MAX_BUCKETS
from bfspo.algorithm.rewards import WINDOWS
from bfspo.algorithm.search import SELECTIONS
from bfspo.device import DEVICES
from bfspo.errors import BfspoError
from bfspo.io import parse_yaml, read_yaml
from bfspo.rollout.streamed import ROLLOUTS, resolve_rollout
from bfspo.training.batching import SAMPLINGS

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
KEYS_HELP = "every key, with its default and meaning: bfspo train --help, or config/README.md, section train"


# Fields that say how a run is observed, threaded or checkpointed, or how much memory it takes, not
# what it trains: a run directory resumes under a command that changes them (e.g. the same run shown
# by another config's table, which names another W&B group, or a run resumed with less memory after
# an OOM). None of them changes which questions or samples are trained on; the memory and attention
# ones change at most the float rounding of the same computation.
OBSERVATION_FIELDS = frozenset({"threads", "save_every", "log_trees", "wandb_project", "wandb_group", "wandb_mode",
                                "wandb_tags", "run_name", "method_key", "model_label", "tables", "val_every",
                                "val_data", "val_benchmark", "val_questions", "collective_timeout_min",
                                # memory only: smaller micro-batches; activations recomputed in the backward
                                # pass (the same operations on the same values)
                                "micro_batch_tokens", "gradient_checkpointing",
                                # how the same attention is computed (float rounding only): a run whose
                                # flex kernel fails resumes with tree_attention: blockwise
                                "tree_attention", "attention_bucket",
                                "device"})  # where: `cuda` (the workflow's GPU classes) is `auto` on a GPU node
# Where the inputs are: a run is the content of its model, tokenizer and training data, which
# inputs.json records and each start compares (bfspo.fingerprint), not their paths. The same bytes
# moved or copied elsewhere (a results folder moved, a hub id's snapshot given as a folder) are the
# same run; other bytes at any path are other inputs (the run is set aside and trained afresh).
INPUT_PATHS = frozenset({"model", "train_data"})
# vLLM's memory: the most sequences it runs at once and its KV cache. Memory only where vLLM is not
# the engine (unused), or where the rollout is lockstep and every request carries its own seed: a
# sample then depends on its place in its tree, not on what ran beside it. Elsewhere they change
# the samples: a streamed rollout adds questions as the engine has room (max_num_seqs) and as trees
# finish (the KV cache paces them), which moves the data order of later steps; and an engine seeded
# once hands its random numbers out in the order its scheduler runs the requests.
VLLM_MEMORY_FIELDS = frozenset({"gpu_memory_utilization", "max_num_seqs"})


def identity_ignores(values: dict) -> frozenset[str]:
    """The fields in which a run directory's config.json may differ from `values` (a config's
    `to_dict()`) and still hold the run that `values` asks for: OBSERVATION_FIELDS, INPUT_PATHS
    (compared by content instead), and VLLM_MEMORY_FIELDS where they cannot change a sample."""
    engine = values.get("engine")
    seeded_lockstep = (resolve_rollout(values.get("rollout", "auto"), engine) == "lockstep"
                       and values.get("per_request_seeds") is True)
    memory = VLLM_MEMORY_FIELDS if engine != "vllm" or seeded_lockstep else frozenset()
    return OBSERVATION_FIELDS | INPUT_PATHS | memory


MAX_LR = 1.0
MAX_WEIGHT_DECAY = 1.0
MAX_OVERSAMPLE = 100.0

# The float fields: what a valid value is, besides finite (NaN fails every comparison, and an
# infinite value is never meant). The upper bounds on lr and weight_decay are argued in their help.
_NUMBER_BOUNDS = {
    "lr": (lambda v: 0 < v <= MAX_LR, f"> 0 and at most {MAX_LR:g}"),
    "weight_decay": (lambda v: 0 <= v <= MAX_WEIGHT_DECAY, f">= 0 and at most {MAX_WEIGHT_DECAY:g}"),
    "max_grad_norm": (lambda v: v >= 0, ">= 0 (0 disables clipping)"),
    "eps_low": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "eps_high": (lambda v: v >= 0, ">= 0"),
    "lora_dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "temperature": (lambda v: v > 0, "> 0"),
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "gpu_memory_utilization": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "oversample": (lambda v: 1 <= v <= MAX_OVERSAMPLE,
                   f">= 1 and at most {MAX_OVERSAMPLE:g} (questions generated per question needed)"),
}


def choices() -> dict[str, tuple]:
    """Field -> its allowed values, from their one source, read at each call (an advantage variant
    registered in ADVANTAGES after import is allowed at once); TrainConfig checks them, BFSPOConfig
    takes its fields' from here."""
    return {"selection": SELECTIONS, "advantage": tuple(ADVANTAGES), "overlong_window": WINDOWS,
            "engine": ("transformers", "vllm"), "wandb_mode": ("offline", "online", "disabled"),
            "batch_unit": ("chains", "prompts"), "filter": FILTERS, "tree_attention": ATTENTIONS,
            "device": DEVICES, "rollout": ROLLOUTS, "sampling": SAMPLINGS}


def number_problem(name: str, value) -> str | None:
    """What is wrong with `value` for the number field `name` (one of `_NUMBER_BOUNDS`), or None;
    the TRL trainer's config checks its own spellings of these fields with it."""
    ok, bounds = _NUMBER_BOUNDS[name]
    if not _is_number(value) or not ok(value):
        return f"must be a number {bounds}, got {value!r}"
    if not math.isfinite(value):
        return f"must be a finite number {bounds}, got {value!r}"
    return None


@dataclass
class TrainConfig:
    """One training run: one model, one training set, one method (DAPO = k 0, BFS-PO, or an ablation)."""

    model: str = field(metadata={"help": "Hub id or local path of the base model (e.g. Qwen/Qwen2.5-3B-Instruct)."})
    train_data: str = field(metadata={"help": "Prepared JSONL of training questions (rows with id, question, answer)."})
    benchmark: str = field(default="gsm8k_train", metadata={
        "help": "Benchmark whose prompt and verifier apply to the training questions (bfspo.tasks.benchmarks)."})
    limit: int = field(default=0, metadata={
        "help": "Train on the first N questions of train_data only (0: all of them; the rehearsal's stand-ins "
                "are fine-tuned on the same N)."})

    # --- the method ---------------------------------------------------------------------------
    k: int = field(default=3, metadata={"help": "Expansion iterations K of Algorithm 1; 0 is exactly DAPO."})
    group_size: int = field(default=8, metadata={"help": "G: samples of the initial group and of each expansion."})
    selection: str = field(default="bfs", metadata={
        "help": "'bfs': backtrack on the shortest correct path (Eq. 5-6); 'entropy': the w/o-BFS ablation (Eq. 11)."})
    advantage: str = field(default="branch", metadata={
        "help": "A variant of ADVANTAGES (bfspo/algorithm/advantages.py): 'branch', Eq. 9 branch advantage; "
                "'global', Eq. 1 over all chains of the tree (ablation)."})
    overlong: bool = field(default=True, metadata={
        "help": "Add DAPO's soft overlong punishment (Eq. 3) to the reward; false is the w/o R_l ablation."})
    overlong_window: str = field(default="paper", metadata={
        "help": "Where Eq. 3's penalty ramps (L_cache = budget/5): 'paper' is App. D's L_max = budget - L_cache, "
                "from 0 at 0.6*budget to -1 at 0.8*budget; 'dapo' is DAPO's/verl's L_max = budget, over "
                "(0.8*budget, budget] (bfspo/algorithm/rewards.py)."})
    filter: str = field(default="all_leaves", metadata={
        "help": "Dynamic sampling, DAPO's 0 < #correct < G (Eq. 2) read on a tree: 'all_leaves' keeps a tree iff "
                "some but not all of its leaves are correct; 'first_samples' applies it to the G first answers, "
                "before the search, and does not expand a tree that fails it (docs/algorithm.md). Same at K = 0. "
                "'none' keeps every tree (no dynamic sampling, as TRL's GRPOTrainer; bench/bench_peer_trl.py). "
                "config/paper.yaml sets 'first_samples' (the toy breakdown study); the default is the reading "
                "the recorded toy results were trained with."})
    budget: int = field(default=512, metadata={
        "help": "L_budget: most generated tokens per path (and the scale of the overlong window)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of the rollouts."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling threshold of the rollouts."})

    # --- batches and optimisation ---------------------------------------------------------------
    steps: int = field(default=100, metadata={"help": "Training batches (rollout + update rounds) to run."})
    batch_unit: str = field(default="chains", metadata={
        "help": "What train_batch and mini_batch count: 'chains' (complete chains) or 'prompts' (DAPO's recipe: "
                "prompts of G answers each, so a batch holds train_batch * G chains). Either way BFS-PO fills a "
                "batch with that many chains through several whole trees (Sec. 4.2)."})
    train_batch: int = field(default=512, metadata={
        "help": "Training batch size in batch_unit; train_batch / mini_batch optimizer steps per batch."})
    mini_batch: int = field(default=32, metadata={"help": "Mini-batch size (one optimizer step) in batch_unit."})
    oversample: float = field(default=3.0, metadata={
        "help": "Dynamic sampling: each generation round asks for at most this many times the questions the "
                "missing chains need (sampling: keep_rate), or exactly this many (sampling: fixed; verl's DAPO recipe "
                f"generates for 3x its training prompts); at most {MAX_OVERSAMPLE:g}, where one round already "
                "generates for a hundred batches."})
    sampling: str = field(default="keep_rate", metadata={
        "help": "Dynamic sampling's rule for how many questions a round asks (a streamed rollout: keeps in flight): "
                "'keep_rate' asks for the questions the batch will keep, at the keep rate observed so far in the run "
                "(carried across steps and in the checkpoint), at least 1x and at most oversample times the need; "
                "'fixed' asks oversample times the need at every step, verl's DAPO recipe exactly "
                "(docs/algorithm.md, 'Filling the batch')."})
    max_gen_rounds: int = field(default=10, metadata={
        "help": "Dynamic sampling: most generation rounds spent filling one batch (verl's DAPO recipe: 10); a batch "
                "still short after them is trained as it is and logged with batch_full 0."})
    max_empty_steps: int = field(default=5, metadata={
        "help": "Stop with an error after this many consecutive batches in which every tree was filtered out."})
    lr: float = field(default=1e-6, metadata={
        "help": f"AdamW learning rate (constant, no schedule), at most {MAX_LR:g}: Adam moves each weight by about lr "
                "per step whatever the gradient's scale, so a larger lr moves weights of typical size (0.01-0.1) by "
                "10-100 times their size in one step (RL with LoRA uses 1e-6 to 1e-4)."})
    weight_decay: float = field(default=0.01, metadata={
        "help": f"AdamW (decoupled) weight decay, at most {MAX_WEIGHT_DECAY:g}: each step multiplies the weights by "
                "1 - lr * weight_decay, which then stays in [0, 1) (with lr <= 1), so decay never flips a weight's "
                "sign or grows it (the usual values are 0 to 0.1)."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (verl's DAPO default); 0 disables."})
    eps_low: float = field(default=0.2, metadata={"help": "Lower clipping range epsilon_l (Eq. 2, 10)."})
    eps_high: float = field(default=0.28, metadata={"help": "Upper clipping range epsilon_h (Eq. 2, 10)."})
    max_nonfinite: int = field(default=3, metadata={
        "help": "Optimizer steps with a NaN/inf loss or gradient, or whose update would make a weight NaN/inf, are "
                "skipped (the weights and optimizer state stay as they were) and counted; the run stops when the "
                "count exceeds this."})

    # --- LoRA -------------------------------------------------------------------------------------
    lora_r: int = field(default=8, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS), metadata={
        "help": "Modules that get LoRA adapters (attention and MLP projections)."})

    # --- systems ----------------------------------------------------------------------------------
    engine: str = field(default="transformers", metadata={"help": "Rollout engine: 'transformers' or 'vllm'."})
    rollout: str = field(default="auto", metadata={
        "help": "How the trees are grown: 'lockstep' (K+1 batched engine calls per generation round, each "
                "waiting for its longest chain), 'streamed' (vLLM only: one engine loop in which each tree "
                "expands as soon as its G samples finish, and dynamic sampling adds a question as soon as the "
                "engine has room; the batch is taken in the order the questions were drawn, never by finish "
                "time), or 'auto': streamed on vllm, lockstep on transformers (docs/algorithm.md, "
                "'Streamed rollout')."})
    rollout_batch_size: int = field(default=64, metadata={
        "help": "Most sequences the transformers engine decodes at once (vLLM's limit is max_num_seqs)."})
    max_num_seqs: int = field(default=512, metadata={
        "help": "vLLM: most sequences decoded at once (its scheduler's max_num_seqs; the KV cache may hold "
                "fewer). A lockstep call hands vLLM all its requests together; a streamed rollout adds a "
                "question while the engine holds fewer."})
    per_request_seeds: bool | None = field(default=None, metadata={
        "help": "vLLM: true seeds every request (reproducible on CPU; on GPUs vLLM then samples seeded requests "
                "one at a time); false seeds the engine once (LLM(seed=...)); null: true on CPU, false on CUDA "
                "(docs/algorithm.md, 'Seeds and reproducibility')."})
    tensor_parallel_size: int = field(default=1, metadata={"help": "vLLM tensor parallelism (7-8B models)."})
    gpu_memory_utilization: float = field(default=0.4, metadata={
        "help": "Fraction of GPU memory vLLM may take while it generates (it shares the GPU with training; on "
                "CUDA it sleeps, its memory freed, during each update)."})
    collective_timeout_min: int = field(default=120, metadata={
        "help": "Minutes a rank waits in a collective (torch.distributed's timeout, NCCL's watchdog) before the "
                "run fails. Ranks wait for each other once per generation round and per mini-batch, so this "
                "must exceed the longest generation round (PyTorch's default is 10 minutes under NCCL)."})
    micro_batch_tokens: int = field(default=16384, metadata={
        "help": "Most tokens (prompts, tree tokens and the ancestors of a split tree's piece) in one forward pass "
                "of the update and of the training-side rescoring: a mini-batch's gradient is accumulated over "
                "micro-batches of whole trees, and a longer tree is cut into pieces (bfspo/algorithm/packing.py). "
                "It must exceed the longest prompt plus the budget. The GPU memory of the update scales with it "
                "(as verl's ppo_max_token_len_per_gpu, whose default 16384 is ours); changing it changes no result "
                "beyond float rounding."})
    tree_attention: str = field(default="auto", metadata={
        "help": "The attention kernel of the update's and the rescoring's packed rows (bfspo/algorithm/"
                "attention_options.py): 'flex' (torch's compiled flex attention: fast, CUDA), 'blockwise' (query "
                "blocks through torch's attention kernels: no compiler, CPU and CUDA), 'dense' (a [T, T] mask: the "
                "reference, quadratic memory), 'auto' (flex on CUDA, blockwise on CPU). If flex fails to compile "
                "or run on a cluster, 'blockwise' is the way out: same results up to float rounding, slower on "
                "GPUs; a run resumes with it."})
    attention_bucket: int = field(default=BUCKET_TOKENS, metadata={
        "help": "flex only: each packed row is padded to the next multiple of this many tokens (at most "
                "micro_batch_tokens), so that flex is compiled once per length (and autograd mode), not once per "
                f"row; at most {MAX_BUCKETS} lengths (a larger step where micro_batch_tokens / attention_bucket "
                "would give more). Smaller: less padding, more compiles (each some seconds to a minute, at the "
                "first row of its length)."})
    device: str = field(default="auto", metadata={
        "help": "'cuda', 'cpu' or 'auto' (CUDA if torch can use it, else the CPU). 'cuda' without a usable CUDA "
                "device stops the run at once, naming torch's CUDA build, the driver and CUDA_VISIBLE_DEVICES "
                "(bfspo/device.py); the workflow passes it to the jobs of GPU size classes."})
    gradient_checkpointing: bool = field(default=False, metadata={
        "help": "Recompute activations in the backward pass: less memory, the same numbers (a run resumes with it "
                "changed)."})
    threads: int = field(default=0, metadata={"help": "torch CPU threads (0: torch's default)."})
    seed: int = field(default=0, metadata={"help": "Seed of the data order, the rollouts and LoRA's initialisation."})
    save_every: int = field(default=10, metadata={"help": "Write a checkpoint every this many steps (and at the end)."})
    log_trees: int = field(default=8, metadata={
        "help": "Search trees written per step to trees/step_NNNNN.jsonl, with their token text: the first N "
                "generated (a random sample of questions, split over the ranks); -1 writes every tree (the toy: "
                "the paired tables and the tree figures read them all), 0 none. docs/workflow.md sizes the logs."})

    # --- validation -------------------------------------------------------------------------------
    val_every: int = field(default=0, metadata={
        "help": "Every N steps (and at the last), answer the held-out questions greedily and log their accuracy "
                "and length (val-core/); 0 never. Validation does not change training."})
    val_data: str | None = field(default=None, metadata={
        "help": "Prepared JSONL of held-out questions for validation (e.g. a test split; the workflow takes the "
                "train set's val_data)."})
    val_benchmark: str | None = field(default=None, metadata={
        "help": "Benchmark whose prompt and verifier apply to val_data (default: benchmark)."})
    val_questions: int = field(default=64, metadata={"help": "Validate on the first N questions of val_data."})

    # --- Weights & Biases -------------------------------------------------------------------------
    wandb_project: str = field(default="bfspo", metadata={"help": "W&B project."})
    wandb_group: str | None = field(default=None, metadata={"help": "W&B group (one per table or sweep)."})
    wandb_tags: list[str] = field(default_factory=list, metadata={
        "help": "W&B tags added to the workflow's (config `wandb.tags`; the rehearsal's runs carry `rehearsal`)."})
    wandb_mode: str = field(default="offline", metadata={
        "help": "W&B mode: offline (default, no account; `bfspo sync` later), online or disabled. "
                "The WANDB_MODE environment variable wins."})
    run_name: str | None = field(default=None, metadata={"help": "Run name (default: the output directory's name)."})
    method_key: str | None = field(default=None, metadata={
        "help": "The workflow's method key (config `methods`); tags the W&B run method:<key>."})
    model_label: str | None = field(default=None, metadata={
        "help": "The workflow's model label (config `models.<m>.label`); tags the W&B run model:<label>."})
    tables: list[str] = field(default_factory=list, metadata={
        "help": "The workflow's tables that show this run; tags the W&B run table:<name> for each."})

    def __post_init__(self):
        if isinstance(self.lora_target_modules, str):  # `lora_target_modules=q_proj` or `q_proj,v_proj`
            self.lora_target_modules = [m.strip() for m in self.lora_target_modules.split(",") if m.strip()]
        for name in ("model", "train_data", "benchmark"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise BfspoError(f"config: {name} must be a non-empty string, got {getattr(self, name)!r}")
        modules = self.lora_target_modules
        if not isinstance(modules, list) or not modules or not all(isinstance(m, str) and m for m in modules):
            raise BfspoError(f"config: lora_target_modules must be a non-empty list of module names, got {modules!r}")
        for name, allowed in choices().items():
            if getattr(self, name) not in allowed:
                raise BfspoError(f"config: {name} must be one of {allowed}, got {getattr(self, name)!r}")
        positive = ["group_size", "budget", "steps", "train_batch", "mini_batch", "max_gen_rounds",
                    "max_empty_steps", "lora_r", "lora_alpha", "rollout_batch_size", "tensor_parallel_size", "save_every",
                    "val_questions", "micro_batch_tokens", "max_num_seqs", "collective_timeout_min", "attention_bucket"]
        for name in positive:
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise BfspoError(f"config: {name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("k", "limit", "threads", "seed", "max_nonfinite", "val_every"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 0:
                raise BfspoError(f"config: {name} must be an integer >= 0, got {getattr(self, name)!r}")
        if resolve_rollout(self.rollout, self.engine) == "streamed" and self.engine != "vllm":
            raise BfspoError(f"config: rollout: streamed needs engine: vllm (the {self.engine} engine has no "
                             "request-level loop); use rollout: lockstep or auto")
        if not (self.per_request_seeds is None or isinstance(self.per_request_seeds, bool)):
            raise BfspoError(f"config: per_request_seeds must be true, false or null, got {self.per_request_seeds!r}")
        for name in _NUMBER_BOUNDS:
            problem = number_problem(name, getattr(self, name))
            if problem:
                raise BfspoError(f"config: {name} {problem}")
        if isinstance(self.log_trees, bool) or not _is_int(self.log_trees) or self.log_trees < -1:
            raise BfspoError(f"config: log_trees must be a number of trees per step, -1 for all of them (was true) or "
                             f"0 for none (was false), got {self.log_trees!r}")
        if self.val_every and not self.val_data:
            raise BfspoError(f"config: val_every is {self.val_every} but no val_data names the held-out questions")
        if not isinstance(self.wandb_tags, list) or not all(isinstance(t, str) and t for t in self.wandb_tags):
            raise BfspoError(f"config: wandb_tags must be a list of non-empty strings, got {self.wandb_tags!r}")
        if self.budget < 5:
            raise BfspoError(f"config: budget must be at least 5 tokens (L_cache = budget/5), got {self.budget}")
        if self.train_batch % self.mini_batch:
            raise BfspoError(f"config: train_batch ({self.train_batch}) must be a multiple of "
                             f"mini_batch ({self.mini_batch})")
        if self.group_size == 1 and self.k == 0:
            raise BfspoError("config: group_size 1 with k 0 gives each question a single answer, which dynamic "
                             "sampling always filters out (it keeps a group only if some but not all answers are "
                             "right); use group_size >= 2 or k >= 1")

    @property
    def chains_per_question(self) -> int:
        """G (K + 1): the complete chains of a fully expanded tree (a DAPO group when K = 0)."""
        return self.group_size * (self.k + 1)

    @property
    def chains_per_unit(self) -> int:
        """Chains that one unit of train_batch / mini_batch stands for: 1, or G under 'prompts'."""
        return self.group_size if self.batch_unit == "prompts" else 1

    @property
    def train_batch_chains(self) -> int:
        """Complete chains per training batch, for DAPO and BFS-PO alike (Sec. 4.2)."""
        return self.train_batch * self.chains_per_unit

    def rank_chains(self, world: int) -> int:
        """Complete chains in one rank's share of a batch, when `world` ranks split it. Each rank must
        get whole units: under 'prompts' a rank with half a prompt would still train a whole group,
        and the batch would silently grow."""
        if self.train_batch % world:
            raise BfspoError(f"config: train_batch ({self.train_batch} {self.batch_unit}) must be a multiple of "
                             f"the number of ranks ({world})")
        return self.train_batch_chains // world

    @property
    def mini_batch_chains(self) -> int:
        """Complete chains per optimizer step."""
        return self.mini_batch * self.chains_per_unit

    @property
    def method(self) -> str:
        """A readable name of the variant: dapo, bfspo, no_bfs, an advantage other than branch (global),
        no_overlong, or a combination."""
        if self.k == 0:
            return "dapo" if self.overlong else "dapo_no_overlong"
        parts = [p for p, on in (("no_bfs", self.selection == "entropy"), (self.advantage, self.advantage != "branch"),
                                 ("no_overlong", not self.overlong)) if on]
        return "+".join(parts) or "bfspo"

    def to_dict(self) -> dict:
        return asdict(self)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # YAML's `true` is no K=1


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def config_help(width: int = 100) -> str:
    """Every TrainConfig key with its type, default and help text (`bfspo train --help`)."""
    lines = ["config keys (in --config, or --set KEY=VALUE):"]
    for f in fields(TrainConfig):
        if f.default is not MISSING:
            default = f"default {f.default!r}"
        elif f.default_factory is not MISSING:
            default = f"default {f.default_factory()!r}"
        else:
            default = "required"
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        lines.append(f"  {f.name} ({kind}; {default})")
        lines += textwrap.wrap(f.metadata["help"], width, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines)


def parse_overrides(pairs: list[str]) -> dict:
    """`key=value` strings -> dict, values parsed as YAML scalars (true, 3, 1e-6, [a, b], null)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BfspoError(f"override {pair!r} is not of the form key=value")
        out[key.strip()] = parse_yaml(value, f"override {pair!r}: the value")
    return out


def load_train_config(path: str | None, overrides: list[str]) -> TrainConfig:
    """A TrainConfig from an optional YAML file plus key=value overrides; unknown keys are errors."""
    values: dict = {}
    if path is not None:
        if not Path(path).is_file():
            raise BfspoError(f"{path}: no such config file")
        loaded = read_yaml(path) or {}
        if not isinstance(loaded, dict):
            raise BfspoError(f"{path}: a config must be a YAML mapping of TrainConfig fields")
        values.update(loaded)
    values.update(parse_overrides(overrides))
    return config_from_values(values)


def unknown_key(key: str) -> str:
    """Why `key` is no TrainConfig field, with the closest field (difflib) and where every field is
    described, in place of the list of them all."""
    close = difflib.get_close_matches(key, [f.name for f in fields(TrainConfig)], n=1, cutoff=0.6)
    return f"unknown key '{key}'" + (f"; did you mean '{close[0]}'?" if close else "") + f" ({KEYS_HELP})"


def config_from_values(values: dict) -> TrainConfig:
    """A TrainConfig from a mapping of its fields, as a YAML config or `--set` overrides give them (a
    number may come as a string); unknown or missing keys and values of the wrong type are errors.
    The workflow checks every planned run through this too (bfspo.pipeline.preflight)."""
    values = dict(values)
    known = {f.name: f for f in fields(TrainConfig)}
    unknown = sorted(set(values) - set(known), key=str)
    if unknown:
        raise BfspoError("config: " + "; ".join(unknown_key(str(k)) for k in unknown))
    missing = [n for n, f in known.items() if f.default is MISSING and f.default_factory is MISSING and n not in values]
    if missing:
        raise BfspoError(f"config: missing required key(s) {', '.join(missing)}")
    for name, value in values.items():
        default = known[name].default
        if isinstance(default, float) and not isinstance(value, bool):
            try:  # YAML reads 1e-6 (no dot) as a string
                values[name] = float(value)
            except (TypeError, ValueError):
                raise BfspoError(f"config: {name} must be a number, got {value!r}") from None
        elif isinstance(default, bool) and not isinstance(value, bool):
            raise BfspoError(f"config: {name} must be true or false, got {value!r}")
    return TrainConfig(**values)
