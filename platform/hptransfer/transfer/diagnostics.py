"""The transfer diagnostics, assembled: every fit, verdict and prediction a user needs to judge a
plan, as the plan's typed `diagnostics` section (hptransfer.plan_diagnostics.Diagnostics).

The jobs live one per module: fitting.py (log-linear trends, paper 2's loss and drift laws),
verdicts.py (drift and fast-transfer verdicts that can abstain, the sweep's warnings), penalty.py
(the predicted penalty of the plan's value), target_check.py (the target loss interval and the
check after the large run). Formulas and assumptions: docs/RESEARCH.md. Pure: numpy and scipy.
"""

from __future__ import annotations

from hptransfer.plan_diagnostics import Diagnostics
from hptransfer.transfer.fitting import fit_drift, fit_loss_vs_width, trend_of, x_of
from hptransfer.transfer.optimum import OptimumFit
from hptransfer.transfer.penalty import curvature_fit, penalty_at_target
from hptransfer.transfer.target_check import target_loss_interval
from hptransfer.transfer.verdicts import drift_verdict, fast_transfer_verdict, sweep_warnings


def primary_hp(tuned: list[str]) -> str:
    return "lr" if "lr" in tuned else tuned[0]


def optimum_summary(f: OptimumFit) -> dict:
    """An optimum as the plan carries it (plan_diagnostics.OptimumSummary)."""
    return {
        "value": f.value,
        "best_grid_value": f.best_grid_value,
        "best_loss": f.best_loss,
        "fitted_loss": f.fitted_loss,
        "on_edge": f.on_edge,
        "convex": f.convex,
        "n_points": f.n_points,
        "n_diverged": f.n_diverged,
        "capped_by_divergence": f.capped_by_divergence,
        "curvature": f.curvature,
        "log_se": f.log_se,
        "ci": [f.ci_low, f.ci_high] if f.ci_low is not None else None,
        "censored": f.censored,
        "bound": [f.bound_low, f.bound_high],
        "noise": f.noise,
        "noise_source": f.noise_source,
        "n_seeds": f.n_seeds,
        "se_floor": f.se_floor,
        "curvature_ci": [f.curvature_low, f.curvature_high],
        "loss_se": f.loss_se,
        # The joint path's own fields, only where it ran (a grid's summary is as before).
        **({"method": "joint", "fallback": f.joint.fallback} if f.joint is not None else {}),
    }


# How each tunable reaches the target, by where it is applied (hyperparameters.APPLIED), under µP:
# the plan's values are base-width values and µP's per-group multipliers carry them (rules.py).
HOW = {
    "lr": "µP: base-width value; hidden matrices × 1/m, vectors and readout × 1 (param_group_multipliers)",
    "weight_decay": "µP: base-width value; hidden matrices × m (independent) or × 1 (standard) per the rule's groups",
    "output_mult": "unchanged at the base width (MuReadout divides the readout's input by m itself)",
    "init_std": "unchanged at the base width (µP's init scales hidden matrices ∝ 1/√fan_in itself)",
    "warmup_steps": "× target steps / proxy steps (the warmup keeps its fraction of the run)",
}


def joint_sections(fits, tuned, hyperparameters, res, target_steps: int, proxy_steps: int) -> dict:
    """The plan's joint-fit diagnostics (`joint_by_width`, `per_hyperparameter`) and their warnings,
    when the optima came from transfer/joint.py; {} on a grid (its plan stays as before)."""
    from hptransfer.hyperparameters import APPLIED, LOG_SCALE

    widths = sorted(fits)
    if not widths or fits[widths[0]][tuned[0]].joint is None:
        return {}
    warnings, by_width, fell_back = [], {}, {}
    for w in widths:
        j = fits[w][tuned[0]].joint
        by_width[str(w)] = {k: v for k, v in vars(j).items() if k != "hyperparameters"} | {"hyperparameters": list(tuned)}
        if j.fallback:
            fell_back[w] = j.fallback
        for hp, side in j.held.items():
            capped = fits[w][hp].capped_by_divergence
            warnings.append(
                f"width {w}: the joint optimum of {hp} lies {'below' if side == 'low' else 'above'} every stable point "
                f"(held at {j.value[hp]:.4g}, a bound): "
                + (
                    "trials beyond it diverged, so it sits at the edge of stability"
                    if capped
                    else f"widen the search box for {hp}"
                )
            )
    if fell_back:  # one line, however many widths: the last resort, said where the user reads
        text = "; ".join(f"width {w}: {why}" for w, why in fell_back.items())
        warnings.insert(
            0, f"joint optimum: the best sampled point used instead of a fitted one at widths {sorted(fell_back)} ({text})"
        )
    src = res.source_width or max(widths)
    j_src = fits.get(src, fits[max(widths)])[tuned[0]].joint
    if j_src.undecided:
        none_pinned = set(j_src.undecided) == set(tuned)
        warnings.append(
            f"joint optimum: the sweep's points do not pin {', '.join(j_src.undecided)} (a near-flat direction or an "
            "interval over most of the span searched): "
            + (
                f"none is pinned, so the plan is width {src}'s best sampled point (seeds averaged), not a fitted optimum; "
                "more trials or seeds would pin it"
                if none_pinned
                else "the plan keeps the best sampled point's value there; fix it by another argument or search it with more points"
            )
        )
    per = {}
    for hp in tuned:
        f = fits.get(src, fits[max(widths)])[hp]
        how = HOW.get(hp, "as at the source width")
        if res.schedule and res.schedule.get("kind") == "sp-warmup" and hp == "lr":
            how = "peak lr as at the source width, with the rule's multiplicative warmup (plan.schedule)"
        elif "hidden_matrices" not in res.param_group_multipliers and hp in ("lr", "weight_decay"):
            how = "one global value: as at the source width, then the rule's heuristics"
        value = hyperparameters.get(hp)
        per[hp] = {
            "scale": "log" if hp in LOG_SCALE else "linear",
            "applied": APPLIED[hp],
            "method": "joint",
            "source_width": src,
            "source_value": f.value,
            "value": value,
            "factor": value / f.value if value is not None and f.value else None,
            "ci": [f.ci_low, f.ci_high],
            "log_se": f.log_se,
            "censored": f.censored,
            "how": how + (f"; steps {proxy_steps} → {target_steps}" if hp == "warmup_steps" else ""),
            "undecided": True if f.undecided else None,
        }
    return {"joint_by_width": by_width, "per_hyperparameter": per, "warnings": warnings}


def diagnose(
    fits: dict[int, dict[str, OptimumFit]],
    tuned: list[str],
    log_scale: set[str],
    rule: str,
    parametrization: str,
    source_width: int,
    target_width: int,
    transferred: dict[str, float] | None = None,
    n_boot: int = 400,
    seed: int = 0,
) -> Diagnostics:
    """Everything a user needs to judge the plan: fits, the verdicts, the predicted penalty, warnings
    (the plan's `diagnostics` but for what the rule and the results table add: trials, notes).

    transferred: the rule's value for each hyperparameter at the target width before any batch/steps
    heuristic; the predicted penalty prices its distance to the target's estimated optimum."""
    widths = sorted(fits)
    hp = primary_hp(tuned)
    hp_log = hp in log_scale
    warnings: list[str] = []
    out: dict = {
        "tuned": list(tuned),
        "source_width": source_width,
        # Width keys are strings, as in the plan's other per-width maps: YAML/JSON give strings back.
        "optimum_by_width": {str(w): {h: optimum_summary(f) for h, f in per.items()} for w, per in fits.items()},
        "primary": hp,
        "widths": widths,
    }
    usable = [w for w in widths if fits[w][hp].censored is None]  # censored optima are bounds
    out["usable_widths"] = usable
    out["censored_widths"] = {h: {str(w): fits[w][h].censored for w in widths if fits[w][h].censored} for h in tuned}
    out["noise_by_width"] = {str(w): fits[w][hp].noise for w in widths}

    # φ*_n: the parabola's minimum, unless the parabola fits worse than the best point it went through.
    best = {w: min(fits[w][hp].fitted_loss, fits[w][hp].best_loss) for w in widths}
    loss_fit = fit_loss_vs_width(widths, [best[w] for w in widths])
    out["loss_fit"] = loss_fit
    if len(widths) >= 3 and loss_fit is None:
        warnings.append(
            f"best loss does not fall with width ({best}); the ladder may be too short-trained or too noisy to judge transfer"
        )

    trend = {}
    for h in tuned:
        f = trend_of({w: fits[w][h] for w in widths}, h in log_scale)  # censored optima as bounds
        if f is not None:
            bounds = [w for w in widths if fits[w][h].censored]
            trend[h] = {"slope": f.b, "slope_se": f.b_se, "log_scale": h in log_scale, "widths": widths, "bounds": bounds}
    out["optimum_trend"] = trend  # d log ν* / d log n (or dν*/d log n): 0 means width-invariant

    xs = {w: x_of(fits[w][hp], hp_log) for w in widths}
    ses = {w: fits[w][hp].log_se for w in widths}
    drift = fit_drift(usable, [xs[w] for w in usable], [ses[w] for w in usable]) if len(usable) >= 2 else None
    if drift is not None and not hp_log and "value_at_infinity" in drift:
        drift["value_at_infinity"] = drift["x_inf"]  # fitted on ν itself, not log ν
    out["drift_fit"] = drift
    verdict = drift_verdict(widths, [xs[w] for w in widths], [ses[w] for w in widths], [fits[w][hp].censored for w in widths])
    out["drift_verdict"] = verdict

    fast = fast_transfer_verdict(
        usable,
        [xs[w] for w in usable],
        [ses[w] for w in usable],
        [best[w] for w in usable],
        [fits[w][hp].loss_se or 0.0 for w in usable],
        verdict,
        n_boot=n_boot,
        seed=seed,
    )
    out["fast_transfer"] = fast["fast"]
    out["fast_transfer_reason"] = fast["reason"]
    out["fast_transfer_interval"] = fast["interval"]
    if fast["fast"] == "undecided":
        out["fast_transfer_undecided"] = fast["reason"]
    if drift is not None and loss_fit is not None and drift.get("beta") is not None:
        out["fast_transfer_test"] = f"beta={drift['beta']:.3g} vs alpha/2={loss_fit['alpha'] / 2:.3g}"

    kfit = curvature_fit(fits, hp)
    out["curvature"] = kfit.curvature if kfit else None
    if len(usable) >= 3 and kfit is not None and drift["drift"] in ("fitted", "none"):
        # Paper 2's c_n ≈ κ·b_n² at the source width: the loss given up by ν*(n_src) where ν*(∞) is best.
        b_src = drift["B"] * source_width ** -drift["beta"] if drift["drift"] == "fitted" else 0.0
        out["predicted_penalty_asymptotic"] = kfit.curvature * b_src**2
        out["predicted_hp_gap"] = b_src

    out.update(penalty_at_target(fits, hp, hp_log, verdict, target_width, (transferred or {}).get(hp)))
    if loss_fit is not None:
        out["loss_gap_at_source"] = loss_fit["A"] * source_width ** -loss_fit["alpha"]
        out["predicted_target_loss"] = loss_fit["phi_inf"] + loss_fit["A"] * target_width ** -loss_fit["alpha"]
        out["predicted_target_loss_interval"] = target_loss_interval(
            widths, [best[w] for w in widths], [fits[w][hp] for w in widths], target_width, seed=seed
        )
    out["ladder_best_loss"] = min(best.values()) if best else None

    out["warnings"] = warnings + sweep_warnings(fits, widths, hp, rule, verdict, fast, trend)
    return Diagnostics.measured(out)
