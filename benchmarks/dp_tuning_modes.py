"""Issue 38 item 4: three ways to choose DP fine-tuning's (B, C, lr) at equal TOTAL ε — tuning on a
public proxy (`dp.tuning: public`), tuning on the private data accounted (`dp.tuning: private`) and a
stated default recipe — each followed by the private run, scored on private validation sequences and
run seeds that nothing was chosen on.

Regime (as benchmarks/dp_finetune.py, whose cached pretraining it reuses): a µP Llama (width 32,
depth 2, head_dim 16, seq_len 32) pretrained without privacy on the stdlib corpus and handed off; every
DP run fine-tunes it on the PRIVATE corpus (`prose`: installed packages' READMEs), N = 1024 training
sequences of 33 bytes, E = 1 epoch, δ = 1e-5, the RDP accountant everywhere (the private mode's ledger
composes RDP curves), candidates B ∈ {32, 64, 128, 256} (T = 32 … 4 steps), lr ∈ {1e-3, 3e-3, 1e-2}.
The product's own functions throughout (one `hpt dp-sweep` LM trial per run: `dp.lm_task`).

Arms, at each total ε (dp.epsilon):
- **public**: the product's public mode: a DP sweep on the PUBLIC proxy (the stdlib corpus, N of its
  sequences: `finetune.tuning_spec`) at ε and at ε = ∞ (the noise-free arm) over every B × a C grid
  (the public norms' median × {0.5, 1, 2}) × lr, one seed; `dp.plan.evidence_from_sweep` + the public
  per-example norms → `dp.plan.dp_plan_for` (predicted-loss B, C = the p(ε)-quantile of the public
  norms, lr from the sweep's LR-vs-B law, as rules.py). The private data are read by the private run
  alone, which spends all of ε. The tuning runs once per ε (its randomness is not replicated).
- **private**: `dp.tuning_run.run_private_tuning` with the defaults of `dp.private_tuning` (share 0.5,
  E[K] = 4 geometric, C the DP median of all N private norms, 2048 private validation sequences for the
  score, noise 0.05 nats), then the private run at the selection with the ε the budget leaves
  (`private_tuning.final_epsilon`). Replicated: each replicate runs the whole procedure again with its
  own seeded randomness (the product draws it from OS entropy).
- **default** (stated, not tuned): B = 256 (the largest candidate, N/4: large batches are DP-friendly,
  Li et al. 2022, "Large language models can be strong differentially private learners"), C = the DP
  median of the private norms (the same mechanism and budget as the private arm's quantile, its ε
  composed), lr = 3e-3 (`dp.sweep.lrs`' default); the private run gets what the quantile leaves.

Scoring: the private run of each arm at run seed 1000 + r (no seed any choice was made on), its loss on
private validation sequences 2048 … 2048 + n_eval (disjoint from the private arm's score set), noise
free (the benchmark's measurement, not a release). Each arm's whole-study ε is composed by RDP and
checked ≤ the total. Differences are paired by replicate (same run seed), mean with a 95% t-interval:
"better" / "worse" when the interval excludes 0, else "inconclusive". Where two arms chose the same
(B, lr) and C within 5%, they are the same algorithm in that replicate, which the JSON counts.

Run: nice -n 10 .venv/bin/python benchmarks/dp_tuning_modes.py  → benchmarks/results/dp_tuning_modes.{json,png}
Quick end-to-end check: add `--quick --out /tmp/dp_tuning_modes` (1 ε, 2 replicates, a tiny sweep).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from common import RESULTS, machine_info, t_interval

sys.path.insert(0, str(Path(__file__).resolve().parent))

SETTINGS = {
    "epsilons": [2.0, 8.0],
    "replicates": 8,
    "dataset_size": 1024,
    "epochs": 1,
    "batch_sizes": [32, 64, 128, 256],
    "lrs": [1e-3, 3e-3, 1e-2],
    "clip_factors": [0.5, 1.0, 2.0],
    "delta": 1e-5,
    "min_steps": 4,
    "score_sequences": 2048,
    "eval_sequences": 1536,
    "norm_sequences": 256,
    "default": {"batch_size": 256, "lr": 3e-3},
    "tuning_seed": 0,
    "run_seed_base": 1000,
}
QUICK = {
    **SETTINGS,
    "epsilons": [8.0],
    "replicates": 2,
    "batch_sizes": [64, 256],
    "lrs": [3e-3, 1e-2],
    "clip_factors": [1.0],
    "eval_sequences": 512,
}


def _spec(s: dict, pre: str, corpus: str, epsilon: float) -> dict:
    from dp_finetune import FULL, model_dict

    w = FULL["width"]
    return {
        "name": "bench-dp-tuning-modes",
        "model": model_dict(FULL),
        "data": {"corpus": corpus, "max_files": FULL["max_files"], "eval_batches": 2},
        "sweep": {"widths": [w, 2 * w], "grid": {"lr": [1e-3]}, "batch_size": 64, "seeds": [s["tuning_seed"]]},
        "target": {"width": 2 * w},
        "transfer": {"rule": "dp"},
        "dp": {
            "epsilon": epsilon,
            "delta": s["delta"],
            "dataset_size": s["dataset_size"],
            "epochs": s["epochs"],
            "batch_sizes": s["batch_sizes"],
            "min_steps": s["min_steps"],
            "accountant": "rdp",
            "init_from": pre,
        },
    }


def final_run(task, eval_seqs, s, *, batch_size, clip, lr, epsilon, sigma, seed) -> dict:
    """The private run of an arm: DP-SGD at (B, C, lr) with σ (its own ε `epsilon`), scored on the
    evaluation sequences."""
    from hptransfer.dp.lm_task import run_dp_lm_finetune
    from hptransfer.dp.tuning_run import per_sequence_losses

    kept: dict = {}
    t0 = time.perf_counter()
    m = run_dp_lm_finetune(
        task,
        epsilon=epsilon,
        delta=s["delta"],
        epochs=s["epochs"],
        batch_size=batch_size,
        clip=clip,
        lr=lr,
        accountant="rdp",
        seed=seed,
        sigma=sigma,
        keep_model=lambda mdl: kept.setdefault("model", mdl),
    )
    losses = per_sequence_losses(kept["model"], eval_seqs)
    return {
        "eval_loss": sum(losses) / len(losses),
        "epsilon_run": m["dp/epsilon"],
        "sigma": sigma,
        "steps": m["steps"],
        "wall_s": round(time.perf_counter() - t0, 2),
    }


def public_plan(s: dict, pre: str, epsilon: float, ptask, norms, sweep_cache: dict) -> dict:
    """The product's public mode at `epsilon`: a DP sweep on the public task (ε and ∞), its evidence
    and the public norms → dp_plan_for; the lr from the sweep's law (rules.py's `dp-sweep` branch), or
    the best LR at the chosen B when no law was fitted."""
    import numpy as np

    from dp_finetune import sweep_table
    from hptransfer.dp.lm_task import run_dp_lm_finetune
    from hptransfer.dp.plan import DPEvidence, dp_plan_for, evidence_from_sweep
    from hptransfer.dp.sweep import sweep_points
    from hptransfer.spec import parse_spec

    median = float(np.median(norms))
    d = _spec(s, pre, "stdlib", epsilon)
    d["dp"] = {**d["dp"], "clip_reference": median, "clip_factors": s["clip_factors"], "batch_rule": "predicted-loss"}
    spec = parse_spec(d)
    rows = []
    for p in sweep_points(spec, [epsilon, math.inf], s["dataset_size"]):
        for lr in s["lrs"]:
            key = json.dumps([p["epsilon"], p["batch_size"], round(p["clip"], 6), lr])
            if key not in sweep_cache:
                m = run_dp_lm_finetune(
                    ptask,
                    epsilon=p["epsilon"],
                    delta=s["delta"],
                    epochs=s["epochs"],
                    batch_size=p["batch_size"],
                    clip=p["clip"],
                    lr=lr,
                    accountant="rdp",
                    seed=s["tuning_seed"],
                    sigma=None if math.isinf(p["epsilon"]) else p["sigma"],
                )
                sweep_cache[key] = {**p, "lr": lr, "seed": s["tuning_seed"], "val_loss": m["val_loss"]}
            rows.append(sweep_cache[key])
    cfg = spec.dp  # a DPConfig (N set)
    ev = evidence_from_sweep(sweep_table(rows), cfg)
    ev = DPEvidence(loss_model=ev.loss_model, lr_law=ev.lr_law, grad_norms=list(norms), source=ev.source)
    plan = dp_plan_for(cfg, ev)
    if plan.lr_law is not None:
        law = plan.lr_law
        lr, lr_from = law["lr_ref"] * (plan.batch_size / law["batch_ref"]) ** law["beta"], "the sweep's LR-vs-B law"
    else:
        at_b = [r for r in rows if r["epsilon"] == epsilon and r["batch_size"] == plan.batch_size]
        lr, lr_from = min(at_b, key=lambda r: r["val_loss"])["lr"], "the best swept LR at B"
    return {
        "batch_size": plan.batch_size,
        "clip": plan.clip,
        "lr": float(lr),
        "lr_from": lr_from,
        "sigma": plan.noise_multiplier,
        "steps": plan.steps,
        "sweep_runs": len(rows),
        "public_median_norm": median,
    }


def _paired(a: dict[int, float], b: dict[int, float]) -> dict:
    common = sorted(set(a) & set(b))
    if not common:
        return {"mean": None, "lo": None, "hi": None, "n": 0, "verdict": "inconclusive"}
    ci = t_interval([a[r] - b[r] for r in common]).as_dict()
    v = "inconclusive" if ci["lo"] is None else "better" if ci["hi"] < 0 else "worse" if ci["lo"] > 0 else "inconclusive"
    return {**ci, "verdict": v}


def _same(x: dict, y: dict) -> bool:
    return x["batch_size"] == y["batch_size"] and x["lr"] == y["lr"] and abs(math.log(x["clip"] / y["clip"])) < math.log(1.05)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 ε, 2 replicates, a small sweep: an end-to-end check")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--work", type=Path, default=Path("/tmp/hpt_dp_finetune"), help="dp_finetune.py's pretraining cache")
    args = ap.parse_args(argv)
    import numpy as np
    import torch

    from dp_finetune import FULL, pretrained_model
    from hptransfer.dp import private_tuning as pt
    from hptransfer.dp.accounting import noise_multiplier, steps_for
    from hptransfer.dp.lm_task import load_lm_task, per_example_grad_norms, public_sequences
    from hptransfer.dp.tuning_run import run_private_tuning, validation_sequences
    from hptransfer.errors import DPError
    from hptransfer.io import write_json
    from hptransfer.spec import DataSpec, parse_spec
    from hptransfer.spec.dp import PrivateTuningSpec

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    s = dict(QUICK if args.quick else SETTINGS)
    args.work.mkdir(parents=True, exist_ok=True)
    folder, pre_rec = pretrained_model(FULL, args.work)
    pre = str(folder)
    private_data = DataSpec(corpus="prose", max_files=FULL["max_files"])
    seq_len = FULL["seq_len"]
    val = validation_sequences(private_data, seq_len, s["score_sequences"] + s["eval_sequences"])
    eval_seqs = val[s["score_sequences"] :]
    ptask_spec = parse_spec(_spec(s, pre, "stdlib", 8.0))
    ptask = load_lm_task(ptask_spec)
    pnorms = per_example_grad_norms(ptask, public_sequences(ptask_spec, s["norm_sequences"]))
    cfg = PrivateTuningSpec()  # the product's defaults
    sigma_for = lambda e, q, t: noise_multiplier(e, s["delta"], q, t, "rdp")
    n = s["dataset_size"]
    sweep_cache: dict = {}
    out: dict = {"settings": s, "private_tuning": cfg.model_dump(), "pretrained": pre_rec, "per_epsilon": []}
    for eps in s["epsilons"]:
        spec = parse_spec(_spec(s, pre, "prose", eps))
        task = load_lm_task(spec)
        norms = per_example_grad_norms(task, task.sequences)  # the default's DP median counts these (kept in memory)
        pub = public_plan(s, pre, eps, ptask, pnorms, sweep_cache)
        print(f"ε={eps:g} public plan: B={pub['batch_size']} C={pub['clip']:.4g} lr={pub['lr']:.4g}", flush=True)
        arms: dict[str, dict[int, dict]] = {"public": {}, "private": {}, "default": {}}
        infeasible = None
        for r in range(s["replicates"]):
            seed = s["run_seed_base"] + r
            rng = np.random.default_rng(10_000 + r)
            # public: all of ε for the private run
            arms["public"][r] = {
                **pub,
                **final_run(task, eval_seqs, s, batch_size=pub["batch_size"], clip=pub["clip"], lr=pub["lr"], epsilon=eps, sigma=pub["sigma"], seed=seed),
                "epsilon_total": pt.epsilon_of(pt.dp_sgd_rdp(pub["batch_size"] / n, pub["sigma"], pub["steps"]), s["delta"]),
            }  # fmt: skip
            # private: the product's private tuning, then the run on what it leaves
            if infeasible is None:
                try:
                    with tempfile.TemporaryDirectory() as tmp:
                        sel = run_private_tuning(
                            Path(tmp), spec, cfg, s["lrs"], task.width, seed=s["tuning_seed"], log=lambda *_: None, rng=rng, task=task
                        )  # fmt: skip
                except DPError as e:
                    infeasible = str(e)
                    print(f"ε={eps:g} private tuning refused: {e}", flush=True)
            if infeasible is None:
                b = sel.batch_size
                q, t = b / n, steps_for(n, s["epochs"], b)
                prior = sel.quantile_rdp + sel.tuning_rdp
                e_run, sig, total = pt.final_epsilon(eps, s["delta"], prior, q, t, sigma_for)
                arms["private"][r] = {
                    "batch_size": b,
                    "clip": sel.clip,
                    "lr": sel.lr,
                    "noisy_score": sel.score,
                    "trial_epsilon": sel.doc["mechanism"]["trials"]["trial_epsilon"],
                    **final_run(task, eval_seqs, s, batch_size=b, clip=sel.clip, lr=sel.lr, epsilon=e_run, sigma=sig, seed=seed),
                    "epsilon_total": total,
                }
            # default: B = 256, C = the DP median (its ε composed), lr = 3e-3
            d = s["default"]
            qstd = cfg.quantile_noise * n
            c = pt.dp_quantile(norms, cfg.quantile, 1e-3, 1e3, cfg.quantile_steps, qstd, rng)
            q_rdp = cfg.quantile_steps * pt.gaussian_rdp(1.0, qstd)
            q, t = d["batch_size"] / n, steps_for(n, s["epochs"], d["batch_size"])
            e_run, sig, total = pt.final_epsilon(eps, s["delta"], q_rdp, q, t, sigma_for)
            arms["default"][r] = {
                "batch_size": d["batch_size"],
                "clip": c,
                "lr": d["lr"],
                **final_run(task, eval_seqs, s, batch_size=d["batch_size"], clip=c, lr=d["lr"], epsilon=e_run, sigma=sig, seed=seed),
                "epsilon_total": total,
                "clipped_fraction": float(np.mean(np.asarray(norms) > c)),
            }  # fmt: skip
            line = " ".join(f"{a}={v[r]['eval_loss']:.4f}" for a, v in arms.items() if r in v)
            print(f"ε={eps:g} replicate {r}: {line} ({time.perf_counter() - t0:.0f} s)", flush=True)
        loss = {a: {r: v["eval_loss"] for r, v in runs.items()} for a, runs in arms.items()}
        assert all(v["epsilon_total"] <= eps * (1 + 1e-9) for runs in arms.values() for v in runs.values())
        out["per_epsilon"].append(
            {
                "epsilon": eps,
                "public_plan": pub,
                "private_infeasible": infeasible,
                "arms": {a: [runs[r] for r in sorted(runs)] for a, runs in arms.items()},
                "mean_eval_loss": {a: (t_interval(v.values()).as_dict() if v else None) for a, v in loss.items()},
                "paired": {
                    "private - public": _paired(loss["private"], loss["public"]),
                    "private - default": _paired(loss["private"], loss["default"]),
                    "public - default": _paired(loss["public"], loss["default"]),
                },
                "same_algorithm": {
                    pair: sum(_same(arms[x][r], arms[y][r]) for r in arms[x] if r in arms[y])
                    for pair, (x, y) in {
                        "private = public": ("private", "public"),
                        "private = default": ("private", "default"),
                        "public = default": ("public", "default"),
                    }.items()
                },
            }
        )
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    out["machine"] = machine_info()
    out["command"] = "nice -n 10 .venv/bin/python benchmarks/dp_tuning_modes.py" + (" --quick" if args.quick else "")
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "dp_tuning_modes.json", out)
    plot(out, args.out / "dp_tuning_modes.png")
    for e in out["per_epsilon"]:
        print(f"ε={e['epsilon']:g}:", {k: (v["mean"], v["lo"], v["hi"], v["verdict"]) for k, v in e["paired"].items()})
    return out


def plot(out: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hptransfer.io import save_figure

    eps = out["per_epsilon"]
    fig, axes = plt.subplots(1, len(eps), figsize=(4.5 * len(eps), 3.6), squeeze=False)
    for ax, e in zip(axes[0], eps):
        for i, runs in enumerate(e["arms"].values()):
            ys = [x["eval_loss"] for x in runs]
            ax.scatter([i] * len(ys), ys, alpha=0.6)
            if ys:
                ax.errorbar([i + 0.15], [sum(ys) / len(ys)], fmt="k_", markersize=14)
        ax.set_xticks(range(len(e["arms"])), list(e["arms"]))
        ax.set_title(f"total ε = {e['epsilon']:g}")
        ax.set_ylabel("private validation loss (held out)")
    fig.suptitle("DP fine-tuning at equal total ε: how (B, C, lr) were chosen")
    fig.tight_layout()
    return save_figure(fig, path)


if __name__ == "__main__":
    main()
