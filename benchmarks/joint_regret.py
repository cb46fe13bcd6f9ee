"""Joint regret: does a joint search of LR, output_mult, init_std and warmup on the µP ladder make a better target than the LR grid, and one at least as good as SP tuned at the target? (issue 25, item 5)

Model: the llama family (HF LlamaForCausalLM, depth 2, head size 16, µP with the base width the
narrowest ladder width) on the stdlib byte corpus, seq 64, batch 16, `steps` steps (linear warmup,
cosine to 10%), AdamW with weight decay 0, evaluated on a fixed held-out set (the same for every run).
Ladder widths 32 and 64, target width 128 (the target keeps the ladder's steps and batch).

At equal ladder compute (the same number of trials × steps at each ladder width):
  (a) µP, the LR grid (`sweep.search: grid`, 16 LRs ×√2 × 2 seeds per width, the other tunables at
      their defaults, warmup 10%), transferred by `hpt transfer` (the grid path);
  (b) µP, the joint search (`sweep.search: optuna`: Optuna's TPE through Ray Tune, 32 trials per width,
      over lr, output_mult, init_std and warmup_steps in a box, each on the scale `Hyperparameters`
      declares), transferred by the joint path (transfer/joint.py: the local quadratic or its fallback);
  (c) SP with its LR tuned directly at the target: an LR grid (×2) at width 128 on selection seeds
      (100, 101), extended while the best is on an edge; the best mean LR is then scored on the
      scoring seeds (never the ones it was chosen on);
  (d) the ground truth for (b)'s regret: a direct joint search at the target, Optuna TPE over the
      same box with the same budget as one ladder width (seed 100, two trials at a time), its best
      trial scored on the scoring seeds.
Both ladders are real `hpt` sweeps: `pipeline.sweep_stage` on a local Ray (2 CPUs, one thread per
trial) and `pipeline.transfer_stage` (the plan `hpt transfer` writes), each in its own study folder.
Every target run is `sweep.trial.train_proxy` at width 128 (the sweep's trial function: not the
DeepSpeed large run), one thread per process, on the scoring seeds 0–4; paired by seed:

    b − a, b − c, a − c: loss differences, mean and 95% t-interval over seeds;
    regret of (b) = (L_b(s) − L_d(s)) / mean_s L_d(s), 95% t-interval.
Verdicts from the intervals: "better" when the interval lies below 0, "worse" when above, else
"inconclusive"; (b)'s regret below 1% by `common.verdict`.

Cached: each ladder is a study folder under the cache directory (a killed sweep resumes in Tune; a
finished one keeps its plan), every target run a line in a JSON-lines run cache (`common.RunCache`);
the direct search replays its sampler from the cache (same seed, same batches → the same points).
`--cached-only` writes the result from what is cached (`complete: false` when parts are missing).
`--quick`: a smoke run (tiny widths and steps, < 3 min idle) into /tmp, never into the results.

Run: .venv/bin/python benchmarks/joint_regret.py   → benchmarks/results/joint_regret.{json,png}
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import subprocess
import time
from pathlib import Path

from common import RESULTS, ROOT, RunCache, key_str, machine_info, t_interval, verdict

CACHE_DIR = Path(os.environ.get("HPT_BENCH_JOINT_CACHE", "/tmp/hpt_bench_joint"))

FULL = {
    "ladder": [32, 64],
    "target": 128,
    "depth": 2,
    "head_dim": 16,
    "seq": 64,
    "steps": 160,
    "batch": 16,
    "eval_batches": 8,
    "wd": 0.0,
    "warmup": 16,  # (a), (c) and the defaults: 10% of the run
    "grid_lrs": [round(0.002 * 2 ** (k / 2), 6) for k in range(16)],  # 0.002 … 0.36, ×√2
    "grid_seeds": [0, 1],
    "noise_seeds": 3,
    "trials_per_width": 32,  # = 16 LRs × 2 seeds: equal ladder compute
    "startup_trials": 8,
    "max_concurrent": 2,
    "box": {"lr": [0.002, 0.36], "output_mult": [0.125, 8.0], "init_std": [0.005, 0.08], "warmup_steps": [0.0, 64.0]},
    "sp_grid": [0.0005 * 2**k for k in range(7)],  # 0.0005 … 0.032
    "sp_limits": [0.0005 / 2**3, 0.032 * 2**3],
    "select_seeds": [100, 101],
    "score_seeds": [0, 1, 2, 3, 4],
    "direct_trials": 32,
    "direct_seed": 100,
}
QUICK = {
    **FULL,
    "ladder": [16, 32],
    "target": 64,
    "steps": 30,
    "batch": 8,
    "eval_batches": 2,
    "warmup": 3,
    "grid_lrs": [0.01, 0.04],
    "grid_seeds": [0, 1],
    "noise_seeds": 1,
    "trials_per_width": 4,
    "startup_trials": 2,
    "box": {"lr": [0.002, 0.36], "output_mult": [0.125, 8.0], "init_std": [0.005, 0.08], "warmup_steps": [0.0, 12.0]},
    "sp_grid": [0.002, 0.008],
    "sp_limits": [0.002, 0.008],
    "select_seeds": [100],
    "score_seeds": [0, 1],
    "direct_trials": 2,
}
REGRET_CEILING = 0.01


def _cfg() -> dict:
    return QUICK if os.environ.get("HPT_JOINT_QUICK") == "1" else FULL  # read by the spawned workers too


def _sig(x: float) -> float:
    return float(f"{float(x):.6g}")


# --- specs: the product's own inputs -----------------------------------------------------------------


def model_dict(c: dict, parametrization: str = "mup") -> dict:
    return {
        "family": "llama",
        "depth": c["depth"],
        "head_dim": c["head_dim"],
        "seq_len": c["seq"],
        "parametrization": parametrization,
        "base_width": c["ladder"][0],
        "hp_defaults": "package",  # this benchmark's (a) is µP at the package defaults (issue 25)
    }


def spec_dict(c: dict, plan: str) -> dict:
    """The study spec of ladder (a) `grid` or (b) `joint`, or of the target runs (`sp`: SP model)."""
    if plan == "joint":
        sweep = {
            "search": "optuna",
            "grid": c["box"],
            "optuna": {
                "trials_per_width": c["trials_per_width"],
                "max_concurrent": c["max_concurrent"],
                "startup_trials": c["startup_trials"],
                "sampler_seed": 0,
            },
            "fixed": {"weight_decay": c["wd"]},
            "seeds": [0],
        }
        from hptransfer.spec import OptunaSpec

        if "budget_decay" in OptunaSpec.model_fields:  # the ladder as fidelity (item 2), when built: equal budgets here
            sweep["optuna"]["budget_decay"] = 1.0
    else:
        sweep = {"grid": {"lr": c["grid_lrs"]}, "fixed": {"weight_decay": c["wd"], "warmup_steps": c["warmup"]}}
        sweep["seeds"] = list(c["grid_seeds"])
    return {
        "name": f"joint-bench-{plan}",
        "seed": 0,
        "model": model_dict(c, "sp" if plan == "sp" else "mup"),
        "data": {"corpus": "stdlib", "max_files": 400, "eval_batches": c["eval_batches"]},
        "sweep": {
            "widths": c["ladder"],
            **sweep,
            "steps": c["steps"],
            "batch_size": c["batch"],
            "noise_seeds": c["noise_seeds"],
            "cpus_per_trial": 1,
            "reports": 1,
        },
        "transfer": {"rule": "power-law" if plan == "sp" else "mup"},
        "target": {"width": c["target"], "steps": c["steps"], "batch_size": c["batch"]},
        "ray": {"num_cpus": 2, "object_store_mb": 256},
    }


# --- the ladders: real sweeps through the pipeline -------------------------------------------------


def ladder(c: dict, plan: str, cache_dir: Path, cached_only: bool, spec: dict | None = None) -> dict | None:
    """Sweep + transfer of ladder `plan` (its spec: `spec`, else spec_dict's) in its study folder
    (named by the spec's hash: a changed setting never reuses another's sweep); the plan file is the
    cache. None when cached_only and the plan is not there."""
    from hptransfer.pipeline import Study, sweep_stage, transfer_stage
    from hptransfer.plan import load_plan
    from hptransfer.transfer.engine import read_results

    d = spec or spec_dict(c, plan)
    h = hashlib.sha256(key_str(d).encode()).hexdigest()[:10]
    study = Study.from_spec(d, cache_dir / "studies" / f"{plan}-{h}")
    t0 = time.perf_counter()
    if study.paths.plan.is_file():
        p = load_plan(study.paths.plan)
    elif cached_only:
        return None
    else:
        print(f"ladder ({plan}): sweeping in {study.root}", flush=True)
        sweep_stage(study)
        p = transfer_stage(study)
    table = read_results(study.paths.sweep_results)
    hps = {k: _sig(v) for k, v in p.hyperparameters.items()}
    ok = table[table["status"] == "ok"] if "status" in table else table
    best = ok.loc[ok["val_loss"].idxmin()] if len(ok) else None
    return {
        "study_dir": str(study.root),
        "sweep": _jsonable(study.spec.sweep.model_dump(mode="json", include={"search", "optuna", "grid", "seeds", "fixed"})),
        "hyperparameters": hps,
        "tuned": sorted(set(d["sweep"]["grid"])),
        "source_width": p.diagnostics.source_width,
        "optimum_by_width": {
            w: {
                hp: {k: _jsonable(getattr(o, k)) for k in ("value", "ci", "censored", "method", "fallback") if hasattr(o, k)}
                for hp, o in fits.items()
            }
            for w, fits in p.diagnostics.optimum_by_width.items()
        },
        "per_hyperparameter": _jsonable(p.diagnostics.per_hyperparameter),
        "joint_by_width": _jsonable(getattr(p.diagnostics, "joint_by_width", None)),
        "warnings": list(p.diagnostics.warnings or [])[:10],
        "trials": {str(int(w)): int((table["width"] == w).sum()) for w in sorted(table["width"].unique())},
        "trial_steps": int(len(table) * c["steps"]),
        "statuses": {str(k): int(v) for k, v in table["status"].value_counts().items()} if "status" in table else {},
        "best_trial": None if best is None else {k: _jsonable(best[k]) for k in [*d["sweep"]["grid"], "width", "val_loss"]},
        "seconds_this_invocation": round(time.perf_counter() - t0, 1),
    }


def _jsonable(x):
    if hasattr(x, "model_dump"):
        return _jsonable(x.model_dump(mode="json"))
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    return x


# --- target runs -------------------------------------------------------------------------------------


HP_KEYS = ("lr", "output_mult", "init_std", "warmup_steps", "weight_decay", "beta1", "beta2", "grad_clip")


def run_key(c: dict, par: str, hps: dict, seed: int) -> dict:
    """Everything that changes a target run's result: the cache key."""
    from hptransfer.hyperparameters import DEFAULT_HPS

    full = {**DEFAULT_HPS, "weight_decay": c["wd"], "warmup_steps": c["warmup"], **hps}
    return {
        "par": par,
        "width": c["target"],
        **{k: _sig(full[k]) for k in HP_KEYS},
        "seed": seed,
        "steps": c["steps"],
        "batch": c["batch"],
        "seq": c["seq"],
        "depth": c["depth"],
        "head_dim": c["head_dim"],
        "base_width": c["ladder"][0],
        "eval_batches": c["eval_batches"],
    }


def _train(key: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    from hptransfer.hyperparameters import Hyperparameters
    from hptransfer.spec import parse_spec
    from hptransfer.sweep.trial import train_proxy

    # The spec from the key alone (model, horizon, data), so other benchmarks' settings train here too.
    ladder = [key["base_width"]] + ([key["width"]] if key["width"] > key["base_width"] else [])
    c = {**_cfg(), **{k: key[k] for k in ("steps", "batch", "seq", "depth", "head_dim", "eval_batches")}}
    c.update(ladder=ladder, target=key["width"])
    spec = parse_spec(spec_dict(c, "sp" if key["par"] == "sp" else "grid"))
    hps = Hyperparameters(**{k: key[k] for k in HP_KEYS})
    m = train_proxy(spec, key["width"], hps, key["seed"], n_reports=1)
    return {**key, "val_loss": m["val_loss"], "status": m["status"], "wall_s": m.get("wall_s")}


def _describe(r: dict) -> str:
    hp = " ".join(f"{k}={r[k]:g}" for k in ("lr", "output_mult", "init_std", "warmup_steps"))
    return f"{r['par']} w={r['width']} {hp} seed={r['seed']} → {r['val_loss']:.4f} ({r['status']}, {r['wall_s']:.0f}s)"


def _ok(r: dict | None) -> bool:
    return r is not None and r["status"] == "ok" and math.isfinite(r["val_loss"])


class Runs:
    """The target runs' cache; with cached_only a run it lacks is recorded missing, not trained."""

    def __init__(self, path: Path, procs: int, cached_only: bool):
        self.cache, self.procs, self.cached_only = RunCache(path), procs, cached_only
        self.missing: set[str] = set()
        self.pool = None  # one pool for every round (the direct search trains two runs at a time)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool = None

    def get(self, keys: list[dict]) -> dict[str, dict]:
        if not keys:
            return {}
        if self.cached_only:
            done = self.cache.load(keys[0])
            found = {key_str(k): done[key_str(k)] for k in keys if key_str(k) in done}
            self.missing |= {key_str(k) for k in keys} - set(found)
            return found
        if self.pool is None:
            import multiprocessing as mp

            self.pool = mp.get_context("spawn").Pool(self.procs)
        order = {key_str(k): i for i, k in reversed(list(enumerate(keys)))}
        return self.cache.run(
            keys, _train, procs=self.procs, first=lambda k: order[key_str(k)], describe=_describe, pool=self.pool
        )


def sp_select(c: dict, runs: Runs) -> dict:
    """(c): SP's LR grid at the target on the selection seeds, extended ×2 while the best mean sits
    on an edge (within sp_limits); the best mean LR."""
    lrs = [_sig(x) for x in c["sp_grid"]]
    while True:
        keys = [run_key(c, "sp", {"lr": lr}, s) for lr in lrs for s in c["select_seeds"]]
        res = runs.get(keys)
        if len(res) < len(keys):  # cached_only and missing: no choice from part of the grid
            return {"curve": {}, "best_lr": None, "complete": False}
        mean = {}
        for lr in lrs:
            rs = [res.get(key_str(run_key(c, "sp", {"lr": lr}, s))) for s in c["select_seeds"]]
            mean[lr] = sum(r["val_loss"] for r in rs) / len(rs) if all(_ok(r) for r in rs) else math.inf
        if all(math.isinf(v) for v in mean.values()):
            return {"curve": {str(k): None for k in lrs}, "best_lr": None}
        b = min(mean, key=mean.get)
        if b == lrs[0] and b / 2 >= c["sp_limits"][0] * 0.999:
            lrs.insert(0, _sig(b / 2))
        elif b == lrs[-1] and b * 2 <= c["sp_limits"][1] * 1.001:
            lrs.append(_sig(b * 2))
        else:
            return {"curve": {str(k): (v if math.isfinite(v) else None) for k, v in mean.items()}, "best_lr": b}


def direct_search(c: dict, runs: Runs) -> dict:
    """(d): Optuna TPE at the target over the ladder's box (the product's `optuna_space`, the same
    sampler settings as a ladder width), `max_concurrent` trials per batch on `direct_seed`. Replayed
    from the cache on a rerun (the sampler is seeded and told in the same order). A diverged trial
    is told the worst loss so far, as the product's searcher does."""
    import optuna

    from hptransfer.hyperparameters import LOG_SCALE
    from hptransfer.sweep.search import optuna_space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = optuna_space(c["box"], LOG_SCALE)
    study = optuna.create_study(
        direction="minimize", sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=c["startup_trials"])
    )
    trials, worst = [], -math.inf
    while len(trials) < c["direct_trials"]:
        batch = [study.ask(space) for _ in range(min(c["max_concurrent"], c["direct_trials"] - len(trials)))]
        keys = [run_key(c, "mup", {k: _sig(v) for k, v in t.params.items()}, c["direct_seed"]) for t in batch]
        res = runs.get(keys)
        if len(res) < len(keys):  # cached_only and missing: the sampler cannot go on
            return {"trials": trials, "complete": False}
        for t, k in zip(batch, keys):
            r = res[key_str(k)]
            if _ok(r):
                worst = max(worst, r["val_loss"])
                study.tell(t, r["val_loss"])
            elif r["status"] == "diverged" and math.isfinite(worst):
                study.tell(t, worst)
            else:
                study.tell(t, state=optuna.trial.TrialState.FAIL)
            trials.append({**{h: k[h] for h in c["box"]}, "val_loss": r["val_loss"], "status": r["status"]})
    ok = [t for t in trials if t["status"] == "ok" and math.isfinite(t["val_loss"])]
    best = min(ok, key=lambda t: t["val_loss"]) if ok else None
    return {"trials": trials, "complete": True, "best": best}


# --- analysis ------------------------------------------------------------------------------------------


def direction(lo: float | None, hi: float | None) -> str:
    """A paired difference (first − second, lower loss is better): "better" when the whole interval
    is below 0, "worse" when above, "inconclusive" otherwise (or without an interval)."""
    v = verdict(lo, hi, below=0.0)
    if v == "reproduced":
        return "better"
    return "worse" if v == "not reproduced" and lo is not None and lo > 0 else "inconclusive"


def paired(x: dict[int, float], y: dict[int, float], relative: bool = False) -> dict | None:
    """x − y over their common seeds (relative: divided by mean y), mean and 95% t-interval."""
    seeds = sorted(s for s in x if s in y and math.isfinite(x[s]) and math.isfinite(y[s]))
    if len(seeds) < 2:
        return None
    my = sum(y[s] for s in seeds) / len(seeds)
    d = [(x[s] - y[s]) / (my if relative else 1.0) for s in seeds]
    ci = t_interval(d)
    return {"mean": ci.mean, "ci": [ci.lo, ci.hi], "n": ci.n, "seeds": seeds, "per_seed": d, "verdict": direction(ci.lo, ci.hi)}


def _git_head() -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny widths and steps, into /tmp (never the results)")
    ap.add_argument("--out", type=Path, default=None, help="result JSON (default: benchmarks/results/joint_regret.json)")
    ap.add_argument("--cache", type=Path, default=None, help=f"cache directory (default: {CACHE_DIR}; env HPT_BENCH_JOINT_CACHE)")
    ap.add_argument("--cached-only", action="store_true", help="write the result from the cache; train nothing")
    ap.add_argument("--no-direct", action="store_true", help="leave out (d), the direct joint search at the target")
    args = ap.parse_args(argv)
    if args.quick:
        os.environ["HPT_JOINT_QUICK"] = "1"
    c = _cfg()
    cache_dir = args.cache or (CACHE_DIR.with_name(CACHE_DIR.name + "_quick") if args.quick else CACHE_DIR)
    out_path = args.out or (Path("/tmp/joint_regret_quick.json") if args.quick else RESULTS / "joint_regret.json")
    import hptransfer
    from hptransfer.io import save_figure, write_json

    t0 = time.perf_counter()
    runs = Runs(cache_dir / "target_runs.jsonl", args.procs, args.cached_only)
    command = (
        ".venv/bin/python benchmarks/joint_regret.py"
        + (" --quick" if args.quick else "")
        + (" --no-direct" if args.no_direct else "")
    )
    out: dict = {
        "setting": dict(c),
        "machine": machine_info(
            processes=args.procs,
            torch_threads_per_process=1,
            note="shared 2-core VM, run under nice -n 10 beside other jobs: wall times are upper bounds (losses unaffected)",
        ),
        "command": command,
        "product": {
            "hptransfer": str(Path(hptransfer.__file__).parent),
            "git_head": _git_head(),
            "commit": os.environ.get("HPT_PRODUCT_COMMIT"),
        },
        "quick": args.quick,
    }

    # (a), (b): the ladders (real sweeps), their plans.
    lad = {p: ladder(c, p, cache_dir, args.cached_only) for p in ("grid", "joint")}
    out["ladders"] = lad
    plans = {"a": lad["grid"], "b": lad["joint"]}
    seeds = c["score_seeds"]
    score_keys = {n: [run_key(c, "mup", lp["hyperparameters"], s) for s in seeds] for n, lp in plans.items() if lp}
    runs.get([k for ks in score_keys.values() for k in ks])  # (a), (b) at the target first
    sp = sp_select(c, runs)
    out["sp_selection"] = sp
    if sp["best_lr"] is not None:
        score_keys["c"] = [run_key(c, "sp", {"lr": sp["best_lr"]}, s) for s in seeds]
    direct = None
    if not args.no_direct:
        runs.get(score_keys.get("c", []))
        direct = direct_search(c, runs)
        if direct.get("best"):
            score_keys["d"] = [run_key(c, "mup", {h: direct["best"][h] for h in c["box"]}, s) for s in seeds]
    out["direct_search"] = direct if direct else {"left_out": "--no-direct"}
    res = runs.get([k for ks in score_keys.values() for k in ks])
    runs.close()

    loss = {n: {k["seed"]: res[key_str(k)]["val_loss"] for k in ks if key_str(k) in res} for n, ks in score_keys.items()}
    names = {
        "a": "µP, LR grid (ladder) → target",
        "b": "µP, joint search (ladder) → target",
        "c": "SP, LR tuned at the target",
        "d": "µP, joint search at the target",
    }
    out["targets"] = {
        n: {
            "name": names[n],
            "hyperparameters": {h: score_keys[n][0][h] for h in HP_KEYS},
            "seeds": sorted(loss[n]),
            "losses": [loss[n][s] for s in sorted(loss[n])],
            "statuses": [res[key_str(k)]["status"] for k in score_keys[n] if key_str(k) in res],
            "mean": t_interval([v for v in loss[n].values() if math.isfinite(v)]).as_dict() if loss[n] else None,
        }
        for n in score_keys
    }
    cmp = {}
    for x, y in (("b", "a"), ("b", "c"), ("a", "c")):
        if x in loss and y in loss:
            cmp[f"{x}-{y}"] = paired(loss[x], loss[y])
    if "b" in loss and "d" in loss:
        cmp["regret_b_vs_d"] = paired(loss["b"], loss["d"], relative=True)
        cmp["a-d"] = paired(loss["a"], loss["d"]) if "a" in loss else None
    out["paired"] = cmp
    out["verdicts"] = verdicts(cmp)
    out["compute"] = compute(c, lad, direct)
    missing = sorted(runs.missing)
    parts = {"ladder a": bool(lad["grid"]), "ladder b": bool(lad["joint"]), "sp selection": sp["best_lr"] is not None}
    parts["targets"] = all(len(loss.get(n, {})) == len(seeds) for n in ("a", "b", "c"))
    if not args.no_direct:
        parts["direct search"] = bool(direct and direct.get("complete")) and len(loss.get("d", {})) == len(seeds)
    out["parts_done"] = parts
    out["complete"] = all(parts.values()) and not missing
    out["missing_runs"] = missing
    out["process_wall_s"] = round(time.perf_counter() - t0, 1)
    out["runs_trained_this_invocation"] = runs.cache.trained
    out["total_train_wall_s"] = round(sum(r.get("wall_s") or 0 for r in runs.cache.load(run_key(c, "mup", {}, 0)).values()), 1)
    png = out_path.with_suffix(".png")
    save_figure(_figure(out), png)
    out["figure"] = str(png.relative_to(ROOT)) if png.is_relative_to(ROOT) else str(png)
    write_json(out_path, _finite(out))
    _print(out)
    print(f"wrote {out_path} and {png}")
    return out


def verdicts(cmp: dict) -> dict:
    """The claims, read from the paired intervals (never typed by hand)."""
    v = {}
    g = lambda k: (cmp.get(k) or {}).get("verdict", "inconclusive")
    v["(b) joint search better than (a) LR grid"] = g("b-a")
    v["(b) joint search vs (c) SP tuned at the target"] = g("b-c")
    v["(a) LR grid vs (c) SP tuned at the target"] = g("a-c")
    r = cmp.get("regret_b_vs_d")
    v["(b) regret against a direct joint search below 1%"] = (
        verdict(r["ci"][0], r["ci"][1], below=REGRET_CEILING) if r else "inconclusive (not measured)"
    )
    return v


def compute(c: dict, lad: dict, direct: dict | None) -> dict:
    """Trials × steps per ladder (equal by design) and per width; the direct search's."""
    out = {n: {"trials": lp["trials"], "trial_steps": lp["trial_steps"]} for n, lp in lad.items() if lp}
    if direct:
        out["direct"] = {
            "trials": len(direct.get("trials", [])),
            "trial_steps": len(direct.get("trials", [])) * c["steps"],
            "width": c["target"],
        }
    return out


def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def _print(out: dict) -> None:
    for n, t in out["targets"].items():
        m = t["mean"]
        hp = ", ".join(f"{k} {t['hyperparameters'][k]:.4g}" for k in ("lr", "output_mult", "init_std", "warmup_steps"))
        ci = f" [{m['lo']:.4f}, {m['hi']:.4f}]" if m and m["lo"] is not None else ""
        seeds = t["seeds"] if len(t["seeds"]) <= 5 else f"{t['seeds'][0]}–{t['seeds'][-1]} ({len(t['seeds'])})"
        print(f"({n}) {t['name']}: {hp}: loss {m['mean']:.4f}{ci} over seeds {seeds}" if m else f"({n}): —")
    for k, p in out["paired"].items():
        if p:
            print(f"{k}: {p['mean']:+.4f} [{p['ci'][0]:+.4f}, {p['ci'][1]:+.4f}] (n={p['n']}) {p['verdict']}")
    for k, v in out["verdicts"].items():
        print(f"{k}: {v}")
    print(f"complete: {out['complete']} ({out['parts_done']})")


def _figure(out: dict):
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    ts = out["targets"]
    for i, t in enumerate(ts.values()):
        ax.plot([i] * len(t["losses"]), t["losses"], "o", alpha=0.5, ms=4)
        m = t["mean"]
        if m:
            lo, hi = m["lo"], m["hi"]
            yerr = [[m["mean"] - lo], [hi - m["mean"]]] if lo is not None else None
            ax.errorbar(i + 0.15, m["mean"], yerr=yerr, fmt="ks", capsize=4)
    ax.set_xticks(range(len(ts)), [f"({n})\n{t['name'].split(',')[0]}" for n, t in ts.items()], fontsize=8)
    ax.set_ylabel(f"target validation loss (width {out['setting']['target']}, {out['setting']['steps']} steps)")
    ax.set_title("target loss per plan (dots: seeds; squares: mean, 95% t)")
    ax.grid(alpha=0.3)
    ps = [(k, p) for k, p in out["paired"].items() if p and not k.startswith("regret")]
    for i, (_, p) in enumerate(ps):
        bx.errorbar(p["mean"], i, xerr=[[p["mean"] - p["ci"][0]], [p["ci"][1] - p["mean"]]], fmt="o", capsize=4)
    bx.axvline(0, color="k", lw=0.8)
    bx.set_yticks(range(len(ps)), [f"{k} ({p['verdict']})" for k, p in ps])
    bx.set_xlabel("paired loss difference (first − second), 95% t")
    bx.grid(alpha=0.3)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    main()
