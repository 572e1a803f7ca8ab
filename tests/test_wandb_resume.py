"""A resumed run's W&B history holds every step once, each row stamped with the time its step ended.

No W&B server can run here, so the run is read back as `wandb sync` uploads it: its offline
fragments, in the order `bfspo sync` passes them (oldest first), each read with wandb's own reader
(`tracking.read_run`). The attempts log as Trainer.fit does (tests/helpers/wandb_attempt.py).
"""

import os
import sys
from pathlib import Path

from bfspo import tracking
from bfspo.reporting.sync import offline_runs
from tests.helpers import process

ATTEMPT = Path(__file__).parent / "helpers" / "wandb_attempt.py"
ENV = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def attempt(run_dir, n, first, last, kill=False) -> int:
    proc = process.run([sys.executable, str(ATTEMPT), str(run_dir), str(n), str(first), str(last)] + ["kill"] * kill,
                       env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == (-9 if kill else 0), proc.stderr
    return int(proc.stdout.split()[0])


def test_a_killed_then_resumed_run_holds_every_step_once(tmp_path):
    run_dir = tmp_path / "run"
    assert attempt(run_dir, 1, 1, 30, kill=True) == 0  # killed after step 30: its last block is lost
    (killed,) = offline_runs(run_dir)
    kept = [h["_step"] for h in tracking.read_run(killed)["history"]]
    assert kept == list(range(1, len(kept) + 1)) and 10 < len(kept) < 30, kept
    # resumed from its checkpoint at step 10: steps 11..kept[-1] are redone but not sent again
    assert attempt(run_dir, 2, 11, 40) == kept[-1]
    fragments = [tracking.read_run(p) for p in offline_runs(run_dir)]
    assert len(fragments) == 2 and len({f["run"]["run_id"] for f in fragments}) == 1
    history = [h for f in fragments for h in f["history"]]
    assert [h["_step"] for h in history] == list(range(1, 41))
    assert [h["attempt"] for h in history] == [1] * len(kept) + [2] * (40 - len(kept))
    # sent as each step ended (0.02 s apart), not in a burst at a checkpoint
    times = [h["_timestamp"] for h in fragments[1]["history"]]
    assert all(b - a > 0.015 for a, b in zip(times, times[1:]))
