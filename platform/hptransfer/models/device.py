"""Where a run computes and in what precision.

A sweep trial trains on the GPU Ray gave it (`sweep.gpus_per_trial`, fractions share one GPU: Ray
sets CUDA_VISIBLE_DEVICES, so the trial's GPU is `cuda`), else on the CPU; a large-run worker on the
device Ray Train assigned it. Batches and evaluation follow the model (`module_device`).

`bf16` precision in a sweep trial is torch.autocast to bfloat16 around forward and loss: weights,
gradients and optimizer state stay fp32, matmuls run in bf16 (on a GPU, and on the CPU too, which is
how the CPU tests exercise it). The large run's bf16 is DeepSpeed's bf16 mode instead (bf16 weights,
fp32 master copy in the optimizer): the same bf16 matmuls, not bit-for-bit the same numerics.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

CPU = torch.device("cpu")


def trial_device() -> torch.device:
    """A Ray Tune trial's device: `cuda` when Ray reserved a GPU (or a fraction of one) for it and
    torch sees CUDA, else the CPU."""
    import ray

    if ray.is_initialized() and ray.get_gpu_ids() and torch.cuda.is_available():
        return torch.device("cuda")
    return CPU


def worker_device(gpus_per_worker: float) -> torch.device:
    """A Ray Train worker's device: the GPU Ray Train assigned it when the run asks for GPUs."""
    if gpus_per_worker > 0:
        import ray.train.torch

        return ray.train.torch.get_device()
    return CPU


def module_device(model: nn.Module) -> torch.device:
    """Where `model`'s parameters live (batches and evaluation go there)."""
    return next(model.parameters()).device


def autocast(device: torch.device | str, precision: str = "fp32") -> contextlib.AbstractContextManager:
    """torch.autocast to bfloat16 on `device` for precision `bf16`; a null context for `fp32`."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    raise ValueError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
