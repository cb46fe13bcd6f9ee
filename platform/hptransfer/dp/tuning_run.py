"""`dp.tuning: private`, run: the DP quantile for C, a random number of DP trials on the private corpus,
the DP-scored selection, and the private plan whose run takes what the budget leaves (the rules:
dp/private_tuning.py).

Order, each step resumable without spending twice:
1. C: the DP quantile of the per-example gradient norms of m private training sequences at the
   pretrained model (the norms stay in memory; only C is kept);
2. K ~ D_{η,γ} and K draws of (B, lr) from dp.batch_sizes × dp.sweep.lrs (uniform: P&S's random
   search), from fresh OS entropy;
3. the trials, one after another in this process: DP-SGD at the per-trial ε (σ from the RDP
   accountant), then the noisy score on `score_sequences` private validation sequences;
4. the selection (the lowest noisy score) written to `private/tuning/selection.json`; the state file
   `private/tuning/state.json` (C, K, the draws, each finished trial's noisy score: what a resume
   needs) is deleted then: Papernot & Steinke's ε covers releasing the best trial only.

The state file is written atomically after each trial. Nothing is printed per trial: the number of
trials K is part of the mechanism (Papernot & Steinke's bound covers the best trial's output, not K), so
the console says when the tuning starts and what it selected, no more. A resume continues the SAME draws (same K,
same noise already drawn); a state made under other settings is refused (running the tuning again is
a new mechanism on the same data, whose ε would add). Trials are sequential and not Ray Tune trials:
Ray's result folders and MLflow's child runs would release every trial's score.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hptransfer.dp import private_tuning as pt
from hptransfer.errors import DPError, Problem
from hptransfer.io import write_json

QUANTILE_RANGE = (1e-3, 1e3)


@dataclass(frozen=True)
class Selection:
    """What the private tuning releases, with its accounting."""

    batch_size: int
    lr: float
    clip: float
    score: float  # the selected trial's noisy score (nats)
    doc: dict[str, Any]  # selection.json

    @property
    def quantile_rdp(self) -> np.ndarray:
        return np.asarray(self.doc["rdp"]["quantile"], dtype=float)

    @property
    def tuning_rdp(self) -> np.ndarray:
        return np.asarray(self.doc["rdp"]["tuning"], dtype=float)


def validation_sequences(data, seq_len: int, n: int) -> torch.Tensor:
    """The first `n` non-overlapping sequences of the corpus' validation split: one private example
    each, as the training sequences are (the score's sensitivity is per sequence)."""
    from hptransfer.dp.lm import private_sequences

    return private_sequences(data, seq_len, n, split="val")


@torch.no_grad()
def per_sequence_losses(model: torch.nn.Module, sequences: torch.Tensor, batch: int = 256) -> list[float]:
    """Each sequence's mean next-token cross-entropy."""
    from hptransfer.models.build import lm_logits

    model.eval()
    out = []
    for i in range(0, len(sequences), batch):
        s = sequences[i : i + batch]
        logits = lm_logits(model, s[:, :-1]).float()
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), s[:, 1:], reduction="none")
        out += ce.mean(1).tolist()
    model.train()
    return out


def _settings(spec, cfg, lrs: list[float], width: int, n: int) -> dict[str, Any]:
    """Everything the tuning's mechanism depends on (a resume under other settings is refused)."""
    dp = spec.dp
    return {
        "width": width,
        "dataset_size": n,
        "epsilon": dp.epsilon,
        "delta": dp.delta,
        "epochs": dp.epochs,
        "batch_sizes": list(dp.resolved_batch_sizes()),
        "min_steps": dp.min_steps,
        "lrs": [float(x) for x in lrs],
        "private_tuning": cfg.model_dump(mode="json"),
        "private_data": spec.data.model_dump(mode="json"),
        "init_from": str(spec.dp.init_from),
    }


def _sigma_for(delta: float):
    from hptransfer.dp.accounting import noise_multiplier

    return lambda eps, q, t: noise_multiplier(eps, delta, q, t, "rdp")


def run_private_tuning(
    folder: Path,
    pspec,
    cfg,
    lrs: list[float],
    width: int,
    seed: int = 0,
    log=print,
    rng: np.random.Generator | None = None,
    task=None,
) -> Selection:
    """The private tuning (`cfg`: the study's dp.private_tuning; `lrs`: its LR candidates) on the private
    part's spec `pspec` (data: the private corpus; dp.init_from: the model pretrained at `width`), its
    files in `folder` (private/tuning/). Returns the selection, reusing `selection.json` when the
    settings match. `rng`: the mechanisms' randomness (K, the draws, the quantile's and the scores'
    noise); None, as `hpt run` calls it: fresh OS entropy (a benchmark passes a seeded one to be
    reproducible). `task`: the LMTask of `pspec` when the caller has it loaded."""
    from hptransfer.dp.accounting import steps_for
    from hptransfer.dp.lm_task import load_lm_task, per_example_grad_norms, run_dp_lm_finetune

    task = task if task is not None else load_lm_task(pspec, width)
    n = task.private_size
    settings = _settings(pspec, cfg, lrs, width, n)
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    sel_path, state_path = folder / "selection.json", folder / "state.json"
    if sel_path.is_file():
        doc = json.loads(sel_path.read_text())
        if doc.get("settings_sha256") == digest:
            log(f"private tuning: already done ({sel_path})")
            return Selection(doc["batch_size"], doc["lr"], doc["clip"], doc["score"], doc)
        raise DPError(
            str(sel_path),
            [
                Problem(
                    "dp.private_tuning",
                    "the private tuning already ran under other settings; tuning again on the same private data is a "
                    "new mechanism whose ε adds to the first",
                    fix=f"restore the settings it ran with, or accept the extra spend by moving {folder} aside "
                    "(and count both in what you publish)",
                )
            ],
        )
    dp = pspec.dp
    seq_len = pspec.model.seq_len
    m = cfg.quantile_sequences or n
    problems = []
    if m > n:
        problems.append(Problem("dp.private_tuning.quantile_sequences", f"exceeds N={n}", m, f"set ≤ {n} or null"))
    try:
        score_seqs = validation_sequences(pspec.data, seq_len, cfg.score_sequences)
    except ValueError as e:
        problems.append(Problem("dp.private_tuning.score_sequences", str(e), cfg.score_sequences, "lower it or add data"))
    batch_steps = [(b, b / n, steps_for(n, dp.epochs, b)) for b in dp.resolved_batch_sizes()]
    batch_steps = [x for x in batch_steps if x[2] >= dp.min_steps and x[0] <= n]
    if not batch_steps:
        problems.append(
            Problem("dp.batch_sizes", f"no batch size gives T ≥ dp.min_steps={dp.min_steps} steps with N={n}", fix="lower them")
        )
    if problems:
        raise DPError("dp.tuning: private", problems)
    lrs = settings["lrs"]
    clip_loss = cfg.score_clip or math.log(pspec.model.vocab)
    score_rdp = pt.gaussian_rdp(clip_loss / cfg.score_sequences, cfg.score_noise)
    quantile_std = cfg.quantile_noise * m
    quantile_rdp = cfg.quantile_steps * pt.gaussian_rdp(1.0, quantile_std)
    sigma_for = _sigma_for(dp.delta)
    try:
        budget = pt.tuning_budget(
            cfg.share * dp.epsilon, dp.delta, batch_steps, sigma_for, cfg.expected_trials, cfg.eta, quantile_rdp, score_rdp
        )
    except ValueError as e:
        raise DPError(
            "dp.private_tuning",
            [
                Problem(
                    "dp.private_tuning.share",
                    f"{e} (dp.epsilon={dp.epsilon:g})",
                    cfg.share,
                    "raise dp.epsilon or the share, raise score_noise or score_sequences, lower expected_trials, or "
                    "raise quantile_noise",
                )
            ],
        ) from None
    cands = {c.batch_size: c for c in budget.candidates}

    rng = rng if rng is not None else np.random.default_rng(secrets.randbits(128))
    if state_path.is_file():
        state = json.loads(state_path.read_text())
        if state.get("settings_sha256") != digest:
            raise DPError(
                str(state_path),
                [
                    Problem(
                        "dp.private_tuning",
                        "an unfinished private tuning ran under other settings; starting over would spend its ε again",
                        fix=f"restore its settings to resume it, or move {folder} aside and count both",
                    )
                ],
            )
        log("private tuning: resuming its unfinished trials (their number is part of the mechanism: not shown)")
    else:
        # in chunks: Opacus holds one per-example gradient per sequence of a batch
        norms = [x for i in range(0, m, 128) for x in per_example_grad_norms(task, task.sequences[i : min(i + 128, m)], seed=0)]
        clip = pt.dp_quantile(norms, cfg.quantile, *QUANTILE_RANGE, cfg.quantile_steps, quantile_std, rng)
        del norms  # the private norms are never written
        k = pt.sample_trials(cfg.eta, budget.gamma, rng)
        draws = [
            {"batch_size": int(batch_steps[rng.integers(len(batch_steps))][0]), "lr": float(lrs[rng.integers(len(lrs))])}
            for _ in range(k)
        ]
        state = {"settings_sha256": digest, "clip": clip, "draws": draws, "scores": []}
        write_json(state_path, state)
        log(
            f"private tuning: C = {clip:.4g} (DP {cfg.quantile:g}-quantile of {m} private sequences' gradient norms); "
            f"a random number of DP trials (E[K] = {cfg.expected_trials:g}) at ε = {budget.trial_epsilon:.3g} each "
            f"(the tuning's share: ε ≤ {cfg.share * dp.epsilon:.3g}); how many run is not shown: K is part of the "
            "mechanism and only the best trial is released"
        )
    for i in range(len(state["scores"]), len(state["draws"])):
        d = state["draws"][i]
        c = cands[d["batch_size"]]
        kept: dict = {}
        run_dp_lm_finetune(
            task,
            epsilon=budget.trial_epsilon,
            delta=dp.delta,
            epochs=dp.epochs,
            batch_size=c.batch_size,
            clip=state["clip"],
            lr=d["lr"],
            accountant="rdp",
            seed=seed,
            sigma=c.sigma,
            keep_model=lambda mdl, kept=kept: kept.setdefault("model", mdl),
        )
        score = pt.noisy_score(per_sequence_losses(kept["model"], score_seqs), clip_loss, cfg.score_noise, rng)
        state["scores"].append(score if math.isfinite(score) else 1e30)
        write_json(state_path, state)  # no console line per trial: counting them would release K
    best = int(np.argmin(state["scores"]))
    pick = state["draws"][best]
    doc = {
        "settings_sha256": digest,
        "batch_size": pick["batch_size"],
        "lr": pick["lr"],
        "clip": state["clip"],
        "score": state["scores"][best],
        "mechanism": {
            "quantile": {
                "quantile": cfg.quantile,
                "sequences": m,
                "steps": cfg.quantile_steps,
                "count_noise_std": quantile_std,
                "range": list(QUANTILE_RANGE),
                "epsilon_alone": pt.epsilon_of(quantile_rdp, dp.delta),
            },
            "trials": {
                "law": f"truncated negative binomial η={cfg.eta:g}, γ={budget.gamma:.6g} (E[K]={cfg.expected_trials:g})",
                "eta": cfg.eta,
                "gamma": budget.gamma,
                "expected_trials": cfg.expected_trials,
                "trial_epsilon": budget.trial_epsilon,
                "candidates": [
                    {"batch_size": c.batch_size, "sample_rate": c.sample_rate, "steps": c.steps, "sigma": c.sigma}
                    for c in budget.candidates
                ],
                "lrs": lrs,
                "score": {"sequences": cfg.score_sequences, "clip": clip_loss, "noise_std": cfg.score_noise},
                "epsilon_alone": pt.epsilon_of(budget.tuning_rdp, dp.delta),
            },
            "epsilon_quantile_and_tuning": budget.epsilon,
            "theorem": "Papernot & Steinke, ICLR 2022, Theorem 2",
        },
        "orders": list(pt.ORDERS),
        "rdp": {"quantile": budget.quantile_rdp.tolist(), "tuning": budget.tuning_rdp.tolist()},
        "released": "the selected (B, lr), C and the selected trial's noisy score only; the number of trials and the "
        "other trials' scores are not (the state file is deleted)",
    }
    write_json(sel_path, doc)
    state_path.unlink(missing_ok=True)
    log(f"private tuning: selected B={doc['batch_size']} lr={doc['lr']:.4g} C={doc['clip']:.4g} (noisy score {doc['score']:.4f})")
    return Selection(doc["batch_size"], doc["lr"], doc["clip"], doc["score"], doc)


def final_plan_spec(pspec, selection: Selection, n: int):
    """The private run's spec: the selection's (B, lr, C), its own ε the largest that keeps the whole
    study within dp.epsilon when its RDP curve is composed with the tuning's, RDP accountant."""
    from hptransfer.dp.accounting import steps_for
    from hptransfer.spec import parse_spec

    dp = pspec.dp
    q, t = selection.batch_size / n, steps_for(n, dp.epochs, selection.batch_size)
    prior = selection.quantile_rdp + selection.tuning_rdp
    eps_f, sigma_f, total = pt.final_epsilon(dp.epsilon, dp.delta, prior, q, t, _sigma_for(dp.delta))
    from hptransfer.dp.finetune import FINETUNE_ONLY

    d = pspec.model_dump(mode="json", exclude_unset=False)
    d["dp"] = {
        **{k: v for k, v in d["dp"].items() if k not in FINETUNE_ONLY},
        "epsilon": eps_f,
        "accountant": "rdp",
        "dataset_size": n,
        "batch_sizes": [selection.batch_size],
        "batch_rule": "noise",
        "clip_reference": selection.clip,
        "clip_factors": [1.0],
        "lr": selection.lr,
        "lr_reference_batch": selection.batch_size,
    }
    info = {"run_epsilon": eps_f, "run_sigma": sigma_f, "study_epsilon": total}
    return parse_spec(d, source=f"{pspec.name} (private run after private tuning)"), info


__all__ = ["Selection", "final_plan_spec", "per_sequence_losses", "run_private_tuning", "validation_sequences"]
