"""How long the planned jobs take end to end, and how many GPUs they hold at once (issue 45).

The DAG runs data -> train -> evaluate -> tables: an evaluation of a trained run waits for its
training job, a zero-shot evaluation for nothing but its data. Only the GPU-planned jobs have a
time (bfspo/pipeline/gpu_plan.py); the data preparation and the tables (CPU jobs of minutes) count
as instant, and the queue's wait, before each job and between a run's attempts, is not counted.

- `critical_path`: the longest chain of dependent jobs, whatever the concurrency: the least
  wall-clock time the whole plan can take.
- `simulate`: the jobs run at most `slots` at once (the Slurm profile's `jobs`), each ready job
  started in the plan's order when a slot frees (training first, as planned); the peak of GPUs
  held at once, when it is reached, and when the last job ends.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass(frozen=True)
class Job:
    """One planned job: its wall-clock hours over all attempts, its GPUs, the jobs it waits for."""

    name: str
    hours: float
    gpus: int
    after: tuple[str, ...] = ()


@dataclass(frozen=True)
class Timeline:
    """The jobs run `slots` at a time: the most GPUs held at once (`peak_gpus`, first reached at
    `peak_at` hours, by `peak_jobs`) and the end of the last job (`makespan`, hours)."""

    slots: int | None
    peak_gpus: int
    peak_at: float
    peak_jobs: tuple[str, ...]
    makespan: float


def plan_jobs(plans) -> list[Job]:
    """The planned train and evaluate jobs of a matrix (`gpu_plan.plan_matrix`), training first."""
    out = [Job(f"train {run}", (p.train_s + p.attempts * p.start_s) / 3600, p.gpus * p.nodes)
           for run, p in plans.train.items()]
    out += [Job(f"evaluate {run} {bench}", p.seconds / 3600, p.gpus,
                (f"train {run}",) if run in plans.train else ())
            for (run, bench), p in plans.eval.items()]
    return out


def critical_path(jobs: list[Job]) -> tuple[float, list[Job]]:
    """The hours of the longest chain of dependent jobs, and that chain (first job first)."""
    by_name = {j.name: j for j in jobs}
    finish: dict[str, tuple[float, list[Job]]] = {}

    def end(job: Job) -> tuple[float, list[Job]]:
        if job.name not in finish:
            before = max((end(by_name[d]) for d in job.after if d in by_name), key=lambda t: t[0], default=(0.0, []))
            finish[job.name] = (before[0] + job.hours, before[1] + [job])
        return finish[job.name]

    return max((end(j) for j in jobs), key=lambda t: t[0], default=(0.0, []))


def simulate(jobs: list[Job], slots: int | None) -> Timeline:
    """Run the jobs at most `slots` at once (None: no limit), each ready job started in list order
    as soon as a slot is free and the jobs it waits for have ended."""
    known = {j.name for j in jobs}
    waiting = list(jobs)
    done: set[str] = set()
    running: list[tuple[float, int, Job]] = []  # (end, order, job): a heap by end time
    now, peak, peak_at, peak_jobs, order = 0.0, 0, 0.0, (), 0
    while waiting or running:
        for job in [j for j in waiting if all(d in done or d not in known for d in j.after)]:
            if slots is not None and len(running) >= slots:
                break
            waiting.remove(job)
            heapq.heappush(running, (now + job.hours, order, job))
            order += 1
        held = sum(j.gpus for _, _, j in running)
        if held > peak:
            peak, peak_at, peak_jobs = held, now, tuple(j.name for _, _, j in sorted(running))
        now, _, job = heapq.heappop(running)
        done.add(job.name)
        while running and running[0][0] <= now:
            done.add(heapq.heappop(running)[2].name)
    return Timeline(slots=slots, peak_gpus=peak, peak_at=peak_at, peak_jobs=peak_jobs, makespan=now)
