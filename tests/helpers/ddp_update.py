"""One `Trainer.update` on fixed trees, under torchrun or alone (used by tests/test_trainer.py).

usage: python ddp_update.py MODEL TRAIN_DATA TREES_JSONL OUT_DIR
Rank r trains on trees r, r + world, ... (cut into pieces by a small micro_batch_tokens) and saves
its LoRA weights to OUT_DIR/rank{r}.pt.
"""

import json
import sys
from pathlib import Path

import torch

from bfspo.algorithm.tree import SearchTree
from bfspo.training import dist
from bfspo.training.config import TrainConfig
from bfspo.training.trainer import Trainer

model, data, trees_file, out = sys.argv[1:5]
cfg = TrainConfig(model=model, train_data=data, k=2, group_size=4, budget=24, train_batch=16,
                  mini_batch=8, lr=1e-2, threads=1, micro_batch_tokens=160)  # 115-token prompts: trees are cut
trainer = Trainer(cfg, Path(out))
trees = [SearchTree.from_dict(json.loads(line)) for line in Path(trees_file).read_text().splitlines()]
trainer.update(trees[trainer.rank::trainer.world])
state = {k: v.detach().clone() for k, v in trainer.model.named_parameters() if v.requires_grad}
torch.save(state, Path(out) / f"rank{trainer.rank}.pt")
dist.teardown()
