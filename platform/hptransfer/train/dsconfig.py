"""The DeepSpeed config a plan implies. Pure: no process group needed (validate it with
`deepspeed.runtime.config.DeepSpeedConfig(cfg)`)."""

from __future__ import annotations

import math

from hptransfer.errors import PlanError
from hptransfer.plan import TransferPlan


def micro_batching(global_batch: int, workers: int, max_micro: int | None = None) -> tuple[int, int]:
    """(micro batch per worker, gradient accumulation steps) with micro × accum × workers = global."""
    if global_batch % workers:
        raise PlanError(
            f"target.batch_size={global_batch} is not divisible by train.workers={workers}; use a multiple of {workers}"
        )
    per_worker = global_batch // workers
    micro = per_worker if not max_micro else max(d for d in range(1, min(per_worker, max_micro) + 1) if per_worker % d == 0)
    return micro, per_worker // micro


def check_worker_range(plan: TransferPlan) -> None:
    """Every worker count an elastic run may have must split the global batch evenly (all reported)."""
    lo, hi = plan.train.worker_range
    bad = [n for n in range(lo, hi + 1) if plan.target.batch_size % n]
    if bad:
        raise PlanError(
            f"target.batch_size={plan.target.batch_size} is not divisible by {bad} of the worker counts "
            f"train.min_workers..train.workers = {lo}..{hi} allow; pick a batch size every count divides "
            f"(e.g. {math.lcm(*range(lo, hi + 1))}) or narrow the range"
        )


def deepspeed_config(
    plan: TransferPlan,
    workers: int,
    *,
    bf16: bool = False,
    max_micro_batch: int | None = None,
    load_universal: bool = False,
) -> dict:
    # Every ZeRO stage, µP included: the large run trains the plan's folded, plain model with AdamW's
    # per-parameter groups (train/plain.py: training_run; handoff/fold.py), so nothing reads µP's
    # `infshape` once training starts, and ZeRO-3's flat partitions lose nothing (issue 39). The
    # hand-off is gathered from the partitions (PlainRecipe._full_weights).
    micro, accum = micro_batching(plan.target.batch_size, workers, max_micro_batch)
    return {
        "train_batch_size": plan.target.batch_size,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": plan.hps.grad_clip,  # 0: off, as in the sweep
        "zero_optimization": zero_optimization(plan.train.zero_stage, plan.train.offload),
        # The optimizer is ours (AdamW with the fold's per-group LRs); DeepSpeed must not replace it.
        "zero_allow_untested_optimizer": True,
        # ZeRO-Offload would otherwise insist on DeepSpeedCPUAdam (a JIT-built op whose decay and ε
        # placement the hand-off probe does not vouch for); torch AdamW steps the CPU partitions instead.
        **({"zero_force_ds_cpu_optimizer": False} if plan.train.offload == "cpu" else {}),
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        # A checkpoint written by another worker count is loaded as a universal checkpoint (train/plain.py).
        **({"checkpoint": {"load_universal": True}} if load_universal else {}),
    }


def zero_optimization(stage: int, offload: str) -> dict:
    """DeepSpeed's `zero_optimization` block. Offload to CPU moves the optimizer states (stages 1–3;
    ZeRO-Offload, Ren et al. 2021) and under stage 3 the parameters too (ZeRO-Infinity's CPU tier);
    `pin_memory` speeds host↔device copies on a GPU and costs nothing to state on a CPU."""
    block: dict = {"stage": stage}
    if offload == "cpu":
        block["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if stage == 3:
            block["offload_param"] = {"device": "cpu", "pin_memory": True}
    return block
