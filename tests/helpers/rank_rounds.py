"""One `Trainer.rollout` under torchrun in which rank 1's trees are all filtered out (used by
tests/test_rank_agreement.py).

usage: python rank_rounds.py MODEL TRAIN_DATA OUT_DIR
The dynamic-sampling filter keeps every tree on rank 0 (its share is full after one round) and
none on rank 1 (its trees are all dropped, round after round). Each rank writes
OUT_DIR/rank{r}.json: the generation rounds it ran, the rounds in which it generated, and its
process group's collective timeout in minutes.
"""

import json
import sys
from pathlib import Path

import torch

from bfspo.training import batching, dist
from bfspo.training.config import TrainConfig
from bfspo.training.trainer import Trainer

model, data, out = sys.argv[1:4]
cfg = TrainConfig(model=model, train_data=data, k=0, group_size=4, budget=8, train_batch=16, mini_batch=8,
                  max_gen_rounds=3, oversample=1.0, collective_timeout_min=7, threads=1)
trainer = Trainer(cfg, Path(out))
generated_in, filled = [], []
fill = batching.fill


def recorded_fill(generate, keep, *args, **kw):
    def recorded_generate(n, round_):
        generated_in.append(round_)
        return generate(n, round_)

    filled.append(fill(recorded_generate, lambda tree: trainer.rank == 0, *args, **kw))
    return filled[-1]


batching.fill = recorded_fill
batch, _, stats = trainer.rollout()
backend = torch.distributed.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
Path(out, f"rank{trainer.rank}.json").write_text(json.dumps({
    "rounds": filled[0].rounds, "generated_in": generated_in, "chains": sum(len(t.leaves()) for t in batch),
    "gen_rounds_logged": stats["gen_rounds"], "timeout_min": backend.options._timeout.total_seconds() / 60}))
dist.teardown()
