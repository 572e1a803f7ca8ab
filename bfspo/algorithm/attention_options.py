"""The choices of tree attention, without torch (TrainConfig, the CLI and the workflow's schema read them).

Kernels (`ATTENTIONS`, TrainConfig `tree_attention`):

* `flex`: torch's compiled flex attention (bfspo.algorithm.tree_attention.flex_tree_attention), the
  fast kernel on CUDA. Compiled once per row length, so its rows are padded to a few fixed lengths
  (`bucket_lengths`).
* `blockwise`: query blocks through torch's attention kernels (fused on CPU, plain tensor operations
  on other devices): no compiler, any row length, on CPU and CUDA. The way out if flex fails to
  compile or run on a cluster.
* `dense`: the model's own sdpa or eager attention under a [T, T] mask: the reference, quadratic in
  memory, for tests and benchmarks.
* `auto`: flex on CUDA, blockwise elsewhere (torch has no flex backward on CPU).

Buckets: the compiled flex kernel specialises on the row length (Dynamo guards on it), so a row of
T tokens is padded to the smallest of `bucket_lengths(max_tokens, step)`: the multiples of `step`
below `max_tokens`, and `max_tokens` itself (at most MAX_BUCKETS of them). A process then compiles at most one kernel per bucket
and autograd mode (the update's with gradients, the rescoring's without), never one per row.
"""

from __future__ import annotations

from bfspo.errors import BfspoError

KERNELS = ("flex", "blockwise")  # the interval kernels (bfspo.algorithm.tree_attention)
ATTENTIONS = ("auto", *KERNELS, "dense")
MAX_BUCKETS = 32  # most row lengths one process compiles flex for
BUCKET_TOKENS = 2048  # TrainConfig attention_bucket's default: the step between bucket lengths


def bucket_lengths(max_tokens: int, step: int) -> tuple[int, ...]:
    """The row lengths of a run whose rows hold at most `max_tokens` tokens: step, 2 step, ... below
    max_tokens, then max_tokens (padding never passes the micro-batch budget the memory plan sizes).
    At most MAX_BUCKETS lengths: the step is raised to max_tokens / MAX_BUCKETS where that is larger."""
    if step < 1 or max_tokens < 1:
        raise BfspoError(f"bucket lengths need a positive step and budget, got step {step}, budget {max_tokens}")
    step = max(step, -(-max_tokens // MAX_BUCKETS))
    return (*range(step, max_tokens, step), max_tokens)


def padded_length(tokens: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds a row of `tokens` tokens."""
    for length in buckets:
        if length >= tokens:
            return length
    raise BfspoError(f"a row of {tokens} tokens is longer than the longest bucket ({buckets[-1]}): "
                     "micro-batches must hold at most micro_batch_tokens tokens")
