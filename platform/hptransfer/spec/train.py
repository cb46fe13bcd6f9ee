"""`train:`, `tracking:` and `ray:`: how the large run executes (workers, ZeRO, checkpoints), where
it is recorded, and which Ray it joins."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hptransfer.spec.base import Precision, _Strict


class TrainSpec(_Strict):
    workers: int = Field(2, ge=1, description="Ray Train workers (processes); DeepSpeed data-parallel ranks.")
    min_workers: int | None = Field(
        None,
        ge=1,
        description="Elastic large run (Ray Train's ScalingConfig(num_workers=(min_workers, workers))): with a node "
        "lost the run goes on with as few as this many workers (Ray Train may grow it back when room returns), resuming "
        "from its checkpoint through a DeepSpeed universal checkpoint when the worker count changed. target.batch_size must "
        "divide by every count in between. Default: workers (a fixed group: a lost node stops the run, exit 75).",
    )
    zero_stage: Literal[0, 1, 2, 3] = Field(1, description="DeepSpeed ZeRO stage.")
    offload: Literal["none", "cpu"] = Field(
        "none",
        description="ZeRO-Offload: `cpu` keeps the optimizer states (and under zero_stage 3 the parameters) in host "
        "memory, trading step time for GPU memory. Needs zero_stage 1, 2 or 3. The optimizer stays the plan's "
        "torch AdamW (its per-group LRs and decoupled decay are the plan), stepping on the CPU partitions.",
    )
    cpus_per_worker: float = Field(1.0, gt=0)
    gpus_per_worker: float = Field(0.0, ge=0)
    precision: Precision = Field(
        "fp32",
        description="Large-run arithmetic: `fp32`, or `bf16` (DeepSpeed's bf16 mode: bf16 weights and compute, fp32 "
        "master weights in the optimizer). Match `sweep.precision`: the tuned LR was found in that precision.",
    )
    eval_every: int = Field(50, ge=1, description="Steps between validation evaluations in the large run.")
    checkpoint_every: int = Field(
        0, ge=0, description="Steps between DeepSpeed checkpoints (reported to Ray Train); 0: only the final one."
    )
    max_failures: int = Field(
        2, ge=0, description="Ray Train restarts of the worker group after a worker dies; each resumes from the last checkpoint."
    )
    keep_checkpoints: int = Field(
        2,
        ge=1,
        description="Checkpoints Ray Train keeps (older ones are deleted); a torn newest one falls back to the one before.",
    )
    stop_checkpoint_after_s: float = Field(
        60.0,
        ge=0,
        description="On SIGTERM (preemption) the large run stops at the next step boundary and writes a checkpoint "
        "unless its newest one is younger than this (seconds; 0: always). Keep the time one checkpoint takes "
        "under the pod's grace period (deploy: terminationGracePeriodSeconds).",
    )

    @property
    def worker_range(self) -> tuple[int, int]:
        """(fewest, most) workers of the large run: equal for a fixed group."""
        return (self.min_workers or self.workers, self.workers)

    @model_validator(mode="after")
    def _min_workers_at_most_workers(self) -> TrainSpec:
        if self.min_workers is not None and self.min_workers > self.workers:
            raise ValueError(
                f"train.min_workers={self.min_workers} is more than train.workers={self.workers}; set it to at most "
                f"{self.workers} (or leave it out for a fixed group)"
            )
        return self

    @model_validator(mode="after")
    def _offload_needs_zero(self) -> TrainSpec:
        if self.offload != "none" and self.zero_stage == 0:
            raise ValueError(
                f"train.offload={self.offload!r} needs ZeRO partitions to offload (train.zero_stage is 0); "
                "set train.zero_stage: 1, 2 or 3, or train.offload: none"
            )
        return self


class TrackingSpec(_Strict):
    uri: str | None = Field(None, description="MLflow tracking URI. Default: sqlite:///<study_dir>/mlflow.db.")
    experiment: str | None = Field(None, description="MLflow experiment name. Default: the study name.")


class RaySpec(_Strict):
    num_cpus: int | None = Field(None, ge=1, description="CPUs for a local Ray. Default: os.cpu_count().")
    object_store_mb: int = Field(
        512, ge=78, description="Local Ray object store size; Ray's default (30% of RAM) is far too large here."
    )
