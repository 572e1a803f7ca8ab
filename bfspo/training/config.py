"""`TrainConfig`: every value of a `bfspo train` run, with its default and meaning.

Defaults follow the paper (Appendix C, App. A): LoRA r=8, alpha=16; AdamW lr 1e-6, weight decay
0.01, no schedule; a training batch of 512 chains in mini-batches of 32 (16 optimizer steps per
batch); eps_low 0.2, eps_high 0.28; G = 8 is DAPO's group size; K = 3 expansions.
A config is a YAML mapping of these fields; `key=value` overrides are parsed as YAML scalars.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import yaml

from bfspo.errors import BfspoError

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# Fields that say how a run is observed, threaded or checkpointed, not what it trains: a run
# directory resumes under a command that changes them (e.g. the same run shown by another
# config's table, which names another W&B group).
OBSERVATION_FIELDS = frozenset({"threads", "save_every", "log_trees", "wandb_project", "wandb_group", "wandb_mode",
                                "run_name", "method_key", "model_label", "tables"})


@dataclass
class TrainConfig:
    """One training run: one model, one training set, one method (DAPO = k 0, BFS-PO, or an ablation)."""

    model: str = field(metadata={"help": "Hub id or local path of the base model (e.g. Qwen/Qwen2.5-3B-Instruct)."})
    train_data: str = field(metadata={"help": "Prepared JSONL of training questions (rows with id, question, answer)."})
    benchmark: str = field(default="gsm8k_train", metadata={
        "help": "Benchmark whose prompt and verifier apply to the training questions (bfspo.tasks.benchmarks)."})

    # --- the method ---------------------------------------------------------------------------
    k: int = field(default=3, metadata={"help": "Expansion iterations K of Algorithm 1; 0 is exactly DAPO."})
    group_size: int = field(default=8, metadata={"help": "G: samples of the initial group and of each expansion."})
    selection: str = field(default="bfs", metadata={
        "help": "'bfs': backtrack on the shortest correct path (Eq. 5-6); 'entropy': the w/o-BFS ablation (Eq. 11)."})
    advantage: str = field(default="branch", metadata={
        "help": "'branch': Eq. 9 branch advantage; 'global': Eq. 1 over all chains of the tree (ablation)."})
    overlong: bool = field(default=True, metadata={
        "help": "Add DAPO's soft overlong punishment (Eq. 3) to the reward; false is the w/o R_l ablation."})
    budget: int = field(default=512, metadata={
        "help": "L_budget: most generated tokens per path. The penalty starts at 0.6*budget and reaches -1 at "
                "0.8*budget (L_cache = budget/5, L_max = budget - L_cache, Eq. 3 as written)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of the rollouts."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling threshold of the rollouts."})

    # --- batches and optimisation ---------------------------------------------------------------
    steps: int = field(default=100, metadata={"help": "Training batches (rollout + update rounds) to run."})
    train_batch_chains: int = field(default=512, metadata={
        "help": "Complete chains per training batch; BFS-PO fills it with whole trees (Sec. 4.2)."})
    mini_batch_chains: int = field(default=32, metadata={
        "help": "Chains per optimizer step; train_batch_chains / mini_batch_chains steps per batch."})
    max_gen_rounds: int = field(default=3, metadata={
        "help": "Dynamic sampling: most generation rounds spent filling one batch with informative trees."})
    max_empty_steps: int = field(default=5, metadata={
        "help": "Stop with an error after this many consecutive batches in which every tree was filtered out."})
    lr: float = field(default=1e-6, metadata={"help": "AdamW learning rate (constant, no schedule)."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (verl's DAPO default); 0 disables."})
    eps_low: float = field(default=0.2, metadata={"help": "Lower clipping range epsilon_l (Eq. 2, 10)."})
    eps_high: float = field(default=0.28, metadata={"help": "Upper clipping range epsilon_h (Eq. 2, 10)."})
    max_nonfinite: int = field(default=3, metadata={
        "help": "NaN/inf losses are skipped and counted; the run stops when the count exceeds this."})

    # --- LoRA -------------------------------------------------------------------------------------
    lora_r: int = field(default=8, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS), metadata={
        "help": "Modules that get LoRA adapters (attention and MLP projections)."})

    # --- systems ----------------------------------------------------------------------------------
    engine: str = field(default="transformers", metadata={"help": "Rollout engine: 'transformers' or 'vllm'."})
    rollout_batch_size: int = field(default=64, metadata={"help": "Most sequences the engine decodes at once."})
    tensor_parallel_size: int = field(default=1, metadata={"help": "vLLM tensor parallelism (7-8B models)."})
    gpu_memory_utilization: float = field(default=0.4, metadata={
        "help": "Fraction of GPU memory vLLM may take (it shares the GPU with training)."})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Recompute activations in the backward pass."})
    threads: int = field(default=0, metadata={"help": "torch CPU threads (0: torch's default)."})
    seed: int = field(default=0, metadata={"help": "Seed of the data order, the rollouts and LoRA's initialisation."})
    save_every: int = field(default=10, metadata={"help": "Write a checkpoint every this many steps (and at the end)."})
    log_trees: bool = field(default=True, metadata={"help": "Write every step's search trees to trees/step_NNNNN.jsonl."})

    # --- Weights & Biases -------------------------------------------------------------------------
    wandb_project: str = field(default="bfspo", metadata={"help": "W&B project."})
    wandb_group: str | None = field(default=None, metadata={"help": "W&B group (one per table or sweep)."})
    wandb_mode: str = field(default="offline", metadata={
        "help": "W&B mode: offline (default, no account; `wandb sync` later), online or disabled. "
                "The WANDB_MODE environment variable wins."})
    run_name: str | None = field(default=None, metadata={"help": "Run name (default: the output directory's name)."})
    method_key: str | None = field(default=None, metadata={
        "help": "The workflow's method key (config `methods`); tags the W&B run method:<key>."})
    model_label: str | None = field(default=None, metadata={
        "help": "The workflow's model label (config `models.<m>.label`); tags the W&B run model:<label>."})
    tables: list[str] = field(default_factory=list, metadata={
        "help": "The workflow's tables that show this run; tags the W&B run table:<name> for each."})

    def __post_init__(self):
        choices = {"selection": ("bfs", "entropy"), "advantage": ("branch", "global"),
                   "engine": ("transformers", "vllm"), "wandb_mode": ("offline", "online", "disabled")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise BfspoError(f"config: {name} must be one of {allowed}, got {getattr(self, name)!r}")
        positive = ["group_size", "budget", "steps", "train_batch_chains", "mini_batch_chains", "max_gen_rounds",
                    "max_empty_steps", "lora_r", "rollout_batch_size", "tensor_parallel_size", "save_every"]
        for name in positive:
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise BfspoError(f"config: {name} must be a positive integer, got {getattr(self, name)!r}")
        if not isinstance(self.k, int) or self.k < 0:
            raise BfspoError(f"config: k must be an integer >= 0, got {self.k!r}")
        if self.budget < 5:
            raise BfspoError(f"config: budget must be at least 5 tokens (L_cache = budget/5), got {self.budget}")
        if self.train_batch_chains % self.mini_batch_chains:
            raise BfspoError(f"config: train_batch_chains ({self.train_batch_chains}) must be a multiple of "
                             f"mini_batch_chains ({self.mini_batch_chains})")
        if not 0 < self.top_p <= 1 or self.temperature <= 0:
            raise BfspoError(f"config: need temperature > 0 and 0 < top_p <= 1, got {self.temperature}, {self.top_p}")

    @property
    def method(self) -> str:
        """A readable name of the variant: dapo, bfspo, no_bfs, global, no_overlong (or a combination)."""
        if self.k == 0:
            return "dapo" if self.overlong else "dapo_no_overlong"
        parts = [p for p, on in (("no_bfs", self.selection == "entropy"), ("global", self.advantage == "global"),
                                 ("no_overlong", not self.overlong)) if on]
        return "+".join(parts) or "bfspo"

    def to_dict(self) -> dict:
        return asdict(self)


def parse_overrides(pairs: list[str]) -> dict:
    """`key=value` strings -> dict, values parsed as YAML scalars (true, 3, 1e-6, [a, b], null)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BfspoError(f"override {pair!r} is not of the form key=value")
        out[key.strip()] = yaml.safe_load(value)
    return out


def load_config(path: str | None, overrides: list[str]) -> TrainConfig:
    """A TrainConfig from an optional YAML file plus key=value overrides; unknown keys are errors."""
    values: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise BfspoError(f"{path}: no such config file")
        loaded = yaml.safe_load(p.read_text()) or {}
        if not isinstance(loaded, dict):
            raise BfspoError(f"{path}: a config must be a YAML mapping of TrainConfig fields")
        values.update(loaded)
    values.update(parse_overrides(overrides))
    known = {f.name: f for f in fields(TrainConfig)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise BfspoError(f"config: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(known)}")
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
