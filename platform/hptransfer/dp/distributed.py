"""The large DP run: Ray Train workers with Opacus' distributed DP (DPDDP + gloo), accounting on the
global sample rate. DeepSpeed and Opacus do not combine, so this path uses plain torch.distributed.

Privacy with W workers: each rank holds a 1/W shard and keeps each of its examples with probability
q = B/N (Opacus' DistributedUniformWithReplacementSampler), so every example is still sampled
independently at the global rate q and the global expected batch is B. Rank 0 alone adds the noise
N(0, σ²C²) before the all-reduce, so the noisy sum is the single-process mechanism; the accountant
records (σ, q) per step exactly as in `train.train_dp`. Each rank seeds its sampler differently:
identical masks on the shards would correlate inclusions across ranks and break Poisson sampling.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class DistributedDPConfig(BaseModel):
    """One distributed DP fine-tuning run; σ, B and T come from `dp_plan_for`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_size: int = Field(..., ge=1, description="Global expected batch B (q = B/N).")
    steps: int = Field(..., ge=1, description="T, from the plan.")
    noise_multiplier: float = Field(..., ge=0)
    clip: float = Field(..., gt=0)
    lr: float = Field(..., gt=0)
    target_epsilon: float = Field(..., gt=0)
    delta: float = Field(..., gt=0, lt=1)
    accountant: Literal["prv", "rdp"] = "prv"
    seed: int = 0
    workers: int = Field(2, ge=1, description="Ray Train workers (gloo ranks).")
    tracking_uri: str | None = Field(None, description="MLflow URI; rank 0 logs ε and accuracy per pass when set.")
    experiment: str = "dp-distributed"


def _worker(cfg: dict[str, Any]) -> None:
    import ray.train
    import torch
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP

    from hptransfer.dp import task as digits
    from hptransfer.dp.train import make_private_normalized

    torch.set_num_threads(1)
    c = DistributedDPConfig.model_validate(cfg["dp"])
    rank, world = ray.train.get_context().get_world_rank(), ray.train.get_context().get_world_size()
    data = digits.load_task()
    body = digits.backbone(cfg["width"])
    body.load_state_dict(cfg["body_state"])
    torch.manual_seed(c.seed)
    model = DPDDP(digits.finetune_model(body))  # broadcasts rank 0's weights
    opt = torch.optim.Adam(model.parameters(), lr=c.lr)
    engine, gsm, dp_opt, loader = make_private_normalized(
        model,
        opt,
        data.private_train,
        batch_size=c.batch_size,
        noise_multiplier=c.noise_multiplier,
        clip=c.clip,
        accountant=c.accountant,
        generator=torch.Generator().manual_seed(c.seed * 7919 + rank),
        distributed=True,
    )
    tracker = _mlflow_run(c) if rank == 0 and c.tracking_uri else None
    step, local_examples = 0, 0
    while step < c.steps:  # every rank takes the same number of steps (collectives in each)
        for x, y in loader:
            local_examples += len(y)
            dp_opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(gsm(x), y).backward()
            dp_opt.step()
            step += 1
            if step == c.steps:
                break
        metrics = {
            "dp/epsilon": float(engine.get_epsilon(c.delta)),
            "test/accuracy": digits.accuracy(model.module, data.private_test_x, data.private_test_y),
        }
        if tracker:
            tracker.log_metrics(metrics, step=step)
        if step < c.steps:
            ray.train.report(metrics)
    total = torch.tensor([float(local_examples)])
    torch.distributed.all_reduce(total)
    hist = [(float(s), float(r), int(k)) for s, r, k in engine.accountant.history]
    final = {**metrics, "steps": step, "mean_global_batch": float(total) / step, "accountant_history": hist, "world_size": world}
    if tracker:
        tracker.end_run()
    if final["dp/epsilon"] > c.target_epsilon:
        raise RuntimeError(f"accountant reports ε={final['dp/epsilon']:.4g} > target {c.target_epsilon:g}")
    if rank == 0:  # Ray Train keeps Result.metrics only with a checkpoint
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "dp_result.json"), "w") as f:
                json.dump(final, f)
            ray.train.report(
                {k: v for k, v in final.items() if not isinstance(v, list)}, checkpoint=ray.train.Checkpoint.from_directory(d)
            )
    else:
        ray.train.report({k: v for k, v in final.items() if not isinstance(v, list)})


def _mlflow_run(c: DistributedDPConfig):
    import mlflow

    mlflow.set_tracking_uri(c.tracking_uri)
    mlflow.set_experiment(c.experiment)
    mlflow.start_run()
    mlflow.log_params({k: v for k, v in c.model_dump().items() if k not in ("tracking_uri",)})
    return mlflow


def train_dp_distributed(body, width: int, config: DistributedDPConfig, storage_path: str) -> dict[str, Any]:
    """DP-fine-tune a copy of the pre-trained digits `body` on `config.workers` Ray Train workers (gloo).
    Needs a running Ray (`ray.init`). Returns rank 0's final metrics and accountant history."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    trainer = TorchTrainer(
        _worker,
        train_loop_config={
            "dp": config.model_dump(),
            "width": width,
            "body_state": {k: v.clone() for k, v in body.state_dict().items()},
        },
        scaling_config=ScalingConfig(num_workers=config.workers, use_gpu=False),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(storage_path=storage_path, name="dp-distributed"),
    )
    result = trainer.fit()
    with result.checkpoint.as_directory() as d, open(os.path.join(d, "dp_result.json")) as f:
        return json.load(f)
