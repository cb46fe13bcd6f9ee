"""The one facade: the pipeline as plain functions, each `stage(ctx) -> artifact` over a
`StudyContext` (coord-check → sweep → transfer → train → report, and the DP sweep), each holding the
study's lock while it writes; and `Study`, the same context with one method per stage, for
notebooks. Each stage reads and writes files in the study folder (their names live on
`ctx.paths`, hptransfer/layout.py), so a user can stop, inspect, edit and resume anywhere. CLI
verbs, launchers, `Study`'s methods and the benchmarks all call these; nothing below imports this.

    study = Study.from_spec("search_spaces/quickstart.yaml")
    study.coord_check(); df = study.sweep(); plan = study.transfer(); metrics = study.train(); study.report()
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from hptransfer.context import StudyContext
from hptransfer.errors import StudyError
from hptransfer.io import write_yaml
from hptransfer.plan import TransferPlan, load_plan, precision_mismatch, save_plan
from hptransfer.tracking import find_study_run


@dataclass
class SweepOutcome:
    table: pd.DataFrame
    mlflow_run_id: str
    plot: Path


def coord_check_stage(study: StudyContext, *, widths: list[int] | None = None):
    from hptransfer.coordcheck import coord_check

    with study.lock():
        return coord_check(study, widths=widths)


def coord_check_depth_stage(study: StudyContext, *, depths: list[int] | None = None):
    """The coordinate check over depth (coordcheck_depth.py), when the spec or the caller names depths."""
    from hptransfer.coordcheck_depth import coord_check_depth

    with study.lock():
        return coord_check_depth(study, depths=depths)


def sweep_stage(study: StudyContext, *, restart: bool = False, log=print) -> SweepOutcome:
    from hptransfer.sweep.record import log_sweep, plot_sweep
    from hptransfer.sweep.runner import run_sweep
    from hptransfer.tracking import mlflow_or_later

    spec = study.require_spec()
    with study.lock():
        df, grid = run_sweep(study, restart=restart, log=log)
        write_yaml(study.paths.spec, spec.model_dump(mode="json"))  # the spec these results belong to
        plot = plot_sweep(df, spec, study.paths.sweep_png)
        run_id = mlflow_or_later(study, "the sweep's trials", lambda: log_sweep(study, df, grid, plot=plot), log)
        return SweepOutcome(df, run_id, plot)


def transfer_stage(study: StudyContext, *, sweep_run_id: str | None = None, out: str | Path | None = None):
    """The study's results table → its plan, written atomically once: to `out` when given (`hpt
    transfer --out`), else to the study folder's plan file. Returns the `TransferPlan`."""
    from hptransfer.transfer.engine import check_results_belong, file_hash, make_plan, read_results

    spec = study.require_spec()
    results = study.paths.sweep_results
    if not results.is_file():
        raise StudyError(
            f"{results} not found: no sweep has finished in {study.root}; run `hpt sweep SPEC "
            f"--study-dir {study.root}` (or `hpt run SPEC`) first"
        )
    table = read_results(results)
    check_results_belong(table, spec, study.sweep_hash, str(results))
    dp_evidence, dp_prov = _dp_sweep_evidence(study, spec)
    plan = make_plan(
        spec,
        table,
        provenance={
            "results_file_hash": file_hash(results),
            **({"mlflow_sweep_run_id": sweep_run_id} if sweep_run_id else {}),
            **dp_prov,
        },
        dp_evidence=dp_evidence,
    )
    with study.lock():
        path = save_plan(plan, out or study.paths.plan)
        from hptransfer.tracking import mlflow_or_later

        mlflow_or_later(study, "the plan", lambda: _log_plan(study, plan, path))
    return plan


def _dp_sweep_evidence(study: StudyContext, spec) -> tuple[object | None, dict]:
    """Rule `dp`: the study's DP sweep table (`hpt dp-sweep`) as the measured batch/LR rules'
    evidence, and its hash for the plan's provenance; (None, {}) when there is none."""
    path = study.paths.dp_sweep_results
    if spec.dp is None or spec.transfer.rule != "dp" or not path.is_file():
        return None, {}
    import dataclasses
    import json

    from hptransfer.dp.plan import evidence_from_sweep
    from hptransfer.transfer.engine import _dp_config, file_hash

    ev, prov = evidence_from_sweep(pd.read_csv(path), _dp_config(spec)), {"dp_sweep_results_hash": file_hash(path)}
    norms = study.paths.dp_grad_norms
    if norms.is_file():  # written by the same DP sweep (public sequences' per-example gradient norms)
        ev = dataclasses.replace(ev, grad_norms=json.loads(norms.read_text())["norms"])
        prov["dp_grad_norms_hash"] = file_hash(norms)
    return ev, prov


def _log_plan(study: StudyContext, plan: TransferPlan, path: Path) -> str | None:
    """The plan file and its headline numbers on the study's sweep run in MLflow, when there is one."""
    run_id = find_study_run(study.tracking_uri, study.experiment, study.root, "sweep")
    if run_id is None:
        return None
    tracker = study.tracker(run_id=run_id)
    d = plan.diagnostics
    tracker.log_artifact(path)
    tracker.log_params({"transfer_rule": plan.rule, "target_width": plan.target.width})
    metrics = {f"transfer_{k}": v for k, v in plan.hyperparameters.items()}
    metrics.update(
        {
            f"transfer_{k}": v
            for k, v in (("predicted_penalty", d.predicted_penalty), ("predicted_target_loss", d.predicted_target_loss))
            if v is not None
        }
    )
    if isinstance(d.fast_transfer, bool):
        metrics["transfer_fast"] = float(d.fast_transfer)
    tracker.log_metrics(metrics)
    return run_id


def train_stage(
    study: StudyContext,
    plan: Any = None,
    *,
    workers: int | None = None,
    gpus_per_worker: float | None = None,
    cpus_per_worker: float | None = None,
    resume: bool = False,
    restart: bool = False,
    log=print,
) -> dict:
    """The large run from a plan (default: the study's own); command-line scale knobs override the
    plan's train settings. Warnings (a precision other than the sweep's, a target worse than
    predicted) are printed and kept in the study's log file."""
    import logging

    from hptransfer import logs
    from hptransfer.train.runner import run_train
    from hptransfer.transfer.target_check import check_target

    plan = plan if isinstance(plan, TransferPlan) else load_plan(plan or study.paths.plan)
    knobs = {
        k: v
        for k, v in (("workers", workers), ("gpus_per_worker", gpus_per_worker), ("cpus_per_worker", cpus_per_worker))
        if v is not None
    }
    if knobs:
        plan = plan.model_copy(update={"train": plan.train.model_copy(update=knobs)})
    warnings = [w for w in [precision_mismatch(plan)] if w and plan.rule != "dp"]  # the private run is fp32
    if warnings:
        logs.attach(study.paths.log_file)  # the study's log file keeps them (the console shows `log`'s lines)
    for w in warnings:
        log(f"WARNING: {w}")
        logging.getLogger(__name__).warning("%s", w)
    with study.lock():  # a `dp` plan trains privately (run_train picks its recipe: train/private.py)
        metrics = run_train(study, plan, resume=resume, restart=restart, log=log)
    # A private run is not judged against the non-private ladder's prediction: DP noise costs loss.
    check = (
        check_target(plan.diagnostics, metrics.get("val_loss"))
        if plan.rule != "dp"
        else {"verdict": "unchecked", "messages": ["DP run: not compared with the non-private ladder's prediction"]}
    )
    metrics["target_check"] = check
    if warnings:
        metrics["warnings"] = warnings
    for m in check["messages"]:
        log(("WARNING: " if check["verdict"] not in ("ok", "unchecked") else "target check: ") + m)
    return metrics


def report_stage(study: StudyContext, *, log=print) -> Path:
    from hptransfer.report.html import write_report

    with study.lock():
        return write_report(study.root, study.tracking_uri, log=log)


def dp_sweep_stage(study: StudyContext, *, log=print, **options: Any) -> pd.DataFrame:
    """`hpt dp-sweep`: the DP fine-tuning sweep (`hptransfer.dp.sweep.run_dp_sweep`, whose keywords
    `options` are: task, width, epsilons, lrs, seeds, pretrain_width, restart), holding the lock."""
    from hptransfer.dp.sweep import run_dp_sweep

    with study.lock():
        return run_dp_sweep(study, log=log, **options)


def finished_run(study: StudyContext, plan: TransferPlan) -> dict | None:
    """The final metrics of the study's large run when train/ holds a finished one (status ok, its
    model handed off) of this very plan (provenance aside: a re-logged sweep has a new run id);
    else None."""
    import json

    p = study.paths.train
    try:
        final = json.loads(p.metrics.read_text()).get("final") or {}
        old = load_plan(p.plan)
    except Exception:  # none, torn or foreign: the run's own checks (train_stage) speak
        return None
    same = old.model_dump(exclude={"provenance"}) == plan.model_dump(exclude={"provenance"})
    handed_off = p.hf_model.is_dir() or plan.model.family == "mlp"  # mlp: no Hugging Face form
    return dict(final) if same and final.get("status") == "ok" and handed_off else None


def finetune_stage(study: StudyContext, *, log=print) -> dict:
    """The fine-tuning regime's private part (`dp.init_from: pretrain`; dp/finetune.py), after the
    pretraining large run: per DP sweep width the pretrained model and a DP sweep on the public
    tuning corpus from it (dp.tuning: public), the across-width check, the private plan from the narrowest width's sweep, and
    the private large run from the large run's handoff. Each step resumes: the sweeps keep their
    finished trials, pretrained models are kept, the private run continues from its checkpoint."""
    from hptransfer.dp import finetune as ft
    from hptransfer.dp.width import summary
    from hptransfer.io import write_json

    spec = study.require_spec()
    if spec.dp is None or not spec.dp.finetunes_pretrained:
        raise StudyError(f"spec {spec.name!r} is not a fine-tuning study (dp.init_from: pretrain)")
    pretrain_plan = load_plan(study.paths.plan)
    s = ft.sweep_settings(spec)
    if spec.dp.tuning == "private":
        return _private_tuning_finetune(study, spec, pretrain_plan, s, log=log)
    if len(s.lrs) < 2 and spec.dp.lr is None:
        log(
            "WARNING: dp.sweep.lrs has one LR and dp.lr is null: the private plan's LR will be the pretraining "
            "sweep's optimum moved by √(B/B_proxy), not one measured under DP; sweep ≥ 2 LRs or set dp.lr"
        )
    tables, sweeps = {}, {}
    with study.lock():
        for w in s.widths:
            folder = ft.pretrained_model(study, pretrain_plan, w, log=log)
            sweeps[w] = ft.sub_study(study, ft.tuning_spec(spec, folder), study.paths.private_sweep(w))
            log(
                f"dp-sweep: width {w}, from the model pretrained at width {w} ({folder}), on the public tuning corpus "
                f"{ft.tuning_corpus(spec).corpus!r} (dp.tuning: public; the private corpus is read by the private run alone)"
            )
            tables[w] = dp_sweep_stage(sweeps[w], width=w, epsilons=s.epsilons, lrs=s.lrs, seeds=s.seeds, log=log)
        check = ft.across_width(tables, s.tolerance) if len(s.widths) > 1 else None
        if check is not None:
            write_json(study.paths.dp_across_width, ft.plain_numbers(check))
            log(summary(check))
        pspec = ft.private_spec(spec, study.paths.train.hf_model)
        private = ft.sub_study(study, pspec, study.paths.private)
        plan = ft.private_plan(study, pspec, sweeps[s.widths[0]], s.widths[0], check)
        with private.lock():
            save_plan(plan, private.paths.plan)
        log(
            f"private plan (dp, settings from width {s.widths[0]}): width {plan.target.width} B={plan.target.batch_size} "
            f"T={plan.target.steps} C={plan.dp['clip']:.4g} lr={plan.hps.lr:.4g} σ={plan.dp['noise_multiplier']:.4g}"
        )
    out = _private_run(study, private, plan, spec, tuning=ft.tuning_corpus(spec), log=log)
    return {**out, "across_width": str(study.paths.dp_across_width) if check is not None else None}


def _private_tuning_finetune(study: StudyContext, spec: Any, pretrain_plan: Any, s: Any, *, log=print) -> dict:
    """dp.tuning: private (dp/tuning_run.py): the private tuning from the model pretrained at the one
    DP sweep width, then the private plan with the selected (B, lr, C) and the ε the tuning leaves, the
    private large run, and the ledger composing all three by RDP."""
    from hptransfer.dp import finetune as ft
    from hptransfer.dp.lm_task import dataset_size
    from hptransfer.dp.tuning_run import final_plan_spec, run_private_tuning

    width = s.widths[0]
    with study.lock():
        folder = ft.pretrained_model(study, pretrain_plan, width, log=log)
        tspec = ft.private_spec(spec, folder)
        log(
            f"private tuning: width {width}, from the model pretrained at width {width} ({folder}), on the PRIVATE corpus "
            f"{tspec.data.corpus!r} (dp.tuning: private: every read accounted within dp.epsilon={spec.dp.epsilon:g})"
        )
        selection = run_private_tuning(
            study.paths.private_tuning, tspec, spec.dp.private_tuning, s.lrs, width, seed=s.seeds[0], log=log
        )
        pspec = ft.private_spec(spec, study.paths.train.hf_model)
        fspec, info = final_plan_spec(pspec, selection, dataset_size(pspec))
        private = ft.sub_study(study, fspec, study.paths.private)
        plan = ft.private_plan_after_tuning(study, fspec, selection, width, info)
        with private.lock():
            save_plan(plan, private.paths.plan)
        log(
            f"private plan (dp, from the private tuning at width {width}): width {plan.target.width} B={plan.target.batch_size} "
            f"T={plan.target.steps} C={plan.dp['clip']:.4g} lr={plan.hps.lr:.4g} σ={plan.dp['noise_multiplier']:.4g} "
            f"(its own ε {info['run_epsilon']:.4g}; with the tuning {info['study_epsilon']:.4g} ≤ {spec.dp.epsilon:g})"
        )
    out = _private_run(study, private, plan, spec, selection=selection, log=log)
    return {**out, "across_width": None, "private_tuning": str(study.paths.private_tuning / "selection.json")}


def _private_run(
    study: StudyContext, private: StudyContext, plan: Any, spec: Any, *, tuning: Any = None, selection: Any = None, log=print
) -> dict:
    """Both modes' end: the private large run (or its finished record), the ledger (public: the one read
    of the private corpus; private: `selection`'s mechanisms composed with the run), the closing line."""
    metrics = finished_run(private, plan)
    if metrics is not None:
        log(f"private large run: already finished for this plan ({private.paths.train.metrics})")
    else:
        metrics = train_stage(private, plan, resume=True, log=log)
    ledger = _write_ledger(study, private, spec, metrics, tuning, selection=selection)
    metrics = {**metrics, "epsilon_total": ledger.total.epsilon}
    whole = (
        f"ε of the whole study {ledger.total.epsilon:.4g}"
        if selection is None
        else f"ε of the whole study, the private tuning included, {ledger.total.epsilon:.4g} ≤ {spec.dp.epsilon:g}"
    )
    log(
        f"private large run: val_loss {metrics.get('val_loss')} (from {metrics.get('initial_val_loss')}), "
        f"ε spent {metrics.get('epsilon_spent')} ≤ {metrics.get('target_epsilon')}; {whole} "
        f"(δ {ledger.total.delta:.3g}; {study.paths.privacy_ledger})"
    )
    return {
        "plan": str(private.paths.plan),
        "train_metrics": str(private.paths.train.metrics),
        "final": {
            k: metrics.get(k) for k in ("val_loss", "initial_val_loss", "epsilon_spent", "epsilon_total", "target_epsilon")
        },
        "privacy_ledger": str(study.paths.privacy_ledger),
    }


def _write_ledger(study: StudyContext, private: StudyContext, spec: Any, final: dict, tuning: Any, selection: Any = None):
    """private/privacy_ledger.json from the private run's final metrics, and `epsilon_total` (the
    ledger's total) beside `epsilon_spent` in train_metrics.json's final block (both atomic)."""
    import json

    from hptransfer.dp.ledger import finetune_ledger, private_tuning_ledger, write_ledger
    from hptransfer.io import write_json

    ledger = finetune_ledger(spec, final, tuning) if selection is None else private_tuning_ledger(spec, final, selection)
    write_ledger(study.paths.privacy_ledger, ledger)
    path = private.paths.train.metrics
    doc = json.loads(path.read_text())
    doc["final"] = {**doc["final"], "epsilon_total": ledger.total.epsilon}
    write_json(path, doc)
    if run_id := final.get("mlflow_run_id"):  # the private run's MLflow run: the total beside epsilon_spent
        try:
            from mlflow import MlflowClient

            client = MlflowClient(tracking_uri=private.tracking_uri)
            client.log_metric(run_id, "epsilon_total", ledger.total.epsilon)
            client.log_artifact(run_id, str(study.paths.privacy_ledger))
        except Exception as e:  # the ledger on disk is the record; MLflow being down must not fail the study
            print(f"WARNING: privacy ledger not logged to MLflow run {run_id} ({type(e).__name__}: {e})")
    return ledger


def run_study(
    study: StudyContext,
    *,
    restart_sweep: bool = False,
    restart_train: bool = False,
    skip_coord_check: bool = False,
    until: str | None = None,
    log=print,
) -> dict:
    """Everything, end to end, on one Ray, holding the study's lock. Returns where things are.
    A re-run resumes: the sweep keeps its finished trials, the large run continues from its latest
    checkpoint (or finds it finished); `restart_sweep` / `restart_train` start that stage over,
    moving what it replaces aside. `until="transfer"` stops after the plan (and writes the report):
    for a large run in another trainer (`hpt handoff`), or to look at the plan first."""
    if until not in (None, "transfer", "train"):
        raise ValueError(f"until={until!r}: use 'transfer' (stop after the plan) or 'train' (everything; the default)")
    from hptransfer.coordcheck import describe

    t0, times = time.time(), {}
    spec = study.require_spec()
    with study.lock(), study.ray_session():
        if not skip_coord_check:
            log(describe(coord_check_stage(study)))
            times["coord_check_s"] = time.time() - t0
        t = time.time()
        sweep = sweep_stage(study, restart=restart_sweep, log=log)
        times["sweep_s"] = time.time() - t
        plan = transfer_stage(study, sweep_run_id=sweep.mlflow_run_id)
        log(
            f"transfer ({plan.rule}): target width {plan.target.width} gets lr={plan.hps.lr:.4g}"
            + "".join(f"\n  warning: {w}" for w in plan.diagnostics.warnings)
        )
        if until == "transfer":
            report = report_stage(study, log=log)
            times["total_s"] = time.time() - t0
            log(f"stopped after the plan (--until transfer): {study.paths.plan}; `hpt run` again trains it")
            return _where(study, report, None, times)
        t = time.time()
        # A re-run continues an interrupted large run instead of refusing, and keeps one that finished
        # this very plan (status ok, handed off) without starting Ray Train and DeepSpeed again.
        finetunes = spec.dp is not None and spec.dp.finetunes_pretrained
        metrics = finished_run(study, plan) if not restart_train else None
        if metrics is not None:
            log(f"large run: already finished for this plan ({study.paths.train.metrics})")
            if study.paths.train.mlflow_unsent.exists():  # its MLflow records, if an outage held them back
                from hptransfer.train.runner import deliver_unsent

                deliver_unsent(study, log)
        else:
            metrics = train_stage(study, plan, resume=not restart_train, restart=restart_train, log=log)
        times["train_s"] = time.time() - t
        private = None
        if finetunes:  # then fine-tune privately from its handoff
            t = time.time()
            private = finetune_stage(study, log=log)
            times["private_s"] = time.time() - t
        report = report_stage(study, log=log)
    times["total_s"] = time.time() - t0
    return {**_where(study, report, metrics, times), **({"private": private} if private else {})}


def _where(study: StudyContext, report: Path, metrics: dict | None, times: dict) -> dict:
    """What `run_study` returns: where things are (no large run: no train_metrics, empty final)."""
    p = study.paths
    return {
        "study_dir": str(study.root),
        "plan": str(p.plan),
        "results": str(p.sweep_results),
        "train_metrics": str(p.train.metrics) if metrics is not None else None,
        "report": str(report),
        "tracking_uri": study.tracking_uri,
        "final": {k: metrics.get(k) for k in ("train_loss", "val_loss", "tokens_per_s")} if metrics is not None else {},
        "times": times,
    }


class Study(StudyContext):
    """A study with its stages as methods, for notebooks (each returns its artifact)."""

    def coord_check(self, widths: list[int] | None = None):
        return coord_check_stage(self, widths=widths)

    def sweep(self, *, restart: bool = False) -> pd.DataFrame:
        return sweep_stage(self, restart=restart).table

    def transfer(self) -> TransferPlan:
        return transfer_stage(self)

    def train(self, plan=None, **knobs: Any) -> dict:
        return train_stage(self, plan, **knobs)

    def report(self) -> Path:
        return report_stage(self)

    def dp_sweep(self, **options: Any) -> pd.DataFrame:
        return dp_sweep_stage(self, **options)

    def finetune(self) -> dict:
        return finetune_stage(self)

    def handoff(self, out: str | Path | None = None, **options: Any):
        """`hpt handoff` of the study's plan into `out` (default: <study>/handoff); a HandoffResult."""
        from hptransfer.handoff.write import write_handoff

        return write_handoff(self.paths.plan, out if out is not None else self.root / "handoff", **options)

    def run(self, **kw: Any) -> dict:
        return run_study(self, **kw)
