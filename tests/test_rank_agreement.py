"""Generation rounds agreed across ranks: every rank runs the same dynamic-sampling rounds (another
round while any rank's batch is short and rounds remain), so that no rank waits in a collective for
another's extra rounds; and the collective timeout reaches the process group."""

import json
import sys
from pathlib import Path

import pytest

from bfspo.training import batching
from tests.helpers import process

HELPERS = Path(__file__).parent / "helpers"


class Tree:
    def __init__(self, chains):
        self.chains = chains

    def leaves(self):
        return range(self.chains)


def test_a_full_rank_runs_the_rounds_the_others_need_without_generating():
    asked = []

    def generate(n, round_):
        asked.append((n, round_))
        return [Tree(8) for _ in range(n)]

    others_short = iter([True, True, True, False])
    filled = batching.fill(generate, lambda t: True, target=16, chains_per_question=8, rate=1.0, max_rounds=10,
                           agree=lambda short: short or next(others_short))
    assert asked == [(2, 0)] and filled.rounds == 4 and len(filled.kept) == 2
    # no rank short: no round at all; out of rounds: the agreement is not asked again
    assert batching.fill(generate, bool, 0, 8, 1.0, 10, agree=lambda short: short).rounds == 0
    polls = []
    batching.fill(lambda n, r: [], bool, 16, 8, 1.0, max_rounds=2, agree=lambda short: polls.append(short) or True)
    assert polls == [True, True]


@pytest.mark.slow
def test_two_ranks_run_the_same_rounds_when_one_ranks_trees_are_all_filtered(tiny_model_dir, train_data, tmp_path):
    """torchrun, 2 CPU processes (gloo). Rank 0 fills its share in round 0; rank 1's trees are all
    dropped. Both run max_gen_rounds = 3 rounds (rank 0 generating in round 0 only) and leave
    rollout together; the process group's timeout is the config's collective_timeout_min."""
    import os

    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = process.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                        str(HELPERS / "rank_rounds.py"), str(tiny_model_dir), str(train_data), str(tmp_path)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["rounds"] == r1["rounds"] == 3
    assert r0["generated_in"] == [0] and r0["chains"] == 8
    assert r1["generated_in"] == [0, 1, 2] and r1["chains"] == 0
    assert r0["gen_rounds_logged"] == r1["gen_rounds_logged"] == 3
    assert r0["timeout_min"] == r1["timeout_min"] == 7
