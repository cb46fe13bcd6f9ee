"""Depth regret: does the LR found at depth 2 stay optimal 4× deeper and 8× wider under CompleteP, depth-µP and none?

Model: the llama family (pre-norm residual transformer, µP in width, head_dim 8, base width 8, base
depth 2) on the stdlib byte corpus; batch 16 × seq 64, `steps` steps (warmup 10%, cosine), AdamW
λ = 0.1, a fixed held-out set of `eval_batches` × 16 × 64 tokens (the same for every run).
`model.depth_parametrization` (hptransfer.models.depth) is `none`, `depth-mup` (α = ½) or
`completep` (α = 1), each relative to `base_depth` 2; at depth 2 all three are the same model, so
the ladder (widths 8 and 16 at depth 2) is shared.

1. Target noise: the target (width 64, depth 8) at the transferred LR, seeds 0, 1, 2 (completep);
   the seed SD says which differences the rest can resolve.
2. LR-vs-depth curves at width 16, depths 2, 4, 8: the LR grid × `seeds`, extended outward while
   the best point sits on the edge; optimum per depth by `transfer.optimum.fit_optimum` (parabola
   in log LR, bootstrap interval from the seed spread). Slope of log LR* against log depth by
   weighted least squares (`transfer.fitting.fit_log_linear`) with a 95% interval (normal, the
   Birge-scaled SE; t with n − 2 dof needs more depths than we can afford).
3. Transfer: the ladder's optimum (fit at width 16, depth 2) used as is at the target under each
   parametrization (µP carries width; the depth rule, or none, carries depth) against a direct sweep
   at the target (grid × `direct_seeds`, extended at an edge; then seeds 0, 1, 2 at its best LR);
   paired by seed:
       regret_s = (L_transfer(s) − L_best(s)) / mean_s L_best(s), mean and 95% t-interval.
4. Verdicts from the intervals: "CompleteP keeps the optimum across depth" (its slope interval
   holds 0 and excludes none's slope), "none drifts" (none's slope interval excludes 0), and per
   parametrization whether the regret interval lies below 1%.

Every run is `sweep.trial.train_proxy` (one thread per process, `--procs` processes), cached by its
settings in a JSON-lines file (`common.RunCache`): a killed run resumes. `--cached-only` analyses
the cache and reports runs it lacks as missing instead of training them.

Run: .venv/bin/python benchmarks/depth_regret.py   → benchmarks/results/depth_regret.{json,png}
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

from common import RESULTS, ROOT, RunCache, key_str, machine_info, t_interval, verdict

CACHE = Path(os.environ.get("HPT_BENCH_DEPTH_CACHE", "/tmp/hpt_bench_depth.jsonl"))
_CFG = json.loads(os.environ.get("HPT_DEPTH") or "{}")  # e.g. HPT_DEPTH='{"steps": 60}' (read by the workers too)
HEAD_DIM, BASE_WIDTH, BASE_DEPTH = 8, 8, 2
LADDER = _CFG.get("ladder", [8, 16])  # widths at the base depth
CURVE_WIDTH = _CFG.get("curve_width", 16)
DEPTHS = _CFG.get("depths", [2, 4, 8])
TARGET_WIDTH, TARGET_DEPTH = _CFG.get("target_width", 64), _CFG.get("target_depth", 8)
STEPS, BATCH, SEQ, WD = _CFG.get("steps", 100), 16, 64, 0.1
WARMUP = max(1, STEPS // 10)
EVAL_BATCHES = _CFG.get("eval_batches", 8)
GRID = _CFG.get("grid", [0.005 * 2**k for k in range(5)])  # 0.005 … 0.08, base-width LRs; extended at an edge
GRID_LIMITS = (0.005 / 2**3, 0.08 * 2**3)  # how far an edge extension may go
SEEDS = tuple(_CFG.get("seeds", [0, 1]))  # curves and the direct sweep
DIRECT_SEEDS = tuple(_CFG.get("direct_seeds", [0]))  # the direct sweep's grid at the target (then NOISE_SEEDS at its best)
NOISE_SEEDS = (0, 1, 2)  # the target's noise, and the transferred and best direct runs (paired regret)
PARS = ("none", "depth-mup", "completep")
REGRET_CEILING = 0.01


def spec_dict(par: str) -> dict:
    return {
        "name": f"depth-{par}",
        "seed": 0,
        "model": {
            "family": "llama",
            "depth": BASE_DEPTH,
            "seq_len": SEQ,
            "parametrization": "mup",
            "base_width": BASE_WIDTH,
            "head_dim": HEAD_DIM,
            "depth_parametrization": par,
        },
        "data": {"max_files": 400, "eval_batches": EVAL_BATCHES},
        "sweep": {
            "widths": [BASE_WIDTH, 2 * BASE_WIDTH],  # only the base width matters here
            "grid": {"lr": GRID},
            "fixed": {"weight_decay": WD, "warmup_steps": WARMUP},
            "steps": STEPS,
            "batch_size": BATCH,
            "seeds": list(SEEDS),
            "reports": 1,
        },
        "transfer": {"rule": "mup"},
        "target": {"width": TARGET_WIDTH},
    }


def run_key(par: str, width: int, depth: int, lr: float, seed: int) -> dict:
    """Everything that changes a run's result (the cache key); at the base depth every
    parametrization is the same model, so it is recorded as `none` there."""
    return {
        "family": "llama",
        "par": "none" if depth == BASE_DEPTH else par,
        "width": width,
        "depth": depth,
        "lr": float(f"{lr:.6g}"),
        "seed": seed,
        "wd": WD,
        "steps": STEPS,
        "warmup": WARMUP,
        "batch": BATCH,
        "seq": SEQ,
        "eval_batches": EVAL_BATCHES,
        "head_dim": HEAD_DIM,
        "base_width": BASE_WIDTH,
        "base_depth": BASE_DEPTH,
    }


def _train(key: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    from hptransfer.hyperparameters import Hyperparameters
    from hptransfer.spec import parse_spec
    from hptransfer.sweep.trial import train_proxy

    spec = parse_spec(spec_dict(key["par"]))
    hps = Hyperparameters(lr=key["lr"], weight_decay=key["wd"], warmup_steps=key["warmup"])
    m = train_proxy(spec, key["width"], hps, key["seed"], n_reports=1, depth=key["depth"])
    return {**key, "val_loss": m["val_loss"], "status": m["status"], "train_loss": m["train_loss"], "wall_s": m.get("wall_s")}


def _describe(r: dict) -> str:
    return (
        f"{r['par']} w={r['width']} L={r['depth']} lr={r['lr']:g} seed={r['seed']} → {r['val_loss']:.4f} "
        f"({r['status']}, {r['wall_s']:.0f}s)"
    )


class Runs:
    """The run cache, trained into unless `cached_only` (then a missing run is left out)."""

    def __init__(self, path: Path, procs: int, cached_only: bool):
        self.cache, self.procs, self.cached_only = RunCache(path), procs, cached_only
        self.res: dict[str, dict] = {}
        self.missing: set[str] = set()

    def get(self, keys: list[dict]) -> dict[str, dict]:
        if not keys:
            return {}
        if self.cached_only:
            done = self.cache.load(keys[0])
            found = {key_str(k): done[key_str(k)] for k in keys if key_str(k) in done}
            self.missing |= {key_str(k) for k in keys} - set(found)
        else:
            order = {key_str(k): i for i, k in reversed(list(enumerate(keys)))}  # the caller's order: priority
            found = self.cache.run(keys, _train, procs=self.procs, first=lambda k: order[key_str(k)], describe=_describe)
        self.res.update(found)
        return found


def _ok(r: dict | None) -> bool:
    return r is not None and r["status"] == "ok" and math.isfinite(r["val_loss"])


def sweeps(runs: Runs, cells: list[tuple[str, int, int]], extra: list[dict] = ()) -> dict[tuple, list[dict]]:
    """The grid × SEEDS at each (par, width, depth) cell, extended one ×2 step outward while a
    cell's seed-mean optimum sits on its swept range's edge (within GRID_LIMITS), so it is
    bracketed by worse points. All cells train together (one process pool per round: a pool's
    start costs tens of seconds on a busy machine); `extra` keys join the first round."""
    lrs = {c: list(GRID) for c in cells}
    first = list(extra)

    def seeds(w: int) -> tuple[int, ...]:
        return DIRECT_SEEDS if w == TARGET_WIDTH else SEEDS

    while True:
        keys = first + [run_key(p, w, d, lr, s) for (p, w, d), ls in lrs.items() for lr in ls for s in seeds(w)]
        first = []
        runs.get(keys)
        grown = False
        for (p, w, d), ls in lrs.items():
            mean = {}
            for lr in ls:
                rs = [runs.res.get(key_str(run_key(p, w, d, lr, s))) for s in seeds(w)]
                mean[lr] = sum(r["val_loss"] for r in rs) / len(rs) if all(_ok(r) for r in rs) else math.inf
            if all(math.isinf(v) for v in mean.values()):
                continue
            b = min(mean, key=mean.get)
            if b == ls[0] and b / 2 >= GRID_LIMITS[0] * 0.999:
                ls.insert(0, b / 2)
                grown = True
            elif b == ls[-1] and b * 2 <= GRID_LIMITS[1] * 1.001:
                ls.append(b * 2)
                grown = True
        if not grown:
            return {
                c: [r for lr in ls for s in seeds(c[1]) if (r := runs.res.get(key_str(run_key(*c, lr, s))))]
                for c, ls in lrs.items()
            }


def optimum(rows: list[dict]) -> dict | None:
    """fit_optimum over the rows (seeds pooled; a non-finite loss counts as diverged)."""
    from hptransfer.transfer.optimum import fit_optimum

    rows = [r for r in rows if r["status"] != "failed"]
    if not rows or not any(_ok(r) for r in rows):
        return None
    f = fit_optimum([r["lr"] for r in rows], [r["val_loss"] if _ok(r) else math.inf for r in rows])
    return {
        "lr": f.value,
        "best_grid_lr": f.best_grid_value,
        "log_se": f.log_se,
        "ci": [f.ci_low, f.ci_high],
        "censored": f.censored,
        "best_loss": f.best_loss,
        "noise": f.noise,
        "curve": _curve(rows),
    }


def _curve(rows: list[dict]) -> list[dict]:
    out = []
    for lr in sorted({r["lr"] for r in rows}):
        rs = [r for r in rows if r["lr"] == lr]
        ok = [r["val_loss"] for r in rs if _ok(r)]
        ci = t_interval(ok) if ok and len(ok) == len(rs) else None
        out.append(
            {
                "lr": lr,
                "mean": ci.mean if ci else None,
                "ci": [ci.lo, ci.hi] if ci and ci.n >= 2 else None,
                "losses": [r["val_loss"] for r in rs],
                "seeds": [r["seed"] for r in rs],
            }
        )
    return out


def slope(optima: dict[int, dict | None]) -> dict | None:
    """log LR* = a + b·log L over the uncensored per-depth optima, weighted by their bootstrap SE;
    95% interval b ± 1.96·SE (normal: with 3 depths a t with 1 dof would say nothing)."""
    from hptransfer.transfer.fitting import fit_log_linear

    pts = [(d, o) for d, o in sorted(optima.items()) if o and not o["censored"]]
    if len(pts) < 2:
        return None
    ds = [d for d, _ in pts]
    ys = [math.log(o["lr"]) for _, o in pts]
    ses = [o["log_se"] for _, o in pts]
    if len(pts) == 2:  # two points: the slope's SE from theirs
        b = (ys[1] - ys[0]) / math.log(ds[1] / ds[0])
        se = math.hypot(*ses) / math.log(ds[1] / ds[0])
    else:
        f = fit_log_linear(ds, ys, ses)
        b, se = f.b, f.b_se
    return {"slope": b, "se": se, "ci": [b - 1.96 * se, b + 1.96 * se], "depths": ds}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "depth_regret.json")
    ap.add_argument(
        "--cache", type=Path, default=CACHE, help=f"JSON-lines run cache (default: {CACHE}; env HPT_BENCH_DEPTH_CACHE)"
    )
    ap.add_argument("--cached-only", action="store_true", help="analyse the cache; runs it lacks are reported missing")
    args = ap.parse_args(argv)
    from hptransfer.io import save_figure, write_json

    t0 = time.perf_counter()
    runs = Runs(args.cache, args.procs, args.cached_only)
    out: dict = {
        "setting": {
            "family": "llama",
            "head_dim": HEAD_DIM,
            "base_width": BASE_WIDTH,
            "base_depth": BASE_DEPTH,
            "ladder_widths": LADDER,
            "curve_width": CURVE_WIDTH,
            "depths": DEPTHS,
            "target_width": TARGET_WIDTH,
            "target_depth": TARGET_DEPTH,
            "steps": STEPS,
            "warmup_steps": WARMUP,
            "batch": BATCH,
            "seq_len": SEQ,
            "eval_tokens": EVAL_BATCHES * BATCH * SEQ,
            "weight_decay": WD,
            "grid": GRID,
            "seeds": list(SEEDS),
            "direct_seeds": list(DIRECT_SEEDS),
            "noise_seeds": list(NOISE_SEEDS),
            "corpus": "stdlib, 400 files, byte-level",
        },
        "machine": machine_info(
            processes=args.procs,
            torch_threads_per_process=1,
            note="shared 2-core VM under heavy load from other jobs: wall times are upper bounds (losses are unaffected)",
        ),
        "command": (f"HPT_DEPTH='{json.dumps(_CFG)}' " if _CFG else "") + ".venv/bin/python benchmarks/depth_regret.py",
    }

    # The ladder at the base depth (shared by every parametrization) → the LR carried to the target.
    lad = sweeps(runs, [("none", w, BASE_DEPTH) for w in LADDER])
    ladder = {w: optimum(lad[("none", w, BASE_DEPTH)]) for w in LADDER}
    src = ladder[max(LADDER)]
    lr_t = float(f"{src['lr']:.6g}") if src else None
    out["ladder"] = {str(w): o for w, o in ladder.items()}
    out["transferred_lr"] = lr_t

    # 1. The target's seed noise at the transferred LR (completep).
    # Everything else trains together (widest, deepest first: the target's noise and transferred runs
    # lead): the transferred runs, then the curves' and the direct sweeps' grids.
    transferred = [run_key(p, TARGET_WIDTH, TARGET_DEPTH, lr_t, s) for p in PARS[::-1] for s in NOISE_SEEDS] if lr_t else []
    cells = [(p, CURVE_WIDTH, d) for d in DEPTHS[::-1] for p in PARS] + [(p, TARGET_WIDTH, TARGET_DEPTH) for p in PARS]
    swept = sweeps(runs, cells, transferred)
    noise = {}
    if lr_t:
        rs = runs.get([run_key("completep", TARGET_WIDTH, TARGET_DEPTH, lr_t, s) for s in NOISE_SEEDS])
        losses = [r["val_loss"] for r in rs.values() if _ok(r)]
        if len(losses) >= 2:
            ci = t_interval(losses)
            import numpy as np

            sd = float(np.std(losses, ddof=1))
            noise = {"losses": losses, "mean": ci.mean, "ci": [ci.lo, ci.hi], "seed_sd": sd, "relative_sd": sd / ci.mean}
    out["target_noise"] = noise

    # 2. LR-vs-depth curves at CURVE_WIDTH.
    curves = {}
    for par in PARS:
        optima = {d: optimum(swept[(par, CURVE_WIDTH, d)]) for d in DEPTHS}
        curves[par] = {"optima": {str(d): o for d, o in optima.items()}, "slope": slope(optima)}
    out["curves"] = curves

    # 3. Transfer to the target against a direct sweep there, paired by seed.
    regret = {}
    d_opts = {p: optimum(swept[(p, TARGET_WIDTH, TARGET_DEPTH)]) for p in PARS}
    best_lrs = {
        p: min((c for c in o["curve"] if c["mean"] is not None), key=lambda c: c["mean"])["lr"] for p, o in d_opts.items() if o
    }
    runs.get([run_key(p, TARGET_WIDTH, TARGET_DEPTH, lr, s) for p, lr in best_lrs.items() for s in NOISE_SEEDS])
    for par in PARS:
        d_opt = d_opts[par]
        entry: dict = {"direct": d_opt, "transferred_lr": lr_t}
        if d_opt and lr_t:
            best_lr = best_lrs[par]
            best = runs.get([run_key(par, TARGET_WIDTH, TARGET_DEPTH, best_lr, s) for s in NOISE_SEEDS])
            tr = runs.get([run_key(par, TARGET_WIDTH, TARGET_DEPTH, lr_t, s) for s in NOISE_SEEDS])
            bb = {r["seed"]: r for r in best.values()}
            pairs = [(r, bb.get(r["seed"])) for r in tr.values()]
            pairs = [(a, b) for a, b in pairs if b is not None]
            entry.update(
                best_direct_lr=best_lr,
                transferred_losses=[a["val_loss"] for a, _ in pairs],
                best_direct_losses=[b["val_loss"] for _, b in pairs],
                seeds=[a["seed"] for a, _ in pairs],
            )
            if pairs and all(_ok(a) and _ok(b) for a, b in pairs):
                mb = sum(b["val_loss"] for _, b in pairs) / len(pairs)
                ci = t_interval([(a["val_loss"] - b["val_loss"]) / mb for a, b in pairs])
                entry.update(regret=ci.mean, regret_ci=[ci.lo, ci.hi] if ci.n >= 2 else None, n=ci.n)
                entry["verdict_regret_below_1pct"] = verdict(*(entry["regret_ci"] or (None, None)), below=REGRET_CEILING)
            elif pairs:  # a transferred run diverged: infinite regret
                entry.update(regret=math.inf if not all(_ok(a) for a, _ in pairs) else None, regret_ci=None)
                entry["verdict_regret_below_1pct"] = "not reproduced" if entry["regret"] == math.inf else "inconclusive"
        regret[par] = entry
    out["regret"] = regret
    out["at_transferred_lr"] = at_transferred_lr(runs, lr_t)
    out["verdicts"] = verdicts(curves)
    out["missing_runs"] = sorted(runs.missing)
    out["process_wall_s"] = round(time.perf_counter() - t0, 1)
    out["runs_trained_this_invocation"] = runs.cache.trained
    out["total_train_wall_s"] = round(sum(r.get("wall_s") or 0 for r in runs.res.values()), 1)
    png = args.out.with_suffix(".png")
    save_figure(_figure(out), png)
    out["figure"] = str(png.relative_to(ROOT)) if png.is_relative_to(ROOT) else str(png)
    write_json(args.out, _finite(out))
    _print(out)
    print(f"wrote {args.out} and {png}")
    return out


def at_transferred_lr(runs: Runs, lr_t: float | None) -> dict:
    """The target at the transferred LR under each parametrization, and each one's loss minus
    `none`'s paired by seed (95% t-interval): what the depth rule buys when the depth-2 LR is
    carried to depth 8 as is. Needs no direct sweep."""
    if not lr_t:
        return {}
    loss = {
        p: {
            s: r["val_loss"]
            for s in NOISE_SEEDS
            if _ok(r := runs.res.get(key_str(run_key(p, TARGET_WIDTH, TARGET_DEPTH, lr_t, s))))
        }
        for p in PARS
    }
    out: dict = {"lr": lr_t, "losses": {p: [loss[p].get(s) for s in NOISE_SEEDS] for p in PARS}, "minus_none": {}}
    for p in PARS[1:]:
        seeds = [s for s in NOISE_SEEDS if s in loss[p] and s in loss["none"]]
        if len(seeds) >= 2:
            ci = t_interval([loss[p][s] - loss["none"][s] for s in seeds])
            out["minus_none"][p] = {
                "mean": ci.mean,
                "ci": [ci.lo, ci.hi],
                "n": ci.n,
                "verdict_lower_than_none": verdict(ci.lo, ci.hi, below=0.0),
            }
    return out


def verdicts(curves: dict) -> dict:
    """Claims read from the slope intervals (never typed by hand)."""
    s = {p: curves[p]["slope"] for p in PARS}
    v = {}
    if s["none"]:
        lo, hi = s["none"]["ci"]
        v["none drifts"] = "reproduced" if hi < 0 or lo > 0 else "inconclusive"
    else:
        v["none drifts"] = "inconclusive"
    for p, claim in (
        ("completep", "CompleteP keeps the optimum across depth"),
        ("depth-mup", "depth-µP keeps the optimum across depth"),
    ):
        if not s[p]:
            v[claim] = "inconclusive"
            continue
        lo, hi = s[p]["ci"]
        holds_zero = lo <= 0 <= hi
        separated = s["none"] is not None and (hi < s["none"]["ci"][0] or lo > s["none"]["ci"][1])
        apart_from_none = s["none"] is not None and not (lo <= s["none"]["slope"] <= hi)
        if holds_zero and separated:
            v[claim] = "reproduced"
        elif not holds_zero:
            v[claim] = "not reproduced"
        else:
            v[claim] = "inconclusive" + ("" if apart_from_none else " (its interval also holds none's slope)")
    return v


def _finite(x):
    """JSON has no inf/nan: null instead."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def _print(out: dict) -> None:
    n = out["target_noise"]
    if n:
        print(f"target noise: {n['losses']} sd {n['seed_sd']:.4f} ({100 * n['relative_sd']:.2f}%)")
    for p, c in out["curves"].items():
        opt = ", ".join(
            f"L={d}: {o['lr']:.4g} [{o['ci'][0]:.3g}, {o['ci'][1]:.3g}]{' (' + o['censored'] + ')' if o['censored'] else ''}"
            for d, o in c["optima"].items()
            if o
        )
        s = c["slope"]
        print(f"{p}: {opt}; slope " + (f"{s['slope']:+.2f} [{s['ci'][0]:+.2f}, {s['ci'][1]:+.2f}]" if s else "—"))
    for p, r in out["regret"].items():
        ci = r.get("regret_ci")
        print(
            f"{p}: transferred {out['transferred_lr']}, direct best {r.get('best_direct_lr')}, regret "
            + ("—" if r.get("regret") is None else f"{100 * r['regret']:+.2f}%")
            + (f" [{100 * ci[0]:+.2f}, {100 * ci[1]:+.2f}]" if ci else "")
        )
    for p, m in out["at_transferred_lr"].get("minus_none", {}).items():
        print(f"{p} − none at the transferred LR (target, paired): {m['mean']:+.4f} [{m['ci'][0]:+.4f}, {m['ci'][1]:+.4f}]")
    for k, v in out["verdicts"].items():
        print(f"{k}: {v}")


def _figure(out: dict):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PARS) + 1, figsize=(5 * (len(PARS) + 1), 4.2))
    for ax, par in zip(axes, PARS):
        for d, o in out["curves"][par]["optima"].items():
            if not o:
                continue
            c = [x for x in o["curve"] if x["mean"] is not None]
            ax.plot([x["lr"] for x in c], [x["mean"] for x in c], "-o", ms=3, label=f"w{CURVE_WIDTH} L={d}: LR* {o['lr']:.3g}")
            ax.axvline(o["lr"], ls=":", lw=0.8, color=ax.lines[-1].get_color())
        r = out["regret"][par]
        if r.get("direct"):
            c = [x for x in r["direct"]["curve"] if x["mean"] is not None]
            ax.plot([x["lr"] for x in c], [x["mean"] for x in c], "k-s", ms=4, label=f"target w{TARGET_WIDTH} L={TARGET_DEPTH}")
        if out["transferred_lr"] and r.get("transferred_losses"):
            ls = [x for x in r["transferred_losses"] if x is not None and math.isfinite(x)]
            if ls:
                ax.plot(out["transferred_lr"], sum(ls) / len(ls), "r*", ms=12, label="transferred (target)")
        ax.set_xscale("log")
        ax.set_title(par)
        ax.set_xlabel("base-width LR")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel(f"validation loss after {STEPS} steps")
    ax = axes[-1]
    for par in PARS:
        pts = [(int(d), o) for d, o in out["curves"][par]["optima"].items() if o]
        if pts:
            ax.errorbar(
                [d for d, _ in pts],
                [o["lr"] for _, o in pts],
                yerr=[
                    [o["lr"] - o["ci"][0] for _, o in pts],
                    [max(0.0, o["ci"][1] - o["lr"]) if math.isfinite(o["ci"][1]) else 0 for _, o in pts],
                ],
                fmt="-o",
                capsize=3,
                label=par,
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("depth L")
    ax.set_ylabel(f"LR* at width {CURVE_WIDTH}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    main()
