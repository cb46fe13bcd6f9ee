"""Sweep results table → per-width optima → rule → `TransferPlan` (+ diagnostics and baselines).

`make_plan` is a pure function of the spec and the table; reading files and writing the plan are
the pipeline's (`pipeline.transfer_stage`) and the CLI's.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from hptransfer.errors import ResultsError  # noqa: F401  (re-exported: tests and users import it from here)
from hptransfer.hyperparameters import LOG_SCALE
from hptransfer.models.optim import FINAL_LR_FRACTION
from hptransfer.plan import TargetShape, TransferPlan
from hptransfer.plan_diagnostics import Diagnostics
from hptransfer.spec import StudySpec, spec_hash
from hptransfer.transfer.axes import (
    AXES,
    at_base,
    axis_arms,
    axis_columns,
    axis_law,
    axis_warnings,
    critical_batch,
    tau_weight_decay,
)
from hptransfer.transfer.baselines import baselines_for
from hptransfer.transfer.diagnostics import diagnose, joint_sections
from hptransfer.transfer.formula_prior import combine, ladder_log_sd
from hptransfer.transfer.heuristics import BATCH_HEURISTIC
from hptransfer.transfer.results import (  # noqa: F401  (re-exported: the table's functions live in results.py)
    ID_COLUMNS,
    STATUSES,
    check_results,
    check_results_belong,
    file_hash,
    optima_by_width,
    read_results,
    standalone_spec,
    table_hash,
    tuned_columns,
)
from hptransfer.transfer.rules import RULES, Evidence, Target


def _clean(obj):
    """numpy scalars → Python, non-finite floats → None: the plan must be plain YAML/JSON."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def make_plan(
    spec: StudySpec, results: pd.DataFrame, provenance: dict | None = None, dp_evidence: object | None = None
) -> TransferPlan:
    """`dp_evidence`: rule `dp` only, the study's DP sweep as `dp.plan.DPEvidence` (its measured batch
    and LR rules); None: the unmeasured ones."""
    tuned = list(spec.sweep.grid)
    results = check_results(results, tuned, target_width=spec.target.width)
    # The width ladder is the rows at the base (steps, batch_size, depth); the rest are axis arms.
    base = {"steps": spec.sweep.steps, "batch_size": spec.sweep.batch_size, "depth": spec.model.depth}
    full = axis_columns(results, base)
    ladder = full[at_base(full, base)]
    # µP: the widths share one optimum, so a searcher's scattered points are fitted over all of them.
    fits = optima_by_width(ladder, tuned, pool_widths=spec.model.parametrization == "mup")
    skipped = sorted(set(ladder["width"].unique()) - set(fits))
    ev = Evidence(
        optima={w: {hp: f.value for hp, f in per.items()} for w, per in fits.items()},
        fixed=dict(spec.sweep.fixed),
        base_width=spec.base_width,
        parametrization=spec.model.parametrization,
        log_se={w: {hp: f.log_se for hp, f in per.items()} for w, per in fits.items()},
        censored={w: {hp: f.censored for hp, f in per.items()} for w, per in fits.items()},
    )
    tgt = Target(
        width=spec.target.width,
        steps=spec.target_steps,
        batch_size=spec.target_batch_size,
        proxy_steps=spec.sweep.steps,
        proxy_batch_size=spec.sweep.batch_size,
        warmup_timescale=spec.transfer.warmup_timescale,
        dp=_dp_config(spec),
        dp_evidence=dp_evidence,
    )
    rule = spec.transfer.rule
    res = RULES[rule](ev, tgt)
    # A rule may choose the target's batch and steps itself (`dp`: B and T from the privacy budget).
    target_batch = res.target_batch_size or spec.target_batch_size
    target_steps = res.target_steps or spec.target_steps
    # The rule's width transfer alone (proxy batch/steps): what the predicted penalty is about.
    width_only = RULES[rule](ev, replace(tgt, steps=tgt.proxy_steps, batch_size=tgt.proxy_batch_size))
    diag = diagnose(
        fits,
        tuned,
        LOG_SCALE,
        rule,
        spec.model.parametrization,
        res.source_width or max(fits),
        spec.target.width,
        width_only.hyperparameters,
    )
    warnings = list(res.warnings) + diag.warnings
    hyperparameters, heuristics = dict(res.hyperparameters), list(res.heuristics)
    axes_section = None
    if rule != "dp" and "lr" in tuned:  # `dp` sets its own batch, steps and LR
        axes_section, hyperparameters, heuristics, more = _transfer_axes(
            spec, full, base, tuned, width_only, hyperparameters, heuristics, target_steps, target_batch
        )
        warnings += more
    if skipped:
        warnings.append(f"widths {skipped} have no ok trial with a finite loss and were left out")
    if heuristics:
        warnings.append(
            "batch size or steps differ between sweep and target: heuristics applied "
            f"({', '.join(h['name'] for h in heuristics)}); see `heuristics`"
        )
    m = spec.model.at_depth(spec.target.depth)  # the depth rule stays relative to the ladder's depth
    hidden_mult = min(g.get("lr", 1.0) for g in res.param_group_multipliers.values()) if res.param_group_multipliers else 1.0
    baseline_args = (m.family, spec.target.width, m.depth, m.ffn_mult, target_steps, target_batch, m.seq_len)
    combined, notes = None, list(res.notes)
    fp = spec.transfer.formula_prior
    if fp is not None and rule != "dp" and "lr" in tuned and m.family == "llama":
        combined = _formula_prior(
            fp, diag, res.source_width or max(fits), axes_section, hyperparameters["lr"], hidden_mult, baseline_args
        )
        if combined.get("lr") is not None:
            hyperparameters["lr"] = combined["lr"]
            heuristics.append(
                {
                    "name": "formula-prior-lr",
                    "kind": "prior",
                    "factor": combined["factor"],
                    "applies_to": "lr",
                    "why": f"the ladder's lr (σ {combined['ladder_log_sd']:.2g} in log) under {fp.formula}'s as a prior "
                    f"(σ {fp.log_sd:.2g}): weight {combined['weight_ladder']:.2f} on the ladder",
                    "source": "transfer/formula_prior.py; docs/RESEARCH.md",
                }
            )
        notes.append(combined["said"])
    joint = joint_sections(fits, tuned, hyperparameters, res, target_steps, spec.sweep.steps)
    warnings += joint.pop("warnings", [])
    counts = ladder.groupby(["width", "status"]).size().unstack(fill_value=0)
    hidden_lr = hyperparameters["lr"] * hidden_mult
    return TransferPlan(
        study=spec.name,
        rule=rule,
        model=m,
        base_width=spec.base_width,
        target=TargetShape(width=spec.target.width, steps=target_steps, batch_size=target_batch, seq_len=m.seq_len),
        hyperparameters={k: float(v) for k, v in hyperparameters.items()},
        param_group_multipliers=res.param_group_multipliers,
        schedule=_clean(
            {
                **(res.schedule or {"kind": "none"}),
                "base": {
                    "warmup": "linear",
                    "warmup_steps": res.hyperparameters.get("warmup_steps", 0.0),
                    "decay": "cosine",
                    "final_lr_fraction": FINAL_LR_FRACTION,
                },
            }
        ),
        heuristics=_clean(heuristics),
        baselines=_clean(
            {**baselines_for(*baseline_args, plan_lr=hidden_lr), **({"formula_prior": combined} if combined else {})}
        ),
        data=spec.data,
        train=spec.train,
        sweep_precision=spec.sweep.precision,
        seed=spec.seed,
        # Width keys are strings: that is what YAML/JSON give back, so a loaded plan equals this one.
        diagnostics=Diagnostics.measured(
            {
                **diag.model_dump(),
                "source_width": res.source_width,
                "trials_by_width": {str(w): {str(k): int(v) for k, v in row.items()} for w, row in counts.iterrows()},
                "notes": notes,
                "warnings": warnings,
                **joint,  # empty on a grid: its plan is as before
            }
        ),
        provenance=_clean({"spec_hash": spec_hash(spec), "results_hash": table_hash(results), **(provenance or {})}),
        axes=_clean(axes_section),
        **res.extras,
    )


def _formula_prior(fp, diag, source_width: int, axes_section, lr: float, hidden_mult: float, baseline_args) -> dict:
    """The plan's lr as the posterior of the ladder's under the formula's (transfer/formula_prior.py),
    compared where the formula speaks: the hidden matrices' LR at the target (lr × hidden_mult)."""
    formula_lr = baselines_for(*baseline_args)[fp.formula]["lr"]
    src = (diag.optimum_by_width.get(str(source_width)) or {}).get("lr")
    out: dict = {"formula": fp.formula, "formula_lr": formula_lr, "formula_log_sd": fp.log_sd, "ladder_lr": lr}
    out["ladder_hidden_lr"] = lr * hidden_mult
    if src is not None and src.censored is not None:
        out["said"] = (
            f"lr not combined with {fp.formula}'s: the ladder's optimum at width {source_width} is a bound "
            f"({src.censored}), not a point with an error; the ladder's value is kept"
        )
        return out
    width_rms = (
        math.hypot(diag.predicted_penalty_bias, diag.predicted_penalty_se)
        if diag.predicted_penalty_bias is not None and diag.predicted_penalty_se is not None
        else None
    )
    laws = (axes_section or {}).get("laws") or {}
    sd, parts = ladder_log_sd(width_rms, src.log_se if src is not None else None, laws)
    if sd is None:
        out["said"] = f"lr not combined with {fp.formula}'s: the ladder's estimate has no error to weigh it by"
        return out
    post = combine(lr * hidden_mult, sd, formula_lr, fp.log_sd)
    out.update(
        ladder_log_sd=sd,
        ladder_log_sd_parts=parts,
        weight_ladder=post["weight_ladder"],
        posterior_log_sd=post["log_sd"],
        factor=post["factor"],
        lr=lr * post["factor"],
        hidden_lr=post["lr"],
    )
    out["said"] = (
        f"lr {lr:.4g} (ladder, σ {sd:.2g} in log η) combined with {fp.formula}'s {formula_lr / hidden_mult:.4g} "
        f"(σ {fp.log_sd:.2g}, transfer.formula_prior) as a prior: {out['lr']:.4g}, weight {post['weight_ladder']:.2f} on the ladder"
    )
    return out


HOLD_PRODUCT_RULES = ("mup-independent-wd", "sp-warmup")  # rules that hold η·λ (rules._finish hold_product)


def _depth_warning(spec, arms, base, target_depth: int) -> str | None:
    """A target deeper than every depth the ladder ran, under standard residuals: nothing carries the
    LR across depth there (the residual stream's update grows ∝ depth), so say what to do."""
    seen = [base["depth"], *(arms["depth"][1]["depth"].tolist() if "depth" in arms else [])]
    if spec.model.depth_parametrization != "none" or target_depth <= max(seen):
        return None
    return (
        f"target depth {target_depth} is deeper than every depth the ladder ran (max {max(seen)}) under "
        "model.depth_parametrization: none: the optimal LR of standard residuals drifts with depth; set "
        "depth_parametrization: completep (and base_depth) and sweep again, or sweep sweep.axes.depth up to the target"
    )


def _transfer_axes(spec, full, base, tuned, width_only, hps, heuristics, target_steps, target_batch):
    """The LR across steps, batch size and depth (transfer/axes.py): each axis's law, composed with
    the width rule's LR at the base point: η = η_width · Π_a factor_a. Replaces the √B heuristic
    (the batch law's prior is the same rule). Returns (plan `axes` section, hyperparameters,
    heuristics, warnings); the section is None when every axis is at the base and none was swept."""
    target = {"steps": target_steps, "batch_size": target_batch, "depth": spec.target_depth}
    arms = axis_arms(full, base)
    if not arms and all(target[a] == base[a] for a in AXES):
        return None, hps, heuristics, []
    laws, warnings = {}, []
    for axis in AXES:
        if axis in arms:
            width, rows = arms[axis]
            per = optima_by_width(rows.assign(width=rows[axis]), tuned)
            vals = sorted(per)
            law = axis_law(
                axis,
                vals,
                [math.log(per[v]["lr"].value) for v in vals],
                [per[v]["lr"].log_se for v in vals],
                [per[v]["lr"].censored for v in vals],
                base[axis],
                target[axis],
            )
            law.update(width=width, optimum={str(v): per[v]["lr"].value for v in vals})
            law["optimum_se"] = {str(v): per[v]["lr"].log_se for v in vals}
            law["censored"] = {str(v): per[v]["lr"].censored for v in vals if per[v]["lr"].censored}
        elif target[axis] != base[axis]:
            law = axis_law(axis, [base[axis]], [0.0], [None], [None], base[axis], target[axis])
        else:
            continue
        laws[axis] = law
        warnings += axis_warnings(law)
    if (w := _depth_warning(spec, arms, base, target["depth"])) is not None:
        warnings.append(w)
    lr_width = width_only.hyperparameters["lr"]
    factor = math.prod(law["factor"] for law in laws.values())
    hps = {**hps, "lr": lr_width * factor}
    # The rule's batch heuristic is the batch law's prior (the same exponent, transfer/priors.py): kept
    # as the record when the batch was not swept.
    fitted = {a for a, law in laws.items() if law["basis"] == "fit"}
    drop = {"hold-lr-wd-product"} | ({BATCH_HEURISTIC} if "batch_size" in fitted else set())
    heuristics = [h for h in heuristics if h["name"] not in drop]
    for a, law in laws.items():
        if a != "batch_size" and law["basis"] == "prior" and law["factor"] != 1.0:
            heuristics.append(
                {
                    "name": f"{a}-prior-lr",
                    "kind": "prior",
                    "factor": law["factor"],
                    "applies_to": "lr",
                    "why": f"{a} {base[a]} → {target[a]}: lr × ({target[a]}/{base[a]})^{law['exponent']:+g}, not measured",
                    "source": law["prior_source"],
                }
            )
    wd0 = width_only.hyperparameters.get("weight_decay", 0.0)
    if spec.transfer.weight_decay == "tau":
        if wd0 > 0:
            wd = tau_weight_decay(wd0, lr_width, base["steps"], hps["lr"], target_steps)
            heuristics.append(
                {
                    "name": "tau-weight-decay",
                    "kind": "rule",
                    "factor": wd / wd0,
                    "applies_to": "weight_decay",
                    "why": f"lr·weight_decay·steps held: {lr_width:.4g}·{wd0:.4g}·{base['steps']} at the ladder",
                    "source": "Wang & Aitchison, arXiv 2405.13698 (τ_epoch = B/(η·λ·D)); docs/RESEARCH.md",
                }
            )
            hps["weight_decay"] = wd
        else:
            warnings.append("transfer.weight_decay: tau needs weight_decay > 0 on the ladder; weight decay left at 0")
    elif spec.transfer.rule in HOLD_PRODUCT_RULES and wd0 > 0 and hps["lr"] != lr_width:
        hps["weight_decay"] = wd0 * lr_width / hps["lr"]  # the rule holds η·λ: weight decay moves against the LR
        heuristics.append(
            {
                "name": "hold-lr-wd-product",
                "kind": "heuristic",
                "factor": lr_width / hps["lr"],
                "applies_to": "weight_decay",
                "why": "lr moved by the axis laws; η·λ held constant",
                "source": "Kosson et al. 2025, arXiv 2510.19093",
            }
        )
    cb = critical_batch(full)
    if cb is not None and target_batch > cb["b_simple"]:
        warnings.append(
            f"the target batch {target_batch} is beyond the critical batch B_simple ≈ {cb['b_simple']:.3g} sequences "
            f"(range {cb['range'][0]:.3g}–{cb['range'][1]:.3g} over {cb['n_trials']} trials): past it a larger batch buys "
            "little and the batch law's √B no longer holds; use a batch near it or sweep sweep.axes.batch_size past it"
        )
    section = {
        "base": base,
        "target": target,
        "width_rule_lr": lr_width,
        "factor": factor,
        "lr": hps["lr"],
        "laws": laws,
        "critical_batch": cb,
        "formula": "lr = width_rule_lr × Π_axis (target / base)^exponent",
    }
    return section, hps, heuristics, warnings


def _dp_config(spec: StudySpec):
    """The spec's `dp:` block with N filled in from the data when it is null: the number of private
    sequences the corpus offers (`dp.lm.sequence_count`). Re-validated, so δ ≥ 1/N and B > N are
    reported as DP errors naming the field."""
    from pydantic import ValidationError

    from hptransfer.errors import DPError, problems_from_validation

    cfg = spec.dp
    if cfg is None or spec.transfer.rule != "dp" or cfg.dataset_size is not None:
        return cfg
    from hptransfer.dp.lm import sequence_count

    n = sequence_count(spec.data, spec.model.seq_len)
    try:
        return cfg.with_dataset_size(n)
    except ValidationError as e:
        raise DPError(
            f"dp (dataset_size derived from the data: N = {n} sequences of {spec.model.seq_len + 1} tokens)",
            problems_from_validation(e, prefix="dp"),
        ) from None
