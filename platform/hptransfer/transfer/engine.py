"""Sweep results table → per-width optima → rule → `TransferPlan` (+ diagnostics and baselines).

`make_plan` is a pure function of the spec and the table; reading files and writing the plan are
the pipeline's (`pipeline.transfer_stage`) and the CLI's.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from hptransfer.errors import ResultsError
from hptransfer.hyperparameters import LOG_SCALE, TUNABLE
from hptransfer.models.optim import FINAL_LR_FRACTION
from hptransfer.plan import TargetShape, TransferPlan
from hptransfer.plan_diagnostics import Diagnostics
from hptransfer.spec import MAX_SEED, MAX_WIDTH, RULE_TRAINING, StudySpec, parse_spec, rule_training, spec_hash
from hptransfer.spec import sweep_hash as sweep_hash_of
from hptransfer.transfer.axes import (
    AXES,
    at_base,
    axis_arms,
    axis_columns,
    axis_law,
    axis_warnings,
    base_point,
    critical_batch,
    tau_weight_decay,
)
from hptransfer.transfer.baselines import baselines_for
from hptransfer.transfer.diagnostics import diagnose, joint_sections
from hptransfer.transfer.joint import is_grid, joint_optima_by_width
from hptransfer.transfer.optimum import OptimumFit, fit_optimum
from hptransfer.transfer.rules import RULES, Evidence, Target

STATUSES = {"ok", "diverged", "failed", "stopped"}


def check_results(results: pd.DataFrame, tuned: list[str], source: str = "results") -> pd.DataFrame:
    """Validate a results table against the contract and return a normalised copy.

    Contract: one row per trial; `width` (int), one column per tuned hyperparameter, `seed`,
    `val_loss` (NaN when not ok), `status` in {ok, diverged, failed, stopped}; extra columns are
    ignored. A missing `seed` column means one seed (0). An `ok` row with a non-finite loss
    diverged (NaN/inf loss is what divergence looks like)."""
    problems = []
    df = results.reset_index(drop=True)  # a concatenated table may repeat index labels
    if "seed" not in df.columns:
        df["seed"] = 0
    missing = [c for c in ("width", "val_loss", "status", *tuned) if c not in df.columns]
    if missing:
        have = ", ".join(map(str, df.columns))
        problems.append(
            f"missing column(s) {missing}; the table has [{have}]. Rename your columns: "
            "`width`, `val_loss`, `status` and one per tuned hyperparameter "
            f"(one of {sorted(TUNABLE)})"
        )
        raise ResultsError(source, problems)
    if df.empty:
        raise ResultsError(source, ["the table has no rows; run the sweep first"])
    width = pd.to_numeric(df["width"], errors="coerce")
    bad = df.loc[~np.isfinite(width) | (width <= 0) | (width != width.round()) | (width > MAX_WIDTH), "width"]
    if len(bad):
        problems.append(f"column `width` must hold positive integers up to {MAX_WIDTH:,}, got {bad.unique()[:5].tolist()}")
    seed = pd.to_numeric(df["seed"], errors="coerce")
    bad = df.loc[~np.isfinite(seed) | (seed != seed.round()) | (seed < 0) | (seed > MAX_SEED), "seed"]
    if len(bad):
        problems.append(
            f"column `seed` must hold integers 0..{MAX_SEED} (one per trial; drop the column for one "
            f"seed), got {bad.unique()[:5].tolist()}"
        )
    # an empty cell stays NaN through astype(str) on pandas ≥ 3: name it, so it is reported, not sorted against strings
    df["status"] = df["status"].fillna("<empty>").astype(str).str.strip().str.lower()
    unknown = sorted(set(df["status"]) - STATUSES)
    if unknown:
        problems.append(f"column `status` has unknown value(s) {unknown}; allowed: {sorted(STATUSES)}")
    loss = pd.to_numeric(df["val_loss"], errors="coerce")
    if loss.isna().sum() > df["val_loss"].isna().sum():
        problems.append(
            "column `val_loss` has non-numeric entries; use a number, or leave it empty (NaN) when the trial was not ok"
        )
    for hp in tuned:
        v = pd.to_numeric(df[hp], errors="coerce")
        if v.isna().any():
            problems.append(
                f"column `{hp}` has empty or non-numeric entries in {int(v.isna().sum())} row(s); "
                "every trial needs its hyperparameter value"
            )
        elif hp in LOG_SCALE and (v <= 0).any():
            problems.append(f"column `{hp}` must be > 0 (fitted on a log scale), got {sorted(v[v <= 0].unique())[:5]}")
    for axis in AXES:  # optional columns of arms beyond the width ladder (transfer/axes.py)
        if axis in df.columns:
            v = pd.to_numeric(df[axis], errors="coerce")
            bad = df.loc[v.notna() & (~np.isfinite(v) | (v <= 0) | (v != v.round())), axis]
            if len(bad) or (v.isna() & df[axis].notna()).any():
                problems.append(
                    f"column `{axis}` must hold positive integers (empty: the ladder's own {axis}), got "
                    f"{df.loc[(v.isna() & df[axis].notna()) | v.index.isin(bad.index), axis].unique()[:5].tolist()}"
                )
    for hp in tuned:
        v = pd.to_numeric(df[hp], errors="coerce")
        if hp in df.columns and (~np.isfinite(v.dropna())).any():
            problems.append(f"column `{hp}` has non-finite values (inf); every trial needs a finite value")
    if problems:
        raise ResultsError(source, problems)
    df["width"] = width.astype(int)
    df["seed"] = seed.astype(int)
    df["val_loss"] = loss.astype(float)
    for hp in tuned:
        df[hp] = pd.to_numeric(df[hp]).astype(float)
    df.loc[(df["status"] == "ok") & ~np.isfinite(df["val_loss"]), "status"] = "diverged"
    good = df[(df["status"] == "ok") & np.isfinite(df["val_loss"])]
    if good.empty:
        problems.append(
            f"no trial has status ok and a finite val_loss (statuses: "
            f"{df['status'].value_counts().to_dict()}); fix the sweep (lower the LR grid) and rerun"
        )
    elif good["width"].nunique() < 2:
        problems.append(
            f"only one width ({good['width'].unique().tolist()}) has a finite loss; transfer needs "
            "a trend: sweep at least 2 widths (3+ to judge drift)"
        )
    if problems:
        raise ResultsError(source, problems)
    return df


def check_results_belong(results: pd.DataFrame, spec: StudySpec, sweep_hash: str | None, source: str) -> None:
    """A study's table must come from its spec: same sweep (the `spec_hash` column the sweep writes:
    spec.sweep_hash, which includes what the rule changes in training) and only widths and grid
    values the spec has. Raises ResultsError listing every mismatch.

    The rows carry nothing else that says how they were trained, so the hash is what binds them to
    µP's weight-decay scaling: a table whose hash is this spec's under the other scaling was trained
    the other way, and a plan from it is refused with the fix."""
    problems = []
    if "spec_hash" in results.columns and sweep_hash is not None:
        found = sorted({str(h) for h in results["spec_hash"].dropna().unique()} - {sweep_hash})
        trained = _trained_otherwise(spec, found)
        if trained:
            problems.append(trained)
        elif found:
            problems.append(
                f"the table comes from another sweep (spec_hash {found}, this spec's is {sweep_hash}); rerun "
                "`hpt sweep` with this spec (add --restart to replace the old results) or restore the old spec"
            )
    # (a missing or non-numeric `width` column is check_results' to report, with the other problems)
    widths = pd.to_numeric(results["width"], errors="coerce") if "width" in results.columns else pd.Series(dtype=float)
    extra = sorted({int(w) for w in widths[np.isfinite(widths)].unique()} - set(spec.sweep.widths))
    if extra:
        problems.append(f"widths {extra} are not in sweep.widths {spec.sweep.widths}; the table belongs to another spec")
    for hp, values in spec.sweep.grid.items():
        if hp not in results.columns:
            continue
        col = pd.to_numeric(results[hp], errors="coerce").dropna()
        if spec.sweep.search == "optuna":  # a box [low, high], not grid values
            lo, hi = values[0] * (1 - 1e-9), values[1] * (1 + 1e-9)
            off = sorted({float(v) for v in col.unique() if not lo <= v <= hi})
            if off:
                problems.append(f"column `{hp}` has values {off[:5]} outside the box sweep.grid.{hp} {values}")
            continue
        off = sorted({float(v) for v in col.unique() if not any(np.isclose(v, g, rtol=1e-9, atol=0) for g in values)})
        if off:
            problems.append(f"column `{hp}` has values {off[:5]} that are not in sweep.grid.{hp} {values}")
    if problems:
        raise ResultsError(source, problems)


def _trained_otherwise(spec: StudySpec, hashes: list[str]) -> str | None:
    """The problem to report when `hashes` are this spec's sweep under another weight-decay scaling."""
    mine = rule_training(spec.transfer.rule).under(spec.model.parametrization)
    for other in {t for t in RULE_TRAINING.values() if t != mine}:
        h = sweep_hash_of(spec, other)
        if h not in hashes:
            continue
        s, theirs = mine.weight_decay_scaling, other.weight_decay_scaling
        rules = [r for r, t in RULE_TRAINING.items() if t == other and (r != "dp" or spec.dp is not None)]
        legacy = "; so does a `mup-standard-wd` sweep made before the scaling entered the hash" if theirs == "independent" else ""
        return (
            f"the table's trials were trained with µP's {theirs} weight-decay scaling (spec_hash {h}{legacy}), "
            f"but transfer.rule `{spec.transfer.rule}` trains with {s} scaling: a plan would assume trials the "
            f"sweep did not run. Re-sweep with this rule (`hpt sweep SPEC --study-dir DIR --restart`), or choose "
            f"a rule with {theirs} scaling ({', '.join(rules)})"
        )
    return None


def optima_by_width(results: pd.DataFrame, tuned: list[str]) -> dict[int, dict[str, OptimumFit]]:
    """For each width and tuned hyperparameter, the optimum with the others at their best grid point.

    With one tuned hyperparameter this is the plain 1-D fit; with several, each is fitted along its
    own axis through the best grid point (a coordinate-wise estimate, stated as such). A table whose
    points are not a grid (`joint.is_grid`) gets the joint optimum instead (`joint.joint_optimum`). `stopped`
    (early-stopped) and `failed` trials are left out of the fit; `diverged` ones inform it (too high).
    Widths without one finite ok loss are skipped."""
    out: dict[int, dict[str, OptimumFit]] = {}
    results = results.reset_index(drop=True)
    if not is_grid(results, tuned):  # points from a searcher: the joint local quadratic (transfer/joint.py)
        return joint_optima_by_width(results, tuned)
    status = results["status"].astype(str).str.lower()
    diverged_all = (status == "diverged") | ((status == "ok") & ~np.isfinite(results["val_loss"].astype(float)))
    for width, g in results.groupby("width"):
        ok = (status.loc[g.index] == "ok") & np.isfinite(g["val_loss"].astype(float))
        if not ok.any():
            continue
        loss = g["val_loss"].where(ok)
        # The slices go through the seed-averaged best grid point, not the luckiest single trial.
        best_row = g[ok].groupby(tuned)["val_loss"].mean().idxmin()
        best_row = dict(zip(tuned, best_row if isinstance(best_row, tuple) else (best_row,)))
        keep = ok | diverged_all.loc[g.index]
        fits = {}
        for hp in tuned:
            sel = g[keep]
            for other in tuned:
                if other != hp:
                    sel = sel[np.isclose(sel[other], best_row[other])]
            fits[hp] = fit_optimum(
                sel[hp].to_numpy(float),
                loss.loc[sel.index].to_numpy(float),
                hp in LOG_SCALE,
                diverged=diverged_all.loc[sel.index].to_numpy(),
            )
        out[int(width)] = fits
    return out


def file_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def table_hash(results: pd.DataFrame) -> str:
    return hashlib.sha256(pd.util.hash_pandas_object(results, index=False).values.tobytes()).hexdigest()[:16]


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
    results = check_results(results, tuned)
    # The width ladder is the rows at the base (steps, batch_size, depth); the rest are axis arms.
    base = {"steps": spec.sweep.steps, "batch_size": spec.sweep.batch_size, "depth": spec.model.depth}
    full = axis_columns(results, base)
    ladder = full[at_base(full, base)]
    fits = optima_by_width(ladder, tuned)
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
    joint = joint_sections(fits, tuned, hyperparameters, res, target_steps, spec.sweep.steps)
    warnings += joint.pop("warnings", [])
    counts = ladder.groupby(["width", "status"]).size().unstack(fill_value=0)
    hidden_lr = (
        hyperparameters["lr"] * min(g.get("lr", 1.0) for g in res.param_group_multipliers.values())
        if res.param_group_multipliers
        else hyperparameters["lr"]
    )
    m = spec.model.at_depth(spec.target.depth)  # the depth rule stays relative to the ladder's depth
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
            baselines_for(
                m.family, spec.target.width, m.depth, m.ffn_mult, target_steps, target_batch, m.seq_len, plan_lr=hidden_lr
            )
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
                "notes": res.notes,
                "warnings": warnings,
                **joint,  # empty on a grid: its plan is as before
            }
        ),
        provenance=_clean({"spec_hash": spec_hash(spec), "results_hash": table_hash(results), **(provenance or {})}),
        axes=_clean(axes_section),
        **res.extras,
    )


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
    # The √B heuristic is the batch law's prior: kept as the record when the batch was not swept.
    fitted = {a for a, law in laws.items() if law["basis"] == "fit"}
    drop = {"hold-lr-wd-product"} | ({"adam-sqrt-batch-lr"} if "batch_size" in fitted else set())
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


# --- standalone use: a results table from any tool, no spec -------------------------------------


def tuned_columns(results: pd.DataFrame) -> tuple[list[str], dict[str, float]]:
    """Tunable hyperparameter columns that vary (tuned) and those with one value (fixed)."""
    tuned, fixed = [], {}
    for c in results.columns:
        if c in TUNABLE:
            vals = pd.to_numeric(results[c], errors="coerce").dropna().unique()
            if len(vals) > 1:
                tuned.append(c)
            elif len(vals) == 1:
                fixed[c] = float(vals[0])
    return tuned, fixed


def standalone_spec(
    results: pd.DataFrame,
    *,
    rule: str,
    target_width: int,
    base_width: int | None = None,
    proxy_steps: int = 100,
    proxy_batch_size: int = 16,
    target_steps: int | None = None,
    target_batch_size: int | None = None,
    target_depth: int | None = None,
    model: dict | None = None,
    name: str = "standalone",
    source: str = "results",
) -> StudySpec:
    """A StudySpec describing a sweep made elsewhere, so `make_plan` serves both modes. A table with
    `steps`, `batch_size` or `depth` columns sets the ladder's own values (the base point: the value
    most widths ran at; transfer/axes.py) instead of proxy_steps / proxy_batch_size / model depth."""
    tuned, fixed = tuned_columns(results)
    if not tuned:
        raise ResultsError(
            source,
            [
                f"no hyperparameter column varies; name the tuned column(s) one of "
                f"{sorted(TUNABLE)} (e.g. rename `learning_rate` to `lr`)"
            ],
        )
    df = check_results(results, tuned, source)
    model = dict(model or {})
    defaults = {"steps": proxy_steps, "batch_size": proxy_batch_size, "depth": int(model.get("depth", 2))}
    base = base_point(df, defaults)
    proxy_steps, proxy_batch_size = base["steps"], base["batch_size"]
    if "depth" in df.columns:
        model["depth"] = base["depth"]
    df = df[at_base(axis_columns(df, base), base)]  # the width ladder
    widths = sorted(int(w) for w in df["width"].unique())
    grid = {hp: sorted(float(v) for v in df[hp].unique()) for hp in tuned}
    seeds = sorted(int(s) for s in df["seed"].unique())
    # Scattered points make a "grid" of every value seen: its product is no trial count to refuse.
    max_trials = max(2000, len(widths) * (len(seeds) * math.prod(len(v) for v in grid.values()) + 3))
    data = {
        "name": name,
        "model": {**model, **({"base_width": base_width} if base_width else {})},
        "sweep": {
            "widths": widths,
            "grid": grid,
            "fixed": fixed,
            "steps": proxy_steps,
            "batch_size": proxy_batch_size,
            "seeds": seeds,
            "max_trials": max_trials,
        },
        "transfer": {"rule": rule},
        "target": {"width": target_width, "steps": target_steps, "batch_size": target_batch_size, "depth": target_depth},
    }
    return parse_spec(data, source=f"{source} (as a study)")


ID_COLUMNS = ("spec_hash", "trial_id")  # text columns of a results table, whatever they look like


def read_results(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise ResultsError(str(path), [f"file not found: {path}"])
    from hptransfer.errors import Problem
    from hptransfer.io import sidecar, torn

    if why := torn(path):
        raise ResultsError(
            str(path),
            [
                Problem(
                    "",
                    f"cut short while it was written ({why}): a crash on a filesystem without atomic rename, or a full disk",
                    fix="rewrite it from the sweep's own state, no trial trained again: rerun the same `hpt sweep SPEC "
                    f"--study-dir DIR` (or `hpt run`); if you shortened it by hand on purpose, delete {sidecar(path).name}",
                )
            ],
        )
    if path.suffix.lower() == ".parquet":
        return pd.read_parquet(path)
    if path.suffix.lower() in (".csv", ".txt"):
        # Identifiers stay text: a hex hash such as 72526379e0394572 would otherwise parse as a float (inf).
        return pd.read_csv(path, dtype=dict.fromkeys(ID_COLUMNS, str))
    raise ResultsError(str(path), [f"unknown table format {path.suffix!r}; use .csv or .parquet"])
