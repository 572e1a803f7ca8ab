"""Data parallelism under `torchrun`: each rank samples its share of the prompts, and the gradients
of every mini-batch are summed across ranks before the optimizer step.

The loss of a mini-batch is a token-mean over ALL ranks' unique tokens (Eq. 10's 1/|T|), so each
rank divides its token sum by the global token count and the gradients are SUMMED (not averaged):
the update then equals one process training on the whole global batch. Gradients are all-reduced
by hand, one flat buffer per step, rather than through the DDP wrapper: a rank may hold an empty
mini-batch (its trees are whole and of uneven size), and the wrapper's hooks cannot express that.

Ranks wait for each other in collectives: once per generation round (`any_rank`, so that all run
the same rounds), per mini-batch, and around logging and checkpoints. The longest wait is one
generation round, tens of minutes at the paper's sizes, hence a collective timeout in hours
(`setup`'s `timeout_min`, TrainConfig.collective_timeout_min) instead of NCCL's 10 minutes.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from bfspo.errors import BfspoError


def setup(timeout_min: int, device: torch.device) -> tuple[int, int]:
    """(rank, world size); initialises the process group when launched by torchrun, with a collective
    timeout of `timeout_min` minutes (a rank that waits longer in a collective fails the run): NCCL
    for ranks on CUDA `device`s, gloo on the CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=timedelta(minutes=timeout_min))
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def refuse_tensor_parallel(tensor_parallel_size: int) -> None:
    """A BfspoError for vLLM tensor parallelism under more than one rank (torchrun's WORLD_SIZE):
    every rank runs its own engine, which would take `tensor_parallel_size` GPUs beside the other
    ranks' (the workflow refuses the same: bfspo.pipeline.matrix, `tensor_parallel`)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if tensor_parallel_size > 1 and world > 1:
        raise BfspoError(f"tensor_parallel_size={tensor_parallel_size} with {world} ranks: each rank runs its own "
                         f"vLLM engine, which would take {tensor_parallel_size} GPUs beside the other ranks'. Run one "
                         f"rank (torchrun --nproc-per-node 1) with tensor_parallel_size={tensor_parallel_size}, or "
                         "tensor_parallel_size=1 with one rank per GPU")


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def sum_scalar(x: float) -> float:
    """Sum a Python number over ranks."""
    if world() == 1:
        return float(x)
    t = torch.tensor([float(x)], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return float(t.item())


def any_rank(flag: bool) -> bool:
    """Whether `flag` is true on any rank (every rank gets the same answer)."""
    return sum_scalar(bool(flag)) > 0


def sum_gradients(params: list[torch.nn.Parameter]) -> None:
    """All-reduce (sum) the gradients of `params` in one flat buffer; a missing grad counts as zero."""
    if world() == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).clone()
        offset += n


def gather(obj) -> list:
    """Every rank's `obj`, in rank order (a list of one on a single process)."""
    if world() == 1:
        return [obj]
    out = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if world() > 1:
        dist.barrier()
