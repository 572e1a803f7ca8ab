"""The toy's pinned CPU numerics (issue 36): the same kernels on every x86-64 CPU with AVX2.

The toy's bytes (data, SFT'd model, RL runs, answers) follow the CPU kernels that run them. Three
libraries pick their kernels from the CPU: torch's own vectorised kernels (AVX2 or AVX-512), MKL's
BLAS (by instruction set, and by vendor: MKL dispatches an Intel CPU and an AMD one differently),
and oneDNN. Each reads an environment variable once, when torch first uses it:

- ATEN_CPU_CAPABILITY=avx2: torch's AVX2 kernels, which every AVX2 CPU (Intel since Haswell, AMD
  since Zen) runs, instead of AVX-512 where the CPU has it;
- MKL_CBWR=COMPATIBLE: MKL's conditional numerical reproducibility on its COMPATIBLE branch (SSE2
  without the approximate rcpps/rsqrtps instructions), the branch its documentation gives for equal
  results on Intel and non-Intel CPUs. Its AVX2 branch holds on Intel CPUs only: on other CPUs MKL
  falls back to its AUTO dispatch ("Getting Started with Conditional Numerical Reproducibility",
  oneMKL Developer Guide). torch's wheel links MKL statically and MKL reads the variable there
  (docs/reproducibility.md shows how it was checked);
- ONEDNN_MAX_CPU_ISA=AVX2: oneDNN's instruction-set cap, for any op that reaches it.

`PINNED` is the one source of these settings. The workflow's toy jobs get them as an `env` prefix
of their command (`shell_prefix`, through bfspo/pipeline/jobs.py), set before any Python starts and
inherited by torchrun's ranks and srun's steps; `bfspo toy` sets them itself (`pin`) before it
imports torch, so that a hand-typed `bfspo toy build` builds the same bytes as `make toy`.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping

PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def shell_prefix() -> str:
    """`env NAME=VALUE ... ` to put before a job's command (ends with a space)."""
    return "env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in PINNED.items()) + " "


def pin(environ: Mapping[str, str] | None = None) -> bool:
    """Put PINNED into this process's environment, over any other value of the same variables;
    returns whether they take effect. torch's dispatch, MKL and oneDNN read them when torch first
    uses them, so a process that has imported torch already (a caller's, such as the tests) keeps
    what it started with, and its environment is left alone."""
    environ = os.environ if environ is None else environ
    if "torch" in sys.modules:
        return describe(environ) == describe(PINNED)
    environ.update(PINNED)
    return True


def describe(environ: Mapping[str, str] | None = None) -> str:
    """The settings of PINNED's variables in `environ`, as `NAME=VALUE` words ("unset" if absent)."""
    environ = os.environ if environ is None else environ
    return " ".join(f"{k}={environ.get(k, 'unset')}" for k in PINNED)
