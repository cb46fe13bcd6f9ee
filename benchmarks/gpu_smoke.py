"""One-GPU smoke test of the device path (issue 13, item 3): bf16 sweep trials sharing a GPU, then a bf16 large run.

A µP sweep whose trials share the GPU, then a 1-GPU ZeRO-1 bf16 large run, both through the
notebook API (`Study.sweep/transfer/train`).

Workload (defaults; under 10 minutes on one GPU):
1. **sweep**: µP Llama ladder (depth 2, head_dim 32, seq 128, batch 32), widths 64/128/256 × 3 LRs,
   200 steps per trial, no replicate seeds; `gpus_per_trial: 0.25` (4 trials share the GPU),
   `cpus_per_trial: 2`, `sweep.precision: bf16` (autocast in each trial).
2. **transfer**: the study's plan (rule `mup`), target width 512.
3. **large run**: `train.workers: 1, gpus_per_worker: 1, zero_stage: 1, precision: bf16` (DeepSpeed's
   bf16 mode, NCCL), 200 steps at global batch 32.

Figures:
- trial tokens/s per width = steps × batch × seq_len / `train_s` (each trial's own timer over its
  training steps, from the sweep's results table; a `loss.item()` every step synchronises the GPU),
  median and range over the width's trials; the trials of a width ran while other trials shared
  the GPU, so this is throughput under sharing, not a single trial's best.
- large-run tokens/s: the loop's own `tokens_per_s` (tokens ÷ seconds since its first step).
- wall times of the sweep, the transfer and the large run (driver clock, Ray start-up included).
It also records the trials' statuses, the large run's losses, its target check and any warning (a
precision mismatch would be one), and the GPU, CUDA and library versions.

Without a CUDA device it prints {"skipped": "no CUDA device", ...} and exits 0; it writes that JSON
only to an explicit `--out`.

Run: .venv/bin/python benchmarks/gpu_smoke.py   → benchmarks/results/gpu_smoke.json
     (`--steps 20 --target-steps 20` for a quicker check)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))

from common import RESULTS, machine_info  # noqa: E402

WIDTHS = [64, 128, 256]
LRS = [3e-3, 1e-2, 3e-2]
SEQ, BATCH = 128, 32
DEFAULT_OUT = RESULTS / "gpu_smoke.json"


def smoke_spec(steps: int, target_steps: int, target_width: int, gpus_per_trial: float) -> dict:
    cpus = os.cpu_count() or 2
    return {
        "name": "gpu-smoke",
        "model": {"family": "llama", "depth": 2, "head_dim": 32, "seq_len": SEQ, "parametrization": "mup"},
        "data": {"max_files": 400, "eval_batches": 4},
        "sweep": {
            "widths": WIDTHS,
            "grid": {"lr": LRS},
            "steps": steps,
            "batch_size": BATCH,
            "noise_seeds": 0,
            "fixed": {"warmup_steps": 10},
            "cpus_per_trial": max(1, min(2, cpus // 4)),
            "gpus_per_trial": gpus_per_trial,
            "precision": "bf16",
            "reports": 2,
        },
        "target": {"width": target_width, "steps": target_steps, "batch_size": BATCH},
        "train": {
            "workers": 1,
            "gpus_per_worker": 1,
            "cpus_per_worker": max(1, min(4, cpus // 2)),
            "zero_stage": 1,
            "precision": "bf16",
            "eval_every": max(1, target_steps // 2),
        },
        "ray": {"num_cpus": cpus, "object_store_mb": 1024},
    }


def gpu_info() -> dict:
    import torch

    return {
        "gpu": torch.cuda.get_device_name(0),
        "gpu_count": torch.cuda.device_count(),
        "cuda": torch.version.cuda,
        "bf16_supported": torch.cuda.is_bf16_supported(),
    }


def trial_throughput(df, steps: int) -> dict:
    """Per width: tokens/s of each finished trial over its training steps (median, min, max)."""
    out = {}
    for width, rows in df.groupby("width"):
        done = rows[rows["status"] == "ok"]
        rates = [steps * BATCH * SEQ / s for s in done["train_s"] if s > 0]
        out[str(int(width))] = {
            "trials": len(rows),
            "ok": len(done),
            "tokens_per_s_median": round(statistics.median(rates)) if rates else None,
            "tokens_per_s_min": round(min(rates)) if rates else None,
            "tokens_per_s_max": round(max(rates)) if rates else None,
            "trial_wall_s_median": round(float(done["wall_s"].median()), 2) if len(done) else None,
        }
    return out


def run(args, info: dict) -> dict:
    from hptransfer.study import Study

    spec = smoke_spec(args.steps, args.target_steps, args.target_width, args.gpus_per_trial)
    work = Path(args.work or tempfile.mkdtemp(prefix="hpt_gpu_smoke_"))
    study = Study.from_spec(spec, work / "study")
    times = {}
    try:
        with study.ray_session():  # one Ray for every stage
            t = time.perf_counter()
            df = study.sweep(restart=True)
            times["sweep_s"] = round(time.perf_counter() - t, 2)
            t = time.perf_counter()
            plan = study.transfer()
            times["transfer_s"] = round(time.perf_counter() - t, 2)
            t = time.perf_counter()
            metrics = study.train(restart=True)
            times["train_s"] = round(time.perf_counter() - t, 2)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return {
        **info,
        "gpu": gpu_info(),
        "spec": spec,
        "times": times,
        "sweep": {
            "trials": len(df),
            "statuses": df["status"].value_counts().to_dict(),
            "precision": spec["sweep"]["precision"],
            "gpus_per_trial": spec["sweep"]["gpus_per_trial"],
            "tokens_per_s_by_width": trial_throughput(df, args.steps),
        },
        "large_run": {
            "width": plan.target.width,
            "lr": plan.hps.lr,
            "precision": plan.train.precision,
            "sweep_precision": plan.sweep_precision,
            "tokens_per_s": metrics.get("tokens_per_s"),
            "train_loss": metrics.get("train_loss"),
            "val_loss": metrics.get("val_loss"),
            "status": metrics.get("status"),
            "target_check": metrics.get("target_check"),
            "warnings": metrics.get("warnings", []),
        },
        "study_dir": str(work / "study") if args.keep else None,
    }


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="training steps per sweep trial")
    ap.add_argument("--target-steps", type=int, default=200, help="training steps of the large run")
    ap.add_argument("--target-width", type=int, default=512, help="width of the large run")
    ap.add_argument("--gpus-per-trial", type=float, default=0.25, help="GPU fraction per sweep trial")
    ap.add_argument(
        "--out", default=None, help=f"result JSON (default: {DEFAULT_OUT.relative_to(ROOT)}; a skip is written only here)"
    )
    ap.add_argument("--work", default=None, help="study folder's parent (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the study folder (MLflow, plan, checkpoints, hpt.log)")
    args = ap.parse_args(argv)

    import torch

    from hptransfer.env import configure
    from hptransfer.io import write_json

    configure()
    info = machine_info([str(Path(__file__).relative_to(ROOT)), *argv])
    if not torch.cuda.is_available():
        result = {"skipped": "no CUDA device", **info}
        print(json.dumps(result, indent=2, default=str))
        print("[gpu_smoke] skipped: no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        if args.out:
            write_json(args.out, result)
        return result
    result = run(args, info)
    out = Path(args.out) if args.out else DEFAULT_OUT
    write_json(out, result)
    print(json.dumps({k: result[k] for k in ("times", "sweep", "large_run")}, indent=2, default=str))
    print(f"[gpu_smoke] wrote {out}", flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
