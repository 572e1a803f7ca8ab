"""Commands that the tests start (`bfspo train`, `bfspo evaluate`, torchrun, Snakemake, vLLM's engine), each
in a process group of its own: a test that times out or fails kills the whole group, so that no grandchild
(vLLM's engine core, a torchrun rank, a Snakemake job) outlives it. subprocess.run's timeout kills only
the child it started."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL every process of `proc`'s group (its own: `start_new_session`), then reap `proc`."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group is gone already
        pass
    proc.wait()


def run(args, *, timeout: float, input: str | bytes | None = None, capture_output: bool = False,
        **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run in a process group of its own: on a timeout (subprocess.TimeoutExpired, as
    subprocess.run raises it), or any other exception while it runs, the whole group is killed."""
    if capture_output:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with subprocess.Popen(args, start_new_session=True, **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except BaseException:
            kill_group(proc)
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@contextmanager
def started(args, **kwargs) -> Iterator[subprocess.Popen]:
    """subprocess.Popen in a process group of its own, for a test that signals or waits on it; what is
    left of the group when the block ends (the child, or children that outlived it) is killed."""
    with subprocess.Popen(args, start_new_session=True, **kwargs) as proc:
        try:
            yield proc
        finally:
            kill_group(proc)
