"""One sweep trial: train a model of one width with one set of hyperparameters, report val loss.

`train_proxy` is plain PyTorch (callable from a notebook or a test); `tune_trainable` adapts it to
Ray Tune. A non-finite training loss ends the trial early with status `diverged`: that is a
result (the LR was too high), not an error.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

from hptransfer.spec import DEFAULT_HPS, StudySpec

Reporter = Callable[[dict], None]


@torch.no_grad()
def evaluate(model, batches) -> float:
    from hptransfer.models import lm_logits

    model.eval()
    total = 0.0
    for x, y in batches:
        logits = lm_logits(model, x)
        total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    model.train()
    return total / len(batches)


def train_proxy(spec: StudySpec, width: int, hps: dict[str, float], seed: int, report: Reporter | None = None, n_reports: int = 4) -> dict:
    """Train one proxy model; returns the final metrics. `report` gets `n_reports` evaluations."""
    from hptransfer.data import load_corpus
    from hptransfer.models import build_model, build_optimizer, lm_logits, lr_schedule

    t0 = time.perf_counter()
    hps = {**DEFAULT_HPS, **hps}
    corpus = load_corpus(spec.data.val_fraction, spec.data.max_files)
    val = corpus.val_batches(spec.data.eval_batches, spec.sweep.batch_size, spec.model.seq_len)
    model = build_model(spec.model, width, base_width=spec.base_width, seed=seed,
                        **({"init_std": hps["init_std"]} if "init_std" in hps else {}))
    opt = build_optimizer(model, spec.model.parametrization, hps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_schedule(s, spec.sweep.steps, hps["warmup_steps"]))
    steps = spec.sweep.steps
    eval_at = {max(1, round(steps * (i + 1) / n_reports)) for i in range(n_reports)}
    metrics = {"status": "ok", "val_loss": float("nan"), "train_loss": float("nan"), "step": 0}
    train_time = 0.0
    for step in range(1, steps + 1):
        ts = time.perf_counter()
        x, y = corpus.batch("train", step, spec.sweep.batch_size, spec.model.seq_len, seed=seed)
        logits = lm_logits(model, x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if hps["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), hps["grad_clip"])
        opt.step()
        sched.step()
        train_time += time.perf_counter() - ts
        metrics.update(train_loss=loss.item(), step=step)
        if not math.isfinite(metrics["train_loss"]):
            metrics.update(status="diverged", val_loss=float("nan"))
        elif step in eval_at:
            metrics["val_loss"] = evaluate(model, val)
            if not math.isfinite(metrics["val_loss"]):
                metrics["status"] = "diverged"
        if metrics["status"] == "diverged" or step in eval_at:
            metrics.update(wall_s=time.perf_counter() - t0, train_s=train_time)
            if report:
                report(dict(metrics))
        if metrics["status"] == "diverged":
            break
    return metrics


def trial_key(spec: StudySpec, width: int, hps: dict, seed: int) -> str:
    import hashlib
    import json

    from hptransfer.spec import spec_hash

    blob = json.dumps({"spec": spec_hash(spec), "width": width, "hps": hps, "seed": seed}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def tune_trainable(config: dict) -> None:
    """Ray Tune function trainable. config: spec (dict), width, seed, one key per tuned HP, and
    `done_dir`, where each finished trial leaves its final metrics.

    Tune snapshots its experiment state every ≥10 s, so after a driver crash it may not know that a
    trial finished moments before; the marker makes such a trial replay its result instead of
    training again."""
    import json
    from pathlib import Path

    from ray import tune

    from hptransfer.io import write_json
    from hptransfer.spec import StudySpec

    spec = StudySpec.model_validate(config["spec"])
    torch.set_num_threads(max(1, int(spec.sweep.cpus_per_trial)))
    hps = {**spec.sweep.fixed, **{k: config[k] for k in spec.sweep.grid}}
    marker = Path(config["done_dir"]) / f"{trial_key(spec, config['width'], hps, config['seed'])}.json" if config.get("done_dir") else None
    if marker is not None and marker.exists():
        tune.report({**json.loads(marker.read_text()), "cached": True})
        return
    final = train_proxy(spec, config["width"], hps, config["seed"], report=tune.report, n_reports=spec.sweep.reports)
    if marker is not None:
        write_json(marker, final)
