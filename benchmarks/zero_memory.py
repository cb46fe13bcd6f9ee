"""ZeRO-1 against ZeRO-3 (and ZeRO-3 with `train.offload: cpu`) for a µP plan (issue 39): per-step
losses and memory per worker, in one run, one variant after the other on one local Ray.

Each variant is the real `run_train(plan)` (2 Ray Train workers × 1 CPU, gloo, DeepSpeed's CPU
accelerator) of the same µP plan, seed and data. Per worker it reads the final block of
`train_metrics.json` (train/loop.py: `memory_per_rank`), all less the resident set before the model
was built (libraries imported): `setup_peak` (`getrusage` ru_maxrss over the whole run, set-up
included) and `training` (the largest resident set at a step's end: model, gradients, optimizer
states and what activations left allocated), the figure ZeRO changes in steady state. On a GPU the
same block carries the peak allocated device memory (this machine has none, so here offload moves
states from one part of host memory to another: its figure is the code path working, not a saving).

Model-state arithmetic for comparison (fp32, Adam: 4 B weights + 4 B gradients + 8 B moments per
parameter, Rajbhandari et al. 2020): ZeRO-1 holds 8 + 8/N bytes per parameter on each of N workers,
ZeRO-3 16/N (plus the layer being gathered).

Run: .venv/bin/python benchmarks/zero_memory.py   → benchmarks/results/zero_memory.json
     (~4 min on 2 idle cores; `--width 256 --steps 4` for a smoke run)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import RESULTS, machine_info  # noqa: E402

WORKERS = 2
VARIANTS = {"zero1": (1, "none"), "zero3": (3, "none"), "zero3_offload_cpu": (3, "cpu")}


def make_plan(width: int, depth: int, steps: int, zero_stage: int, offload: str):
    from hptransfer.plan import TargetShape, TransferPlan
    from hptransfer.spec import parse_spec

    spec = parse_spec(
        {
            "name": "bench-zero",
            "model": {"family": "llama", "depth": depth, "head_dim": 64, "seq_len": 64, "parametrization": "mup"},
            "data": {"max_files": 200, "eval_batches": 2},
            "sweep": {"widths": [64, 128], "grid": {"lr": [1e-2]}, "steps": 10, "batch_size": 8},
            "target": {"width": width, "steps": steps, "batch_size": 8},
            "train": {
                "workers": WORKERS,
                "zero_stage": zero_stage,
                "offload": offload,
                "cpus_per_worker": 1,
                "eval_every": 10**6,
                "checkpoint_every": 0,
                "max_failures": 0,
            },
        }
    )
    return TransferPlan(
        study="bench-zero",
        rule="mup",
        model=spec.model,
        base_width=64,
        target=TargetShape(width=width, steps=steps, batch_size=8, seq_len=64),
        hyperparameters={"lr": 3e-3, "weight_decay": 0.1, "warmup_steps": 2, "grad_clip": 1.0},
        data=spec.data,
        train=spec.train,
    )


def run_variant(plan, out: Path) -> dict:
    from hptransfer.study import Study
    from hptransfer.train.runner import run_train

    study = Study(None, out, name=plan.study)
    t0 = time.perf_counter()
    run_train(study, plan, log=lambda m: None)
    fit_s = time.perf_counter() - t0
    tm = json.loads(study.paths.train.metrics.read_text())
    mem = tm["final"]["memory_per_rank"]
    return {
        "zero_optimization": tm["deepspeed_config"]["zero_optimization"],
        "losses": [round(h["train_loss"], 6) for h in tm["history"]],
        "final_train_loss": tm["final"]["train_loss"],
        "memory_per_rank": mem,
        "setup_peak_mb_per_rank": [round(r["rss_peak_mb"] - r["rss_start_mb"], 1) for r in mem],
        "training_mb_per_rank": [round(r["rss_steps_max_mb"] - r["rss_start_mb"], 1) for r in mem],
        "loop_s": round(tm["final"]["wall_s"], 2),
        "fit_s": round(fit_s, 2),
        "status": tm["final"]["status"],
    }


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", type=Path, default=RESULTS / "zero_memory.json")
    args = ap.parse_args(argv)

    from hptransfer.context import StudyContext
    from hptransfer.env import configure
    from hptransfer.io import write_json
    from hptransfer.spec import RaySpec

    configure()
    info = machine_info([str(Path(__file__).relative_to(ROOT)), *argv])
    work = Path(tempfile.mkdtemp(prefix="hpt_bench_zero_"))
    results, loads = {}, {}
    try:
        ctx = StudyContext(None, work, name="bench-zero")
        ctx.ray = RaySpec(num_cpus=WORKERS, object_store_mb=256)
        with ctx.ray_session():
            for name, (stage, offload) in VARIANTS.items():
                loads[f"before_{name}"] = round(os.getloadavg()[0], 2)
                plan = make_plan(args.width, args.depth, args.steps, stage, offload)
                results[name] = run_variant(plan, work / name)
                print(
                    f"[zero_memory] {name}: {json.dumps({k: v for k, v in results[name].items() if k != 'losses'})}", flush=True
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    from hptransfer.models import build_model

    spec_model = make_plan(args.width, args.depth, 1, 1, "none").model
    params = sum(p.numel() for p in build_model(spec_model, args.width, base_width=64).parameters())
    ref = results["zero1"]["losses"]
    compare = {
        name: {
            "max_rel_loss_diff_vs_zero1": max(abs(a - b) / abs(a) for a, b in zip(ref, r["losses"])),
            **{
                f"{k}_ratio_vs_zero1": round(sum(r[f"{k}_mb_per_rank"]) / max(sum(results["zero1"][f"{k}_mb_per_rank"]), 1e-9), 3)
                for k in ("setup_peak", "training")
            },
        }
        for name, r in results.items()
        if name != "zero1"
    }
    mb = params / 2**20
    result = {
        "benchmark": "zero_memory",
        "machine": {**info, "loadavg_1min": {**loads, "end": round(os.getloadavg()[0], 2)}},
        "setup": {
            "model": f"llama µP depth {args.depth}, head_dim 64",
            "width": args.width,
            "params": params,
            "global_batch": 8,
            "seq_len": 64,
            "steps": args.steps,
            "workers": WORKERS,
            "backend": "gloo, DeepSpeed CPU accelerator",
            "model_state_mb_expected_per_rank": {
                "zero1": round(mb * (8 + 8 / WORKERS), 1),
                "zero3": round(mb * 16 / WORKERS, 1),
            },
        },
        "variants": results,
        "compare": compare,
    }
    result["verdict"] = verdict(result)
    write_json(args.out, result)
    print(f"[zero_memory] {json.dumps(compare)}; wrote {args.out}", flush=True)
    return result


def verdict(result: dict) -> dict[str, str]:
    """What the figures say, drawn from them: the losses (same algorithm, so equal within float
    noise is the pass) and host memory against the model-state arithmetic (ZeRO-3 / ZeRO-1 =
    16/N ÷ (8 + 8/N), 0.67 at N = 2)."""
    exp = result["setup"]["model_state_mb_expected_per_rank"]
    expected = exp["zero3"] / exp["zero1"]
    out = {}
    for name, c in result["compare"].items():
        same = c["max_rel_loss_diff_vs_zero1"] <= 1e-5
        got = c["training_ratio_vs_zero1"]
        mem = f"training host memory {got:.2f}× ZeRO-1's, the arithmetic expects {expected:.2f}×: " + (
            "reproduced" if got <= expected * 1.1 else "not reproduced on this host"
        )
        out[name] = (
            f"losses {'the same' if same else 'differ'} (max relative difference {c['max_rel_loss_diff_vs_zero1']:.1e}); {mem}"
        )
    out["why"] = (
        "suspected, not isolated by this benchmark: every rank builds the whole fp32 model before deepspeed.initialize partitions it (no "
        "zero.Init: mup's set_base_shapes reads full shapes), the freed full tensors stay in the "
        "allocator's heap (resident set does not shrink), and ZeRO-3 adds its gather/prefetch and "
        "reduce buckets; on a CPU, offload moves states from host memory to host memory. ZeRO-3's "
        "saving is on GPU memory, which this benchmark reports as device_peak_mb where there is a GPU."
    )
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
