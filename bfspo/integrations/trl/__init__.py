"""BFS-PO as a TRL trainer (`pip install -e ".[trl]"` in the clone; docs/trl.md):

    from bfspo.integrations.trl import BFSPOConfig, BFSPOTrainer, verifier_reward

`BFSPOConfig` is TRL's GRPOConfig plus BFS-PO's fields, `BFSPOTrainer` a GRPOTrainer that grows a
search tree per question and trains Eq. 10 over its unique tokens, and `verifier_reward` TRL's
reward-function interface around the project's verifier."""

from bfspo.integrations.trl.config import BFSPOConfig
from bfspo.integrations.trl.rewards import question_rows, verifier_reward
from bfspo.integrations.trl.trainer import BFSPOTrainer

__all__ = ["BFSPOConfig", "BFSPOTrainer", "question_rows", "verifier_reward"]
