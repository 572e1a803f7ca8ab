"""`BFSPOConfig`: TRL's GRPOConfig plus BFS-PO's fields.

Each BFS-PO field has the default and the help text of its `TrainConfig` field
(bfspo/training/config.py), and the allowed values come from where TrainConfig gets them, so the two
trainers cannot drift. TRL's own settings keep their meaning, read for BFS-PO as follows (docs/trl.md):

- `num_generations` is G: the answers of a question's initial group and of each expansion;
- `max_completion_length` is L_budget: no root-to-leaf path holds more generated tokens;
- a generation batch (`per_device_train_batch_size` x processes x `steps_per_generation` completions
  for GRPO) holds `generation_batch_size / num_generations` questions, as for GRPOTrainer; each grows
  a tree of up to (K + 1) G chains, trained in `steps_per_generation` micro-steps of whole trees;
- `epsilon` / `epsilon_high` are eps_low / eps_high of Eq. 10 (the paper's 0.2 / 0.28 by default);
- `max_completion_length` also sets Eq. 3's overlong penalty: L_cache = budget / 5, so at TRL's default
  256 an answer past about 154 tokens (the `paper` window) is penalised; set it to your budget.

The class docstring's `Parameters:` section, in TRL's form, is generated from the fields' help.
"""

from __future__ import annotations

import textwrap
from dataclasses import MISSING, dataclass, field, fields

from trl import GRPOConfig

from bfspo.algorithm.loss import EPS_HIGH
from bfspo.training.config import TrainConfig, number_problem
from bfspo.training.config import choices as train_choices

_TRAIN_FIELDS = {f.name: f for f in fields(TrainConfig)}


def _as_in_train_config(name: str):
    """A dataclass field with TrainConfig's default and help for `name`."""
    f = _TRAIN_FIELDS[name]
    return field(default=f.default if f.default is not MISSING else None, metadata={"help": f.metadata["help"]})


# the fields whose allowed values are TrainConfig's (bfspo.training.config.choices)
CHOICE_FIELDS = ("selection", "filter", "advantage", "overlong_window", "tree_attention")
# a TRL field -> TrainConfig's number field of the same meaning, whose bounds it is checked against
NUMBERS = {"epsilon": "eps_low", "epsilon_high": "eps_high", "temperature": "temperature", "top_p": "top_p",
           "learning_rate": "lr", "weight_decay": "weight_decay", "max_grad_norm": "max_grad_norm"}


@dataclass
class BFSPOConfig(GRPOConfig):
    """GRPOConfig plus the fields of BFS-PO (Algorithm 1, Eq. 3-4, 8-10); see the module docstring for
    how GRPOConfig's batch and generation settings map onto G, questions per step and the budget.

    `max_completion_length` is L_budget, and Eq. 3's overlong penalty keys off it (L_cache = budget / 5):
    at TRL's default of 256 the `paper` window penalises answers past about 154 tokens. Set it to the
    longest answer you mean to allow."""

    k: int = _as_in_train_config("k")
    selection: str = _as_in_train_config("selection")
    filter: str = field(default=_TRAIN_FIELDS["filter"].default, metadata={"help": (
        _TRAIN_FIELDS["filter"].metadata["help"] + " Under TRL the data loader fixes the questions of a step: a "
        "filtered tree is left out of the loss, not replaced by another question (docs/trl.md).")})
    advantage: str = _as_in_train_config("advantage")
    verdict_reward: str | None = field(default=None, metadata={"help": (
        "Name of the reward function (its __name__, as in TRL's `rewards/<name>/mean`) whose value says whether a "
        "chain is correct (positive: correct; None or NaN: wrong): v(o, a*) of Eq. 4, which picks Algorithm 1's "
        "shortest correct answer and Eq. 3-4's +-1. Default: the only reward function, or the one verifier_reward "
        "made. Every other function adds its weighted value to the leaf reward (docs/trl.md).")})
    overlong: bool = _as_in_train_config("overlong")
    overlong_window: str = _as_in_train_config("overlong_window")
    micro_batch_tokens: int = field(default=_TRAIN_FIELDS["micro_batch_tokens"].default, metadata={"help": (
        "Most row tokens in one no-grad forward of the rescoring that gives every sampled token its old log-prob "
        "and the entropy after it (bfspo/rollout/rescore.py); must exceed the longest prompt plus the budget. The "
        "update packs each micro-step's trees in one row: its size is set by TRL's batch settings.")})
    tree_attention: str = _as_in_train_config("tree_attention")
    log_trees: int = field(default=_TRAIN_FIELDS["log_trees"].default, metadata={"help": (
        "Search trees written per generation batch to output_dir/trees/step_NNNNN.jsonl (NNNNN: the first "
        "optimizer step they train), with their token text, for `bfspo tree show` and `bfspo tree stats`: the first "
        "N, split over the processes; -1 every tree, 0 none.")})
    epsilon_high: float = field(default=EPS_HIGH, metadata={"help": "eps_high of Eq. 10 (the paper's 0.28)."})
    vllm_importance_sampling_correction: bool = field(default=False, metadata={"help": (
        "Must stay False: BFS-PO's old log-probs are the training model's rescoring of the samples, whatever "
        "engine drew them (docs/algorithm.md, 'Old log-probs'), so there is no engine mismatch to correct.")})

    def __post_init__(self):
        super().__post_init__()
        allowed_values = train_choices()
        for name in CHOICE_FIELDS:
            allowed = allowed_values[name]
            if getattr(self, name) not in allowed:
                raise ValueError(f"BFSPOConfig: {name} must be one of {allowed}, got {getattr(self, name)!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 0:
            raise ValueError(f"BFSPOConfig: k must be an integer >= 0, got {self.k!r}")
        if not isinstance(self.overlong, bool):
            raise ValueError(f"BFSPOConfig: overlong must be true or false, got {self.overlong!r}")
        for name, theirs in NUMBERS.items():
            problem = number_problem(theirs, getattr(self, name))
            if problem:
                raise ValueError(f"BFSPOConfig: {name} (bfspo train's {theirs}) {problem}")
        if isinstance(self.log_trees, bool) or not isinstance(self.log_trees, int) or self.log_trees < -1:
            raise ValueError(f"BFSPOConfig: log_trees must be a number of trees, -1 for all or 0 for none, "
                             f"got {self.log_trees!r}")
        if self.verdict_reward is not None and not (isinstance(self.verdict_reward, str) and self.verdict_reward):
            raise ValueError(f"BFSPOConfig: verdict_reward must name a reward function, got {self.verdict_reward!r}")
        if self.max_completion_length is None or self.max_completion_length < 5:
            raise ValueError("BFSPOConfig: max_completion_length is L_budget and must be at least 5 tokens "
                             f"(L_cache = budget/5), got {self.max_completion_length!r}")


def parameters_doc(cls) -> str:
    """TRL's `Parameters:` section for the fields `cls` adds to GRPOConfig, from their help."""
    own = [f for f in fields(cls) if f.name not in GRPOConfig.__dataclass_fields__
           or f.metadata.get("help") != GRPOConfig.__dataclass_fields__[f.name].metadata.get("help")]
    lines = ["Parameters:", "", "    > Parameters of BFS-PO (and GRPOConfig's that BFS-PO reads its own way)", ""]
    for f in own:
        kind = getattr(f.type, "__name__", str(f.type))
        lines.append(f"    {f.name} (`{kind}`, *optional*, defaults to `{f.default!r}`):")
        lines += textwrap.wrap(f.metadata["help"], 100, initial_indent=" " * 8, subsequent_indent=" " * 8)
    return "\n".join(lines)


BFSPOConfig.__doc__ = BFSPOConfig.__doc__ + "\n\n" + textwrap.indent(parameters_doc(BFSPOConfig), "    ")
