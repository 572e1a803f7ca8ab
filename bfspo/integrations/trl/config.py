"""`BFSPOConfig`: TRL's GRPOConfig plus BFS-PO's fields.

Each BFS-PO field has the default and the help text of its `TrainConfig` field
(bfspo/training/config.py), and the allowed values come from where TrainConfig gets them, so the two
trainers cannot drift. TRL's own settings keep their meaning, read for BFS-PO as follows (docs/trl.md):

- `num_generations` is G: the answers of a question's initial group and of each expansion;
- `max_completion_length` is L_budget: no root-to-leaf path holds more generated tokens;
- a generation batch (`per_device_train_batch_size` x processes x `steps_per_generation` completions
  for GRPO) holds `generation_batch_size / num_generations` questions, as for GRPOTrainer; each grows
  a tree of up to (K + 1) G chains, trained in `steps_per_generation` micro-steps of whole trees;
- `epsilon` / `epsilon_high` are eps_low / eps_high of Eq. 10 (the paper's 0.2 / 0.28 by default).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

from trl import GRPOConfig

from bfspo.algorithm.advantages import ADVANTAGES, FILTERS
from bfspo.algorithm.attention_options import ATTENTIONS
from bfspo.algorithm.loss import EPS_HIGH
from bfspo.algorithm.rewards import WINDOWS
from bfspo.algorithm.search import SELECTIONS
from bfspo.training.config import TrainConfig

_TRAIN_FIELDS = {f.name: f for f in fields(TrainConfig)}


def _as_in_train_config(name: str):
    """A dataclass field with TrainConfig's default and help for `name`."""
    f = _TRAIN_FIELDS[name]
    return field(default=f.default if f.default is not MISSING else None, metadata={"help": f.metadata["help"]})


# field -> its allowed values, from their one source (as TrainConfig.__post_init__ checks them)
CHOICES = {"selection": SELECTIONS, "filter": FILTERS, "advantage": tuple(ADVANTAGES), "overlong_window": WINDOWS,
           "tree_attention": ATTENTIONS}


@dataclass
class BFSPOConfig(GRPOConfig):
    """GRPOConfig plus the fields of BFS-PO (Algorithm 1, Eq. 3-4, 8-10); see the module docstring for
    how GRPOConfig's batch and generation settings map onto G, questions per step and the budget."""

    k: int = _as_in_train_config("k")
    selection: str = _as_in_train_config("selection")
    filter: str = field(default=_TRAIN_FIELDS["filter"].default, metadata={"help": (
        _TRAIN_FIELDS["filter"].metadata["help"] + " Under TRL the data loader fixes the questions of a step: a "
        "filtered tree is left out of the loss, not replaced by another question (docs/trl.md).")})
    advantage: str = _as_in_train_config("advantage")
    overlong: bool = _as_in_train_config("overlong")
    overlong_window: str = _as_in_train_config("overlong_window")
    micro_batch_tokens: int = field(default=_TRAIN_FIELDS["micro_batch_tokens"].default, metadata={"help": (
        "Most row tokens in one no-grad forward of the rescoring that gives every sampled token its old log-prob "
        "and the entropy after it (bfspo/rollout/rescore.py); must exceed the longest prompt plus the budget. The "
        "update packs each micro-step's trees in one row: its size is set by TRL's batch settings.")})
    tree_attention: str = _as_in_train_config("tree_attention")
    epsilon_high: float = field(default=EPS_HIGH, metadata={"help": "eps_high of Eq. 10 (the paper's 0.28)."})
    vllm_importance_sampling_correction: bool = field(default=False, metadata={"help": (
        "Must stay False: BFS-PO's old log-probs are the training model's rescoring of the samples, whatever "
        "engine drew them (docs/algorithm.md, 'Old log-probs'), so there is no engine mismatch to correct.")})

    def __post_init__(self):
        super().__post_init__()
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"BFSPOConfig: {name} must be one of {allowed}, got {getattr(self, name)!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 0:
            raise ValueError(f"BFSPOConfig: k must be an integer >= 0, got {self.k!r}")
        if not isinstance(self.overlong, bool):
            raise ValueError(f"BFSPOConfig: overlong must be true or false, got {self.overlong!r}")
        if self.max_completion_length is None or self.max_completion_length < 5:
            raise ValueError("BFSPOConfig: max_completion_length is L_budget and must be at least 5 tokens "
                             f"(L_cache = budget/5), got {self.max_completion_length!r}")
