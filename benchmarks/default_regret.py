"""Default regret: is the default plan better than what a user gets without hptransfer, on a transformer? (issue 36 item 5)

Model: the llama family (HF LlamaForCausalLM, depth 2, head size 16, µP with the base width the
narrowest ladder width) on the stdlib byte corpus, seq 64, batch 16, 160 steps (linear warmup 16,
cosine to 10%), AdamW without weight decay, scored on a fixed held-out set. Ladder widths 16 and 32,
target width 256: 8× the widest swept width (the issue's floor).

At equal ladder compute (the same LR grid × seeds at each ladder width, the product's own sweep and
plan, formula prior included as `hpt run` makes it):
  (a) today's default before issue 36 item 1: µP, LR grid, the package defaults (output_mult 1,
      init_std 0.02: `model.hp_defaults: package`);
  (b) the new default: µP, LR grid, the family's measured defaults (`model.hp_defaults: family`:
      output_mult 7, init_std 0.04, hptransfer/family_defaults.py);
  (c) SP with its LR tuned at the target (×2 grid on selection seeds 100, 101, extended while the
      best is on an edge; scored on the scoring seeds);
  (d) Step Law's LR (arXiv 2503.04715, η = 1.79·N^−0.713·D^0.307 at the target's N, D) on the SP
      target at the package defaults: the free formula, no sweep;
  (e) the reference: a direct joint search at the target (Optuna TPE over lr, output_mult, init_std,
      warmup, `direct_trials` trials on seed 100), its best re-scored on the scoring seeds.
Every target run is `sweep.trial.train_proxy` at width 256 (the sweep's trial function), one
thread per process, on scoring seeds 0–4, paired by seed (joint_regret.py's machinery and caches):
    regret of (b) = (L_b(s) − L_e(s)) / mean_s L_e(s), 95% t-interval: the goal is its upper end ≤ 1%
      ((b) and (e) on `regret_seeds`, 0–44: seeds 0–4 left it at ±6%; the other pairs on seeds 0–4);
    b − c, b − d: "worse" when the 95% interval lies above 0 — the goal is neither;
    b − a: whether the new default improved on the old.
Note (a) and (b) differ only in the two defaults; (c) and (d) are different algorithms from (b)
(SP without a ladder), (e) a different search: no comparison here pits an arm against itself.

Cached: each ladder is a study folder under the cache directory; every target run a line in a
JSON-lines run cache; the direct search replays its sampler from the cache. `--cached-only`
writes from what is cached; `--quick`: a smoke run (tiny widths, steps) into /tmp.

Run: .venv/bin/python benchmarks/default_regret.py   → benchmarks/results/default_regret.{json,png}
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import time
from pathlib import Path

import joint_regret as jr

from common import RESULTS, ROOT, key_str, machine_info, t_interval, verdict

CACHE_DIR = Path(os.environ.get("HPT_BENCH_DEFAULT_CACHE", "/tmp/hpt_bench_default"))
REGRET_CEILING = 0.01

FULL = {
    **jr.FULL,
    "ladder": [16, 32],
    "target": 256,
    "grid_lrs": [round(0.001 * 2**k, 6) for k in range(9)],  # 0.001 … 0.256, ×2
    "grid_seeds": [0, 1],
    "noise_seeds": 3,
    "direct_trials": 24,
    "startup_trials": 8,
    # (b) and (e) only, for (b)'s regret: its paired sd was 4.9% on seeds 0-4 (interval ±6.1%), so an
    # upper end at 1% needs the half-width ~1.5% around the point (-0.5%) seen there: n ≈ (2.02·4.9/1.5)² ≈ 44.
    # Chosen from that power estimate before these seeds were run; the other pairs stay on score_seeds.
    "regret_seeds": list(range(45)),
}
QUICK = {
    **jr.QUICK,
    "ladder": [16, 32],
    "target": 64,
    "grid_lrs": [0.01, 0.04],
    "direct_trials": 2,
}

NAMES = {
    "a": "µP, LR grid, package defaults (before)",
    "b": "µP, LR grid, family defaults (the default)",
    "c": "SP, LR tuned at the target",
    "d": "SP, Step Law's LR",
    "e": "µP, joint search at the target",
}


def ladder_spec(c: dict, hp_defaults: str) -> dict:
    """The LR-grid study spec of ladder (a) (`package`) or (b) (`family`)."""
    d = jr.spec_dict(c, "grid")
    d["name"] = f"default-bench-{hp_defaults}"
    d["model"] = {**d["model"], "hp_defaults": hp_defaults}
    return d


def step_law_lr(c: dict) -> float:
    """Step Law's η at the target's non-embedding N and tokens D (the product's baselines)."""
    from hptransfer.transfer.baselines import non_embedding_params, step_law

    n = non_embedding_params("llama", c["target"], c["depth"])
    return step_law(n, float(c["steps"]) * c["batch"] * c["seq"])["lr"]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny widths and steps, into /tmp (never the results)")
    ap.add_argument("--out", type=Path, default=None, help="result JSON (default: benchmarks/results/default_regret.json)")
    ap.add_argument(
        "--cache", type=Path, default=None, help=f"cache directory (default: {CACHE_DIR}; env HPT_BENCH_DEFAULT_CACHE)"
    )
    ap.add_argument("--cached-only", action="store_true", help="write the result from the cache; train nothing")
    args = ap.parse_args(argv)
    if args.quick:
        os.environ["HPT_JOINT_QUICK"] = "1"  # the spawned trainers' fallback settings (the key carries the rest)
    c = QUICK if args.quick else FULL
    cache_dir = args.cache or (CACHE_DIR.with_name(CACHE_DIR.name + "_quick") if args.quick else CACHE_DIR)
    out_path = args.out or (Path("/tmp/default_regret_quick.json") if args.quick else RESULTS / "default_regret.json")
    from hptransfer.io import save_figure, write_json

    t0 = time.perf_counter()
    runs = jr.Runs(cache_dir / "target_runs.jsonl", args.procs, args.cached_only)
    out: dict = {
        "setting": dict(c),
        "machine": machine_info(processes=args.procs, torch_threads_per_process=1),
        "command": ".venv/bin/python benchmarks/default_regret.py" + (" --quick" if args.quick else ""),
        "git_head": jr._git_head(),
        "product_commit": os.environ.get("HPT_PRODUCT_COMMIT"),  # when run from a snapshot of a working tree
        "quick": args.quick,
    }
    lad = {}
    for name, hp_defaults in (("a", "package"), ("b", "family")):
        spec = ladder_spec(c, hp_defaults)
        tag = hashlib.sha256(key_str(spec).encode()).hexdigest()[:6]
        lad[name] = jr.ladder(c, f"grid-{hp_defaults}-{tag}", cache_dir, args.cached_only, spec=spec)
    out["ladders"] = lad
    seeds = c["score_seeds"]
    score = {n: [jr.run_key(c, "mup", lp["hyperparameters"], s) for s in seeds] for n, lp in lad.items() if lp}
    runs.get([k for ks in score.values() for k in ks])
    sl = jr._sig(step_law_lr(c))
    out["step_law_lr"] = sl
    score["d"] = [jr.run_key(c, "sp", {"lr": sl}, s) for s in seeds]
    sp = jr.sp_select(c, runs)
    out["sp_selection"] = sp
    if sp["best_lr"] is not None:
        score["c"] = [jr.run_key(c, "sp", {"lr": sp["best_lr"]}, s) for s in seeds]
    runs.get([k for n in ("c", "d") for k in score.get(n, [])])
    direct = jr.direct_search(c, runs)
    out["direct_search"] = direct
    regret_seeds = c.get("regret_seeds", seeds)
    if lad.get("b"):
        score["b"] = [jr.run_key(c, "mup", lad["b"]["hyperparameters"], s) for s in regret_seeds]
    if direct.get("best"):
        score["e"] = [jr.run_key(c, "mup", {h: direct["best"][h] for h in c["box"]}, s) for s in regret_seeds]
    res = runs.get([k for ks in score.values() for k in ks])
    runs.close()

    loss = {n: {k["seed"]: res[key_str(k)]["val_loss"] for k in ks if key_str(k) in res} for n, ks in score.items()}
    out["targets"] = {
        n: {
            "name": NAMES[n],
            "hyperparameters": {h: score[n][0][h] for h in jr.HP_KEYS},
            "parametrization": score[n][0]["par"],
            "seeds": sorted(loss[n]),
            "losses": [loss[n][s] for s in sorted(loss[n])],
            "statuses": [res[key_str(k)]["status"] for k in score[n] if key_str(k) in res],
            "mean": t_interval([v for v in loss[n].values() if math.isfinite(v)]).as_dict() if loss[n] else None,
        }
        for n in sorted(score)
    }
    cmp = {}
    for x, y in (("b", "a"), ("b", "c"), ("b", "d"), ("a", "c"), ("a", "d"), ("c", "d")):
        if x in loss and y in loss:
            cmp[f"{x}-{y}"] = jr.paired(loss[x], loss[y])
    for x in ("a", "b", "c", "d"):
        if x in loss and "e" in loss:
            cmp[f"regret_{x}_vs_e"] = jr.paired(loss[x], loss["e"], relative=True)
    out["paired"] = cmp
    out["verdicts"] = verdicts(cmp)
    parts = {n: len(loss.get(n, {})) == len(regret_seeds if n in ("b", "e") else seeds) for n in NAMES}
    out["parts_done"] = parts
    out["complete"] = all(parts.values()) and not runs.missing and bool(direct.get("complete"))
    out["missing_runs"] = sorted(runs.missing)
    out["process_wall_s"] = round(time.perf_counter() - t0, 1)
    out["runs_trained_this_invocation"] = runs.cache.trained
    png = out_path.with_suffix(".png")
    save_figure(jr._figure(out), png)
    out["figure"] = str(png.relative_to(ROOT)) if png.is_relative_to(ROOT) else str(png)
    write_json(out_path, jr._finite(out))
    jr._print(out)
    print(f"wrote {out_path} and {png}")
    return out


def verdicts(cmp: dict) -> dict:
    """The issue's claims, read from the paired intervals (never typed by hand)."""
    g = lambda k: (cmp.get(k) or {}).get("verdict", "inconclusive (not measured)")
    r = cmp.get("regret_b_vs_e")
    return {
        "(b) regret against a direct joint search at the target, upper end <= 1%": (
            verdict(r["ci"][0], r["ci"][1], below=REGRET_CEILING) if r else "inconclusive (not measured)"
        ),
        "(b) new default vs (a) old default": g("b-a"),
        "(b) vs (c) SP tuned at the target (goal: not worse)": g("b-c"),
        "(b) vs (d) Step Law's LR (goal: not worse)": g("b-d"),
    }


if __name__ == "__main__":
    main()
