"""DP fine-tuning of a PRETRAINED language model: the plan `hpt transfer` makes for a `dp` study
(predicted-loss batch rule, clipping bound from measured per-example gradient norms) against the
common default B = 256, C = 1 and against the best cell of a (B, C) grid chosen on other seeds, at
ε ∈ {0.5, 2, 8} and E ∈ {1, 4} epochs; and paper 1's directions (Rehn et al., arXiv 2510.20616;
docs/RESEARCH.md) in the fine-tuning regime they are about.

Regime (issue 26): a µP Llama (width 32, depth 2, head_dim 16, seq_len 32) is pretrained once,
without privacy, on the PUBLIC corpus (the standard library's .py bytes, `data.corpus: stdlib`),
handed off as the large run hands off (`models.handoff.save_handoff`: Hugging Face weights, µP's
readout folded in) and cached; every DP run fine-tunes that model (`dp.init_from`) on the PRIVATE
corpus (installed packages' READMEs, `data.corpus: prose`, a different distribution) with the
product's own DP code: one `hpt dp-sweep` LM trial each (`dp.lm_task.run_dp_lm_finetune`: Opacus,
Poisson sampling at q = B/N, T = ceil(E·N/B) steps, the normalized DP-Adam of
`dp.train.make_private_normalized`, σ from the PRV accountant), N = the first 512 sequences of 33
bytes. Score: validation loss on 8 fixed batches of 64 held-out prose sequences. Every private run's
ε spent, read from Opacus' accountant at its end, is recorded and checked ≤ its target.

The plan is made from the evidence the product would have, never from the scored runs:
- per-example gradient norms of the pretrained model on 256 prose sequences after the N private ones
  (`dp.lm_task.public_sequences` + `per_example_grad_norms`, what `hpt dp-sweep` writes to
  dp_grad_norms.json) → C(ε), the p(ε)-quantile (`dp.rule.clip_from_norms`);
- a small DP sweep on PILOT seeds (disjoint from the selection and scoring seeds) at each E: the
  noise-free arm (ε = inf, σ = 0) and the private arm at every ε, at every B of the grid, one C each
  (the median norm for the noise-free arm, the plan's C(ε) for the private one) → the loss model
  L(T, ρ) of the predicted-loss batch rule (`dp.plan.evidence_from_sweep` on that table, as
  `hpt transfer` reads dp_sweep_results.csv) → `dp.plan.dp_plan_for`.
The LR follows one rule in every arm (plan, default, grid): lr = lr_ref·√(B/256) (`dp.rule.lr_scale`),
lr_ref the best of `lrs_pilot` at the default's B = 256, ε = 2, C = median norm (sum over both E,
pilot seeds): tuned at the default's batch size, so the rule favours the default if anyone.

Seeds: the grid (B ∈ {16, …, 256} × C = median norm × {0.25, 0.63, 1.6, 4}) runs on the selection
seeds; its best cell per (ε, E) (lowest seed mean) is then run on the scoring seeds, with the plan's
and the default's cells, so "plan − grid best" has no winner's curse. Differences are paired by seed
(same init of the DP run's sampling and noise; the model is the same pretrained one), mean with a
95% t-interval. Goal: every plan − default interval has lo ≤ 0 (never significantly worse) and every
plan − grid best has lo ≤ 0 (within the noise of the grid best).

Paper 1's directions, from the grid on the selection seeds (per-seed statistics, t-intervals):
(a) ε = 0.5: where σ√T is within 5% of its minimum, loss is flat in B (relative slope per doubling
    of B inside ±1%; the margin is our assumption);
(b) ε = 8: larger B is better (relative slope < 0);
(c) the best C is larger at ε = 0.5 than at ε = 8 (log C* difference > 0, C* from a parabola in
    log C at each ε's best B, `transfer.optimum.fit_optimum`);
(d) more epochs make larger batches viable: the slope at E = 4 minus the slope at E = 1 < 0.
(a)–(c) at each E. "inconclusive" when the interval straddles the claim's boundary.

Why this size: one run costs ≈ E·N per-example gradients of a 2-layer width-32 Llama, ~30 ms per step
(Opacus' hooks) and ~1 s (model, accountant, evaluation): ~2 s at E = 1 and ~5 s at E = 4 with
N = 512 on one idle thread. 3 ε × 2 E × 20 cells × 3 selection seeds + 3 cells × 3 scoring seeds +
the pilot is 468 runs, ~1500 CPU-seconds idle (estimate): ~13 min on 2 idle processes; measured 46 min
at a load of 4–22 (benchmarks/results/dp_finetune.json: wall_s, run_wall_s_total). It was sized down twice
(N = 2048, then 1024) because this shared machine ran it at a load of 12–30, i.e. ~10× slower than
idle. The grid runs one selection seed at a time, each followed by the grid best's scoring runs, so a
run cut short still gives every comparison (chosen on fewer seeds; the JSON lists the seeds used).
σ for every (ε, q, T) is computed once in the driver (the PRV search takes 2–17 s).

Run: nice -n 10 .venv/bin/python benchmarks/dp_finetune.py   → benchmarks/results/dp_finetune.{json,png}
Quick end-to-end check (1 ε, 1 E, 2 B × 2 C, tiny pretraining; a few minutes): add `--quick --out /tmp/dp_finetune`.
Held-out check (`--heldout` → dp_finetune_heldout.{json,png}): the rules were changed after this
benchmark's first run showed the plan losing, so the rerun above is in-sample; this runs the same
product path at N = 1024 with new pilot (101) and scoring (6–8) seeds, plan vs default only (no grid).
A rerun resumes from the JSON-lines run cache (/tmp/hpt_dp_finetune_runs.jsonl; `--cache` moves it)
and the pretrained model in /tmp/hpt_dp_finetune/ (`--work`); `--cached-only` writes the result from
the runs already cached, marked `complete: false` when any is missing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

from dp_lm import log_optimum_difference, paired, relative_slopes

from common import RESULTS, RunCache, key_str, machine_info, t_interval, verdict

CACHE = Path("/tmp/hpt_dp_finetune_runs.jsonl")
WORK = Path("/tmp/hpt_dp_finetune")  # the pretrained model and the σ table

FULL = {
    "epsilons": [0.5, 2.0, 8.0],
    "epochs": [1, 4],
    "dataset_size": 512,
    "batch_sizes": [16, 32, 64, 128, 256],
    "clip_factors": [0.25, 0.63, 1.6, 4.0],  # × the median measured norm; ratio ≈ 2.5
    "selection_seeds": [0, 1, 2],
    "scoring_seeds": [3, 4, 5],
    "pilot_seeds": [100],
    "lrs_pilot": [1e-3, 3e-3, 1e-2, 3e-2],
    "lr_ref_batch": 256,
    "width": 32,
    "depth": 2,
    "head_dim": 16,
    "seq_len": 32,
    "delta": 1e-5,
    "accountant": "prv",
    "tolerance": 0.05,
    "min_steps": 8,  # only the σ√T rule's floor (the noise-free fallback); T ≥ 8 at every grid B
    "eval_batches": 8,
    "eval_batch": 64,
    "max_files": 400,
    "pretrain_steps": 2000,
    "pretrain_batch": 32,
    "pretrain_lr": 1e-2,
    "norm_sequences": 256,
    "flat_margin": 0.01,
}
QUICK = {
    **FULL,
    "epsilons": [8.0],
    "epochs": [1],
    "dataset_size": 512,
    "batch_sizes": [16, 32],
    "clip_factors": [0.5, 2.0],
    "selection_seeds": [0],
    "scoring_seeds": [1, 2],
    "lrs_pilot": [3e-3, 1e-2],
    "lr_ref_batch": 32,
    "accountant": "rdp",
    "eval_batches": 2,
    "pretrain_steps": 30,
    "norm_sequences": 64,
}
# A held-out check of the rules (changed after the first run of this benchmark): another N, new pilot and
# scoring seeds, plan vs default only (no grid), same pretrained model. → dp_finetune_heldout.json
HELDOUT = {**FULL, "dataset_size": 1024, "selection_seeds": [], "scoring_seeds": [6, 7, 8], "pilot_seeds": [101]}
DEFAULT = {"batch_size": 256, "clip": 1.0}  # a common default (Opacus tutorials' max_grad_norm), as dp_lm.py
PILOT_EPSILON = 2.0


def settings(quick: bool, heldout: bool = False) -> dict:
    return dict(QUICK if quick else HELDOUT if heldout else FULL)


def _c(x: float) -> float:
    return float(f"{x:.6g}")


# --- pretraining on the public corpus (once, cached) ---------------------------------------------


def model_dict(s: dict) -> dict:
    return {"family": "llama", "depth": s["depth"], "head_dim": s["head_dim"], "seq_len": s["seq_len"], "parametrization": "mup"}


def pretrain_key(s: dict) -> dict:
    return {
        "model": model_dict(s),
        "width": s["width"],
        **{k: s[k] for k in ("pretrain_steps", "pretrain_batch", "pretrain_lr", "max_files")},
        "corpus": "stdlib",
    }


def pretrained_model(s: dict, work: Path) -> tuple[Path, dict]:
    """The handed-off folder of the model pretrained (non-privately) on the stdlib corpus: trained on
    first use, then reused (its folder name is a hash of the settings). Returns it with its record."""
    key = pretrain_key(s)
    folder = work / f"pretrained-{hashlib.sha256(key_str(key).encode()).hexdigest()[:12]}"
    record = folder / "pretrain.json"
    if record.is_file():
        return folder, json.loads(record.read_text())
    import shutil

    import torch

    from hptransfer.data import open_corpus
    from hptransfer.hyperparameters import Hyperparameters
    from hptransfer.io import write_json
    from hptransfer.models import evaluate, lm_logits, training_setup
    from hptransfer.models.build import lm_loss
    from hptransfer.models.handoff import save_handoff
    from hptransfer.spec import DataSpec, ModelSpec

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    mspec, data = ModelSpec(**model_dict(s)), DataSpec(corpus="stdlib", max_files=s["max_files"])
    corpus = open_corpus(data)
    w, steps, bs, sl = s["width"], s["pretrain_steps"], s["pretrain_batch"], s["seq_len"]
    run = training_setup(mspec, w, base_width=w, hps=Hyperparameters(lr=s["pretrain_lr"]), total_steps=steps, seed=0)
    model, opt, sched = run.model, run.optimizer, run.scheduler()
    for step in range(1, steps + 1):  # the sweep trial's loop (sweep.trial.train_proxy), keeping the model
        x, y = corpus.batch("train", step, bs, sl, seed=0)
        loss = lm_loss(lm_logits(model, x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        run.clip_gradients()
        opt.step()
        sched.step()
    val = evaluate(model, corpus.val_batches(s["eval_batches"], s["eval_batch"], sl))
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_handoff(model, tmp, spec_model=mspec, width=w, base_width=w)
    rec = {**key, "public_val_loss": val, "final_train_loss": float(loss), "wall_s": round(time.perf_counter() - t0, 1)}
    write_json(tmp / "pretrain.json", rec)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    print(f"pretrained on stdlib: {steps} steps, public val loss {val:.4f} ({rec['wall_s']} s) → {folder}", flush=True)
    return folder, rec


# --- the private task, the σ table and the runs ---------------------------------------------------


def spec_dict(s: dict, init_from: str, epsilon: float = 2.0, epochs: float = 1) -> dict:
    """The DP study spec whose `hpt dp-sweep` LM trials these runs are: prose as the private corpus,
    the pretrained model as `dp.init_from`."""
    w = s["width"]
    return {
        "name": "bench-dp-finetune",
        "model": model_dict(s),
        "data": {"corpus": "prose", "max_files": s["max_files"], "eval_batches": s["eval_batches"]},
        "sweep": {"widths": [w, 2 * w], "grid": {"lr": [1e-3]}, "batch_size": s["eval_batch"]},
        "target": {"width": 2 * w},
        "transfer": {"rule": "dp"},
        "dp": {
            "epsilon": epsilon,
            "delta": s["delta"],
            "dataset_size": s["dataset_size"],
            "epochs": epochs,
            "batch_sizes": s["batch_sizes"],
            "min_steps": s["min_steps"],
            "accountant": s["accountant"],
            "init_from": init_from,
        },
    }


def sigma_key(epsilon: float, delta: float, q: float, steps: int, accountant: str) -> str:
    return json.dumps([epsilon, delta, q, steps, accountant])


def sigma_table(s: dict, work: Path, procs: int) -> dict[str, float]:
    """σ for every (ε, q = B/N, T) of the benchmark by `dp.accounting.noise_multiplier` (the call a
    trial makes), computed once (in `procs` processes) and kept in work/sigma.json."""
    import multiprocessing as mp

    from hptransfer.dp.accounting import steps_for
    from hptransfer.io import write_json

    path = work / "sigma.json"
    table = json.loads(path.read_text()) if path.is_file() else {}
    n = s["dataset_size"]
    want = [
        (e, s["delta"], b / n, steps_for(n, ep, b), s["accountant"])
        for e in [*s["epsilons"], PILOT_EPSILON]
        for ep in s["epochs"]
        for b in sorted({*s["batch_sizes"], DEFAULT["batch_size"], s["lr_ref_batch"]})
        if b <= n
    ]
    todo = sorted({w for w in want if sigma_key(*w) not in table})
    if todo:
        print(f"σ for {len(todo)} (ε, q, T) by the {s['accountant']} accountant …", flush=True)
        with mp.get_context("spawn").Pool(procs) as pool:
            for w, sig in zip(todo, pool.starmap(_sigma, todo)):
                table[sigma_key(*w)] = sig
        write_json(path, table)
    return table


def _sigma(epsilon, delta, q, steps, accountant) -> float:
    from hptransfer.dp.accounting import noise_multiplier

    return noise_multiplier(epsilon, delta, q, steps, accountant)


_W: dict = {}


def _init(spec: dict, sigmas: dict[str, float]) -> None:
    import torch

    from hptransfer.dp.lm_task import load_lm_task
    from hptransfer.spec import parse_spec

    torch.set_num_threads(1)
    _W["task"] = load_lm_task(parse_spec(spec))
    _W["sigmas"] = sigmas


def _run(key: dict) -> dict:
    from hptransfer.dp.accounting import steps_for
    from hptransfer.dp.lm_task import run_dp_lm_finetune

    t0 = time.perf_counter()
    n, e = key["dataset_size"], key["epsilon"]
    sig = (
        None
        if math.isinf(e)
        else _W["sigmas"].get(
            sigma_key(e, key["delta"], key["batch_size"] / n, steps_for(n, key["epochs"], key["batch_size"]), key["accountant"])
        )
    )
    m = run_dp_lm_finetune(
        _W["task"],
        sigma=sig,  # the driver's σ for these (ε, δ, q, T); None: the trial computes it
        epsilon=key["epsilon"],
        delta=key["delta"],
        epochs=key["epochs"],
        batch_size=key["batch_size"],
        clip=key["clip"],
        lr=key["lr"],
        accountant=key["accountant"],
        seed=key["seed"],
    )
    eps = m.pop("dp/epsilon")  # Opacus' accountant at the end of the run (train_dp raises above target)
    assert math.isinf(key["epsilon"]) or eps <= key["epsilon"] + 1e-9, (eps, key)
    return {**key, "epsilon_spent": eps, **m, "wall_s": time.perf_counter() - t0}


def run_key(s: dict, pre: str, epsilon: float, epochs: float, batch_size: int, clip: float, lr: float, seed: int) -> dict:
    """Everything that changes a run's result (the cache key); `pre` names the pretrained model."""
    return {
        "epsilon": epsilon,
        "epochs": epochs,
        "batch_size": batch_size,
        "clip": _c(clip),
        "lr": _c(lr),
        "seed": seed,
        "pretrained": pre,
        **{k: s[k] for k in ("dataset_size", "delta", "accountant", "width", "depth", "head_dim", "seq_len")},
        **{k: s[k] for k in ("eval_batches", "eval_batch", "max_files")},
    }


def _describe(r: dict) -> str:
    return (
        f"ε={r['epsilon']:g} E={r['epochs']:g} B={r['batch_size']} C={r['clip']:.3g} lr={r['lr']:.3g} seed={r['seed']} → "
        f"val {r['val_loss']:.4f} (from {r['initial_val_loss']:.3f}; ε spent {r['epsilon_spent']:.3g}, T={r['steps']}, "
        f"{r['wall_s']:.0f}s)"
    )


class Runner:
    """Runs keys through the JSON-lines cache in one pool of worker processes (the task loaded once
    per worker), kept across rounds; with `cached_only`, returns the cached subset and counts the
    missing ones."""

    def __init__(self, cache: RunCache, spec: dict, sigmas: dict, procs: int, cached_only: bool):
        self.cache, self.spec, self.sigmas, self.procs, self.cached_only = cache, spec, sigmas, procs, cached_only
        self.missing: list[dict] = []
        self.all: dict[str, dict] = {}
        self.pool = None

    def __call__(self, keys: list[dict]) -> dict[str, dict]:
        if not keys:
            return {}
        if self.cached_only:
            done = self.cache.load(list(keys[0]))
            self.missing += [k for k in keys if key_str(k) not in done]
            out = {key_str(k): done[key_str(k)] for k in keys if key_str(k) in done}
        else:
            import inspect
            import multiprocessing as mp

            reuse = "pool" in inspect.signature(RunCache.run).parameters
            if reuse and self.pool is None and any(key_str(k) not in self.cache.load(list(keys[0])) for k in keys):
                self.pool = mp.get_context("spawn").Pool(self.procs, _init, (self.spec, self.sigmas))
            out = self.cache.run(
                keys,
                _run,
                procs=self.procs,
                first=lambda k: -k["epochs"] * (1 + 32 / k["batch_size"]),  # longest first
                describe=_describe,
                initializer=_init,
                initargs=(self.spec, self.sigmas),
                **({"pool": self.pool} if reuse else {}),
            )
        self.all.update(out)
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool = None


# --- plan, evidence and statistics ----------------------------------------------------------------


def lr_for(s: dict, lr_ref: float, batch_size: int) -> float:
    from hptransfer.dp.rule import lr_scale

    return lr_ref * lr_scale(s["lr_ref_batch"], batch_size)


def dp_config(s: dict, epsilon: float, epochs: float, median_norm: float, lr_ref: float):
    from hptransfer.privacy import DPConfig

    return DPConfig(
        epsilon=epsilon,
        delta=s["delta"],
        dataset_size=s["dataset_size"],
        epochs=epochs,
        batch_sizes=s["batch_sizes"],
        min_steps=s["min_steps"],
        tolerance=s["tolerance"],
        accountant=s["accountant"],
        batch_rule="predicted-loss",
        clip_reference=median_norm,
        clip_factors=s["clip_factors"],
        lr=lr_ref,
        lr_reference_batch=s["lr_ref_batch"],
    )


def sweep_table(runs: list[dict]):
    """Runs as the rows of a study's dp_sweep_results.csv (what `evidence_from_sweep` reads)."""
    import pandas as pd

    cols = ("epsilon", "batch_size", "clip", "lr", "seed", "val_loss", "steps", "sigma")
    return pd.DataFrame(
        [{**{k: r[k] for k in cols}, "status": "ok" if math.isfinite(r["val_loss"]) else "diverged"} for r in runs]
    )


def _mean(seeds: dict[int, float]) -> float:
    v = list(seeds.values())
    return sum(v) / len(v) if v and all(math.isfinite(x) for x in v) else math.inf


def _ci(seeds: dict[int, float]) -> dict:
    return t_interval([seeds[k] for k in sorted(seeds)]).as_dict() if seeds else {"mean": None, "lo": None, "hi": None, "n": 0}


def _side(ci: dict | None) -> str:
    """plan − other: which side of 0 the interval is on."""
    if not ci or ci["lo"] is None:
        return "inconclusive"
    return "plan better" if ci["hi"] < 0 else "plan worse" if ci["lo"] > 0 else "within noise"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 ε, 1 E, 2 B × 2 C, tiny pretraining: an end-to-end check")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for dp_finetune.json and dp_finetune.png")
    ap.add_argument("--cache", type=Path, default=CACHE, help=f"JSON-lines run cache (default: {CACHE})")
    ap.add_argument("--work", type=Path, default=WORK, help=f"pretrained model and σ table (default: {WORK})")
    ap.add_argument(
        "--heldout",
        action="store_true",
        help="held-out check of the rules: N = 1024, new pilot/scoring seeds, plan vs default only → dp_finetune_heldout.json",
    )
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--cached-only", action="store_true", help="train nothing: write the result from the cached runs")
    args = ap.parse_args(argv)
    import numpy as np

    from hptransfer.dp.lm_task import load_lm_task, per_example_grad_norms, public_sequences
    from hptransfer.dp.plan import DPEvidence, dp_plan_for, evidence_from_sweep
    from hptransfer.dp.rule import clip_from_norms
    from hptransfer.io import write_json
    from hptransfer.spec import parse_spec

    t0 = time.perf_counter()
    s = settings(args.quick, args.heldout)
    name = "dp_finetune_heldout" if args.heldout else "dp_finetune"
    args.work.mkdir(parents=True, exist_ok=True)
    folder, pre_rec = pretrained_model(s, args.work)
    pre = folder.name
    spec = spec_dict(s, str(folder))
    sp = parse_spec(spec)
    task = load_lm_task(sp)
    norms = per_example_grad_norms(task, public_sequences(sp, s["norm_sequences"]))
    median = _c(float(np.median(norms)))
    print(f"per-example gradient norms of the pretrained model on {len(norms)} held-out prose sequences: median {median}")
    sigmas = sigma_table(s, args.work, args.procs)
    run = Runner(RunCache(args.cache), spec, sigmas, args.procs, args.cached_only)
    key = lambda *a: run_key(s, pre, *a)

    # 1. lr_ref: at the default's B, ε = 2, C = median norm, every E, pilot seeds
    lr_keys = {
        lr: [key(PILOT_EPSILON, ep, s["lr_ref_batch"], median, lr, sd) for ep in s["epochs"] for sd in s["pilot_seeds"]]
        for lr in s["lrs_pilot"]
    }
    res = run([k for ks in lr_keys.values() for k in ks])
    lr_score = {lr: sum(res[key_str(k)]["val_loss"] for k in ks if key_str(k) in res) for lr, ks in lr_keys.items()}
    lr_ref = min(lr_score, key=lambda lr: (lr_score[lr] if all(key_str(k) in res for k in lr_keys[lr]) else math.inf, lr))
    print(f"lr_ref = {lr_ref:g} (pilot sums { ({f'{k:g}': round(v, 4) for k, v in lr_score.items()}) })", flush=True)

    # 2. the evidence sweep (pilot seeds): noise-free arm + private arm, every B; then the plans
    plans, evidence = {}, {}
    for ep in s["epochs"]:
        ev_keys = [
            key(math.inf, ep, b, median, lr_for(s, lr_ref, b), sd) for b in s["batch_sizes"] for sd in s["pilot_seeds"]
        ] + [
            key(e, ep, b, clip_from_norms(norms, e), lr_for(s, lr_ref, b), sd)
            for e in s["epsilons"]
            for b in s["batch_sizes"]
            for sd in s["pilot_seeds"]
        ]
        ev_runs = list(run(ev_keys).values())
        ev = evidence_from_sweep(sweep_table(ev_runs), dp_config(s, s["epsilons"][0], ep, median, lr_ref))
        ev = DPEvidence(loss_model=ev.loss_model, lr_law=ev.lr_law, grad_norms=norms, source=ev.source + " (pilot seeds)")
        evidence[ep] = {"loss_model": ev.loss_model.as_dict() if ev.loss_model else None, "source": ev.source}
        for e in s["epsilons"]:
            # the plan's σ√T table reads σ from the benchmark's table (the same accountant call, kept
            # between runs: the PRV search takes 2–17 s); trials get σ as an argument
            known = lambda q, t, e=e: sigmas.get(sigma_key(e, s["delta"], q, t, s["accountant"]))
            plans[(e, ep)] = dp_plan_for(dp_config(s, e, ep, median, lr_ref), ev, sigma_of=known)

    # 3. plan and default on the scoring seeds; then one selection seed at a time: the grid on it, and
    #    the grid best chosen on the selection seeds so far run on the scoring seeds (so a run cut
    #    short still leaves complete comparisons, chosen on fewer selection seeds)
    clips = [_c(median * f) for f in s["clip_factors"]]
    grid = {(e, ep, b, c) for e in s["epsilons"] for ep in s["epochs"] for b in s["batch_sizes"] for c in clips}
    plan_cell = {(e, ep): (e, ep, p.batch_size, _c(p.clip)) for (e, ep), p in plans.items()}
    default_cell = {(e, ep): (e, ep, DEFAULT["batch_size"], DEFAULT["clip"]) for e in s["epsilons"] for ep in s["epochs"]}
    cell_key = lambda c, sd: key(c[0], c[1], c[2], c[3], lr_for(s, lr_ref, c[2]), sd)
    res = run([cell_key(c, sd) for d in (plan_cell, default_cell) for c in d.values() for sd in s["scoring_seeds"]])

    def seeds_of(cell: tuple, seeds: list[int]) -> dict[int, float]:
        out = {}
        for sd in seeds:
            r = res.get(key_str(cell_key(cell, sd)))
            if r is not None:
                out[sd] = r["val_loss"]
        return out

    used: list[int] = []  # selection seeds whose whole grid ran
    best_cell: dict = {}
    for sd in s["selection_seeds"]:
        got = run([cell_key(c, sd) for c in sorted(grid)])
        res.update(got)
        if len(got) < len(grid):  # --cached-only: this seed's grid is incomplete
            break
        used.append(sd)
        # 4. the grid best per (ε, E), chosen on the selection seeds so far, run on the scoring seeds
        best_cell = {
            (e, ep): min((c for c in grid if c[0] == e and c[1] == ep), key=lambda c: (_mean(seeds_of(c, used)), c))
            for e in s["epsilons"]
            for ep in s["epochs"]
        }
        res.update(run([cell_key(c, x) for c in best_cell.values() for x in s["scoring_seeds"]]))
    run.close()
    s = {**s, "selection_seeds": used, "selection_seeds_planned": s["selection_seeds"]}

    out = analyse(s, median, norms, lr_ref, lr_score, plans, evidence, grid, plan_cell, default_cell, best_cell, seeds_of)
    private = [r for r in run.all.values() if math.isfinite(r["epsilon"])]
    out["max_epsilon_spent_over_target"] = max((r["epsilon_spent"] / r["epsilon"] for r in private), default=None)
    out["all_within_budget"] = all(r["epsilon_spent"] <= r["epsilon"] + 1e-9 for r in private)
    out["pretraining"] = pre_rec
    out["complete"] = not run.missing and len(out["comparisons"]) == len(s["epsilons"]) * len(s["epochs"])
    if run.missing:
        out["missing_runs"] = len(run.missing)
    out["runs"] = [
        {
            k: (r[k] if not (isinstance(r[k], float) and math.isinf(r[k])) else "inf")
            for k in ("epsilon", "epochs", "batch_size", "clip", "lr", "seed", "val_loss", "epsilon_spent", "steps", "sigma")
        }
        | {"wall_s": round(r["wall_s"], 2)}
        for r in sorted(run.all.values(), key=lambda r: (r["epochs"], r["epsilon"], r["batch_size"], r["clip"], r["seed"]))
    ]
    out.update(
        command=" ".join(
            ["nice -n 10 .venv/bin/python", "benchmarks/dp_finetune.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        machine=machine_info(
            argv,
            processes=args.procs,
            torch_threads_per_process=1,
            note="shared 2-core VM; other jobs ran concurrently, so wall times are upper bounds (losses are unaffected)",
        ),
        n_runs=len(run.all),
        run_wall_s_total=round(sum(r["wall_s"] for r in run.all.values()), 1),
        wall_s=round(time.perf_counter() - t0, 1),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / f"{name}.png"
    plot(out, png)
    out["figure"] = f"benchmarks/results/{name}.png" if args.out.resolve() == RESULTS.resolve() else str(png)
    write_json(args.out / f"{name}.json", out)
    print(json.dumps({k: out[k] for k in ("comparisons", "goal", "verdicts", "complete", "wall_s")}, indent=1, default=str))
    return out


def analyse(s, median, norms, lr_ref, lr_score, plans, evidence, grid, plan_cell, default_cell, best_cell, seeds_of) -> dict:
    """Rows, paired comparisons, the goal and the directions' verdicts."""
    import numpy as np

    from hptransfer.dp.accounting import noise_row
    from hptransfer.dp.rule import clip_from_norms

    sel, sco = s["selection_seeds"], s["scoring_seeds"]
    out: dict = {
        "setting": {
            **s,
            "pretrained": True,
            "default": DEFAULT,
            "lr_ref": lr_ref,
            "lr_rule": f"lr = {lr_ref:g}·√(B/{s['lr_ref_batch']})",
            "lr_pilot_sum_of_losses": {f"{k:g}": v for k, v in lr_score.items()},
            "clip_reference_median_norm": median,
            "clip_grid": sorted({c[3] for c in grid}),
            "model": f"llama width {s['width']}, depth {s['depth']}, head_dim {s['head_dim']}, µP, seq_len {s['seq_len']}",
            "public_corpus": f"stdlib .py bytes (max_files {s['max_files']})",
            "private_corpus": f"prose (installed packages' READMEs, max_files {s['max_files']}); N = first "
            f"{s['dataset_size']} sequences of {s['seq_len'] + 1} bytes",
        },
        "grad_norms": {
            "n": len(norms),
            "quantiles": {f"{q:g}": float(np.quantile(norms, q)) for q in (0.02, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99)},
            "plan_clip_by_epsilon": {f"{e:g}": clip_from_norms(norms, e) for e in s["epsilons"]},
        },
        "evidence": {f"{ep:g}": v for ep, v in evidence.items()},
        "rows": [],
        "comparisons": [],
        "cells": [],
    }
    lr = lambda b: lr_for(s, lr_ref, b)
    for (e, ep), plan in sorted(plans.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        table = {r.batch_size: r for r in plan.table}
        cells = {"dp-plan": plan_cell[(e, ep)], "default": default_cell[(e, ep)], "grid best": best_cell.get((e, ep))}
        for choice, cell in cells.items():
            if cell is None:
                continue
            sc = seeds_of(cell, sco)
            ci = _ci(sc)
            nr = table.get(cell[2]) or noise_row(e, s["delta"], s["dataset_size"], ep, cell[2], 1, s["accountant"])
            out["rows"].append(
                {
                    "epsilon": e,
                    "epochs": ep,
                    "choice": choice,
                    "batch_size": cell[2],
                    "clip": cell[3],
                    "clip_over_median": cell[3] / median,
                    "lr": lr(cell[2]),
                    "steps": nr.steps if nr else None,
                    "sigma": nr.sigma if nr else None,
                    "sigma_sqrt_T": nr.sigma_sqrt_t if nr else None,
                    "val_loss": ci["mean"],
                    "ci_low": ci["lo"],
                    "ci_high": ci["hi"],
                    "seed_losses": [sc[k] for k in sorted(sc)],
                    "selection_mean": _mean(seeds_of(cell, sel)) if choice == "grid best" else None,
                }
            )
        p, d, b = (seeds_of(cells[c], sco) if cells[c] else {} for c in ("dp-plan", "default", "grid best"))
        pmd = paired(p, d) if set(p) & set(d) else None
        pmg = paired(p, b) if set(p) & set(b) else None
        out["comparisons"].append(
            {
                "epsilon": e,
                "epochs": ep,
                "plan": {"batch_size": plan.batch_size, "clip": _c(plan.clip), "clip_quantile": plan.clip_quantile},
                "grid_best": {"batch_size": cells["grid best"][2], "clip": cells["grid best"][3]} if cells["grid best"] else None,
                "plan_minus_default": pmd,
                "plan_minus_grid_best": pmg,
                "default_minus_grid_best": paired(d, b) if set(d) & set(b) else None,
                "vs_default": _side(pmd),
                "vs_grid_best": _side(pmg),
                "predictions": plan.predictions,
                "batch_decision": plan.batch_decision,
                "plan_notes": plan.notes,
                "sigma_sqrt_T": {str(r.batch_size): r.sigma_sqrt_t for r in plan.table},
            }
        )
        for cell in sorted(c for c in grid if c[0] == e and c[1] == ep):
            sc = seeds_of(cell, sel)
            if sc:
                out["cells"].append({"epsilon": e, "epochs": ep, "B": cell[2], "C": cell[3], **_ci(sc)})
    comps = out["comparisons"]
    ok_d = [c["plan_minus_default"] is not None and c["plan_minus_default"]["lo"] is not None for c in comps]
    ok_g = [c["plan_minus_grid_best"] is not None and c["plan_minus_grid_best"]["lo"] is not None for c in comps]
    never_worse = all(ok_d) and all(c["plan_minus_default"]["lo"] <= 0 for c in comps)
    near_best = all(ok_g) and all(c["plan_minus_grid_best"]["lo"] <= 0 for c in comps) if sel else None
    out["goal"] = {
        "plan_never_significantly_worse_than_default": never_worse,
        "plan_within_noise_of_grid_best": near_best,
        "met": never_worse and near_best is not False,
        "rule": "every plan_minus_default.lo ≤ 0 and every plan_minus_grid_best.lo ≤ 0 (95% t-intervals, paired by seed)"
        + ("" if sel else "; no grid in this run (held-out check): plan vs default only"),
    }
    out["verdicts"] = directions(s, plans, grid, seeds_of) if sel else {}
    return out


def _per_b(e: float, ep: float, grid: set, seeds_of, seeds: list[int]) -> dict[int, tuple[float, dict[int, float]]]:
    """Each B's best C (lowest seed mean) at (ε, E) and its per-seed losses."""
    out: dict[int, tuple[float, dict[int, float]]] = {}
    for c in sorted(grid):
        if c[0] == e and c[1] == ep:
            sc = seeds_of(c, seeds)
            if len(sc) == len(seeds) and (c[2] not in out or _mean(sc) < _mean(out[c[2]][1])):
                out[c[2]] = (c[3], sc)
    return dict(sorted(out.items()))


def _optimum_c(e, ep, b, grid, seeds_of, seeds) -> dict:
    from hptransfer.transfer.optimum import fit_optimum

    vals, losses = [], []
    for c in sorted(grid):
        if c[0] == e and c[1] == ep and c[2] == b:
            for loss in seeds_of(c, seeds).values():
                vals.append(c[3])
                losses.append(loss)
    f = fit_optimum(vals, losses, log_scale=True)
    return {"batch_size": b, "value": f.value, "log_se": f.log_se, "censored": f.censored, "convex": f.convex}


def directions(s: dict, plans: dict, grid: set, seeds_of) -> dict:
    sel, m = s["selection_seeds"], s["flat_margin"]
    tight, loose = min(s["epsilons"]), max(s["epsilons"])
    out: dict = {}
    for ep in s["epochs"]:
        tag = f"E={ep:g}"
        rows = [r for r in plans[(tight, ep)].table if r.sigma_sqrt_t is not None]
        low = min(r.sigma_sqrt_t for r in rows)
        flat_b = [r.batch_size for r in rows if r.sigma_sqrt_t <= (1 + s["tolerance"]) * low]
        per_b = _per_b(tight, ep, grid, seeds_of, sel)
        a = {"epsilon": tight, "epochs": ep, "batch_sizes": flat_b, "claim_region": [-m, m]}
        if len(flat_b) >= 2 and all(b in per_b for b in flat_b) and len(sel) >= 2:
            a["relative_slope"] = t_interval(relative_slopes({b: per_b[b][1] for b in flat_b})).as_dict()
            a["verdict"] = verdict(a["relative_slope"]["lo"], a["relative_slope"]["hi"], inside=(-m, m))
        else:
            a["verdict"], a["why"] = (
                "inconclusive",
                f"σ√T within {s['tolerance']:.0%} of its minimum at B = {flat_b} only"
                if len(flat_b) < 2
                else f"{len(sel)} selection seed(s): no interval",
            )
        out[f"a_plateau_at_tight_epsilon_{tag}"] = a
        per_b = _per_b(loose, ep, grid, seeds_of, sel)
        b_ = {"epsilon": loose, "epochs": ep, "batch_sizes": list(per_b), "claim_region": ["-inf", 0]}
        if len(per_b) >= 2 and len(sel) >= 2:
            b_["relative_slope"] = t_interval(relative_slopes({b: v[1] for b, v in per_b.items()})).as_dict()
            b_["verdict"] = verdict(b_["relative_slope"]["lo"], b_["relative_slope"]["hi"], below=0.0)
        else:
            b_["verdict"], b_["why"] = "inconclusive", "fewer than 2 batch sizes or seeds"
        out[f"b_larger_batch_better_at_loose_epsilon_{tag}"] = b_
        if tight != loose:
            optima = {}
            for e in (tight, loose):
                pb = _per_b(e, ep, grid, seeds_of, sel)
                best_b = min(pb, key=lambda b: _mean(pb[b][1]))
                optima[f"{e:g}"] = _optimum_c(e, ep, best_b, grid, seeds_of, sel)
            diff = log_optimum_difference(optima[f"{tight:g}"], optima[f"{loose:g}"])
            out[f"c_larger_clip_at_tight_epsilon_{tag}"] = {
                "epsilons": [tight, loose],
                "epochs": ep,
                "optima": optima,
                "log_ratio": diff,
                "claim_region": [0, "inf"],
                "verdict": verdict(-diff["hi"], -diff["lo"], below=0.0),
            }
    if len(s["epochs"]) >= 2 and len(sel) >= 2:
        e1, e2 = min(s["epochs"]), max(s["epochs"])
        for e in s["epsilons"]:
            lo_b, hi_b = _per_b(e, e1, grid, seeds_of, sel), _per_b(e, e2, grid, seeds_of, sel)
            bs = sorted(set(lo_b) & set(hi_b))
            d = {"epsilon": e, "epochs": [e1, e2], "batch_sizes": bs, "claim_region": ["-inf", 0]}
            if len(bs) >= 2:
                s1 = relative_slopes({b: lo_b[b][1] for b in bs})
                s2 = relative_slopes({b: hi_b[b][1] for b in bs})
                d["slope_difference"] = t_interval([y - x for x, y in zip(s1, s2)]).as_dict()
                d["verdict"] = verdict(d["slope_difference"]["lo"], d["slope_difference"]["hi"], below=0.0)
            else:
                d["verdict"] = "inconclusive"
            out[f"d_more_epochs_larger_batch_eps={e:g}"] = d
    return out


def plot(out: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hptransfer.io import save_figure

    s = out["setting"]
    eps_list, ep_list = s["epsilons"], s["epochs"]
    fig, axes = plt.subplots(len(ep_list), len(eps_list), figsize=(4.8 * len(eps_list), 3.8 * len(ep_list)), squeeze=False)
    med = s["clip_reference_median_norm"]
    marks = {"dp-plan": ("*", 16, "black"), "grid best": ("o", 12, "red"), "default": ("s", 10, "tab:green")}
    for i, ep in enumerate(ep_list):
        for j, eps in enumerate(eps_list):
            ax = axes[i][j]
            cells = [c for c in out["cells"] if c["epsilon"] == eps and c["epochs"] == ep]
            for cv in sorted({c["C"] for c in cells}):
                pts = sorted((c["B"], c["mean"], c["lo"], c["hi"]) for c in cells if c["C"] == cv)
                err = [
                    [p[1] - p[2] if p[2] is not None else 0 for p in pts],
                    [p[3] - p[1] if p[3] is not None else 0 for p in pts],
                ]
                ax.errorbar(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    yerr=err,
                    marker="o",
                    ms=3,
                    capsize=2,
                    lw=1,
                    label=f"C={cv / med:.2g}×med",
                )
            for r in (r for r in out["rows"] if r["epsilon"] == eps and r["epochs"] == ep and r["val_loss"] is not None):
                mk, ms, col = marks[r["choice"]]
                ax.errorbar(
                    [r["batch_size"]],
                    [r["val_loss"]],
                    yerr=[[r["val_loss"] - (r["ci_low"] or r["val_loss"])], [(r["ci_high"] or r["val_loss"]) - r["val_loss"]]],
                    fmt=mk,
                    ms=ms,
                    mfc="none",
                    mec=col,
                    ecolor=col,
                    mew=1.6,
                    label=f"{r['choice']} (C={r['clip']:.2g})",
                )
            ax.set_xscale("log", base=2)
            ax.set_title(f"ε = {eps:g}, E = {ep:g}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)
            if i == len(ep_list) - 1:
                ax.set_xlabel("expected batch size B")
        axes[i][0].set_ylabel("val loss (prose)")
    fig.suptitle(
        "DP fine-tuning of a pretrained Llama: grid (selection seeds) per C; plan, default, grid best on the scoring seeds"
    )
    fig.tight_layout()
    return save_figure(fig, path)


if __name__ == "__main__":
    main()
