"""DP fine-tuning of a language model: the batch size and clipping bound `hpt dp-plan` picks, against
the best cell of a (B, C) grid and a common default, and paper 1's three directions (Rehn et al.,
arXiv 2510.20616; docs/RESEARCH.md).

Each run is one trial of `hpt dp-sweep`'s language-model task (`hptransfer.dp.lm_task`, plain
PyTorch + Opacus in one process): a byte-level MLP LM (`family: mlp`, width 32, depth 2, µP at its
base width, seq_len 32) trained with DP-Adam in the normalized clipping form on the first N = 4096
sequences of 33 bytes of the stdlib corpus, Poisson sampling at q = B/N for T = ceil(E·N/B) steps,
E = 4 epochs, σ from the PRV accountant for (ε, δ, q, T); scored by the validation loss on 8 fixed
batches of 64 held-out sequences. Every run's ε spent (Opacus' accountant) is checked ≤ ε.

Why this size: a run costs ≈ E·N per-example gradients plus a per-step overhead; at N = 4096, E = 4
that is 8–25 s on one thread of this shared machine, so the 174 runs fit in ~12 min on 2 idle
processes and ~20 min under a load of 4 (budget: 25 min). σ√T depends only on q = B/N and E, and
over B = 32…512 (q = 1/128…1/8) the table has paper 1's shape: at ε = 0.5 it is flat within 5% over
B = 128…512 (31.8, 30.9, 30.5; the plateau), at ε = 8 it falls 2.5× from B = 32 to 512. B = 1024
would leave T = 16 < min_steps = 20. A Llama of the same width costs ~2.5× per run and would not
fit. The model is trained from scratch (the task's `dp.init_from: null`), not from a pre-trained
backbone as in paper 1: the directions are tested on DP training of a fresh small LM.

δ = 1e-5: paper 1's value, and the project's conventional δ ≪ 1/N (`privacy._suggest_delta`: the
largest power of ten below 1/(10·N) = 2.4e-5), so δ·N ≈ 0.04.

Compared at each ε ∈ {0.5, 2, 8}, 3 seeds each:
- dp-plan: `dp_plan_for` (what `hpt dp-plan` picks) over B ∈ {32, …, 512}, C = clip_reference;
- grid best: the lowest seed-mean loss over the feasible B × the plan's C grid (reference × {¼, 1,
  4}, extended upward as ε falls). Chosen on the seeds it is scored on, so it is optimistic (winner's
  curse): "plan − grid best" overstates the plan's gap;
- default: B = 256, C = 1.0 (Opacus' tutorial max_grad_norm), marked infeasible when T < min_steps.
clip_reference is the median per-example gradient norm of the fresh model on 512 sequences of the
corpus beyond the first N (disjoint from the private ones; public in this benchmark's framing).
The LR follows one rule in every cell: lr = 0.02·√(B/256) (paper 1's starting point when B moves,
`dp.rule.lr_scale`); 0.02 was the best of {0.01, 0.02, 0.04, 0.08} at B = 256, C = reference,
ε = 2 (seeds 0–1), measured once before the benchmark. It is not tuned per cell.

Intervals: mean over seeds with a 95% t-interval; differences are paired by seed (same model init).
Verdicts, derived from the intervals (`verdict`):
(a) ε = 0.5: over the B where σ√T is within the plan's tolerance (5%) of its minimum, the per-seed
    slope of loss against log2 B (at each B's best C), relative to the mean loss, lies inside ±1% per
    doubling (assumption: the paper gives no number) → reproduced; entirely outside → not reproduced;
(b) ε = 8: that slope over every feasible B is < 0 (larger B is better);
(c) log C* at ε = 0.5 minus log C* at ε = 8 is > 0, C* from a parabola in log C at each ε's best B
    (`transfer.optimum.fit_optimum`; an optimum on the grid edge opens that side of the interval).

Run: .venv/bin/python benchmarks/dp_lm.py   → benchmarks/results/dp_lm.{json,png}
Quick end-to-end check (1 ε, 2 points, 2 seeds, a few steps; ~1 min): add `--quick --out /tmp/dp_lm`.
A rerun resumes from the JSON-lines run cache (/tmp/hpt_dp_lm_runs.jsonl; `--cache` moves it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from common import RESULTS, RunCache, machine_info, t_interval, verdict

CACHE = Path("/tmp/hpt_dp_lm_runs.jsonl")  # every run's result, keyed by its settings (--cache to move it)

FULL = {
    "epsilons": [0.5, 2.0, 8.0],
    "dataset_size": 4096,
    "epochs": 4,
    "batch_sizes": [32, 64, 128, 256, 512],
    "min_steps": 20,
    "clip_factors": [0.25, 1.0, 4.0],
    "seeds": [0, 1, 2],
    "width": 32,
    "depth": 2,
    "seq_len": 32,
    "lr_ref": 0.02,
    "lr_ref_batch": 256,
    "delta": 1e-5,
    "accountant": "prv",
    "tolerance": 0.05,
    "eval_batches": 8,
    "eval_batch": 64,
    "max_files": 400,
    "flat_margin": 0.01,  # (a): |relative slope per doubling of B| ≤ 1% is "flat" (assumption)
}
QUICK = {  # ε = 8 (no grid extension): exactly 2 (B, C) points; B = 256 is infeasible here (T < min_steps)
    **FULL,
    "epsilons": [8.0],
    "dataset_size": 512,
    "epochs": 2,
    "batch_sizes": [32, 64],
    "min_steps": 5,
    "clip_factors": [1.0],
    "seeds": [0, 1],
    "accountant": "rdp",  # PRV's σ search at q = 1/16 takes ~30 s; RDP a fraction of a second
    "eval_batches": 2,
}
DEFAULT = {"batch_size": 256, "clip": 1.0}  # a common default: Opacus tutorials' max_grad_norm = 1.0
# Another setting without editing the file: HPT_DP_LM='{"dataset_size": 8192, "seeds": [0, 1, 2, 3]}'
# (read at import, so the worker processes see it too).
_OVERRIDE = json.loads(os.environ.get("HPT_DP_LM") or "{}")


def settings(quick: bool) -> dict:
    return {**(QUICK if quick else FULL), **_OVERRIDE}


def spec_dict(s: dict) -> dict:
    """The study spec whose `hpt dp-sweep` trials these runs are."""
    return {
        "name": "bench-dp-lm",
        "model": {"family": "mlp", "depth": s["depth"], "seq_len": s["seq_len"], "parametrization": "mup"},
        "data": {"corpus": "stdlib", "max_files": s["max_files"], "eval_batches": s["eval_batches"]},
        "sweep": {"widths": [s["width"], 2 * s["width"]], "grid": {"lr": [s["lr_ref"]]}, "batch_size": s["eval_batch"]},
        "target": {"width": 2 * s["width"]},
        "transfer": {"rule": "dp"},
        "dp": {
            "epsilon": s["epsilons"][0],
            "delta": s["delta"],
            "dataset_size": s["dataset_size"],
            "epochs": s["epochs"],
            "batch_sizes": s["batch_sizes"],
            "min_steps": s["min_steps"],
            "tolerance": s["tolerance"],
            "accountant": s["accountant"],
            "clip_factors": s["clip_factors"],
            "lr": s["lr_ref"],
            "lr_reference_batch": s["lr_ref_batch"],
        },
    }


# --- runs: one process per core, cached by their settings ---------------------------------------

_W: dict = {}


def _init(spec: dict) -> None:
    import torch

    from hptransfer.dp.lm_task import load_lm_task
    from hptransfer.spec import parse_spec

    torch.set_num_threads(1)
    _W["task"] = load_lm_task(parse_spec(spec))


def _run(key: dict) -> dict:
    from hptransfer.dp.lm_task import run_dp_lm_finetune

    t0 = time.perf_counter()
    m = run_dp_lm_finetune(
        _W["task"],
        epsilon=key["epsilon"],
        delta=key["delta"],
        epochs=key["epochs"],
        batch_size=key["batch_size"],
        clip=key["clip"],
        lr=key["lr"],
        accountant=key["accountant"],
        seed=key["seed"],
    )
    assert m["dp/epsilon"] <= key["epsilon"] + 1e-9, (m["dp/epsilon"], key)  # train_dp raises first
    extra = {"epsilon_spent": m.pop("dp/epsilon"), **m}
    return {**key, **extra, "wall_s": time.perf_counter() - t0}


def run_key(s: dict, epsilon: float, batch_size: int, clip: float, lr: float, seed: int) -> dict:
    """Everything that changes a run's result: the cache key."""
    return {
        "epsilon": epsilon,
        "batch_size": batch_size,
        "clip": float(f"{clip:.6g}"),
        "lr": float(f"{lr:.6g}"),
        "seed": seed,
        **{k: s[k] for k in ("dataset_size", "epochs", "delta", "accountant", "width", "depth", "seq_len")},
        **{k: s[k] for k in ("eval_batches", "eval_batch", "max_files")},
    }


def _describe(r: dict) -> str:
    return (
        f"ε={r['epsilon']:g} B={r['batch_size']} C={r['clip']:.3g} lr={r['lr']:.3g} seed={r['seed']} → val "
        f"{r['val_loss']:.4f} (ε spent {r['epsilon_spent']:.3g}, T={r['steps']}, {r['wall_s']:.0f}s)"
    )


def run_all(keys: list[dict], spec: dict, cache: RunCache, procs: int) -> dict[str, dict]:
    """Train the keys not in the JSON-lines cache (smallest B first: the longest runs); all results by key."""
    return cache.run(
        keys, _run, procs=procs, first=lambda k: k["batch_size"], describe=_describe, initializer=_init, initargs=(spec,)
    )


def public_grad_norm(spec: dict, n: int = 512, seed: int = 0) -> float:
    """Median per-example gradient norm of the fresh model on `n` sequences after the first N (not
    among the private ones): the clipping grid's reference scale (`DPConfig.clip_reference`)."""
    import torch
    from opacus import GradSampleModule

    from hptransfer.dp.lm import private_sequences, register_mu_readout
    from hptransfer.dp.lm_task import lm_loss
    from hptransfer.hyperparameters import Hyperparameters
    from hptransfer.models import training_setup
    from hptransfer.spec import parse_spec

    sp = parse_spec(spec)
    big_n = sp.dp.dataset_size
    seqs = private_sequences(sp.data, sp.model.seq_len, big_n + n)[big_n:]
    register_mu_readout()
    model = training_setup(
        sp.model, sp.base_width, base_width=sp.base_width, hps=Hyperparameters(lr=1.0), total_steps=1, seed=seed
    ).model
    gsm = GradSampleModule(model)
    lm_loss(gsm(seqs[:, :-1]), seqs[:, 1:]).backward()
    norms = torch.sqrt(sum(p.grad_sample.flatten(1).pow(2).sum(1) for p in model.parameters() if p.grad_sample is not None))
    return float(norms.median())


# --- statistics and verdicts (pure) ---------------------------------------------------------------


def relative_slopes(losses: dict[int, dict[int, float]]) -> list[float]:
    """Per seed: least-squares slope of loss against log2 B, divided by that seed's mean loss.
    losses: {B: {seed: loss}}; seeds present at every B only."""
    bs = sorted(losses)
    seeds = sorted(set.intersection(*(set(losses[b]) for b in bs)))
    x = [math.log2(b) for b in bs]
    mx = sum(x) / len(x)
    out = []
    for s in seeds:
        y = [losses[b][s] for b in bs]
        my = sum(y) / len(y)
        slope = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y)) / sum((xi - mx) ** 2 for xi in x)
        out.append(slope / my)
    return out


def log_optimum_difference(small: dict, large: dict) -> dict:
    """log C*(small ε) − log C*(large ε) with a 95% interval from the two fits' standard errors; a
    censored optimum (best C on the grid edge) opens its side of the interval."""
    d = math.log(small["value"]) - math.log(large["value"])
    h = 1.96 * math.hypot(small["log_se"], large["log_se"])
    lo, hi = d - h, d + h
    if small["censored"] == "lower" or large["censored"] == "upper":
        hi = math.inf
    if small["censored"] == "upper" or large["censored"] == "lower":
        lo = -math.inf
    return {"mean": d, "lo": lo, "hi": hi}


# --- the benchmark --------------------------------------------------------------------------------


def plan_for(s: dict, epsilon: float, clip_reference: float):
    from hptransfer.dp.plan import dp_plan_for
    from hptransfer.privacy import DPConfig

    return dp_plan_for(
        DPConfig(
            epsilon=epsilon,
            delta=s["delta"],
            dataset_size=s["dataset_size"],
            epochs=s["epochs"],
            batch_sizes=s["batch_sizes"],
            min_steps=s["min_steps"],
            tolerance=s["tolerance"],
            accountant=s["accountant"],
            clip_reference=clip_reference,
            clip_factors=s["clip_factors"],
            lr=s["lr_ref"],
            lr_reference_batch=s["lr_ref_batch"],
        )
    )


def lr_for(s: dict, batch_size: int) -> float:
    from hptransfer.dp.rule import lr_scale

    return s["lr_ref"] * lr_scale(s["lr_ref_batch"], batch_size)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 ε, 2 points, 2 seeds, a few steps: an end-to-end check")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for dp_lm.json and dp_lm.png")
    ap.add_argument("--cache", type=Path, default=CACHE, help=f"JSON-lines run cache (default: {CACHE})")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--cached-only", action="store_true", help="only read runs from the cache; refuse to train a missing one")
    args = ap.parse_args(argv)
    from hptransfer.dp.accounting import noise_row
    from hptransfer.io import write_json

    t0 = time.perf_counter()
    s = settings(args.quick)
    spec = spec_dict(s)
    ref = float(f"{public_grad_norm(spec):.3g}")
    spec["dp"]["clip_reference"] = ref
    print(f"clip_reference (median public per-example gradient norm) = {ref}", flush=True)

    plans, grid_cells, default_rows = {}, set(), {}
    for eps in s["epsilons"]:
        plans[eps] = plan = plan_for(s, eps, ref)
        grid_cells |= {(eps, r.batch_size, _c(c)) for r in plan.table if r.feasible for c in plan.clip_grid}
        default_rows[eps] = noise_row(
            eps, s["delta"], s["dataset_size"], s["epochs"], DEFAULT["batch_size"], s["min_steps"], s["accountant"]
        )
    cells = grid_cells | {(e, DEFAULT["batch_size"], DEFAULT["clip"]) for e, d in default_rows.items() if d.feasible}
    keys = [run_key(s, e, b, c, lr_for(s, b), seed) for (e, b, c) in sorted(cells) for seed in s["seeds"]]
    results = run_all(keys, spec, RunCache(args.cache, train=not args.cached_only), args.procs)
    by_cell: dict[tuple, dict[int, float]] = {}
    for r in results.values():
        by_cell.setdefault((r["epsilon"], r["batch_size"], r["clip"]), {})[r["seed"]] = r["val_loss"]
    out = analyse(s, ref, plans, grid_cells, default_rows, by_cell)
    out["max_epsilon_spent_over_target"] = max(r["epsilon_spent"] / r["epsilon"] for r in results.values())
    out.update(
        command=" ".join([".venv/bin/python", "benchmarks/dp_lm.py", *(argv if argv is not None else sys.argv[1:])]),
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        machine=machine_info(
            argv,
            processes=args.procs,
            torch_threads_per_process=1,
            note="shared 2-core VM; other jobs may run concurrently, so wall times are upper bounds (losses are unaffected)",
        ),
        runs=len(keys),
        run_wall_s_total=round(sum(r["wall_s"] for r in results.values()), 1),
        wall_s=round(time.perf_counter() - t0, 1),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    plot(out, args.out / "dp_lm.png")
    out["figure"] = "benchmarks/results/dp_lm.png" if args.out.resolve() == RESULTS.resolve() else str(args.out / "dp_lm.png")
    write_json(args.out / "dp_lm.json", out)
    print(json.dumps({k: out[k] for k in ("comparisons", "verdicts", "wall_s")}, indent=1, default=str))
    return out


def _c(c: float) -> float:
    return float(f"{c:.6g}")


def _mean(seeds: dict[int, float]) -> float:
    v = list(seeds.values())
    return sum(v) / len(v) if v and all(math.isfinite(x) for x in v) else math.inf


def paired(a: dict[int, float], b: dict[int, float]) -> dict:
    """a − b paired by seed, with its 95% t-interval."""
    common = sorted(set(a) & set(b))
    return t_interval([a[k] - b[k] for k in common]).as_dict()


def _best_c_per_b(eps: float, grid_cells: set, by_cell: dict) -> dict[int, tuple[float, dict[int, float]]]:
    """Each B's best C at ε (lowest seed-mean loss) and its per-seed losses."""
    out: dict[int, tuple[float, dict[int, float]]] = {}
    for e, b, c in grid_cells:
        if e == eps and (b not in out or _mean(by_cell[(e, b, c)]) < _mean(out[b][1])):
            out[b] = (c, by_cell[(e, b, c)])
    return dict(sorted(out.items()))


def _optimum_c(eps: float, b: int, grid_cells: set, by_cell: dict) -> dict:
    from hptransfer.transfer.optimum import fit_optimum

    vals, losses = [], []
    for e, bb, c in sorted(grid_cells):
        if e == eps and bb == b:
            for loss in by_cell[(e, bb, c)].values():
                vals.append(c)
                losses.append(loss)
    f = fit_optimum(vals, losses, log_scale=True)
    return {
        "epsilon": eps,
        "batch_size": b,
        "value": f.value,
        "best_grid_value": f.best_grid_value,
        "log_se": f.log_se,
        "ci_low": f.ci_low,
        "ci_high": f.ci_high,
        "censored": f.censored,
        "convex": f.convex,
    }


def analyse(s: dict, ref: float, plans: dict, grid_cells: set, default_rows: dict, by_cell: dict) -> dict:
    """Rows (dp-plan, grid best, default per ε), paired differences and the three verdicts."""
    out: dict = {
        "setting": {
            **s,
            "clip_reference": ref,
            "default": DEFAULT,
            "lr_rule": f"lr = {s['lr_ref']:g}·√(B/{s['lr_ref_batch']})",
            "model": f"mlp (ByteMLP) width {s['width']}, depth {s['depth']}, µP at its base width, seq_len {s['seq_len']}",
            "corpus": f"stdlib bytes (max_files {s['max_files']}); N = first {s['dataset_size']} sequences of {s['seq_len'] + 1} bytes",
        },
        "sigma_sqrt_T": {},
        "rows": [],
        "comparisons": [],
        "cells": [],
    }
    for eps in s["epsilons"]:
        plan = plans[eps]
        table = {r.batch_size: r for r in plan.table}
        out["sigma_sqrt_T"][f"{eps:g}"] = [
            {"B": r.batch_size, "T": r.steps, "sigma": r.sigma, "sigma_sqrt_T": r.sigma_sqrt_t, "feasible": r.feasible}
            for r in plan.table
        ]
        mine = sorted(c for c in grid_cells if c[0] == eps)
        best = min(mine, key=lambda c: _mean(by_cell[c]))
        plan_cell = (eps, plan.batch_size, _c(plan.clip))
        assert plan_cell in grid_cells, "the plan's C must be on its own grid (clip_factors needs 1.0)"
        d = default_rows[eps]
        default_cell = (eps, DEFAULT["batch_size"], DEFAULT["clip"])

        def row(choice: str, cell: tuple, nr, note: str = "") -> dict:
            seeds = by_cell.get(cell, {}) if nr.feasible else {}
            ci = (
                t_interval([seeds[k] for k in sorted(seeds)]).as_dict()
                if seeds
                else {"mean": None, "lo": None, "hi": None, "n": 0}
            )
            return {
                "epsilon": cell[0],
                "choice": choice,
                "batch_size": cell[1],
                "clip": cell[2],
                "clip_over_ref": cell[2] / ref,
                "lr": lr_for(s, cell[1]),
                "steps": nr.steps,
                "sigma": nr.sigma,
                "sigma_sqrt_T": nr.sigma_sqrt_t,
                "feasible": nr.feasible,
                "val_loss": ci["mean"],
                "ci_low": ci["lo"],
                "ci_high": ci["hi"],
                "seed_losses": [seeds[k] for k in sorted(seeds)],
                "note": note,
            }

        out["rows"] += [
            row("dp-plan", plan_cell, table[plan.batch_size], "the grid best" if plan_cell == best else ""),
            row("grid best", best, table[best[1]], f"C = {best[2] / ref:g}× reference"),
            row(
                "default",
                default_cell,
                d,
                ""
                if d.feasible
                else f"infeasible: B = {DEFAULT['batch_size']} gives {d.reason or 'no σ'} at N = {s['dataset_size']}",
            ),
        ]
        out["comparisons"].append(
            {
                "epsilon": eps,
                "plan_minus_grid_best": paired(by_cell[plan_cell], by_cell[best]),
                "plan_minus_default": paired(by_cell[plan_cell], by_cell[default_cell]) if d.feasible else None,
                "default_note": "" if d.feasible else f"B = {DEFAULT['batch_size']} infeasible ({d.reason})",
            }
        )
        for cell in sorted(c for c in by_cell if c[0] == eps):
            ci = t_interval([by_cell[cell][k] for k in sorted(by_cell[cell])]).as_dict()
            out["cells"].append({"epsilon": eps, "B": cell[1], "C": cell[2], "mean": ci["mean"], "lo": ci["lo"], "hi": ci["hi"]})
    out["verdicts"] = verdicts(s, plans, grid_cells, by_cell)
    return out


def verdicts(s: dict, plans: dict, grid_cells: set, by_cell: dict) -> dict:
    tight, loose = min(s["epsilons"]), max(s["epsilons"])
    m = s["flat_margin"]
    out = {}
    # (a) the plateau: B whose σ√T is within the plan's tolerance of the minimum at the tightest ε
    rows = [r for r in plans[tight].table if r.feasible]
    low = min(r.sigma_sqrt_t for r in rows)
    flat_b = [r.batch_size for r in rows if r.sigma_sqrt_t <= (1 + s["tolerance"]) * low]
    per_b = _best_c_per_b(tight, grid_cells, by_cell)
    a = {"epsilon": tight, "batch_sizes": flat_b, "claim_region": [-m, m]}
    if len(flat_b) >= 2:
        a["relative_slope"] = t_interval(relative_slopes({b: per_b[b][1] for b in flat_b})).as_dict()
        a["verdict"] = verdict(a["relative_slope"]["lo"], a["relative_slope"]["hi"], inside=(-m, m))
    else:
        a["verdict"], a["why"] = "inconclusive", f"σ√T is within {s['tolerance']:.0%} of its minimum at {len(flat_b)} B only"
    out["a_plateau_at_tight_epsilon"] = a
    # (b) at the loosest ε, loss falls with B (every feasible B, each at its best C)
    per_b = _best_c_per_b(loose, grid_cells, by_cell)
    b_ = {"epsilon": loose, "batch_sizes": list(per_b), "claim_region": ["-inf", 0]}
    if len(per_b) >= 2:
        b_["relative_slope"] = t_interval(relative_slopes({b: v[1] for b, v in per_b.items()})).as_dict()
        b_["verdict"] = verdict(b_["relative_slope"]["lo"], b_["relative_slope"]["hi"], below=0.0)
    else:
        b_["verdict"], b_["why"] = "inconclusive", "fewer than 2 feasible batch sizes"
    out["b_larger_batch_better_at_loose_epsilon"] = b_
    # (c) the best C, at each ε's best B, is larger at the tightest ε than at the loosest
    optima = {}
    for eps in s["epsilons"]:
        best = min((c for c in grid_cells if c[0] == eps), key=lambda c: _mean(by_cell[c]))
        optima[f"{eps:g}"] = _optimum_c(eps, best[1], grid_cells, by_cell)
    diff = log_optimum_difference(optima[f"{tight:g}"], optima[f"{loose:g}"])
    out["c_larger_clip_at_tight_epsilon"] = {
        "epsilons": [tight, loose],
        "optima": optima,
        "log_ratio": diff,
        "claim_region": [0, "inf"],
        "verdict": verdict(-diff["hi"], -diff["lo"], below=0.0),
    }
    return out


def plot(out: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hptransfer.io import save_figure

    eps_list = out["setting"]["epsilons"]
    fig, axes = plt.subplots(1, len(eps_list), figsize=(5.2 * len(eps_list), 4.2), squeeze=False)
    ref = out["setting"]["clip_reference"]
    for ax, eps in zip(axes[0], eps_list):
        cells = [c for c in out["cells"] if c["epsilon"] == eps]
        for c_val in sorted({c["C"] for c in cells}):
            pts = sorted((c["B"], c["mean"], c["lo"], c["hi"]) for c in cells if c["C"] == c_val)
            bs = [p[0] for p in pts]
            means = [p[1] for p in pts]
            err = [[p[1] - p[2] if p[2] is not None else 0 for p in pts], [p[3] - p[1] if p[3] is not None else 0 for p in pts]]
            ax.errorbar(bs, means, yerr=err, marker="o", ms=3, capsize=2, lw=1, label=f"C={c_val:.3g} ({c_val / ref:.3g}× ref)")
        marks = {"dp-plan": ("*", 16, "black"), "grid best": ("o", 12, "red"), "default": ("s", 10, "tab:green")}
        for r in (r for r in out["rows"] if r["epsilon"] == eps and r["val_loss"] is not None):
            mk, ms, col = marks[r["choice"]]
            ax.plot([r["batch_size"]], [r["val_loss"]], mk, ms=ms, mfc="none", mec=col, mew=1.8, label=r["choice"])
        tw = ax.twinx()
        st = [t for t in out["sigma_sqrt_T"][f"{eps:g}"] if t["sigma_sqrt_T"] is not None]
        tw.plot([t["B"] for t in st], [t["sigma_sqrt_T"] for t in st], "--", color="gray", lw=1)
        tw.set_ylabel("σ√T (dashed)", color="gray")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("expected batch size B")
        ax.set_title(f"ε = {eps:g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("validation loss (mean over seeds, 95% t-interval)")
    fig.suptitle("DP LM fine-tuning: loss against B per clipping bound C; dp-plan, grid best and default marked")
    fig.tight_layout()
    return save_figure(fig, path)


if __name__ == "__main__":
    main()
