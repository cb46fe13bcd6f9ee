"""Transfer regret: does a small-width sweep find the large model's learning rate — measured beyond the noise?

Regime (chosen so the seed-to-seed noise at the target is far below the 0.5% we want to resolve,
and so a direct sweep with 3 seeds per LR fits ~30 minutes on 2 cores): the `mlp` family (a
per-position byte MLP LM over the current and previous byte, depth 2, the product's own model class)
on the stdlib byte corpus, batch 64 × seq 64 (4,096 tokens per step, 4× the quickstart's), 300
steps (warmup 30, cosine to 10%), AdamW λ = 0.1, evaluated on a fixed held-out set of 32 × 64 × 64
= 131k tokens (the same for every run, so evaluation adds no seed noise). The JSON records the
measured noise (`target_noise`: seed SD at the direct optimum, as a share of the loss); a Llama at
this horizon on 2 cores shows 2–4% (issue 12), which is why it is not used here.

Ladder 8/12/16/24/32 (5 widths; base width 8) → target 256 (8× the widest). Each ladder is swept as
`hpt sweep` would: seed 0 on the grid, then `noise_seeds` = 3 replicates of each width's best point
(`sweep.runner.replicate_points`, the code the product runs). A plan per rule comes from
`transfer.engine.make_plan` (the code `hpt transfer` runs). Rules:

- `mup` (µP, MuAdamW's independent weight decay), `mup-standard-wd` (µP with λ fixed: paper 3's
  "standard" scaling, the product's rule option), each against its own direct sweep;
- on an SP model: the SP optimum copied as is (rule `mup` on SP: what a user without a rule does),
  `sp-warmup` and `power-law`, against the SP direct sweep.

Ground truth: a direct sweep at the target on the same LR grid with seeds 0, 1, 2 per LR; its best LR
is the argmin of the seed-mean curve. To fit the budget it sweeps the grid points within two steps
of any rule's transferred LR and extends outward while the optimum is on the swept range's edge, so
the best direct LR is always bracketed; compute shares are against the full grid × 3 seeds (what a
user without transfer would sweep, not knowing where the optimum is). Each transferred LR is trained at the target with the same
seeds 0, 1, 2 (a seed fixes init and data order, so runs pair by seed):

    regret_s = (L_transfer(s) − L_best(s)) / mean_s L_best(s)           (per seed, paired)
    relative regret = mean_s regret_s,  95% interval: t(0.975, n−1) · sd / √n
    compute share = Σ_ladder 6·N_w·tokens / (|grid| · 3 seeds · 6·N_target·tokens)
                    (ladder incl. replicates; N = non-embedding parameters, readout included)

The predicted penalty of each plan (`diagnostics.predicted_penalty`, an absolute loss increase with
an interval) is set beside the measured absolute regret (the calibration table of issue 12).

Every run is plain PyTorch (`sweep.trial.train_proxy`, one thread per process, 2 processes; the
`sp-warmup` factor reaches it as the large run's does, through `extra_lr_factor`) and is cached by
its settings in a JSON-lines file (`common.RunCache`), so a killed run resumes and `paper_claims.py`
reuses it. `--cached-only` re-plans from the cache (seconds) and refuses to train a missing run:
the check that the figures still follow from the runs after a change to the engine.

Run: .venv/bin/python benchmarks/transfer_regret.py   → benchmarks/results/transfer_regret.{json,png}
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import time
from pathlib import Path

from common import RESULTS, ROOT, Interval, RunCache, key_str, machine_info, t_interval

CACHE = Path(os.environ.get("HPT_BENCH_CACHE", "/tmp/hpt_bench_regret_mlp.jsonl"))  # --cache moves it

# Another setting without editing the file: HPT_REGRET='{"ladder": [8, 16, 32, 64], "target": 512, "steps": 200}'
# (read at import, so the worker processes see it too).
_CFG = json.loads(os.environ.get("HPT_REGRET") or "{}")
FAMILY, DEPTH = _CFG.get("family", "mlp"), _CFG.get("depth", 2)
LADDER = _CFG.get("ladder", [8, 12, 16, 24, 32])
TARGET = _CFG.get("target", 256)
HEAD_DIM = _CFG.get("head_dim", 8)  # llama only
STEPS, WARMUP, BATCH, SEQ, WD = _CFG.get("steps", 300), _CFG.get("warmup", 30), _CFG.get("batch", 64), 64, 0.1
EVAL_BATCHES = _CFG.get("eval_batches", 32)
SEED = 0
SEEDS = tuple(_CFG.get("seeds", [0, 1, 2]))  # direct sweep and transferred runs
NOISE_SEEDS = _CFG.get("noise_seeds", 3)  # the ladder's replicates (the product's default)
GRIDS = {
    p: g
    for p, g in {
        "mup": [0.004 * 2**k for k in range(8)],  # 0.004 … 0.512 (base-width LRs)
        "sp": [0.0005 * 2**k for k in range(11)],  # 0.0005 … 0.512: SP's optimum falls with width (narrow widths want ≥ 0.128)
    }.items()
    if p in _CFG.get("parametrizations", ["mup", "sp"])
}
# A training variant: (parametrization, µP weight-decay scaling) — each has its own direct sweep.
VARIANTS = {"mup": ("mup", "independent"), "mup-standard-wd": ("mup", "standard"), "sp": ("sp", "independent")}
VARIANTS = {k: v for k, v in VARIANTS.items() if v[0] in GRIDS}
# (name, variant, rule)
RULES = [
    r
    for r in [
        ("mup", "mup", "mup"),
        ("mup-standard-wd", "mup-standard-wd", "mup-standard-wd"),
        ("sp-copied (no rule)", "sp", "mup"),
        ("sp-warmup", "sp", "sp-warmup"),
        ("power-law", "sp", "power-law"),
    ]
    if r[1] in VARIANTS
]


def spec_dict(par: str, widths: list[int], rule: str = "mup", target: int = TARGET, seeds: tuple[int, ...] = (SEED,)) -> dict:
    model = {"family": FAMILY, "depth": DEPTH, "seq_len": SEQ, "parametrization": par, "base_width": LADDER[0]}
    if FAMILY == "llama":
        model["head_dim"] = HEAD_DIM
    return {
        "name": f"bench-{par}",
        "seed": SEED,
        "model": model,
        "data": {"max_files": 400, "eval_batches": EVAL_BATCHES},
        "sweep": {
            "widths": widths,
            "grid": {"lr": GRIDS[par]},
            "fixed": {"weight_decay": WD, "warmup_steps": WARMUP},
            "steps": STEPS,
            "batch_size": BATCH,
            "seeds": list(seeds),
            "noise_seeds": NOISE_SEEDS,
            "reports": 1,
        },
        "transfer": {"rule": rule},
        "target": {"width": target},
    }


def run_key(
    par: str, width: int, lr: float, wd: float = WD, wd_mode: str = "independent", schedule: dict | None = None, seed: int = SEED
) -> dict:
    """Everything that changes a run's result; the cache key."""
    return {
        "family": FAMILY,
        "depth": DEPTH,
        "par": par,
        "width": width,
        "lr": float(f"{lr:.6g}"),
        "wd": wd,
        "wd_mode": wd_mode if par == "mup" else "independent",  # SP has no width-scaled decay
        "schedule": schedule,
        "steps": STEPS,
        "warmup": WARMUP,
        "batch": BATCH,
        "seq": SEQ,
        "eval_batches": EVAL_BATCHES,
        "seed": seed,
        "head_dim": HEAD_DIM if FAMILY == "llama" else None,
        "base_width": LADDER[0],
    }


def _train(key: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    from hptransfer.hyperparameters import Hyperparameters
    from hptransfer.models import build_model, param_count
    from hptransfer.spec import parse_spec
    from hptransfer.sweep.trial import train_proxy
    from hptransfer.transfer.schedule import warmup_multiplier

    # µP's weight-decay scaling is the rule's (models.setup.weight_decay_scaling): the product's option.
    rule = "mup-standard-wd" if key["wd_mode"] == "standard" else "mup"
    spec = parse_spec(spec_dict(key["par"], LADDER, rule, target=max(TARGET, key["width"])))
    hps = Hyperparameters(lr=key["lr"], weight_decay=key["wd"], warmup_steps=WARMUP)
    # `sp-warmup`'s multiplicative warmup on the schedule, as train/loop.py applies it to the large run.
    plan = {"schedule": {"kind": "sp-warmup", **key["schedule"]}} if key["schedule"] else None
    extra = (lambda s: warmup_multiplier(s, plan)) if plan else None
    m = train_proxy(spec, key["width"], hps, key["seed"], n_reports=1, extra_lr_factor=extra)
    # FLOPs ≈ 6·N·D with N the non-embedding parameters (Kaplan et al.): an embedding lookup is a
    # gather, not a matmul; the readout is counted.
    n = param_count(build_model(spec.model, key["width"], base_width=spec.base_width, seed=0), non_embedding=True)
    return {
        **key,
        "val_loss": m["val_loss"],
        "status": m["status"],
        "train_loss": m["train_loss"],
        "wall_s": m.get("wall_s"),
        "train_s": m.get("train_s"),
        "n_params": n,
        "flops": 6.0 * n * STEPS * BATCH * SEQ,
    }


def _describe(r: dict) -> str:
    return (
        f"{r['par']} w={r['width']} lr={r['lr']:g} wd={r['wd_mode']}{' +warmup' if r['schedule'] else ''} "
        f"seed={r['seed']} → {r['val_loss']:.4f} ({r['status']}, {r['wall_s']:.0f}s)"
    )


def run_all(cache: RunCache, keys: list[dict], procs: int = 2) -> dict[str, dict]:
    """Run the keys not yet cached (widest first, to balance the pool); return all results by key."""
    return cache.run(keys, _train, procs=procs, first=lambda k: -k["width"], describe=_describe)


def table(results: dict[str, dict] | list[dict], replicate: bool = False):
    import pandas as pd

    rows = [
        {
            "width": r["width"],
            "lr": r["lr"],
            "seed": r["seed"],
            "val_loss": r["val_loss"],
            "status": r["status"],
            "replicate": replicate,
        }
        for r in (results.values() if isinstance(results, dict) else results)
    ]
    return pd.DataFrame(rows)


def machine() -> dict:
    return machine_info(
        processes=2,
        torch_threads_per_process=1,
        note="shared 2-core VM; other jobs may have run concurrently, so wall times are upper bounds (losses are unaffected)",
    )


def _ladder(cache: RunCache, variant: str, res_grid: dict, procs: int) -> tuple:
    """The ladder as `hpt sweep` runs it: seed 0 on the grid, then replicates of each width's best."""
    import pandas as pd

    from hptransfer.spec import parse_spec
    from hptransfer.sweep.runner import replicate_points

    par, mode = VARIANTS[variant]
    grid_df = table(res_grid)
    points = replicate_points(parse_spec(spec_dict(par, LADDER)), grid_df)
    rep_keys = [run_key(par, p["width"], p["lr"], wd_mode=mode, seed=p["seed"]) for p in points]
    rep = run_all(cache, rep_keys, procs)
    return pd.concat([grid_df, table(rep, replicate=True)], ignore_index=True), list(res_grid.values()) + list(rep.values())


def _direct_sweep(cache: RunCache, variant: str, centers: list[float], res: dict, procs: int) -> list[dict]:
    """The ground truth at the target, on the LR grid, `SEEDS` per LR: first the grid points within
    two steps (×4) of any rule's transferred LR, then one more step outward while the seed-mean
    optimum sits on the swept range's edge — so the best direct LR is bracketed by worse points on
    both sides (or is the grid's own edge, reported as such) at a fraction of a full sweep's cost."""
    par, mode = VARIANTS[variant]
    grid = GRIDS[par]
    idx = {i for i, lr in enumerate(grid) if any(c / 4.01 <= lr <= c * 4.01 for c in centers)}
    if not idx:  # every transferred LR is off the grid: start at the nearest grid point
        idx = {min(range(len(grid)), key=lambda i: min(abs(math.log(grid[i] / c)) for c in centers))}
    while True:
        keys = [run_key(par, TARGET, grid[i], wd_mode=mode, seed=s) for i in sorted(idx) for s in SEEDS]
        res.update(run_all(cache, keys, procs))
        mean = {}
        for i in sorted(idx):
            ls = [res[key_str(run_key(par, TARGET, grid[i], wd_mode=mode, seed=s))] for s in SEEDS]
            ok = all(r["status"] == "ok" and math.isfinite(r["val_loss"]) for r in ls)
            mean[i] = sum(r["val_loss"] for r in ls) / len(ls) if ok else math.inf
        b = min(mean, key=mean.get)
        if b == min(idx) and b > 0:
            idx.add(b - 1)
        elif b == max(idx) and b < len(grid) - 1:
            idx.add(b + 1)
        else:
            return keys


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "transfer_regret.json")
    ap.add_argument("--cache", type=Path, default=CACHE, help=f"JSON-lines run cache (default: {CACHE}; env HPT_BENCH_CACHE)")
    ap.add_argument(
        "--cached-only", action="store_true", help="re-plan from the run cache only; refuse if a run would have to be trained"
    )
    args = ap.parse_args(argv)
    import numpy as np

    from hptransfer.io import save_figure, write_json
    from hptransfer.spec import parse_spec
    from hptransfer.transfer.engine import make_plan

    t_start = time.perf_counter()
    cache = RunCache(args.cache, train=not args.cached_only)
    grid_keys = {v: [run_key(p, w, lr, wd_mode=m) for w in LADDER for lr in GRIDS[p]] for v, (p, m) in VARIANTS.items()}
    res = run_all(cache, [k for ks in grid_keys.values() for k in ks], args.procs)
    ladders = {v: _ladder(cache, v, {key_str(k): res[key_str(k)] for k in grid_keys[v]}, args.procs) for v in VARIANTS}

    plans = {}
    for name, v, rule in RULES:
        par = VARIANTS[v][0]
        plans[name] = make_plan(parse_spec(spec_dict(par, LADDER, rule)), ladders[v][0])
    transferred = {
        name: [
            run_key(
                VARIANTS[v][0],
                TARGET,
                plans[name].hyperparameters["lr"],
                wd_mode=VARIANTS[v][1],
                schedule=_warmup(plans[name].schedule),
                seed=s,
            )
            for s in SEEDS
        ]
        for name, v, _ in RULES
    }
    res.update(run_all(cache, [k for ks in transferred.values() for k in ks], args.procs))
    direct_keys = {}
    for v in VARIANTS:
        centers = [plans[name].hyperparameters["lr"] for name, vv, _ in RULES if vv == v]
        direct_keys[v] = _direct_sweep(cache, v, centers, res, args.procs)

    out = {
        "setting": {
            "family": FAMILY,
            "depth": DEPTH,
            "ladder": LADDER,
            "target": TARGET,
            "width_ratio": TARGET / LADDER[-1],
            "steps": STEPS,
            "warmup_steps": WARMUP,
            "batch": BATCH,
            "seq_len": SEQ,
            "tokens_per_step": BATCH * SEQ,
            "eval_tokens": EVAL_BATCHES * BATCH * SEQ,
            "weight_decay": WD,
            "seed": SEED,
            "seeds": list(SEEDS),
            "ladder_noise_seeds": NOISE_SEEDS,
            "grids": GRIDS,
            "head_dim": HEAD_DIM if FAMILY == "llama" else None,
            "corpus": "stdlib, 400 files, byte-level",
        },
        "machine": machine(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": (f"HPT_REGRET='{json.dumps(_CFG)}' " if _CFG else "")
        + ".venv/bin/python benchmarks/transfer_regret.py"
        + (
            f" --out {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}"
            if args.out != RESULTS / "transfer_regret.json"
            else ""
        ),
        "rules": [],
        "direct": {},
    }
    best_runs = {}
    for v, (p, _) in VARIANTS.items():
        d = [res[key_str(k)] for k in direct_keys[v]]
        curve = []
        for lr in sorted({r["lr"] for r in d}):
            runs = [r for r in d if r["lr"] == lr]
            ok = [r["val_loss"] for r in runs if r["status"] == "ok" and math.isfinite(r["val_loss"])]
            ci = t_interval(ok) if len(ok) == len(runs) else Interval(math.nan, math.nan, math.nan, len(ok))
            curve.append(
                {
                    "lr": float(f"{lr:.6g}"),
                    "mean": ci.mean,
                    "ci": [ci.lo, ci.hi],
                    "losses": [r["val_loss"] for r in runs],
                    "statuses": [r["status"] for r in runs],
                }
            )
        best = min((c for c in curve if math.isfinite(c["mean"])), key=lambda c: c["mean"])
        best_runs[v] = {r["seed"]: r for r in d if r["lr"] == best["lr"]}
        sd = float(np.std(best["losses"], ddof=1)) if len(best["losses"]) > 1 else math.nan
        lad_rows = ladders[v][1]
        out["direct"][v] = {
            "parametrization": p,
            "curve": curve,
            "best_lr": best["lr"],
            "best_loss": best["mean"],
            "best_loss_ci": best["ci"],
            "target_noise": {"seed_sd": sd, "relative": sd / best["mean"]},
            "ladder_flops": sum(r["flops"] for r in lad_rows),
            "direct_flops": len(GRIDS[p]) * len(SEEDS) * d[0]["flops"],  # the full grid × seeds
            "direct_flops_swept": sum(r["flops"] for r in d),
            "ladder_wall_s": sum(r["wall_s"] for r in lad_rows),
            "direct_wall_s": sum(r["wall_s"] for r in d),
            "ladder": [
                {"width": r["width"], "lr": r["lr"], "seed": r["seed"], "val_loss": r["val_loss"], "status": r["status"]}
                for r in lad_rows
            ],
        }
    per_seed_regret = {}
    for name, v, rule in RULES:
        plan, dd = plans[name], out["direct"][v]
        runs = [res[key_str(k)] for k in transferred[name]]
        base = best_runs[v]
        mean_best = dd["best_loss"]
        diffs = [r["val_loss"] - base[r["seed"]]["val_loss"] for r in runs]
        ok = all(math.isfinite(x) for x in diffs)
        per_seed_regret[name] = [x / mean_best for x in diffs] if ok else None
        rel = t_interval(per_seed_regret[name]) if ok else None
        ab = t_interval(diffs) if ok else None
        diag = plan.diagnostics.model_dump(mode="json")  # the same JSON as the plan file
        out["rules"].append(
            {
                "name": name,
                "variant": v,
                "parametrization": VARIANTS[v][0],
                "rule": rule,
                "transferred_lr": plan.hyperparameters["lr"],
                "schedule": plan.schedule.get("kind"),
                "target_losses": [r["val_loss"] for r in runs],
                "target_statuses": [r["status"] for r in runs],
                "target_loss": t_interval([r["val_loss"] for r in runs]).mean if ok else math.nan,
                "best_direct_lr": dd["best_lr"],
                "best_direct_loss": mean_best,
                "relative_regret": rel.mean if ok else None,
                "regret_ci": [rel.lo, rel.hi] if ok else None,
                "absolute_regret": ab.mean if ok else None,
                "absolute_regret_ci": [ab.lo, ab.hi] if ok else None,
                "compute_fraction": dd["ladder_flops"] / dd["direct_flops"],
                "predicted_penalty": diag.get("predicted_penalty"),
                "predicted_penalty_interval": diag.get("predicted_penalty_interval"),
                "predicted_penalty_basis": diag.get("predicted_penalty_basis"),
                "predicted_penalty_weights": diag.get("predicted_penalty_weights"),
                "predicted_penalty_bias": diag.get("predicted_penalty_bias"),
                "predicted_penalty_se": diag.get("predicted_penalty_se"),
                "predicted_target_loss": diag.get("predicted_target_loss"),
                "predicted_target_loss_interval": diag.get("predicted_target_loss_interval"),
                "fast_transfer": diag.get("fast_transfer"),
                "warnings": plan.warnings if hasattr(plan, "warnings") else diag.get("warnings", []),
            }
        )
    # SP copied vs µP: paired (by seed) difference of relative regrets.
    if per_seed_regret.get("sp-copied (no rule)") and per_seed_regret.get("mup"):
        d = [a - b for a, b in zip(per_seed_regret["sp-copied (no rule)"], per_seed_regret["mup"])]
        ci = t_interval(d)
        out["sp_copied_minus_mup"] = {"mean": ci.mean, "ci": [ci.lo, ci.hi]}
    # This invocation's wall (a rerun with every run cached only re-plans: seconds) and how many runs
    # it trained; the training itself is total_train_wall_s, summed over the cached runs.
    out["process_wall_s"] = round(time.perf_counter() - t_start, 1)
    out["runs_trained_this_invocation"] = cache.trained
    out["total_train_wall_s"] = round(sum(r.get("wall_s") or 0 for r in res.values()), 1)
    png = args.out.with_suffix(".png")
    save_figure(_figure(out), png)
    out["figure"] = str(png.relative_to(ROOT)) if png.is_relative_to(ROOT) else str(png)
    write_json(args.out, out)
    for r in out["rules"]:
        reg = (
            "n/a"
            if r["relative_regret"] is None
            else f"{100 * r['relative_regret']:+.2f}% [{100 * r['regret_ci'][0]:+.2f}, {100 * r['regret_ci'][1]:+.2f}]"
        )
        print(
            f"{r['name']:<22} lr={r['transferred_lr']:.4g} loss={r['target_loss']:.4f} best={r['best_direct_loss']:.4f} "
            f"(lr {r['best_direct_lr']:g}) regret={reg} compute={100 * r['compute_fraction']:.1f}% "
            f"predicted={r['predicted_penalty']}"
        )
    for v, dd in out["direct"].items():
        print(
            f"{v}: seed SD at the direct optimum {dd['target_noise']['seed_sd']:.4f} ({100 * dd['target_noise']['relative']:.3f}% of the loss)"
        )
    print(f"wrote {args.out} and {png}")
    return out


def _warmup(schedule: dict | None) -> dict | None:
    if schedule and schedule.get("kind") == "sp-warmup":
        return {"m": float(f"{schedule['m']:.6g}"), "timescale": float(f"{schedule['timescale']:.6g}")}
    return None


def _figure(out: dict):
    import matplotlib.pyplot as plt

    variants = list(out["direct"])
    fig, axes = plt.subplots(1, len(variants), figsize=(5.5 * len(variants), 4.2), sharey=True, squeeze=False)
    axes = axes[0]
    markers = iter("o^sDv*PXhp<>")
    for ax, v in zip(axes, variants):
        d = out["direct"][v]
        for w in LADDER:
            pts = sorted(
                (r["lr"], r["val_loss"]) for r in d["ladder"] if r["width"] == w and r["status"] == "ok" and r["seed"] == SEED
            )
            if pts:
                ax.plot(*zip(*pts), "-", alpha=0.45, label=f"width {w} (sweep)")
        c = [x for x in d["curve"] if math.isfinite(x["mean"])]
        ax.errorbar(
            [x["lr"] for x in c],
            [x["mean"] for x in c],
            yerr=[[x["mean"] - x["ci"][0] for x in c], [x["ci"][1] - x["mean"] for x in c]],
            fmt="k-o",
            ms=4,
            capsize=2,
            label=f"width {TARGET} (direct, {len(SEEDS)} seeds, 95% CI)",
        )
        for r in out["rules"]:
            if r["variant"] == v and math.isfinite(r["target_loss"]):
                ci = r["regret_ci"]
                ax.plot(
                    r["transferred_lr"],
                    r["target_loss"],
                    next(markers),
                    ms=10,
                    mfc="none",
                    mew=2,
                    label=f"{r['name']}: regret {100 * r['relative_regret']:+.2f}% [{100 * ci[0]:+.2f}, {100 * ci[1]:+.2f}]",
                )
        ax.set_xscale("log")
        ax.set_xlabel("learning rate" + (" (base-width value)" if d["parametrization"] == "mup" else ""))
        ax.set_title(f"{v}: {LADDER} → {TARGET}")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    lo = min(x["mean"] for v in variants for x in out["direct"][v]["curve"] if math.isfinite(x["mean"]))
    axes[0].set_ylim(lo - 0.05, lo + 0.6)
    axes[0].set_ylabel(f"validation loss after {STEPS} steps")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    main()
