"""One-GPU smoke test of the device path (issues 13 and 39): bf16 sweep trials sharing a GPU, then the bf16 large run under ZeRO-1 and ZeRO-3.

A µP sweep whose trials share the GPU, then a 1-GPU ZeRO-1 bf16 large run, both through the
notebook API (`Study.sweep/transfer/train`), then the same plan under ZeRO-3 (issue 39 item 7).

Workload (defaults; under 10 minutes on one GPU):
1. **sweep**: µP Llama ladder (depth 2, head_dim 32, seq 128, batch 32), widths 64/128/256 × 3 LRs,
   200 steps per trial, no replicate seeds; `gpus_per_trial: 0.25` (4 trials share the GPU),
   `cpus_per_trial: 2`, `sweep.precision: bf16` (autocast in each trial).
2. **transfer**: the study's plan (rule `mup`), target width 512.
3. **large run**: `train.workers: 1, gpus_per_worker: 1, zero_stage: 1, precision: bf16` (DeepSpeed's
   bf16 mode, NCCL), 200 steps at global batch 32.
4. **ZeRO-3**: the same plan and seed with `zero_stage: 3` (parameters, gradients and optimizer
   states partitioned; the hand-off gathered from the partitions). Assertions (exit 1 when one
   fails, the JSON written first): both runs `ok`; per-step losses within ZERO3_REL_TOL of ZeRO-1's
   (bf16 and another reduction order: not bit-equal); the hand-off loads in plain `transformers` with
   its full readout shape. Figures: the largest per-step relative difference, each run's device peak
   memory per worker (`memory_per_rank`) and tokens/s.

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
     `--cpu-check`: the same code path on the CPU at toy size, fp32, 2 workers (no GPU figures;
     nothing written unless --out): that the script runs before a GPU is spent on it.
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
ZERO3_REL_TOL = 2e-2  # assumed for bf16 (8 bits of mantissa) over a changed reduction order; --cpu-check (fp32) measured 1.0e-7


def cpu_check_spec() -> dict:
    """The smoke spec at toy size on the CPU: fp32, no GPU, 2 large-run workers."""
    spec = smoke_spec(steps=10, target_steps=10, target_width=64, gpus_per_trial=0)
    spec["model"].update(head_dim=16, seq_len=32)
    spec["sweep"].update(widths=[16, 32], grid={"lr": [1e-2, 3e-2]}, batch_size=8, precision="fp32", gpus_per_trial=0)
    spec["sweep"]["cpus_per_trial"] = 1
    spec["target"]["batch_size"] = 8
    spec["train"].update(workers=2, gpus_per_worker=0, cpus_per_worker=1, precision="fp32")
    spec["data"]["max_files"] = 50
    return spec


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


def zero3_leg(work: Path, plan, zero1: dict) -> dict:
    """The ZeRO-1 run's plan again under ZeRO-3 (same seed, own folder), compared step by step."""
    from transformers import AutoModelForCausalLM

    from hptransfer.context import StudyContext
    from hptransfer.train.runner import run_train

    plan3 = plan.model_copy(update={"train": plan.train.model_copy(update={"zero_stage": 3})})
    t = time.perf_counter()
    m3 = run_train(StudyContext(None, work / "zero3", name=plan.study + "-zero3"), plan3)
    wall = round(time.perf_counter() - t, 2)
    h1 = json.loads((work / "study" / "train" / "train_metrics.json").read_text())
    h3 = json.loads((work / "zero3" / "train" / "train_metrics.json").read_text())
    l1, l3 = ([h["train_loss"] for h in x["history"]] for x in (h1, h3))
    worst = max(abs(a - b) / abs(a) for a, b in zip(l1, l3)) if l1 and len(l1) == len(l3) else float("inf")
    hf = AutoModelForCausalLM.from_pretrained(work / "zero3" / "train" / "hf_model")
    checks = {
        "both_ok": zero1.get("status") == "ok" and m3.get("status") == "ok",
        "losses_within_tol": worst <= ZERO3_REL_TOL,
        "handoff_full_readout": tuple(hf.lm_head.weight.shape) == (plan.model.vocab, plan.target.width),
    }
    return {
        "wall_s": wall,
        "zero_stages": [
            h1["deepspeed_config"]["zero_optimization"]["stage"],
            h3["deepspeed_config"]["zero_optimization"]["stage"],
        ],
        "max_rel_loss_diff": worst,
        "tolerance": ZERO3_REL_TOL,
        "val_loss": {"zero1": zero1.get("val_loss"), "zero3": m3.get("val_loss")},
        "tokens_per_s": {"zero1": zero1.get("tokens_per_s"), "zero3": m3.get("tokens_per_s")},
        "memory_per_rank": {"zero1": h1["final"].get("memory_per_rank"), "zero3": h3["final"].get("memory_per_rank")},
        "checks": checks,
        "ok": all(checks.values()),
    }


def run(args, info: dict) -> dict:
    from hptransfer.study import Study

    spec = (
        cpu_check_spec() if args.cpu_check else smoke_spec(args.steps, args.target_steps, args.target_width, args.gpus_per_trial)
    )
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
            zero3 = zero3_leg(work, plan, metrics)
            times["zero3_train_s"] = zero3["wall_s"]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return {
        **info,
        "gpu": gpu_info() if not args.cpu_check else None,
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
        "zero3": zero3,
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
    ap.add_argument("--cpu-check", action="store_true", help="the same path on the CPU at toy size (no GPU figures)")
    args = ap.parse_args(argv)

    import torch

    from hptransfer.env import configure
    from hptransfer.io import write_json

    configure()
    info = machine_info([str(Path(__file__).relative_to(ROOT)), *argv])
    if args.cpu_check:
        result = run(args, info)
        if args.out:
            write_json(args.out, result)
        print(json.dumps({k: result[k] for k in ("times", "large_run", "zero3")}, indent=2, default=str))
        sys.exit(0 if result["zero3"]["ok"] else 1)
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
    print(json.dumps({k: result[k] for k in ("times", "sweep", "large_run", "zero3")}, indent=2, default=str))
    print(f"[gpu_smoke] wrote {out}", flush=True)
    if not result["zero3"]["ok"]:
        print(f"[gpu_smoke] ZeRO-3 check failed: {result['zero3']['checks']}", file=sys.stderr)
        sys.exit(1)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
