"""One attempt of a training run's W&B logging, as Trainer.fit does it (used by tests/test_wandb_resume.py).

usage: python wandb_attempt.py RUN_DIR ATTEMPT FIRST LAST [kill]
Logs steps FIRST..LAST, one row each as it ends, except those that earlier fragments of the run hold
already (tracking.last_logged_step); prints that step. With `kill`, the attempt and its wandb
service are SIGKILLed after step LAST, as Slurm kills a job, before wandb closes its file.
"""

import os
import signal
import sys
import time
from pathlib import Path

from bfspo import tracking

run_dir, attempt, first, last = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
run = tracking.start(run_dir, {"seed": 0}, project="bfspo-test", group="g", job_type="train", name="r", footer=False)
logged = tracking.last_logged_step(run)
print(logged, flush=True)
for step in range(first, last + 1):
    time.sleep(0.02)
    if step > logged:  # a row the size of a trainer's (about 80 keys)
        tracking.log(run, {"attempt": attempt, "train/loss": step / 100, **{f"pad/{i}": i / 7 for i in range(80)}},
                     step=step)
if len(sys.argv) > 5:
    os.killpg(0, signal.SIGKILL)
tracking.finish(run)
