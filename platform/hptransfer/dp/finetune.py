"""The fine-tuning regime of paper 1 (`dp.init_from: pretrain`): pretrain non-privately on the public
corpus `data`, then fine-tune privately on the private corpus `dp.data`, starting from the study's
own large run. `hpt run` sequences it (`pipeline.finetune_stage`), each stage resumable:

1. the ordinary sweep → plan → large run on `data` (rule `transfer.rule`, e.g. mup): the large run
   hands off `train/hf_model`;
2. per DP sweep width w (`dp.sweep.widths`, default the target's): the model pretrained at w (the
   target: the large run's handoff; a narrower w: the pretraining plan trained at w in-process,
   `pretrained_model`, µP's transferred hyperparameters hold there) and a DP sweep on the PUBLIC
   tuning corpus's sequences starting from it (`tuning_spec`) — every trial of a width starts from
   the same pretrained model;
3. with ≥ 2 widths, the across-width check (dp/width.py): do the narrowest width's (B, C, lr) hold
   at the widest (`private/dp_across_width.json`);
4. the private plan (rule dp) from the narrowest width's DP sweep (its measured step curve, LR law
   and gradient norms: the transferred settings), at the target width, fine-tuning the large run's
   handoff; written to `private/transfer_plan.yaml`, trained by the private large run into
   `private/train/` (ε spent from Opacus' accountant, ≤ target).

The private part runs on derived specs: `tuning_spec` for the DP sweeps (`dp.tuning: public`, the
default: `data` = the PUBLIC tuning corpus `dp.tuning_data`, else the pretraining corpus; rule `dp`,
`dp.init_from` = the pretrained folder, N = the private run's) and `private_spec` for the private plan
and run (`data` = the private corpus). So the private corpus is read by the private large run alone
(and counted for N when dp.dataset_size is null); `privacy_ledger` lists that read with its ε. Its folders (layout: `private/…`) are study folders
of their own sharing the study's MLflow tracking URI and experiment.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hptransfer.context import StudyContext
from hptransfer.errors import StudyError
from hptransfer.plan import TransferPlan
from hptransfer.spec import StudySpec, parse_spec


@dataclass(frozen=True)
class SweepSettings:
    widths: list[int]
    epsilons: list[float]
    lrs: list[float]
    seeds: list[int]
    tolerance: float


def sweep_settings(spec: StudySpec) -> SweepSettings:
    """`dp.sweep` with its defaults filled in (see spec.DPSweepSpec)."""
    dp = spec.dp
    assert dp is not None and dp.finetunes_pretrained
    s = dp.sweep
    return SweepSettings(
        widths=list(s.widths or [spec.target.width]),
        epsilons=list(s.epsilons or [dp.epsilon, math.inf]),
        lrs=list(s.lrs or [dp.lr or 3e-3]),
        seeds=list(s.seeds or spec.sweep.seeds),
        tolerance=s.tolerance,
    )


def private_spec(spec: StudySpec, init_from: str | Path) -> StudySpec:
    """The spec of the private part: the private corpus as `data`, rule `dp`, `dp.init_from` the
    pretrained folder (the rest of the spec, the model and the budget included, unchanged)."""
    assert spec.dp is not None and spec.dp.finetunes_pretrained
    d = spec.model_dump(mode="json", exclude_unset=False)
    d["data"] = (spec.dp.data or spec.data).model_dump(mode="json")
    d["transfer"] = {**d["transfer"], "rule": "dp"}
    d["dp"] = {k: v for k, v in d["dp"].items() if k not in FINETUNE_ONLY} | {"init_from": str(init_from)}
    return parse_spec(d, source=f"{spec.name} (private part)")


FINETUNE_ONLY = ("data", "sweep", "tuning", "tuning_data", "private_tuning")  # the fine-tuning regime's own dp keys


def tuning_corpus(spec: StudySpec):
    """The corpus the DP sweep reads under `dp.tuning: public`: dp.tuning_data, else `data`."""
    assert spec.dp is not None and spec.dp.finetunes_pretrained
    return spec.dp.tuning_data or spec.data


def tuning_spec(spec: StudySpec, init_from: str | Path) -> StudySpec:
    """The spec of the DP sweep under `dp.tuning: public`: the private part's spec with the PUBLIC
    tuning corpus as `data`, so its trials, the noise-free arm, the per-example gradient norms (C) and
    the selection (its validation split) never read `dp.data`. N is the private run's (dp.dataset_size
    or the private corpus' sequence count: the size, treated as public as Opacus' q = B/N treats it),
    so σ(B), T = E·N/B and the step curve are the private run's; the public corpus must hold N
    sequences beyond which the norms are measured."""
    from hptransfer.dp.lm_task import dataset_size

    pspec = private_spec(spec, init_from)
    d = pspec.model_dump(mode="json", exclude_unset=False)
    d["data"] = tuning_corpus(spec).model_dump(mode="json")
    d["dp"] = {k: v for k, v in d["dp"].items() if k not in FINETUNE_ONLY} | {"dataset_size": dataset_size(pspec)}
    return parse_spec(d, source=f"{spec.name} (DP sweep on the public tuning corpus)")


def sub_study(study: StudyContext, spec: StudySpec, root: Path) -> StudyContext:
    """A study folder inside the study, logging to the same MLflow store and experiment."""
    return StudyContext(spec, root, tracking_uri=study.tracking_uri, experiment=study.experiment, address=study.address)


def pretrained_model(study: StudyContext, plan: TransferPlan, width: int, log=print) -> Path:
    """The model pretrained at `width`: the large run's handoff at the target width; below it, the
    pretraining plan (its hyperparameters, steps, batch and schedule) trained at `width` in this
    process and handed off the same way, once (kept; a rerun reuses it)."""
    from hptransfer.models.handoff import save_handoff
    from hptransfer.sweep.trial import train_proxy
    from hptransfer.transfer.schedule import warmup_multiplier

    if width == plan.target.width:
        folder = study.paths.train.hf_model
        if not folder.is_dir():
            raise StudyError(
                f"{folder} not found: the pretraining large run has not handed off a model; run `hpt run` "
                "(it trains it) or check train/train_metrics.json"
            )
        return folder
    folder = study.paths.pretrained(width)
    if folder.is_dir():
        return folder
    spec = study.require_spec()
    kept: dict = {}
    log(f"pretrain: width {width} with the pretraining plan ({plan.target.steps} steps, batch {plan.target.batch_size})")
    metrics = train_proxy(
        spec,
        width,
        plan.hps,
        seed=plan.seed,
        steps=plan.target.steps,
        batch_size=plan.target.batch_size,
        depth=plan.model.depth,
        extra_lr_factor=lambda s: warmup_multiplier(s, plan),
        keep_model=lambda m: kept.setdefault("model", m),
    )
    if metrics["status"] != "ok":
        raise StudyError(f"pretraining at width {width} {metrics['status']} (val_loss {metrics['val_loss']})")
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    plan_w = plan.model_copy(update={"target": plan.target.model_copy(update={"width": width})})
    save_handoff(
        kept["model"].cpu(),
        tmp,
        spec_model=plan.model,
        width=width,
        base_width=plan.base_width,
        plan_dict=plan_w.model_dump(mode="json"),
    )
    tmp.rename(folder)  # whole or absent: a rerun after a crash trains it again
    log(f"pretrain: width {width} val_loss {metrics['val_loss']:.4f} → {folder}")
    return folder


def dp_evidence(ctx: StudyContext):
    """The measured rules' evidence from one width's DP sweep folder (its table and, when written,
    the per-example gradient norms), with their hashes for the plan's provenance."""
    import dataclasses
    import json

    from hptransfer.dp.plan import evidence_from_sweep
    from hptransfer.transfer.engine import _dp_config, file_hash

    path = ctx.paths.dp_sweep_results
    ev = evidence_from_sweep(pd.read_csv(path), _dp_config(ctx.require_spec()))
    prov = {"dp_sweep_results_hash": file_hash(path), "dp_sweep_folder": str(ctx.root)}
    if ctx.paths.dp_grad_norms.is_file():
        ev = dataclasses.replace(ev, grad_norms=json.loads(ctx.paths.dp_grad_norms.read_text())["norms"])
        prov["dp_grad_norms_hash"] = file_hash(ctx.paths.dp_grad_norms)
    return ev, prov


def across_width(tables: dict[int, pd.DataFrame], tolerance: float) -> dict:
    """dp/width.py's check over the widths' DP sweep tables."""
    from hptransfer.dp.width import compare_widths

    df = pd.concat([t.assign(width=w) for w, t in sorted(tables.items())], ignore_index=True)
    return compare_widths(df, tolerance)


def private_plan(
    study: StudyContext, pspec: StudySpec, narrow: StudyContext, narrow_width: int, check: dict | None
) -> TransferPlan:
    """The private plan: rule dp on the pretraining sweep's table (µP's width transfer underneath)
    with the narrowest width's DP sweep as its evidence, at the target width; the across-width
    check and where the model came from in its `dp` section."""
    from hptransfer.transfer.engine import check_results_belong, file_hash, make_plan, read_results

    spec = study.require_spec()
    table = read_results(study.paths.sweep_results)
    check_results_belong(table, spec, study.sweep_hash, str(study.paths.sweep_results))
    ev, prov = dp_evidence(narrow)
    plan = make_plan(pspec, table, provenance={"results_file_hash": file_hash(study.paths.sweep_results), **prov}, dp_evidence=ev)
    dp = dict(plan.dp or {})
    dp["pretrained_from"] = pspec.dp.init_from
    dp["settings_from_width"] = narrow_width
    if check is not None:
        dp["across_width"] = plain_numbers(check)
    return plan.model_copy(update={"dp": dp})


def private_plan_after_tuning(study: StudyContext, fspec: StudySpec, selection, width: int, info: dict) -> TransferPlan:
    """dp.tuning: private: the private plan from `fspec` (dp/tuning_run.final_plan_spec: the selected B, lr
    and C, the run's own ε), rule dp over the pretraining sweep's table, no DP sweep evidence; the
    selection and the budget in its `dp` section."""
    from hptransfer.transfer.engine import check_results_belong, file_hash, make_plan, read_results

    spec = study.require_spec()
    table = read_results(study.paths.sweep_results)
    check_results_belong(table, spec, study.sweep_hash, str(study.paths.sweep_results))
    sel = study.paths.private_tuning / "selection.json"
    plan = make_plan(
        fspec,
        table,
        provenance={"results_file_hash": file_hash(study.paths.sweep_results), "private_tuning_hash": file_hash(sel)},
    )
    dp = dict(plan.dp or {})
    dp["pretrained_from"] = fspec.dp.init_from
    dp["settings_from_width"] = width
    dp["private_tuning"] = {
        "selection": str(sel),
        "batch_size": selection.batch_size,
        "lr": selection.lr,
        "clip": selection.clip,
        "noisy_score": selection.score,
        "budget_epsilon": spec.dp.epsilon,
        **info,
    }
    return plan.model_copy(update={"dp": dp})


def plain_numbers(obj):
    """ε = inf (the noise-free arm) as the string "inf": a plan holds no non-finite number."""
    if isinstance(obj, dict):
        return {k: plain_numbers(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [plain_numbers(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj
