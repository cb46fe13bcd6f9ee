"""One sweep trial: train a model of one width with one set of hyperparameters, report val loss.

`train_proxy` is plain PyTorch (callable from a notebook or a test); `tune_trainable` adapts it to
Ray Tune. A non-finite training loss ends the trial early with status `diverged`: that is a
result (the LR was too high), not an error.

A trial trains on the GPU Ray reserved for it (`sweep.gpus_per_trial`), else on the CPU, in
`sweep.precision` (bf16: forward and loss under autocast; hptransfer.models.device).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from hptransfer.hyperparameters import Hyperparameters
from hptransfer.spec import StudySpec

Reporter = Callable[[dict], None]


def trial_hps(spec: StudySpec, point: dict) -> Hyperparameters:
    """Defaults ← the sweep's fixed values ← this grid point's tuned values."""
    return Hyperparameters.of(spec.sweep.fixed, {k: point[k] for k in spec.sweep.grid})


def train_proxy(
    spec: StudySpec,
    width: int,
    hps: Hyperparameters,
    seed: int,
    report: Reporter | None = None,
    n_reports: int = 4,
    *,
    device: torch.device | str = "cpu",
    precision: str | None = None,
    extra_lr_factor: Callable[[int], float] | None = None,
    steps: int | None = None,
    batch_size: int | None = None,
    noise_scale_batches: int = 0,
    depth: int | None = None,
    keep_model: Callable[[torch.nn.Module], None] | None = None,
) -> dict:
    """Train one proxy model on `device` in `precision` (default: `sweep.precision`); returns the
    final metrics. `report` gets `n_reports` evaluations. `extra_lr_factor` multiplies the LR
    schedule as in the large run (`training_setup`; e.g. `sp-warmup`'s warmup at the target).
    `steps`, `batch_size`, `depth`: an arm of sweep.axes (default: the ladder's; a depth arm keeps the
    depth rule relative to the ladder's depth). `noise_scale_batches` > 0:
    the final metrics carry `noise_scale`, B_simple measured on that many fresh batches
    (sweep/noise_scale.py). `keep_model` gets the trained model at the end (dp/finetune.py hands
    off a pretrained model per DP sweep width)."""
    from hptransfer.data import open_corpus
    from hptransfer.models import evaluate, lm_logits, training_setup
    from hptransfer.models.build import lm_loss
    from hptransfer.models.device import autocast

    t0 = time.perf_counter()
    steps, bs = steps or spec.sweep.steps, batch_size or spec.sweep.batch_size
    corpus = open_corpus(spec.data, seq_len=spec.model.seq_len, steps=steps + noise_scale_batches, batch_size=bs)
    val = corpus.val_batches(spec.data.eval_batches, bs, spec.model.seq_len)
    run = training_setup(
        spec.model.at_depth(depth),
        width,
        base_width=spec.base_width,
        hps=hps,
        total_steps=steps,
        seed=seed,
        rule=spec.transfer.rule,
        extra_lr_factor=extra_lr_factor,
    )
    device, precision = torch.device(device), precision or spec.sweep.precision
    # In place: the optimizer built by training_setup keeps the same (now moved) parameters.
    model, opt, sched = run.model.to(device), run.optimizer, run.scheduler()
    eval_at = {max(1, round(steps * (i + 1) / n_reports)) for i in range(n_reports)}
    # steps_planned: what a trial that ran to the end reached (an arm's own horizon; runner's status)
    metrics = {"status": "ok", "val_loss": float("nan"), "train_loss": float("nan"), "step": 0, "steps_planned": steps}
    train_time = 0.0
    for step in range(1, steps + 1):
        ts = time.perf_counter()
        x, y = corpus.batch("train", step, bs, spec.model.seq_len, seed=seed)
        x, y = x.to(device), y.to(device)
        with autocast(device, precision):
            loss = lm_loss(lm_logits(model, x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        run.clip_gradients()
        opt.step()
        sched.step()
        train_time += time.perf_counter() - ts
        metrics.update(train_loss=loss.item(), step=step)
        if not math.isfinite(metrics["train_loss"]):
            metrics.update(status="diverged", val_loss=float("nan"))
        elif step in eval_at:
            metrics["val_loss"] = evaluate(model, val, precision)
            if not math.isfinite(metrics["val_loss"]):
                metrics["status"] = "diverged"
        if metrics["status"] == "diverged" or step in eval_at:
            metrics.update(wall_s=time.perf_counter() - t0, train_s=train_time)
            if report:
                report(dict(metrics))
        if metrics["status"] == "diverged":
            break
    if noise_scale_batches > 0 and metrics["status"] == "ok":
        from hptransfer.sweep.noise_scale import gradient_noise_scale

        fresh = (corpus.batch("train", steps + i, bs, spec.model.seq_len, seed=seed) for i in range(1, noise_scale_batches + 1))
        metrics["noise_scale"] = gradient_noise_scale(
            model, ((x.to(device), y.to(device)) for x, y in fresh), lambda m, x, y: lm_loss(lm_logits(m, x), y)
        )
        if report:
            report(dict(metrics))  # the last result is the table's row
    if keep_model is not None:
        keep_model(model)
    return metrics


def trial_key(spec: StudySpec, width: int, hps: Hyperparameters, seed: int, arm: dict | None = None) -> str:
    """`arm`: a sweep.axes arm's {steps or batch_size: value}; the ladder's own trials have none (and
    keep the key they had before arms existed)."""
    import hashlib
    import json

    from hptransfer.spec import spec_hash

    key = {"spec": spec_hash(spec), "width": width, "hps": hps.as_dict(), "seed": seed, **(arm or {})}
    blob = json.dumps(key, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def tune_trainable(config: dict, spec: StudySpec | None = None, done_dir: str | None = None) -> None:
    """Ray Tune function trainable. config: width, seed, one key per tuned HP. The spec arrives once
    through Ray's object store (`tune.with_parameters`), not copied into every trial's config.

    Tune snapshots its experiment state every ≥10 s, so after a driver crash it may not know that a
    trial finished moments before; a marker in `done_dir` makes such a trial replay its result
    instead of training again."""
    import json
    from pathlib import Path

    from ray import tune

    from hptransfer.io import write_json
    from hptransfer.models.device import trial_device

    s = spec  # validated once by the driver; shared through the object store
    torch.set_num_threads(max(1, int(s.sweep.cpus_per_trial)))
    hps = trial_hps(s, config)
    ladder = {"steps": s.sweep.steps, "batch_size": s.sweep.batch_size, "depth": s.model.depth}
    arm = {a: config[a] for a in ladder if config.get(a) not in (None, ladder[a])}
    marker = Path(done_dir) / f"{trial_key(s, config['width'], hps, config['seed'], arm)}.json" if done_dir else None
    if marker is not None and marker.exists():
        tune.report({**json.loads(marker.read_text()), "cached": True})
        return
    final = train_proxy(
        s,
        config["width"],
        hps,
        config["seed"],
        report=tune.report,
        n_reports=s.sweep.reports,
        device=trial_device(),
        steps=config.get("steps"),
        batch_size=config.get("batch_size"),
        depth=config.get("depth"),
        noise_scale_batches=s.sweep.axes.noise_scale_batches if s.sweep.axes else 0,
    )
    if marker is not None:
        write_json(marker, final)
