"""The gradient of one mini-batch split over ranks and micro-batches (used by tests/test_microbatch.py).

usage: torchrun --nproc-per-node 2 ddp_grads.py MODEL TREES_JSONL MICRO_BATCH_TOKENS OUT_DIR
Rank r takes trees r, r + world, ...; the ranks' gradients are summed as the trainer sums them,
and rank 0 saves them to OUT_DIR/grads.pt with the micro-batch count of each rank.
"""

import json
import sys
from pathlib import Path

import torch

from bfspo.algorithm.packing import n_entries
from bfspo.algorithm.tree import SearchTree
from bfspo.training import dist
from bfspo.training.accumulate import minibatch_backward
from tests.helpers.trees import load_float32_model

model_dir, trees_file, budget, out = sys.argv[1:5]
torch.set_num_threads(1)
rank, world = dist.setup(timeout_min=5, device=torch.device("cpu"))
model = load_float32_model(model_dir)
trees = [SearchTree.from_dict(json.loads(line)) for line in Path(trees_file).read_text().splitlines()]
mine = trees[rank::world]
acc = minibatch_backward(model, mine, micro_batch_tokens=int(budget),
                         normalizer=dist.sum_scalar(sum(n_entries(t) for t in mine)), eps_low=0.2, eps_high=0.28)
params = [p for p in model.parameters()]
dist.sum_gradients(params)
counts = dist.gather(acc.micro_batches)
if rank == 0:
    torch.save({"grads": [p.grad for p in params], "micro_batches": counts, "loss": dist.sum_scalar(acc.loss)},
               Path(out) / "grads.pt")
else:
    dist.sum_scalar(acc.loss)
dist.teardown()
